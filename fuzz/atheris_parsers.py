"""Coverage-guided fuzzing of the text-log and flight-recorder parsers with atheris (by hand, not in CI).

    pip install atheris
    python fuzz/atheris_parsers.py text_log --seconds 300
    python fuzz/atheris_parsers.py flight_recorder --seconds 300

The corpus starts from the same seeds as tests/test_fuzz.py (the richest real files of the
kind in sample_logs/) and grows with every input that reaches new code in our parsers
(atheris instruments postmortem.parsers; Polars' and DuckDB's native code is not). Each input
is written to a file under /dev/shm and parsed as discovery would hand it over; the input
errors (OSError, EOFError, ValueError, UnicodeError) are what a parser may raise for a bad
file (it is then recorded as partial), anything else is a crash: atheris stops and writes
the input as crash-<hash> in the working directory. At the end it prints libFuzzer's figures
(`#N DONE cov: edges ft: features corp: inputs/bytes exec/s`).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports(include=["postmortem.parsers"]):
    from postmortem.parsers import flight_recorder, textlog
    from postmortem.parsers.source import Source

from tests.test_fuzz import INPUT_ERRORS, seeds  # noqa: E402  (the same seeds as the suite)

PARSERS = {"text_log": textlog, "flight_recorder": flight_recorder}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(PARSERS))
    ap.add_argument("--seconds", type=int, default=300, help="how long to fuzz")
    ap.add_argument("--max-len", type=int, default=1 << 20, help="largest input in bytes")
    args = ap.parse_args()
    parser = PARSERS[args.kind]
    # libFuzzer ends the process itself, so the scratch folder has a fixed name, emptied at the start
    scratch = Path("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()) / f"postmortem-fuzz-{args.kind}"
    shutil.rmtree(scratch, ignore_errors=True)
    corpus = scratch / "corpus"
    corpus.mkdir(parents=True)
    for i, path in enumerate(seeds(args.kind)):
        data = path.read_bytes()
        (corpus / f"seed{i}").write_bytes(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    target = scratch / "input.log"

    def one_input(data: bytes) -> None:
        target.write_bytes(data)
        source = Source(path=target, name=target.name, kind=args.kind, rank=0, year=2026, bytes=len(data))
        try:
            for _table, _frame in parser.parse(source):
                pass
        except INPUT_ERRORS:
            pass  # a bad file: recorded as partial, the run goes on

    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={args.seconds}", f"-max_len={args.max_len}",
                   "-print_final_stats=1"], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

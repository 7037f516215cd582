"""Dump every table of every scenario's run, canonically, to compare two versions of the parsers.

    python benchmarks/tables_dump.py sample_logs tests/realworld --out /tmp/before
    python benchmarks/tables_dump.py sample_logs tests/realworld --out /tmp/after
    diff -r /tmp/before /tmp/after        # nothing: the change left every table as it was

For each scenario folder (one holding expected.json) the run is loaded and matched as
``postmortem eval`` does (nothing kept in history), and each table of the store is written to
``OUT/<corpus>/<scenario>/<table>.txt`` (a header, then each row's repr): every column but the run id and what depends on when
the analysis ran (the run's id and time, its fingerprint of the analyzer's code), rows in a
total order (ORDER BY ALL), so that two runs of the same input give the same files.

Another commit's code, beside this checkout: give its tree the installed layout, or the
installed (editable) parsers are the ones imported and the two dumps compare a tree with itself:

    git archive OLD | tar -x -C /tmp/old
    ln -s ../parsers /tmp/old/postmortem/parsers; ln -s ../signatures /tmp/old/postmortem/signatures
    PYTHONPATH=/tmp/old python /tmp/old/benchmarks/tables_dump.py sample_logs tests/realworld --out /tmp/before

Not a test: a whole-run golden file per scenario would be rewritten by every change that
means to change a table. Run it before and after a change that means not to.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from postmortem import api, parsers
from postmortem.schema import TABLES

# Columns that differ between two analyses of the same files by the same tables.
_VOLATILE = {"run_id", "analyzed_at", "fingerprint", "source_dir"}


def dump_scenario(scenario: Path, out: Path) -> None:
    """Every table of ``scenario``'s run, one file each, in a total order."""
    con, run_id, _ = api.ingest(scenario, keep=False)
    out.mkdir(parents=True, exist_ok=True)
    for table, columns in TABLES.items():
        kept = [f'"{name}"' for name, _, _ in columns if name not in _VOLATILE]
        has_run = any(name == "run_id" for name, _, _ in columns)
        where = "WHERE run_id = ?" if has_run else ""
        rows = con.execute(f"SELECT {', '.join(kept)} FROM {table} {where} ORDER BY ALL",
                           [run_id] if has_run else []).fetchall()
        # repr: exact for every type the tables hold (lists, timestamps, floats), one row a line
        (out / f"{table}.txt").write_text("".join(f"{row!r}\n" for row in [tuple(kept), *rows]))
    con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpora", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(f"parsers: {Path(parsers.__file__).parent}", file=sys.stderr)  # (which code is dumped)
    for corpus in args.corpora:
        for scenario in api.scenario_dirs([corpus]):
            try:
                dump_scenario(scenario, args.out / corpus.name / scenario.name)
            except Exception as exc:  # a scenario that fails is a difference too: write why
                (args.out / corpus.name / scenario.name).mkdir(parents=True, exist_ok=True)
                (args.out / corpus.name / scenario.name / "ERROR.txt").write_text(f"{type(exc).__name__}: {exc}\n")
                print(f"{scenario}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()

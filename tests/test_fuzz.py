"""Every parser, fed mutated real files, either parses or stops with an input error.

The input errors (OSError, EOFError, ValueError, UnicodeError) mark a file `partial` with
the reason; anything else escaping a parser is a bug. Real files come from sample_logs/,
one per kind discovery finds there, so a new parser is fuzzed as soon as a sample has its
format. The budget is POSTMORTEM_FUZZ_EXAMPLES examples per kind (default 25; run a long
campaign by hand with a larger value).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postmortem.discover import discover
from postmortem.parsers import FILE_PARSERS
from postmortem.parsers.source import Source

from .conftest import SAMPLES

INPUT_ERRORS = (OSError, EOFError, ValueError, UnicodeError)
EXAMPLES = int(os.environ.get("POSTMORTEM_FUZZ_EXAMPLES", "25"))
MAX_SEED_BYTES = 256 << 10
_PARSERS = {p.KIND: p for p in FILE_PARSERS}


def _seeds() -> dict[str, Source]:
    """One real file per parsed kind (the smallest, to keep examples quick)."""
    seeds: dict[str, Source] = {}
    for scenario in sorted(p for p in SAMPLES.iterdir() if (p / "expected.json").is_file()):
        for source in discover(scenario).sources:
            if source.bytes > MAX_SEED_BYTES:
                continue
            if source.kind not in seeds or source.bytes < seeds[source.kind].bytes:
                seeds[source.kind] = source
    return seeds


SEEDS = _seeds()


def _mutate(data: bytes, how: str, at: float, junk: bytes) -> bytes:
    cut = int(len(data) * at)
    if how == "truncate":
        return data[:cut]
    if how == "overwrite":
        return data[:cut] + junk + data[cut + len(junk):]
    if how == "insert":
        return data[:cut] + junk + data[cut:]
    if how == "crlf":
        return data.replace(b"\n", b"\r\n")
    if how == "nul":
        return data[:cut] + b"\x00" * 64 + data[cut:]
    if how == "invalid_utf8":
        return data[:cut] + b"\xff\xfe\xc3\x28" + data[cut:]
    if how == "gzip_cut":
        whole = gzip.compress(data)
        return whole[: max(10, int(len(whole) * at))]
    raise AssertionError(how)


def _parse(kind: str, path: Path) -> None:
    source = Source(path=path, name=path.name, kind=kind, rank=0, year=2026)
    try:
        for _table, _frame in _PARSERS[kind].parse(source):
            pass
    except INPUT_ERRORS:
        pass  # recorded as `partial` with the reason; the run goes on


@pytest.mark.parametrize("kind", sorted(SEEDS))
def test_parser_survives_mutated_real_input(kind, tmp_path_factory):
    seed = SEEDS[kind].path.read_bytes()
    if seed[:2] == b"\x1f\x8b":
        seed = gzip.decompress(seed)
    work = tmp_path_factory.mktemp(kind)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(how=st.sampled_from(["truncate", "overwrite", "insert", "crlf", "nul", "invalid_utf8", "gzip_cut"]),
           at=st.floats(0, 1), junk=st.binary(min_size=1, max_size=512))
    def run(how, at, junk):
        path = work / f"mutated-{how}"
        path.write_bytes(_mutate(seed, how, at, junk))
        _parse(kind, path)

    run()


def test_text_parser_survives_a_50_mb_line_and_random_bytes(tmp_path):
    path = tmp_path / "huge.log"
    with open(path, "wb") as fh:
        fh.write(b"[rank0]:[E1129 14:23:26.100000000 x.cpp:1] " + os.urandom(25 << 20).hex().encode())
        fh.write(b"\n[rank0]: Traceback (most recent call last):\n")
    _parse("text_log", path)
    (tmp_path / "random.log").write_bytes(os.urandom(1 << 20))
    _parse("text_log", tmp_path / "random.log")

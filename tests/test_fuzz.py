"""Every parser, fed mutated real files, either parses or stops with an input error.

The input errors (OSError, EOFError, ValueError, UnicodeError) mark a file `partial` with
the reason; anything else escaping a parser is a bug. The seeds are the richest real files of
each kind in sample_logs/: chosen greedily so that together (at most ``SEEDS_PER_KIND``) they
give every kind of row that kind's files give anywhere in the samples (each table, and each
value of its categorical columns: event kinds, compile events, collective ops and states,
stack sources...), so the mutations hit tracebacks, watchdog lines, NCCL COLL lines, dynamo
records and flight-recorder entries with sizes, not a 120-byte stdout. A new parser is fuzzed
as soon as a sample has its format. The budget is POSTMORTEM_FUZZ_EXAMPLES examples per kind
(default 25; run a long campaign by hand with a larger value, or the coverage-guided one in
fuzz/atheris_parsers.py).
"""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postmortem.discover import discover
from postmortem.parsers import BY_KIND
from postmortem.parsers.source import Source

from .conftest import SAMPLES

INPUT_ERRORS = (OSError, EOFError, ValueError, UnicodeError)
EXAMPLES = int(os.environ.get("POSTMORTEM_FUZZ_EXAMPLES", "25"))
MAX_SEED_BYTES = 512 << 10
SEEDS_PER_KIND = 4


def _candidates() -> dict[str, list[Source]]:
    """Every real file of each parsed kind in the samples (up to MAX_SEED_BYTES, to keep examples quick)."""
    found: dict[str, list[Source]] = {}
    for scenario in sorted(p for p in SAMPLES.iterdir() if (p / "expected.json").is_file()):
        for source in discover(scenario).sources:
            if source.bytes <= MAX_SEED_BYTES:
                found.setdefault(source.kind, []).append(source)
    return found


CANDIDATES = _candidates()


def row_kinds(source: Source) -> set[tuple]:
    """What a file gives: each table it fills, and each value of those tables' categorical
    (string, at most 16 distinct values) columns."""
    kinds: set[tuple] = set()
    for table, frame in BY_KIND[source.kind].parse(source):
        kinds.add((table,))
        for column, dtype in frame.schema.items():
            if dtype == pl.String and column != "file":
                values = frame[column].drop_nulls().unique()
                if len(values) <= 16:
                    kinds |= {(table, column, v) for v in values}
    return kinds


@functools.cache
def seeds(kind: str) -> list[Path]:
    """The richest files of ``kind``: a greedy cover of every row kind its files give."""
    given_by = [(source, row_kinds(source)) for source in CANDIDATES[kind]]
    chosen, covered = [], set()
    while len(chosen) < SEEDS_PER_KIND:
        source, kinds = max(given_by, key=lambda sk: (len(sk[1] - covered), -sk[0].bytes))
        if chosen and not kinds - covered:
            break
        chosen.append(source.path)
        covered |= kinds
    return chosen


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
        for _table, _frame in BY_KIND[kind].parse(source):
            pass
    except INPUT_ERRORS:
        pass  # recorded as `partial` with the reason; the run goes on


def test_seeds_are_the_files_with_the_most_to_parse():
    # the text seeds hold a traceback, a watchdog or NCCL line and a compile record between them
    text = [row_kinds(Source(path=p, name=p.name, kind="text_log", rank=0, year=2026)) for p in seeds("text_log")]
    given = set().union(*text)
    assert ("events", "kind", "exception") in given and ("compiles",) in given and ("collectives",) in given
    fr = set().union(*(row_kinds(Source(path=p, name=p.name, kind="flight_recorder", rank=0, year=2026))
                       for p in seeds("flight_recorder")))
    assert ("collectives",) in fr and ("rank_status",) in fr


@pytest.mark.parametrize("kind", sorted(CANDIDATES))
def test_parser_survives_mutated_real_input(kind, tmp_path_factory):
    corpus = []
    for path in seeds(kind):
        data = path.read_bytes()
        corpus.append(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    work = tmp_path_factory.mktemp(kind)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(seed=st.sampled_from(corpus),
           how=st.sampled_from(["truncate", "overwrite", "insert", "crlf", "nul", "invalid_utf8", "gzip_cut"]),
           at=st.floats(0, 1), junk=st.binary(min_size=1, max_size=512))
    def run(seed, how, at, junk):
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

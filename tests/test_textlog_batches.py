"""Small text logs parsed many to a frame give what each gives parsed alone (real sample files)."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import polars as pl
import pytest
from postmortem.parsers import textlog
from postmortem.parsers.source import Source

from postmortem import api, discover, parsing


def tables(pairs) -> dict[str, pl.DataFrame]:
    """Each table's rows, every value as text, in one order: batches and files yield them in others."""
    out: dict[str, list[pl.DataFrame]] = {}
    for table, frame in pairs:
        if frame.height:
            out.setdefault(table, []).append(frame)
    return {t: pl.concat(fs, how="vertical_relaxed").select(pl.all().cast(pl.String)).sort(pl.all(), nulls_last=True)
            for t, fs in out.items()}


def batched(sources: list[Source]) -> dict[str, pl.DataFrame]:
    return tables(textlog.build([textlog.read(s) for s in sources]))


def alone(sources: list[Source]) -> dict[str, pl.DataFrame]:
    return tables(pair for s in sources for pair in textlog.parse(dataclasses.replace(s, notes=[])))


def assert_same(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> None:
    assert a.keys() == b.keys()
    for table in a:
        assert a[table].equals(b[table], null_equal=True), table


@pytest.mark.parametrize("name", ["rank_exception_nccl", "hang_dataloader_nccl", "recompile_limit", "memory_leak",
                                  "collective_mismatch_detail", "rank_sigkill", "native_crash"])
def test_a_scenarios_small_logs_parsed_together_give_what_each_gives_alone(sample, name):
    sources = [s for s in discover.discover(sample(name)).sources if s.kind == "text_log"]
    assert len(sources) > 1 and all(textlog.batchable(s) for s in sources)
    together = batched(sources)
    assert together, "the scenario's logs hold records"
    assert_same(together, alone(sources))


def test_a_block_cut_at_a_files_end_does_not_run_on_into_the_next_file(sample, tmp_path):
    """A traceback whose header ends one file and whose frames start the next is two files'
    halves, not one traceback: the first file has no exception, as when it is parsed alone."""
    (log,) = sample("rank_exception").glob("logs/*/attempt_0/1/stderr.log")
    lines = log.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line) + 1
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text("".join(lines[:cut]))
    second.write_text("".join(lines[cut:]))
    sources = [Source(path=p, name=p.name, kind="text_log", rank=1, bytes=p.stat().st_size, year=2026)
               for p in (first, second)]
    together = batched(sources)
    assert_same(together, alone(sources))
    events = together["events"]
    assert events.filter((pl.col("file") == "a.log") & (pl.col("kind") == "exception")).is_empty()
    # whole, the same lines do make an exception: the cut is what keeps it from a.log
    whole = tables(textlog.parse(Source(path=log, name="a.log", kind="text_log", rank=1, year=2026)))
    assert not whole["events"].filter(pl.col("kind") == "exception").is_empty()


def test_only_small_plain_files_are_batched(tmp_path):
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    small.write_text("x\n")
    big.write_bytes(b"x\n" * (textlog.BATCH_MAX_BYTES // 2 + 1))
    packed = tmp_path / "small.log.gz"
    packed.write_bytes(gzip.compress(b"x\n"))
    found = {s.name: s for s in discover.discover(tmp_path).sources}  # discovery tells gzip from plain

    def source(path: Path) -> Source:
        return found[path.name]

    assert textlog.batchable(source(small))
    assert not textlog.batchable(source(big))
    assert not textlog.batchable(source(packed))  # a gzip stream cut short must keep what it read, file by file


def test_files_read_to_be_built_together_wait_in_bounded_batches(monkeypatch, sample):
    """What was read waits in memory until its batch is built: a job of 100,000 small logs must
    not hold them all (and the batches give what one batch gives)."""
    whole = api.analyze(sample("rank_sigkill"), keep=False)
    sizes = []
    build = textlog.build

    def counted(reads):
        sizes.append(len(reads))
        return build(reads)

    monkeypatch.setattr(textlog, "build", counted)
    monkeypatch.setattr(parsing, "BUILD_FILES", 2)
    split = api.analyze(sample("rank_sigkill"), keep=False)
    assert sizes and max(sizes) <= 2 and sum(sizes) > 2
    assert split["verdict"] == whole["verdict"]
    assert [f["summary"] for f in split["findings"]] == [f["summary"] for f in whole["findings"]]


def test_every_realworld_log_split_with_all_the_others_gives_what_it_gives_alone():
    """The logs of every public thread (prefixes of many launchers, non-ASCII, CRs, progress bars,
    files with and without a final newline) read as blocks and split as one: each file's records
    are those it has alone, with its own line numbers."""
    realworld = Path(__file__).parent / "realworld"
    sources = [dataclasses.replace(s, name=f"{case.name}/{s.name}")
               for case in sorted(p for p in realworld.iterdir() if p.is_dir())
               for s in discover.discover(case).sources if s.kind == "text_log" and textlog.batchable(s)]
    reads = [textlog.read(s) for s in sources]
    assert len(sources) > 100 and all(r.block is not None for r in reads)
    assert_same(tables(textlog.build(reads)), alone(sources))

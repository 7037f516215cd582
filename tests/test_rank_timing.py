"""Per-rank timing reports (parsers/ranktime.py) and the straggler rule over them, on lines of the
real-world corpus (tests/realworld/)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from postmortem.parsers import textlog
from postmortem.parsers.source import Source

from postmortem import api
from postmortem.checks import straggler

REALWORLD = Path(__file__).resolve().parent / "realworld"


def rank_times(path: Path) -> list[dict]:
    source = Source(path=path, name=path.name, kind="text_log", rank=None, year=2026)
    frames = [f for table, f in textlog.parse(source) if table == "events"]
    rows = pl.concat(frames).filter(pl.col("kind") == "rank_time").to_dicts()
    return [json.loads(r["attrs"]) for r in rows]


def test_a_list_of_one_sections_time_per_rank_is_one_report_with_each_ranks_time():
    # d_flagscale_straggler_report_healthy_938: "[default0]:    Rank 0: 9.98ms" ... under "optimizer:"
    times = rank_times(REALWORLD / "d_flagscale_straggler_report_healthy_938" / "output.log")
    assert [(t["subject_rank"], t["ms"]) for t in times] == [
        (0, 9.98), (1, 10.12), (2, 9.46), (3, 9.40), (4, 9.17), (5, 9.58)]
    assert len({t["report"] for t in times}) == 1


def test_one_ranks_time_against_the_median_ranks_is_read_with_both_times():
    # d_traceml_input_straggler_rank2_252: "Rank r2 input wait was 199.7ms vs median rank r0 at 10.4ms."
    (t,) = rank_times(REALWORLD / "d_traceml_input_straggler_rank2_252" / "traceml.log")
    assert (t["subject_rank"], t["ms"], t["median_ms"], t["what"]) == (2, 199.7, 10.4, "input wait")


def test_a_rank_many_times_slower_than_the_median_rank_is_the_straggler():
    report = api.analyze(REALWORLD / "d_traceml_input_straggler_rank2_252", keep=False)
    assert report["verdict"]["signature"] == "straggler" and report["verdict"]["culprit_ranks"] == [2]
    assert "199.7 ms against the median rank's 10.4 ms" in report["verdict"]["summary"]


def test_a_report_with_a_small_spread_names_no_straggler():
    report = api.analyze(REALWORLD / "d_flagscale_straggler_report_healthy_938", keep=False)
    assert not [f for f in report["findings"] if f["signature"] == "straggler"]


def test_the_slow_rank_must_be_well_past_the_median_by_ratio_and_by_time():
    def listed(*ms: float) -> list[dict]:
        return [{"subject_rank": r, "ms": m} for r, m in enumerate(ms)]

    assert straggler._slow_in(listed(10.0, 10.1, 9.9, 16.0)) is None  # 1.6x but only 6 ms more
    slow, usual = straggler._slow_in(listed(100.0, 101.0, 99.0, 180.0))
    assert slow["subject_rank"] == 3 and usual == 100.0
    assert straggler._slow_in(listed(100.0, 101.0, 99.0, 140.0)) is None  # 1.4x: spread
    assert straggler._slow_in(listed(100.0, 300.0)) is None  # two ranks: no median to speak of


def test_a_per_rank_performance_score_list_is_a_report_and_a_low_score_is_the_slow_rank():
    # d_megatron_bridge_nvrx_straggler_report_healthy_2114: "  Rank=0 Node=node01 Score=0.95" (NVRx)
    times = rank_times(REALWORLD / "d_megatron_bridge_nvrx_straggler_report_healthy_2114" / "train.log")
    assert [(t["subject_rank"], t["score"]) for t in times] == [(0, 0.95), (1, 1.00), (0, 0.98), (1, 0.99)]
    assert len({t["report"] for t in times}) == 2  # relative and individual performance

    def scored(*scores: float) -> list[dict]:
        return [{"subject_rank": r, "score": s} for r, s in enumerate(scores)]

    slow, usual = straggler._slow_in(scored(0.98, 1.0, 0.45, 0.97))
    assert slow["subject_rank"] == 2 and usual == 0.98
    assert straggler._slow_in(scored(0.98, 1.0, 0.8, 0.97)) is None  # 1.2x: spread


def test_a_rank_slow_in_one_report_of_many_is_a_hiccup_not_a_straggler():
    def report(name: str, *ms: float) -> list[dict]:
        return [{"subject_rank": r, "ms": m, "ts": None, "file": "f", "line": r, "text": ""} for r, m in enumerate(ms)]

    steady = {f"r{i}": report(f"r{i}", 100.0, 101.0, 99.0, 100.0) for i in range(3)}
    hiccup = {"r3": report("r3", 100.0, 101.0, 99.0, 400.0)}
    assert straggler.from_reports({**steady, **hiccup}) == []
    assert [r["rank"] for r in straggler.from_reports(hiccup)] == [3]

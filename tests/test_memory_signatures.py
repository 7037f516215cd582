"""memory-leak, straggler and cuda-oom on the project's own samples (sample_logs/)."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from postmortem import api
from postmortem.checks.memory_leak import theil_sen


def finding(report: dict, signature: str) -> dict | None:
    return next((f for f in report["findings"] if f["signature"] == signature), None)


# ---------------------------------------------------------------- the fit


def test_theil_sen_ignores_a_warm_up_jump_and_a_spike():
    steps = list(range(12))
    flat = [400.0, 900.0] + [900.0] * 9 + [5000.0]  # optimizer state at step 0->1, one spike at the end
    slope, _, _ = theil_sen(steps, flat)
    assert slope == 0.0
    growing = [100.0 + 30.0 * s for s in steps]
    growing[3] = 2000.0
    slope, _, r2 = theil_sen(steps, growing)
    assert slope == pytest.approx(30.0) and r2 < 1.0


# ---------------------------------------------------------------- memory_leak


def test_leak_sample_memory_holds_a_per_step_allocated_series_per_rank(sample):
    """Done-when of issue 6: `memory` holds a per-step allocated series per rank."""
    con, run_id, _ = api.load(sample("memory_leak"))
    rows = con.execute(
        "SELECT rank, list(step ORDER BY step), list(allocated ORDER BY step) FROM memory "
        "WHERE run_id = ? AND source = 'log' AND rank IS NOT NULL GROUP BY rank ORDER BY rank", [run_id]).fetchall()
    assert [r[0] for r in rows] == [0, 1]
    for _, steps, allocated in rows:
        assert steps == list(range(len(steps))) and len(steps) >= 20
        assert all(b > a for a, b in pairwise(allocated))  # it leaks on every step


def test_leak_sample_snapshot_names_the_validation_forward_whose_output_was_kept(sample):
    """The kept tensors are the outputs of `out = model(x_val)` in validate(), appended to a list."""
    con, run_id, _ = api.load(sample("memory_leak"))
    sites = con.execute(
        "SELECT rank, arg_max(site, allocated), max(allocated), arg_max(blocks, allocated) FROM memory "
        "WHERE run_id = ? AND source = 'snapshot' AND site IS NOT NULL GROUP BY rank ORDER BY rank",
        [run_id]).fetchall()
    assert [s[0] for s in sites] == [0, 1]
    train_py = (sample("memory_leak").parent / "generate" / "train.py").read_text().splitlines()
    for _, site, size, blocks in sites:
        file_line, function = site.split(" in ")
        line = int(file_line.rsplit(":", 1)[1])
        assert function == "validate" and "model(x_val)" in train_py[line - 1]
        assert size > 500 * 2**20 and blocks > 20
    frames = con.execute(
        "SELECT function FROM stacks WHERE run_id = ? AND source = 'snapshot' AND rank = 0 "
        "AND thread = 'allocation site 1' ORDER BY depth", [run_id]).fetchall()
    assert ("validate",) in frames and ("main",) in frames


def test_leak_sample_verdict_is_memory_leak_with_slope_r2_headroom_and_site(report_of):
    report = report_of("memory_leak")
    assert report["verdict"]["signature"] == "memory-leak"
    leak = finding(report, "memory-leak")
    assert leak["ranks"] == [0, 1] and leak["role"] == "root_cause"
    assert "32.5 MiB per step" in leak["summary"] and "R^2 1.00" in leak["summary"]
    assert "0.88 GiB" in leak["summary"]  # the 896 MiB per-process cap, from the OOM message
    assert "train.py:307 in validate" in leak["summary"]
    assert "torch.no_grad()" in leak["remediation"]
    # The OOM and the crash it caused are explained by the leak, not separate root causes.
    assert finding(report, "cuda-oom")["role"] == "context"
    assert finding(report, "rank-crash")["role"] == "context"
    texts = [e["text"] for e in leak["evidence"]]
    assert any("top live allocation site" in t for t in texts)
    assert any("CUDA out of memory" in t for t in texts)


@pytest.mark.parametrize("scenario", ["healthy", "recompile_limit", "straggler", "straggler_cuda", "cuda_oom_spike"])
def test_no_leak_where_memory_is_flat_or_drifts_a_little(report_of, scenario):
    assert finding(report_of(scenario), "memory-leak") is None


# ---------------------------------------------------------------- straggler


@pytest.mark.parametrize("scenario", ["straggler", "straggler_cuda"])
def test_straggler_sample_names_the_slow_rank_and_how_long_the_other_waited(report_of, scenario):
    report = report_of(scenario)
    assert report["verdict"]["signature"] == "straggler"
    s = finding(report, "straggler")
    assert s["ranks"] == [1]
    assert "arrived last at the collectives in 3 of 3 steps" in s["summary"]
    wait_ms = float(s["summary"].split("waited a median ")[1].split(" ms")[0].replace(",", ""))
    assert 250 < wait_ms < 350  # the planted 0.3 s per batch
    culprit, other = s["evidence"][0], s["evidence"][1]
    assert culprit["rank"] == 1 and other["rank"] == 0 and "waiting for rank 1" in other["text"]


@pytest.mark.parametrize("scenario", ["healthy", "memory_leak", "cuda_oom_spike", "graph_breaks_cuda"])
def test_no_straggler_without_one(report_of, scenario):
    assert finding(report_of(scenario), "straggler") is None


# ---------------------------------------------------------------- cuda-oom


def test_oom_spike_is_a_spike_at_the_users_line_not_a_leak(report_of, sample):
    report = report_of("cuda_oom_spike")
    oom = finding(report, "cuda-oom")
    assert report["verdict"]["signature"] == "cuda-oom" and oom["ranks"] == [1]
    assert "(a spike)" in oom["summary"] and "256.0 GiB" in oom["summary"]
    train_py = (sample("cuda_oom_spike").parent / "generate" / "train.py").read_text().splitlines()
    where = oom["summary"].split(" at ", 1)[1].split(": asking", 1)[0]  # ".../train.py:233 in build_pair_mask"
    line = int(where.split(" in ")[0].rsplit(":", 1)[1])
    assert "torch.ones(n, n" in train_py[line - 1] and where.endswith("in build_pair_mask")
    assert "shape" in oom["remediation"]


def test_leak_oom_is_an_accumulated_peak_not_a_spike(report_of):
    oom = finding(report_of("memory_leak"), "cuda-oom")
    assert "accumulated peak" in oom["summary"]


def test_snapshot_event_records_fragmentation_figures(sample):
    con, run_id, _ = api.load(sample("memory_leak"))
    (attrs,) = con.execute("SELECT attrs FROM events WHERE run_id = ? AND kind = 'memory_snapshot' AND rank = 0",
                           [run_id]).fetchall()[0]
    a = json.loads(attrs)
    assert a["reserved"] >= a["allocated"] > 0 and a["inactive"] == a["reserved"] - a["allocated"]
    assert a["oom"]["size"] == 16 * 2**20  # the failed request, as the OOM message says (16.00 MiB)

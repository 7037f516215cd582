"""Replay: a finding from the logs re-run on real processes (gloo on CPU) or a compiled stand-in."""

from __future__ import annotations

import multiprocessing
import re
import sys

import pytest
from typer.testing import CliRunner

from postmortem import api
from postmortem.cli import app
from postmortem.errors import PostmortemError
from postmortem.replay import collective, replay
from postmortem.replay.sequence import Op, Plan

from .conftest import sample_dir


def analyzed(name, history):
    return api.analyze(sample_dir(name), db=history)["run_id"]


def test_compile_replay_reproduces_the_recorded_recompiles_and_the_fix_removes_them(history):
    run_id = analyzed("recompile_limit", history)
    seen = replay(run_id, history, finding="recompile-limit")
    rank = next(iter(seen["ranks"].values()))
    assert seen["reproduced"] and abs(rank["recompiles"] - rank["recorded_recompiles"]) <= 1
    assert rank["limit_hit"]
    fixed = replay(run_id, history, finding="recompile-limit", fix=True)
    assert next(iter(fixed["ranks"].values()))["recompiles"] == 0
    confirmations = api.query("select summary from findings where role = 'confirmation'", db=history)[1]
    assert len(confirmations) == 2 and confirmations[0][0].startswith("replay: reproduced")


def test_a_hang_that_was_not_in_the_collective_sequence_is_not_reproduced(history):
    # One rank, its all_reduce enqueued behind a GPU kernel that never finished: the recorded
    # collective sequence itself completes when replayed.
    run_id = analyzed("nccl_watchdog_timeout", history)
    result = replay(run_id, history, finding="collective-timeout", backend="gloo", timeout_s=60)
    assert result["reproduced"] is False and "not reproduced" in result["summary"]
    assert result["kind"] == "stuck"


def _op(seq, numel=1024):
    return Op(pg="0", seq=seq, op="all_reduce", in_numel=numel, out_numel=numel, dtype="Float", source="test")


def test_a_replay_never_outlives_its_timeout_and_reaps_every_process():
    hang = Plan(world_size=2, sequences={0: [_op(1), _op(2)], 1: [_op(1)]}, pg="0", first_seq=1, divergence=2,
                culprits=[1], kind="missing")
    outcome = collective.run(hang, "gloo", timeout_s=8)
    assert outcome.completed == {0: 1, 1: 1} and outcome.stuck == {0: 2}
    assert multiprocessing.active_children() == []


def test_a_size_mismatch_fails_where_it_was_recorded_and_equal_sizes_complete():
    mismatch = Plan(world_size=2, sequences={0: [_op(1), _op(2, 4096)], 1: [_op(1), _op(2, 4000)]}, pg="0",
                    first_seq=1, divergence=2, culprits=[1], kind="mismatch")
    outcome = collective.run(mismatch, "gloo", timeout_s=20)
    assert outcome.completed.get(0) == 1 and set(outcome.stuck.values()) == {2}
    equal = Plan(world_size=2, sequences={0: [_op(1), _op(2, 4096)], 1: [_op(1), _op(2, 4096)]}, pg="0",
                 first_seq=1, divergence=None, culprits=[], kind="stuck")
    done = collective.run(equal, "gloo", timeout_s=20)
    assert sorted(done.finished) == [0, 1] and not done.errors and not done.hung


def test_without_torch_replay_says_how_to_install_it(history, monkeypatch):
    run_id = analyzed("healthy", history)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(PostmortemError, match=r"pip install 'postmortem\[replay\]'"):
        replay(run_id, history, finding="recompile-limit")
    result = CliRunner().invoke(app, ["replay", run_id, "--finding", "recompile-limit"])
    assert result.exit_code == 2 and "postmortem[replay]" in result.output


@pytest.mark.parametrize("name", ["hang_dataloader", "hang_conditional_barrier"])
def test_replay_of_a_gloo_hang_reproduces_at_the_analysis_sequence_and_the_fix_completes(name, history):
    report = api.analyze(sample_dir(name), db=history)
    analysis_seq = int(re.search(r"sequence (\d+)", report["verdict"]["summary"])[1])
    seen = replay(report["run_id"], history, backend="gloo", timeout_s=10)
    assert seen["reproduced"] and seen["divergence"] == analysis_seq
    assert seen["culprit_ranks"] == expected_culprits(name)
    fixed = replay(report["run_id"], history, backend="gloo", timeout_s=20, fix=True)
    assert not fixed["reproduced"] and all(r["finished"] for r in fixed["ranks"].values())


@pytest.mark.parametrize("name", ["allgather_shard_mismatch", "dtype_mismatch"])
def test_a_gloo_size_mismatch_whose_culprit_left_no_dump_is_rebuilt_and_reproduced(name, history):
    # The culprit aborted on gloo's size check before it could dump: its side is rebuilt from
    # its peer's sequence, its stack's call site and the byte counts gloo printed.
    report = api.analyze(sample_dir(name), db=history)
    seen = replay(report["run_id"], history, backend="gloo", timeout_s=20)
    assert seen["reproduced"] and seen["kind"] == "mismatch"
    assert seen["culprit_ranks"] == expected_culprits(name)
    assert "SIGABRT" in seen["summary"] and f"seq {seen['divergence']}" in seen["summary"]
    assert any("gloo's byte counts" in note for note in seen["notes"])
    fixed = replay(report["run_id"], history, backend="gloo", timeout_s=20, fix=True)
    assert not fixed["reproduced"] and all(r["finished"] for r in fixed["ranks"].values())


@pytest.mark.parametrize("name", ["healthy", "healthy_fsdp"])
def test_a_healthy_run_replays_to_completion_with_nothing_reproduced(name, history):
    run_id = analyzed(name, history)
    seen = replay(run_id, history, backend="gloo", timeout_s=20)
    assert seen["kind"] == "none" and not seen["reproduced"]
    assert seen["summary"].startswith("nothing to reproduce") and all(r["finished"] for r in seen["ranks"].values())


def expected_culprits(name: str) -> list[int]:
    """The culprits the sample's author planted (expected.json), not what the analysis says."""
    import json

    return json.loads((sample_dir(name) / "expected.json").read_text())["culprit_ranks"]


def _committed_replays():
    from .conftest import SAMPLES
    return sorted(p.parent.parent.name for p in SAMPLES.glob("*/replay/replay.json"))


@pytest.mark.parametrize("name", _committed_replays())
def test_committed_gpu_replays_agree_with_the_analysis_of_their_sample(name, history):
    """The replays run on the H200s (NCCL collectives, inductor compiles) and committed under
    sample_logs/<scenario>/replay/: what they reproduced is what today's analysis of the same
    logs says, at the same sequence number and on the same ranks, and --fix completed."""
    import json

    seen = json.loads((sample_dir(name) / "replay" / "replay.json").read_text())
    fixed = json.loads((sample_dir(name) / "replay" / "replay_fix.json").read_text())
    verdict = api.analyze(sample_dir(name), db=history)["verdict"]
    assert not fixed["reproduced"]
    if not (verdict or {}).get("signature"):
        assert seen["kind"] == "none" and not seen["reproduced"]
        assert all(r["finished"] for r in fixed["ranks"].values())
        return
    assert seen["reproduced"] and seen["finding"] == verdict["signature"]
    if seen["backend"] == "compile":
        rank = next(iter(seen["ranks"].values()))
        assert abs(rank["recompiles"] - rank["recorded_recompiles"]) <= 1
        assert next(iter(fixed["ranks"].values()))["recompiles"] == 0
        return
    assert seen["backend"] == "nccl" and seen["culprit_ranks"] == expected_culprits(name)
    analysis_seq = int(re.search(r"sequence (\d+)", verdict["summary"])[1])
    detail = [n for n in seen["notes"] if n.startswith("TORCH_DISTRIBUTED_DEBUG=DETAIL")]
    if detail:  # DETAIL numbers from 0, the flight recorder from 1
        assert f"its sequence {analysis_seq} (the recorder's {seen['divergence']})" in detail[0]
    else:
        assert seen["divergence"] == analysis_seq
    assert all(r["finished"] for r in fixed["ranks"].values())


@pytest.mark.parametrize("name", ["rank_frozen", "rank_sigkill", "fsdp_desync"])
def test_a_rank_that_left_no_record_is_replayed_up_to_where_its_peers_were_left_waiting(name, history):
    # SIGSTOP, SIGKILL, gloo's abort: no dump. The rank joined what its peers completed and
    # never the collective they waited in, which is where the replay hangs.
    report = api.analyze(sample_dir(name), db=history)
    seen = replay(report["run_id"], history, backend="gloo", timeout_s=15)
    assert seen["reproduced"] and seen["kind"] == "missing"
    assert seen["culprit_ranks"] == expected_culprits(name)
    assert f"hung at seq {seen['divergence']} waiting for rank(s) {seen['culprit_ranks'][0]}" in seen["summary"]
    assert any("replayed as issuing what rank" in note for note in seen["notes"])
    fixed = replay(report["run_id"], history, backend="gloo", timeout_s=20, fix=True)
    assert not fixed["reproduced"] and all(r["finished"] for r in fixed["ranks"].values())


def test_replay_of_two_groups_taken_in_different_orders_reproduces_the_cycle_and_the_equal_order_completes(history):
    # two_group_cycle: rank 0 waits in grads' all-reduce, rank 1 in metrics'; each rank replays its
    # recorded collectives of all three groups in its own order
    run_id = analyzed("two_group_cycle", history)
    seen = replay(run_id, history, backend="gloo", timeout_s=10)
    assert seen["kind"] == "cycle" and seen["reproduced"]
    assert seen["summary"].startswith("reproduced the cycle")
    assert "rank 0 in group 1 (grads) seq 5" in seen["summary"] and "rank 1 in group 2 (metrics) seq 5" in seen["summary"]
    assert seen["culprit_ranks"] == expected_culprits("two_group_cycle")
    fixed = replay(run_id, history, backend="gloo", timeout_s=20, fix=True)
    assert not fixed["reproduced"] and all(r["finished"] for r in fixed["ranks"].values())


def test_replay_of_a_pipeline_stage_that_skipped_a_send_hangs_every_stage_and_adding_the_send_completes(history):
    # pipeline_missing_send: gloo records no send/recv; the tracebacks' dist.recv(src=...) lines
    # give each stage's wait, and the stage that skipped its send is left without it
    run_id = analyzed("pipeline_missing_send", history)
    seen = replay(run_id, history, backend="gloo", timeout_s=10)
    assert seen["kind"] == "p2p" and seen["reproduced"]
    assert seen["culprit_ranks"] == expected_culprits("pipeline_missing_send")
    assert all(r["hung_in"] == 1 or (r["error"] or "").startswith("at seq 1") for r in seen["ranks"].values())
    fixed = replay(run_id, history, backend="gloo", timeout_s=20, fix=True)
    assert not fixed["reproduced"] and all(r["finished"] for r in fixed["ranks"].values())

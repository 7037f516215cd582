"""Hangs decided from evidence: where each rank's main thread was (its stack's innermost frames,
not its functions' names), which peer a send/recv waits for, and hangs that left no error line.
Each on a real run of the project's generator (gloo, CPU; sample_logs/)."""

from __future__ import annotations

import pytest

from postmortem import api
from postmortem.checks.collective_hang import _peer, find_cycle
from postmortem.checks.timeout_misconfigured import what_it_was_doing


def pyspy_main_frames(path) -> list[tuple[str, str, int | None]]:
    """(function, file, line) of a py-spy text dump's first thread, innermost first."""
    frames = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("Thread ") and frames:
            break
        if line.endswith(")") and " (" in line and not line.startswith(("Thread", "Process", "Python")):
            function, _, where = line[:-1].rpartition(" (")
            file, _, number = where.rpartition(":")
            frames.append((function, file, int(number) if number.isdigit() else None))
    return frames


def verdict(sample, name: str) -> dict:
    return api.analyze(sample(name), keep=False)["verdict"]


def test_a_rank_blocked_on_a_lock_inside_a_save_function_is_a_hang_not_a_slow_save(sample):
    # rank 0 waits on a semaphore inside save_checkpoint_locked: its innermost frames are threading's
    frames = pyspy_main_frames(sample("lock_wait_in_save") / "pyspy" / "rank0.txt")
    assert any("save" in f for f, _, _ in frames) and frames[0][1].endswith("threading.py")
    assert what_it_was_doing(frames) is None
    v = verdict(sample, "lock_wait_in_save")
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [0]


def test_a_rank_really_writing_or_compiling_when_the_timeout_fired_is_timeout_misconfigured(sample):
    writing = pyspy_main_frames(sample("timeout_misconfigured") / "pyspy" / "rank0.txt")
    assert what_it_was_doing(writing) == ("in save_checkpoint", "train.py:331")
    compiling = pyspy_main_frames(sample("cold_cache_compile_timeout") / "pyspy" / "rank1.txt")
    assert what_it_was_doing(compiling)[0] == "compiling (torch.compile)"
    for name, rank in (("timeout_misconfigured", 0), ("cold_cache_compile_timeout", 1)):
        v = verdict(sample, name)
        assert v["signature"] == "timeout-misconfigured" and v["culprit_ranks"] == [rank], name


def test_a_hang_with_no_error_line_is_judged_from_the_stack_dumps(sample):
    # default 30-minute timeout, job SIGKILLed at a deadline: no rank ever printed an error
    v = verdict(sample, "silent_hang_killed")
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [1]
    assert v["user_line"].endswith("train.py:735") and "no error line" in v["summary"]


def test_a_pipeline_stage_that_skipped_a_send_is_named_not_the_ranks_waiting_on_it(sample):
    # all four ranks time out in dist.recv; rank 3 waits for rank 2's activations (forward,
    # an earlier line) while rank 2, past its skipped send, waits for rank 3's gradient
    v = verdict(sample, "pipeline_missing_send")
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [2]
    assert "never sent" in v["summary"]


@pytest.mark.parametrize("expr, rank, peer", [
    ("rank + 1", 2, 3), ("rank - 1", 3, 2), ("self.rank - 1", 3, 2), ("0", 5, 0), ("global_rank+2", 1, 3),
    ("prev_stage", 3, None), ("__import__('os').getpid()", 3, None), ("rank * 2", 3, None), ("(", 1, None),
])
def test_a_calls_peer_is_read_from_its_source_text_without_running_it(expr, rank, peer):
    assert _peer(expr, rank) == peer


def test_two_groups_taken_in_different_orders_are_reported_as_a_cycle_naming_the_rank_that_reordered(sample):
    # rank 0 waits in grads' all-reduce, rank 1 in metrics': each for the other. The stall
    # watchdog's flight-recorder dumps name the groups; rank 1's own history issues grads there
    v = verdict(sample, "two_group_cycle")
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [1]
    assert "wait cycle" in v["summary"] and "(grads)" in v["summary"] and "(metrics)" in v["summary"]
    assert "train.py:722" in v["summary"] and v["user_line"].endswith("train.py:719")


def test_a_cycle_seen_only_in_stack_dumps_names_every_rank_in_it(sample, tmp_path):
    # the same run without its flight-recorder dumps: py-spy gives the call sites, not the
    # groups or the order, so no rank is singled out
    import shutil
    run = tmp_path / "two_group_cycle"
    shutil.copytree(sample("two_group_cycle"), run, ignore=shutil.ignore_patterns("nccl_trace_rank_*"))
    v = api.analyze(run, keep=False)["verdict"]
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [0, 1]


def test_find_cycle_returns_the_cycle_from_its_lowest_rank_and_nothing_for_a_chain():
    edges = {3: [(1, "metrics")], 1: [(3, "grads")], 0: [(1, "grads")], 2: [(1, "grads")]}
    assert find_cycle(edges) == [(1, "grads"), (3, "metrics")]
    assert find_cycle({0: [(1, "g")], 2: [(1, "g")]}) == []
    assert find_cycle({0: [(1, "a")], 1: [(2, "b")], 2: [(0, "c")]}) == [(0, "a"), (1, "b"), (2, "c")]

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


# TORCH_NCCL_DESYNC_DEBUG's report, as ProcessGroupNCCL (2.6+: DesyncDebugger::run, LOG(ERROR) <<
# "Rank 0" << retrieveDesyncReport(...)) prints it. No public thread we could use holds a real one:
# these lines are built from TraceUtils.h's format strings (analyzeLaggingRanks, analyzeMissingRanks,
# dumpSnapshot; the same text from 1.11 to 2.13) under a glog header of the form our NCCL samples show.
WATCHDOG = ("[E1201 10:20:07.118209713 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=183, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=30000) "
            "ran for 30050 milliseconds before timing out.\n")
LAGGING = ("[E1201 10:20:07.120000000 ProcessGroupNCCL.cpp:2165] Rank 0\n"
           "\t - [0] Timeout at collective: ALLREDUCE, #183\n"
           "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:\n"
           "\t     [1] finished collective #182, but didn't join collective #183 (count from 1)\n"
           "\t - Snapshot of ranks' latest states:\n"
           "\t   #182 finished ranks:\n"
           "\t     [1] finished ALLREDUCE\n"
           "\t   #183 started ranks:\n"
           "\t     [0] started ALLREDUCE\n")
MISSING = ("[E1201 10:20:07.120000000 ProcessGroupNCCL.cpp:2165] Rank 0\n"
           "\t - [0] Timeout at collective: ALLREDUCE, #1\n"
           "\t - To our best knowledge, ranks [1] are the lagging ranks that caused this timeout. "
           "They never joined any collectives\n")


def analyze_text(tmp_path, text: str) -> tuple[dict, list]:
    (tmp_path / "rank0.log").write_text(text)
    con, run_id, _ = api.ingest(tmp_path, keep=False)
    status = con.execute("SELECT rank, last_enqueued, last_completed, timed_out_seq FROM rank_status "
                         "WHERE run_id = ? AND source = 'desync_report' ORDER BY rank", [run_id]).fetchall()
    return api.analyze(tmp_path, keep=False)["verdict"], status


def test_the_desync_reports_lagging_rank_is_the_hang_culprit_and_its_state_is_rank_status(tmp_path):
    v, status = analyze_text(tmp_path, WATCHDOG + LAGGING)
    # rank 0 issued #183 and timed out in it; rank 1 completed #182 and never issued #183
    assert status == [(0, 183, None, 183), (1, 182, 182, None)]
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [1]
    assert "#182" in v["summary"] and "desync report" in v["summary"]


def test_ranks_the_desync_report_says_never_joined_any_collective_are_the_culprits(tmp_path):
    v, status = analyze_text(tmp_path, MISSING)
    assert (1, 0, 0, None) in status
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [1]


def test_the_ranks_an_nccl_ras_report_lists_are_rank_status_at_their_groups_operation_count():
    # e_nccl_ras_opcount_mismatch_1911 (NCCL 2.26.2, real): ranks 12 and 13 listed at AllGather 641
    from pathlib import Path
    case = Path(__file__).parent / "realworld" / "e_nccl_ras_opcount_mismatch_1911"
    con, run_id, _ = api.ingest(case, keep=False)
    status = con.execute("SELECT rank, pg, last_enqueued FROM rank_status WHERE run_id = ? AND source = 'nccl_ras' "
                         "ORDER BY rank", [run_id]).fetchall()
    assert status == [(12, None, 641), (13, None, 641)]


def ras_json(counts: dict[int, int], missing: list[int] = ()) -> str:
    """An `ncclras -f json` report. No real one was found in public threads: built from NCCL's
    writer (src/ras/client_support.cc jsonWriteHeader/jsonStartCommunicator/jsonWriteRankData,
    NCCL 2.28.7+), the fields and nesting it prints, every rank on one host."""
    import json
    ranks = [{"rank": r, "host": "10.0.0.1", "pid": 4100 + r, "cuda_dev": r, "nvml_dev": r,
              "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                         "abort_flag": False},
              "collective_counts": {"AllGather": 0, "AllReduce": n, "Broadcast": 1}} for r, n in counts.items()]
    return json.dumps({"nccl_version": "2.28.9+cuda13.0", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
                       "timestamp": "2026-12-01 10:20:07", "communicators_count": 1, "communicators": [
                           {"hash": "0x78db921d1c117b4a", "secondary_hash": "0x1:0x2", "size": len(counts) + len(missing),
                            "ranks_count": len(counts), "missing_ranks_count": len(missing), "ranks": ranks,
                            "missing_ranks": [{"rank": r, "host": "10.0.0.1", "pid": -1, "cuda_dev": r, "nvml_dev": r,
                                               "status": {"unresponsive": True, "considered_dead": False}}
                                              for r in missing]}],
                       "ras": {"collection_time_sec": 0.012, "timeouts_count": 0}}, indent=2)


def test_an_ncclras_json_report_names_the_rank_that_launched_fewer_operations(tmp_path):
    (tmp_path / "ras.json").write_text(ras_json({0: 65, 1: 65, 2: 64, 3: 65}))
    con, run_id, _ = api.ingest(tmp_path, keep=False)
    assert con.execute("SELECT kind FROM files WHERE run_id = ?", [run_id]).fetchall() == [("ncclras_json",)]
    status = con.execute("SELECT rank, last_enqueued FROM rank_status WHERE run_id = ? ORDER BY rank",
                         [run_id]).fetchall()
    assert status == [(0, 65), (1, 65), (2, 64), (3, 65)]
    v = api.analyze(tmp_path, keep=False)["verdict"]
    assert v["signature"] == "collective-hang" and v["culprit_ranks"] == [2]


def test_an_ncclras_json_report_whose_ranks_agree_names_no_hang(tmp_path):
    (tmp_path / "ras.json").write_text(ras_json({0: 65, 1: 65}))
    v = api.analyze(tmp_path, keep=False)["verdict"]
    assert (v or {}).get("signature") != "collective-hang"


def healthy_with_completions(copy_sample, done: dict[int, int]) -> list:
    """The healthy gloo run's completion dumps (both ranks issued seq 1..25, nothing failed) with
    each rank's recorded last completed collective set to ``done[rank]``."""
    import pickle

    from postmortem.parsers import pickles

    from postmortem.checks import collective_alignment
    run = copy_sample("healthy")
    for rank, last in done.items():
        path = run / f"nccl_trace_rank_{rank}"
        dump = pickles.loads(path.read_bytes())
        dump["pg_status"]["0"]["last_completed_collective"] = last
        path.write_bytes(pickle.dumps(dump, protocol=2))
    con, run_id, _ = api.load(run)
    return collective_alignment.analyze(con, run_id)


def test_a_completion_dump_whose_counter_lags_a_peers_is_no_hang(copy_sample):
    # rank 1 completed everything both issued, so rank 0 took part in all of it: a recording lag
    assert healthy_with_completions(copy_sample, {0: 23, 1: 25}) == []


def test_collectives_every_rank_issued_and_none_completed_are_judged_even_when_nothing_failed(copy_sample):
    # seq 23..25 issued by both ranks, completed by neither (a stalled job dumped from outside)
    (stuck,) = healthy_with_completions(copy_sample, {0: 22, 1: 22})
    assert stuck.kind == "stuck" and stuck.seq == 23 and stuck.others == [0, 1]

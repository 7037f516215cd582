"""Collectives lined up across ranks by (process group, sequence number): hangs, mismatches, stalls.

The real multi-source run here is ``nccl_watchdog_timeout`` (one rank on an H200: a
flight-recorder dump, the watchdog's timeout and PG-status lines, NCCL COLL lines). The
cross-rank cases are that run with a second rank added by mutating its own real records:
its dump re-pickled with an entry changed or dropped (dumps hold plain data), or its log
lines with a number changed. Where the system's python has torch, a real two-rank gloo job
is run too (gloo records the flight recorder as well).
"""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from postmortem.parsers import pickles

from postmortem import api
from postmortem.checks import collective_alignment as alignment

from .conftest import sample_dir, scenario_names

RUN = "nccl_watchdog_timeout"


def real_dump(sdir: Path) -> dict:
    return pickles.loads((sdir / "nccl_trace_rank_0").read_bytes())


def with_rank1(copy_sample, mutate_dump=None, mutate_line=None, keep_dump=True, as_name=None) -> Path:
    """The real run, plus a rank 1 made of rank 0's own records, mutated."""
    target = copy_sample(RUN, as_name)
    dump = real_dump(target)
    if mutate_dump is not None:
        # The group now has two members: the one all-gather (DDP's shape check) gathers two.
        dump["pg_config"]["0"]["ranks"] = "[0, 1]"
        for e in dump["entries"]:
            if "all_gather" in e["profiling_name"]:
                e["output_sizes"] = [[2 * e["input_sizes"][0][0], *e["input_sizes"][0][1:]]]
        second = copy.deepcopy(dump)
        mutate_dump(second)
        (target / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump, protocol=2))
        (target / "nccl_trace_rank_1").write_bytes(pickle.dumps(second, protocol=2))
    if not keep_dump:
        (target / "nccl_trace_rank_0").unlink()
    if mutate_line is not None:
        (log0,) = target.glob("logs/*/attempt_0/0/stderr.log")
        log1 = log0.parent.parent / "1" / "stderr.log"
        log1.parent.mkdir()
        lines = [mutate_line(line.replace("[rank0]:", "[rank1]:").replace("Rank 0]", "Rank 1]"))
                 for line in log0.read_text().splitlines() if "ProcessGroupNCCL.cpp" in line]
        log1.write_text("\n".join(line for line in lines if line) + "\n")
    return target


def stuck_entry(dump: dict) -> dict:
    return next(e for e in dump["entries"] if e["state"] != "completed")


def findings(path: Path) -> tuple[list[alignment.Disagreement], dict]:
    con, run_id, _ = api.load(path)
    return alignment.analyze(con, run_id), api.analyze(path, keep=False)


# ---------------------------------------------------------------- the real run


def test_one_rank_stuck_in_its_own_collective_is_a_stall_not_a_hang(sample):
    found, report = findings(sample(RUN))
    seq = stuck_entry(real_dump(sample(RUN)))["collective_seq_id"]
    assert [(d.kind, d.pg, d.seq) for d in found] == [("stuck", "0", seq)]
    assert report["verdict"]["signature"] == "collective-timeout"
    assert "train.py:270" in report["verdict"]["summary"]  # the stuck entry's user frame


# ---------------------------------------------------------------- hangs


def drop_stuck(d):
    """Rank 1 stopped before the collective rank 0 waits in."""
    seq = stuck_entry(d)["collective_seq_id"]
    d["entries"] = [e for e in d["entries"] if e["collective_seq_id"] < seq]
    d["pg_status"]["0"] = {"last_enqueued_collective": seq - 1, "last_started_collective": seq - 1,
                           "last_completed_collective": seq - 1}


# Rank 1's dump, changed at the sequence rank 0 is stuck in.
MISMATCHES = [
    ("size", lambda d: stuck_entry(d).update(input_sizes=[[1000]], output_sizes=[[1000]]), "numel differs"),
    ("dtype", lambda d: stuck_entry(d).update(input_dtypes=["BFloat16"], output_dtypes=["BFloat16"]),
     "dtypes differ"),
    ("op", lambda d: stuck_entry(d).update(profiling_name="nccl:all_reduce_barrier"), "different collectives"),
]


def test_rank_that_never_issued_the_sequence_is_the_culprit(copy_sample):
    found, report = findings(with_rank1(copy_sample, drop_stuck))
    (hang,) = [d for d in found if d.kind == "never_enqueued"]
    assert hang.culprits == [1] and hang.others == [0] and hang.pg == "0"
    assert report["verdict"]["signature"] == "collective-hang" and report["verdict"]["culprit_ranks"] == [1]
    assert f"never issued all_reduce sequence {hang.seq}" in report["verdict"]["summary"]
    timeout = next(f for f in report["findings"] if f["signature"] == "collective-timeout")
    assert "explained by collective-hang" in timeout["summary"]


def test_watchdog_status_lines_alone_find_the_rank_that_never_issued(copy_sample):
    # No dumps at all: rank 1's "Received a dump signal ... Last enqueued NCCL work: 18" says it
    # never issued 19; rank 0's "failure detected ... last enqueued work: 19" says it waits in it.
    def rank1_line(line):
        if "Received a dump signal" in line:
            return line.replace("Last enqueued NCCL work: 19", "Last enqueued NCCL work: 18").replace(
                "from this local rank", "from  rank 0")
        return None

    found, report = findings(with_rank1(copy_sample, mutate_line=rank1_line, keep_dump=False))
    hang = next(d for d in found if d.kind == "never_enqueued")
    assert hang.culprits == [1] and hang.seq == 19 and hang.op == "ALLREDUCE"
    assert report["verdict"]["culprit_ranks"] == [1]


def test_rank_that_issued_but_never_completed_while_a_peer_did_is_the_culprit(copy_sample):
    def completed(d):  # rank 1 completed what rank 0 is stuck in: rank 0's GPU never finished it
        e = stuck_entry(d)
        e["state"], e["time_discovered_completed_ns"] = "completed", e["time_created_ns"] + 1000
        d["pg_status"]["0"]["last_completed_collective"] = e["collective_seq_id"]

    found, report = findings(with_rank1(copy_sample, completed))
    (lag,) = [d for d in found if d.kind == "never_completed"]
    assert lag.culprits == [0] and lag.others == [1]
    assert report["verdict"]["signature"] == "collective-hang" and report["verdict"]["culprit_ranks"] == [0]
    assert "never completed" in report["verdict"]["summary"]


def test_groups_whose_numbers_cannot_be_compared_are_not_judged(copy_sample):
    def far_ahead(d):  # completed far past what rank 0 ever issued: numbering not shared
        d["pg_status"]["0"] = {"last_enqueued_collective": 500, "last_started_collective": -1,
                               "last_completed_collective": 500}
        d["entries"] = []

    found, _ = findings(with_rank1(copy_sample, far_ahead))
    assert not [d for d in found if d.kind in ("never_enqueued", "never_completed", "stuck")]


# ---------------------------------------------------------------- mismatches


@pytest.mark.parametrize("what,change,culprit_text", MISMATCHES)
def test_ranks_disagreeing_at_the_same_sequence_are_a_mismatch(copy_sample, what, change, culprit_text):
    found, report = findings(with_rank1(copy_sample, change))
    (m,) = [d for d in found if d.kind == "mismatch"]
    assert m.detail.startswith(what) and culprit_text in m.detail and m.seq == 19
    assert sorted(m.culprits + m.others) == [0, 1]
    assert report["verdict"]["signature"] == "collective-mismatch"
    assert "train.py:270" in report["verdict"]["summary"]


def test_watchdog_numel_differing_across_ranks_is_a_mismatch_without_dumps(copy_sample):
    def rank1_line(line):
        if "Watchdog caught collective operation timeout" in line or "failure detected" in line:
            return line.replace("NumelIn=1024, NumelOut=1024", "NumelIn=1000, NumelOut=1000")
        return None

    found, report = findings(with_rank1(copy_sample, mutate_line=rank1_line, keep_dump=False))
    (m,) = [d for d in found if d.kind == "mismatch"]
    assert m.source == "flight_recorder" and m.seq == 19 and "1024" in m.detail and "1000" in m.detail
    assert {c.source for c in m.calls.values()} == {"watchdog"}
    assert report["verdict"]["signature"] == "collective-mismatch"


def call(rank, op, numel_in, numel_out, dtypes='{"in": ["Float"]}'):
    return alignment.Call(rank, "flight_recorder", op, numel_in, numel_out, dtypes, "scheduled", "f", rank)


def test_all_gather_base_output_must_be_world_times_input():
    # torchfrtrace spells this rule "all_gather_base" and never applies it to _all_gather_base
    # (anchors.md §1.6); the counts are those of the FSDP-style shard of the samples.
    ok = {0: call(0, "_all_gather_base", 4096, 8192), 1: call(1, "_all_gather_base", 4096, 8192)}
    assert alignment.compare(ok, 2) is None
    bad = {0: call(0, "_all_gather_base", 4096, 8192), 1: call(1, "all_gather_into_tensor", 4000, 8192)}
    what, culprits, detail = alignment.compare(bad, 2)
    assert what == "size" and culprits == [1] and "8192 != 2 ranks x input numel 4000" in detail


def test_reduce_scatter_input_must_be_world_times_output():
    bad = {0: call(0, "_reduce_scatter_base", 8192, 4096), 1: call(1, "_reduce_scatter_base", 8192, 4000)}
    what, culprits, _ = alignment.compare(bad, 2)
    assert what == "size" and culprits == [1]


def test_op_families_join_every_sources_spelling():
    for spellings, family in ((("all_reduce", "ALLREDUCE", "AllReduce", "allreduce_coalesced"), "all_reduce"),
                              (("_all_gather_base", "_ALLGATHER_BASE", "AllGather", "all_gather_into_tensor"),
                               "all_gather"),
                              (("_reduce_scatter_base", "REDUCE_SCATTER", "ReduceScatter"), "reduce_scatter"),
                              (("all_reduce_barrier", "BARRIER"), "barrier")):
        assert {alignment.op_family(s) for s in spellings} == {family}


def test_between_two_equal_sides_the_odd_one_left_the_loops_usual_path():
    # A training step's collectives repeat: after (grads, metric) came the shard all-gather.
    step = [("all_reduce", 262144), ("all_reduce", 4880), ("all_gather", 4096)]
    history = step * 3 + step[:2]
    assert alignment.expected_next(history) == ("all_gather", 4096)
    # FSDP: after block 0's all-gather, block 2's came next (a rank skipping it jumps to the head's)
    fsdp = [("ag", 65792), ("ag", 65664), ("ag", 2056), ("rs", 2056)] * 2 + [("ag", 65792)]
    assert alignment.expected_next(fsdp) == ("ag", 65664)
    assert alignment.expected_next([("ag", 1)]) is None


# ---------------------------------------------------------------- no false alarms


@pytest.mark.parametrize("name", scenario_names())
def test_every_sample_disagreement_names_only_the_planted_culprits(name):
    """No false alarms on the real runs: a healthy run shows no disagreement, and any rank the
    alignment blames is one the scenario planted its fault on (a rank stuck in checkpoint I/O
    did never issue the all-reduce its peer timed out in: the tables say so, and
    timeout-misconfigured explains why)."""
    import json
    expected = json.loads((sample_dir(name) / "expected.json").read_text())
    con, run_id, _ = api.load(sample_dir(name))
    blamed = [d for d in alignment.analyze(con, run_id) if d.kind in ("mismatch", "never_enqueued", "never_completed")]
    if expected.get("root_cause") is None:
        assert not blamed, (name, blamed)
    for d in blamed:
        assert set(d.culprits) <= set(expected["culprit_ranks"]), (name, d)


# ---------------------------------------------------------------- a real two-rank job

_GLOO_HANG = r"""
import os, sys, time, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
rank, out = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"), rank=rank, world_size=2)
dist.all_reduce(torch.ones(1024))
dist.all_reduce(torch.ones(16) if rank == 0 else torch.ones(16, dtype=torch.int32))  # same bytes, dtype drift
if rank == 0:
    dist.all_reduce(torch.ones(16), async_op=True)  # rank 1 never issues it
time.sleep(1)
with open(os.path.join(out, "nccl_trace_rank_%d" % rank), "wb") as fh:
    fh.write(c10d._dump_fr_trace(True, True, False))
os._exit(0)
"""


def test_real_gloo_job_dumps_show_the_dtype_drift_and_the_missing_rank(tmp_path):
    # torch is a test dependency: the job runs on this interpreter, and a missing torch fails here
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}
    procs = [subprocess.Popen([sys.executable, "-c", _GLOO_HANG, str(r), str(tmp_path)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for r in (0, 1)]
    for p in procs:
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr.decode(errors="replace")[-2000:]
    (tmp_path / "store").unlink(missing_ok=True)
    found, report = findings(tmp_path)
    kinds = {d.kind: d for d in found}
    assert kinds["mismatch"].seq == 2 and "dtypes differ" in kinds["mismatch"].detail
    assert kinds["never_enqueued"].culprits == [1] and kinds["never_enqueued"].seq == 3
    assert report["verdict"]["signature"] == "collective-mismatch"


def test_a_rank_that_died_of_its_own_error_is_rank_crash_not_a_hang(copy_sample):
    # Rank 1 never issued the collective because it raised first: its stderr is rank 1's of the
    # rank_exception run (a real ValueError traceback in check_batch).
    target = with_rank1(copy_sample, drop_stuck)
    (own,) = sample_dir("rank_exception").glob("logs/*/attempt_0/1/stderr.log")
    (log0,) = target.glob("logs/*/attempt_0/0/stderr.log")
    (log0.parent.parent / "1").mkdir()
    shutil.copy(own, log0.parent.parent / "1" / "stderr.log")
    found, report = findings(target)
    assert any(d.kind == "never_enqueued" and d.culprits == [1] for d in found)  # the tables say so
    hang = [f for f in report["findings"] if f["signature"] == "collective-hang"]
    assert not hang or 1 not in hang[0]["ranks"]
    crash = next(f for f in report["findings"] if f["signature"] == "rank-crash")
    assert crash["ranks"] == [1]


# ---------------------------------------------------------------- logs with nothing but the symptom


def analyzed_text(tmp_path: Path, text: str, name: str = "console.log") -> dict:
    (tmp_path / name).write_text(text)
    return api.analyze(tmp_path, keep=False)


# tests/realworld/d_ofa_nccl_timeout_old_271 (OFA-Sys/OFA#271): the old wording, no Numel, no
# [rankN]: prefix and a header without a time; five ranks wait in one ALLREDUCE.
OLD_TIMEOUTS = "".join(
    f"[E ProcessGroupNCCL.cpp:737] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
    f"OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 180221{r} milliseconds before timing out.\n" for r in (1, 3, 2, 6, 7))


def test_bare_watchdog_timeouts_are_the_timeout_verdict_and_name_no_culprit(tmp_path):
    report = analyzed_text(tmp_path, OLD_TIMEOUTS)
    verdict = report["verdict"]
    assert verdict["signature"] == "collective-timeout"
    assert verdict["culprit_ranks"] == []  # the ranks that timed out are the ones that waited
    assert verdict["summary"].startswith("rank(s) 1-3, 6, 7 timed out waiting in a collective")
    assert "SeqNum=469508, OpType=ALLREDUCE" in verdict["summary"]


def test_watchdog_status_line_alone_counts_as_that_ranks_timeout(tmp_path):
    # tests/realworld/d_llamafactory_linenum_prefixed_timeout_7396 (hiyouga/LLaMA-Factory#7396), its
    # lines without the paste's "[NNNNN] " numbers: rank 3 left only its PG status line.
    text = (
        "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) "
        "ran for 600060 milliseconds before timing out.\n"
        "[rank3]:[E321 02:07:08.465224069 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 3] Exception (either an error or "
        "timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.\n"
    )
    report = analyzed_text(tmp_path, text)
    assert report["verdict"]["signature"] == "collective-timeout" and report["verdict"]["culprit_ranks"] == []
    assert report["verdict"]["summary"].startswith("rank(s) 0, 3 timed out")


def test_bare_gloo_transport_timeout_is_the_timeout_verdict(tmp_path):
    # tests/realworld/d_deimv2_gloo_recv_timeout_bare_65: the one line the user quoted, no rank.
    report = analyzed_text(tmp_path, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                                     "Timed out waiting 1800000ms for recv operation to complete\n")
    assert report["verdict"]["signature"] == "collective-timeout" and report["verdict"]["culprit_ranks"] == []
    assert "Timed out waiting 1800000ms" in report["verdict"]["summary"]


def test_nccls_own_mismatch_check_is_a_mismatch_not_an_nccl_error(tmp_path):
    # tests/realworld/d_nccl_warn_mismatched_collective_296 (NVIDIA/nccl#296): "rank 39" is the rank
    # that reported it, not a culprit.
    report = analyzed_text(tmp_path, (
        "init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at and around "
        "rank 39. You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to see the collective logs\n"))
    assert report["verdict"]["signature"] == "collective-mismatch" and report["verdict"]["culprit_ranks"] == []
    assert "around rank 39" in report["verdict"]["summary"]
    roles = {f["signature"]: f["role"] for f in report["findings"]}
    assert roles.get("nccl-error") in (None, "context")


def test_flight_recorder_analyzer_report_is_a_hang_naming_the_missing_ranks(tmp_path):
    # tests/realworld/d_pytorch_fr_trace_missing_ranks_140969 (pytorch/pytorch#140969).
    from .test_nccl_parser import FR_TRACE
    report = analyzed_text(tmp_path, FR_TRACE, name="fr_trace.txt")
    assert report["verdict"]["signature"] == "collective-hang"
    assert report["verdict"]["culprit_ranks"] == [3, 4, 5, 6, 7]
    summary = report["verdict"]["summary"]
    assert "sequence 31117 on 0:default_pg that rank(s) 0-2 scheduled" in summary
    assert "gaussian_splatting.py:650" in summary  # where the ranks that issued it called it


def test_a_rank_with_its_own_watchdog_record_is_not_taken_for_the_missing_one(tmp_path):
    # tests/realworld/d_openrlhf_save_model_nccl_timeout_1126 (OpenRLHF/OpenRLHF#1126): rank 2 did not
    # time out itself, but its dump-signal line says it enqueued 460631, the work rank 7 timed out in.
    text = (
        "[rank2]:[E901 05:20:03.118859045 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] Received "
        "a dump signal due to a collective timeout from  rank 6 and we will try our best to dump the debug info. Last "
        "enqueued NCCL work: 460631, last completed NCCL work: 460630.This is most likely caused by incorrect usages "
        "of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or "
        "the scheduled collective, for some reason, didn't run.\n"
        "[rank7]:[E901 05:20:03.123992144 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=460631, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600020 milliseconds before timing out.\n"
        "[rank7]:[E901 05:20:03.124073319 ProcessGroupNCCL.cpp:2271] [PG ID 0 PG GUID 0(default_pg) Rank 7]  failure "
        "detected by watchdog at work sequence id: 460631 PG status: last enqueued work: 460631, last completed work: "
        "460630\n"
    )
    report = analyzed_text(tmp_path, text)
    assert report["verdict"]["signature"] == "collective-timeout" and report["verdict"]["culprit_ranks"] == []


def test_a_rank_its_own_watchdog_aborted_is_not_taken_for_the_missing_one(tmp_path):
    # tests/realworld/d_verl_alltoall_epoch_transition_hang_1158 (volcengine/verl#1158): local rank 1
    # ended on SIGABRT (exit -6), ProcessGroupNCCL's own abort after its timeout; torchrun sends SIGTERM.
    text = (
        "[rank7]:[E419 10:42:28.858931807 ProcessGroupNCCL.cpp:616] [Rank 7] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=4486, OpType=ALLTOALL, NumelIn=46684160, NumelOut=46684160, Timeout(ms)=600000) ran "
        "for 600013 milliseconds before timing out.\n"
        "[rank7]:[E419 10:42:28.861967180 ProcessGroupNCCL.cpp:1785] [PG ID 2 PG GUID 9 Rank 7] Exception (either an "
        "error or timeout) detected by watchdog at work: 4486, last enqueued NCCL work: 4489, last completed NCCL "
        "work: 4485.\n"
        "W0419 11:01:25.532000 245 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 313 closing "
        "signal SIGTERM\n"
        "E0419 11:01:25.597000 245 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) "
        "local_rank: 1 (pid: 314) of binary: /usr/bin/python\n"
    )
    report = analyzed_text(tmp_path, text)
    assert report["verdict"]["signature"] in ("collective-timeout", "rank-crash")
    assert not any(f["signature"] == "collective-hang" for f in report["findings"])

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

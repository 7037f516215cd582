"""NCCL's own lines, the ProcessGroupNCCL watchdog family and DETAIL fingerprints.

Real lines come from the project's samples: gloo runs (DETAIL's "Running collective") and
the NCCL runs on H200s (``nccl_watchdog_timeout``: COLL lines, the watchdog timeout and PG
status lines, a flight-recorder dump; ``nccl_duplicate_gpu``: a real NCCL WARN). Formats no
run here can produce (an IB transport failure, the oldest watchdog forms) are written from
the NCCL / PyTorch source format strings; each such line says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postmortem.parsers import textlog
from postmortem.parsers.source import Source

from postmortem import api


def parse_text(tmp_path: Path, text: str, rank: int | None = 0, name: str = "stderr.log") -> dict[str, pl.DataFrame]:
    path = tmp_path / name
    path.write_text(text)
    return parse_path(path, rank)


def parse_path(path: Path, rank: int | None = 0) -> dict[str, pl.DataFrame]:
    source = Source(path=path, name=path.name, kind="text_log", rank=rank, year=2026)
    tables: dict[str, list[pl.DataFrame]] = {}
    for table, frame in textlog.parse(source):
        tables.setdefault(table, []).append(frame)
    return {t: pl.concat(frames) for t, frames in tables.items()}


def rows(tables: dict[str, pl.DataFrame], table: str, **where) -> list[dict]:
    df = tables.get(table)
    if df is None:
        return []
    for column, value in where.items():
        df = df.filter(pl.col(column) == value)
    return df.to_dicts()


def rank_files(sample_dir: Path, rank: int) -> list[Path]:
    return sorted(sample_dir.glob(f"logs/*/attempt_0/{rank}/*.log"))


def lines_with(sample_dir: Path, needle: str) -> list[str]:
    found = []
    for path in sorted(sample_dir.glob("logs/*/attempt_0/*/*.log")):
        found += [line.rstrip("\n") for line in path.read_text(errors="replace").splitlines() if needle in line]
    return found


# ---------------------------------------------------------------- NCCL WARN classes


# Written from NCCL's WARN format strings (NVIDIA/nccl src/, named per line): no run on
# this machine fails an InfiniBand or socket transport, or a CUDA call inside NCCL.
SOURCE_FORMAT_WARNS = {
    # transport/net_ib/p2p.cc: "NET/IB: Got completion from peer %s with status=%s(%d) opcode=%s(%d) vendor_err=%u %s%s%s%s hca %s"
    "ib": "node2:319733:319761 [1] transport/net_ib/p2p.cc:688 NCCL WARN NET/IB: Got completion from peer "
          "10.0.0.13<40554> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) "
          "vendor_err=129 localGid ::ffff:1.1.2.2 remoteGids::ffff:1.1.1.4 hca mlx5_1",
    # misc/socket.cc: "socketProgress: Connection closed by remote peer %s"
    "socket": "node2:2985003:2985024 [0] misc/socket.cc:58 NCCL WARN socketProgress: Connection closed by remote "
              "peer node1<45074>",
    # include/cudawrap.h: "Cuda failure %d '%s'"
    "cuda_failure": "[2026-07-23 04:16:01] node13:2619531:2620804 [1] enqueue.cc:1556 NCCL WARN Cuda failure 700 "
                    "'an illegal memory access was encountered'",
    # graph/connect.cc: "Internal error : tree already has %d children (%d %d %d)"
    "internal_error": "node1:100:100 [0] graph/connect.cc:131 NCCL WARN Internal error : tree already has 3 "
                      "children (1 2 3)",
    # init.cc: "Mismatched NCCL version detected : rank %d version %d rank %d version %d"
    "invalid_usage": "node1:100:100 [0] init.cc:1043 NCCL WARN Mismatched NCCL version detected : rank 0 version "
                     "22809 rank 1 version 22703",
    # include/checks.h SYSCHECK: "Call to " name " failed: %s"
    "system_error": "node1:100:100 [0] misc/shmutils.cc:80 NCCL WARN Call to mmap failed: Cannot allocate memory",
    # os/linux.cc: "%s: connect to %s failed : %s" (the bootstrap's socket)
    "net": "node1:100:100 [0] bootstrap.cc:80 NCCL WARN Net : error encountered when getting address info : "
           "Name or service not known",
}


@pytest.mark.parametrize("error_class", sorted(SOURCE_FORMAT_WARNS))
def test_nccl_warn_line_is_an_event_with_its_error_class(tmp_path, error_class):
    tables = parse_text(tmp_path, SOURCE_FORMAT_WARNS[error_class] + "\n")
    (event,) = rows(tables, "events", kind="nccl_warn")
    attrs = json.loads(event["attrs"])
    assert attrs["error_class"] == error_class
    assert attrs["host"] and event["pid"] > 0 and event["level"] == "W"
    assert event["source"].split(":")[1].isdigit()


def test_real_nccl_warn_from_the_duplicate_gpu_run_is_classified(sample):
    warns = lines_with(sample("nccl_duplicate_gpu"), "NCCL WARN")
    assert warns, "the run printed an NCCL WARN"
    report = api.analyze(sample("nccl_duplicate_gpu"), keep=False)
    assert any(f["signature"] == "nccl-error" for f in report["findings"])
    con, run_id, _ = api.load(sample("nccl_duplicate_gpu"))
    classes = {json.loads(a)["error_class"] for (a,) in con.execute(
        "SELECT attrs FROM events WHERE run_id = ? AND kind = 'nccl_warn'", [run_id]).fetchall()}
    assert classes and "other" not in classes, classes


def test_nccl_warn_pasted_without_its_host_header_is_still_a_classified_event(tmp_path):
    # tests/realworld/d_nccl_warn_mismatched_collective_296 (NVIDIA/nccl#296, NCCL 2.4.8): the
    # user's paste dropped the "host:pid:tid [dev] " header.
    line = ("init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at and "
            "around rank 39. You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to see the collective logs\n")
    (event,) = rows(parse_text(tmp_path, line, rank=None), "events", kind="nccl_warn")
    assert event["source"] == "init.cc:1247" and event["level"] == "W" and event["pid"] is None
    assert json.loads(event["attrs"])["error_class"] == "collective_mismatch"
    assert event["message"].startswith("Mismatched collective detected")


# ---------------------------------------------------------------- COLL lines


def test_coll_lines_become_collectives_numbered_per_communicator(sample):
    sdir = sample("nccl_watchdog_timeout")
    con, run_id, _ = api.load(sdir)
    got = con.execute(
        """SELECT rank, pg, count(*), min(seq_id), max(seq_id), count(DISTINCT seq_id), any_value(dtypes)
           FROM collectives WHERE run_id = ? AND source = 'nccl_log' GROUP BY rank, pg""", [run_id]).fetchall()
    assert got, "NCCL_DEBUG_SUBSYS=COLL lines were read"
    for rank, pg, n, lo, hi, distinct, dtypes in got:
        assert rank is not None and pg.startswith("0x")
        assert (lo, hi, distinct) == (1, n, n)  # 1..n, one per call
        assert json.loads(dtypes)["in"][0] in ("Float", "Long", "Int", "Char", "Byte", "Half", "BFloat16", "Double")
    # The communicator is named by its commId (the same on every rank), not by the local pointer.
    init = con.execute("SELECT DISTINCT attrs->>'comm_id' FROM events WHERE run_id = ? AND kind = 'nccl_init'",
                       [run_id]).fetchall()
    assert {pg for _, pg, *_ in got} <= {r[0] for r in init}


def test_coll_line_counts_follow_nccls_collective_semantics(tmp_path):
    # ncclEnqueueCheck's format (src/enqueue.cc), as NCCL 2.28.9 printed it on the H200 runs.
    text = (
        "vm:3640:3640 [0] NCCL INFO ncclCommInitRankConfig comm 0x1fbee8b0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
        "busId 60 commId 0x5c3279b975931d3d - Init COMPLETE\n"
        "vm:3640:3640 [0] NCCL INFO AllGather: opCount 0 sendbuff 0x7fcb34c1d200 recvbuff 0x7fcb34c1d800 count 1 "
        "datatype 4 op 0 root 0 comm 0x1fbee8b0 [nranks=2] stream 0x270afe20\n"
        "vm:3640:3688 [0] NCCL INFO ReduceScatter: opCount 0 sendbuff 0x7f0 recvbuff 0x7f8 count 512 "
        "datatype 9 op 0 root 0 comm 0x1fbee8b0 [nranks=2] stream 0x270afe20\n"
        "vm:3640:3688 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x4a28c00000 recvbuff 0x4a28c00000 count 4194304 "
        "datatype 7 op 0 root 0 comm 0x1fbee8b0 [nranks=2] stream 0x270afe20\n"
    )
    got = rows(parse_text(tmp_path, text, rank=None), "collectives", source="nccl_log")
    assert [(r["seq_id"], r["op"], r["numel_in"], r["numel_out"]) for r in got] == [
        (1, "AllGather", 1, 2), (2, "ReduceScatter", 1024, 512), (3, "AllReduce", 4194304, 4194304)]
    assert [json.loads(r["dtypes"])["in"] for r in got] == [["Long"], ["BFloat16"], ["Float"]]
    assert {r["pg"] for r in got} == {"0x5c3279b975931d3d"}
    assert {r["rank"] for r in got} == {0}  # no [rankN] prefix, no file rank: the communicator's rank


def test_coll_numbering_continues_across_chunks(tmp_path, monkeypatch):
    from postmortem.parsers import lines
    line = ("vm:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 8 datatype 7 op 0 root 0 "
            "comm 0xabc [nranks=2] stream 0x2\n")
    path = tmp_path / "nccl.log"
    path.write_text(line * 300)
    real = lines.read_line_chunks
    monkeypatch.setattr(textlog, "read_line_chunks", lambda p: real(p, chunk_bytes=4096))
    got = rows(parse_path(path), "collectives", source="nccl_log")
    assert sorted(r["seq_id"] for r in got) == list(range(1, 301))


# ---------------------------------------------------------------- the watchdog family


def test_real_watchdog_timeout_gives_a_timed_out_collective_and_the_pg_status(sample):
    sdir = sample("nccl_watchdog_timeout")
    (timeout_line, *_) = lines_with(sdir, "Watchdog caught collective operation timeout")
    con, run_id, _ = api.load(sdir)
    (c,) = con.execute(
        """SELECT rank, pg, seq_id, op, numel_in, numel_out, timeout_ms, state FROM collectives
           WHERE run_id = ? AND source = 'watchdog' AND file LIKE 'logs/%'""", [run_id]).fetchall()
    rank, pg, seq, op, numel_in, numel_out, timeout_ms, state = c
    assert f"SeqNum={seq}, OpType={op}, NumelIn={numel_in}, NumelOut={numel_out}, Timeout(ms)={timeout_ms})" \
        in timeout_line
    assert pg == "0" and state == "timed_out"
    status = con.execute(
        "SELECT last_enqueued, last_completed, timed_out_seq FROM rank_status WHERE run_id = ? AND source = "
        "'watchdog' AND rank = ?", [run_id, rank]).fetchall()
    assert status and status[0][2] == seq and status[0][0] >= seq > status[0][1]


# Written from ProcessGroupNCCL.cpp's format strings of older releases (anchors.md §5.1):
# the runs here use PyTorch 2.11/2.13, which print the newest form only.
OLD_WATCHDOG = [
    # ~2.0: SeqNum and Timeout, no Numel; WorkNCCL's own "[Rank r]" prefix.
    (("[E ProcessGroupNCCL.cpp:828] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=15173, "
      "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802710 milliseconds before timing out."),
     {"seq_id": 15173, "op": "ALLREDUCE", "numel_in": None, "timeout_ms": 1800000, "rank": 1}),
    # the oldest: no SeqNum at all.
    (("[E ProcessGroupNCCL.cpp:587] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(OpType=BROADCAST, "
      "Timeout(ms)=1800000) ran for 1804406 milliseconds before timing out."),
     {"seq_id": None, "op": "BROADCAST", "timeout_ms": 1800000, "rank": 3}),
    # a TensorShape instead of Numel.
    (("[E ProcessGroupNCCL.cpp:587] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, "
      "TensorShape=[32, 1024], Timeout(ms)=600000) ran for 600351 milliseconds before timing out."),
     {"seq_id": None, "op": "ALLREDUCE", "numel_in": 32 * 1024, "timeout_ms": 600000, "rank": 0}),
]


@pytest.mark.parametrize("line,expected", OLD_WATCHDOG)
def test_watchdog_line_without_numel_or_seq_still_gives_op_and_timeout(tmp_path, line, expected):
    (row,) = rows(parse_text(tmp_path, line + "\n", rank=None), "collectives", source="watchdog")
    for key, value in expected.items():
        assert row[key] == value, key
    assert row["state"] == "timed_out"


# ProcessGroupNCCL.cpp, ≈2.4-2.5 (the "[PG p (desc) Rank r]" and "[PG p Rank r]" prefixes):
# written from the format strings.
OLD_STATUS = [
    (("[rank1]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL "
      "work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462."), (1, "0", 6463, 6462, 6463)),
    (("[rank0]:[E1206 18:44:16.994932383 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 0] Timeout at NCCL work: 7753, "
      "last enqueued NCCL work: 7755, last completed NCCL work: 7752."), (0, "1", 7755, 7752, 7753)),
    (("[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either "
      "an error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL "
      "work: 6462."), (1, "0", 6463, 6462, 6463)),
    (("[rank2]:[E901 05:20:03.118859045 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] Received "
      "a dump signal due to a collective timeout from  rank 6 and we will try our best to dump the debug info. Last "
      "enqueued NCCL work: 460631, last completed NCCL work: 460630.This is most likely caused by incorrect usages "
      "of collectives"), (2, "0", 460631, 460630, None)),
]


@pytest.mark.parametrize("line,expected", OLD_STATUS)
def test_pg_status_lines_of_every_version_give_rank_status(tmp_path, line, expected):
    (row,) = rows(parse_text(tmp_path, line + "\n", rank=None), "rank_status")
    assert (row["rank"], row["pg"], row["last_enqueued"], row["last_completed"], row["timed_out_seq"]) == expected


def test_subgroup_prefix_rank_is_not_taken_for_the_global_rank(tmp_path):
    # In "[PG ID 3 PG GUID 7(tp) Rank 1]" the 1 is the rank within group 7.
    line = ("[E1129 13:33:42.672968673 ProcessGroupNCCL.cpp:2303] [PG ID 3 PG GUID 7(tp) Rank 1]  failure detected "
            "by watchdog at work sequence id: 12 PG status: last enqueued work: 14, last completed work: 11\n")
    assert rows(parse_text(tmp_path, line, rank=None), "rank_status")[0]["rank"] is None
    assert rows(parse_text(tmp_path, line, rank=5), "rank_status")[0]["rank"] == 5


def test_watchdog_stuck_and_communicator_aborted_are_events(tmp_path):
    # The heartbeat monitor's and the abort's messages (ProcessGroupNCCL.cpp format strings).
    text = (
        "[E1129 13:40:00.000000000 ProcessGroupNCCL.cpp:1423] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
        "collectives.\n"
        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 0.\n"
    )
    events = parse_text(tmp_path, text)["events"]
    stuck = events.filter(pl.col("kind") == "watchdog_stuck").to_dicts()
    assert json.loads(stuck[0]["attrs"])["stuck_s"] == 480
    assert events.filter(pl.col("kind") == "nccl_comm_aborted").height == 1


def test_watchdog_lines_whose_header_is_not_parsed_still_give_the_collective_and_status(tmp_path):
    # tests/realworld/d_basicsr_nccl_timeout_737 (XPixelGroup/BasicSR#737): c10's header prints the
    # month unpadded ("E626"), and the line still gives the work and the PG status.
    text = (
        "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran "
        "for 600020 milliseconds before timing out.\n"
        "[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception "
        "(either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed "
        "NCCL work: 807.\n"
    )
    tables = parse_text(tmp_path, text, rank=None)
    (work,) = rows(tables, "collectives", source="watchdog")
    assert (work["rank"], work["pg"], work["seq_id"], work["op"], work["numel_in"], work["state"]) == (
        1, "0", 808, "ALLREDUCE", 9801523, "timed_out")
    (status,) = rows(tables, "rank_status")
    assert (status["rank"], status["last_enqueued"], status["last_completed"], status["timed_out_seq"]) == (
        1, 811, 807, 808)


# tests/realworld/d_milabench_nccl_timeout_wrapped_269 (mila-iqia/milabench#269): a runner's
# "host [stderr] " tag on each line, and each long line wrapped onto the next, unprefixed.
WRAPPED = (
    "dinov2-giant-nodes.node04 [stderr] [rank14]:[E909 09:55:29.307629539 ProcessGroupNCCL.cpp:607] [Rank 14] "
    "Watchdog caught collective operation timeout: \n"
    "WorkNCCL(SeqNum=2070, OpType=REDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600034 milliseconds "
    "before timing out.\n"
    "dinov2-giant-nodes.node04 [stderr] [rank12]:[E909 09:55:29.313379098 ProcessGroupNCCL.cpp:1664] [PG 0 "
    "(default_pg) Rank 12] Exception (either an error or timeout) detected\n"
    "by watchdog at work: 2070, last enqueued NCCL work: 2070, last completed NCCL work: 2069.\n"
)


def test_a_wrapped_watchdog_line_is_read_joined_at_its_first_line(tmp_path):
    tables = parse_text(tmp_path, WRAPPED, rank=None)
    (work,) = rows(tables, "collectives", source="watchdog")
    assert (work["rank"], work["seq_id"], work["op"], work["timeout_ms"], work["line_no"]) == (
        14, 2070, "REDUCE", 600000, 1)
    status = {r["rank"]: r for r in rows(tables, "rank_status")}
    assert (status[12]["pg"], status[12]["last_enqueued"], status[12]["last_completed"], status[12]["timed_out_seq"],
            status[12]["line_no"]) == ("0", 2070, 2069, 2070, 3)


def test_an_unwrapped_line_after_a_finished_watchdog_line_is_not_joined(tmp_path):
    # A line of its own (the async exception, no prefix) after a complete watchdog line stays itself.
    text = (OLD_WATCHDOG[0][0] + "\n"
            "Collective WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000000) raised the "
            "following async exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), "
            "NCCL version 2.25.1\n")
    got = sorted((r["line_no"], r["seq_id"], r["state"]) for r in rows(parse_text(tmp_path, text, rank=None),
                                                                        "collectives", source="watchdog"))
    assert got == [(1, 15173, "timed_out"), (2, 2, "failed")]


# ---------------------------------------------------------------- PyTorch's NCCL error reports


# Each a real report: (case, lines, rank, result code, error class, last error).
NCCL_REPORTS = [
    # tests/realworld/d_nccl_unhandled_cuda_error_1410 (NVIDIA/nccl#1410, NCCL 2.20.5): a CUDA call inside NCCL.
    ("unhandled_cuda",
     ("[rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
      "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n"
      "[rank7]: ncclUnhandledCudaError: Call to CUDA function failed.\n"
      "[rank7]: Last error:\n"
      "[rank7]: Cuda failure 1 'invalid argument'\n"),
     7, "ncclUnhandledCudaError", "cuda_failure", "Cuda failure 1 'invalid argument'"),
    # tests/realworld/d_nccl_internal_error_lightning_1514 (NVIDIA/nccl#1514, NCCL 2.14.3): the paste starts
    # mid-line; that era reported a peer's closed socket as an internal error, the last error says which.
    ("internal_error_socket",
     ("GroupNCCL.cpp:1275, internal error, NCCL version 2.14.3\n"
      "ncclInternalError: Internal check failed.\n"
      "Last error:\n"
      "Net : Connection closed by remote peer user<43236>\n"
      "Traceback (most recent call last):\n"),
     None, "ncclInternalError", "socket", "Net : Connection closed by remote peer user<43236>"),
    # tests/realworld/d_pytorch_async_ncclsystemerror_149984 (pytorch/pytorch#149984, NCCL 2.25.1): the
    # watchdog's async exception, with an empty last error.
    ("async_system_error",
     ("Collective WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000000) raised the "
      "following async exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
      "version 2.25.1\n"
      "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
      "Last error:\n"
      "\n"
      "Exception raised from checkForNCCLErrorsInternal at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL."
      "cpp:2501 (most recent call first):\n"),
     None, "ncclSystemError", "system_error", ""),
]


@pytest.mark.parametrize("case,text,rank,code,error_class,last", NCCL_REPORTS, ids=[c[0] for c in NCCL_REPORTS])
def test_pytorch_nccl_error_report_is_one_event_with_its_class(tmp_path, case, text, rank, code, error_class, last):
    (event,) = rows(parse_text(tmp_path, text, rank=None, name="console.log"), "events", kind="nccl_error")
    attrs = json.loads(event["attrs"])
    assert (event["rank"], attrs["result"], attrs["error_class"], attrs["last_error"]) == (rank, code, error_class, last)
    assert event["line_no"] == 2 and code in event["message"]
    if "NCCL error" in text.splitlines()[0]:  # the header line is whole: it leads the message
        assert event["message"].splitlines()[0] == text.splitlines()[0].removeprefix("[rank7]: ").strip()


def test_nccl_error_report_alone_is_the_nccl_error_verdict_with_its_class(tmp_path):
    (tmp_path / "console.log").write_text(NCCL_REPORTS[2][1])
    report = api.analyze(tmp_path, keep=False)
    assert report["verdict"]["signature"] == "nccl-error"
    assert "system_error" in report["verdict"]["summary"] and report["verdict"]["culprit_ranks"] == []
    (tmp_path / "console.log").write_text(NCCL_REPORTS[0][1])
    report = api.analyze(tmp_path, keep=False)
    assert report["verdict"]["signature"] == "nccl-error" and report["verdict"]["culprit_ranks"] == [7]


@pytest.mark.parametrize("text,error_class", [
    # tests/realworld/d_llm_model_hub_grpo_nccl_unhandled_cuda_115: the report's first line, then the
    # user's "--" and a result line that lost its "ncc"
    ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3699, "
     "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n--\n"
     "UnhandledCudaError: Call to CUDA function failed.\n", "cuda_failure"),
    # tests/realworld/d_chatbot_ai_nccl_internal_report_only_7 (NCCL 2.18.1): the internal error's result
    # string carries a request after " - "
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, "
     "internal error - please report this issue to the NCCL developers, NCCL version 2.18.1\n", "internal_error"),
    # open-mmlab/mmdetection#2434's title (torch 1.2 era): the line ended at the result string
    ("RuntimeError: NCCL error in: /opt/conda/conda-bld/pytorch_1565272271120/work/torch/lib/c10d/ProcessGroupNCCL.cpp:290, "
     "unhandled cuda error\n", "cuda_failure"),
])
def test_the_first_line_of_a_report_alone_is_an_nccl_error_with_its_class(tmp_path, text, error_class):
    (event,) = rows(parse_text(tmp_path, text, rank=None, name="console.log"), "events", kind="nccl_error")
    assert json.loads(event["attrs"])["error_class"] == error_class and event["line_no"] == 1
    # with its result-code line after it, the report is still one event, at the result line
    whole = NCCL_REPORTS[0][1]
    assert [e["line_no"] for e in rows(parse_text(tmp_path, whole, rank=None, name="console.log"), "events",
                                       kind="nccl_error")] == [2]


# ---------------------------------------------------------------- gloo's transport timeout


def test_gloo_transport_timeout_is_an_event_even_bare_or_cut(tmp_path):
    # tests/realworld/d_deimv2_gloo_recv_timeout_bare_65 (the bare line) and
    # d_dfine_gloo_and_nccl_timeout_75 (two ranks' output interleaved mid-line).
    text = (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for "
        "recv operation to complete\n"
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting 1800000ms for "
        "send operation to completeRuntimeError\n"
        ": [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv "
        "operation to complete\n"
    )
    got = rows(parse_text(tmp_path, text, rank=None), "events", kind="gloo_timeout")
    assert [(e["line_no"], e["source"], json.loads(e["attrs"])["op"], json.loads(e["attrs"])["timeout_ms"])
            for e in got] == [(1, "unbound_buffer.cc:81", "recv", 1800000), (2, "unbound_buffer.cc:133", "send", 1800000),
                              (3, "unbound_buffer.cc:81", "recv", 1800000)]


# ---------------------------------------------------------------- the flight recorder analyzer's report


# tests/realworld/d_pytorch_fr_trace_missing_ranks_140969 (pytorch/pytorch#140969, its test plan's output).
FR_TRACE = """Not all ranks joining collective: sequence number: 31117
internal record id: 31116
group info: 0:default_pg
collective: nccl:all_reduce
missing ranks: {3, 4, 5, 6, 7}
input sizes: [[1571911]]
output sizes: [[1571911]]
world size: 8
expected ranks: {0, 1, 2, 3, 4, 5, 6, 7}
collective state: scheduled
collective stack trace:
 all_reduce at /packages/fblearner.flow.canary/workflow#link-tree/torch/distributed/distributed_c10d.py:2707
wrapper at /packages/fblearner.flow.canary/workflow#link-tree/torch/distributed/c10d_logger.py:81
sync_buffers at /packages/fblearner.flow.canary/workflow#link-tree/xri_mapsr/neural_fields/models/gaussian_splatting.py:650
"""
# The 2.5 form, as the flight recorder tutorial (pytorch/tutorials, flight_recorder_tutorial.rst) prints it.
FR_TRACE_25 = """  Not all ranks joining collective 5 at entry 4
  group info: 0:default_pg
  collective: nccl:all_reduce
  missing ranks: {1}
  input sizes: [[3, 4]]
  output sizes: [[3, 4]]
  expected ranks: 2
  collective state: scheduled
  collective stack trace:
    all_reduce at /home/cpio/local/pytorch/torch/distributed/distributed_c10d.py:2696
    wrapper at /home/cpio/local/pytorch/torch/distributed/c10d_logger.py:83
    <module> at /home/cpio/test/crash.py:44
"""


def test_flight_recorder_analyzer_report_names_the_missing_ranks(tmp_path):
    (event,) = rows(parse_text(tmp_path, "Buck UI: https://example\n" + FR_TRACE, rank=None, name="fr_trace.txt"),
                    "events", kind="fr_not_joined")
    a = json.loads(event["attrs"])
    assert (event["line_no"], a["seq"], a["pg"], a["op"], a["missing_ranks"], a["expected_ranks"], a["world_size"],
            a["state"]) == (2, 31117, "0", "nccl:all_reduce", [3, 4, 5, 6, 7], list(range(8)), 8, "scheduled")
    assert a["user_frame"].endswith("models/gaussian_splatting.py:650") and a["user_function"] == "sync_buffers"
    (old,) = rows(parse_text(tmp_path, FR_TRACE_25, rank=None, name="fr_trace.txt"), "events", kind="fr_not_joined")
    a = json.loads(old["attrs"])
    assert (a["seq"], a["missing_ranks"], a["expected_ranks"], a["world_size"], a["user_frame"]) == (
        5, [1], None, 2, "/home/cpio/test/crash.py:44")


# ---------------------------------------------------------------- DETAIL fingerprints


def test_detail_running_collective_lines_become_fingerprints(sample):
    sdir = sample("collective_mismatch_detail")
    con, run_id, _ = api.load(sdir)
    got = con.execute(
        "SELECT rank, seq_id, op, numel_in, dtypes FROM collectives WHERE run_id = ? AND source = 'detail' "
        "ORDER BY rank, seq_id", [run_id]).fetchall()
    logged = lines_with(sdir, "Running collective: CollectiveFingerPrint")
    assert len(got) == len(logged) and len(got) >= 2
    for rank, seq, op, numel, dtypes in got:
        line = next(x for x in logged if x.startswith(f"[rank{rank}]:") and f"SequenceNumber={seq}," in x)
        assert f"OpType={op}," in line
        shape = line.split("TensorShape=[", 1)[1].split("]", 1)[0]
        assert numel == eval_product(shape)
        assert f"TensorDtypes={json.loads(dtypes)['in'][0]}," in line
    # Both ranks ran the same fingerprints: nothing to report.
    report = api.analyze(sdir, keep=False)
    assert report["verdict"]["signature"] == "native-crash"


def eval_product(shape: str) -> int:
    n = 1
    for d in shape.split(","):
        n *= int(d)
    return n


# ProcessGroupWrapper.cpp's format (anchors.md §5.2). The gloo runs here crash in DDP's
# constructor under DETAIL before the planted mismatch (sample_logs/README.md), so no sample
# holds one: the first line is as a 2xH200 NCCL run of the same script printed it, the
# second (a collective without tensors: no comma before OpType) as a user reported it.
DETAIL_MISMATCH = (
    "[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=26, OpType=_ALLGATHER_BASE, TensorShape=[4000], TensorDtypes=Float, "
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), requires_grad=false "
    "(default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=26, OpType=_ALLGATHER_BASE, TensorShape=[4096], TensorDtypes=Float, "
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), requires_grad=false "
    "(default), pinned_memory=false (default), memory_format=(nullopt))).Collectives differ in the following aspects:"
    "   Tensor Tensor shapes: 4000vs 4096"
)
DETAIL_NO_TENSORS = (
    "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=1649OpType=BARRIER), but Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=0OpType=GATHER).Collectives differ in the following aspects: "
    "\t Sequence number: 1649vs 0  Op type: BARRIERvs GATHER"
)


def test_detail_mismatch_gives_both_ranks_fingerprints(tmp_path):
    got = rows(parse_text(tmp_path, DETAIL_MISMATCH + "\n", rank=1), "collectives", source="detail")
    assert sorted((r["rank"], r["seq_id"], r["op"], r["numel_in"]) for r in got) == [
        (0, 26, "_ALLGATHER_BASE", 4096), (1, 26, "_ALLGATHER_BASE", 4000)]
    got = rows(parse_text(tmp_path, DETAIL_NO_TENSORS + "\n", rank=0), "collectives", source="detail")
    assert sorted((r["rank"], r["seq_id"], r["op"], r["numel_in"]) for r in got) == [
        (0, 1649, "BARRIER", None), (1, 0, "GATHER", None)]


# ---------------------------------------------------------------- never raises


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=1, max_value=400), junk=st.text(max_size=30))
def test_mutated_real_lines_never_raise(tmp_path, cut, junk):
    base = [SOURCE_FORMAT_WARNS["ib"], OLD_WATCHDOG[0][0], OLD_STATUS[0][0], DETAIL_MISMATCH, *WRAPPED.splitlines(),
            *NCCL_REPORTS[0][1].splitlines(), *FR_TRACE.splitlines()[:6],
            ("vm:3640:3688 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x4a28c00000 recvbuff 0x4a28c00000 count "
             "4194304 datatype 7 op 0 root 0 comm 0x1fbee8b0 [nranks=2] stream 0x270afe20")]
    text = "\n".join(line[:cut] + junk + line[cut:] for line in base) + "\n"
    tables = parse_text(tmp_path, text)
    assert "events" in tables

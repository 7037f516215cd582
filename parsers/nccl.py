"""NCCL's own debug lines and ProcessGroupNCCL's lines, into ``events``, ``collectives`` and ``rank_status``.

Real lines (NCCL 2.28.9, PyTorch 2.11, ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL``):

    vm:3640:3640 [0] NCCL INFO ncclCommInitRankConfig comm 0x1fbee8b0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x5c3279b975931d3d - Init COMPLETE
    vm:3640:3688 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x4a28c00000 recvbuff 0x4a28c00000 count 4194304 datatype 7 op 0 root 0 comm 0x1fbee8b0 [nranks=2] stream 0x270afe20
    [I1129 13:32:58.205777547 ProcessGroupNCCL.cpp:988] [PG ID 0 PG GUID 0 Rank 0] ProcessGroupNCCL initialization options: size: 2, global rank: 0, TIMEOUT(ms): 30000, ...
    [E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=32, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=30000) ran for 30050 milliseconds before timing out.
    [E1129 13:33:42.672968673 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 32 PG status: last enqueued work: 36, last completed work: 31

What each record becomes:

- every ``NCCL WARN`` (and ATTN/TRACE/CALL) line, and ``Init COMPLETE``: an ``events`` row
  (``nccl_warn`` with ``attrs.error_class``: cuda_failure, ib, socket, timeout, net,
  remote_error, system_error, internal_error, invalid_usage or other; ``nccl_init``);
- a ``NCCL_DEBUG_SUBSYS=COLL`` line: a ``collectives`` row (source ``nccl_log``). NCCL 2.28
  prints ``opCount 0`` for every call, so ``seq_id`` is the line's ordinal on its
  communicator in this process (1-based), which is ProcessGroupNCCL's sequence number for
  plain collectives (hang_stuck: 36 lines on rank 0, "last enqueued work: 36"). ``pg`` is
  the ``commId`` of the communicator's init line (the same on every rank), else the comm
  pointer; ``dtypes`` names NCCL's datatype enum the way PyTorch does (7 = ncclFloat32 = Float);
- the ProcessGroupNCCL watchdog family, every form in reference/anchors.md §5.1 (the
  ``[PG ID p PG GUID g(desc) Rank r]``, ``[PG g (desc) Rank r]``, ``[PG g Rank r]`` and
  ``[Rank r]`` prefixes; ``WorkNCCL(...)`` with and without NumelIn/NumelOut or SeqNum):
  a timed-out or failed ``WorkNCCL`` is a ``collectives`` row (source ``watchdog``); the PG
  status it reports (last enqueued / completed, the timed-out sequence) is a
  ``rank_status`` row; "watchdog got stuck" and "NCCL communicator was aborted" are events;
  the flight recorder's frames printed under "Stack trace of the failed collective:" are
  ``stacks`` rows (source ``flight_recorder``, ``origin_line`` the header's line).

``pg`` is the process group's GUID (its name: "0" for the default group), the key the
flight recorder uses too. The rank is the line's (``[rankN]:`` prefix, or the file's);
only where neither is known, and the group is the default one, the prefix's ``Rank r``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import conform, json_attrs

from .lines import extract_groups, header_source

_NCCL = (
    r"^(?:\[[\d\- :.,]+\] )?(?<host>[^\s:\[\]]+):(?<npid>\d+):(?<tid>\d+) \[(?<dev>\d+)\] "
    r"(?:[\d.]+ )?(?:(?<where>\S+:\d+)(?: \((?<func>[^)]*)\))? )?NCCL (?<nlevel>INFO|WARN|ATTN|TRACE|CALL) ?(?<nmsg>.*)$"
)
_INIT = (
    r"comm (?<comm>0x[0-9a-f]+) rank (?<rank>\d+) nranks (?<nranks>\d+) cudaDev (?<dev>\d+)"
    r"(?: nvmlDev \d+)? busId (?<bus>[0-9a-fx]+)(?: commId (?<comm_id>0x[0-9a-f]+))?.* - Init (?:START|COMPLETE)"
)
_PG_INIT = (
    r"(?:\[PG (?:ID )?(?<pg>\S+).*?\] )?ProcessGroupNCCL initialization options: size: (?<size>\d+), "
    r"global rank: (?<grank>\d+), TIMEOUT\(ms\): (?<timeout>\d+)"
)
# ncclEnqueueCheck: "%s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p [nranks=%d] stream %p"
_COLL = (
    r"^(?<op>\w+): opCount (?<op_count>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (?<count>\d+) "
    r"datatype (?<datatype>\d+) op (?<redop>\d+) root (?<root>-?\d+) comm (?<comm>\S+) \[nranks=(?<nranks>\d+)\]"
)
# ncclDataType_t (nccl.h) by the name PyTorch prints for the same scalar type.
_NCCL_DTYPES = {0: "Char", 1: "Byte", 2: "Int", 3: "UInt32", 4: "Long", 5: "UInt64", 6: "Half", 7: "Float",
                8: "Double", 9: "BFloat16", 10: "Float8_e4m3fn", 11: "Float8_e5m2"}

# First match wins: the transport, when the line names one, says more than the result code.
_ERROR_CLASSES = (
    ("cuda_failure", r"(?i)cuda failure|cuda error|ncclUnhandledCudaError|unhandled cuda"),
    ("ib", r"NET/IB|\bibv_|\bIB\b|\bRoCE\b|\bmlx5"),
    ("socket", r"(?i)NET/Socket|socket|connection (?:closed|refused|reset)|connect to \S+ failed"),
    ("timeout", r"(?i)timed? ?out\b|timeout"),
    ("net", r"(?i)\bnet\b|network|\bproxy|bootstrap"),
    ("remote_error", r"(?i)remote error|ncclRemoteError|remote process"),
    ("system_error", r"(?i)system error|ncclSystemError|system call|errno|call to \S+ failed"),
    ("internal_error", r"(?i)internal error|ncclInternalError|internal check"),
    ("invalid_usage", r"(?i)invalid usage|ncclInvalidUsage|invalid|duplicate gpu|mismatched"),
)

# The watchdog family: a cheap substring test first, then the regexes on what passed.
_WATCHDOG_MARKERS = [
    "WorkNCCL(", "failure detected by watchdog", "Timeout at NCCL work", "detected by watchdog at work",
    "Received a dump signal", "watchdog got stuck", "communicator was aborted",
]
_PREFIX = (
    r"\[PG ID (?<pg_id>\d+) PG GUID (?<guid>[^\s(\]]+)(?:\((?<desc>[^)]*)\))? Rank (?<pg_rank>\d+)\]"
    r"|\[PG (?<old_pg>[^\s(\]]+)(?: \((?<old_desc>[^)]*)\))? Rank (?<old_rank>\d+)\]"
    r"|\[Rank (?<work_rank>\d+)\]"
)
# operator<<(WorkNCCL), every version: SeqNum and NumelIn/NumelOut came later; very old
# releases printed the first tensor's shape instead.
_WORK = (
    r"WorkNCCL\((?:SeqNum=(?<seq>\d+),? ?)?OpType=(?<op>\w+)(?:, NumelIn=(?<numel_in>-?\d+), NumelOut=(?<numel_out>-?\d+))?"
    r"(?:, TensorShape=\[(?<shape>[^\]]*)\])?(?:, Timeout\(ms\)=(?<timeout>\d+))?\)(?: ran for (?<ran_ms>\d+) milliseconds)?"
)
_STATUS = (
    r"(?:failure detected by watchdog at work sequence id: (?<seq_a>\d+) PG status: last enqueued work: (?<enq_a>-?\d+), "
    r"last completed work: (?<done_a>-?\d+))"
    r"|(?:(?:Timeout at NCCL work|detected by watchdog at work): (?<seq_b>\d+), last enqueued NCCL work: (?<enq_b>-?\d+), "
    r"last completed NCCL work: (?<done_b>-?\d+))"
    r"|(?:Received a dump signal .*?from (?:this local rank| *rank (?<from_rank>\d+))\b.*?Last enqueued NCCL work: "
    r"(?<enq_c>-?\d+), last completed NCCL work: (?<done_c>-?\d+))"
)


def _state(state: dict) -> dict:
    """What earlier chunks of a file taught: communicator ids, and lines counted per comm (keyed
    by file, pid and comm)."""
    return state.setdefault("nccl", {"comms": {}, "counts": {}})


def _error_class(text: pl.Expr) -> pl.Expr:
    expr = pl.lit("other")
    for name, pattern in reversed(_ERROR_CLASSES):
        expr = pl.when(text.str.contains(pattern)).then(pl.lit(name)).otherwise(expr)
    return expr


# The NCCL lines any record comes from; the rest of NCCL's INFO chatter (rings, channels,
# plugins) is dropped before a regex sees it.
_NCCL_KEPT = [" NCCL WARN", " NCCL ATTN", " NCCL TRACE", " NCCL CALL", " - Init ", ": opCount "]


def _nccl_lines(own: pl.DataFrame) -> pl.DataFrame:
    return own.filter(pl.col("text").str.contains_any(_NCCL_KEPT)).with_columns(
        extract_groups("text", _NCCL).alias("n")
    ).unnest("n").filter(pl.col("host").is_not_null())


def _nccl_events(lines: pl.DataFrame) -> pl.DataFrame:
    init = extract_groups("nmsg", _INIT)
    kept = lines.filter(
        (pl.col("nlevel") != "INFO") | pl.col("nmsg").str.contains(" - Init COMPLETE", literal=True)
    )
    field = lambda f: init.struct.field(f)
    return conform("events", kept.select(
        "rank",
        pl.col("ts_ff").alias("ts"),
        "line_no",
        pl.col("nlevel").str.slice(0, 1).alias("level"),
        pl.col("where").alias("source"),
        pl.when(pl.col("nlevel") == "INFO").then(pl.lit("nccl_init")).otherwise(pl.lit("nccl_warn")).alias("kind"),
        pl.col("nmsg").str.slice(0, 2000).alias("message"),
        pl.col("npid").cast(pl.Int32, strict=False).alias("pid"),
        pl.when(field("comm").is_not_null())
        .then(json_attrs(host=pl.col("host"), comm=field("comm"), comm_rank=field("rank").cast(pl.Int64, strict=False),
                         nranks=field("nranks").cast(pl.Int64, strict=False), device=field("dev").cast(pl.Int64, strict=False),
                         bus_id=field("bus"), comm_id=field("comm_id")))
        .when(pl.col("nlevel") == "WARN")
        .then(json_attrs(host=pl.col("host"), device=pl.col("dev").cast(pl.Int64, strict=False),
                         error_class=_error_class(pl.col("nmsg")), function=pl.col("func")))
        .otherwise(json_attrs(host=pl.col("host"), device=pl.col("dev").cast(pl.Int64, strict=False)))
        .alias("attrs"),
        "file",
    ))


def _remember_comms(lines: pl.DataFrame, state: dict) -> None:
    inits = lines.filter(pl.col("nmsg").str.contains(" - Init ", literal=True)).select(
        "file", "npid", extract_groups("nmsg", _INIT).alias("i")
    ).unnest("i").filter(pl.col("comm").is_not_null())
    comms = _state(state)["comms"]
    for file, npid, comm, comm_id, rank in inits.select("file", "npid", "comm", "comm_id", "rank").iter_rows():
        comms[(file, npid, comm)] = (comm_id, int(rank))


def _coll_rows(lines: pl.DataFrame, state: dict) -> pl.DataFrame:
    """NCCL_DEBUG_SUBSYS=COLL lines: one collective call each, numbered per communicator."""
    found = lines.filter(pl.col("nmsg").str.contains(": opCount ", literal=True)).with_columns(
        extract_groups("nmsg", _COLL).alias("c")
    ).unnest("c").filter(pl.col("count").is_not_null())
    if found.is_empty():
        return conform("collectives", found)
    state = _state(state)
    key = ["file", "npid", "comm"]
    known = pl.DataFrame(
        [{"file": f, "npid": p, "comm": c, "offset": state["counts"].get((f, p, c), 0),
          "comm_id": state["comms"].get((f, p, c), (None, None))[0],
          "comm_rank": state["comms"].get((f, p, c), (None, None))[1]}
         for f, p, c in found.select(key).unique().iter_rows()],
        schema={"file": pl.String, "npid": pl.String, "comm": pl.String, "offset": pl.Int64, "comm_id": pl.String,
                "comm_rank": pl.Int32},
    )
    found = found.join(known, on=key, how="left").with_columns(
        (pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(key) + pl.col("offset")).alias("seq_id"),
        pl.col("count").cast(pl.Int64, strict=False),
        pl.col("nranks").cast(pl.Int64, strict=False),
    )
    for file, npid, comm, n in found.group_by(key).agg(pl.col("seq_id").max()).iter_rows():
        state["counts"][(file, npid, comm)] = n
    op = pl.col("op")
    count, nranks = pl.col("count"), pl.col("nranks")
    dtype = pl.col("datatype").cast(pl.Int64, strict=False).replace_strict(_NCCL_DTYPES, default=None, return_dtype=pl.String)
    return conform("collectives", found.select(
        pl.coalesce(pl.col("rank"), pl.col("comm_rank")).alias("rank"),
        pl.lit("nccl_log").alias("source"),
        pl.coalesce(pl.col("comm_id"), pl.col("comm")).alias("pg"),
        "seq_id",
        "op",
        pl.when(op == "ReduceScatter").then(count * nranks).otherwise(count).alias("numel_in"),
        pl.when(op == "AllGather").then(count * nranks).otherwise(count).alias("numel_out"),
        json_attrs(count=count, nranks=nranks, root=pl.col("root").cast(pl.Int64, strict=False)).alias("sizes"),
        pl.when(dtype.is_not_null()).then(json_attrs(**{"in": pl.concat_list(dtype), "out": pl.concat_list(dtype)}))
        .otherwise(json_attrs(nccl_datatype=pl.col("datatype").cast(pl.Int64, strict=False))).alias("dtypes"),
        pl.lit("scheduled").alias("state"),
        pl.col("ts_ff").alias("t_created"),
        "line_no",
        "file",
    ))


def _pg_init_events(own: pl.DataFrame) -> pl.DataFrame:
    found = header_source(own.filter(pl.col("msg").str.contains(_PG_INIT_MARKER, literal=True))).with_columns(
        extract_groups("msg", _PG_INIT).alias("g")
    ).unnest("g").filter(pl.col("size").is_not_null())
    return conform("events", found.select(
        pl.coalesce(pl.col("rank"), pl.col("grank").cast(pl.Int32, strict=False)).alias("rank"),
        pl.col("ts_ff").alias("ts"),
        "line_no",
        "level",
        pl.col("src").alias("source"),
        pl.lit("pg_init").alias("kind"),
        "msg",
        json_attrs(pg=pl.col("pg"), size=pl.col("size").cast(pl.Int64, strict=False), global_rank=pl.col("grank").cast(pl.Int64, strict=False),
                   timeout_ms=pl.col("timeout").cast(pl.Int64, strict=False)).alias("attrs"),
        "file",
    ).rename({"msg": "message"}))


def _watchdog_lines(own: pl.DataFrame) -> pl.DataFrame:
    """The watchdog family's lines, with their prefix, WorkNCCL and PG-status fields parsed."""
    lines = own.filter(pl.col("msg").str.contains_any(_WATCHDOG_MARKERS))
    if lines.is_empty():
        return lines
    df = lines.with_columns(
        extract_groups("msg", _PREFIX).alias("p"),
        extract_groups("msg", _WORK).alias("w"),
        extract_groups("msg", _STATUS).alias("s"),
    ).unnest("p", "w", "s")
    i64 = lambda c: pl.col(c).cast(pl.Int64, strict=False)
    pg = pl.coalesce(pl.col("guid"), pl.col("old_pg"))
    prefix_rank = pl.coalesce(pl.col("pg_rank"), pl.col("old_rank"), pl.col("work_rank")).cast(pl.Int32, strict=False)
    df = df.with_columns(
        pg.alias("pg"),
        pl.coalesce(i64("seq"), i64("seq_a"), i64("seq_b")).alias("seq_id"),
        pl.coalesce(i64("enq_a"), i64("enq_b"), i64("enq_c")).alias("last_enqueued"),
        pl.coalesce(i64("done_a"), i64("done_b"), i64("done_c")).alias("last_completed"),
        prefix_rank.alias("prefix_rank"),
    )
    # A "[Rank r] Watchdog caught ... WorkNCCL(SeqNum=32 ...)" line names no group: the
    # group is that of the rank's other lines about the same sequence number.
    rank_key = pl.coalesce(pl.col("rank"), pl.col("prefix_rank"))
    df = df.with_columns(rank_key.alias("_rank"))
    groups = df.filter(pl.col("pg").is_not_null() & pl.col("seq_id").is_not_null()).group_by(
        "file", "_rank", "seq_id").agg(pl.col("pg").first().alias("_pg"))
    df = df.join(groups, on=["file", "_rank", "seq_id"], how="left").with_columns(pl.coalesce("pg", "_pg").alias("pg"))
    # The prefix's "Rank r" is the rank within the group: it is the global rank only in the default group.
    return df.with_columns(
        pl.when(pl.col("rank").is_not_null()).then(pl.col("rank"))
        .when(pl.col("pg").is_null() | (pl.col("pg") == "0")).then(pl.col("prefix_rank"))
        .otherwise(pl.lit(None)).cast(pl.Int32, strict=False).alias("rank")
    )


def _watchdog_collectives(df: pl.DataFrame) -> pl.DataFrame:
    works = df.filter(pl.col("op").is_not_null() & (
        pl.col("msg").str.contains("Watchdog caught collective operation timeout", literal=True)
        | pl.col("msg").str.contains("timed out in blocking wait", literal=True)
        | pl.col("msg").str.contains("raised the following async exception", literal=True)))
    if works.is_empty():
        return conform("collectives", works)
    timed_out = ~pl.col("msg").str.contains("raised the following async exception", literal=True)
    shape_numel = pl.col("shape").str.split(",").list.eval(  # safe: Polars list.eval
        pl.element().str.strip_chars().cast(pl.Int64, strict=False)).list.eval(pl.element().product()).list.first()  # safe: Polars list.eval
    rows = works.select(
        "rank",
        pl.lit("watchdog").alias("source"),
        "pg",
        "seq_id",
        "op",
        pl.coalesce(pl.col("numel_in").cast(pl.Int64, strict=False),
                    pl.when(pl.col("shape").is_not_null()).then(shape_numel)).alias("numel_in"),
        pl.col("numel_out").cast(pl.Int64, strict=False).alias("numel_out"),
        pl.when(pl.col("shape").is_not_null()).then(pl.concat_str([pl.lit('{"in": [['), pl.col("shape"), pl.lit("]]}")]))
        .alias("sizes"),
        pl.when(timed_out).then(pl.lit("timed_out")).otherwise(pl.lit("failed")).alias("state"),
        # "ran for" counts from the work's creation (enqueue) to the check that timed it out.
        (pl.col("ts") - pl.duration(milliseconds=pl.col("ran_ms").cast(pl.Int64, strict=False))).alias("t_created"),
        pl.col("timeout").cast(pl.Int64, strict=False).alias("timeout_ms"),
        "line_no",
        "file",
    )
    # The same work is printed three or four times (the timeout, the watchdog's exception,
    # terminate's what()): keep the first, preferring a line that knew the group.
    return conform("collectives", rows.sort("line_no").unique(
        subset=["file", "rank", "pg", "seq_id", "op"], keep="first", maintain_order=True))


def _rank_status(df: pl.DataFrame) -> pl.DataFrame:
    timed_out = pl.col("msg").str.contains("Watchdog caught collective operation timeout", literal=True) & pl.col(
        "seq_id").is_not_null()
    status = df.filter(pl.col("last_enqueued").is_not_null() | timed_out)
    if status.is_empty():
        return conform("rank_status", status)
    is_failure = pl.col("msg").str.contains_any(
        ["failure detected by watchdog", "Timeout at NCCL work", "detected by watchdog at work", "WorkNCCL("])
    rows = status.with_columns(
        pl.when(is_failure).then(pl.col("seq_id")).alias("timed_out_seq")
    ).group_by("file", "rank", "pg", maintain_order=True).agg(
        pl.col("last_enqueued").max(),
        pl.col("last_completed").max(),
        pl.col("timed_out_seq").min(),
        pl.col("line_no").min(),
    )
    return conform("rank_status", rows.with_columns(pl.lit("watchdog").alias("source")))


def _watchdog_events(df: pl.DataFrame) -> pl.DataFrame:
    msg = pl.col("msg")
    found = header_source(df.filter(msg.str.contains_any(["watchdog got stuck", "communicator was aborted"])))
    if found.is_empty():
        return conform("events", found)
    stuck = msg.str.extract(r"watchdog got stuck for (\d+) seconds", 1).cast(pl.Int64, strict=False)
    return conform("events", found.select(
        "rank",
        pl.col("ts_ff").alias("ts"),
        "line_no",
        pl.coalesce(pl.col("level"), pl.lit("E")).alias("level"),
        pl.col("src").alias("source"),
        pl.when(msg.str.contains("watchdog got stuck", literal=True)).then(pl.lit("watchdog_stuck"))
        .otherwise(pl.lit("nccl_comm_aborted")).alias("kind"),
        msg.str.slice(0, 2000).alias("message"),
        "pid",
        json_attrs(pg=pl.col("pg"), stuck_s=stuck).alias("attrs"),
        "file",
    ))


_FR_FRAME = r"^#(?<depth>\d+) (?<function>\S+) from (?<file>.+):(?<line>\d+)$"
_FAILED_STACK = "Stack trace of the failed collective:"


def _failed_collective_stacks(df: pl.DataFrame, own: pl.DataFrame) -> pl.DataFrame:
    """The watchdog's "Stack trace of the failed collective:" and the flight recorder's frames under it.

        [rank0]:[E1129 15:01:38.453308182 ProcessGroupNCCL.cpp:733] Stack trace of the failed collective:
        #0 all_reduce from /opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:3068
        #2 sync_metric from /work/main/sample_logs/generate/train.py:270
    """
    if not own.filter(pl.col("msg").str.contains(_FAILED_STACK, literal=True)).height:
        return conform("stacks", own.clear())
    header = pl.col("msg").str.contains(_FAILED_STACK, literal=True)
    frame_line = pl.col("text").str.contains(r"^#\d+ \S+ from ")
    # A block is the header and the frame lines right after it in its file: any other line ends it.
    block = ["_log", "_seg"]
    blocks = df.rename({"file": "_log"}).with_columns(
        (~(header | frame_line)).cum_sum().alias("_seg"),
        pl.when(header).then(pl.col("pos")).alias("_head_pos"),
        pl.when(header).then(pl.col("line_no")).alias("_head"),
        pl.when(header).then(pl.col("rank")).alias("_head_rank"),
    ).with_columns(
        pl.col("_head_pos", "_head", "_head_rank").forward_fill().over(block),
    ).filter(frame_line & pl.col("_head").is_not_null()
             & pl.col("_head_pos").is_in(own.filter(header)["pos"].implode()))
    frames = header_source(blocks).with_columns(extract_groups("text", _FR_FRAME).alias("f")).unnest("f")
    return conform("stacks", frames.select(
        pl.coalesce(pl.col("_head_rank"), pl.col("rank")).alias("rank"),
        "pid",
        pl.lit("failed collective").alias("thread"),
        pl.lit("timed_out").alias("thread_state"),
        pl.col("depth").cast(pl.Int32, strict=False),
        "function",
        "file",  # the frame's
        pl.col("line").cast(pl.Int32, strict=False),
        pl.lit("flight_recorder").alias("source"),
        pl.col("_log").alias("origin"),
        pl.col("_head").alias("origin_line"),
    ))


_PG_INIT_MARKER = "initialization options: size:"


# A chunk none of whose lines holds one of these is skipped before any frame work.
LINES = "|".join(re.escape(m) for m in (*_NCCL_KEPT, _PG_INIT_MARKER, _FAILED_STACK, *_WATCHDOG_MARKERS))


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    # Every record below starts on a line that LINES matches (all own holds): each record's
    # own test runs on those few.
    lines = _nccl_lines(own)
    if not lines.is_empty():
        _remember_comms(lines, state)
        yield "events", _nccl_events(lines)
        yield "collectives", _coll_rows(lines, state)
    yield "events", _pg_init_events(own)
    yield "stacks", _failed_collective_stacks(df, own)
    watchdog = _watchdog_lines(own)
    if not watchdog.is_empty():
        yield "collectives", _watchdog_collectives(watchdog)
        yield "rank_status", _rank_status(watchdog)
        yield "events", _watchdog_events(watchdog)

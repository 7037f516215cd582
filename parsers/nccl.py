"""NCCL's own debug lines and ProcessGroupNCCL's lines, into ``events``, ``collectives`` and ``rank_status``.

Real lines (NCCL 2.28.9, PyTorch 2.11, ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL``):

    vm:3640:3640 [0] NCCL INFO ncclCommInitRankConfig comm 0x1fbee8b0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x5c3279b975931d3d - Init COMPLETE
    vm:3640:3688 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x4a28c00000 recvbuff 0x4a28c00000 count 4194304 datatype 7 op 0 root 0 comm 0x1fbee8b0 [nranks=2] stream 0x270afe20
    [I1129 13:32:58.205777547 ProcessGroupNCCL.cpp:988] [PG ID 0 PG GUID 0 Rank 0] ProcessGroupNCCL initialization options: size: 2, global rank: 0, TIMEOUT(ms): 30000, ...
    [E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=32, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=30000) ran for 30050 milliseconds before timing out.
    [E1129 13:33:42.672968673 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 32 PG status: last enqueued work: 36, last completed work: 31

What each record becomes:

- every ``NCCL WARN`` (and ATTN/TRACE/CALL) line, and ``Init COMPLETE``: an ``events`` row
  (``nccl_warn`` with ``attrs.error_class``: collective_mismatch, cuda_failure, ib, socket,
  timeout, net, remote_error, system_error, internal_error, invalid_usage or other; ``nccl_init``);
- a ``NCCL_DEBUG_SUBSYS=COLL`` line: a ``collectives`` row (source ``nccl_log``). NCCL 2.28
  prints ``opCount 0`` for every call, so ``seq_id`` is the line's ordinal on its
  communicator in this process (1-based), which is ProcessGroupNCCL's sequence number for
  plain collectives (hang_stuck: 36 lines on rank 0, "last enqueued work: 36"). ``pg`` is
  the ``commId`` of the communicator's init line (the same on every rank), else the comm
  pointer; ``dtypes`` names NCCL's datatype enum the way PyTorch does (7 = ncclFloat32 = Float);
- an NCCL line pasted without its ``host:pid:tid [dev]`` header (``init.cc:1247 NCCL WARN
  Mismatched collective detected, ...``, NVIDIA/nccl#296, NCCL 2.4.8) is read the same way,
  host and pid NULL; NCCL's device-side mismatch check is the class ``collective_mismatch``;
- PyTorch's report of a failed NCCL call (``NCCL error in: ...`` or the watchdog's "raised the
  following async exception: NCCL error: ...", then ``ncclUnhandledCudaError: Call to CUDA
  function failed.``, ``Last error:``, NCCL's last WARN): an ``nccl_error`` event at the
  result-code line, ``attrs.error_class`` from the last error when it names a transport, else
  from the result code;
- gloo's transport timeout (``[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81]
  Timed out waiting 1800000ms for recv operation to complete``): a ``gloo_timeout`` event,
  wherever it was printed (a traceback, a bare paste, two ranks' output cut into each other);
- the flight recorder analyzer's text report (torchfrtrace, 2.5+: "Not all ranks joining
  collective, sequence number: S" and its fields): an ``fr_not_joined`` event, rank NULL, with
  the group, sequence, op, missing and expected ranks and the call site in ``attrs``;
- the ProcessGroupNCCL watchdog family, every form in reference/anchors.md §5.1 (the
  ``[PG ID p PG GUID g(desc) Rank r]``, ``[PG g (desc) Rank r]``, ``[PG g Rank r]`` and
  ``[Rank r]`` prefixes; ``WorkNCCL(...)`` with and without NumelIn/NumelOut or SeqNum):
  a timed-out or failed ``WorkNCCL`` is a ``collectives`` row (source ``watchdog``); the PG
  status it reports (last enqueued / completed, the timed-out sequence) is a
  ``rank_status`` row; "watchdog got stuck" and "NCCL communicator was aborted" are events;
  the flight recorder's frames printed under "Stack trace of the failed collective:" are
  ``stacks`` rows (source ``flight_recorder``, ``origin_line`` the header's line). A line a
  terminal wrapped (``... Watchdog caught collective operation timeout: `` then, unprefixed,
  ``WorkNCCL(SeqNum=2070, ...``; mila-iqia/milabench#269) is read joined, at its first line.
  Its header need not be parsed: ``[E ProcessGroupNCCL.cpp:737]`` (no time) and ``[E626 ...``
  (c10's unpadded month) give the same rows.

``nccl_error``, ``gloo_timeout`` and ``fr_not_joined`` carry the line's own time only (``ts``,
never the previous line's): an untimed line is no sign of life.

``pg`` is the process group's GUID (its name: "0" for the default group), the key the
flight recorder uses too. The rank is the line's (``[rankN]:`` prefix, or the file's);
only where neither is known, and the group is the default one, the prefix's ``Rank r``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import polars as pl

from postmortem.schema import conform, json_attrs

from . import scan
from .lines import extract_groups, header_source

# The "host:pid:tid [dev] " header is NCCL's (its host what is left where the user blanked it
# out: "::16674:17023 [0] graph/search.cc:703 NCCL WARN ..."); a line pasted without it ("init.cc:1247 NCCL WARN
# Mismatched collective detected, ...") still names its source and level.
_NCCL = (
    r"^(?:\[[\d\- :.,]+\] )?(?:(?<host>[^\s\[\]]*?):(?<npid>\d+):(?<tid>\d+) \[(?<dev>\d+)\] )?"
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
    # enqueue.cc / init.cc ncclGetAsyncError: the device-side check of NCCL >= 2.4 caught ranks
    # running different collectives ("... at and around rank %d" names the reporting rank).
    ("collective_mismatch", r"Mismatched collective detected|may be caused by a collective mismatch"),
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
    "WorkNCCL(", "failure detected by watchdog", "Timeout at NCCL work", "by watchdog at work",
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


# NCCL 2.2 and older printed the level without "NCCL " after the header and source line
# ("e66aa18dc444:3171:3171 [0] include/socket.h:311 WARN Socket creation failed : ..."): with
# both the header and the source present that is NCCL's line, and it is read as the newer form.
_OLD_LEVEL = r"^((?:\[[\d\- :.,]+\] )?[^\s:\[\]]+:\d+:\d+ \[\d+\] \S+:\d+ )(WARN|ATTN|TRACE|CALL) "


def _nccl_lines(own: pl.DataFrame) -> pl.DataFrame:
    return own.filter(
        pl.col("text").str.contains_any(_NCCL_KEPT) | pl.col("text").str.contains(_OLD_LEVEL)
    ).with_columns(pl.col("text").str.replace(_OLD_LEVEL, "${1}NCCL ${2} ").alias("_ntext")).with_columns(
        extract_groups("_ntext", _NCCL).alias("n")
    ).drop("_ntext").unnest("n").filter(pl.col("nlevel").is_not_null())


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
    found = found.join(known, on=key, how="left", nulls_equal=True).with_columns(
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


# A line a terminal or a log collector wrapped goes on, unprefixed, on the next line:
#     [rank14]:[E909 09:55:29.307629539 ProcessGroupNCCL.cpp:607] [Rank 14] Watchdog caught collective operation timeout:
#     WorkNCCL(SeqNum=2070, OpType=REDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600034 milliseconds ...
# Its record is the two lines joined, at the first one's place.
_CARRIED = ["text", "msg", "rank", "ts", "ts_ff", "line_no", "level", "src_at", "src_end", "pos"]


def _joined_wrapped(df: pl.DataFrame, lines: pl.DataFrame) -> pl.DataFrame:
    """``lines`` (watchdog lines of ``df``) with each line that continues the line before it
    joined to that line: a continuation has no prefix of its own ([Rank r], [PG ...], a log
    header) and follows, in its file, a watchdog-prefixed line that holds no record by itself."""
    own_prefix = pl.col("msg").str.contains(_PREFIX)
    cont = lines.filter(~own_prefix & pl.col("level").is_null() & ~pl.col("text").str.starts_with("["))
    if cont.is_empty():
        return lines
    prev = df.select(
        (pl.col("pos") + 1).alias("pos"), pl.col("file").alias("_pfile"),
        *(pl.col(c).alias(f"_p_{c}") for c in _CARRIED),
    ).filter(pl.col("pos").is_in(cont["pos"].implode()))
    opens = pl.col("_p_msg").str.contains(_PREFIX) & ~pl.col("_p_msg").str.contains_any(_WATCHDOG_MARKERS)
    joined = cont.join(prev, on="pos", how="inner").filter((pl.col("_pfile") == pl.col("file")) & opens)
    if joined.is_empty():
        return lines
    glue = lambda c: pl.when(pl.col(f"_p_{c}").str.contains(r"\s$")).then(pl.lit("")).otherwise(pl.lit(" "))
    joined = joined.with_columns(
        pl.concat_str([pl.col("_p_text"), glue("text"), pl.col("text")]).alias("_p_text"),
        pl.concat_str([pl.col("_p_msg"), glue("msg"), pl.col("msg")]).alias("_p_msg"),
        pl.coalesce(pl.col("_p_rank"), pl.col("rank")).alias("_p_rank"),
    ).with_columns(pl.col(f"_p_{c}").alias(c) for c in _CARRIED).select(lines.columns)
    # Each joined record replaces its continuation line (the line after the one it now starts on).
    rest = lines.filter(~pl.col("pos").is_in((joined["pos"] + 1).implode()))
    return pl.concat([rest, joined], how="vertical_relaxed").sort("pos")


def _watchdog_lines(df: pl.DataFrame, own: pl.DataFrame) -> pl.DataFrame:
    """The watchdog family's lines, with their prefix, WorkNCCL and PG-status fields parsed."""
    lines = own.filter(pl.col("msg").str.contains_any(_WATCHDOG_MARKERS))
    if lines.is_empty():
        return lines
    lines = _joined_wrapped(df, lines)
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


# PyTorch's report of a failed NCCL call (NCCLUtils getNcclErrorDetailStr): the result
# code's meaning on the line after "NCCL error in: <file>:<line>, <ncclGetErrorString>, NCCL
# version V" (or the watchdog's "... raised the following async exception: NCCL error: ..."),
# then "Last error:" and NCCL's last WARN text:
#     [rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
#     [rank7]: ncclUnhandledCudaError: Call to CUDA function failed.
#     [rank7]: Last error:
#     [rank7]: Cuda failure 1 'invalid argument'
_NCCL_RESULT = (
    r"^\s*(?<code>nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage|RemoteError)): "
    r"(?:Call to CUDA function failed|System call|Internal check failed|Invalid value for an argument"
    r"|This usually reflects invalid usage|A call failed possibly)"
)
_NCCL_RESULT_MARKERS = ["ncclUnhandledCudaError: ", "ncclSystemError: ", "ncclInternalError: ",
                        "ncclInvalidArgument: ", "ncclInvalidUsage: ", "ncclRemoteError: "]
# The result code's class where NCCL's last error does not name a better one (a transport).
_RESULT_CLASSES = {"ncclUnhandledCudaError": "cuda_failure", "ncclSystemError": "system_error",
                   "ncclInternalError": "internal_error", "ncclInvalidArgument": "invalid_usage",
                   "ncclInvalidUsage": "invalid_usage", "ncclRemoteError": "remote_error"}


# The report's first line on its own (a user who pasted only it, a log that cut the rest, torch
# before 1.10 that printed no result code): "NCCL error in: <file>:<line>, <ncclGetErrorString>
# [(run with NCCL_DEBUG=INFO for details)], NCCL version V" (the version since torch 1.5). Its
# class is the result string's, as NCCL's ncclGetErrorString words it.
_NCCL_ERROR_LINE_MARKER = "NCCL error in: "
_NCCL_ERROR_LINE = (r"NCCL error in: \S+:\d+, (?<reason>unhandled cuda error|unhandled system error|internal error"
                    r"|invalid argument|invalid usage|remote process exited or there was a network error)"
                    r"[^,]*(?:, NCCL version|\s*$)")
_REASON_CLASSES = {"unhandled cuda error": "cuda_failure", "unhandled system error": "system_error",
                   "internal error": "internal_error", "invalid argument": "invalid_usage",
                   "invalid usage": "invalid_usage",
                   "remote process exited or there was a network error": "remote_error"}


def _lone_report_events(df: pl.DataFrame, own: pl.DataFrame, reported: pl.Series) -> pl.DataFrame:
    """An ``nccl_error`` event for each "NCCL error in: ..." line whose result-code line does
    not follow it (``reported``: the positions of those that do)."""
    found = own.filter(pl.col("msg").str.contains(_NCCL_ERROR_LINE_MARKER, literal=True)).with_columns(
        pl.col("msg").str.extract(_NCCL_ERROR_LINE, 1).alias("reason")).filter(
        pl.col("reason").is_not_null() & ~(pl.col("pos").cast(pl.Int64) + 1).is_in(reported.implode()))
    if found.is_empty():
        return conform("events", found.clear())
    return conform("events", header_source(found).select(
        "rank", "ts", "line_no", "level", pl.col("src").alias("source"), pl.lit("nccl_error").alias("kind"),
        pl.col("msg").str.strip_chars().str.slice(0, 2000).alias("message"), "pid",
        json_attrs(error_class=pl.col("reason").replace_strict(_REASON_CLASSES, default="other",
                                                               return_dtype=pl.String)).alias("attrs"),
        "file",
    ))


def _nccl_error_events(df: pl.DataFrame, own: pl.DataFrame) -> pl.DataFrame:
    """One ``nccl_error`` event per PyTorch report of a failed NCCL call, at its result-code line,
    its message the report's lines joined: the "NCCL error" line before it (when whole), the
    code's meaning, and NCCL's last error after "Last error:"; and one for each report's first
    line that no result-code line follows."""
    found = own.filter(pl.col("msg").str.contains_any(_NCCL_RESULT_MARKERS)).with_columns(
        pl.col("msg").str.extract(_NCCL_RESULT, 1).alias("code")).filter(pl.col("code").is_not_null())
    lone = _lone_report_events(df, own, found["pos"].cast(pl.Int64))
    if found.is_empty():
        return lone
    found = found.with_columns(pl.col("pos").cast(pl.Int64).alias("_pos"))
    wanted = pl.concat([found["_pos"] + k for k in (-1, 1, 2)]).implode()
    nearby = df.select(pl.col("pos").cast(pl.Int64).alias("_pos"), "file", "msg").filter(pl.col("_pos").is_in(wanted))
    for k, name in ((-1, "before"), (1, "after"), (2, "last")):  # the line k rows away, in the same file
        near = nearby.select((pl.col("_pos") - k).alias("_pos"), pl.col("file").alias(f"_{name}_file"),
                             pl.col("msg").alias(f"_{name}"))
        found = found.join(near, on="_pos", how="left").with_columns(
            pl.when(pl.col(f"_{name}_file") == pl.col("file")).then(pl.col(f"_{name}")).alias(f"_{name}"))
    before = pl.when(pl.col("_before").str.contains("NCCL error", literal=True)).then(pl.col("_before").str.strip_chars())
    last = pl.when(pl.col("_after").str.strip_chars() == "Last error:").then(pl.col("_last").str.strip_chars())
    found = header_source(found.with_columns(before.alias("_before"), last.alias("_last")))
    by_last = _error_class(pl.coalesce(pl.col("_last"), pl.lit("")))
    by_code = pl.col("code").replace_strict(_RESULT_CLASSES, default="other", return_dtype=pl.String)
    return pl.concat([lone, conform("events", found.select(
        "rank",
        "ts",  # its own time only: an untimed line is no sign of life
        "line_no",
        "level",
        pl.col("src").alias("source"),
        pl.lit("nccl_error").alias("kind"),
        pl.concat_str([pl.col("_before"), pl.col("msg").str.strip_chars(),
                       pl.when(pl.col("_last").is_not_null()).then(pl.format("Last error: {}", pl.col("_last")))],
                      separator="\n", ignore_nulls=True).str.slice(0, 2000).alias("message"),
        "pid",
        json_attrs(result=pl.col("code"), last_error=pl.col("_last"),
                   error_class=pl.when(by_last != "other").then(by_last).otherwise(by_code)).alias("attrs"),
        "file",
    ))])


# gloo's transport gave up on a peer (gloo/transport/tcp/unbound_buffer.cc, and the ibverbs
# transport's alike): "[<file>:<line>] Timed out waiting <ms>ms for recv operation to complete".
_GLOO_TIMEOUT_MARKER = "Timed out waiting "
_GLOO_TIMEOUT = r"Timed out waiting (?<timeout>\d+)ms for (?<op>recv|send) operation to complete"


def _gloo_timeout_events(own: pl.DataFrame) -> pl.DataFrame:
    found = own.filter(pl.col("msg").str.contains(_GLOO_TIMEOUT_MARKER, literal=True)).with_columns(
        extract_groups("msg", _GLOO_TIMEOUT).alias("g"),
        pl.col("msg").str.extract(r"\[([^\]\s]*gloo[^\]\s]*:\d+)\] Timed out waiting", 1).alias("where"),
    ).unnest("g").filter(pl.col("timeout").is_not_null())
    if found.is_empty():
        return conform("events", found.clear())
    return conform("events", header_source(found).select(
        "rank",
        "ts",
        "line_no",
        "level",
        pl.coalesce(pl.col("where").str.extract(r"([^/]+:\d+)$", 1), pl.col("src")).alias("source"),
        pl.lit("gloo_timeout").alias("kind"),
        pl.col("msg").str.slice(0, 2000).alias("message"),
        "pid",
        json_attrs(timeout_ms=pl.col("timeout").cast(pl.Int64, strict=False), op=pl.col("op")).alias("attrs"),
        "file",
    ))


# The flight recorder's analyzer (torchfrtrace / fr_trace, torch/distributed/flight_recorder),
# its text output for a collective some ranks of the group never issued:
#     Not all ranks joining collective, sequence number: 4          (2.6+; 2.5: "... collective 5 at entry 4")
#     internal record id: 3
#     group info: 0:default_pg
#     collective: nccl:all_reduce
#     missing ranks: {1}
#     input sizes: [[3, 4]]
#     output sizes: [[3, 4]]
#     world size: 2                                                 ("expected ranks: 2" before 2.6)
#     expected ranks: {0, 1}
#     collective state: scheduled
#     collective stack trace:
#      all_reduce at /usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py:2696
#      <module> at /home/user/test/crash.py:44
_FR_NOT_JOINED_MARKER = "Not all ranks joining collective"
_FR_NOT_JOINED = r"^\s*Not all ranks joining collective(?:[,:]? sequence number:)? *(?<seq>\d+)(?: at entry (?<entry>\d+))?"
_FR_FIELD = (r"^\s*(?<key>internal record id|group info|collective|missing ranks|total input numel|total output numel"
             r"|input sizes|output sizes|world size|expected ranks|collective state|collective stack trace):\s*(?<value>.*)$")
_FR_TRACE_FRAME = r"^\s*(?<fr_function>\S+) at (?<fr_file>\S.*):(?<fr_line>\d+)\s*$"


def _fr_not_joined_events(df: pl.DataFrame, own: pl.DataFrame) -> pl.DataFrame:
    """One ``fr_not_joined`` event per analyzer report of ranks that never joined a collective:
    attrs name the group, sequence, op, the missing and the expected ranks, and the innermost
    frame of the user's code in the collective's stack (the stack of a rank that issued it)."""
    heads = own.filter(pl.col("msg").str.contains(_FR_NOT_JOINED_MARKER, literal=True)).with_columns(
        extract_groups("msg", _FR_NOT_JOINED).alias("h")).unnest("h").filter(pl.col("seq").is_not_null())
    if heads.is_empty():
        return conform("events", heads.clear())
    text = pl.col("text")
    head = text.str.contains(_FR_NOT_JOINED)
    field = text.str.contains(_FR_FIELD)
    frame = text.str.contains(_FR_TRACE_FRAME)
    # A report is its header and the field and frame lines right after it: any other line ends it.
    blocks = df.filter(pl.col("file").is_in(heads["file"].unique().implode())).with_columns(
        head.cum_sum().over("file").alias("_block"),
        (~(head | field | frame)).cum_sum().over("file").alias("_seg"),
    )
    starts = blocks.filter(pl.col("pos").is_in(heads["pos"].implode())).select("file", "_block", "_seg", "pos")
    body = blocks.join(starts.rename({"pos": "_head_pos"}), on=["file", "_block", "_seg"], how="inner")
    fields = body.filter(field).with_columns(extract_groups("text", _FR_FIELD).alias("f")).unnest("f")
    value = lambda key: pl.col("value").filter(pl.col("key") == key).first()
    per = fields.group_by("_head_pos").agg(
        value("group info").alias("group"), value("collective").alias("op"),
        value("missing ranks").alias("missing"), value("expected ranks").alias("expected"),
        value("world size").alias("world"), value("collective state").alias("state"),
        value("input sizes").alias("input_sizes"), value("output sizes").alias("output_sizes"))
    frames = body.filter(frame & ~field).with_columns(extract_groups("text", _FR_TRACE_FRAME).alias("fr")).unnest("fr")
    not_user = pl.col("fr_file").str.contains(r"site-packages/|dist-packages/|/torch/|^torch/|/lib/python3|^<")
    user = frames.filter(~not_user).group_by("_head_pos").agg(
        pl.format("{}:{}", pl.col("fr_file"), pl.col("fr_line")).sort_by("pos").first().alias("user_frame"),
        pl.col("fr_function").sort_by("pos").first().alias("user_function"))
    ranks = lambda c: pl.col(c).str.extract_all(r"\d+").list.eval(  # safe: Polars list.eval, not eval()
        pl.element().cast(pl.Int64, strict=False))  # safe: Polars list.eval
    expected = pl.when(pl.col("expected").str.contains(r"^\s*\{")).then(ranks("expected"))
    found = header_source(heads.join(per, left_on="pos", right_on="_head_pos", how="left")
                          .join(user, left_on="pos", right_on="_head_pos", how="left"))
    return conform("events", found.select(
        pl.lit(None, pl.Int32).alias("rank"),  # the analyzer speaks for every rank of the group
        "ts",
        "line_no",
        "level",
        pl.lit("flight recorder analyzer").alias("source"),
        pl.lit("fr_not_joined").alias("kind"),
        pl.col("msg").str.strip_chars().str.slice(0, 2000).alias("message"),
        "pid",
        json_attrs(
            seq=pl.col("seq").cast(pl.Int64, strict=False),
            pg=pl.col("group").str.extract(r"^([^:\s]+)", 1), pg_desc=pl.col("group"), op=pl.col("op"),
            missing_ranks=ranks("missing"), expected_ranks=expected,
            world_size=pl.coalesce(pl.col("world").cast(pl.Int64, strict=False),
                                   pl.col("expected").str.strip_chars().cast(pl.Int64, strict=False),
                                   expected.list.len().cast(pl.Int64)),
            state=pl.col("state"), input_sizes=pl.col("input_sizes"), output_sizes=pl.col("output_sizes"),
            user_frame=pl.col("user_frame"), user_function=pl.col("user_function"),
        ).alias("attrs"),
        "file",
    ))


# TORCH_NCCL_DESYNC_DEBUG's report (TraceUtils.h retrieveDesyncReport, the same text from 1.11
# through 2.13; appended to the watchdog's timeout line up to 2.1, its own LOG(ERROR) since,
# "Rank 3" before it from 2.6), one record per line. No log of it was found in public threads:
# the tests hold lines built from these format strings.
#     \t - [7] Timeout at collective: ALLREDUCE, #183
#     \t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
#     \t   - [3] joined but didn't finish collective #182 (count from 1)
#     \t     [2, 5] finished collective #182, but didn't join collective #183 (count from 1)
#     \t - To our best knowledge, ranks [1, 4] are the lagging ranks that caused this timeout. They never joined any collectives
#     \t   #183 started ranks:
#     \t     [0, 1, 6, 7] started ALLREDUCE
_DESYNC_MARKERS = ["] Timeout at collective: ", "] joined but didn't finish collective #",
                   ", but didn't join collective #", "] are the lagging ranks that caused this timeout"]
_DESYNC = (
    r"\[(?<own_rank>\d+)\] Timeout at collective: (?<own_op>\w+), #(?<own_seq>\d+)"
    r"|\[(?<started>[\d, ]+)\] joined but didn't finish collective #(?<started_seq>\d+)"
    r"|\[(?<finished>[\d, ]+)\] finished collective #(?<finished_seq>\d+), but didn't join collective #\d+"
    r"|ranks \[(?<absent>[\d, ]*)\] are the lagging ranks that caused this timeout"
)


def _desync_rows(own: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(``desync_report`` events, ``rank_status`` rows) from the report's lines. The report names
    no process group (it reads its own group's keys of the store), so ``pg`` stays NULL. Per rank:
    the one that timed out issued ``#S`` (``timed_out_seq``); "joined but didn't finish #L"
    ranks issued L and completed L - 1; "finished #L, but didn't join #L+1" ranks completed L
    and issued nothing after; "never joined any collectives" ranks issued none (0)."""
    found = own.filter(pl.col("msg").str.contains_any(_DESYNC_MARKERS)).with_columns(
        extract_groups("msg", _DESYNC).alias("g")).unnest("g")
    found = found.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in ("own_rank", "started", "finished", "absent")))
    if found.is_empty():
        return conform("events", found.clear()), conform("rank_status", found.clear())
    ranks = lambda c: pl.col(c).str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int32))  # safe: Polars list.eval
    what = (pl.when(pl.col("own_rank").is_not_null()).then(pl.lit("timed_out"))
            .when(pl.col("started").is_not_null()).then(pl.lit("joined_not_finished"))
            .when(pl.col("finished").is_not_null()).then(pl.lit("finished_not_joined"))
            .otherwise(pl.lit("never_joined")))
    found = header_source(found).with_columns(
        what.alias("what"),
        pl.coalesce(ranks("own_rank"), ranks("started"), ranks("finished"), ranks("absent")).alias("named"),
        pl.coalesce(pl.col("own_seq"), pl.col("started_seq"), pl.col("finished_seq")).cast(pl.Int64).alias("seq"),
    )
    events = conform("events", found.select(
        "rank", "ts", "line_no", "level",
        pl.lit("desync debug").alias("source"),
        pl.lit("desync_report").alias("kind"),
        pl.col("msg").str.strip_chars().str.slice(0, 2000).alias("message"),
        "pid",
        json_attrs(what=pl.col("what"), ranks=pl.col("named"), seq=pl.col("seq"), op=pl.col("own_op")).alias("attrs"),
        "file",
    ))
    per_rank = found.explode("named").filter(pl.col("named").is_not_null())
    seq = pl.col("seq")
    status = per_rank.select(
        pl.col("named").alias("rank"),
        pl.lit(None, pl.Utf8).alias("pg"),
        pl.when(pl.col("what") == "never_joined").then(pl.lit(0, pl.Int64)).otherwise(seq).alias("last_enqueued"),
        pl.when(pl.col("what") == "joined_not_finished").then(seq - 1)
        .when(pl.col("what") == "finished_not_joined").then(seq)
        .when(pl.col("what") == "never_joined").then(pl.lit(0, pl.Int64)).alias("last_completed"),
        pl.when(pl.col("what") == "timed_out").then(seq).alias("timed_out_seq"),
        pl.lit("desync_report").alias("source"),
        "file", "line_no",
    )
    return events, conform("rank_status", status)


_PG_INIT_MARKER = "initialization options: size:"


# A chunk none of whose lines holds one of these is skipped before any frame work.
_MARKERS = (*_NCCL_KEPT, _PG_INIT_MARKER, _FAILED_STACK, *_WATCHDOG_MARKERS, *_NCCL_RESULT_MARKERS, _NCCL_ERROR_LINE_MARKER,
            _GLOO_TIMEOUT_MARKER, _FR_NOT_JOINED_MARKER, *_DESYNC_MARKERS)
# NCCL 2.2 and older wrote "host:pid:tid [dev] file:line WARN msg", without the word NCCL.
_OLD_LEVELS = (" WARN ", " ATTN ", " TRACE ", " CALL ")
LINES = "|".join(re.escape(m) for m in _MARKERS) + r"|\[\d+\] \S+:\d+ (?:WARN|ATTN|TRACE|CALL) "
TRIGGER = scan.Trigger("nccl", (*_MARKERS, *_OLD_LEVELS))  # every line LINES matches holds one


def _holds(own: pl.DataFrame, markers: Sequence[str]) -> bool:
    """Whether any of the chunk's NCCL lines holds one of a step's markers (the lines each step
    reads start with one): a step none does is not run, and its dozen Polars calls cost nothing."""
    return bool(own.select(pl.col("text").str.contains_any(list(markers)).any()).item())


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    # Every record below starts on a line that LINES matches (all own holds): each record's
    # own test runs on those few, and only where they hold its marker.
    if _holds(own, (*_NCCL_KEPT, *_OLD_LEVELS)):
        lines = _nccl_lines(own)
        if not lines.is_empty():
            _remember_comms(lines, state)
            yield "events", _nccl_events(lines)
            yield "collectives", _coll_rows(lines, state)
    if _holds(own, (_PG_INIT_MARKER,)):
        yield "events", _pg_init_events(own)
    if _holds(own, (*_NCCL_RESULT_MARKERS, _NCCL_ERROR_LINE_MARKER)):
        yield "events", _nccl_error_events(df, own)
    if _holds(own, (_GLOO_TIMEOUT_MARKER,)):
        yield "events", _gloo_timeout_events(own)
    if _holds(own, (_FR_NOT_JOINED_MARKER,)):
        yield "events", _fr_not_joined_events(df, own)
    if _holds(own, _DESYNC_MARKERS):
        desync_events, desync_status = _desync_rows(own)
        yield "events", desync_events
        yield "rank_status", desync_status
    if _holds(own, (_FAILED_STACK,)):
        yield "stacks", _failed_collective_stacks(df, own)
    if _holds(own, _WATCHDOG_MARKERS):
        watchdog = _watchdog_lines(df, own)
        if not watchdog.is_empty():
            yield "collectives", _watchdog_collectives(watchdog)
            yield "rank_status", _rank_status(watchdog)
            yield "events", _watchdog_events(watchdog)

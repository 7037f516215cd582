"""TORCH_DISTRIBUTED_DEBUG=DETAIL collective fingerprints, into ``collectives`` (source ``detail``).

ProcessGroupWrapper checks every collective's fingerprint across ranks before running it.
With ``TORCH_CPP_LOG_LEVEL=INFO`` it logs each one; on a mismatch it raises with both
ranks' fingerprints. Real lines (PyTorch 2.13.0+cpu gloo, and 2.11.0+cu130 NCCL):

    [rank0]:[I1129 14:33:26.457934342 ProcessGroupWrapper.cpp:710] [Rank 0] Running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLGATHER, TensorShape=[1], TensorDtypes=Long, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, ...))
    [rank0]: RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=26, OpType=_ALLGATHER_BASE, TensorShape=[4096], TensorDtypes=Float, TensorDeviceTypes=...), but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=26, OpType=_ALLGATHER_BASE, TensorShape=[4000], ...).Collectives differ in the following aspects:   Tensor Tensor shapes: 4096vs 4000

A mismatch line gives a row for each of the two ranks it names, so the peer's
fingerprint is known even when the peer's own log is lost. A collective without tensors
prints ``CollectiveFingerPrint(SequenceNumber=1649OpType=BARRIER)`` (no comma). The
fingerprint's shape is that of the first tensor (the input): it gives ``numel_in``.
The sequence number is the wrapper's own count, not ProcessGroupNCCL's, and the line
names no process group: ``pg`` is left NULL.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import conform

from . import scan
from .lines import extract_groups

_FP = "CollectiveFingerPrint("
_MISMATCH = "Detected mismatch between collectives on ranks"
_RUNNING = "Running collective: " + _FP
# Rank A is running collective: <fp A>, but Rank B is running collective: <fp B>.
_PAIR = (
    r"Rank (?<rank_a>\d+) is running collective: CollectiveFingerPrint\((?<fp_a>.*?)\), but "
    r"Rank (?<rank_b>\d+) is running collective: CollectiveFingerPrint\((?<fp_b>.*)$"
)


def _fingerprint(fp: pl.Expr) -> dict[str, pl.Expr]:
    shape = fp.str.extract(r"TensorShape=\[([^\]]*)\]", 1)
    dims = shape.str.split(",").list.eval(pl.element().str.strip_chars().cast(pl.Int64, strict=False))  # safe: Polars list.eval
    dtypes = fp.str.extract(r"TensorDtypes=(.*?)(?:, TensorDeviceTypes=|\)|$)", 1)
    dtype_list = dtypes.str.strip_chars("[] ").str.split(",").list.eval(pl.element().str.strip_chars())  # safe: Polars list.eval
    return {
        "seq_id": fp.str.extract(r"SequenceNumber=(\d+)", 1).cast(pl.Int64, strict=False),
        "op": fp.str.extract(r"OpType=(\w+)", 1),
        "numel_in": pl.when(shape.is_not_null()).then(
            pl.when(shape.str.strip_chars() == "").then(pl.lit(1, pl.Int64))
            .otherwise(dims.list.eval(pl.element().product()).list.first())),  # safe: Polars list.eval
        "sizes": pl.when(shape.is_not_null()).then(pl.concat_str([pl.lit('{"in": [['), shape, pl.lit("]]}")])),
        "dtypes": pl.when(dtypes.is_not_null()).then(
            pl.concat_str([pl.lit('{"in": ['), dtype_list.list.eval(pl.format('"{}"', pl.element())).list.join(", "),  # safe: Polars list.eval
                           pl.lit("]}")])),
    }


def _rows(lines: pl.DataFrame, rank: pl.Expr, fp: pl.Expr, state: str) -> pl.DataFrame:
    fields = _fingerprint(fp)
    return conform("collectives", lines.select(
        rank.cast(pl.Int32, strict=False).alias("rank"),
        pl.lit("detail").alias("source"),
        *(expr.alias(name) for name, expr in fields.items()),
        pl.lit(state).alias("state"),
        pl.col("ts_ff").alias("t_created"),
        "line_no",
        "file",
    ))


# A chunk none of whose lines holds a fingerprint is skipped before any frame work.
LINES = re.escape(_FP)
TRIGGER = scan.Trigger("detail", (_FP,))


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    lines = own.filter(pl.col("msg").str.contains(_FP, literal=True))
    if lines.is_empty():
        return
    running = lines.filter(pl.col("msg").str.contains(_RUNNING, literal=True))
    own_rank = pl.coalesce(pl.col("rank"), pl.col("msg").str.extract(r"\[Rank (\d+)\]", 1).cast(pl.Int32, strict=False))
    parts = [_rows(running, own_rank, pl.col("msg").str.split(_RUNNING).list.last(), "scheduled")]
    mismatch = lines.filter(pl.col("msg").str.contains(_MISMATCH, literal=True)).with_columns(
        extract_groups("msg", _PAIR).alias("pair")).unnest("pair").filter(pl.col("fp_a").is_not_null())
    if not mismatch.is_empty():
        # The rank that raised names itself first; its peer second.
        parts.append(_rows(mismatch, pl.col("rank_a"), pl.col("fp_a"), "scheduled"))
        parts.append(_rows(mismatch, pl.col("rank_b"), pl.col("fp_b"), "scheduled"))
    rows = pl.concat(parts)
    # One fingerprint per rank and sequence number: the exception is printed again by
    # torchrun's error table and by the traceback's re-raise.
    yield "collectives", rows.unique(subset=["file", "rank", "seq_id", "op", "numel_in", "dtypes", "state"], keep="first",
                                     maintain_order=True)

"""Plain-text logs (a rank's stdout/stderr, torchrun's console): read once, parsed by many.

This module owns the file; the line parsers (``runtime``, ``nccl``) own the formats. Each
chunk of lines gets the log header every format shares parsed once, into the columns

    level  I/W/E/F/C/V/D     from a glog, c10 or Python-logging header
    ts     Datetime(us)      the header's time (the year comes from the run)
    ts_ff  Datetime(us)      ts, or the last one before it in this file (for untimed lines)
    ts_bf  Datetime(us)      ts, or the next one after it (an untimed line happened before it)
    pid    Int32             the pid a Python-logging header names
    src    String            the emitting code location, e.g. ``ProcessGroupNCCL.cpp:689``
    msg    String            the text after the header

Headers seen in real PyTorch 2.11 logs:

    [E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught ...
    V1129 13:40:20.565000 5350 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] ...
    2026-11-29 13:33:12,646 [rank0] step 0 loss 1.4026 step_time 3.722s
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from . import detail, dynamo, memory, nccl, runtime
from .lines import read_line_chunks
from .source import Source

KIND = "text_log"
LINE_PARSERS = (runtime, nccl, detail, dynamo, memory)

_GLOG = (
    r"^\[?(?<level>[IWEFCVD])(?<mon>\d\d)(?<day>\d\d) (?<hms>\d\d:\d\d:\d\d)\.(?<frac>\d{1,9})"
    r"(?: +(?<pid>\d+))? +(?<src>[^\s\]]+:\d+)\] ?(?<msg>.*)$"
)
_ASCTIME = r"^(?<date>\d{4}-\d\d-\d\d)[ T_](?<hms>\d\d:\d\d:\d\d)(?:[,.](?<frac>\d{1,6}))?\s*(?<msg>.*)$"
_ASCTIME_LEVEL = r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL|FATAL)\b"


def sniff(head: bytes, name: str) -> bool:
    """Text: no NUL bytes and few control characters. Invalid UTF-8 (a Latin-1 log, a line cut
    mid-character) is still text; it is read with replacement characters."""
    sample = head[:8192]
    if not sample or b"\x00" in sample:
        return False
    control = sum(1 for b in sample if b < 32 and b not in b"\t\r\n\x1b\x0c")
    undecodable = sample.decode("utf-8", errors="replace").count("\ufffd")
    return control <= len(sample) // 20 and undecodable <= len(sample) // 3


def with_headers(df: pl.DataFrame, year: int) -> pl.DataFrame:
    """Add level, ts, pid, src and msg parsed from each line's log header."""
    glog = pl.col("text").str.extract_groups(_GLOG)
    asc = pl.col("text").str.extract_groups(_ASCTIME)
    g = lambda f: glog.struct.field(f)  # noqa: E731
    a = lambda f: asc.struct.field(f)  # noqa: E731
    glog_ts = pl.format(
        "{}-{}-{} {}.{}", pl.lit(str(year)), g("mon"), g("day"), g("hms"), g("frac").str.slice(0, 6)
    ).str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    asc_ts = pl.format("{} {}.{}", a("date"), a("hms"), a("frac").fill_null("0")).str.to_datetime(
        "%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us"
    )
    asc_level = a("msg").str.extract(_ASCTIME_LEVEL, 1).str.slice(0, 1)
    return df.with_columns(
        pl.coalesce(g("level"), asc_level).alias("level"),
        pl.coalesce(glog_ts, asc_ts).alias("ts"),
        g("pid").cast(pl.Int32, strict=False).alias("pid"),
        g("src").alias("src"),
        pl.coalesce(g("msg"), a("msg"), pl.col("text")).alias("msg"),
    )


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    last_ts = None
    skip = list(source.tee_ranks_elsewhere)
    for chunk in read_line_chunks(source.path):
        df = chunk.frame.with_row_index("row")
        if skip:
            df = df.filter(~(pl.col("tee") & pl.col("rank").is_in(skip)))
        df = with_headers(df.with_row_index("pos"), source.year)
        if source.rank is not None:
            df = df.with_columns(pl.col("rank").fill_null(source.rank))
        ts_ff = pl.col("ts").forward_fill()
        if last_ts is not None:
            ts_ff = ts_ff.fill_null(pl.lit(last_ts, dtype=pl.Datetime("us")))
        df = df.with_columns(ts_ff.alias("ts_ff"), pl.col("ts").backward_fill().alias("ts_bf"))
        own = df.filter(pl.col("row") < chunk.own)
        if own.height:
            last_ts = own["ts_ff"][-1]
            source.lines = int(own["line_no"][-1])
        for parser in LINE_PARSERS:
            yield from parser.parse_lines(df, own, source)

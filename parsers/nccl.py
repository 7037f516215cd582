"""NCCL's own debug lines and ProcessGroupNCCL's setup lines, into ``events``.

Real lines (NCCL 2.28.9, PyTorch 2.11, ``NCCL_DEBUG=INFO``):

    vm:3640:3640 [0] NCCL INFO ncclCommInitRankConfig comm 0x1fbee8b0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x5c3279b975931d3d - Init COMPLETE
    [I1129 13:32:58.205777547 ProcessGroupNCCL.cpp:988] [PG ID 0 PG GUID 0 Rank 0] ProcessGroupNCCL initialization options: size: 2, global rank: 0, TIMEOUT(ms): 30000, ...

The ``host:pid:tid`` header ties a process to its host; the init lines give each
communicator's rank and size, and the process group's collective timeout.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from postmortem.schema import conform, json_attrs

from .source import Source

_NCCL = (
    r"^(?:\[[\d\- :.,]+\] )?(?<host>[^\s:\[\]]+):(?<npid>\d+):(?<tid>\d+) \[(?<dev>\d+)\] "
    r"(?:[\d.]+ )?(?:(?<where>\S+:\d+)(?: \((?<func>[^)]*)\))? )?NCCL (?<nlevel>INFO|WARN|ATTN|TRACE|CALL) ?(?<nmsg>.*)$"
)
_INIT = (
    r"comm (?<comm>0x[0-9a-f]+) rank (?<rank>\d+) nranks (?<nranks>\d+) cudaDev (?<dev>\d+)"
    r"(?: nvmlDev \d+)? busId (?<bus>[0-9a-fx]+).* - Init COMPLETE"
)
_PG_INIT = (
    r"(?:\[PG (?:ID )?(?<pg>\S+).*?\] )?ProcessGroupNCCL initialization options: size: (?<size>\d+), "
    r"global rank: (?<grank>\d+), TIMEOUT\(ms\): (?<timeout>\d+)"
)


def _nccl_events(own: pl.DataFrame, source: Source) -> pl.DataFrame:
    lines = own.filter(pl.col("text").str.contains(" NCCL ", literal=True)).with_columns(
        pl.col("text").str.extract_groups(_NCCL).alias("n")
    ).unnest("n").filter(pl.col("host").is_not_null())
    init = pl.col("nmsg").str.extract_groups(_INIT)
    kept = lines.filter(
        (pl.col("nlevel") != "INFO") | pl.col("nmsg").str.contains(" - Init COMPLETE", literal=True)
    )
    field = lambda f: init.struct.field(f)  # noqa: E731
    return conform("events", kept.select(
        "rank",
        pl.col("ts_ff").alias("ts"),
        "line_no",
        pl.col("nlevel").str.slice(0, 1).alias("level"),
        pl.col("where").alias("source"),
        pl.when(pl.col("nlevel") == "INFO").then(pl.lit("nccl_init")).otherwise(pl.lit("nccl_warn")).alias("kind"),
        pl.col("nmsg").alias("message"),
        pl.col("npid").cast(pl.Int32).alias("pid"),
        pl.when(field("comm").is_not_null())
        .then(json_attrs(host=pl.col("host"), comm=field("comm"), comm_rank=field("rank").cast(pl.Int64),
                         nranks=field("nranks").cast(pl.Int64), device=field("dev").cast(pl.Int64),
                         bus_id=field("bus")))
        .otherwise(json_attrs(host=pl.col("host"), device=pl.col("dev").cast(pl.Int64)))
        .alias("attrs"),
        pl.lit(source.name).alias("file"),
    ))


def _pg_init_events(own: pl.DataFrame, source: Source) -> pl.DataFrame:
    found = own.filter(pl.col("msg").str.contains("initialization options: size:", literal=True)).with_columns(
        pl.col("msg").str.extract_groups(_PG_INIT).alias("g")
    ).unnest("g").filter(pl.col("size").is_not_null())
    return conform("events", found.select(
        pl.coalesce(pl.col("rank"), pl.col("grank").cast(pl.Int32)).alias("rank"),
        pl.col("ts_ff").alias("ts"),
        "line_no",
        "level",
        pl.col("src").alias("source"),
        pl.lit("pg_init").alias("kind"),
        "msg",
        json_attrs(pg=pl.col("pg"), size=pl.col("size").cast(pl.Int64), global_rank=pl.col("grank").cast(pl.Int64),
                   timeout_ms=pl.col("timeout").cast(pl.Int64)).alias("attrs"),
        pl.lit(source.name).alias("file"),
    ).rename({"msg": "message"}))


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    yield "events", _nccl_events(own, source)
    yield "events", _pg_init_events(own, source)

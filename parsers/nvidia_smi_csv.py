"""``nvidia-smi --query-gpu=... --format=csv`` files into ``memory`` (source ``nvidia-smi``).

A job's monitor often logs the GPUs with ``nvidia-smi --query-gpu=timestamp,index,memory.used,
memory.total --format=csv -l 5 > gpu.csv``: a header naming each queried field with its unit, then
one row per GPU per sample. Real output (this project's sample_logs/lightning_memory_leak_cuda/
out/gpu.csv: nvidia-smi on an H200, every 100 ms beside the run):

    timestamp, index, memory.used [MiB], memory.total [MiB]
    2026/12/01 19:59:26.012, 0, 1021 MiB, 143771 MiB

``nounits`` leaves the unit in the header only (``8311``); a field the GPU cannot report is
``[N/A]`` (dropped). Each row is one memory sample of the device: ``reserved`` holds the used
memory (PyTorch's reserve plus the CUDA context and every other library's memory on it),
``device`` the index, ``ts`` the timestamp field when queried. A device is not a rank, so rows
name none; memory-leak fits the allocator's figures, not these.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import conform

from .metrics_csv import read_cells, read_head
from .source import Source

KIND = "nvidia_smi_csv"
_HEADER_FIELD = re.compile(r"^[a-z_]+(?:\.[a-z_]+)*(?: \[[^\]]+\])?$")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _header(head: bytes) -> list[str]:
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
    return [c.strip() for c in first.split(",")]


def sniff(head: bytes, name: str) -> bool:
    fields = _header(head[:4096])
    return (any(f.startswith("memory.used") for f in fields) and len(fields) >= 2
            and all(_HEADER_FIELD.match(f) for f in fields))


def _field(columns: list[str], name: str) -> str | None:
    return next((c for c in columns if c == name or c.startswith(name + " [")), None)


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    table = read_cells(read_head(source))
    table = table.rename({c: c.strip() for c in table.columns}).with_columns(pl.all().str.strip_chars())
    source.lines = table.height + 1
    used = _field(table.columns, "memory.used")
    if used is None:
        raise ValueError("no memory.used field in the header")
    header_unit = re.search(r"\[(\w+)\]", used)
    cell = table[used].str.extract_groups(r"^(?<v>\d+(?:\.\d+)?)\s*(?<u>[KMG]?i?B)?$")
    unit = pl.coalesce(cell.struct.field("u"), pl.lit(header_unit[1] if header_unit else "MiB"))
    index, stamp = _field(table.columns, "index"), _field(table.columns, "timestamp")
    rows = table.with_row_index("line_no", offset=2).select(
        pl.lit(source.name).alias("file"),
        pl.col("line_no").cast(pl.Int64),
        (cell.struct.field("v").cast(pl.Float64, strict=False)
         * unit.replace_strict(_UNITS, default=None, return_dtype=pl.Float64)).round(0).cast(pl.Int64).alias("reserved"),
        (pl.col(index).cast(pl.Int32, strict=False) if index else pl.lit(None, pl.Int32)).alias("device"),
        (pl.col(stamp).str.to_datetime("%Y/%m/%d %H:%M:%S%.f", strict=False, time_unit="us") if stamp
         else pl.lit(None, pl.Datetime("us"))).alias("ts"),
        pl.lit("nvidia-smi").alias("source"),
    ).filter(pl.col("reserved").is_not_null())
    yield "memory", conform("memory", rows)

"""Per-step metrics CSV files (Lightning's ``CSVLogger`` ``metrics.csv``) into ``events`` and ``memory``.

``CSVLogger`` (lightning 2.6.6, ``lightning/fabric/loggers/csv_logs.py``) writes one row per
logged step with a header of every metric name seen, empty where a row lacks one; a NaN is
written as ``nan``. Real lines (this project's sample_logs/lightning_non_finite_loss,
``lightning_logs/version_0/metrics.csv``):

    epoch,step,train_loss
    0,3,10.485387802124023
    0,4,nan

Each row becomes one ``train_metrics`` event whose message names every non-empty cell by its
column, the step and the losses and norms first (``step=4, train_loss=nan, epoch=0``), with
``step`` in ``attrs``; a column with a memory-ish name (``gpu_mem_alloc_mb``, DeviceStatsMonitor's
``DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current``) gives memory rows through
``memory.figures_from_messages``.
The file is written by rank 0 only (Lightning's loggers are rank-zero-only) and a logged value
may be the mean over the ranks (``sync_dist=True``): its rows name no rank. A file is a metrics
CSV by content: a header of metric names with a step column, and numbers under it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import conform

from . import memory
from .lines import open_binary
from .source import Source

KIND = "metrics_csv"
MAX_BYTES = 256 << 20
_STEP_COLUMNS = ("step", "global_step", "trainer/global_step", "iteration")
_FIRST = re.compile(r"(?i)loss|norm")
MESSAGE_CHARS = 2000
_NAME = re.compile(r"^[A-Za-z_][\w./\-@ ()\[\]]*$")
_CELL = re.compile(r"^(?:|[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf|infinity|NaN|Inf|-?Infinity))$")


def sniff(head: bytes, name: str) -> bool:
    """A header of metric names with a step column, and numbers under it. The head may end inside
    the first row (DeviceStatsMonitor's header alone is some 15 KB): a cut row is judged on the
    cells it holds."""
    # (the first two lines, and whether a third begins: a newline byte is never inside a UTF-8 character)
    lines = [part.decode("utf-8", errors="replace") for part in head.split(b"\n", 2)]
    if len(lines) < 2:
        return False
    header = [c.strip() for c in lines[0].split(",")]
    row = [c.strip() for c in lines[1].split(",")]
    whole = len(lines) > 2
    if not whole:
        row = row[:-1]  # the last cell may be cut
    return (len(header) >= 2 and (len(row) == len(header) if whole else len(row) <= len(header))
            and any(c in _STEP_COLUMNS for c in header)
            and all(_NAME.match(c) for c in header) and all(_CELL.match(c) for c in row))


def read_head(source: Source) -> bytes:
    """The file's first MAX_BYTES, cut after its last whole line there (and noted) when it is larger."""
    with open_binary(source.path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        source.notes.append(f"larger than {MAX_BYTES} bytes: only its first {MAX_BYTES} read")
        data = data[:data.rfind(b"\n", 0, MAX_BYTES) + 1]
    return data


def read_cells(data: bytes) -> pl.DataFrame:
    """A CSV's cells as strings; ValueError saying why when it is no CSV (empty, cut, binary)."""
    try:
        return pl.read_csv(data, infer_schema=False, truncate_ragged_lines=True)
    except pl.exceptions.PolarsError as exc:
        raise ValueError(f"not a readable CSV: {exc}"[:300]) from exc


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    table = read_cells(read_head(source))
    source.lines = table.height + 1
    step_col = next((c for c in table.columns if c in _STEP_COLUMNS), None)
    if step_col is None:
        raise ValueError("no step column in the header")
    # The event names the step, then the losses and norms non-finite-loss reads, then the rest, cut
    # at MESSAGE_CHARS (DeviceStatsMonitor alone logs some 250 columns); memory reads every cell.
    first = [step_col] + [c for c in table.columns if c != step_col and _FIRST.search(c)]
    ordered = first + [c for c in table.columns if c not in first]
    # the name as a literal, not in a format template: a header may hold "{}"
    cells = [pl.when(pl.col(c).is_not_null() & (pl.col(c) != "")).then(pl.concat_str(pl.lit(f"{c}="), pl.col(c)))
             for c in ordered]
    step = pl.col(step_col).cast(pl.Float64, strict=False).cast(pl.Int64, strict=False)
    rows = table.with_row_index("line_no", offset=2).select(
        pl.lit(source.name).alias("file"),
        pl.lit(None, pl.Int32).alias("rank"),
        pl.lit(None, pl.Datetime("us")).alias("ts"),
        pl.col("line_no").cast(pl.Int64),
        pl.lit("I").alias("level"),
        pl.lit("metrics_csv").alias("source"),
        pl.lit("train_metrics").alias("kind"),
        pl.concat_str(cells, separator=", ", ignore_nulls=True).alias("text"),
        pl.format('{{"step": {}}}', step.cast(pl.String).fill_null("null")).alias("attrs"),
        step.alias("step"),
    )
    yield "events", conform("events", rows.with_columns(pl.col("text").str.slice(0, MESSAGE_CHARS).alias("message")))
    msgs = rows.select("file", "rank", pl.col("ts").alias("ts_ff"), "line_no", pl.col("text").alias("msg"), "step")
    yield "memory", memory.figures_from_messages(msgs)


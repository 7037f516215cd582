"""Progress bars (tqdm, as HF datasets, Trainer, accelerate and most training scripts print them)
into ``events`` (kind ``progress``): proof that a process was working, and for how long.

A line parser: ``textlog`` hands it frames of lines. A real line (LLaMA-Factory's tokenizer on
rank 0 while ranks 1-3 time out in a barrier; the watchdog's line that followed it on the same
terminal line is split off by ``lines``):

    Running tokenizer on dataset:   9%|███▊      | 280000/2969526 [29:55<4:48:08, 155.57 examples/s]

A terminal line that tqdm redrew with carriage returns holds every state; the last is read.
One event per bar (its description, or the file when it has none) and file, its longest-running
state in each chunk: attrs ``desc``, ``n``, ``total``, ``elapsed_s``, ``rate`` (per second, or None when
tqdm printed "?") and ``unit``.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from postmortem.schema import conform

from . import scan

LINES = r"\d/\d+(?:\.\d+)?[kMG]? ?\[(?:\d+:)?\d\d:\d\d<"
# the "<" between elapsed and remaining time, after a digit (a bare "<" is in every "<module>" of a traceback)
TRIGGER = scan.Trigger("progress", tuple(f"{d}<" for d in range(10)))

_BAR = (r"(?:(?<desc>[^|\r]*?):?\s*)?(?<pct>\d+)%\|[^|]*\|\s*(?<n>\d+(?:\.\d+)?[kMG]?)/(?<total>\d+(?:\.\d+)?[kMG]?)"
        r"\s*\[(?<elapsed>(?:\d+:)?\d+:\d\d)<[^,\]]*,\s*(?<rate>[\d.]+|\?)\s*(?<unit>[^\]]*?)\]")


def _seconds(clock: pl.Expr) -> pl.Expr:
    """tqdm's elapsed "29:55" or "1:02:03" in seconds."""
    parts = clock.str.split(":").list.reverse()
    return sum((parts.list.get(i, null_on_oob=True).cast(pl.Int64, strict=False).fill_null(0) * (60 ** i)
                for i in range(3)), pl.lit(0))


def _count(value: pl.Expr) -> pl.Expr:
    """tqdm's "280000" or "1.2k" as a number."""
    number = value.str.extract(r"^(\d+(?:\.\d+)?)", 1).cast(pl.Float64, strict=False)
    scale = value.str.extract(r"([kMG])$", 1).replace_strict({"k": 1e3, "M": 1e6, "G": 1e9}, default=1.0,
                                                               return_dtype=pl.Float64)
    return number * scale


def _rate_per_second(rate: pl.Expr, unit: pl.Expr) -> pl.Expr:
    """tqdm's rate in items per second ("155.57 examples/s"; "1.83s/it" is one item per 1.83 s)."""
    value = rate.cast(pl.Float64, strict=False)
    return pl.when(unit.str.starts_with("s/")).then(1.0 / value).otherwise(value)


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    latest = pl.col("text").str.split("\r").list.last()  # the bar's last redraw on this terminal line
    bars = own.select("rank", "ts_ff", "file", "line_no", latest.alias("bar")).with_columns(
        pl.col("bar").str.extract_groups(_BAR).alias("m")).filter(pl.col("m").struct.field("n").is_not_null())
    if not bars.height:
        return
    m = pl.col("m").struct.field
    unit = m("unit").str.strip_chars()
    bars = bars.with_columns(
        pl.coalesce(m("desc").str.strip_chars().replace("", None), pl.col("file")).alias("desc"),
        _count(m("n")).alias("n"), _count(m("total")).alias("total"), _seconds(m("elapsed")).alias("elapsed_s"),
        _rate_per_second(m("rate"), unit).alias("rate"), unit.alias("unit"),
    )
    # a bar redrawn on many lines is one piece of work: its longest-running state per chunk is
    # enough (two processes of one console, unprefixed, may draw bars of the same name)
    bars = bars.sort("elapsed_s", "line_no").group_by("file", "rank", "desc", maintain_order=True).last()
    yield "events", conform("events", bars.select(
        "rank", pl.col("ts_ff").alias("ts"), "file", "line_no", pl.lit("I").alias("level"),
        pl.lit("progress").alias("kind"), pl.col("bar").str.strip_chars().str.slice(0, 500).alias("message"),
        pl.struct("desc", "n", "total", "elapsed_s", "rate", "unit").struct.json_encode().alias("attrs"),
    ))

"""Memory figures printed in text logs into ``memory`` (source ``log``, or ``oom``) and ``events``.

A line parser: ``textlog`` hands it frames of lines. Real lines it reads:

    2026-11-29 13:39:35,826 [rank0] step 23 loss 1.0826 step_time 0.013s mem_alloc_mb 2553.9 mem_reserved_mb 2858.0
        (this project's train.py, PyTorch 2.11 on an H200; on CPU it logs the process RSS as mem_alloc_mb)
    [rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - step: 14  loss:  3.24405  grad_norm:  0.8319  memory:  9.46GiB(64.99%)  tps: 7,282  tflops: 0.52  mfu: 0.17%
        (torchtitan: the peak reserved memory since the last log step)
    [Rank 4] (after 3 iterations) memory (MB) | allocated: 65639.96411132812 | max allocated: 96745.81176757812 | reserved: 96883.21484375 | max reserved: 96883.21484375
        (Megatron's report_memory)
    [2022-02-21 23:35:27,338] [INFO] [utils.py:827:see_memory_usage] MA 4.96 GB         Max_MA 5.09 GB         CA 6.39 GB         Max_CA 6 GB
        (DeepSpeed's see_memory_usage)
    {'loss': 0.6188, 'learning_rate': 2.9130434782608696e-05, 'epoch': 0.09, 'memory_allocated (GB)': 3.82, 'max_memory_allocated (GB)': 6.32, 'total_memory_available (GB)': 29.85}
        (a Hugging Face Trainer log dict with memory metrics, optimum-habana)
    |                  PyTorch CUDA memory summary, device ID 0                 |
    | Allocated memory      |   1024 KiB |   1024 KiB |   1024 KiB |      0 B   |
        (torch.cuda.memory_summary(); the block also yields one ``memory_summary`` event)
    [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. ... 2.77 GiB is allocated by PyTorch, and 22.04 MiB is reserved by PyTorch but unallocated. ...
        (source ``oom``: the allocator's state at the failure; the runtime parser makes the event)

Units are binary whatever they are spelled (``MB``, ``GB``, ``mb``, ``gigabytes``): every one
of these writers divides by powers of 1024. A figure with no unit is bytes when it is an
integer, and dropped otherwise. The step is the line's ``step N`` / ``iteration N`` /
``(after N iterations)``; NULL when the line has none (the order of lines still orders them).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import conform, frame

from . import scan
from .columns import dictionary
from .lines import extract_groups, following, per_distinct
from .runtime import oom_figures

_ANSI = r"\x1b\[[0-9;]*m"
# Every line a figure is read from matches this (a key of _GENERIC, Megatron's "memory (MB) |",
# torchtitan's "memory:", DeepSpeed's "MA 1.2 GB", a summary, an OOM); NCCL's "via P2P/CUMEM" doesn't.
_PREFILTER = (r"(?i)mem(?:ory)?[_ -]?(?:alloc|res|cached|max|peak)|(?:max|peak)[_ -]?(?:gpu[_ -])?mem|memory \(|"
              r"memory:|memory summary|out of memory|\bMA \d|(?:allocated|reserved|cached)\s*[:=]\s*\d[\d.]*\s*[KMGT]i?B|"
              r"\d+MiB\s*/\s*\d+MiB|_bytes\.all\.(?:current|peak)")
_NUM = r"(?<v>\d+(?:\.\d+)?)"
_UNIT_WORD = r"mb|mib|gb|gib|kb|kib|tb|tib|bytes|megabytes|gigabytes"
_UNIT_SYM = r"[KMGT]i?B|bytes|B"
_TAIL = (rf"(?:[_ -](?<u1>{_UNIT_WORD}))?(?:\(\d*\))?(?:\s*\((?<u2>{_UNIT_SYM})\))?['\"]?\s*[:=]?\s*{_NUM}"
         rf"\s*(?<u3>{_UNIT_SYM})?\b")


def _key(kind: str, peak: bool) -> str:
    """A regex for ``<mem key> <number> <unit>`` in the many spellings of the frameworks."""
    what = r"alloc(?:ated)?" if kind == "alloc" else r"(?:res(?:erved)?|cached)"
    if peak:
        key = rf"(?:(?:max|peak)[_ -]?(?:gpu[_ -])?mem(?:ory)?[_ -]?|(?:gpu[_ -])?mem(?:ory)?[_ -](?:max|peak)[_ -]?){what}"
    else:
        key = rf"(?:gpu[_ -])?mem(?:ory)?[_ -]?{what}"
    # The key must not be glued to a word before it, so "max_mem_alloc" is not a current figure.
    return rf"(?i)(?:^|[^\w-]){key}{_TAIL}"


_GENERIC = {
    "allocated": _key("alloc", False),
    "reserved": _key("res", False),
    "peak_allocated": _key("alloc", True),
    "peak_reserved": _key("res", True),
}
_MEGATRON = (
    r"memory \((?<u>[KMGT]i?B)\) \| allocated: (?<a>[\d.]+) \| max allocated: (?<ma>[\d.]+) \| "
    r"(?:reserved|cached): (?<r>[\d.]+) \| max (?:reserved|cached): (?<mr>[\d.]+)"
)
# A bare "allocated: 31894.55 MB, reserved: 58676.00 MB" (a user's own print): the name alone is
# memory-ish only with a byte unit after the figure, and only first in a line or after a
# separator, so Megatron's "| max allocated:" is not read as a current figure.
_BARE = {"allocated": r"(?i)(?:^|[,|;]|\]:?)\s*allocated\s*[:=]\s*(?<v>\d+(?:\.\d+)?)\s*(?<u>[KMGT]i?B)\b",
         "reserved": r"(?i)(?:^|[,|;]|\]:?)\s*(?:reserved|cached)\s*[:=]\s*(?<v>\d+(?:\.\d+)?)\s*(?<u>[KMGT]i?B)\b"}
# torch.cuda.memory_stats()'s keys, as Lightning's DeviceStatsMonitor logs them into metrics.csv
# ("DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current=255049728") or a printed
# memory_stats() dict ("'allocated_bytes.all.current': 255049728"): bytes
_STATS = {f"s_{field}": rf"(?:^|[^\w.]|/){key}_bytes\.all\.{when}['\"]?\s*[:=]\s*(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\b"
          for field, key, when in (("allocated", "allocated", "current"), ("reserved", "reserved", "current"),
                                   ("peak_allocated", "allocated", "peak"), ("peak_reserved", "reserved", "peak"))}
# torch.cuda.memory_allocated(0): the device the call names
_CALL_DEVICE = r"(?i)mem(?:ory)?_(?:allocated|reserved|cached)\((\d+)\)"
# nvidia-smi's table ("|  0%   31C    P0    70W /  300W |   3446MiB /  46068MiB |") and a line that
# names nvidia-smi's figure ("nvidia-smi GPU-1 memory (MB) 1494"): the device's used memory,
# the allocator's reserve plus the CUDA context and every other library's memory.
_SMI_TABLE = r"\|\s*(?<used>\d+)MiB\s*/\s*(?<total>\d+)MiB\s*\|"
_SMI_NAMED = r"(?i)nvidia-smi\b.*?(?:GPU[- ]?(?<dev>\d+)\b.*?)?memory \((?<u>[KMGT]i?B)\)\s*[:=]?\s*(?<v>\d+(?:\.\d+)?)\s*$"
_MEGATRON_STEP = r"\(after (\d+) iterations?\)"
_LINE_RANK = r"^\[[Rr]ank[ :]?(\d+)\]"  # Megatron's "[Rank 4]", a logging format's "[rank0]"
_DEEPSPEED = (
    r"\bMA (?<a>[\d.]+) (?<ua>[KMGT]i?B)\s+Max_MA (?<ma>[\d.]+) (?<uma>[KMGT]i?B)\s+"
    r"CA (?<r>[\d.]+) (?<ur>[KMGT]i?B)\s+Max_CA (?<mr>[\d.]+) (?<umr>[KMGT]i?B)"
)
_TORCHTITAN = r"\bmemory:\s*(?<v>\d+(?:\.\d+)?)\s*(?<u>[KMGT]i?B)\((?<pct>[\d.]+)%\)"
_STEP = r"(?i)\b(?:global[_ ]?)?(?:steps?|iter(?:ation)?s?)\b\s*[:=#]?\s*(\d+)\b"

_MULT = {"b": 1, "bytes": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
         "mib": 1 << 20, "megabytes": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "gigabytes": 1 << 30,
         "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}

# torch.cuda.memory_summary()
_SUMMARY_HEAD = r"PyTorch CUDA memory summary, device ID (\d+)"
_SUMMARY_COUNTS = r"CUDA OOMs: (?<ooms>\d+)\s*\|\s*cudaMalloc retries: (?<retries>\d+)"
_SUMMARY_ROW = re.compile(
    r"^\|\s*(?P<metric>Allocated memory|Active memory|Requested memory|GPU reserved memory|Non-releasable memory)"
    r"\s*\|\s*(?P<cur>\d+(?:\.\d+)?\s*[KMGT]?i?B)\s*\|\s*(?P<peak>\d+(?:\.\d+)?\s*[KMGT]?i?B)\s*\|"
)
_SUMMARY_LINES = 40


def _bytes(value: pl.Expr, unit: pl.Expr) -> pl.Expr:
    """A figure times its unit's bytes; no unit: bytes when the figure is an integer."""
    mult = unit.str.to_lowercase().replace_strict(_MULT, default=None, return_dtype=pl.Float64)
    number = value.cast(pl.Float64, strict=False)
    plain = pl.when(value.str.contains(r"^\d+$")).then(number)
    return pl.when(unit.is_not_null()).then(number * mult).otherwise(plain).round(0).cast(pl.Int64)


def _generic(field: str, pattern: str) -> pl.Expr:
    g = extract_groups("clean", pattern)
    unit = pl.coalesce(g.struct.field("u1"), g.struct.field("u2"), g.struct.field("u3"))
    return _bytes(g.struct.field("v"), unit).alias(field)


@functools.cache
def _figures() -> tuple[pl.Expr, ...]:
    """The expressions that read figures off a line's ``clean`` text (built once per process)."""
    mega = extract_groups("clean", _MEGATRON)
    ds = extract_groups("clean", _DEEPSPEED)
    titan = extract_groups("clean", _TORCHTITAN)
    smi_table = extract_groups("clean", _SMI_TABLE)
    smi_named = extract_groups("clean", _SMI_NAMED)
    m = lambda f: mega.struct.field(f)
    d = lambda f: ds.struct.field(f)
    bare = {f: extract_groups("clean", p) for f, p in _BARE.items()}
    return (
        *(_bytes(g.struct.field("v"), g.struct.field("u")).alias(f"b_{f}") for f, g in bare.items()),
        *(pl.col("clean").str.extract(p, 1).cast(pl.Float64, strict=False).round(0).cast(pl.Int64).alias(f)
          for f, p in _STATS.items()),
        pl.coalesce(_bytes(smi_table.struct.field("used"), pl.lit("MiB")),
                    _bytes(smi_named.struct.field("v"), smi_named.struct.field("u"))).alias("smi_used"),
        pl.coalesce(smi_named.struct.field("dev"), pl.col("clean").str.extract(_CALL_DEVICE, 1))
        .cast(pl.Int32, strict=False).alias("_device"),
        *(_generic(f, p) for f, p in _GENERIC.items()),
        _bytes(m("a"), m("u")).alias("m_a"), _bytes(m("ma"), m("u")).alias("m_ma"),
        _bytes(m("r"), m("u")).alias("m_r"), _bytes(m("mr"), m("u")).alias("m_mr"),
        _bytes(d("a"), d("ua")).alias("d_a"), _bytes(d("ma"), d("uma")).alias("d_ma"),
        _bytes(d("r"), d("ur")).alias("d_r"), _bytes(d("mr"), d("umr")).alias("d_mr"),
        _bytes(titan.struct.field("v"), titan.struct.field("u")).alias("t_mr"),
        pl.coalesce(pl.col("clean").str.extract(_MEGATRON_STEP, 1), pl.col("clean").str.extract(_STEP, 1))
        .cast(pl.Int64, strict=False).alias("step"),
        pl.col("clean").str.extract(_LINE_RANK, 1).cast(pl.Int32, strict=False).alias("_line_rank"),
    )


def _series_rows(own: pl.DataFrame) -> pl.DataFrame:
    # a figure is a number: a line without a digit ("Reducer: comm-optimized memory allocator not
    # found, using regular one") holds none, and the two dozen expressions below are not planned for it
    # (both tests once a distinct message: such a line repeats at every step)
    codes, distinct = dictionary(own["msg"])
    holds = (distinct.str.contains(_PREFILTER) & distinct.str.contains(r"\d")).gather(codes).fill_null(False)
    lines = own.filter(holds).with_columns(pl.col("msg").str.replace_all(_ANSI, "").alias("clean"))
    if lines.is_empty():
        return frame("memory")
    # A figure's line repeats word for word at every step of a run that prints the same figure:
    # the regexes run once per distinct message.
    rows = per_distinct(lines, "clean", *_figures()).select(
        "file",
        pl.coalesce("rank", "_line_rank").alias("rank"),
        pl.col("ts_ff").alias("ts"),
        pl.coalesce("_given_step", "step").alias("step") if "_given_step" in lines.columns else "step",
        "line_no",
        pl.col("_device").alias("device"),
        pl.coalesce("m_a", "d_a", "s_allocated", "allocated", "b_allocated").alias("allocated"),
        pl.coalesce("m_r", "d_r", "s_reserved", "reserved", "b_reserved").alias("reserved"),
        pl.coalesce("m_ma", "d_ma", "s_peak_allocated", "peak_allocated").alias("peak_allocated"),
        pl.coalesce("m_mr", "d_mr", "t_mr", "s_peak_reserved", "peak_reserved").alias("peak_reserved"),
        "smi_used",
    )
    logged = rows.filter(
        pl.any_horizontal(pl.col("allocated", "reserved", "peak_allocated", "peak_reserved").is_not_null())
    ).with_columns(pl.lit("log").alias("source"))
    # nvidia-smi's used memory is the device's, not the allocator's: its own source, in ``reserved``
    smi = rows.filter(pl.col("smi_used").is_not_null() & pl.col("reserved").is_null()).with_columns(
        pl.col("smi_used").alias("reserved"), pl.lit("nvidia-smi").alias("source"))
    return conform("memory", pl.concat([logged, smi]))


def figures_from_messages(msgs: pl.DataFrame) -> pl.DataFrame:
    """Memory rows from messages that are not a text log's lines (a trainer state's entries, a
    metrics file's rows): columns file, rank, ts_ff, line_no, msg and step (the record's own step,
    taken before one the message names)."""
    return _series_rows(msgs.rename({"step": "_given_step"}))


def _oom_rows(own: pl.DataFrame) -> pl.DataFrame:
    """The allocator's state in each CUDA OOM message, as a memory sample of source ``oom``."""
    hits = own.filter(pl.col("msg").str.contains("CUDA out of memory", literal=True))
    rows = []
    for r in hits.select("file", "rank", "ts_ff", "line_no", "msg").to_dicts():
        f = oom_figures(r["msg"])
        allocated = f.get("allocated_by_pytorch")
        if allocated is None:
            continue
        reserved = f.get("reserved_total")
        if reserved is None and f.get("reserved_unallocated") is not None:
            reserved = allocated + f["reserved_unallocated"]
        rows.append({"rank": r["rank"], "ts": r["ts_ff"], "line_no": r["line_no"], "allocated": allocated,
                     "reserved": reserved, "source": "oom", "file": r["file"]})
    return frame("memory", rows)


def _size(text: str) -> int | None:
    m = re.match(r"(\d+(?:\.\d+)?)\s*([KMGT]?i?B)", text.strip())
    if not m:
        return None
    unit = m[2].lower()
    return int(float(m[1]) * _MULT.get(unit, _MULT.get(unit[:1], 1)))


def _summaries(df: pl.DataFrame, own: pl.DataFrame) -> Iterator[tuple[str, pl.DataFrame]]:
    """``torch.cuda.memory_summary()`` blocks: one memory row and one event per block."""
    starts = own.filter(pl.col("msg").str.contains(_SUMMARY_HEAD))
    if starts.is_empty():
        return
    memory, events = [], []
    for start in starts.select("file", "pos", "rank", "ts_ff", "line_no", "msg").to_dicts():
        device = int(re.search(_SUMMARY_HEAD, start["msg"])[1])
        figures: dict[str, int | None] = {"device": device}
        same_rank = (pl.col("rank") == start["rank"]) if start["rank"] is not None else pl.col("rank").is_null()
        block = following(df, start, _SUMMARY_LINES, first=1).filter(same_rank)
        for text in block["msg"].to_list():
            text = text.strip()
            if "memory summary, device ID" in text:
                break  # the next block
            counts = re.search(_SUMMARY_COUNTS.replace("?<", "?P<"), text)
            if counts:
                figures["ooms"], figures["malloc_retries"] = int(counts["ooms"]), int(counts["retries"])
            row = _SUMMARY_ROW.match(text)
            if row:
                key = row["metric"].split()[0].lower().replace("gpu", "reserved").replace("non-releasable", "non_releasable")
                figures.setdefault(f"{key}_current", _size(row["cur"]))
                figures.setdefault(f"{key}_peak", _size(row["peak"]))
        if "allocated_current" not in figures:
            continue
        memory.append({"rank": start["rank"], "ts": start["ts_ff"], "line_no": start["line_no"],
                       "allocated": figures.get("allocated_current"), "reserved": figures.get("reserved_current"),
                       "peak_allocated": figures.get("allocated_peak"), "peak_reserved": figures.get("reserved_peak"),
                       "device": device, "source": "log", "file": start["file"]})
        events.append({"rank": start["rank"], "ts": start["ts_ff"], "file": start["file"], "line_no": start["line_no"],
                       "level": "I", "kind": "memory_summary", "message": start["msg"].strip(" |")[:2000],
                       "attrs": json.dumps(figures)})
    yield "memory", frame("memory", memory)
    yield "events", frame("events", events)


# Every record starts on a line that matches this: textlog hands parse_lines only those as ``own``.
LINES = _PREFILTER
# A literal of each of _PREFILTER's branches, caseless as it is: "mem" (memory, mem_alloc, peak_mem,
# out of memory ...), "MA " (DeepSpeed's "MA 1.2 GB"), the allocator's words, "MiB" of nvidia-smi's
# "1234MiB / 81559MiB", and torch's "_bytes.all." counters.
TRIGGER = scan.Trigger("memory", ("mem", "ma ", "allocated", "reserved", "cached", "mib", "_bytes.all."), caseless=True)


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    """Memory samples in one chunk of lines; ``df`` adds lookahead rows to ``own``."""
    yield "memory", _series_rows(own)
    yield "memory", _oom_rows(own)
    yield from _summaries(df, own)

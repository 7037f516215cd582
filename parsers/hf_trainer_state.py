"""Hugging Face ``Trainer``'s ``trainer_state.json`` into ``events`` (kind ``train_metrics``) and ``memory``.

``Trainer.save_state()`` and every checkpoint write the trainer's state with
``json.dumps(..., indent=2, sort_keys=True)``; its ``log_history`` holds one dict per logging
step, the same dict the console prints (transformers 5.24, this project's
sample_logs/hf_trainer_non_finite_loss/out/trainer_state.json):

    {
      "epoch": 0.4,
      "grad_norm": NaN,
      "learning_rate": 0.006999999999999999,
      "loss": 4.745141506195068,
      "step": 4
    },

Python's ``json`` writes a non-finite float as ``NaN`` / ``Infinity`` and reads it back. Each
entry becomes one event whose message is the entry as one line (``{"epoch": 0.4, "grad_norm":
NaN, ...}``) at the line the entry starts on, with ``step`` in ``attrs``; figures with a
memory-ish name (``'memory_allocated (GB)': 3.82``) become memory rows through
``memory.figures_from_messages``. The file is written by the world's process zero and its losses
are the mean over the ranks: its rows name no rank.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import frame

from . import memory
from .lines import open_binary
from .source import Source

KIND = "hf_trainer_state"
MAX_BYTES = 64 << 20
_ENTRY_START = re.compile(r"^\s*\{\s*$")


def sniff(head: bytes, name: str) -> bool:
    start = head.lstrip()[:1]
    return start == b"{" and b'"log_history"' in head and (b'"global_step"' in head or b'"best_metric"' in head)


def _entry_lines(text: str) -> list[int]:
    """1-based line numbers of the lines that open log_history's entries (``{`` alone on a line)."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if '"log_history"' in line), None)
    if at is None:
        return []
    out = []
    for i in range(at + 1, len(lines)):
        if lines[i].lstrip().startswith("]"):
            break
        if _ENTRY_START.match(lines[i]):
            out.append(i + 1)
    return out


def _attr(value) -> object:
    """A figure for ``attrs`` (JSON, which has no NaN): non-finite floats as their words."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def entry_rows(entries: list, line_nos: list[int], file: str) -> pl.DataFrame:
    """One ``train_metrics`` event per log_history entry (a dict); others are dropped."""
    rows = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        step = entry.get("step")
        rows.append({
            "rank": None, "ts": None, "file": file, "line_no": line_nos[i] if i < len(line_nos) else None,
            "level": "I", "source": "trainer_state", "kind": "train_metrics",
            "message": json.dumps(entry, sort_keys=True)[:2000],
            "attrs": json.dumps({"step": step if isinstance(step, int) else None,
                                 **{k: _attr(v) for k, v in entry.items() if isinstance(v, (int, float, str))}}),
        })
    return frame("events", rows)


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    with open_binary(source.path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        source.notes.append(f"larger than {MAX_BYTES} bytes: not read as a trainer state")
        return
    text = data.decode("utf-8", errors="replace")
    doc = json.loads(text)
    history = doc.get("log_history") if isinstance(doc, dict) else None
    if not isinstance(history, list):
        source.notes.append("no 'log_history' list")
        return
    source.lines = text.count("\n") + 1
    events = entry_rows(history, _entry_lines(text), source.name)
    yield "events", events
    steps = events.select(pl.col("attrs").str.json_path_match("$.step").cast(pl.Int64, strict=False).alias("step"))
    msgs = events.select("file", "rank", pl.col("ts").alias("ts_ff"), "line_no", pl.col("message").alias("msg"),
                         ).with_columns(steps["step"])
    yield "memory", memory.figures_from_messages(msgs)

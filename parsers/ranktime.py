"""Per-rank timings that a framework's straggler report prints, into ``events`` (kind ``rank_time``).

A line parser: ``textlog`` hands it frames of lines. Two shapes are read, both real:

A list of one measure per rank, one line a rank, under a section name (FlagScale's straggler
report, on Megatron; the ``[default0]:`` prefix is torchrun's, cut off by ``lines``):

    [default0]:  optimizer:
    [default0]:    Min: 9.17ms, Max: 10.12ms, Avg: 9.55ms, Slowdown: 1.10x
    [default0]:    Rank 0: 9.98ms
    [default0]:    Rank 1: 10.12ms

One rank's time against the median rank's (TraceML 0.3.4's step-time diagnosis, torch 2.11):

    Rank r2 input wait was 199.7ms vs median rank r0 at 10.4ms.

A list of one performance score per rank, 1.0 the fastest (NVIDIA Resiliency Extension's
straggler report, as Megatron-Bridge logs it; a score is speed, the inverse of a time):

    megatron.bridge.NVRxStragglerDetection: GPU relative performance:
      Rank=0 Node=node01 Score=0.95

Each list (consecutive ``Rank N: T ms`` or ``Rank=N ... Score=S`` lines of one file) is one
report; each comparison line is a report of its own. One event per rank and report; attrs:
``report`` (file and first line), ``subject_rank`` (the rank the figure is of), and ``ms`` with,
for a comparison, ``median_ms``, or ``score``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import frame

from . import scan

_LIST = re.compile(r"^\s*Rank (?P<rank>\d+): (?P<ms>\d+(?:\.\d+)?) ?ms\s*$")
_SCORE = re.compile(r"^\s*Rank=(?P<rank>\d+) (?:\w+=\S+ )*Score=(?P<score>\d+(?:\.\d+)?)\s*$")
_VERSUS = re.compile(r"\bRank r?(?P<rank>\d+) (?P<what>[\w /-]{1,40}?) was (?P<ms>\d+(?:\.\d+)?) ?ms "
                     r"vs median rank r?(?P<median_rank>\d+) at (?P<median_ms>\d+(?:\.\d+)?) ?ms")

# What every line a record is read from matches (parse_lines tells them apart): the comparison's
# "{1,40}" is left to _VERSUS, since that bound of a Unicode class costs Polars ~12 ms to compile,
# and its cache of 32 regexes per thread holds no pattern of ours from one chunk to the next.
LINES = r"\bRank r?\d+(?::| [\w /-]+? was) \d+(?:\.\d+)? ?ms\b|^\s*Rank=\d+ .*Score=\d"
# What each branch holds besides "Rank" (which every c10d line's "[PG ID 0 ... Rank 3]" holds too):
# a list entry's digit and ": ", a comparison's " was ", a score's "Rank=" (digits as reports print them: ASCII).
TRIGGER = scan.Trigger("ranktime", (*(f"{d}: " for d in range(10)), " was ", "Rank="))


def _event(row: dict, report: str, attrs: dict) -> dict:
    return {"rank": row["rank"], "ts": row["ts_ff"], "file": row["file"], "line_no": row["line_no"],
            "level": "I", "kind": "rank_time", "message": row["text"].strip()[:2000],
            "attrs": json.dumps({"report": report, **attrs})}


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    events = []
    last: dict[str, tuple[int, str]] = state.setdefault("rank_time_list", {})  # file -> (pos, report)
    for row in own.select("file", "pos", "line_no", "rank", "text", "ts_ff").to_dicts():
        if m := _VERSUS.search(row["text"]):
            report = f"{row['file']}:{row['line_no']}"
            events.append(_event(row, report, {"subject_rank": int(m["rank"]), "ms": float(m["ms"]),
                                               "median_ms": float(m["median_ms"]), "what": m["what"]}))
        elif m := _LIST.match(row["text"]) or _SCORE.match(row["text"]):
            prev = last.get(row["file"])
            # a list is a run of consecutive lines; a gap starts the next report
            report = prev[1] if prev and prev[0] == row["pos"] - 1 else f"{row['file']}:{row['line_no']}"
            last[row["file"]] = (row["pos"], report)
            figure = {"ms": float(m["ms"])} if "ms" in m.re.groupindex else {"score": float(m["score"])}
            events.append(_event(row, report, {"subject_rank": int(m["rank"]), **figure}))
    yield "events", frame("events", events)

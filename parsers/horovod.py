"""Horovod's stall inspector into ``events`` (kind ``horovod_stall``).

A line parser: ``textlog`` hands it frames of lines. When some ranks submitted a collective the
others did not, Horovod's coordinator warns every 60 s and lists, per rank, the tensors that rank
has not submitted. Real lines (Horovod 0.20, under horovodrun, whose `[0]<stderr>:` prefix
``lines`` cuts off):

    [2020-12-29 16:51:57.726092: W /tmp/.../horovod/common/stall_inspector.cc:105] One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more than 60 seconds. ...
    Missing ranks:
    0: [broadcast.bool.sz]
    1: [allreduce.c_d1.bias, allreduce.c_d1.weight, allreduce.c_d1_bn.bias ...]

(later Horovod says "Stalled ranks:"). One event per warning; its attrs map each listed rank to
the tensors it is missing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import frame

from . import scan
from .lines import following

_WARNING = "were submitted to be reduced, gathered or broadcasted by subset of ranks"
_HEAD = re.compile(r"^\s*(?:Missing|Stalled) ranks:\s*$")
_RANK = re.compile(r"^\s*(?P<rank>\d+): \[(?P<tensors>[^\]]*)\]?")
BLOCK_LINES = 200

LINES = re.escape(_WARNING)
TRIGGER = scan.Trigger("horovod", (_WARNING,))


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    events = []
    for start in own.select("file", "pos", "line_no", "rank", "text", "ts_ff").to_dicts():
        missing: dict[str, list[str]] = {}
        listing = False
        for row in following(df, start, BLOCK_LINES, first=1).select("text").to_dicts():
            text = row["text"]
            if _HEAD.match(text):
                listing = True
                continue
            m = _RANK.match(text) if listing else None
            if not m:
                break  # the list (or the warning) ends at the first other line
            tensors = [t.strip() for t in m["tensors"].split(",") if t.strip() and t.strip() != "..."]
            missing[m["rank"]] = [t.rstrip(" .") for t in tensors]
        if missing:
            events.append({"rank": start["rank"], "ts": start["ts_ff"], "file": start["file"],
                           "line_no": start["line_no"], "level": "W", "kind": "horovod_stall",
                           "message": start["text"].strip()[:2000], "attrs": json.dumps({"missing": missing})})
    yield "events", frame("events", events)

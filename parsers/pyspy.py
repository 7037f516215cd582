"""py-spy dumps (``py-spy dump`` text and ``--json``) into ``stacks``.

Real output of py-spy 0.4 on a rank hung in a rank-conditional barrier:

    Process 15140: /root/.pyenv/versions/3.11.7/bin/python3.11 -u sample_logs/generate/train.py ...
    Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

    Thread 15140 (idle): "MainThread"
        barrier (torch/distributed/distributed_c10d.py:5356)
        maybe_sync_before_step (train.py:147)

and with ``--json``: ``[{"pid": 15141, "thread_name": "MainThread", "active": false,
"owns_gil": false, "frames": [{"name": ..., "filename": ..., "short_filename": ..., "line": 979}]}]``.

Frames are listed innermost first; depth 0 is the innermost. The pid joins the dump to
its rank (through the store); a ``rank3`` in the file name is used when present. Dumps are
a few KB, so they are read whole, up to ``MAX_BYTES``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import frame

from .lines import open_binary
from .source import Source

KIND = "pyspy"
MAX_BYTES = 32 << 20

_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")
_PYTHON = re.compile(r"^Python v(?P<version>\S+)")
_THREAD = re.compile(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<state>[^)]*)\)(?:: "(?P<name>.*)")?')
_FRAME = re.compile(r"^ {4}(?P<func>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def sniff(head: bytes, name: str) -> bool:
    start = head.lstrip()[:1]
    if start == b"[":
        return b'"thread_id"' in head and b'"frames"' in head
    return re.match(rb"^Process \d+: ", head) is not None and b"\nPython v" in head[:4096]


def _read(source: Source) -> str:
    with open_binary(source.path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        source.notes.append(f"only the first {MAX_BYTES >> 20} MiB read")
    return data[:MAX_BYTES].decode("utf-8", errors="replace")


def parse_text(text: str, source: Source) -> tuple[list[dict], list[dict]]:
    """(stack rows, event rows) of a text dump."""
    stacks: list[dict] = []
    events: list[dict] = []
    pid = thread = state = None
    depth = 0
    thread_line = 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if m := _PROCESS.match(line):
            pid = int(m["pid"])
            events.append({"rank": source.rank, "file": source.name, "line_no": line_no, "kind": "process",
                           "message": line[:2000], "pid": pid, "attrs": json.dumps({"command": m["cmd"][:2000]})})
        elif m := _PYTHON.match(line):
            events.append({"rank": source.rank, "file": source.name, "line_no": line_no, "kind": "version",
                           "message": line[:2000], "pid": pid,
                           "attrs": json.dumps({"component": "python", "version": m["version"]})})
        elif m := _THREAD.match(line):
            thread, state, depth, thread_line = (m["name"] or m["tid"]), m["state"], 0, line_no
        elif thread is not None and (m := _FRAME.match(line)):
            stacks.append({"rank": source.rank, "pid": pid, "thread": thread, "thread_state": state, "depth": depth,
                           "function": m["func"], "file": m["file"], "line": int(m["line"]) if m["line"] else None,
                           "source": "pyspy", "origin": source.name, "origin_line": thread_line})
            depth += 1
    return stacks, events


def parse_json(text: str, source: Source) -> list[dict]:
    threads = json.loads(text)
    if not isinstance(threads, list):
        raise ValueError("a py-spy --json dump is a list of threads")
    stacks = []
    for t in threads:
        if not isinstance(t, dict):
            continue
        state = "active+gil" if t.get("owns_gil") else ("active" if t.get("active") else "idle")
        frames = t.get("frames") if isinstance(t.get("frames"), list) else []
        for depth, f in enumerate(x for x in frames if isinstance(x, dict)):
            stacks.append({
                "rank": source.rank, "pid": t.get("pid") if isinstance(t.get("pid"), int) else None,
                "thread": str(t.get("thread_name") or t.get("thread_id")), "thread_state": state, "depth": depth,
                "function": str(f.get("name")), "file": str(f.get("short_filename") or f.get("filename")),
                "line": f.get("line") if isinstance(f.get("line"), int) and f.get("line") > 0 else None,
                "source": "pyspy", "origin": source.name, "origin_line": None,
            })
    return stacks


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    text = _read(source)
    if text.lstrip().startswith("["):
        yield "stacks", frame("stacks", parse_json(text, source))
        return
    stacks, events = parse_text(text, source)
    yield "stacks", frame("stacks", stacks)
    yield "events", frame("events", events)

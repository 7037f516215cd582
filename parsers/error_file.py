"""torchelastic error files (``error.json``, written by ``@record``) into ``failures``.

A real file's shape (torch/distributed/elastic/multiprocessing/errors/error_handler.py):

    {"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1764423283"}}}

Small by nature; a file over ``MAX_BYTES`` is not an error file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone

import polars as pl

from postmortem.schema import frame

from .lines import open_binary
from .source import Source

KIND = "error_file"
MAX_BYTES = 4 << 20


def sniff(head: bytes, name: str) -> bool:
    start = head.lstrip()[:200]
    return start.startswith(b"{") and b'"message"' in head and (b'"extraInfo"' in head or b'"errorCode"' in head)


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    with open_binary(source.path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        source.notes.append(f"larger than {MAX_BYTES} bytes: not read as an error file")
        return
    doc = json.loads(data.decode("utf-8", errors="replace"))
    outer = doc.get("message") if isinstance(doc, dict) else None
    if not isinstance(outer, dict):
        source.notes.append("no 'message' object")
        return
    message = str(outer.get("message", ""))
    extra = outer.get("extraInfo") if isinstance(outer.get("extraInfo"), dict) else {}
    try:
        ts = datetime.fromtimestamp(int(extra.get("timestamp")), timezone.utc).replace(tzinfo=None)
    except (TypeError, ValueError, OverflowError):
        ts = None
    exc_type, _, exc_msg = message.partition(": ")
    row = {
        "rank": source.rank,
        "ts": ts,
        "exception_type": exc_type if exc_type and " " not in exc_type else None,
        "message": (exc_msg if exc_type and " " not in exc_type else message)[:2000],
        "source": "error_file",
        "file": source.name,
        "line_no": 1,
    }
    yield "failures", frame("failures", [row])

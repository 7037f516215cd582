"""timeout-misconfigured: a rank was busy with legitimate slow work (writing a checkpoint,
compiling, evaluating) when its peers' collective timeout expired.

Told apart from a hang by where the late rank's main thread was, from its stack dump: busy
when its innermost frames are its own work (computing, writing, compiling: user code, torch
ops, the compiler), stuck when they are a wait, whatever the functions around it are called:
a lock, a condition or an event (threading), a queue, a pipe or a child (multiprocessing,
subprocess, selectors, sockets), or a torch.distributed collective. A rank stuck on a lock
inside ``save_checkpoint`` is a hang, not a slow save. What the busy rank was doing is named
from its frames (the compiler's, serialization's, or its innermost own function). The timeout
in force comes from the timeout message ("Timed out waiting 30000ms") or ProcessGroupNCCL's
init options.
"""

from __future__ import annotations

import re

import duckdb

from postmortem.ranges import rank_ranges

from .common import is_user_file, stuck_elsewhere
from .progress import busy_by_progress

# Files whose frames, innermost, mean the thread waits for someone else (py-spy prints the
# standard library and torch by their short paths: threading.py, torch/distributed/...).
_WAITS = re.compile(r"(?:^|/)(?:threading|queue|selectors|socket|ssl|subprocess)\.py$|(?:^|/)(?:multiprocessing|asyncio|"
                    r"concurrent/futures)/|(?:^|/)torch/distributed/(?!checkpoint/)")
_COMPILING = re.compile(r"(?:^|/)torch/(?:_inductor|_dynamo|_functorch)/|(?:^|/)triton/")
_SERIALIZING = re.compile(r"(?:^|/)torch/(?:serialization\.py|distributed/checkpoint/)")


def what_it_was_doing(frames: list[tuple[str, str, int | None]]) -> tuple[str, str] | None:
    """(what it was doing, where) for a main thread busy with its own work ("in save_checkpoint",
    "compiling (torch.compile)"), innermost frame first in
    ``frames`` (function, file, line); None when its innermost frame is a wait."""
    if not frames or _WAITS.search(frames[0][1]):
        return None
    innermost = f"{frames[0][1]}:{frames[0][2]}" if frames[0][2] is not None else frames[0][1]
    own = next(((f, f"{file}:{line}") for f, file, line in frames if is_user_file(file)), None)
    if any(_COMPILING.search(file) for _, file, _ in frames):
        return "compiling (torch.compile)", own[1] if own else innermost
    if any(_SERIALIZING.search(file) for _, file, _ in frames):
        return "writing a checkpoint (torch serialization)", own[1] if own else innermost
    function, where = own or (frames[0][0], innermost)
    return f"in {function}", where


def _timeout_ms(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    rows = con.execute(
        """
        SELECT coalesce(TRY_CAST(regexp_extract(message, 'Timed out waiting (\\d+)ms', 1) AS BIGINT),
                        TRY_CAST(regexp_extract(message, 'Timeout\\(ms\\)=(\\d+)', 1) AS BIGINT),
                        TRY_CAST(attrs->>'timeout_ms' AS BIGINT))
        FROM events WHERE run_id = ? AND (kind IN ('exception', 'watchdog_timeout', 'pg_init'))
        """, [run_id]).fetchall()
    values = [r[0] for r in rows if r[0]]
    return min(values) if values else None


def _failure_starts(con: duckdb.DuckDBPyConnection, run_id: str, timed_out: dict) -> list[tuple[str, int]]:
    """(file, line) where each timed-out rank's error begins: its timeout line, or the first line
    of the traceback that ends in it."""
    starts = [(t["file"], t["line"]) for t in timed_out.values() if t["file"] is not None]
    if not starts:
        return starts
    # one query for every rank's (a query a rank cost 1 ms each: half a second for 511 ranks timed out)
    wanted = set(starts)
    return starts + [(file, int(first)) for file, line, first in con.execute(
        "SELECT file, line_no, attrs->>'traceback_line' FROM events WHERE run_id = ? AND file IN (SELECT unnest(?)) "
        "AND attrs->>'traceback_line' IS NOT NULL", [run_id, sorted({file for file, _ in starts})]).fetchall()
        if (file, line) in wanted]


def _waiting_line(con: duckdb.DuckDBPyConnection, run_id: str, timed_out: dict) -> str | None:
    """The user's own frame of the first timed-out rank's traceback: where the job waited."""
    for t in sorted(timed_out.values(), key=lambda t: t["rank"]):
        rows = con.execute("SELECT attrs->>'user_frame' FROM events WHERE run_id = ? AND file = ? AND line_no = ? "
                           "AND attrs->>'user_frame' IS NOT NULL", [run_id, t["file"], t["line"]]).fetchall()
        if rows:
            return rows[0][0]
    return None


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    timed_out, missing = stuck_elsewhere(con, run_id)
    if not missing:
        return []
    late = {m["rank"] for m in missing}
    frames: dict[int, list] = {}
    for rank, function, file, line in con.execute(
        """
        SELECT rank, function, file, line FROM stacks
        WHERE run_id = ? AND source = 'pyspy' AND thread = 'MainThread' ORDER BY rank, origin, depth
        """, [run_id]).fetchall():
        if rank in late:
            frames.setdefault(rank, []).append((function, file, line))
    busy = {rank: doing for rank, stack in frames.items() if (doing := what_it_was_doing(stack))}
    timeout = _timeout_ms(con, run_id)
    # a late rank with no stack dump: its progress bar, if it kept moving for most of the timeout
    undumped = late - set(frames)
    by_progress = busy_by_progress(con, run_id, undumped, timeout,
                                   _failure_starts(con, run_id, timed_out) if undumped else [])
    busy.update(by_progress)
    if not busy:
        return []
    rows = [{"rank": rank, "ts": None, "file": None, "line": None, "culprit": True,
             "text": f"{work} at {where} when the collective timeout expired",
             "work": work, "where": where, "waiting": rank_ranges(list(timed_out)),
             # a bar is not code: the user's line is where the others waited for it
             "user_line": _waiting_line(con, run_id, timed_out) if rank in by_progress else where,
             "timeout": f"the {timeout / 1000:g} s collective timeout" if timeout
             else "their collective timeout (its length is not in the logs)", "confidence": 0.8}
            for rank, (work, where) in sorted(busy.items())]
    rows += [{**t, "culprit": False} for t in timed_out.values()]
    return rows

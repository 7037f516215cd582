"""timeout-misconfigured: a rank was busy with legitimate slow work (writing a checkpoint,
saving, evaluating) when its peers' collective timeout expired.

Told apart from a hang by where the late rank was: its stack dump shows it inside a
save / checkpoint / serialization call, making progress, not blocked on a queue or a lock.
The timeout in force comes from the timeout message ("Timed out waiting 30000ms") or
ProcessGroupNCCL's init options.
"""

from __future__ import annotations

import re

import duckdb

from postmortem.engine import rank_ranges

from .common import stuck_elsewhere

_SLOW_WORK = re.compile(r"(?i)checkpoint|save|serializ|write|flush|fsync|distributed/checkpoint|evaluat|validat")


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


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    timed_out, missing = stuck_elsewhere(con, run_id)
    if not missing:
        return []
    frames = con.execute(
        """
        SELECT rank, depth, function, file, line FROM stacks
        WHERE run_id = ? AND source = 'pyspy' AND thread = 'MainThread' ORDER BY rank, depth
        """, [run_id]).fetchall()
    busy = {}
    for rank, depth, function, file, line in frames:
        if rank in busy or rank not in {m["rank"] for m in missing}:
            continue
        if _SLOW_WORK.search(f"{function} {file}"):
            busy[rank] = (function, f"{file}:{line}")
    if not busy:
        return []
    timeout = _timeout_ms(con, run_id)
    rows = [{"rank": rank, "ts": None, "file": None, "line": None, "culprit": True,
             "text": f"in {function} at {where} when the collective timeout expired",
             "work": function, "where": where, "waiting": rank_ranges(list(timed_out)),
             "timeout_s": f"{timeout / 1000:g}" if timeout else "?", "confidence": 0.8}
            for rank, (function, where) in sorted(busy.items())]
    rows += [{**t, "culprit": False} for t in timed_out.values()]
    return rows

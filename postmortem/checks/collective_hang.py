"""collective-hang: ranks timed out in a collective that another rank never reached.

A rank is missing when others timed out waiting and it neither timed out itself nor
failed on its own: it was torn down by torchrun, or never ended. Where it was comes from
its py-spy dump (innermost frame and the user's line), else its last log line.
"""

from __future__ import annotations

import duckdb

from .common import stack_positions, stuck_elsewhere


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    timed_out, missing = stuck_elsewhere(con, run_id)
    if not missing:
        return []
    stacks = stack_positions(con, run_id)
    rows = []
    for m in missing:
        pos = stacks.get(m["rank"])
        last = m["last_event"] or {}
        if pos:
            where = f"in {pos['innermost']}, called from {pos['user_line'] or 'no user frame'}"
            rows.append({"rank": m["rank"], "ts": last.get("ts"), "file": pos["file"], "line": None,
                         "text": where, "where": where, "user_line": pos["user_line"] or "unknown",
                         "culprit": True, "confidence": 0.9})
        else:
            where = f"somewhere no stack dump shows; its last log line was at {last.get('ts')}: {(last.get('text') or '')[:200]}"
            rows.append({"rank": m["rank"], "ts": last.get("ts"), "file": last.get("file"), "line": last.get("line"),
                         "text": last.get("text"), "where": where, "user_line": "unknown",
                         "culprit": True, "confidence": 0.75})
    waiting = ", ".join(str(r) for r in sorted(timed_out))
    for row in rows:
        row["waiting"] = waiting
    for t in timed_out.values():
        rows.append({**t, "culprit": False})
    return rows

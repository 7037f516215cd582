"""collective-timeout, from the collectives lined up: every rank issued the sequence, none completed it.

The watchdog's timeout lines are the signature's own SQL. This check adds what the
alignment (``collective_alignment``) can say when no rank is missing, behind or in
disagreement: all the group's ranks with a record are in the same collective and it never
finished (a network or NCCL stall, or a rank that left no record). When the alignment names
a culprit, the timeout is that culprit's symptom and nothing is added here.
"""

from __future__ import annotations

import duckdb

from . import collective_alignment as alignment


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    found = alignment.analyze(con, run_id)
    if any(d.kind in ("mismatch", "never_enqueued", "never_completed") for d in found):
        return []
    sites = alignment.call_sites(con, run_id)
    rows = []
    for d in found:
        if d.kind != "stuck":
            continue
        site = alignment.first_site(sites, d.calls.values())
        called = f", called from {site}" if site else ""
        for rank in d.others:
            call = d.calls.get(rank)
            rows.append({"rank": rank, "ts": call.ts if call else None, "file": call.file if call else None,
                         "line": call.line if call else None, "text": f"{d.detail} ({d.group}{called})",
                         "user_line": site or "unknown"})
    return rows

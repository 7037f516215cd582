"""collective-timeout, from the collectives lined up: every rank issued the sequence, none completed it.

The watchdog's timeout lines are the signature's own SQL. This check adds what the
alignment (``collective_alignment``) can say when no rank is missing, behind or in
disagreement: all the group's ranks with a record are in the same collective and it never
finished (a network or NCCL stall, or a rank that left no record). When the alignment names
a culprit, the timeout is that culprit's symptom and nothing is added here.
"""

from __future__ import annotations

import duckdb

from postmortem.ranges import rank_ranges

from . import collective_alignment as alignment


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    found = alignment.analyze(con, run_id)
    if any(d.kind in ("mismatch", "never_enqueued", "never_completed") for d in found):
        return []
    sites = alignment.call_sites(con, run_id)
    rows = []
    # Every rank the watchdog saw time out, in a group the alignment could place or not.
    timed_out = {r for (r,) in con.execute(
        """SELECT rank FROM collectives WHERE run_id = $1 AND source = 'watchdog' AND state = 'timed_out'
           UNION SELECT rank FROM rank_status WHERE run_id = $1 AND source = 'watchdog' AND timed_out_seq IS NOT NULL""",
        [run_id]).fetchall() if r is not None}
    for d in found:
        if d.kind != "stuck":
            continue
        site = alignment.first_site(sites, d.calls.values())
        called = f", called from {site}" if site else ""
        for rank in d.others:
            call = d.calls.get(rank)
            # culprit False: the ranks in the stalled collective waited in it; none is shown to be the cause
            rows.append({"rank": rank, "ts": call.ts if call else None, "file": call.file if call else None,
                         "line": call.line if call else None, "text": f"{d.detail} ({d.group}{called})",
                         "user_line": site or "unknown", "culprit": False,
                         "waited": f"rank(s) {rank_ranges(sorted(timed_out | set(d.others)))}"})
    return rows

"""collective-hang: ranks waited in a collective that another rank never reached, or never finished.

From the collectives lined up by (group, sequence) (``collective_alignment``): a rank that
never issued the sequence the others wait in (flight-recorder dumps, or the watchdog's
"last enqueued work" lines), or a rank that issued it and never completed it while a peer
did (its GPU or NCCL kernel stopped). Where such a rank was comes from its py-spy dump.

Without a dump or a watchdog status line (gloo), a rank is missing when others timed
out waiting and it neither timed out itself nor failed on its own: torchrun tore it down,
or it never ended. Where it was comes from its py-spy dump, else its last log line.
"""

from __future__ import annotations

from dataclasses import replace

import duckdb

from postmortem.summary import rank_endings

from . import collective_alignment as alignment
from .common import stack_positions, stuck_elsewhere

_KINDS = ("never_enqueued", "never_completed")


def _headline(d: alignment.Disagreement) -> str:
    op = d.op or "the collective"
    waiting = alignment._fmt(d.others)
    if d.kind == "never_completed":
        return (f"rank(s) {alignment._fmt(d.culprits)} issued {op} sequence {d.seq} on {d.group} and never "
                f"completed it, while rank(s) {waiting} did")
    return (f"rank(s) {alignment._fmt(d.culprits)} never issued {op} sequence {d.seq} on {d.group} that rank(s) "
            f"{waiting} wait in")


def _file_of(con: duckdb.DuckDBPyConnection, run_id: str, rank: int) -> tuple[str | None, int | None]:
    """The culprit's own record: its dump, else its status line."""
    row = con.execute(
        """
        SELECT file, line_no FROM (
            SELECT path AS file, NULL::BIGINT AS line_no, 0 AS pref FROM files
            WHERE run_id = $1 AND rank = $2 AND kind = 'flight_recorder'
            UNION ALL SELECT file, line_no, 1 FROM rank_status WHERE run_id = $1 AND rank = $2
        ) ORDER BY pref, file LIMIT 1
        """, [run_id, rank]).fetchall()
    return (row[0][0], row[0][1]) if row else (None, None)


def _aligned(con: duckdb.DuckDBPyConnection, run_id: str, found: list[alignment.Disagreement]) -> list[dict]:
    found = sorted(found, key=lambda d: (_KINDS.index(d.kind), -len(d.culprits), d.seq))
    stacks = stack_positions(con, run_id)
    first = found[0]
    culprits = sorted({r for d in found for r in d.culprits})
    places = []
    for rank in culprits:
        pos = stacks.get(rank)
        if pos:
            places.append(f"rank {rank} was in {pos['innermost']}, called from {pos['user_line'] or 'no user frame'}")
    if places:
        where = "; ".join(places)
    elif first.kind == "never_completed":
        where = "a peer can complete a collective only with every rank's data, so their GPU or NCCL kernel stopped"
    else:
        where = "they were outside torch.distributed (no stack dump shows where)"
    headline = _headline(first)
    if set(culprits) - set(first.culprits):
        firsts = {}
        for d in found:
            for rank in d.culprits:
                firsts.setdefault(rank, d)
        verb = "never completed" if first.kind == "never_completed" else "never issued"
        headline = f"rank(s) {alignment._fmt(culprits)} {verb} collectives their groups wait in: " + "; ".join(
            f"rank {r}: {firsts[r].op or 'collective'} sequence {firsts[r].seq} on {firsts[r].group}" for r in culprits)
    groups = sorted({d.group for d in found if set(d.culprits) & set(culprits)})
    site = alignment.first_site(alignment.call_sites(con, run_id), first.calls.values())
    if site:
        headline += f" (called from {site})"
    rows = []
    for rank in culprits:
        own = next(d for d in found if rank in d.culprits)
        call = own.calls.get(rank)
        file, line = (call.file, call.line) if call else _file_of(con, run_id, rank)
        pos = stacks.get(rank)
        rows.append({"rank": rank, "ts": call.ts if call else None, "file": file, "line": line,
                     "text": own.detail + f" ({own.group})", "culprit": True, "case": first.kind,
                     "headline": headline, "where": where,
                     "user_line": (pos or {}).get("user_line") or "unknown",
                     "waiting": alignment._fmt(first.others), "groups": "; ".join(groups[:8]),
                     "confidence": 0.9 if first.kind == "never_enqueued" else 0.8})
    for rank in first.others:
        call = first.calls.get(rank)
        if call is not None:
            rows.append({"rank": rank, "ts": call.ts, "file": call.file, "line": call.line,
                         "text": f"rank {rank}: {call.describe()}, {call.state}", "culprit": False})
    return rows


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    everything = alignment.analyze(con, run_id)
    # The first disagreement in a group is the root: ranks that part ways at sequence 2 (a
    # mismatch) and then wait for each other at 3 have a mismatch, not a hang.
    first_mismatch = {d.pg: d.seq for d in everything if d.kind == "mismatch" and d.source == "flight_recorder"}
    found = [d for d in everything if d.kind in _KINDS and d.seq < first_mismatch.get(d.pg, d.seq + 1)]
    # A rank that died of its own failure never issued what came after: rank-crash's case.
    crashed = {e["rank"] for e in rank_endings(con, run_id)
               if not e["consequence"] and e["ended"] != "no failure recorded"}
    found = [replace(d, culprits=[r for r in d.culprits if r not in crashed]) if d.kind == "never_enqueued" else d
             for d in found]
    found = [d for d in found if d.culprits]
    if found:
        return _aligned(con, run_id, found)
    timed_out, missing = stuck_elsewhere(con, run_id)
    if not missing:
        return []
    stacks = stack_positions(con, run_id)
    rows = []
    waiting = ", ".join(str(r) for r in sorted(timed_out))
    for m in missing:
        pos = stacks.get(m["rank"])
        if pos and pos["collective"]:
            continue  # it reached a collective, another one: collective-mismatch's case
        last = m["last_event"] or {}
        headline = f"rank {m['rank']} never reached the collective that rank(s) {waiting} timed out in"
        if pos:
            where = f"it was in {pos['innermost']}, called from {pos['user_line'] or 'no user frame'}"
            rows.append({"rank": m["rank"], "ts": last.get("ts"), "file": pos["file"], "line": None,
                         "text": where, "where": where, "user_line": pos["user_line"] or "unknown",
                         "headline": headline, "culprit": True, "confidence": 0.9})
        else:
            where = (f"it was somewhere no stack dump shows; its last log line was at {last.get('ts')}: "
                     f"{(last.get('text') or '')[:200]}")
            rows.append({"rank": m["rank"], "ts": last.get("ts"), "file": last.get("file"), "line": last.get("line"),
                         "text": last.get("text"), "where": where, "user_line": "unknown", "headline": headline,
                         "culprit": True, "confidence": 0.75})
    if not rows:
        return []
    for row in rows:
        row["waiting"] = waiting
    for t in timed_out.values():
        rows.append({**t, "culprit": False})
    return rows

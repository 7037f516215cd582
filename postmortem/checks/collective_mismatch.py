"""collective-mismatch: ranks at the same point of their collective sequence disagree.

First from the collectives lined up by (group, sequence) (``collective_alignment``): the
flight recorder, the watchdog's WorkNCCL lines, TORCH_DISTRIBUTED_DEBUG=DETAIL fingerprints
and NCCL COLL lines, each in its own numbering: a different op, element count (including
the all-gather / reduce-scatter ``size x`` rules) or dtype at the same sequence number.

Else from stack dumps: every rank is inside a collective, not the same one. The culprit
is the smaller group; between two equal groups, the one whose collective the user's code
calls directly (a `dist.barrier()` under `if rank == 0`) rather than one the framework
issues for everyone (DDP's gradient all-reduce under backward).
"""

from __future__ import annotations

from collections import defaultdict

import duckdb

from . import collective_alignment as alignment
from .common import stack_positions, timed_out_ranks

# The more direct the record, the better the evidence: the recorder and the watchdog saw
# the collective; DETAIL checked it before it ran; NCCL's lines are numbered by us.
_SOURCE_ORDER = ("detail", "flight_recorder", "watchdog", "nccl_log")


def _user_frames(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[tuple, str]:
    """The user's frame of the exception raised at a line (DETAIL's mismatch is an exception)."""
    rows = con.execute(
        "SELECT file, line_no, attrs->>'user_frame' FROM events WHERE run_id = ? AND kind = 'exception' "
        "AND attrs->>'user_frame' IS NOT NULL", [run_id]).fetchall()
    return {(f, line): frame for f, line, frame in rows}


def _aligned(con: duckdb.DuckDBPyConnection, run_id: str, found: list[alignment.Disagreement]) -> list[dict]:
    d = min(found, key=lambda x: (_SOURCE_ORDER.index(x.source) if x.source in _SOURCE_ORDER else 9, x.seq))
    frames = _user_frames(con, run_id)
    stacks = stack_positions(con, run_id)
    # The culprits' call site first: where the odd rank's code went, not where the others waited.
    calls = [d.calls[r] for r in d.culprits + d.others if r in d.calls]
    user_line = next((frames[(c.file, c.line)] for c in calls if (c.file, c.line) in frames), None)
    if user_line is None:
        sites = alignment.call_sites(con, run_id)
        user_line = alignment.first_site(sites, calls)
    if user_line is None:
        user_line = next((stacks[r]["user_line"] for r in d.culprits if stacks.get(r, {}).get("user_line")), None)
    detail = f"{d.group}, sequence {d.seq}: {d.detail}"
    rows = []
    for rank in d.culprits + d.others:
        call = d.calls.get(rank)
        if call is None:
            continue
        rows.append({"rank": rank, "ts": call.ts, "file": call.file, "line": call.line,
                     "text": f"rank {rank} at sequence {d.seq}: {call.describe()}", "culprit": rank in d.culprits,
                     "detail": detail, "user_line": user_line or "unknown", "source": d.source,
                     "confidence": 0.9 if d.source in ("flight_recorder", "detail", "watchdog") else 0.75})
    return rows


def _from_stacks(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    if not timed_out_ranks(con, run_id):
        return []
    stacks = stack_positions(con, run_id)
    if len(stacks) < 2 or any(p["collective"] is None for p in stacks.values()):
        return []
    groups: dict[str, list[dict]] = defaultdict(list)
    for pos in stacks.values():
        groups[pos["collective"]].append(pos)
    if len(groups) < 2:
        return []
    ordered = sorted(groups.values(), key=lambda g: (len(g), not any(p["direct_call"] for p in g)))
    culprits = {p["rank"] for p in ordered[0]}
    detail = "; ".join(
        f"rank(s) {', '.join(str(p['rank']) for p in g)} in {g[0]['collective']} from {g[0]['user_line']}"
        for g in ordered
    )
    return [{"rank": p["rank"], "ts": None, "file": p["file"], "line": None,
             "text": f"in {p['innermost']}, called from {p['user_line']}", "culprit": p["rank"] in culprits,
             "detail": detail, "user_line": p["user_line"] or "unknown", "confidence": 0.8}
            for p in sorted(stacks.values(), key=lambda p: (p["rank"] not in culprits, p["rank"]))]


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    found = [d for d in alignment.analyze(con, run_id) if d.kind == "mismatch"]
    if found:
        return _aligned(con, run_id, found)
    return _from_stacks(con, run_id)

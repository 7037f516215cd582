"""collective-mismatch from stack dumps: every rank is inside a collective, not the same one.

The culprit is the smaller group; between two equal groups, the one whose collective the
user's code calls directly (a `dist.barrier()` under `if rank == 0`) rather than one the
framework issues for everyone (DDP's gradient all-reduce under backward).
"""

from __future__ import annotations

from collections import defaultdict

import duckdb

from .common import stack_positions, timed_out_ranks


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
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

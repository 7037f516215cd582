"""straggler: one rank is slow, and the others' collectives wait for it.

Per profiled step, each rank's time in collectives (its NCCL kernels on a GPU, its
``gloo:*`` / ``nccl:*`` spans on CPU: the ``profiler_step`` events of parsers/profiler.py).
A collective ends at about the same time on every rank, so a rank's time in it is its
wait for the last one to arrive plus the transfer: the rank that arrives last waits least.
In each step the rank with the least collective time is the one the others waited on; a
straggler is the same rank in most steps, with the others waiting a large share of the
step for it.
"""

from __future__ import annotations

import json
from collections import Counter
from statistics import median

import duckdb

MIN_SHARE = 0.25  # the others' median extra wait, as a share of the step
MIN_WAIT_US = 10_000.0  # below this per step it is jitter, not a rank that sets the pace
MIN_AGREEMENT = 0.66  # share of steps in which the same rank arrived last
MIN_STEPS = 2


def _steps(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict[int, dict]]:
    """step -> rank -> {dur, comm, compute, file, ts}."""
    out: dict[int, dict[int, dict]] = {}
    for rank, ts, file, attrs in con.execute(
            "SELECT rank, ts, file, attrs FROM events WHERE run_id = ? AND kind = 'profiler_step' "
            "AND rank IS NOT NULL ORDER BY ts", [run_id]).fetchall():
        try:
            a = json.loads(attrs)
        except (TypeError, ValueError):
            continue
        if a.get("comm_us") is None or a.get("step") is None:
            continue
        out.setdefault(int(a["step"]), {})[rank] = {
            "dur": float(a["dur_us"]), "comm": float(a["comm_us"]),
            "compute": a.get("compute_us"), "other": a.get("other_us"),
            "source": a.get("comm_source"), "file": file, "ts": ts}
    return out


def _ms(us: float) -> str:
    return f"{us / 1000:,.1f}"


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    steps = {n: ranks for n, ranks in _steps(con, run_id).items() if len(ranks) >= 2}
    if not steps:
        return []
    last_in: Counter = Counter()
    waits: dict[int, list[float]] = {}
    for ranks in steps.values():
        slow = min(ranks, key=lambda r: ranks[r]["comm"])
        last_in[slow] += 1
        others = [v["comm"] - ranks[slow]["comm"] for r, v in ranks.items() if r != slow]
        waits.setdefault(slow, []).append(median(others))
    culprit, count = last_in.most_common(1)[0]
    agreement = count / len(steps)
    wait = median(waits[culprit])
    step_us = median(v["dur"] for ranks in steps.values() for v in ranks.values())
    share = wait / step_us if step_us else 0.0
    if len(steps) < MIN_STEPS or agreement < MIN_AGREEMENT or wait < MIN_WAIT_US or share < MIN_SHARE:
        return []
    per_rank: dict[int, dict] = {}
    for ranks in steps.values():
        for r, v in ranks.items():
            p = per_rank.setdefault(r, {"dur": [], "comm": [], "compute": [], "other": [], "file": v["file"],
                                        "ts": v["ts"], "source": v["source"]})
            p["dur"].append(v["dur"])
            p["comm"].append(v["comm"])
            for key in ("compute", "other"):
                if v[key] is not None:
                    p[key].append(float(v[key]))
    others = sorted(r for r in per_rank if r != culprit)
    first, last = min(steps), max(steps)
    c = per_rank[culprit]
    what = "NCCL kernels" if c["source"] == "nccl_kernels" else "collectives"

    def split(p: dict) -> str:
        parts = [f"{_ms(median(p['dur']))} ms per step", f"{_ms(median(p['comm']))} ms in {what}"]
        if p["other"]:
            parts.append(f"{_ms(median(p['other']))} ms outside them")
        if p["compute"]:
            parts.append(f"{_ms(median(p['compute']))} ms of GPU compute kernels")
        return ", ".join(parts)

    rows = [{
        "rank": culprit, "ts": c["ts"], "file": c["file"], "line": None, "culprit": True,
        "text": (f"rank {culprit}, ProfilerStep#{first}..#{last} (medians): {split(c)}; it arrived last at the "
                 f"collectives in {count} of {len(steps)} steps"),
        "wait_ms": _ms(wait), "share_pct": f"{100 * share:.0f}", "step_ms": _ms(step_us), "what": what,
        "steps": len(steps), "agreement": f"{count} of {len(steps)}", "others": ", ".join(map(str, others)),
        "first_step": first, "last_step": last,
        "confidence": round(min(0.9, 0.6 + 0.3 * agreement * min(share / 0.5, 1.0)), 2),
    }]
    for r in others:
        rows.append({"rank": r, "ts": per_rank[r]["ts"], "file": per_rank[r]["file"], "line": None, "culprit": False,
                     "text": f"rank {r} (medians): {split(per_rank[r])}, waiting for rank {culprit}"})
    return rows

"""straggler: one rank is slow, and the others' collectives wait for it.

Per profiled step, each rank's time in collectives (its NCCL kernels on a GPU, its
``gloo:*`` / ``nccl:*`` spans on CPU: the ``profiler_step`` events of parsers/profiler.py).
A collective ends at about the same time on every rank, so a rank's time in it is its
wait for the last one to arrive plus the transfer: the rank that arrives last waits least.
In each step the rank with the least collective time is the one the others waited on; a
straggler is the same rank in most steps, with the others waiting a large share of the
step for it.

Without traces, a framework's own per-rank timing report (the ``rank_time`` events of
parsers/ranktime.py: a list of one measure per rank, or one rank's time against the median
rank's) says the same in numbers: a rank whose time is at least ``MIN_RATIO`` times the median
rank's, by at least ``MIN_WAIT_US``, in most of the reports that have a slow rank and in at least
half of all of them, set the pace.
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
MIN_RATIO = 1.5  # a reported rank's time against the median rank's: below this it is spread, not a straggler
MIN_REPORT_RANKS = 3  # a list needs this many ranks for its median to say what is usual
MIN_SLOW_REPORTS = 0.5  # share of the reports in which the rank is slow: one slow report is a hiccup


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


def _reports(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, list[dict]]:
    """report -> its per-rank times, in line order."""
    out: dict[str, list[dict]] = {}
    for ts, file, line, message, attrs in con.execute(
            "SELECT ts, file, line_no, message, attrs FROM events WHERE run_id = ? AND kind = 'rank_time' "
            "ORDER BY file, line_no", [run_id]).fetchall():
        a = json.loads(attrs)
        out.setdefault(a["report"], []).append({**a, "ts": ts, "file": file, "line": line, "text": message})
    return out


def _slow_in(report: list[dict]) -> tuple[dict, float] | None:
    """The rank that set this report's pace, and the usual (median) figure it is measured against:
    a time (the slow rank's is the longest) or a performance score (its is the lowest)."""
    if report[0].get("median_ms") is not None:
        slow, usual = report[0], report[0]["median_ms"]
    else:
        if len({r["subject_rank"] for r in report}) < MIN_REPORT_RANKS:
            return None
        key = "ms" if report[0].get("ms") is not None else "score"
        slow = (max if key == "ms" else min)(report, key=lambda r: r[key])
        usual = median(r[key] for r in report if r is not slow)
        if key == "score":  # a score is a speed: the usual rank is `ratio` times faster
            return (slow, usual) if slow["score"] > 0 and usual / slow["score"] >= MIN_RATIO else None
    excess_us = (slow["ms"] - usual) * 1000
    if usual <= 0 or slow["ms"] / usual < MIN_RATIO or excess_us < MIN_WAIT_US:
        return None
    return slow, usual


def from_reports(reports: dict[str, list[dict]]) -> list[dict]:
    """The evidence row naming the rank that set the pace in most per-rank timing reports, if one did."""
    slow = [s for s in map(_slow_in, reports.values()) if s]
    if not slow:
        return []
    counts = Counter(s["subject_rank"] for s, _ in slow)
    culprit, count = counts.most_common(1)[0]
    if count / len(slow) < MIN_AGREEMENT or count / len(reports) < MIN_SLOW_REPORTS:
        return []
    first, usual = next((s, u) for s, u in slow if s["subject_rank"] == culprit)
    if first.get("ms") is not None:
        figure = f"its time was {first['ms']:,.1f} ms against the median rank's {usual:,.1f} ms ({first['ms'] / usual:.1f}x)"
    else:
        figure = f"its performance score was {first['score']:.2f} against the median rank's {usual:.2f}"
    detail = f"{figure}, slowest in {count} of {len(reports)} per-rank timing report(s)"
    return [{"rank": culprit, "ts": first["ts"], "file": first["file"], "line": first["line"], "culprit": True,
             "text": first["text"], "detail": detail,
             "confidence": round(min(0.8, 0.5 + 0.3 * count / len(reports)), 2)}]


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    steps = {n: ranks for n, ranks in _steps(con, run_id).items() if len(ranks) >= 2}
    if not steps:
        return from_reports(_reports(con, run_id))
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
        "detail": (f"over ProfilerStep#{first}..#{last} it arrived last at the collectives in {count} of "
                   f"{len(steps)} steps, and rank(s) {', '.join(map(str, others))} waited a median {_ms(wait)} ms "
                   f"per step in {what} for it ({100 * share:.0f}% of a {_ms(step_us)} ms step)"),
        "confidence": round(min(0.9, 0.6 + 0.3 * agreement * min(share / 0.5, 1.0)), 2),
    }]
    for r in others:
        rows.append({"rank": r, "ts": per_rank[r]["ts"], "file": per_rank[r]["file"], "line": None, "culprit": False,
                     "text": f"rank {r} (medians): {split(per_rank[r])}, waiting for rank {culprit}"})
    return rows

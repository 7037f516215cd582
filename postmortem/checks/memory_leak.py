"""memory-leak: memory that grows step over step, by a robust fit, per rank.

For each rank the best per-step series in ``memory`` is fitted (a log's per-step lines,
else the profiler's ``[memory]`` samples, else a snapshot's replayed trace): one value per
step, the last sample of the step (what the step left behind). The slope is Theil-Sen's
(the median of the pairwise slopes), so a warm-up jump at step 0 (optimizer state) or a
one-off spike does not make a trend; R^2 says how well a straight line explains the series.
A leak is a slope that grew the series by at least ``MIN_GROWTH`` of its start and
``MIN_GROWTH_BYTES`` over the steps seen, with R^2 >= ``MIN_R2``, over ``MIN_POINTS`` points; a
shorter series of ``FEW_POINTS`` counts only when every point is above the one before and the
last is ``FEW_POINTS_GROWTH`` times the first (a warm-up settles after a step or two; this does
not). A series whose lines name no step (``report_memory()`` printed once per step) is ordered by
its lines in its file; a log that names no rank at all is one process's, and its series counts as
that process's (rank NULL). Steps to OOM are the
headroom left at the last step over the slope, the limit being the OOM message's
"allowed" (set_per_process_memory_fraction) or the GPU's capacity.
"""

from __future__ import annotations

import json
from itertools import pairwise
from statistics import median

import duckdb

MIN_POINTS = 5
MIN_STEPS = 4
FEW_POINTS = 4
FEW_POINTS_GROWTH = 2.0
MIN_GROWTH = 0.10
MIN_GROWTH_BYTES = 32 << 20
MIN_R2 = 0.8
MAX_POINTS = 400
_SOURCE_ORDER = {"log": 0, "profiler": 1, "snapshot": 2}
_VALUES = ("allocated", "peak_allocated", "reserved", "peak_reserved")


def theil_sen(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(slope, intercept, R^2) of the Theil-Sen line through the points."""
    n = len(xs)
    if n > MAX_POINTS:  # pairwise slopes are quadratic: fit an even subsample of a long series
        idx = [round(i * (n - 1) / (MAX_POINTS - 1)) for i in range(MAX_POINTS)]
        xs, ys = [xs[i] for i in idx], [ys[i] for i in idx]
        n = MAX_POINTS
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n) if xs[j] != xs[i]]
    if not slopes:
        return 0.0, ys[0], 0.0
    slope = median(slopes)
    intercept = median(y - slope * x for x, y in zip(xs, ys))
    mean = sum(ys) / n
    total = sum((y - mean) ** 2 for y in ys)
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    return slope, intercept, (1.0 - residual / total) if total > 0 else 0.0


def _series(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, list[dict]]:
    """rank -> candidate series: one point per step (the step's last sample)."""
    rows = con.execute(
        """
        WITH m AS (
            SELECT * FROM memory
            WHERE run_id = $1 AND site IS NULL AND source IN ('log', 'profiler', 'snapshot')
              AND coalesce(allocated, peak_allocated, reserved, peak_reserved) IS NOT NULL
              -- rank-less rows are one process's only when no row names a rank
              AND (rank IS NOT NULL OR NOT EXISTS (
                    SELECT 1 FROM memory WHERE run_id = $1 AND rank IS NOT NULL))
        ),
        s AS (
            SELECT rank, source, coalesce(device, 0) AS device,
                   -- lines that name no step are steps in their file's order
                   coalesce(step, CASE WHEN count(step) OVER w = 0 THEN row_number() OVER (w ORDER BY line_no) - 1 END)
                       AS step,
                   coalesce(allocated, peak_allocated, reserved, peak_reserved) AS value,
                   CASE WHEN allocated IS NOT NULL THEN 'allocated'
                        WHEN peak_allocated IS NOT NULL THEN 'peak_allocated'
                        WHEN reserved IS NOT NULL THEN 'reserved' ELSE 'peak_reserved' END AS what,
                   ts, file, line_no
            FROM m
            WINDOW w AS (PARTITION BY file, rank, source, coalesce(device, 0),
                         allocated IS NULL, peak_allocated IS NULL, reserved IS NULL)
        )
        SELECT rank, source, device, what, step,
               arg_max(value, (coalesce(ts, TIMESTAMP '1970-01-01'), coalesce(line_no, 0))) AS value,
               arg_max(file, (coalesce(ts, TIMESTAMP '1970-01-01'), coalesce(line_no, 0))) AS file,
               arg_max(line_no, (coalesce(ts, TIMESTAMP '1970-01-01'), coalesce(line_no, 0))) AS line_no,
               max(ts) AS ts
        FROM s WHERE step IS NOT NULL
        GROUP BY ALL ORDER BY rank, source, device, what, step
        """, [run_id]).fetchall()
    series: dict[tuple, dict] = {}
    for rank, source, device, what, step, value, file, line_no, ts in rows:
        key = (rank, source, device, what)
        s = series.setdefault(key, {"rank": rank, "source": source, "device": device, "what": what, "points": []})
        s["points"].append({"step": step, "value": value, "file": file, "line": line_no, "ts": ts})
    by_rank: dict[int, list[dict]] = {}
    for s in series.values():
        by_rank.setdefault(s["rank"], []).append(s)
    return by_rank


def _few_but_steep(points: list[dict]) -> bool:
    """A short series that rises at every point and multiplies: no warm-up looks like that."""
    ys = [p["value"] for p in points]
    return (len(ys) >= FEW_POINTS and all(b > a for a, b in pairwise(ys))
            and ys[-1] >= FEW_POINTS_GROWTH * max(ys[0], 1))


def _best(candidates: list[dict]) -> dict | None:
    usable = [s for s in candidates if (len(s["points"]) >= MIN_POINTS
              and s["points"][-1]["step"] - s["points"][0]["step"] >= MIN_STEPS) or _few_but_steep(s["points"])]
    if not usable:
        return None
    return min(usable, key=lambda s: (s["device"] == -1, _SOURCE_ORDER.get(s["source"], 9),
                                      _VALUES.index(s["what"]), -len(s["points"])))


def _limits(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    """rank -> its OOM (event row and the memory limit it names), if it had one."""
    rows = con.execute(
        """
        SELECT rank, ts, file, line_no, message,
               coalesce(TRY_CAST(attrs->>'allowed' AS BIGINT), TRY_CAST(attrs->>'capacity' AS BIGINT)) AS limit_bytes,
               attrs->>'allowed' IS NOT NULL AS fraction
        FROM events WHERE run_id = ? AND kind = 'oom' AND rank IS NOT NULL
        ORDER BY ts NULLS LAST, line_no
        """, [run_id]).fetchall()
    out: dict[int, dict] = {}
    for rank, ts, file, line, message, limit, fraction in rows:
        out.setdefault(rank, {"ts": ts, "file": file, "line": line, "text": message, "limit": limit,
                              "fraction": fraction})
    return out


def _device_limits(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, int]:
    """rank -> the largest device capacity its profiler trace names."""
    out: dict[int, int] = {}
    for rank, attrs in con.execute(
            "SELECT rank, attrs FROM events WHERE run_id = ? AND kind = 'profiler_trace' AND rank IS NOT NULL",
            [run_id]).fetchall():
        try:
            devices = json.loads(attrs).get("devices") or []
        except (TypeError, ValueError):
            continue
        sizes = [d.get("total_bytes") for d in devices if isinstance(d, dict) and d.get("total_bytes")]
        if sizes:
            out[rank] = max(sizes)
    return out


def _sites(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    """rank -> the top live allocation site of its memory snapshot."""
    out: dict[int, dict] = {}
    for rank, ts, file, attrs in con.execute(
            "SELECT rank, ts, file, attrs FROM events WHERE run_id = ? AND kind = 'memory_snapshot' "
            "AND rank IS NOT NULL ORDER BY ts", [run_id]).fetchall():
        try:
            top = (json.loads(attrs).get("top_sites") or [None])[0]
        except (TypeError, ValueError):
            continue
        if top:
            out[rank] = {**top, "ts": ts, "file": file}
    return out


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    ooms = _limits(con, run_id)
    capacity = _device_limits(con, run_id)
    sites = _sites(con, run_id)
    leaks = []
    for rank, candidates in sorted(_series(con, run_id).items()):
        s = _best(candidates)
        if s is None:
            continue
        pts = s["points"]
        xs, ys = [p["step"] for p in pts], [p["value"] for p in pts]
        slope, _, r2 = theil_sen(xs, ys)
        growth = slope * (xs[-1] - xs[0])
        start = max(ys[0], 1)
        if slope <= 0 or r2 < MIN_R2 or growth < MIN_GROWTH_BYTES or growth < MIN_GROWTH * start:
            continue
        leaks.append((rank, s, slope, r2))
    if not leaks:
        return []
    rows = []
    for rank, s, slope, r2 in leaks:
        pts = s["points"]
        first, last = pts[0], pts[-1]
        oom = ooms.get(rank)
        limit = (oom or {}).get("limit") or capacity.get(rank)
        steps_left = (limit - last["value"]) / slope if limit and limit > last["value"] else None
        limit_name = ("the per-process limit (set_per_process_memory_fraction)" if oom and oom["fraction"]
                      else "the GPU's capacity")
        if oom:
            outcome = f"it ran out of memory after step {last['step']}"
        elif steps_left is not None:
            outcome = f"at this rate it would run out in about {steps_left:,.0f} more steps"
        else:
            outcome = "no OOM was recorded"
        site = sites.get(rank)
        fit = (f"{s['what']} memory grew from {_mib(first['value'])} MiB at step {first['step']} to "
               f"{_mib(last['value'])} MiB at step {last['step']}: +{_mib(slope)} MiB per step "
               f"(Theil-Sen, R^2 {r2:.2f}, {len(pts)} steps from the {s['source']})")
        confidence = 0.75 + (0.1 if oom else 0.0) + (0.05 if site else 0.0) + (0.05 if r2 >= 0.95 else 0.0)
        rows.append({
            "rank": rank, "ts": last["ts"], "file": last["file"], "line": last["line"], "text": fit,
            "culprit": True, "confidence": round(min(confidence, 0.95), 2),
            "slope_mib": _mib(slope), "r2": f"{r2:.2f}", "start_mib": _mib(first["value"]),
            "end_mib": _mib(last["value"]), "first_step": first["step"], "last_step": last["step"],
            "series": s["what"], "series_source": s["source"], "points": len(pts),
            "limit_gib": f"{limit / 2**30:.2f}" if limit else "unknown", "limit_name": limit_name,
            "steps_to_oom": f"{steps_left:,.0f}" if steps_left is not None else "unknown",
            "outcome": outcome,
            "site": site["site"] if site else "unknown (no memory snapshot)",
            "user_line": site["site"] if site else None,
            "site_mib": _mib(site["bytes"]) if site else "?", "site_blocks": site["blocks"] if site else "?",
            "case": "snapshot" if site else "default",
        })
        rows.append({"rank": rank, "ts": first["ts"], "file": first["file"], "line": first["line"],
                     "text": f"step {first['step']}: {s['what']} {_mib(first['value'])} MiB (first point of the fit)",
                     "culprit": False})
        if oom:
            rows.append({"rank": rank, "ts": oom["ts"], "file": oom["file"], "line": oom["line"], "text": oom["text"],
                         "culprit": False})
        if site:
            rows.append({"rank": rank, "ts": site["ts"], "file": site["file"], "line": None,
                         "text": (f"top live allocation site: {site['site']}: {_mib(site['bytes'])} MiB in "
                                  f"{site['blocks']} blocks, {_mib(site.get('kept_across_steps') or 0)} MiB of them "
                                  f"allocated in earlier steps and never freed"),
                         "culprit": False})
    # The first row carries the summary's figures: the rank that grew fastest.
    rows_by_rank = [r for r in rows if r["culprit"]]
    top = max(rows_by_rank, key=lambda r: float(r["slope_mib"].replace(",", "")))
    rows.remove(top)
    return [top] + rows

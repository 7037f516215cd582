"""Questions across runs, over the history database: which host keeps carrying the culprit
rank, which signature fires most and whether it grows, what changed between two runs.

Reads the views of ``schema.VIEWS``; everything here is a query.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb

from .errors import PostmortemError

# Signatures whose culprit rank points at the machine it ran on, not at the code.
HOST_SIGNATURES = ("hardware-fault", "nccl-error", "collective-hang", "collective-timeout", "rank-crash",
                   "native-crash", "straggler")


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def parse_since(text: str | None) -> datetime | None:
    """'7d', '12h', '30m' or an ISO date into a UTC cutoff."""
    if not text:
        return None
    units = {"d": "days", "h": "hours", "m": "minutes", "w": "weeks"}
    if text[-1:] in units and text[:-1].isdigit():
        return datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(**{units[text[-1]]: int(text[:-1])})
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise PostmortemError(f"--since takes 7d, 12h, 30m, 2w or a date like 2026-11-01, not {text!r}.") from exc


def hosts(con: duckdb.DuckDBPyConnection, since: datetime | None = None) -> list[dict]:
    """Hosts ranked as suspects: how many runs named a rank on them as the culprit of a
    host-level fault, out of the runs that used them.

    The rank is by the fault rate with add-one smoothing, (faulty runs + 1) / (runs + 2):
    a host with 3 faults in 3 runs is more suspect than one with 10 in 13 that ran
    everything, and neither a single unlucky run nor a busy host tops the list by itself.
    """
    marks = ", ".join("?" for _ in HOST_SIGNATURES)
    return _rows(con, f"""
        WITH used AS (
            SELECT h.host, count(DISTINCT h.run_id) AS runs_on_host
            FROM v_rank_hosts h JOIN runs r USING (run_id)
            WHERE ? IS NULL OR r.analyzed_at >= ?
            GROUP BY h.host
        ),
        faults AS (
            SELECT host, count(DISTINCT run_id) AS faulty_runs, count(*) AS findings,
                   string_agg(DISTINCT signature, ', ' ORDER BY signature) AS signatures,
                   min(analyzed_at) AS first_seen, max(analyzed_at) AS last_seen
            FROM v_host_faults
            WHERE signature IN ({marks}) AND (? IS NULL OR analyzed_at >= ?)
            GROUP BY host
        )
        SELECT f.host, f.faulty_runs, u.runs_on_host,
               round((f.faulty_runs + 1.0) / (u.runs_on_host + 2.0), 3) AS fault_rate,
               f.findings, f.signatures, f.first_seen, f.last_seen
        FROM faults f JOIN used u USING (host)
        ORDER BY fault_rate DESC, f.faulty_runs DESC, f.host
        """, [since, since, *HOST_SIGNATURES, since, since])


def signatures(con: duckdb.DuckDBPyConnection, since: datetime | None = None) -> list[dict]:
    """Each signature's count as a root cause, and in the window's later half vs its earlier half."""
    return _rows(con, """
        WITH w AS (
            SELECT *, min(analyzed_at) OVER () AS t0, max(analyzed_at) OVER () AS t1
            FROM v_findings WHERE ? IS NULL OR analyzed_at >= ?
        )
        SELECT signature,
               count(DISTINCT run_id) FILTER (role = 'root_cause') AS as_root_cause,
               count(DISTINCT run_id) AS runs,
               count(DISTINCT run_id) FILTER (analyzed_at < t0 + (t1 - t0) / 2) AS earlier_half,
               count(DISTINCT run_id) FILTER (analyzed_at >= t0 + (t1 - t0) / 2) AS later_half,
               max(analyzed_at) AS last_seen
        FROM w GROUP BY signature ORDER BY as_root_cause DESC, runs DESC, signature
        """, [since, since])


def compare(con: duckdb.DuckDBPyConnection, run: str, other: str) -> dict:
    """What changed from ``other`` to ``run``: findings, recompiles per frame, memory, step time."""
    for r in (run, other):
        if not con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [r]).fetchall()[0][0]:
            raise PostmortemError(f"No run {r!r} in the history; `postmortem runs` lists them.")
    findings = _rows(con, """
        SELECT signature,
               bool_or(run_id = $1) AS in_run, bool_or(run_id = $2) AS in_other,
               max(summary) FILTER (run_id = $1) AS summary
        FROM findings WHERE run_id IN ($1, $2) GROUP BY signature ORDER BY signature""", [run, other])
    compiles = _rows(con, """
        SELECT coalesce(function, '?') AS function, code_file, code_line,
               count(*) FILTER (run_id = $1 AND event = 'recompile') AS recompiles,
               count(*) FILTER (run_id = $2 AND event = 'recompile') AS recompiles_before,
               count(*) FILTER (run_id = $1 AND event = 'graph_break') AS graph_breaks,
               count(*) FILTER (run_id = $2 AND event = 'graph_break') AS graph_breaks_before
        FROM compiles WHERE run_id IN ($1, $2) GROUP BY ALL
        HAVING recompiles <> recompiles_before OR graph_breaks <> graph_breaks_before
        ORDER BY abs(recompiles - recompiles_before) DESC""", [run, other])
    memory = _rows(con, """
        SELECT rank, max(allocated) FILTER (run_id = $1) AS peak_allocated,
               max(allocated) FILTER (run_id = $2) AS peak_allocated_before,
               regr_slope(allocated, step) FILTER (run_id = $1) AS bytes_per_step,
               regr_slope(allocated, step) FILTER (run_id = $2) AS bytes_per_step_before
        FROM memory WHERE run_id IN ($1, $2) AND step IS NOT NULL GROUP BY rank ORDER BY rank""", [run, other])
    steps = _rows(con, """
        SELECT rank, avg(dur) FILTER (run_id = $1) / 1000.0 AS step_ms,
               avg(dur) FILTER (run_id = $2) / 1000.0 AS step_ms_before
        FROM kernels WHERE run_id IN ($1, $2) AND category = 'step' GROUP BY rank ORDER BY rank""", [run, other])
    return {
        "run": run, "compared_with": other,
        "new_findings": [f for f in findings if f["in_run"] and not f["in_other"]],
        "gone_findings": [f["signature"] for f in findings if f["in_other"] and not f["in_run"]],
        "compiles": compiles, "memory": memory, "step_time": steps,
    }

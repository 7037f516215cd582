"""The history as Prometheus metrics, for node_exporter's textfile collector.

Reads the history's ``runs``, ``findings`` and views (``v_findings``, ``v_rank_hosts``) and writes one
file in the text exposition format, e.g.

    # HELP postmortem_findings_total Findings in the postmortem history, by signature, severity, the host of a culprit rank and job.
    # TYPE postmortem_findings_total counter
    postmortem_findings_total{signature="collective-hang",severity="critical",host="node17",job="4711"} 3

Point ``--collector.textfile.directory`` at the file's directory and run ``postmortem export
--prometheus DIR/postmortem.prom`` after each analysis (a Slurm epilog, a cron job). The file is
written beside its final name and renamed over it, so the collector never reads half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from . import history

METRICS = {
    "postmortem_findings_total": (
        "counter", "Findings in the postmortem history, by signature, severity, the host of a culprit rank and job."),
    "postmortem_runs_total": ("counter", "Runs analyzed into the postmortem history."),
    "postmortem_last_run_timestamp_seconds": ("gauge", "When the newest run in the history was analyzed (Unix time)."),
    "postmortem_host_suspect_score": (
        "gauge", "A host's fault rate as a culprit's host: (faulty runs + 1) / (runs + 2), over the --since window."),
}


def _label_value(value) -> str:
    """The exposition format's escaping: backslash, double quote and newline."""
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Every digit: a Unix time in seconds (1796150000.123) must not print as 1.79615e+09."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _sample(name: str, labels: dict, value: float) -> str:
    inner = ",".join(f'{key}="{_label_value(v)}"' for key, v in labels.items())
    return f"{name}{{{inner}}} {_number(value)}" if inner else f"{name} {_number(value)}"


def findings_by_host(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """(signature, severity, host, job, count): a finding naming ranks on two hosts counts on each;
    one naming no rank, or a rank whose host the logs never said, has host ""."""
    return con.execute("""
        SELECT signature, severity, coalesce(host, '') AS host, coalesce(job_id, '') AS job,
               count(DISTINCT run_id || '/' || signature || '/' || role) AS n
        FROM (SELECT DISTINCT f.run_id, f.job_id, f.signature, f.role, f.severity, h.host
              FROM v_findings f LEFT JOIN v_rank_hosts h ON h.run_id = f.run_id AND h.rank = f.culprit_rank)
        GROUP BY ALL ORDER BY ALL""").fetchall()


def render(con: duckdb.DuckDBPyConnection, since: str | None = "7d") -> str:
    """The metrics text (ends with a newline, as the format requires)."""
    runs, last = con.execute("SELECT count(*), epoch(max(analyzed_at)) FROM runs").fetchone()
    samples = {
        "postmortem_findings_total": [
            _sample("postmortem_findings_total", {"signature": s, "severity": sev, "host": h, "job": j}, n)
            for s, sev, h, j, n in findings_by_host(con)],
        "postmortem_runs_total": [_sample("postmortem_runs_total", {}, runs)],
        "postmortem_last_run_timestamp_seconds": (
            [_sample("postmortem_last_run_timestamp_seconds", {}, last)] if last is not None else []),
        "postmortem_host_suspect_score": [
            _sample("postmortem_host_suspect_score", {"host": row["host"]}, row["fault_rate"])
            for row in history.hosts(con, history.parse_since(since))],
    }
    lines = []
    for name, (kind, help_text) in METRICS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(lines) + "\n"


def write(con: duckdb.DuckDBPyConnection, path: Path, since: str | None = "7d") -> int:
    """Write the metrics file atomically; the number of samples written."""
    text = render(con, since)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def export(path: str | Path, db: str | Path | None = None, since: str | None = "7d") -> int:
    """Write the history at ``db`` (default: the user's) as a metrics file at ``path``; samples written."""
    from . import store

    con = store.open_history(Path(db) if db else store.default_db_path())
    try:
        return write(con, Path(path), since)
    finally:
        con.close()

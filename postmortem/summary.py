"""Run-level facts and the report dict, computed from a run's tables.

Everything here reads tables (SQL over a connection holding the run), so a report built
right after ingest and one rebuilt later from history (`postmortem show`) are the same.
"""

from __future__ import annotations

import json
import re
import signal as signals
from collections import Counter
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import polars as pl

from . import __version__
from .schema import frame

if TYPE_CHECKING:  # (DuckDB is imported where it is used: store's docstring says why)
    import duckdb

REPORT_SCHEMA = "postmortem.report/1"


def files_frame(rows: list[dict]) -> pl.DataFrame:
    return frame("files", rows)


def runs_frame(run: dict) -> pl.DataFrame:
    return frame("runs", [run])


def findings_frame(rows: list[dict]) -> pl.DataFrame:
    return frame("findings", rows)


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def attribute_ranks_by_pid(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Give rank-less rows the rank of their pid, where exactly one rank is known for it.

    torchrun's agent names workers by pid ("Sending process 3641 closing signal SIGTERM"),
    and NCCL headers carry pids: the failure table and the ranks' own files tie pids to ranks.
    """
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE pid_rank AS
        SELECT pid, any_value(rank) AS rank FROM (
            SELECT pid, rank FROM failures WHERE run_id = $1
            UNION ALL SELECT pid, rank FROM events WHERE run_id = $1 AND kind NOT IN ('agent_signal', 'agent_failure')
            UNION ALL SELECT pid, rank FROM stacks WHERE run_id = $1
        ) WHERE pid IS NOT NULL AND rank IS NOT NULL
        GROUP BY pid HAVING count(DISTINCT rank) = 1
        """,
        [run_id],
    )
    for table in ("events", "failures", "stacks"):
        con.execute(
            f"UPDATE {table} SET rank = p.rank FROM pid_rank p "
            f"WHERE {table}.run_id = $1 AND {table}.rank IS NULL AND {table}.pid = p.pid",
            [run_id],
        )


_SIGNAL_CODES = {-s.value for s in signals.Signals}


def ranks_from_local_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Record the workers a launcher's line names only by local rank as torchrun failures.

    "failed (exitcode: -9) local_rank: 3 (pid: 812917)" without torchrun's failure table, and
    no record of that pid elsewhere (a pasted excerpt), or DeepSpeed's and torch.distributed.launch's
    "--local_rank=0 ... exits with return code = -9": on one node the local rank is the rank.
    A run whose records name more than one host, or that has torchrun's table, is left alone.
    """
    hosts, table = con.execute(
        "SELECT count(DISTINCT host), count(*) FILTER (source = 'torchrun') FROM failures WHERE run_id = ?",
        [run_id]).fetchone()
    if hosts > 1 or table:
        return
    rows = con.execute(
        """
        SELECT DISTINCT ON (local_rank) local_rank, ts, exit_code, pid, message, file, line_no FROM (
            SELECT TRY_CAST(attrs->>'local_rank' AS INTEGER) AS local_rank, ts,
                   TRY_CAST(attrs->>'exit_code' AS INTEGER) AS exit_code,
                   TRY_CAST(attrs->>'target_pid' AS INTEGER) AS pid, message, file, line_no
            FROM events WHERE run_id = ? AND kind = 'agent_failure' AND rank IS NULL)
        WHERE local_rank IS NOT NULL ORDER BY local_rank, ts NULLS LAST, file, line_no
        """, [run_id]).fetchall()
    for local_rank, ts, exit_code, pid, message, file, line_no in rows:
        sig = signals.Signals(-exit_code).name if exit_code in _SIGNAL_CODES else None
        con.execute("INSERT INTO failures VALUES (?, ?, ?, ?, ?, NULL, ?, ?, NULL, 'torchrun', ?, ?)",
                    [run_id, local_rank, ts, exit_code, sig, message, pid, file, line_no])
        con.execute("UPDATE events SET rank = ? WHERE run_id = ? AND kind = 'agent_failure' AND file = ? "
                    "AND line_no = ?", [local_rank, run_id, file, line_no])


def refine_untimed(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Move untimed records (tracebacks, aborts) to the latest time their rank was seen alive.

    A traceback in stderr.log inherits the time of stderr's previous line, which can be
    long before the rank's last step logged in stdout.log. The rank's latest timed record
    in any file, up to the next timestamp after the block in its own file, is closer.
    """
    con.execute(
        """
        UPDATE events SET ts = b.best FROM (
            SELECT e.file, e.line_no, e.rank, max(x.ts) AS best
            FROM events e JOIN events x ON x.run_id = e.run_id AND x.rank = e.rank
            WHERE e.run_id = $1 AND e.attrs->>'ts_from' IS NOT NULL AND x.ts IS NOT NULL
              AND x.attrs->>'ts_from' IS NULL
              AND x.kind NOT IN ('agent_signal', 'agent_failure', 'torchrun_failure')
              AND (e.attrs->>'ts_before' IS NULL OR x.ts < CAST(e.attrs->>'ts_before' AS TIMESTAMP))
            GROUP BY ALL
        ) b
        WHERE events.run_id = $1 AND events.file = b.file AND events.line_no = b.line_no
          AND events.rank = b.rank AND events.attrs->>'ts_from' IS NOT NULL
          AND (events.ts IS NULL OR b.best > events.ts)
        """,
        [run_id],
    )
    con.execute(
        """
        UPDATE failures SET ts = e.ts FROM events e
        WHERE failures.run_id = $1 AND e.run_id = $1 AND failures.file = e.file AND failures.line_no = e.line_no
          AND e.kind IN ('exception', 'terminate', 'fatal') AND failures.source <> 'torchrun'
        """,
        [run_id],
    )


def _versions(con, run_id) -> dict[str, str]:
    rows = con.execute(
        "SELECT attrs->>'component', attrs->>'version' FROM events WHERE run_id = ? AND kind = 'version'", [run_id]
    ).fetchall()
    found: dict[str, Counter] = {}
    for component, version in rows:
        found.setdefault(component, Counter())[version] += 1
    return {c: counts.most_common(1)[0][0] for c, counts in found.items()}


def _job_id_from_layout(con, run_id) -> str | None:
    """torchrun's --log-dir holds `<rdzv run id>_<random>/attempt_N/`: the run id names the job."""
    rows = con.execute(
        r"SELECT regexp_extract(path, '(?:^|/)([^/]+)_[a-z0-9_]{8}/attempt_\d+/', 1) AS id FROM files "
        r"WHERE run_id = ? AND regexp_matches(path, '(?:^|/)[^/]+_[a-z0-9_]{8}/attempt_\d+/') LIMIT 1",
        [run_id]).fetchall()
    job = rows[0][0] if rows else None
    return None if job in (None, "", "none") else job


def _command(con, run_id) -> str | None:
    rows = con.execute(
        "SELECT attrs->>'command' FROM events WHERE run_id = ? AND kind = 'process' AND rank IS NOT NULL "
        "ORDER BY rank LIMIT 1", [run_id]).fetchall()
    return rows[0][0] if rows else None


def run_facts(con: duckdb.DuckDBPyConnection, run_id: str, found, labels: dict[str, str] | None = None) -> dict:
    ranks = [r[0] for r in con.execute(
        """
        SELECT DISTINCT rank FROM (
            SELECT rank FROM files WHERE run_id = $1 UNION ALL SELECT rank FROM events WHERE run_id = $1
            UNION ALL SELECT rank FROM failures WHERE run_id = $1
            -- a watchdog line's "[Rank 3]" names its rank where no prefix does
            UNION ALL SELECT rank FROM collectives WHERE run_id = $1
            UNION ALL SELECT rank FROM rank_status WHERE run_id = $1
        ) WHERE rank IS NOT NULL ORDER BY rank
        """, [run_id]).fetchall()]
    sizes = con.execute(
        """
        SELECT max(TRY_CAST(attrs->>'size' AS INTEGER)) FILTER (kind = 'pg_init'),
               max(TRY_CAST(attrs->>'nranks' AS INTEGER)) FILTER (kind = 'nccl_init')
        FROM events WHERE run_id = ?
        """, [run_id]).fetchall()[0]
    world = max([s for s in sizes if s] + [max(ranks) + 1 if ranks else 0]) or None
    # NCCL's headers name the host as the worker saw it; torchrun's table only as the agent
    # resolved it ("localhost"), so it counts only when NCCL said nothing.
    hosts = sorted({h for (h,) in con.execute(
        "SELECT attrs->>'host' FROM events WHERE run_id = ? AND kind LIKE 'nccl%' AND attrs->>'host' IS NOT NULL",
        [run_id]).fetchall()}
        or {h for (h,) in con.execute(
            "SELECT host FROM failures WHERE run_id = ? AND host IS NOT NULL", [run_id]).fetchall()})
    span = con.execute("SELECT min(ts), max(ts) FROM events WHERE run_id = ?", [run_id]).fetchall()[0]
    versions = _versions(con, run_id)
    labels = labels or {}
    return {
        "run_id": run_id,
        "source_dir": str(found.root),
        "analyzed_at": datetime.now(timezone.utc).replace(tzinfo=None),
        "job_id": labels.get("job_id") or labels.get("torchelastic_run_id") or _job_id_from_layout(con, run_id),
        "world_size": world,
        "ranks_seen": ranks,
        "hosts": hosts,
        "torch_version": versions.get("torch"),
        "nccl_version": versions.get("nccl"),
        "cuda_version": versions.get("cuda"),
        "python_version": versions.get("python"),
        "started_at": span[0],
        "ended_at": span[1],
        "verdict": None,
        "exit_status": 0,
        "fingerprint": found.fingerprint,
        "user": labels.get("user"),
        "command": _command(con, run_id),
        "labels": json.dumps(labels, sort_keys=True),
    }


def _iso(ts) -> str | None:
    return ts.isoformat(sep=" ") if ts is not None else None


def rank_endings(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """How and when each rank ended, first to end first.

    The time is the rank's own: its fatal error, the agent's signal to it, or its last
    sign of life for a rank killed without a word (SIGKILL). torchrun's "first observed
    failure" is when the agent noticed, which can name the wrong rank first.
    """
    ranks = [r[0] for r in con.execute("SELECT unnest(ranks_seen) FROM runs WHERE run_id = ?", [run_id]).fetchall()]
    table = {r["rank"]: r for r in _rows(con, "SELECT * FROM failures WHERE run_id = ? AND source = 'torchrun'",
                                         [run_id])}
    own = _rows(con, """
        SELECT f.rank, f.ts, f.source, f.exception_type, f.signal, f.message, f.file, f.line_no,
               e.attrs->>'ts_from' IS NOT NULL AS ts_inferred, CAST(e.attrs->>'ts_before' AS TIMESTAMP) AS ts_before
        FROM failures f LEFT JOIN events e ON e.run_id = f.run_id AND e.file = f.file AND e.line_no = f.line_no
             AND e.kind IN ('exception', 'terminate', 'fatal')
        WHERE f.run_id = ? AND f.source <> 'torchrun' AND f.rank IS NOT NULL
        ORDER BY f.ts NULLS LAST, f.line_no""", [run_id])
    agent = _rows(con, """
        SELECT rank, ts, attrs->>'signal' AS signal, file, line_no, message FROM events
        WHERE run_id = ? AND kind = 'agent_signal' AND rank IS NOT NULL ORDER BY ts""", [run_id])
    # Ties in time (two files, one millisecond) are broken by file and line, so the answer
    # does not depend on the order files were parsed in.
    last = _rows(con, """
        SELECT rank, ts, file, line_no, message FROM events
        WHERE run_id = ? AND rank IS NOT NULL AND ts IS NOT NULL
          AND kind NOT IN ('torchrun_failure', 'agent_signal', 'agent_failure')
        QUALIFY row_number() OVER (PARTITION BY rank ORDER BY ts DESC, file DESC, line_no DESC) = 1""", [run_id])
    first_error = _rows(con, """
        SELECT rank, ts, file, line_no, message FROM events
        WHERE run_id = ? AND rank IS NOT NULL AND level IN ('E', 'F') AND ts IS NOT NULL
          AND kind NOT IN ('torchrun_failure', 'agent_signal', 'agent_failure')
        QUALIFY row_number() OVER (PARTITION BY rank ORDER BY ts, file, line_no) = 1""", [run_id])
    first_timeout = con.execute("SELECT min(ts) FROM events WHERE run_id = ? AND kind = 'watchdog_timeout'",
                                [run_id]).fetchone()[0]
    last_by_rank = {r["rank"]: r for r in last}
    error_by_rank = {r["rank"]: r for r in first_error}
    first_observed = {r["rank"] for r in _rows(con, """
        SELECT rank FROM events WHERE run_id = ? AND kind = 'torchrun_failure'
          AND CAST(attrs->>'first_observed' AS BOOLEAN)""", [run_id])}
    # Ranks whose exit in torchrun's table is a plain error code: they ended by their own failure.
    exited_with_error = {r for r, row in table.items() if (row["exit_code"] or 0) > 0 and not row["signal"]}
    endings = []
    for rank in ranks:
        inferred, upper, victim = False, None, False
        exit_row = table.get(rank)
        mine = [f for f in own if f["rank"] == rank]
        signalled = next((a for a in agent if a["rank"] == rank), None)
        fatal = next((f for f in mine if f["source"] in ("terminate", "faulthandler")), None)
        exc = mine[-1] if mine else None
        signal = exit_row["signal"] if exit_row else (fatal["signal"] if fatal else None)
        exit_code = exit_row["exit_code"] if exit_row else None
        own_end = fatal or exc
        if own_end:
            cause = own_end["message"]
            if own_end["exception_type"]:
                cause = f"{own_end['exception_type']}: {cause}"
            if signalled:
                how = f"{cause} (then {signalled['signal']} from torchrun while exiting)"
            elif signal:
                how = f"{signal} after {cause}"
            elif exit_code is not None:
                how = f"exit {exit_code} after {cause}"
            else:
                how = cause
            when, evidence = own_end["ts"], own_end
            inferred, upper = bool(own_end["ts_inferred"]), own_end["ts_before"]
            victim = bool(PEER_CAUSED.search(cause or ""))
        elif signalled:
            how = f"{signalled['signal']} from torchrun (torn down after another rank failed)"
            when, evidence, signal = signalled["ts"], signalled, signal or signalled["signal"]
            victim = True  # the agent tears a rank down because another one ended
        elif signal == "SIGABRT" and first_timeout is not None and (exit_row["ts"] is None
                                                                    or first_timeout <= exit_row["ts"]):
            # ProcessGroupNCCL aborts its process once a collective timed out (async error handling)
            how = NCCL_ABORT
            when, evidence, victim = exit_row["ts"], exit_row, True
        elif signal == "SIGTERM" and exited_with_error - {rank}:
            # torchrun's agent SIGTERMs the surviving workers once one of them exits with an error;
            # the table is all that is left of it when its "closing signal" line is not in the logs.
            how = "SIGTERM from torchrun (torn down after another rank failed)"
            when, evidence, victim = exit_row["ts"], exit_row, True
        elif signal:
            alive = last_by_rank.get(rank)
            how = f"{signal} with no message (killed from outside; last sign of life shown)"
            when, evidence = (alive["ts"] if alive else exit_row["ts"]), (alive or exit_row)
        elif exit_code is not None:
            how, when, evidence = f"exit {exit_code}", exit_row["ts"], exit_row
        else:
            alive = last_by_rank.get(rank)
            how, when, evidence = "no failure recorded", (alive["ts"] if alive else None), alive
        endings.append({
            "rank": rank,
            "ended": how,
            "ts": _iso(when),
            "ts_inferred": inferred,
            "_upper": upper,
            "consequence": victim,
            "exit_code": exit_code,
            "signal": signal,
            "pid": exit_row["pid"] if exit_row else None,
            "host": exit_row["host"] if exit_row else None,
            "torchrun_first_observed": rank in first_observed if table else None,
            "evidence": _evidence(evidence),
            "first_error": _evidence(error_by_rank.get(rank)),
            "last_event": _evidence(last_by_rank.get(rank)),
        })
    return _in_time_order(endings)


# How a rank ended that ProcessGroupNCCL aborted after a collective of its timed out: it was in
# that collective, a consequence of whatever held it up.
NCCL_ABORT = "SIGABRT after the collective timeout (ProcessGroupNCCL's abort)"

# An error that says a peer went away or never answered is a consequence of another
# rank's end, not a cause. gloo words its collective timeout two ways: "Timed out waiting
# 30000ms for recv operation to complete", or, when the timeout closes the pair first,
# "Application timeout caused pair closure" (both seen 30 s into a hang in sample_logs/).
PEER_CAUSED = re.compile(
    r"(?i)connection (?:reset|closed) by peer|timed out waiting|Application timeout caused pair closure"
    r"|Watchdog caught collective operation timeout"
    r"|communicator was aborted|Broken pipe|remote (?:worker|process|peer)|Connection refused|DistNetworkError"
    r"|retrieving ncclUniqueId from \[\d+\] via c10d key-value store"
)


def _in_time_order(endings: list[dict]) -> list[dict]:
    """Ranks that failed, first to end first; then the rest.

    An untimed error (a traceback) is only known to have happened after the rank's last
    timestamp and before the next one. When such an error blames a peer, and a peer's end
    falls inside that window, the peer ended first: a consequence cannot precede its cause.
    """
    failed = [e for e in endings if e["ended"] != "no failure recorded" and e["ts"]]
    primary = [e for e in failed if not e["consequence"]]
    for e in failed:
        key = e["ts"]
        if e["consequence"] and e["ts_inferred"]:
            causes = [p["ts"] for p in primary if p["rank"] != e["rank"]
                      and (e["_upper"] is None or p["ts"] <= _iso(e["_upper"]))]
            if causes:
                key = max(key, min(causes))
        e["_key"] = (key, e["consequence"])
    # Untimed ends (one console, no timestamps) keep their order, but one that blames a peer
    # comes after those that do not: a consequence cannot precede its cause.
    untimed = sorted((e for e in endings if e not in failed),
                     key=lambda e: (e["ended"] == "no failure recorded", e["consequence"]))
    ordered = sorted(failed, key=lambda e: e["_key"]) + untimed
    for e in ordered:
        for private in ("_key", "_upper"):
            e.pop(private, None)
    return ordered


def _evidence(row: dict | None) -> dict | None:
    if not row:
        return None
    text = row.get("message")
    return {"rank": row.get("rank"), "file": row.get("file"), "line": row.get("line_no"), "ts": _iso(row.get("ts")),
            "text": text[:500] if text else text}


def _findings(con, run_id) -> list[dict]:
    rows = _rows(con, """
        SELECT * EXCLUDE (run_id) FROM findings
        WHERE run_id = ?
        ORDER BY CASE role WHEN 'root_cause' THEN 0 WHEN 'symptom' THEN 1 ELSE 2 END,
                 list_position(['critical', 'error', 'warning', 'info'], severity), confidence DESC, signature
        """, [run_id])
    for r in rows:
        r["evidence"] = json.loads(r["evidence"]) if r["evidence"] else []
        r.setdefault("user_line", None)  # a history of schema 1, opened read-only, has no such column
        r.setdefault("evidence_kind", None)  # nor one of schema 2 this
    return rows


# What to collect next when the logs cannot settle a verdict, by what the run lacks.
_COLLECT_BY_KIND = {
    "text_log": "each rank's own log: `torchrun --log-dir DIR --redirects 3 --tee 3` (or the launcher's per-rank "
                "output), whole, not an excerpt",
    "pyspy": "a stack of every rank while it is stuck: `py-spy dump --pid PID` for each rank's process, or run "
             "the job under `postmortem watch`",
    "flight_recorder": "the flight recorder: TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=DIR/nccl_trace_rank_",
}


def _cannot_tell(verdict: dict, kinds: set[str], ranked: bool) -> dict:
    """Whether the verdict is too weakly supported to act on (its fitted confidence under
    calibration.CANNOT_TELL: the report then says "cannot tell", not a guess), and what to
    collect next: the weak verdict's signature's own list and the evidence sources the run
    lacks; with no verdict, those sources when no rank is known (an excerpt)."""
    from . import calibration, catalog

    weak = verdict["confidence"] is not None and verdict["confidence"] < calibration.CANNOT_TELL
    collect: list[str] = []
    if weak:
        sig = next((s for s in catalog.load_all()[0] if s.id == verdict["signature"]), None)
        collect = list(sig.collect) if sig else []
    # no verdict from logs that name no rank (an excerpt, one unattributed stdout): say what would tell
    if weak or (not verdict["signature"] and not ranked):
        lacking = {k for k in _COLLECT_BY_KIND if k not in kinds} | ({"text_log"} if not ranked else set())
        collect += [what for kind, what in _COLLECT_BY_KIND.items() if kind in lacking and what not in collect]
    if weak:
        verdict = {**verdict, "summary": f"cannot tell: perhaps {verdict['summary']}"}
    return {"summary": verdict["summary"], "cannot_tell": weak, "collect": collect}


def report(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """The report of DESIGN.md's JSON contract (plus run facts and per-rank endings)."""
    run = _rows(con, "SELECT * FROM runs WHERE run_id = ?", [run_id])[0]
    files = _rows(con, "SELECT path, kind, rank, bytes, status, error FROM files WHERE run_id = ? ORDER BY path",
                  [run_id])
    endings = rank_endings(con, run_id)
    findings = _findings(con, run_id)
    root = next((f for f in findings if f["role"] == "root_cause"), None) or next(
        (f for f in findings if f["role"] == "symptom" and f["severity"] in ("error", "critical")), None)
    first = next((e for e in endings if e["ended"] != "no failure recorded"), None)
    if root:
        verdict = {"signature": root["signature"], "summary": root["summary"], "culprit_ranks": root["ranks"],
                   "confidence": root["confidence"], "user_line": root["user_line"],
                   "evidence_kind": root["evidence_kind"]}
    else:
        verdict = {"signature": None,
                   "summary": (f"rank {first['rank']} ended first: {first['ended']}" if first
                               else "no failure found in the logs"),
                   "culprit_ranks": [], "confidence": None, "user_line": None, "evidence_kind": None}
    verdict.update(_cannot_tell(verdict, {f["kind"] for f in files if f["status"] == "parsed"},
                                bool(run["ranks_seen"])))
    return {
        "schema": REPORT_SCHEMA,
        "postmortem_version": __version__,
        "run_id": run_id,
        "source_dir": run["source_dir"],
        "job": {"id": run["job_id"], "user": run["user"], "command": run["command"],
                "labels": json.loads(run["labels"]) if run["labels"] else {}},
        "world_size": run["world_size"],
        "ranks_seen": run["ranks_seen"] or [],
        "hosts": run["hosts"] or [],
        "versions": {k: run[f"{k}_version"] for k in ("torch", "nccl", "cuda", "python")},
        "started_at": _iso(run["started_at"]),
        "ended_at": _iso(run["ended_at"]),
        "verdict": verdict,
        "ranks": endings,
        "findings": findings,
        "files": {
            "parsed": sum(1 for f in files if f["status"] == "parsed"),
            "skipped": sum(1 for f in files if f["status"] == "skipped"),
            "errors": [{"path": f["path"], "kind": f["kind"], "status": f["status"], "error": f["error"]}
                       for f in files if f["error"]],
        },
    }


def series(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """What the HTML report draws: the tail of each rank's collectives, memory per step,
    recompiles per frame, step time per rank."""
    collectives = _rows(con, """
        WITH ranked AS (
            SELECT rank, pg, seq_id, op, state, source,
                   row_number() OVER (PARTITION BY rank, pg, seq_id ORDER BY
                       list_position(['flight_recorder', 'watchdog', 'nccl_log', 'detail', 'profiler'], source)) AS pick
            FROM collectives WHERE run_id = ? AND rank IS NOT NULL AND seq_id IS NOT NULL
        ),
        tail AS (
            SELECT *, dense_rank() OVER (PARTITION BY pg ORDER BY seq_id DESC) AS from_end FROM ranked WHERE pick = 1
        )
        SELECT rank, pg, seq_id, op, state, source FROM tail WHERE from_end <= 16 ORDER BY pg, seq_id, rank
        """, [run_id])
    memory = _rows(con, """
        SELECT rank, step, round(max(allocated) / 2^20, 1) AS allocated_mb FROM memory
        WHERE run_id = ? AND rank IS NOT NULL AND step IS NOT NULL AND allocated IS NOT NULL
          AND source IN ('log', 'profiler')
        GROUP BY rank, step ORDER BY rank, step""", [run_id])
    recompiles = _rows(con, """
        SELECT coalesce(function, '?') AS function, coalesce(code_file, '?') || ':' || coalesce(code_line, 0) AS "where",
               count(*) AS recompiles
        FROM compiles WHERE run_id = ? AND event = 'recompile' GROUP BY ALL ORDER BY recompiles DESC LIMIT 30""",
        [run_id])
    step_time = _rows(con, """
        SELECT rank, avg(dur) / 1000.0 AS step_ms FROM kernels
        WHERE run_id = ? AND category IN ('step', 'step_cpu') AND rank IS NOT NULL GROUP BY rank ORDER BY rank""",
        [run_id])
    from . import timeline  # the per-rank timeline and the collectives grid of the HTML report

    return {"collectives": collectives, "memory": memory, "recompiles": recompiles, "step_time": step_time,
            **timeline.series(con, run_id)}

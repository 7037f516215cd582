"""What the HTML report's per-rank timeline and collectives grid draw, read from a run's tables.

Reads ``compiles``, ``collectives``, ``events``, ``memory``, ``kernels`` and ``failures`` of one
run (every query is vectorized SQL; nothing here loops over log lines) and returns plain rows for
``report["series"]``, which ``html.py`` renders without touching the database. A rank's marks
carry the evidence line they come from, e.g. a compile mark from the dynamo record

    V1129 15:56:52.388000 1840 torch/_dynamo/guards.py:2997] [0/1] [__recompiles] Recompiling function forward

becomes ``{"rank": 0, "ts_us": ..., "kind": "recompile", "label": "recompile forward [0/1]", ...}``.

Folding: ranks that behaved alike share a ``fold_key`` built from counts and sequence numbers,
never from times or message words (a rank's last sequence number per process group, how many
collectives it recorded, its compile events by kind, its warning and error kinds, its last step,
how it ended), so 509 healthy copies of a rank fold into one lane while the rank that stopped
one collective early keeps its own.
"""

from __future__ import annotations

import duckdb

MARKS_PER_KIND = 40  # per rank and kind: enough to read the last minute, bounded at 512 ranks
GRID_HALF_WINDOW = 8  # sequence numbers shown either side of the first divergence

# The collective record a cell shows when several sources saw it: the richest first.
SOURCE_ORDER = "['flight_recorder', 'watchdog', 'nccl_log', 'detail', 'profiler']"


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def marks(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """Each rank's timed marks: compiles, collectives, step starts, memory samples, warnings and errors,
    the latest MARKS_PER_KIND of each kind per rank."""
    return _rows(con, f"""
        WITH all_marks AS (
            SELECT rank, epoch_us(ts) AS ts_us, event AS kind,
                   event || ' ' || coalesce(function, '?') || ' [' || coalesce(attempt, '?') || ']' AS label,
                   coalesce(reason, '') AS detail, file, line_no, NULL::DOUBLE AS value, NULL AS pg
            FROM compiles WHERE run_id = ? AND ts IS NOT NULL AND rank IS NOT NULL
            UNION ALL
            SELECT rank, epoch_us(coalesce(t_started, t_created)), 'collective',
                   op || ' seq ' || seq_id || ' (pg ' || coalesce(pg, '?') || ')',
                   coalesce(state, '') || ' · ' || source, file, line_no, seq_id, coalesce(pg, '')
            FROM collectives WHERE run_id = ? AND rank IS NOT NULL AND coalesce(t_started, t_created) IS NOT NULL
            UNION ALL
            SELECT rank, epoch_us(min(ts)), 'step', 'step ' || step, '', any_value(file), min(line_no), step, NULL
            FROM memory WHERE run_id = ? AND rank IS NOT NULL AND step IS NOT NULL AND ts IS NOT NULL
            GROUP BY rank, step
            UNION ALL
            SELECT rank, epoch_us(ts), 'memory', 'allocated ' || round(allocated / 2^20, 1) || ' MiB'
                   || coalesce(' at step ' || step, ''), coalesce(source, ''), file, line_no, allocated, NULL
            FROM memory WHERE run_id = ? AND rank IS NOT NULL AND ts IS NOT NULL AND allocated IS NOT NULL
            UNION ALL
            SELECT rank, epoch_us(ts), CASE WHEN level IN ('E', 'F', 'C') OR kind IN ('exception', 'fatal')
                                            THEN 'error' ELSE 'warning' END,
                   kind, left(message, 300), file, line_no, NULL, NULL
            FROM events WHERE run_id = ? AND rank IS NOT NULL AND ts IS NOT NULL
              AND (level IN ('W', 'E', 'F', 'C') OR kind IN ('exception', 'fatal', 'gloo_timeout', 'nccl_error'))
        ),
        latest AS (
            SELECT *, row_number() OVER (PARTITION BY rank, kind ORDER BY ts_us DESC) AS from_end FROM all_marks
        )
        SELECT rank, ts_us, kind, label, detail, file, line_no, value, pg FROM latest
        WHERE from_end <= {MARKS_PER_KIND} ORDER BY rank, ts_us
        """, [run_id] * 5)


def spans(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """Per rank and process group: when its collectives ran (first to last record) and where it stopped."""
    return _rows(con, """
        SELECT rank, coalesce(pg, '') AS pg,
               epoch_us(min(coalesce(t_started, t_created))) AS first_us,
               epoch_us(max(coalesce(t_started, t_created))) AS last_us,
               max(seq_id) AS last_seq, arg_max(op, seq_id) AS last_op, arg_max(state, seq_id) AS last_state,
               count(DISTINCT seq_id) AS collectives
        FROM collectives WHERE run_id = ? AND rank IS NOT NULL AND seq_id IS NOT NULL
        GROUP BY ALL ORDER BY rank, pg""", [run_id])


def fold_keys(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """One row per rank: its fold key (what it did, in counts and sequence numbers)."""
    return _rows(con, """
        WITH ranks AS (
            SELECT rank FROM compiles WHERE run_id = $1 UNION SELECT rank FROM collectives WHERE run_id = $1
            UNION SELECT rank FROM events WHERE run_id = $1 UNION SELECT rank FROM memory WHERE run_id = $1
            UNION SELECT rank FROM failures WHERE run_id = $1
        ),
        coll AS (
            SELECT rank, string_agg(pg || ':' || last_seq || '/' || n, ',' ORDER BY pg) AS k FROM (
                SELECT rank, coalesce(pg, '') AS pg, max(seq_id) AS last_seq, count(DISTINCT seq_id) AS n
                FROM collectives WHERE run_id = $1 GROUP BY ALL) GROUP BY rank
        ),
        comp AS (
            SELECT rank, string_agg(event || ':' || n, ',' ORDER BY event) AS k FROM (
                SELECT rank, event, count(*) AS n FROM compiles WHERE run_id = $1 GROUP BY ALL) GROUP BY rank
        ),
        bad AS (
            SELECT rank, string_agg(kind || ':' || n, ',' ORDER BY kind) AS k FROM (
                SELECT rank, kind, count(*) AS n FROM events
                WHERE run_id = $1 AND (level IN ('W', 'E', 'F', 'C') OR kind IN ('exception', 'fatal'))
                GROUP BY ALL) GROUP BY rank
        ),
        steps AS (SELECT rank, max(step) AS k FROM memory WHERE run_id = $1 GROUP BY rank),
        ends AS (
            SELECT rank, string_agg(DISTINCT concat_ws('/', exit_code, signal, exception_type), ','
                              ORDER BY concat_ws('/', exit_code, signal, exception_type)) AS k
            FROM failures WHERE run_id = $1 GROUP BY rank
        )
        SELECT rank, concat_ws(' | ', 'c=' || coalesce(coll.k, ''), 'd=' || coalesce(comp.k, ''),
                               'e=' || coalesce(bad.k, ''), 's=' || coalesce(steps.k::VARCHAR, ''),
                               'x=' || coalesce(ends.k, '')) AS fold_key
        FROM ranks LEFT JOIN coll USING (rank) LEFT JOIN comp USING (rank) LEFT JOIN bad USING (rank)
        LEFT JOIN steps USING (rank) LEFT JOIN ends USING (rank)
        WHERE rank IS NOT NULL ORDER BY rank""", [run_id])


def group_names(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, str]:
    """Process group id -> its description where a dump gave one ('0' -> 'default_pg')."""
    rows = con.execute("""
        SELECT DISTINCT json_extract_string(attrs, '$.pg') AS pg, json_extract_string(attrs, '$.desc') AS "desc"
        FROM events WHERE run_id = ? AND kind = 'pg_config'""", [run_id]).fetchall()
    return {pg: desc for pg, desc in rows if pg is not None and desc}


def grid(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """Each rank's collectives in the window around the first divergence of each process group: the
    first sequence number some rank of the group never reached, or where the ranks that reached it
    disagree on op or size. Only the groups that diverge are shown; when none does, each group's last
    2 * GRID_HALF_WINDOW sequences."""
    return _rows(con, f"""
        WITH picked AS (
            SELECT rank, coalesce(pg, '') AS pg, seq_id, op, state, source, numel_in, dtypes,
                   row_number() OVER (PARTITION BY rank, pg, seq_id ORDER BY
                       list_position({SOURCE_ORDER}, source)) AS pick
            FROM collectives WHERE run_id = ? AND rank IS NOT NULL AND seq_id IS NOT NULL
        ),
        one AS (SELECT * EXCLUDE (pick) FROM picked WHERE pick = 1),
        reach AS (SELECT pg, rank, max(seq_id) AS last_seq FROM one GROUP BY ALL),
        bounds AS (SELECT pg, min(last_seq) AS lowest_last, max(last_seq) AS highest FROM reach GROUP BY pg),
        disagree AS (
            SELECT pg, min(seq_id) AS seq FROM (
                SELECT pg, seq_id FROM one GROUP BY ALL
                HAVING count(DISTINCT op) > 1 OR count(DISTINCT numel_in) > 1 OR count(DISTINCT dtypes) > 1)
            GROUP BY pg
        ),
        divergence AS (
            SELECT b.pg, b.highest,
                   least(d.seq, CASE WHEN b.lowest_last < b.highest THEN b.lowest_last + 1 END) AS first_divergent
            FROM bounds b LEFT JOIN disagree d USING (pg)
        )
        SELECT o.rank, o.pg, o.seq_id, o.op, o.state, o.source, o.numel_in, o.dtypes, v.first_divergent
        FROM one o JOIN divergence v USING (pg)
        WHERE (v.first_divergent IS NOT NULL OR NOT EXISTS (SELECT 1 FROM divergence WHERE first_divergent IS NOT NULL))
          AND CASE WHEN v.first_divergent IS NULL THEN o.seq_id > v.highest - {2 * GRID_HALF_WINDOW}
                   ELSE o.seq_id BETWEEN v.first_divergent - {GRID_HALF_WINDOW}
                                     AND v.first_divergent + {GRID_HALF_WINDOW} END
        ORDER BY o.pg, o.seq_id, o.rank""", [run_id])


def recompiles_per_frame(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """Recompiles of each frame on the rank that recompiled it most: a compile id seen in both TORCH_LOGS
    ([0/3]) and TORCH_TRACE ([0/3_1], its restart count appended) is one recompile, not two."""
    return _rows(con, r"""
        WITH per_rank AS (
            SELECT coalesce(function, '?') AS function, coalesce(code_file, '?') || ':' || coalesce(code_line, 0) AS "where",
                   rank, count(DISTINCT coalesce(regexp_replace(attempt, '_\d+$', ''), file || ':' || line_no)) AS recompiles
            FROM compiles WHERE run_id = ? AND event = 'recompile' GROUP BY ALL
        )
        SELECT function, "where", max(recompiles) AS recompiles, list(rank ORDER BY rank) AS ranks
        FROM per_rank GROUP BY ALL ORDER BY recompiles DESC, function LIMIT 30""", [run_id])


def memory_limit_bytes(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The device's capacity where a CUDA OOM message stated it ('GPU 0 has a total capacity of 79.19 GiB')."""
    row = con.execute("""
        SELECT max(TRY_CAST(json_extract_string(attrs, '$.capacity') AS BIGINT)) FROM events
        WHERE run_id = ? AND json_extract_string(attrs, '$.capacity') IS NOT NULL""", [run_id]).fetchone()
    return int(row[0]) if row and row[0] else None


def series(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """Everything the timeline and the collectives grid draw, as plain rows."""
    return {"marks": marks(con, run_id), "spans": spans(con, run_id), "fold_keys": fold_keys(con, run_id),
            "group_names": group_names(con, run_id), "grid": grid(con, run_id),
            "recompiles_per_frame": recompiles_per_frame(con, run_id),
            "memory_limit_bytes": memory_limit_bytes(con, run_id)}


"""The tables of a run, declared once.

Every other module derives what it needs from ``TABLES``: the store its DDL, parsers the
Polars schema of the frames they yield, the docs the column list. Each table has
``run_id`` as its first column; parsers never fill it (the store does).

Units live in the docs here: ``ts``/``t_*`` are UTC timestamps with microsecond
precision, ``allocated``/``reserved`` are bytes, ``dur`` is microseconds.
"""

from __future__ import annotations

import polars as pl

# The schema version of the history database. Bump it and add a step to
# ``store.MIGRATIONS`` whenever a table below changes (a new column: ``ADDED_COLUMNS``).
SCHEMA_VERSION = 3

# name -> [(column, DuckDB type, description)]
TABLES: dict[str, list[tuple[str, str, str]]] = {
    "runs": [
        ("run_id", "VARCHAR", "id of the analysis"),
        ("source_dir", "VARCHAR", "the log directory analyzed"),
        ("analyzed_at", "TIMESTAMP", "when the analysis ran (UTC)"),
        ("job_id", "VARCHAR", "scheduler or torchelastic job id, when known"),
        ("world_size", "INTEGER", "ranks in the job (from the logs)"),
        ("ranks_seen", "INTEGER[]", "ranks some file spoke for"),
        ("hosts", "VARCHAR[]", "hosts seen"),
        ("torch_version", "VARCHAR", ""),
        ("nccl_version", "VARCHAR", ""),
        ("cuda_version", "VARCHAR", ""),
        ("python_version", "VARCHAR", ""),
        ("started_at", "TIMESTAMP", "first timestamp in the logs"),
        ("ended_at", "TIMESTAMP", "last timestamp in the logs"),
        ("verdict", "VARCHAR", "signature id of the root cause, if any"),
        ("exit_status", "INTEGER", "the CLI exit code for this analysis"),
        ("fingerprint", "VARCHAR", "hash of the input files' names, sizes and mtimes and of the analyzer (code, signatures)"),
        ("user", "VARCHAR", "who ran the job (scheduler env or --label user=...)"),
        ("command", "VARCHAR", "the job's command line, when a log shows it"),
        ("labels", "JSON", "--label key=value flags and scheduler variables (SLURM_*, TORCHELASTIC_RUN_ID, ...)"),
    ],
    "files": [
        ("run_id", "VARCHAR", ""),
        ("path", "VARCHAR", "path relative to the source directory"),
        ("kind", "VARCHAR", "what discovery sniffed: text_log, flight_recorder, ..."),
        ("rank", "INTEGER", "rank the file speaks for; NULL for mixed or unknown"),
        ("bytes", "BIGINT", "size on disk"),
        ("lines", "BIGINT", "lines read (text files)"),
        ("parser", "VARCHAR", "parser modules that read it"),
        ("status", "VARCHAR", "parsed, partial, skipped"),
        ("error", "VARCHAR", "why it was skipped or what was wrong with it"),
    ],
    "events": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("ts", "TIMESTAMP", "UTC"),
        ("file", "VARCHAR", ""),
        ("line_no", "BIGINT", "1-based line in file"),
        ("level", "VARCHAR", "I, W, E, F, V, D"),
        ("source", "VARCHAR", "the emitting code location, e.g. ProcessGroupNCCL.cpp:689"),
        ("kind", "VARCHAR", "log, exception, signal, oom, terminate, version, last_line, ..."),
        ("message", "VARCHAR", ""),
        ("pid", "INTEGER", ""),
        ("attrs", "JSON", "kind-specific fields"),
    ],
    "compiles": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("ts", "TIMESTAMP", ""),
        ("frame_id", "INTEGER", ""),
        ("attempt", "VARCHAR", "the compile id, e.g. 0/3"),
        ("function", "VARCHAR", ""),
        ("code_file", "VARCHAR", ""),
        ("code_line", "INTEGER", ""),
        ("event", "VARCHAR", "compile, recompile, graph_break, limit_hit, failure"),
        ("reason", "VARCHAR", ""),
        ("reason_class", "VARCHAR", "shape, python_scalar, dtype, type_id, global_state, other"),
        ("file", "VARCHAR", ""),
        ("line_no", "BIGINT", ""),
        ("user_frame", "VARCHAR", "innermost frame of the user's code, file:line (not torch, site-packages, stdlib)"),
        ("framework", "VARCHAR", "ddp, fsdp, torch, ...: the break/compile is inside torch's own code (context, not "
                                 "blame); NULL for user code"),
        ("source", "VARCHAR", "torch_logs (TORCH_LOGS text), torch_trace (TORCH_TRACE)"),
        ("attrs", "JSON", "event fields: guard, expected/actual value, failures, guard kinds, timings, cache hit/miss"),
    ],
    "collectives": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("source", "VARCHAR", "flight_recorder, nccl_log, watchdog, detail, profiler"),
        ("pg", "VARCHAR", ""),
        ("seq_id", "BIGINT", ""),
        ("op", "VARCHAR", ""),
        ("numel_in", "BIGINT", ""),
        ("numel_out", "BIGINT", ""),
        ("sizes", "VARCHAR", "input/output sizes as JSON"),
        ("dtypes", "VARCHAR", ""),
        ("state", "VARCHAR", "scheduled, started, completed, timed_out"),
        ("t_created", "TIMESTAMP", ""),
        ("t_started", "TIMESTAMP", ""),
        ("t_completed", "TIMESTAMP", ""),
        ("timeout_ms", "BIGINT", ""),
        ("file", "VARCHAR", ""),
        ("line_no", "BIGINT", ""),
    ],
    "rank_status": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("pg", "VARCHAR", ""),
        ("last_enqueued", "BIGINT", ""),
        ("last_started", "BIGINT", ""),
        ("last_completed", "BIGINT", ""),
        ("timed_out_seq", "BIGINT", ""),
        ("source", "VARCHAR", ""),
        ("file", "VARCHAR", ""),
        ("line_no", "BIGINT", ""),
    ],
    "stacks": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("pid", "INTEGER", ""),
        ("thread", "VARCHAR", ""),
        ("thread_state", "VARCHAR", "idle, active, active+gil, ..."),
        ("depth", "INTEGER", "0 = innermost frame"),
        ("function", "VARCHAR", ""),
        ("file", "VARCHAR", "source file of the frame"),
        ("line", "INTEGER", ""),
        ("source", "VARCHAR", "pyspy, traceback, flight_recorder, faulthandler"),
        ("origin", "VARCHAR", "the log file the stack came from"),
        ("origin_line", "BIGINT", "line in that file where the stack starts"),
    ],
    "memory": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("ts", "TIMESTAMP", ""),
        ("step", "BIGINT", ""),
        ("allocated", "BIGINT", "bytes"),
        ("reserved", "BIGINT", "bytes"),
        ("source", "VARCHAR", "profiler, log, snapshot, oom"),
        ("file", "VARCHAR", ""),
        ("line_no", "BIGINT", ""),
        ("device", "INTEGER", "CUDA device index; -1 the CPU allocator (profiler)"),
        ("peak_allocated", "BIGINT", "bytes: the peak a line reports (max_memory_allocated, Max_MA)"),
        ("peak_reserved", "BIGINT", "bytes: the peak reserved a line reports (torchtitan's memory:)"),
        ("delta", "BIGINT", "bytes this sample allocated (+) or freed (-): profiler [memory] events"),
        ("site", "VARCHAR", "snapshot: the allocation site (file:line in function) of a group of live blocks"),
        ("blocks", "BIGINT", "snapshot: live blocks allocated at that site"),
    ],
    "kernels": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("ts", "TIMESTAMP", ""),
        ("dur", "BIGINT", "microseconds"),
        ("name", "VARCHAR", ""),
        ("category", "VARCHAR", "nccl, compute, memcpy, memset; step_cpu / step_gpu: a ProfilerStep span on the CPU / GPU"),
        ("stream", "INTEGER", ""),
        ("device", "INTEGER", "CUDA device index"),
        ("step", "BIGINT", "the ProfilerStep#N the kernel ran in (its GPU span), or the span's own N"),
    ],
    "failures": [
        ("run_id", "VARCHAR", ""),
        ("rank", "INTEGER", ""),
        ("ts", "TIMESTAMP", ""),
        ("exit_code", "INTEGER", ""),
        ("signal", "VARCHAR", "e.g. SIGKILL"),
        ("exception_type", "VARCHAR", ""),
        ("message", "VARCHAR", ""),
        ("pid", "INTEGER", ""),
        ("host", "VARCHAR", ""),
        ("source", "VARCHAR", "torchrun, error_file, traceback, signal, oom, terminate"),
        ("file", "VARCHAR", ""),
        ("line_no", "BIGINT", ""),
    ],
    "findings": [
        ("run_id", "VARCHAR", ""),
        ("signature", "VARCHAR", ""),
        ("role", "VARCHAR", "root_cause, symptom, context, confirmation"),
        ("severity", "VARCHAR", "critical, error, warning, info"),
        ("confidence", "DOUBLE", "0..1"),
        ("ranks", "INTEGER[]", ""),
        ("summary", "VARCHAR", ""),
        ("evidence", "JSON", "[{rank, file, line, ts, text}]"),
        ("remediation", "VARCHAR", ""),
        ("user_line", "VARCHAR", "the user's own source line the finding names (file:line), where it names one"),
        ("evidence_kind", "VARCHAR", "the strongest kind of file its evidence comes from: flight_recorder, pyspy, ..."),
    ],
}

# Columns added by a later schema version (always at their table's end, so rows keep their
# column order): version -> (table, column). The first version's tables are the rest.
ADDED_COLUMNS: dict[int, list[tuple[str, str]]] = {2: [("findings", "user_line")],
                                                   3: [("findings", "evidence_kind")]}

# Views over the history, for SQL users and `postmortem history`. Hosts come from NCCL's
# `host:pid:tid` headers (the worker's own hostname), else torchrun's failure table.
VIEWS: dict[str, str] = {
    "v_runs": """
        SELECT r.run_id, r.analyzed_at, r.job_id, r."user", r.source_dir, r.world_size, r.verdict, r.exit_status,
               r.started_at, r.ended_at, r.torch_version, r.nccl_version,
               (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id) AS findings
        FROM runs r""",
    "v_findings": """
        SELECT f.run_id, r.analyzed_at, r.job_id, r.source_dir, f.signature, f.role, f.severity, f.confidence,
               f.summary, u.rank AS culprit_rank
        FROM findings f JOIN runs r USING (run_id)
        LEFT JOIN LATERAL (SELECT unnest(CASE WHEN len(f.ranks) > 0 THEN f.ranks ELSE [NULL] END) AS rank) u ON true""",
    "v_rank_hosts": """
        SELECT run_id, rank, coalesce(arg_max(nccl_host, n), arg_max(table_host, n)) AS host FROM (
            SELECT run_id, rank, attrs->>'host' AS nccl_host, NULL AS table_host, count(*) AS n
            FROM events WHERE kind LIKE 'nccl%' AND rank IS NOT NULL AND attrs->>'host' IS NOT NULL GROUP BY ALL
            UNION ALL
            SELECT run_id, rank, NULL, host, count(*) FROM failures
            WHERE host IS NOT NULL AND rank IS NOT NULL GROUP BY ALL
        ) GROUP BY run_id, rank""",
    "v_host_faults": """
        SELECT h.host, f.run_id, f.analyzed_at, f.job_id, f.signature, f.culprit_rank
        FROM v_findings f JOIN v_rank_hosts h ON h.run_id = f.run_id AND h.rank = f.culprit_rank
        WHERE f.role = 'root_cause'""",
}

_POLARS_TYPES = {
    "VARCHAR": pl.String,
    "JSON": pl.String,
    "INTEGER": pl.Int32,
    "BIGINT": pl.Int64,
    "DOUBLE": pl.Float64,
    "TIMESTAMP": pl.Datetime("us"),
    "INTEGER[]": pl.List(pl.Int32),
    "VARCHAR[]": pl.List(pl.String),
}


def columns(table: str) -> list[str]:
    """The columns a parser fills for ``table`` (all but run_id)."""
    return [name for name, _, _ in TABLES[table] if name != "run_id"]


def polars_schema(table: str) -> dict[str, pl.DataType]:
    """The Polars schema of the frames parsers yield for ``table``."""
    return {name: _POLARS_TYPES[typ] for name, typ, _ in TABLES[table] if name != "run_id"}


def frame(table: str, rows: list[dict] | None = None) -> pl.DataFrame:
    """A frame for ``table`` from a few row dicts; missing columns are NULL.

    For the small, rare records (a torchrun failure table, a traceback); hot paths build
    frames with expressions and pass them through ``conform``.
    """
    schema = polars_schema(table)
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame([{c: r.get(c) for c in schema} for r in rows], schema=schema, strict=False)


def conform(table: str, df: pl.DataFrame) -> pl.DataFrame:
    """Select, cast and order ``df``'s columns to ``table``'s; add missing ones as NULL."""
    schema = polars_schema(table)
    if df.height == 0:  # most parsers' sub-results are: no query for nothing
        return pl.DataFrame(schema=schema)
    return df.select(
        [
            (pl.col(c) if c in df.columns else pl.lit(None)).cast(t, strict=False).alias(c)
            for c, t in schema.items()
        ]
    )


def view_ddl() -> list[str]:
    return [f"CREATE OR REPLACE VIEW {name} AS {sql}" for name, sql in VIEWS.items()]


def ddl(table: str, version: int | None = None) -> str:
    """CREATE TABLE for ``table`` as schema ``version`` (default: the current one) had it."""
    later = {(t, c) for v, cols in ADDED_COLUMNS.items() if version is not None and v > version for t, c in cols}
    cols = ", ".join(f'"{name}" {typ}' for name, typ, _ in TABLES[table] if (table, name) not in later)
    return f"CREATE TABLE IF NOT EXISTS {table} ({cols})"


def add_column_ddl(table: str, column: str) -> str:
    typ = next(t for name, t, _ in TABLES[table] if name == column)
    return f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{column}" {typ}'


def json_attrs(**fields: pl.Expr) -> pl.Expr:
    """An ``attrs`` JSON string built from expressions, one key per field."""
    return pl.struct(**fields).struct.json_encode()

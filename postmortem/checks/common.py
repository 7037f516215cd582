"""What the hang checks share: where each rank was when the job stopped making progress."""

from __future__ import annotations

import duckdb

from postmortem.summary import rank_endings

# A frame is the user's when its file is none of these (py-spy prints short file names).
NOT_USER_SQL = """
    file NOT LIKE '%site-packages/%' AND file NOT LIKE '%dist-packages/%' AND file NOT LIKE 'torch/%'
    AND file NOT LIKE '%/torch/%' AND file NOT LIKE '%/lib/python3%' AND file NOT LIKE '<%'
    AND file NOT LIKE 'threading.py' AND file NOT LIKE 'queue.py' AND file NOT LIKE 'multiprocessing/%'
"""


def timed_out_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    """Ranks that gave up waiting in a collective, with their first timeout line."""
    rows = con.execute(
        """
        SELECT rank, arg_min(ts, coalesce(ts, TIMESTAMP '2000-01-01')) AS ts,
               arg_min(file, line_no) AS file, min(line_no) AS line, arg_min(message, line_no) AS text
        FROM events
        WHERE run_id = ? AND rank IS NOT NULL
          AND (kind = 'watchdog_timeout'
               OR (kind = 'exception' AND (message ILIKE '%timed out waiting%'
                                           OR message LIKE '%Watchdog caught collective operation timeout%')))
        GROUP BY rank
        """, [run_id]).fetchall()
    return {r[0]: {"rank": r[0], "ts": r[1], "file": r[2], "line": r[3], "text": r[4]} for r in rows}


def stack_positions(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    """Per rank with a py-spy dump: its main thread's innermost frame, the collective it is
    in (a torch.distributed call, or DDP's gradient all-reduce under backward), and the
    innermost frame of the user's own code."""
    rows = con.execute(
        f"""
        WITH main AS (
            SELECT DISTINCT rank, thread, depth, function, file, line, origin
            FROM stacks WHERE run_id = $1 AND source = 'pyspy' AND rank IS NOT NULL
              AND (thread = 'MainThread' OR thread NOT LIKE 'Thread-%')
        ),
        per_rank AS (
            SELECT rank, min(origin) AS origin FROM main WHERE thread = 'MainThread' GROUP BY rank
        )
        SELECT m.rank,
               -- the innermost frame worth naming: Queue.get, not the Condition.wait inside it
               arg_min(m.function || ' (' || m.file || coalesce(':' || m.line, '') || ')', m.depth)
                   FILTER (m.file NOT LIKE '%threading.py') AS innermost,
               arg_min(m.function, m.depth) FILTER (m.file LIKE '%distributed_c10d.py') AS collective,
               bool_or(m.function IN ('backward', '_engine_run_backward')) AS in_backward,
               arg_min(m.file || ':' || m.line, m.depth) FILTER ({NOT_USER_SQL} AND m.line IS NOT NULL) AS user_line,
               arg_min(m.function, m.depth) FILTER ({NOT_USER_SQL} AND m.line IS NOT NULL) AS user_function,
               arg_min(m.depth, m.depth) FILTER ({NOT_USER_SQL} AND m.line IS NOT NULL) AS user_depth,
               max(m.depth) FILTER (m.file LIKE '%distributed_c10d.py') AS collective_depth,
               any_value(p.origin) AS origin
        FROM main m JOIN per_rank p ON p.rank = m.rank AND p.origin = m.origin AND m.thread = 'MainThread'
        GROUP BY m.rank
        """, [run_id]).fetchall()
    out = {}
    for rank, innermost, collective, in_backward, user_line, user_function, user_depth, c_depth, origin in rows:
        op = collective or ("all_reduce (DDP gradients, under backward)" if in_backward else None)
        # The collective is the user's own call when the user's frame sits right above torch.distributed's
        # (only logging wrappers between), not reached through autograd or a library.
        direct = collective is not None and user_depth is not None and c_depth is not None and user_depth - c_depth <= 3
        out[rank] = {"rank": rank, "innermost": innermost, "collective": op, "user_line": user_line,
                     "user_function": user_function, "direct_call": direct, "file": origin}
    return out


def stuck_elsewhere(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[dict, list[dict]]:
    """(ranks that timed out in a collective, ranks that never did and never failed on their own)."""
    timed_out = timed_out_ranks(con, run_id)
    if not timed_out:
        return timed_out, []
    endings = {e["rank"]: e for e in rank_endings(con, run_id)}
    missing = []
    for rank, ending in sorted(endings.items()):
        if rank in timed_out:
            continue
        torn_down = ending["consequence"] or ending["ended"] == "no failure recorded"
        if torn_down:
            missing.append(ending)
    return timed_out, missing

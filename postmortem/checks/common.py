"""What the hang checks share: where each rank was when the job stopped making progress."""

from __future__ import annotations

from fnmatch import fnmatchcase

import duckdb

from postmortem.summary import NCCL_ABORT, rank_endings

from . import once

# A frame is the user's when its file matches none of these (SQL LIKE patterns; py-spy prints
# short file names): as SQL for the queries, as a function for the checks' own Python.
_NOT_USER = ("%site-packages/%", "%dist-packages/%", "torch/%", "%/torch/%", "%/lib/python3%", "<%",
             "threading.py", "queue.py", "multiprocessing/%")
NOT_USER_SQL = " AND ".join(f"file NOT LIKE '{p}'" for p in _NOT_USER)


def is_user_file(file: str) -> bool:
    return not any(fnmatchcase(file, p.replace("%", "*")) for p in _NOT_USER)


# What several checks of one matching read alike is worked out once (``checks.once``: don't change
# what these return): the hang checks' rank endings, timeouts and stack positions, 64 ranks' ~60 ms.


def endings(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """``summary.rank_endings``, once a matching."""
    return once(("rank_endings", run_id), lambda: rank_endings(con, run_id))


def timed_out_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    """Ranks that gave up waiting in a collective, with their first timeout line: the watchdog's
    "Watchdog caught collective operation timeout", gloo's "Timed out waiting", or the watchdog's
    status line of the same failure ("Exception (either an error or timeout) detected by watchdog
    at work: 1580", a timed-out sequence in ``rank_status``), whichever of them an excerpt kept."""
    return once(("timed_out_ranks", run_id), lambda: _timed_out_ranks(con, run_id))


def _timed_out_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    rows = con.execute(
        f"""
        WITH waits AS (
            SELECT coalesce(rank, TRY_CAST(regexp_extract(message, '{_STORE_WAIT}', 1) AS INTEGER)) AS rank,
                   ts, file, line_no, message
            FROM events e
            WHERE run_id = $1
              AND (kind = 'watchdog_timeout'
                   OR (kind = 'exception' AND (message ILIKE '%timed out waiting%'
                                               OR message LIKE '%Watchdog caught collective operation timeout%'
                                               OR regexp_matches(message, '{_STORE_WAIT}')))
                   OR (kind = 'log' AND EXISTS (
                       SELECT 1 FROM rank_status s WHERE s.run_id = $1 AND s.rank = e.rank AND s.file = e.file
                         AND s.line_no = e.line_no AND s.timed_out_seq IS NOT NULL)))
        )
        SELECT rank, arg_min(ts, coalesce(ts, TIMESTAMP '2000-01-01')) AS ts,
               arg_min(file, line_no) AS file, min(line_no) AS line, arg_min(message, line_no) AS text
        FROM waits WHERE rank IS NOT NULL
        GROUP BY rank ORDER BY rank
        """, [run_id]).fetchall()
    return {r[0]: {"rank": r[0], "ts": r[1], "file": r[2], "line": r[3], "text": r[4]} for r in rows}


# ProcessGroupNCCL's communicator setup waiting for the rank that makes the NCCL id, which never
# wrote it to the store: "[1] is setting up NCCL communicator and retrieving ncclUniqueId from [0]
# via c10d key-value store by key '0', but store->get('0') got error" (the waiting rank, then the
# rank it waited for).
_STORE_WAIT = r"^\w*(?:Error|Exception)?:? ?\[(\d+)\] is setting up NCCL communicator and retrieving ncclUniqueId from \[(\d+)\]"


def waited_for(con: duckdb.DuckDBPyConnection, run_id: str) -> set[int]:
    """Ranks that a timed-out rank's own message names as the one it waited for."""
    rows = con.execute(f"""
        SELECT DISTINCT TRY_CAST(regexp_extract(message, '{_STORE_WAIT}', 2) AS INTEGER) FROM events
        WHERE run_id = ? AND kind = 'exception' AND regexp_matches(message, '{_STORE_WAIT}')""", [run_id]).fetchall()
    return {r[0] for r in rows if r[0] is not None}


def stack_positions(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    """Per rank with a py-spy dump: its main thread's innermost frame, the collective it is
    in (a torch.distributed call, or DDP's gradient all-reduce under backward), and the
    innermost frame of the user's own code."""
    return once(("stack_positions", run_id), lambda: _stack_positions(con, run_id))


def _stack_positions(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
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
    return once(("stuck_elsewhere", run_id), lambda: _stuck_elsewhere(con, run_id))


def _stuck_elsewhere(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[dict, list[dict]]:
    timed_out = timed_out_ranks(con, run_id)
    if not timed_out:
        return timed_out, []
    ends = {e["rank"]: e for e in endings(con, run_id)}
    # A rank whose watchdog says it issued the sequence the others timed out in ("Received a dump
    # signal ... Last enqueued NCCL work: 460631"), or whose watchdog was itself stuck inside
    # NCCL/CUDA, was there too: it is not the rank that never came.
    there = {r[0] for r in con.execute(
        """
        SELECT DISTINCT s.rank FROM rank_status s JOIN rank_status t
          ON t.run_id = s.run_id AND t.pg IS NOT DISTINCT FROM s.pg AND t.timed_out_seq IS NOT NULL
        WHERE s.run_id = $1 AND s.last_enqueued >= t.timed_out_seq
        UNION SELECT rank FROM events WHERE run_id = $1 AND kind = 'watchdog_stuck' AND rank IS NOT NULL
        """, [run_id]).fetchall()}
    missing = []
    for rank, ending in sorted(ends.items()):
        if rank in timed_out or rank in there or ending["ended"] == NCCL_ABORT:
            continue
        torn_down = ending["consequence"] or ending["ended"] == "no failure recorded"
        if torn_down:
            missing.append(ending)
    named = [{"rank": r, "ended": "waited for by name", "ts": None, "ts_inferred": False, "consequence": False,
              "evidence": None, "first_error": None, "last_event": None}
             for r in sorted(waited_for(con, run_id) - set(timed_out) - {m["rank"] for m in missing} - there)
             if r not in ends or ends[r]["ended"] == "no failure recorded"]
    return timed_out, missing + (named or _never_seen(con, run_id, ends, timed_out))


def _never_seen(con: duckdb.DuckDBPyConnection, run_id: str, endings: dict, timed_out: dict) -> list[dict]:
    """The one rank of the job that left no line at all, when every rank that did timed out
    waiting: in one console whose lines name no rank (the late rank's output is the unprefixed
    one), the rank the others waited for is the one never named. Two or more unseen ranks are
    more likely an excerpt's cut than the culprits."""
    ((world,),) = con.execute("SELECT max(world_size) FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if not world or set(endings) - set(timed_out):
        return []
    unseen = sorted(set(range(world)) - set(endings))
    if len(unseen) != 1 or len(timed_out) < 2:
        return []
    return [{"rank": r, "ended": "no line in the logs", "ts": None, "ts_inferred": False, "consequence": False,
             "evidence": None, "first_error": None, "last_event": None} for r in unseen]

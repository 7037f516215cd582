"""rank-divergent-compile: ranks of one job compiled different things.

Every rank runs the same code on the same shapes, so it should compile the same frames with
the same compile ids, recompile them as often and for the same guards, and hit or miss the
compile caches alike. Where ranks differ, the compiled graphs (and the collectives inside
them, for DDP / FSDP / TP) can differ: a desync risk. Like tlparse's multi-rank report,
ranks are grouped by what they compiled; unlike it, the groups say how they differ.

Ranks are compared within one source: TORCH_TRACE when two or more ranks have it (it logs
every compile), else TORCH_LOGS text (recompiles and graph breaks only). A rank whose process
failed and whose compile ids are a prefix of the others' stopped early; it does not count.

What a log leaves out is not a difference: a frame is known by its compile id's frame number
(``[2/8]`` is frame 2 on every rank of one program), so a recompile block cut before its
``function:`` line still counts for its frame; a guard is compared only on frames where every
rank's log names one; and object ids in guards (``___check_obj_id(L['self'], 140318667175440)``)
differ per process by construction, so they are masked.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import duckdb

# In order: the first aspect in which ranks differ is reported.
_ASPECTS = ("collective schedule", "compile ids", "recompiles per frame", "guard failures", "cache hit/miss pattern")


_LIBRARY_PATHS = ("site-packages/", "dist-packages/", "/torch/", "/lib/python3")
# an integer this long in a guard is an object or type id (id() of a Python object), not a size
_OBJECT_ID = re.compile(r"\b\d{8,}\b")


def _in_user_code(code_file: str | None) -> bool:
    return bool(code_file) and not any(m in code_file for m in _LIBRARY_PATHS)


def _rows(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """The compile records the comparison reads, in each rank's order. A job that logged the
    same graph break at every step on 512 ranks has millions of records, almost all alike: only
    recompiles, limits, failures, cache outcomes and collective schedules are fetched whole;
    of the rest, each compile id's first record (and first in user code: evidence) and each
    rank's last record."""
    library = " OR ".join(f"contains(code_file, '{m}')" for m in _LIBRARY_PATHS)
    # (the text is searched first, and JSON taken apart only where it holds the key)
    wanted = "".join(f"""
                  OR ({_names_key('attrs', key)} AND (attrs->'{key}') IS NOT NULL)"""
                     for key in _keys_held(con, run_id))
    # The firsts and lasts are picked by aggregates over row ids (hashing), not by numbering every
    # record in order (sorting millions); NULL times sort last, as ORDER BY ts NULLS LAST would.
    cur = con.execute(
        f"""
        WITH c AS (
            SELECT rowid AS rid, rank, source, attempt, event, ts, line_no, attrs,
                   coalesce(code_file, '') <> '' AND NOT ({library}) AS user_code
            FROM compiles
            WHERE run_id = ? AND rank IS NOT NULL
        ), picked AS (
            SELECT arg_min(rid, (ts IS NULL, coalesce(ts, 'infinity'::TIMESTAMP), line_no)) AS rid
            FROM c GROUP BY rank, source, attempt, user_code
            UNION
            SELECT arg_max(rid, (ts IS NULL, coalesce(ts, '-infinity'::TIMESTAMP), line_no)) FROM c GROUP BY rank, source
            UNION
            SELECT rid FROM c
            WHERE event IN ('recompile', 'limit_hit', 'failure'){wanted}
        )
        SELECT rank, source, attempt, event, function, code_file, code_line, reason_class,
               attrs->>'guard' AS guard, attrs->'cache' AS cache, attrs->'collectives' AS collectives, ts, file, line_no
        FROM compiles
        WHERE rowid IN (SELECT rid FROM picked)
        ORDER BY rank, ts NULLS LAST, line_no
        """, [run_id])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


# The attrs keys whose records are fetched whole: cache outcomes and collective schedules.
_WHOLE_KEYS = ("cache", "collectives")


def _names_key(column: str, key: str) -> str:
    """SQL: whether the attrs text ``column`` names ``key`` (attrs, written by the parsers, hold a
    key's quoted name wherever they hold the key)."""
    return f"""contains({column}, '"{key}"')"""


def _keys_held(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """Which of the attrs keys the comparison reads whole (cache outcomes, collective schedules) some
    record's attrs may hold: looked for once in each distinct attrs text, not in every record's (a
    graph break logged at every step of 64 ranks: 205k records, 80 MB of attrs in 5 values; 20 of
    the query's 37 ms)."""
    held = ", ".join(f"coalesce(bool_or({_names_key('a', key)}), false)" for key in _WHOLE_KEYS)
    found = con.execute(f"SELECT {held} FROM (SELECT DISTINCT attrs AS a FROM compiles "
                        "WHERE run_id = ? AND rank IS NOT NULL)", [run_id]).fetchone()
    return [key for key, is_held in zip(_WHOLE_KEYS, found) if is_held]


def _failed_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> set[int]:
    return {r[0] for r in con.execute(
        "SELECT DISTINCT rank FROM failures WHERE run_id = ? AND rank IS NOT NULL", [run_id]).fetchall()}


def _id_key(attempt: str) -> tuple:
    parts = attempt.lstrip("!").replace("_", "/").split("/")
    return tuple(int(p) if p.isdigit() else 0 for p in parts)


def _frame_name(r: dict) -> str | None:
    return f"{r['function']} ({r['code_file']}:{r['code_line']})" if r["function"] else None


def _frame_key(r: dict) -> str:
    """The frame a record is of: its compile id's frame number where it has one (the same frame on
    every rank of one program, whether or not this record's block kept its ``function:`` line)."""
    attempt = (r["attempt"] or "").lstrip("!")
    if "/" in attempt:
        return "frame " + attempt.split("/")[0]
    return _frame_name(r) or "unknown frame"


def _profile(rows: list[dict]) -> dict:
    """What one rank compiled: its compile ids, recompiles and guards per frame, cache outcomes."""
    ids = {r["attempt"] for r in rows if r["attempt"]}
    recompiles: Counter = Counter()
    guards: dict[str, set] = defaultdict(set)
    names: dict[str, str] = {}
    seen: set = set()
    cache = []
    schedule = []
    for r in rows:
        frame = _frame_key(r)
        if _frame_name(r):
            names.setdefault(frame, _frame_name(r))
        if r["event"] in ("recompile", "limit_hit"):
            key = r["attempt"] or (r["file"], r["line_no"])
            if (frame, key) not in seen:
                seen.add((frame, key))
                recompiles[frame] += 1
            if r["guard"]:
                guards[frame].add((r["reason_class"], _OBJECT_ID.sub("<id>", r["guard"])))
        if r["cache"] and r["event"] in ("compile", "recompile"):
            outcome = json.loads(r["cache"]) if isinstance(r["cache"], str) else r["cache"]
            cache.append((r["attempt"], outcome.get("fx_graph_cache")))
        if r["collectives"]:
            ops = json.loads(r["collectives"]) if isinstance(r["collectives"], str) else r["collectives"]
            schedule.append((r["attempt"], tuple(ops)))
    return {"compile ids": frozenset(ids), "recompiles per frame": tuple(sorted(recompiles.items())),
            "guard failures": tuple(sorted((f, tuple(sorted(g, key=str))) for f, g in guards.items())),
            "frame names": names,
            "cache hit/miss pattern": tuple(sorted(cache, key=lambda c: _id_key(c[0] or ""))),
            "collective schedule": tuple(sorted(schedule, key=lambda c: _id_key(c[0] or "")))}


def _describe(profile: dict, rows: list[dict]) -> str:
    ids = sorted(profile["compile ids"], key=_id_key)
    span = f"{ids[0]} … {ids[-1]}" if len(ids) > 2 else ", ".join(ids)
    parts = [f"{len(ids)} compile id(s) ({span or 'none'})"]
    for frame, n in profile["recompiles per frame"]:
        classes = sorted({c for f, g in profile["guard failures"] if f == frame for c, _ in g if c})
        name = profile["frame names"].get(frame, frame).split(" (")[0]
        parts.append(f"{name} recompiled {n}x" + (f" ({', '.join(classes)})" if classes else ""))
    outcomes = Counter(o for _, o in profile["cache hit/miss pattern"] if o)
    if outcomes:
        parts.append("FX cache " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    for attempt, ops in profile["collective schedule"]:
        parts.append(f"graph {attempt} collectives [{', '.join(ops)}]")
    failures = sum(1 for r in rows if r["event"] == "failure")
    if failures:
        parts.append(f"{failures} compile failure(s)")
    return "; ".join(parts)


def _keep_guards_every_rank_names(profiles: dict[int, dict]) -> None:
    """Compare guards only on frames whose guards every rank's log shows: a rank whose recompile
    block was cut before its ``last reason:`` line failed some guard, just not one we can read."""
    named = [{f for f, _ in p["guard failures"]} for p in profiles.values()]
    common = set.intersection(*named) if named else set()
    for p in profiles.values():
        p["guard failures"] = tuple(fg for fg in p["guard failures"] if fg[0] in common)


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    rows = _rows(con, run_id)
    by_source: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_source[r["source"]][r["rank"]].append(r)
    source = next((s for s in ("torch_trace", "torch_logs") if len(by_source.get(s, {})) >= 2), None)
    if source is None:
        return []
    per_rank = by_source[source]
    profiles = {rank: _profile(rs) for rank, rs in per_rank.items()}
    failed = _failed_ranks(con, run_id)
    _keep_guards_every_rank_names(profiles)
    for aspect in _ASPECTS:
        groups: dict = defaultdict(list)
        for rank, p in profiles.items():
            groups[p[aspect]].append(rank)
        if len(groups) < 2:
            continue
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
        majority_value, majority = ordered[0]
        if aspect == "compile ids":
            # A rank that failed and compiled a prefix of what the others did just stopped early.
            ordered = [(v, rs) for v, rs in ordered
                       if (v, rs) == ordered[0] or not (set(rs) <= failed and v < majority_value)]
            if len(ordered) < 2:
                continue
        unique_majority = len(ordered[0][1]) > len(ordered[1][1])
        # Two equal groups, one of which compiled everything the other did and more: the extra
        # compiles are the divergence (rank 1 recompiled for an input only it saw).
        superset = None
        if not unique_majority and aspect == "compile ids" and len(ordered) == 2:
            (a, _), (b, _) = ordered
            superset = a if a > b else b if b > a else None
        summary_groups = " | ".join(_ranks_text(sorted(rs)) for _, rs in ordered)
        out = []
        for value, ranks in ordered:
            ranks = sorted(ranks)
            text = f"{_ranks_text(ranks)}: {_describe(profiles[ranks[0]], per_rank[ranks[0]])}"
            # Evidence: the rank's first compile the majority lacks, else its last compile record.
            baseline = min((v for v, _ in ordered if v is not value), key=len, default=majority_value)
            extra = profiles[ranks[0]]["compile ids"] - (baseline if superset is not None else majority_value) \
                if aspect == "compile ids" else set()
            for rank in ranks:
                rank_rows = per_rank[rank]
                candidates = [r for r in rank_rows if r["attempt"] in extra]
                in_user_code = [r for r in candidates if _in_user_code(r.get("code_file"))]
                at = (in_user_code or candidates or rank_rows[-1:] or [{}])[0]
                where = f"{at.get('code_file')}:{at.get('code_line')}" if at.get("code_file") else None
                extra_here = bool(where) and at.get("attempt") in extra
                out.append({"rank": rank, "ts": at.get("ts"), "file": at.get("file"), "line": at.get("line_no"),
                            "text": text + (f" (first extra compile: {at.get('function')} at {where})"
                                            if extra_here else ""),
                            # the user's frame that compiled again (its def line, as the recompile names it)
                            "user_line": where if extra_here and _in_user_code(at.get("code_file")) else "unknown",
                            "culprit": (unique_majority and value is not majority_value)
                            or (superset is not None and value == superset),
                            "aspect": aspect, "groups": summary_groups, "source": source})
        first = min(majority)
        majority_text = f"{_ranks_text(sorted(majority))}: {_describe(profiles[first], per_rank[first])}"
        detail = " | ".join(dict.fromkeys(r["text"] for r in out if r["text"] != majority_text))
        for r in out:
            r["detail"] = detail or r["text"]
            r["majority"] = majority_text if unique_majority else (
                "the other group compiled a subset of these" if superset is not None else "no majority")
            r["confidence"] = 0.75 if unique_majority or superset is not None else 0.6
        out.sort(key=lambda r: (not r["culprit"], r["rank"]))
        return out
    return []

"""collective-hang: ranks waited in a collective that another rank never reached, or never finished.

From the collectives lined up by (group, sequence) (``collective_alignment``): a rank that
never issued the sequence the others wait in (flight-recorder dumps, or the watchdog's
"last enqueued work" lines), or a rank that issued it and never completed it while a peer
did (its GPU or NCCL kernel stopped). Where such a rank was comes from its py-spy dump.

Without the dumps themselves, the flight recorder analyzer's own report (``torchfrtrace``'s
"Not all ranks joining collective ... missing ranks: {3, 4}", the ``fr_not_joined`` events)
names the ranks that never issued the collective the others scheduled.

Ranks that each wait in a collective of a group another never issued, where those waits close
a loop (rank 0 waits in ``grads`` seq 5 for rank 1, rank 1 in ``metrics`` seq 5 for rank 0: two
groups taken in different orders), are a wait cycle (``find_cycle`` over the wait-for graph of
the recorded disagreements); its culprit is the rank whose waiting call is not what its own
history issues at that point. PyTorch's TORCH_NCCL_DESYNC_DEBUG report names its lagging ranks
("[7] finished collective #182, but didn't join collective #183"): the ``desync_report`` events.

Without a dump or a watchdog status line (gloo), a rank is missing when others timed
out waiting and it neither timed out itself nor failed on its own: torchrun tore it down,
or it never ended (``common.stuck_elsewhere``). Where it was comes from its py-spy dump,
else its last log line.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import replace

import duckdb

from postmortem.ranges import rank_ranges

from . import collective_alignment as alignment
from .common import endings, stack_positions, stuck_elsewhere

_KINDS = ("never_enqueued", "never_completed")


def _headline(d: alignment.Disagreement) -> str:
    op = d.op or "the collective"
    waiting = alignment._fmt(d.others)
    if d.kind == "never_completed":
        return (f"rank(s) {alignment._fmt(d.culprits)} issued {op} sequence {d.seq} on {d.group} and never "
                f"completed it, while rank(s) {waiting} did")
    return (f"rank(s) {alignment._fmt(d.culprits)} never issued {op} sequence {d.seq} on {d.group} that rank(s) "
            f"{waiting} wait in")


def _file_of(con: duckdb.DuckDBPyConnection, run_id: str, rank: int) -> tuple[str | None, int | None]:
    """The culprit's own record: its dump, else its status line."""
    row = con.execute(
        """
        SELECT file, line_no FROM (
            SELECT path AS file, NULL::BIGINT AS line_no, 0 AS pref FROM files
            WHERE run_id = $1 AND rank = $2 AND kind = 'flight_recorder'
            UNION ALL SELECT file, line_no, 1 FROM rank_status WHERE run_id = $1 AND rank = $2
        ) ORDER BY pref, file LIMIT 1
        """, [run_id, rank]).fetchall()
    return (row[0][0], row[0][1]) if row else (None, None)


def _aligned(con: duckdb.DuckDBPyConnection, run_id: str, found: list[alignment.Disagreement]) -> list[dict]:
    found = sorted(found, key=lambda d: (_KINDS.index(d.kind), -len(d.culprits), d.seq))
    stacks = stack_positions(con, run_id)
    first = found[0]
    culprits = sorted({r for d in found for r in d.culprits})
    places = []
    for rank in culprits:
        pos = stacks.get(rank)
        if pos:
            places.append(f"rank {rank} was in {pos['innermost']}, called from {pos['user_line'] or 'no user frame'}")
    if places:
        where = "; ".join(places)
    elif first.kind == "never_completed":
        where = "a peer can complete a collective only with every rank's data, so their GPU or NCCL kernel stopped"
    else:
        where = "they were outside torch.distributed (no stack dump shows where)"
    headline = _headline(first)
    if set(culprits) - set(first.culprits):
        firsts = {}
        for d in found:
            for rank in d.culprits:
                firsts.setdefault(rank, d)
        verb = "never completed" if first.kind == "never_completed" else "never issued"
        headline = f"rank(s) {alignment._fmt(culprits)} {verb} collectives their groups wait in: " + "; ".join(
            f"rank {r}: {firsts[r].op or 'collective'} sequence {firsts[r].seq} on {firsts[r].group}" for r in culprits)
    groups = sorted({d.group for d in found if set(d.culprits) & set(culprits)})
    site = alignment.first_site(alignment.call_sites(con, run_id), first.calls.values())
    if site:
        headline += f" (called from {site})"
    rows = []
    for rank in culprits:
        own = next(d for d in found if rank in d.culprits)
        call = own.calls.get(rank)
        file, line = (call.file, call.line) if call else _file_of(con, run_id, rank)
        pos = stacks.get(rank)
        rows.append({"rank": rank, "ts": call.ts if call else None, "file": file, "line": line,
                     "text": own.detail + f" ({own.group})", "culprit": True, "case": first.kind,
                     "headline": headline, "where": where,
                     "user_line": (pos or {}).get("user_line") or "unknown",
                     "waiting": alignment._fmt(first.others), "groups": "; ".join(groups[:8]),
                     "confidence": 0.9 if first.kind == "never_enqueued" else 0.8})
    for rank in first.others:
        call = first.calls.get(rank)
        if call is not None:
            rows.append({"rank": rank, "ts": call.ts, "file": call.file, "line": call.line,
                         "text": f"rank {rank}: {call.describe()}, {call.state}", "culprit": False})
    return rows


def _from_analyzer(con: duckdb.DuckDBPyConnection, run_id: str, crashed: set[int]) -> list[dict]:
    """The analyzer's first report of ranks that never joined (lowest sequence of its group)."""
    reports = con.execute(
        "SELECT file, line_no, message, attrs FROM events WHERE run_id = ? AND kind = 'fr_not_joined' "
        "ORDER BY TRY_CAST(attrs->>'seq' AS BIGINT), file, line_no", [run_id]).fetchall()
    stacks = stack_positions(con, run_id)
    for file, line, message, attrs in reports:
        a = json.loads(attrs)
        missing = sorted(set(a.get("missing_ranks") or []) - crashed)
        if not missing:
            continue
        waiting = sorted(set(a.get("expected_ranks") or []) - set(a.get("missing_ranks") or []))
        op, group, seq = a.get("op") or "the collective", a.get("pg_desc") or a.get("pg") or "?", a.get("seq")
        headline = (f"rank(s) {rank_ranges(missing)} never issued {op} sequence {seq} on {group}"
                    + (f" that rank(s) {rank_ranges(waiting)} {a.get('state') or 'scheduled'}" if waiting else "")
                    + (f" (called from {a['user_frame']})" if a.get("user_frame") else ""))
        places = [f"rank {r} was in {stacks[r]['innermost']}, called from {stacks[r]['user_line'] or 'no user frame'}"
                  for r in missing if stacks.get(r)]
        where = "; ".join(places) or ("the flight recorder analyzer found it in no dump of theirs: they were outside "
                                      "torch.distributed (no stack dump shows where)")
        # The frame above is where the ranks that issued it called it; where the missing ones were is unknown.
        return [{"rank": r, "ts": None, "file": file, "line": line, "text": message, "culprit": True,
                 "case": "never_enqueued", "headline": headline, "where": where,
                 "user_line": (stacks.get(r) or {}).get("user_line") or "unknown",
                 "waiting": rank_ranges(waiting), "groups": group, "confidence": 0.85} for r in missing]
    return []


_P2P_CALL = re.compile(r"\b(?P<op>i?send|i?recv)\((?P<args>.*)\)")
_PEER_ARG = re.compile(r"\b(?P<kw>src|dst)\s*=\s*(?P<expr>[^,)#]+)")


def _peer(expr: str, rank: int) -> int | None:
    """The rank a ``src=``/``dst=`` argument names, as the call's own source line wrote it: an
    integer, or the caller's rank (``rank``, ``self.rank``, ``global_rank``) plus or minus
    integers. Read with ``ast``, never run; anything else names no rank we can know."""
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in ("rank", "global_rank"):
            return rank
        if isinstance(node, ast.Attribute) and node.attr in ("rank", "global_rank"):
            return rank
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left, right = value(node.left), value(node.right)
            if left is None or right is None:
                return None
            return left + right if isinstance(node.op, ast.Add) else left - right
        return None

    return value(tree)


def p2p_waits(con: duckdb.DuckDBPyConnection, run_id: str,
              crashed: set[int] = frozenset()) -> tuple[dict[int, dict], set[int]]:
    """(rank -> the send/recv it timed out in and the peer its call names, ranks that timed out
    in a send/recv whose peer cannot be read), from the user's line in each traceback."""
    rows = con.execute(
        """
        SELECT rank, arg_min(attrs->>'user_frame', line_no), arg_min(attrs->>'user_function', line_no),
               arg_min(attrs->>'user_code', line_no), arg_min(file, line_no), min(line_no)
        FROM events WHERE run_id = ? AND kind = 'exception' AND rank IS NOT NULL
          AND attrs->>'user_code' IS NOT NULL AND message ILIKE '%timed out%'
        GROUP BY rank
        """, [run_id]).fetchall()
    seen = {r[0] for r in con.execute("SELECT unnest(ranks_seen) FROM runs WHERE run_id = ?", [run_id]).fetchall()}
    waits, unread = {}, set()  # unread: ranks that time out in a send/recv whose peer cannot be read
    for rank, frame, function, code, file, line in rows:
        call, arg = _P2P_CALL.search(code or ""), None
        arg = _PEER_ARG.search(call["args"]) if call else None
        peer = _peer(arg["expr"], rank) if arg else None
        # a peer outside the job (the last stage's "rank + 1") is a reading that went wrong, not a rank
        if peer in seen and peer != rank and rank not in crashed:
            site, _, at = (frame or "").rpartition(":")
            waits[rank] = {"peer": peer, "op": call["op"], "site": frame, "file_path": site,
                           "line_in_file": int(at) if at.isdigit() else None, "function": function,
                           "code": code, "file": file, "line": line}
        elif call:
            unread.add(rank)
    return waits, unread


def p2p_culprits(waits: dict[int, dict], unread: set[int]) -> set[int]:
    """The ranks the send/recv waits point at that did not do their part: waited for and
    waiting for no one, or of two ranks waiting for each other in the same function, the one
    further along it (a later line: the backward recv, past the forward send it skipped)."""
    culprits = set()
    for rank, w in waits.items():
        back = waits.get(w["peer"])
        if back is None:
            if w["peer"] not in unread:
                culprits.add(w["peer"])  # waited for, waiting for no one: it never sent or never received
        elif back["peer"] == rank and back["function"] == w["function"] and back["file_path"] == w["file_path"] \
                and None not in (back["line_in_file"], w["line_in_file"]) and back["line_in_file"] > w["line_in_file"]:
            culprits.add(w["peer"])  # the peer moved on past the point this rank waits for it at
    return culprits


def _point_to_point(con: duckdb.DuckDBPyConnection, run_id: str, crashed: set[int]) -> list[dict]:
    """Ranks that timed out in a send or recv, each waiting for the peer its call names (the
    ``src=``/``dst=`` of the user's line in its traceback). Where two ranks wait for each other,
    the one further along the same function (a later line: the backward recv, past the forward
    send it skipped) is the one that did not send; a rank waited for that waits for no one in
    return is the culprit too."""
    waits, unread = p2p_waits(con, run_id, crashed)
    culprits = p2p_culprits(waits, unread)
    culprits -= crashed
    if not culprits:
        return []
    out = []
    for rank in sorted(culprits):
        waited_by = sorted(r for r, w in waits.items() if w["peer"] == rank)
        first = waits[waited_by[0]]
        own = waits.get(rank)
        where = (f"it waits in {own['op']} at {own['site']} ({own['code'].split('#')[0].strip()})" if own
                 else "it waits for no one there")
        headline = (f"rank {rank} never sent what rank(s) {rank_ranges(waited_by)} wait to {first['op']} from it "
                    f"(at {first['site']}: {first['code'].split('#')[0].strip()})")
        out.append({"rank": rank, "ts": None, "file": (own or first)["file"], "line": (own or first)["line"],
                    "text": where, "where": where, "headline": headline, "culprit": True,
                    "user_line": (own or first)["site"] or "unknown", "waiting": rank_ranges(waited_by),
                    "confidence": 0.8})
    for rank, w in sorted(waits.items()):
        if rank not in culprits:
            out.append({"rank": rank, "ts": None, "file": w["file"], "line": w["line"], "culprit": False,
                        "text": f"rank {rank} waits in {w['op']} for rank {w['peer']} at {w['site']}"})
    return out


def _nccl_ras(con: duckdb.DuckDBPyConnection, run_id: str, crashed: set[int]) -> list[dict]:
    """NCCL RAS's operation counts of a communicator: the ranks that launched the fewest
    operations are behind; the others wait for them in the next one. RAS lists some groups'
    ranks; the behind ranks are named when it listed them, or when it listed all the others
    and the communicator is the whole job (its groups add up to the job's processes)."""
    reports = con.execute("SELECT ts, file, line_no, message, attrs FROM events WHERE run_id = ? "
                          "AND kind = 'ras_mismatch' ORDER BY ts NULLS LAST, file, line_no", [run_id]).fetchall()
    for ts, file, line, message, attrs in reports:
        a = json.loads(attrs)
        groups = sorted(a["groups"], key=lambda g: g["op_count"])
        if len(groups) < 2:
            continue
        behind, ahead = groups[0], groups[1:]
        size = sum(g["count"] for g in groups)
        if len(behind["ranks"]) == behind["count"]:
            culprits = behind["ranks"]
        elif a.get("ranks") == size and all(len(g["ranks"]) == g["count"] for g in ahead):
            culprits = sorted(set(range(size)) - {r for g in ahead for r in g["ranks"]})
        else:
            culprits = []
        culprits = [r for r in culprits if r not in crashed]
        op = a.get("op") or "collective"
        headline = (f"NCCL RAS ({a.get('comm')}): {behind['count']} rank(s) launched {op} operations only up to "
                    f"{behind['op_count']}, while " + ", ".join(f"{g['count']} reached {g['op_count']}" for g in ahead)
                    + (f": rank(s) {rank_ranges(culprits)} never launched the next one" if culprits else
                       ": which ranks are behind RAS did not list"))
        where = "RAS reports where each rank's count stopped, not what the rank was doing: a stack dump shows that"
        common = {"ts": ts, "file": file, "line": line, "text": message, "headline": headline, "where": where,
                  "user_line": "unknown", "waiting": rank_ranges([r for g in ahead for r in g["ranks"]]) or "?",
                  "culprit": True, "confidence": 0.8 if culprits else 0.6}
        return [{**common, "rank": r} for r in culprits] or [{**common, "rank": None}]
    return []


def _store_barrier(con: duckdb.DuckDBPyConnection, run_id: str, crashed: set[int]) -> list[dict]:
    """Ranks waiting for a process group to be created that others never came to (c10d's store
    based barrier: "world_size=8, worker_count=7"). The ranks that never came are named when
    every rank that arrived is seen waiting; otherwise the wait is reported without a culprit."""
    rows = con.execute(
        """
        SELECT attrs->>'key' AS key, max(TRY_CAST(attrs->>'world_size' AS INTEGER)) AS world,
               max(TRY_CAST(attrs->>'worker_count' AS INTEGER)) AS arrived,
               list(DISTINCT TRY_CAST(attrs->>'barrier_rank' AS INTEGER)) AS waiting,
               min(ts) AS ts, arg_min(file, line_no) AS file, min(line_no) AS line, arg_min(message, line_no) AS text
        FROM events WHERE run_id = ? AND kind = 'store_barrier_wait' GROUP BY ALL
        HAVING max(TRY_CAST(attrs->>'worker_count' AS INTEGER)) < max(TRY_CAST(attrs->>'world_size' AS INTEGER))
        ORDER BY ts NULLS LAST, key
        """, [run_id]).fetchall()
    if not rows:
        return []
    key, world, arrived, waiting, ts, file, line, text = rows[0]
    waiting = sorted(r for r in waiting if r is not None)
    absent = sorted(set(range(world)) - set(waiting) - crashed) if len(waiting) == arrived else []
    headline = (f"{arrived} of {world} ranks reached process-group creation ({key}) and wait for the rest"
                + (f": rank(s) {rank_ranges(absent)} never came" if absent else
                   f"; {len(waiting)} of them are seen waiting (rank(s) {rank_ranges(waiting)}), so which "
                   f"{world - arrived} never came is not told"))
    where = ("the rank(s) that never came were not at dist.init_process_group / new_group: their own logs "
             "say where they were")
    common = {"ts": ts, "file": file, "line": line, "headline": headline, "where": where, "user_line": "unknown",
              "waiting": rank_ranges(waiting), "confidence": 0.75 if absent else 0.6}
    if absent:
        return [{**common, "rank": r, "text": text, "culprit": True} for r in absent]
    return [{**common, "rank": None, "text": text, "culprit": True}]


def _silent(con: duckdb.DuckDBPyConnection, run_id: str, crashed: set[int]) -> list[dict]:
    """A hang that left no error line (the default 30-minute timeout, a barrier with none, a job
    killed by the scheduler first): from the stack dumps alone. Ranks whose main thread waits in
    a collective wait for the dumped ranks that are not in one; those are the culprits."""
    stacks = {r: p for r, p in stack_positions(con, run_id).items() if r not in crashed}
    waiting = sorted(r for r, p in stacks.items() if p["collective"])
    elsewhere = sorted(r for r, p in stacks.items() if not p["collective"])
    stopped = con.execute("SELECT max(ts) FROM events WHERE run_id = ? AND kind NOT IN "
                          "('agent_signal', 'agent_failure', 'torchrun_failure')", [run_id]).fetchone()[0]
    sites = {stacks[r]["user_line"] for r in waiting}
    if waiting and not elsewhere and len(waiting) > 1 and len(sites) > 1:
        return _crossed(stacks, waiting, stopped)
    if not waiting or not elsewhere:
        return []
    ops = sorted({stacks[r]["collective"] for r in waiting})
    headline = (f"no error line: the logs stop at {stopped}; rank(s) {rank_ranges(waiting)} wait in "
                f"{' / '.join(ops)} (stack dumps) for rank(s) {rank_ranges(elsewhere)}, which never reached it")
    rows = []
    for rank in elsewhere:
        pos = stacks[rank]
        where = f"it was in {pos['innermost']}, called from {pos['user_line'] or 'no user frame'}"
        rows.append({"rank": rank, "ts": stopped, "file": pos["file"], "line": None, "text": where, "where": where,
                     "user_line": pos["user_line"] or "unknown", "headline": headline, "culprit": True,
                     "waiting": rank_ranges(waiting), "confidence": 0.8})
    for rank in waiting:
        pos = stacks[rank]
        rows.append({"rank": rank, "ts": stopped, "file": pos["file"], "line": None, "culprit": False,
                     "text": f"rank {rank} waits in {pos['collective']}, called from {pos['user_line'] or '?'}"})
    return rows


def _crossed(stacks: dict[int, dict], waiting: list[int], stopped) -> list[dict]:
    """Every dumped rank waits in a collective, but not all from the same call site: they wait in
    different collectives, each for the others (two process groups taken in different orders, a
    rank-conditional collective). The stacks show the call sites, not the groups, so which rank
    took the wrong order is not told: every one of them is named, with what would tell."""
    by_site: dict[str, list[int]] = {}
    for rank in waiting:
        by_site.setdefault(stacks[rank]["user_line"] or "no user frame", []).append(rank)
    places = "; ".join(f"rank(s) {rank_ranges(ranks)} in {stacks[ranks[0]]['collective']} at {site}"
                       for site, ranks in sorted(by_site.items(), key=lambda kv: kv[1]))
    headline = (f"no error line: the logs stop at {stopped}; every rank waits in a collective, from different call "
                f"sites, each for the others (a wait cycle across process groups, or a rank-conditional collective)")
    where = (f"{places}. Which rank took the wrong order the stacks do not say: a flight-recorder dump "
             f"(TORCH_NCCL_DEBUG_INFO_PIPE_FILE on NCCL) or `py-spy dump --locals` shows each call's group")
    return [{"rank": rank, "ts": stopped, "file": stacks[rank]["file"], "line": None, "culprit": True,
             "text": f"rank {rank} waits in {stacks[rank]['collective']} at {stacks[rank]['user_line']}",
             "where": where, "headline": headline, "user_line": stacks[rank]["user_line"] or "unknown",
             "waiting": rank_ranges(waiting), "confidence": 0.5} for rank in waiting]


def _desync_report(con: duckdb.DuckDBPyConnection, run_id: str, crashed: set[int]) -> list[dict]:
    """PyTorch's TORCH_NCCL_DESYNC_DEBUG report: the ranks it names as lagging (that never
    joined any collective, or whose last collective is the lowest any rank reached: "joined but
    didn't finish #L", "finished #L, but didn't join #L+1") are the ones the others wait for."""
    rows = con.execute(
        """
        SELECT attrs->>'what', TRY_CAST(attrs->>'seq' AS BIGINT), attrs->'ranks', ts, file, line_no, message
        FROM events WHERE run_id = ? AND kind = 'desync_report'
          AND attrs->>'what' IN ('never_joined', 'joined_not_finished', 'finished_not_joined')
        ORDER BY attrs->>'what' <> 'never_joined', TRY_CAST(attrs->>'seq' AS BIGINT), file, line_no
        """, [run_id]).fetchall()
    if not rows:
        return []
    what, seq = rows[0][0], rows[0][1]
    same = [r for r in rows if r[0] == what] if what == "never_joined" else \
        [r for r in rows if r[1] == seq and r[0] != "never_joined"]
    named: dict[int, tuple] = {}
    for row in same:
        for rank in json.loads(row[2] or "[]"):
            if isinstance(rank, int) and rank not in crashed:
                named.setdefault(rank, row)
    if not named:
        return []
    timed_out = con.execute(
        "SELECT DISTINCT rank FROM rank_status WHERE run_id = ? AND source = 'desync_report' AND timed_out_seq IS NOT "
        "NULL AND rank IS NOT NULL ORDER BY rank", [run_id]).fetchall()
    waiting = rank_ranges([r[0] for r in timed_out if r[0] not in named]) or "?"
    if what == "never_joined":
        headline = (f"the desync report (TORCH_NCCL_DESYNC_DEBUG) names rank(s) {rank_ranges(sorted(named))} as "
                    f"lagging: they never joined any collective of the group rank(s) {waiting} timed out in")
    else:
        headline = (f"the desync report (TORCH_NCCL_DESYNC_DEBUG) names rank(s) {rank_ranges(sorted(named))} as "
                    f"lagging: their last collective is #{seq}, the lowest any rank reached, while rank(s) {waiting} "
                    f"timed out in a later one")
    stacks = stack_positions(con, run_id)
    out = []
    for rank, (kind, _, _, ts, file, line, message) in sorted(named.items()):
        pos = stacks.get(rank)
        where = (f"it was in {pos['innermost']}, called from {pos['user_line'] or 'no user frame'}" if pos else
                 "the report says where its sequence stopped, not what it was doing: a stack dump shows that")
        out.append({"rank": rank, "ts": ts, "file": file, "line": line, "text": message, "culprit": True,
                    "case": "never_enqueued" if kind != "joined_not_finished" else "never_completed",
                    "headline": headline, "where": where, "user_line": (pos or {}).get("user_line") or "unknown",
                    "waiting": waiting, "confidence": 0.85})
    return out


def _wait_for(found: list[alignment.Disagreement]) -> dict[int, list[tuple[int, alignment.Disagreement]]]:
    """The wait-for graph of the recorded collectives: an edge r -> s, labelled with the
    disagreement, when r waits in a collective of a group that s never issued."""
    edges: dict[int, list[tuple[int, alignment.Disagreement]]] = {}
    for d in found:
        for waiter in d.others:
            edges.setdefault(waiter, []).extend((c, d) for c in d.culprits if c != waiter)
    return edges


def find_cycle(edges: dict[int, list[tuple[int, object]]]) -> list[tuple[int, object]]:
    """One cycle of the graph as [(rank, label of its edge to the next rank), ...], lowest rank
    first; [] when it has none. Iterative depth-first search: a job has thousands of ranks."""
    done: set[int] = set()
    for start in sorted(edges):
        if start in done:
            continue
        path, on_path, todo = [], {}, [(start, iter(edges.get(start, [])))]
        on_path[start] = 0
        while todo:
            node, out = todo[-1]
            step = next(out, None)
            if step is None:
                todo.pop()
                on_path.pop(node, None)
                done.add(node)
                if path:
                    path.pop()
                continue
            peer, label = step
            if peer in on_path:
                cycle = (path + [(node, label)])[on_path[peer]:]
                low = min(range(len(cycle)), key=lambda i: cycle[i][0])
                return cycle[low:] + cycle[:low]
            if peer not in done:
                path.append((node, label))
                on_path[peer] = len(path)
                todo.append((peer, iter(edges.get(peer, []))))
    return []


def _order_keys(con: duckdb.DuckDBPyConnection, run_id: str, ranks: list[int]) -> dict[int, list[tuple]]:
    """Each of ``ranks``' recorded collectives over all its groups, in the order it issued them
    (its dump's entry order): (position, group, op family, elements in)."""
    rows = con.execute(
        "SELECT rank, line_no, pg, op, numel_in FROM collectives WHERE run_id = ? AND source = 'flight_recorder' "
        "AND list_contains(?, rank) AND line_no IS NOT NULL ORDER BY rank, file, line_no", [run_id, ranks]).fetchall()
    out: dict[int, list[tuple]] = {}
    for rank, position, pg, op, numel in rows:
        out.setdefault(rank, []).append((position, pg, alignment.op_family(op), numel))
    return out


def _left_the_order(order: list[tuple], call: alignment.Call | None) -> tuple | None:
    """What the rank's own history issues next where it stands (the last time its recent calls
    were the same), when its waiting call is something else: it took its groups in another order."""
    if call is None or call.line is None:
        return None
    history = [k[1:] for k in order if k[0] < call.line]
    mine = next((k[1:] for k in order if k[0] == call.line), None)
    usual = alignment.expected_next(history)
    return usual if usual is not None and mine is not None and usual != mine else None


def _group_name(pg: str | None, descs: dict[str, str]) -> str:
    return f"process group {pg}" + (f" ({descs[pg]})" if pg in descs else "")


def _cycle(con: duckdb.DuckDBPyConnection, run_id: str, waits: list[alignment.Disagreement],
           crashed: set[int]) -> list[dict]:
    """Ranks that wait in collectives of different groups, each for a rank that waits in the
    other's group: a cycle (two groups taken in different orders). The cycle's ranks, groups
    and call sites are named; the culprit is the rank whose waiting call is not what its own
    history issues at that point (it took the groups in the other order), when the records
    single it out, else every rank of the cycle."""
    cycle = find_cycle(_wait_for([d for d in waits if not set(d.culprits) & crashed]))
    if not cycle:
        return []
    sites = alignment.call_sites(con, run_id)
    stacks = stack_positions(con, run_id)
    orders = _order_keys(con, run_id, sorted({rank for rank, _ in cycle}))
    links = []
    for (rank, d), (peer, _) in zip(cycle, cycle[1:] + cycle[:1]):
        call = d.calls.get(rank)
        site = alignment.site_of(sites, call) or (stacks.get(rank) or {}).get("user_line") or "an unknown call site"
        links.append({"rank": rank, "peer": peer, "d": d, "call": call, "site": site,
                      "usual": _left_the_order(orders.get(rank, []), call)})
    descs = alignment.group_descs(con, run_id)
    left = [x for x in links if x["usual"] is not None]
    culprits = left if left and len(left) < len(links) else links
    groups = {x["d"].pg: x["d"].group for x in links}
    ranks = sorted({r for x in links for r in (*x["d"].others, *x["d"].culprits)})
    chain = "; ".join(f"rank {x['rank']} waits in {x['d'].op or 'a collective'} sequence {x['d'].seq} of "
                      f"{x['d'].group} at {x['site']} for rank {x['peer']}" for x in links)
    headline = (f"a wait cycle across {len(groups)} process groups ({', '.join(groups.values())}): ranks "
                f"{rank_ranges(ranks)} wait for each other in collectives of different groups ({chain})")
    if culprits is left:
        where = "; ".join(
            f"rank {x['rank']} took the groups in another order: at that point its own history (every step "
            f"before) issues {x['usual'][1] or 'a collective'} on {_group_name(x['usual'][0], descs)} next, it issued "
            f"{x['d'].op or 'a collective'} on {x['d'].group} at {x['site']}" for x in left)
    else:
        where = ("every rank of the cycle issued what its own history issues next, so which one took the other "
                 "order is not told: make every rank call the groups' collectives in one order")
    out = []
    for x in culprits:
        pos = stacks.get(x["rank"]) or {}
        call = x["call"]
        out.append({"rank": x["rank"], "ts": call.ts if call else None, "file": call.file if call else pos.get("file"),
                    "line": call.line if call else None, "culprit": True, "case": "cycle",
                    "text": f"rank {x['rank']}: {call.describe() if call else 'a collective'} sequence "
                            f"{x['d'].seq} on {x['d'].group}, waiting for rank {x['peer']}, at {x['site']}",
                    "headline": headline, "where": where, "user_line": x["site"],
                    "waiting": rank_ranges(ranks), "groups": "; ".join(groups.values()),
                    "confidence": 0.85 if culprits is left else 0.6})
    for x in links:
        if x not in culprits:
            call = x["call"]
            out.append({"rank": x["rank"], "ts": call.ts if call else None, "file": call.file if call else None,
                        "line": call.line if call else None, "culprit": False,
                        "text": f"rank {x['rank']}: {call.describe() if call else 'a collective'} sequence "
                                f"{x['d'].seq} on {x['d'].group}, waiting for rank {x['peer']}, at {x['site']}"})
    return out


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    everything = alignment.analyze(con, run_id)
    # The first disagreement in a group is the root: ranks that part ways at sequence 2 (a
    # mismatch) and then wait for each other at 3 have a mismatch, not a hang.
    first_mismatch = {d.pg: d.seq for d in everything if d.kind == "mismatch" and d.source == "flight_recorder"}
    found = [d for d in everything if d.kind in _KINDS and d.seq < first_mismatch.get(d.pg, d.seq + 1)]
    # A rank that died of its own failure never issued what came after: rank-crash's case.
    crashed = {e["rank"] for e in endings(con, run_id)
               if not e["consequence"] and e["ended"] != "no failure recorded"}
    found = [replace(d, culprits=[r for r in d.culprits if r not in crashed]) if d.kind == "never_enqueued" else d
             for d in found]
    found = [d for d in found if d.culprits]
    if found:
        return _aligned(con, run_id, found)
    cycle = _cycle(con, run_id, [d for d in everything if d.kind == "never_enqueued_waiting_elsewhere"], crashed)
    if cycle:
        return cycle
    analyzed = (_from_analyzer(con, run_id, crashed) or _desync_report(con, run_id, crashed)
                or _point_to_point(con, run_id, crashed)
                or _store_barrier(con, run_id, crashed) or _nccl_ras(con, run_id, crashed))
    if analyzed:
        return analyzed
    timed_out, missing = stuck_elsewhere(con, run_id)
    if not timed_out:
        return _silent(con, run_id, crashed)
    if not missing:
        return []
    stacks = stack_positions(con, run_id)
    rows = []
    waiting = ", ".join(str(r) for r in sorted(timed_out))
    for m in missing:
        pos = stacks.get(m["rank"])
        if pos and pos["collective"]:
            continue  # it reached a collective, another one: collective-mismatch's case
        last = m["last_event"] or {}
        headline = f"rank {m['rank']} never reached the collective that rank(s) {waiting} timed out in"
        if pos:
            where = f"it was in {pos['innermost']}, called from {pos['user_line'] or 'no user frame'}"
            rows.append({"rank": m["rank"], "ts": last.get("ts"), "file": pos["file"], "line": None,
                         "text": where, "where": where, "user_line": pos["user_line"] or "unknown",
                         "headline": headline, "culprit": True, "confidence": 0.9})
        else:
            where = (f"it was somewhere no stack dump shows; its last log line was at {last.get('ts')}: "
                     f"{(last.get('text') or '')[:200]}")
            rows.append({"rank": m["rank"], "ts": last.get("ts"), "file": last.get("file"), "line": last.get("line"),
                         "text": last.get("text"), "where": where, "user_line": "unknown", "headline": headline,
                         "culprit": True, "confidence": 0.75})
    if not rows:
        return []
    for row in rows:
        row["waiting"] = waiting
    for t in timed_out.values():
        rows.append({**t, "culprit": False})
    return rows

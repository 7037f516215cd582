"""Line up every rank's collectives by (process group, sequence number) and find where they part.

Sources are aligned within their own numbering: the flight recorder and the watchdog share
ProcessGroupNCCL's sequence numbers per group (``flight_recorder`` rows first, a
``watchdog`` row where a rank left no dump); TORCH_DISTRIBUTED_DEBUG=DETAIL fingerprints
(``detail``) use the wrapper's own count; NCCL COLL lines (``nccl_log``) number calls per
communicator. What comes out, per process group:

- ``never_enqueued``: other ranks wait in sequence S, a member rank with a dump (or a
  watchdog status line) never issued it: it was somewhere else (Python, data loading, a
  held GIL). Not when that rank is itself waiting in a collective: then it is a symptom.
- ``never_completed``: a rank issued S and never completed it, while a peer completed
  it: its GPU or its NCCL kernel stopped (the peer could only complete S with its data).
- ``mismatch``: at the same S ranks disagree on the op family, the element counts (with
  all-gather's ``out == size * in`` and reduce-scatter's ``in == size * out``, for the
  ``_all_gather_base`` / ``all_gather_into_tensor`` spellings that torchfrtrace misses),
  or the dtypes.
- ``stuck``: every member issued S, none completed it, no rank is missing or behind.

A group is compared only when its numbering is consistent: no rank completed a sequence
another rank never issued (``max(completed) <= min(enqueued)``), and no point-to-point op
shares its counters (batched send/recv advance them unevenly per pipeline stage).
Checks read tables only; rendering is the signatures' business.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass, field

import duckdb

from postmortem.ranges import rank_ranges

from . import once
from .common import NOT_USER_SQL

PG_SOURCES = ("flight_recorder", "watchdog")
# How far a rank's "completed" may run past another rank's "enqueued" and still be a failed
# or timed-out work counted as completed, not a numbering the ranks don't share.
_IN_FLIGHT = 8

# Op spellings of every source -> one family. Variants that move the same bytes
# (all_gather vs _all_gather_base) are one family: NCCL runs them as the same call.
_FAMILIES = {
    "allreduce": "all_reduce", "allreducecoalesced": "all_reduce", "allreducesparse": "all_reduce",
    "allreducebarrier": "barrier", "barrier": "barrier",
    "allgather": "all_gather", "allgatherbase": "all_gather", "allgatherintotensor": "all_gather",
    "allgatherintotensorcoalesced": "all_gather", "allgathercoalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter", "reducescattertensorcoalesced": "reduce_scatter",
    "broadcast": "broadcast", "broadcastoop": "broadcast", "reduce": "reduce", "reduceoop": "reduce",
    "alltoall": "all_to_all", "alltoallbase": "all_to_all", "alltoallsingle": "all_to_all", "alltoallv": "all_to_all",
    "gather": "gather", "scatter": "scatter", "send": "p2p", "recv": "p2p", "recvanysource": "p2p",
    "sendrecv": "p2p", "coalesced": "coalesced",
}


@functools.lru_cache(maxsize=1024)  # a job has a handful of op names and asks about each thousands of times
def op_family(op: str | None) -> str | None:
    if not op:
        return None
    key = op.split(":")[-1].lower().replace("_", "")  # "nccl:_all_gather_base", "gloo:all_gather", "ALLGATHER"
    return _FAMILIES.get(key, key)


@dataclass
class Call:
    """One rank's view of one collective."""
    rank: int
    source: str
    op: str | None
    numel_in: int | None
    numel_out: int | None
    dtypes: str | None
    state: str | None
    file: str | None
    line: int | None
    ts: object = None

    @property
    def family(self) -> str | None:
        return op_family(self.op)

    def describe(self) -> str:
        sizes = []
        if self.numel_in is not None:
            sizes.append(f"{self.numel_in} in")
        if self.numel_out is not None and self.numel_out != self.numel_in:
            sizes.append(f"{self.numel_out} out")
        dtype = _dtype_text(self.dtypes)
        return f"{self.op or '?'}" + (f" ({', '.join(sizes)}{', ' + dtype if dtype else ''})" if sizes or dtype else "")


@dataclass
class Disagreement:
    kind: str  # never_enqueued, never_completed, mismatch, stuck
    source: str  # the numbering: flight_recorder/watchdog ("pg"), detail, nccl_log
    pg: str | None
    desc: str | None
    seq: int
    op: str | None
    culprits: list[int]
    others: list[int]  # the ranks waiting (hang), agreeing (mismatch), all (stuck)
    detail: str
    calls: dict[int, Call] = field(default_factory=dict)

    @property
    def group(self) -> str:
        if self.pg is None:
            return "the default group" if self.source == "detail" else "an unnamed group"
        if self.source == "nccl_log":
            return f"NCCL communicator {self.pg}"
        return f"process group {self.pg}" + (f" ({self.desc})" if self.desc else "")


def _dtype_doc(dtypes: str | None):
    """The dtypes column decoded: {"in": [...], "out": [...]}, a plain list, or the raw text."""
    if not dtypes:
        return None
    try:
        return json.loads(dtypes)
    except json.JSONDecodeError:
        return dtypes


def _dtype_text(dtypes: str | None) -> str | None:
    parsed = _dtype_doc(dtypes)
    if isinstance(parsed, str):
        return parsed
    values = parsed.get("in") or parsed.get("out") if isinstance(parsed, dict) else parsed
    return ", ".join(dict.fromkeys(str(v) for v in values)) if isinstance(values, list) and values else None


@functools.lru_cache(maxsize=4096)
def _in_dtypes(dtypes: str | None) -> tuple | None:
    """The input dtypes a collective's ``dtypes`` names (a job's collectives name a few, each
    decoded once: 64 ranks' 1,900 collectives, the alignment 24.5 -> 22 ms)."""
    parsed = _dtype_doc(dtypes)
    values = parsed.get("in") if isinstance(parsed, dict) else None
    return tuple(values) if isinstance(values, list) and values else None


def _fmt(ranks) -> str:
    return rank_ranges(list(ranks))


# ---------------------------------------------------------------- loading


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _groups(con, run_id) -> tuple[dict[str, set[int]], dict[str, str]]:
    members: dict[str, set[int]] = defaultdict(set)
    descs: dict[str, str] = {}
    for pg, desc, ranks in con.execute(
            "SELECT attrs->>'pg', attrs->>'desc', attrs->>'ranks' FROM events WHERE run_id = ? AND kind = 'pg_config'",
            [run_id]).fetchall():
        try:
            parsed = json.loads(ranks) if ranks else None
        except json.JSONDecodeError:
            parsed = None
        if pg is not None and isinstance(parsed, list):
            members[pg] |= {r for r in parsed if isinstance(r, int)}
        if pg is not None and desc:
            descs[pg] = desc
    return members, descs


def group_descs(con, run_id) -> dict[str, str]:
    """Process group -> the desc its records give ("grads" for ``new_group(group_desc="grads")``)."""
    return _groups(con, run_id)[1]


def _all_ranks(con, run_id) -> set[int]:
    ranks = {r[0] for r in con.execute(
        """SELECT DISTINCT rank FROM (SELECT rank FROM files WHERE run_id = $1 UNION ALL
                                        SELECT rank FROM collectives WHERE run_id = $1 UNION ALL
                                        SELECT rank FROM rank_status WHERE run_id = $1) WHERE rank IS NOT NULL""",
        [run_id]).fetchall()}
    size = con.execute("SELECT max(world_size) FROM runs WHERE run_id = ?", [run_id]).fetchall()[0]
    if size and size[0] and ranks and size[0] > max(ranks):
        ranks |= set(range(size[0]))
    return ranks


def _calls(con, run_id, sources: tuple[str, ...]) -> dict[tuple, dict[int, Call]]:
    """(pg, seq) -> rank -> the rank's call, the first source in ``sources`` winning."""
    rows = _rows(con, f"""
        SELECT DISTINCT rank, source, pg, seq_id, op, numel_in, numel_out, dtypes, state, file, line_no, t_created
        FROM collectives
        WHERE run_id = $1 AND rank IS NOT NULL AND seq_id IS NOT NULL
          AND source IN ({', '.join("'" + s + "'" for s in sources)})
        ORDER BY rank, seq_id, file, line_no
        """, [run_id])
    order = {s: i for i, s in enumerate(sources)}
    out: dict[tuple, dict[int, Call]] = defaultdict(dict)
    for r in rows:
        key = (r["pg"], r["seq_id"])
        have = out[key].get(r["rank"])
        call = Call(r["rank"], r["source"], r["op"], r["numel_in"], r["numel_out"], r["dtypes"], r["state"],
                    r["file"], r["line_no"], r["t_created"])
        if have is None or order[call.source] < order[have.source]:
            if have is not None:  # keep what the better source lacks (the watchdog's numel)
                call.numel_in = call.numel_in if call.numel_in is not None else have.numel_in
                call.numel_out = call.numel_out if call.numel_out is not None else have.numel_out
            out[key][r["rank"]] = call
    return out


def _status(con, run_id) -> dict[tuple[str, int], dict]:
    # A recorder whose counter runs past every sequence it recorded counted operations it did not
    # record (gloo's send/recv: last_enqueued_collective 20 with collectives 1-4 recorded); a rank
    # that sends and receives more counts more, so such a counter says nothing across ranks.
    rows = _rows(con, """
        WITH recorded AS (
            SELECT pg, rank, max(seq_id) AS seq FROM collectives
            WHERE run_id = $1 AND source = 'flight_recorder' GROUP BY pg, rank
        )
        SELECT s.pg, s.rank, max(last_enqueued) AS enq, max(last_completed) AS done, min(timed_out_seq) AS timed_out,
               arg_min(s.file, s.line_no) AS file, min(s.line_no) AS line
        FROM rank_status s LEFT JOIN recorded r ON r.pg = s.pg AND r.rank = s.rank
        WHERE s.run_id = $1 AND s.rank IS NOT NULL AND s.pg IS NOT NULL
          AND NOT (s.source = 'flight_recorder' AND r.seq IS NOT NULL AND s.last_enqueued > r.seq)
        GROUP BY s.pg, s.rank
        """, [run_id])
    return {(r["pg"], r["rank"]): r for r in rows}


def _dumped(con, run_id) -> set[int]:
    return {r[0] for r in con.execute(
        "SELECT DISTINCT rank FROM files WHERE run_id = ? AND kind = 'flight_recorder' AND status <> 'skipped' "
        "AND rank IS NOT NULL", [run_id]).fetchall()}


# ---------------------------------------------------------------- comparing one sequence number


def _numel_rule(call: Call, size: int | None) -> str | None:
    """The per-rank size rule of all-gather / reduce-scatter, when both counts are known."""
    if size is None or call.numel_in is None or call.numel_out is None:
        return None
    if call.family == "all_gather" and call.numel_out != size * call.numel_in:
        return f"output numel {call.numel_out} != {size} ranks x input numel {call.numel_in}"
    if call.family == "reduce_scatter" and call.numel_in != size * call.numel_out:
        return f"input numel {call.numel_in} != {size} ranks x output numel {call.numel_out}"
    return None


def _split(calls: dict[int, Call], key) -> list[list[int]] | None:
    """Ranks grouped by ``key`` (None values ignored); None when they all agree."""
    groups: dict = defaultdict(list)
    for rank, call in calls.items():
        value = key(call)
        if value is not None:
            groups[value].append(rank)
    return sorted(groups.values(), key=lambda g: (len(g), g)) if len(groups) > 1 else None


def _minority(groups: list[list[int]]) -> list[int]:
    """The smaller side; both sides when they are the same size (intent decides which is wrong)."""
    if len(groups[0]) < len(groups[1]):
        return sorted(groups[0])
    return sorted(r for g in groups for r in g)


def compare(calls: dict[int, Call], size: int | None) -> tuple[str, list[int], str] | None:
    """(what differs, culprit ranks, detail) for one sequence number, or None when the ranks agree."""
    families = _split(calls, lambda c: c.family)
    if families:
        sides = "; ".join(f"rank(s) {_fmt(g)}: {calls[g[0]].describe()}" for g in families)
        return "op", _minority(families), f"different collectives: {sides}"
    family = next(iter(calls.values())).family
    rules = {r: why for r, c in calls.items() if (why := _numel_rule(c, size))}
    if len(rules) == len(calls):
        rules = {}  # every rank breaks it alike: the group's size we inferred is what is wrong
    if family not in ("all_to_all", "p2p", "barrier", "gather", "scatter", "coalesced", None):
        for what, key in (("input", lambda c: c.numel_in), ("output", lambda c: c.numel_out)):
            split = _split(calls, key)
            if split:
                culprits = sorted(rules) if rules else _minority(split)
                sides = "; ".join(f"rank(s) {_fmt(g)}: {key(calls[g[0]])}" for g in split)
                why = "".join(f"; rank {r}: {rule}" for r, rule in sorted(rules.items()))
                return "size", culprits, f"{calls[split[0][0]].op} {what} numel differs: {sides}{why}"
    if rules:
        return "size", sorted(rules), "; ".join(f"rank {r}: {calls[r].op} {why}" for r, why in sorted(rules.items()))
    dtypes = _split(calls, lambda c: _in_dtypes(c.dtypes))
    if dtypes:
        sides = "; ".join(f"rank(s) {_fmt(g)}: {_dtype_text(calls[g[0]].dtypes)}" for g in dtypes)
        return "dtype", _minority(dtypes), f"{calls[dtypes[0][0]].op} dtypes differ: {sides}"
    return None


# ---------------------------------------------------------------- per source


def _mismatches(by_seq: dict[tuple, dict[int, Call]], source: str, sizes: dict, descs: dict,
                skip: set) -> list[Disagreement]:
    """The first sequence number per group where the ranks that issued it disagree."""
    found: dict = {}
    for (pg, seq), calls in sorted(by_seq.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if pg in found or pg in skip or len(calls) < 2:
            continue
        if any(c.family in ("p2p", "coalesced") for c in calls.values()):
            continue
        diff = compare(calls, sizes.get(pg))
        if diff:
            what, culprits, detail = diff
            found[pg] = Disagreement("mismatch", source, pg, descs.get(pg), seq, next(iter(calls.values())).op,
                                     culprits, sorted(set(calls) - set(culprits)), f"{what}: {detail}", calls)
    return list(found.values())


def _progress(pg: str, ranks: set[int], seqs: dict[int, dict[int, Call]], status: dict) -> dict[int, dict]:
    """Per rank of the group: last issued and last completed sequence, and what it waits in."""
    out = {}
    for rank in ranks:
        s = status.get((pg, rank), {})
        enq, done = s.get("enq"), s.get("done")
        waiting = []
        for seq, calls in seqs.items():
            c = calls.get(rank)
            if c is None or c.family == "p2p":
                continue
            enq = seq if enq is None else max(enq, seq)
            if c.state == "completed":
                done = seq if done is None else max(done, seq)
            elif c.state in ("scheduled", "started", "timed_out", "failed"):
                waiting.append(seq)
        # An entry the status counts as completed is (gloo's recorder never marks entries completed).
        waiting = sorted(seq for seq in waiting if done is None or seq > done)
        out[rank] = {"enq": enq, "done": done, "waiting": waiting, "status": s}
    return out


def _troubled(con, run_id) -> bool:
    """Did anything in the run fail, time out or get signalled?"""
    return con.execute(
        """SELECT EXISTS (SELECT 1 FROM failures WHERE run_id = $1)
               OR EXISTS (SELECT 1 FROM events WHERE run_id = $1 AND kind IN
                          ('watchdog_timeout', 'exception', 'terminate', 'fatal', 'agent_signal'))""",
        [run_id]).fetchall()[0][0]


def _hangs(con, run_id, calls_by_seq, members, descs) -> list[Disagreement]:
    status = _status(con, run_id)
    troubled = None
    dumped = _dumped(con, run_id)
    everyone = _all_ranks(con, run_id)
    by_pg: dict[str, dict[int, dict[int, Call]]] = defaultdict(dict)
    for (pg, seq), calls in calls_by_seq.items():
        by_pg[pg][seq] = calls
    pgs = set(by_pg) | {pg for pg, _ in status} | set(members)
    p2p_groups = {pg for pg, seqs in by_pg.items()
                  if any(c.family in ("p2p", "coalesced") for calls in seqs.values() for c in calls.values())}
    found: list[Disagreement] = []
    waiting_anywhere: dict[int, list[tuple]] = defaultdict(list)
    views = {}
    for pg in pgs:
        if pg is None:
            continue
        group = members.get(pg) or (everyone if pg == "0" else set())
        known = {r for (g, r) in status if g == pg} | {r for calls in by_pg.get(pg, {}).values() for r in calls}
        group = group | known
        progress = _progress(pg, known, by_pg.get(pg, {}), status)
        views[pg] = (group, progress)
        for rank, p in progress.items():
            if p["enq"] is not None and (p["done"] is None or p["enq"] > p["done"]):
                waiting_anywhere[rank].append((pg, (p["done"] or 0) + 1))
            for seq in p["waiting"]:
                waiting_anywhere[rank].append((pg, seq))
    for pg, (group, progress) in views.items():
        if pg in p2p_groups:
            continue
        enqs = [p["enq"] for p in progress.values() if p["enq"] is not None]
        dones = [p["done"] for p in progress.values() if p["done"] is not None]
        if not enqs:
            continue
        # A rank can't complete a collective another never issued. A few past it: a backend
        # that counts a work that failed or timed out as completed (gloo). Far past it: the
        # ranks don't share the numbering; nothing can be said.
        consistent = not dones or max(dones) <= min(enqs)
        if not consistent and max(dones) - min(enqs) > _IN_FLIGHT:
            continue
        if consistent:
            low = min((p["done"] or 0) for p in progress.values()) + 1
        else:
            low = min(enqs) + 1
        if low > max(enqs):
            continue  # nothing in flight
        issued = {r for r, p in progress.items() if p["enq"] is not None and p["enq"] >= low}
        calls = calls_by_seq.get((pg, low), {})
        op_call = next(iter(calls.values()), None)
        if op_call is not None and op_call.family in ("p2p", "coalesced"):
            continue
        someone_done = max((q["done"] or 0) for q in progress.values()) >= low
        laggards = consistent and someone_done and sorted(r for r, p in progress.items()
                                                          if r in issued and (p["done"] or 0) < low)
        if min(enqs) == max(enqs) and (low == max(enqs) or max(dones, default=0) >= max(enqs)):
            # Every rank issued the same last collective, and either it is the only one in flight
            # or a rank completed it (so every rank took part in it): in a run where nothing
            # failed, the others' completions just weren't recorded yet when they dumped (gloo
            # marks one after the call returns; under torch 2.9.1 a rank's completion dump was seen
            # two behind its peer's), which is no hang. Several in flight that no rank completed
            # (a 16-rank job's groups six collectives behind, every rank stalled) stay judged.
            troubled = _troubled(con, run_id) if troubled is None else troubled
            if not troubled:
                continue
        if laggards:
            done_by = sorted(r for r, p in progress.items() if (p["done"] or 0) >= low)
            found.append(Disagreement(
                "never_completed", "flight_recorder", pg, descs.get(pg), low, op_call.op if op_call else None,
                laggards, done_by,
                f"rank(s) {_fmt(laggards)} issued sequence {low} "
                f"({op_call.describe() if op_call else 'op not recorded'}) and never completed it, while rank(s) "
                f"{_fmt(done_by)} completed it", {r: calls[r] for r in laggards if r in calls}))
            continue
        # Members that left evidence (a dump, a status line) but never issued `low`.
        evidenced = {r for r in group if r in dumped or r in progress}
        missing = sorted(r for r in evidenced - issued)
        waiting = sorted(issued - {r for r, p in progress.items() if consistent and (p["done"] or 0) >= low})
        if missing and waiting:
            found.append(Disagreement(
                "never_enqueued", "flight_recorder", pg, descs.get(pg), low, op_call.op if op_call else None,
                missing, waiting,
                f"rank(s) {_fmt(missing)} never issued sequence {low} "
                f"({op_call.describe() if op_call else 'op not recorded'}) that rank(s) {_fmt(waiting)} wait in",
                calls))
        elif waiting and group <= evidenced and set(waiting) >= group:
            found.append(Disagreement(
                "stuck", "flight_recorder", pg, descs.get(pg), low, op_call.op if op_call else None, [], waiting,
                f"every rank with a record ({_fmt(waiting)}) issued sequence {low} "
                f"({op_call.describe() if op_call else 'op not recorded'}) and none completed it", calls))
    # A rank missing from one group while it waits in a collective of another is held up
    # there: a symptom. The root is the rank that waits in nothing.
    for d in found:
        if d.kind == "never_enqueued":
            roots = [r for r in d.culprits if not waiting_anywhere.get(r)]
            if roots:
                d.culprits = roots
            else:
                d.kind = "never_enqueued_waiting_elsewhere"
    return found


def _direct_calls(con: duckdb.DuckDBPyConnection, run_id: str, d: Disagreement) -> set[int]:
    """Ranks whose call the user's code made itself (a frame of theirs right above
    torch.distributed's), not through autograd (DDP's gradient all-reduce), by the
    flight recorder's frames of the entry."""
    direct = set()
    for rank, call in d.calls.items():
        frames = con.execute(
            f"""SELECT depth, function, file, ({NOT_USER_SQL}) AS mine FROM stacks
                WHERE run_id = ? AND source = 'flight_recorder' AND origin = ? AND origin_line = ?
                ORDER BY depth""", [run_id, call.file, call.line]).fetchall()
        if not frames or any(f in ("backward", "_engine_run_backward") for _, f, _, _ in frames):
            continue
        c10d = max((depth for depth, _, file, _ in frames if file.endswith("distributed_c10d.py")), default=None)
        user = min((depth for depth, _, _, mine in frames if mine), default=None)
        if c10d is not None and user is not None and 0 < user - c10d <= 3:
            direct.add(rank)
    return direct


def _key(call: Call) -> tuple:
    return (call.family, call.numel_in, call.numel_out, _in_dtypes(call.dtypes))


def expected_next(history: list[tuple], context: int = 4) -> tuple | None:
    """What the sequence issued next the last time it stood where it stands now: the latest
    earlier point whose preceding ``context`` (down to 1) calls equal the last ones of
    ``history``. Training loops repeat their collectives every step, so this is the call a
    rank on the usual path issues next."""
    for width in range(min(context, len(history) - 1), 0, -1):
        tail = history[-width:]
        for end in range(len(history) - 1, width - 1, -1):
            if history[end - width:end] == tail:
                return history[end]
    return None


def _agreed_history(by_seq: dict[tuple, dict[int, Call]], pg, seq: int) -> list[tuple]:
    """The group's calls before ``seq`` where every rank that issued them agreed, in order."""
    out = []
    for (g, s), calls in sorted(((k, v) for k, v in by_seq.items() if k[0] == pg and k[1] < seq),
                                key=lambda kv: kv[0][1]):
        keys = {_key(c) for c in calls.values()}
        if len(keys) == 1:
            out.append(keys.pop())
    return out


def _break_ties(con: duckdb.DuckDBPyConnection, run_id: str, found: list[Disagreement],
                by_source: dict[str, dict[tuple, dict[int, Call]]]) -> None:
    """Two equal sides (no majority): the odd side is the one that left the loop's usual
    path: its call is not what the sequence issued the last time it stood at the same point
    (a shard of another size, a bf16 metric, a skipped FSDP all-gather). Else, for different
    ops, the side the user's code calls directly (a barrier under `if rank == 0:`), not DDP's
    all-reduce that every rank runs."""
    for d in found:
        if d.kind != "mismatch" or not d.culprits or d.others:
            continue
        usual = expected_next(_agreed_history(by_source.get(d.source, {}), d.pg, d.seq))
        if usual is not None:
            on_path = {r for r, c in d.calls.items() if _key(c) == usual}
            if on_path and on_path != set(d.calls):
                d.others, d.culprits = sorted(on_path), sorted(set(d.calls) - on_path)
                continue
        if d.detail.startswith("op"):
            direct = _direct_calls(con, run_id, d)
            if direct and direct != set(d.culprits):
                d.others, d.culprits = sorted(set(d.culprits) - direct), sorted(direct)


def call_sites(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[tuple[str, int], str]:
    """(dump file, entry) -> the user's innermost frame (file:line) of a flight-recorder entry's stack."""
    rows = con.execute(
        f"""
        SELECT origin, origin_line, arg_min(file || ':' || line, depth)
        FROM stacks WHERE run_id = ? AND source = 'flight_recorder' AND line IS NOT NULL AND {NOT_USER_SQL}
        GROUP BY origin, origin_line
        """, [run_id]).fetchall()
    return {(origin, line): site for origin, line, site in rows}


def site_of(sites: dict[tuple[str, int], str], call: Call | None) -> str | None:
    """Where the user's code issued ``call``: its dump entry's frames, or for a watchdog line
    the "Stack trace of the failed collective" printed right after it."""
    if call is None or call.file is None:
        return None
    if (call.file, call.line) in sites:
        return sites[(call.file, call.line)]
    if call.source == "watchdog" and call.line is not None:
        near = [(line, site) for (f, line), site in sites.items()
                if f == call.file and line is not None and call.line < line <= call.line + 20]
        return min(near)[1] if near else None
    return None


def first_site(sites: dict[tuple[str, int], str], calls) -> str | None:
    return next((site for c in calls if (site := site_of(sites, c))), None)


def analyze(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Disagreement]:
    """Every disagreement the run's collectives show, the most telling first (computed once
    per matching: see ``checks.shared_results``; don't change what it returns). Keyed by the run:
    the checks of one matching read its one database, each perhaps on a cursor of its own."""
    return list(once(("collective_alignment", run_id), lambda: _analyze(con, run_id)))


def _analyze(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Disagreement]:
    members, descs = _groups(con, run_id)
    everyone = _all_ranks(con, run_id)
    sizes = {pg: len(r) for pg, r in members.items()}
    if everyone:
        sizes.setdefault("0", len(everyone))
    pg_calls = _calls(con, run_id, PG_SOURCES)
    out = _hangs(con, run_id, pg_calls, members, descs)
    out += _mismatches(pg_calls, "flight_recorder", sizes, descs, set())
    detail = {(None, seq): calls for (_, seq), calls in _calls(con, run_id, ("detail",)).items()}
    out += _mismatches(detail, "detail", {None: len(everyone) or None}, {}, set())
    nccl = _calls(con, run_id, ("nccl_log",))
    out += _mismatches(nccl, "nccl_log", {}, {}, set())
    _break_ties(con, run_id, out, {"flight_recorder": pg_calls, "detail": detail, "nccl_log": nccl})
    # NCCL checks no sizes: a mismatched collective can complete on one side and not the
    # other. That is the mismatch showing, not a stalled GPU.
    mismatched = {(d.pg, d.seq) for d in out if d.kind == "mismatch" and d.source == "flight_recorder"}
    out = [d for d in out if not (d.kind == "never_completed" and (d.pg, d.seq) in mismatched)]
    order = {"mismatch": 0, "never_completed": 1, "never_enqueued": 2, "stuck": 3, "never_enqueued_waiting_elsewhere": 4}
    return sorted(out, key=lambda d: (order[d.kind], d.seq))


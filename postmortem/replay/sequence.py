"""Each rank's recorded collective sequence, rebuilt from a run's ``collectives`` table.

Pure data, no torch: the flight recorder first (it has sizes, dtypes and state), then
NCCL's COLL lines, the watchdog's and DETAIL's lines, the profiler. A plan is what the
replay issues: per rank, the ops of the replayed window in order, and the divergence the
log analysis saw (the first sequence number where ranks disagree).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace

import duckdb

from postmortem.checks.collective_alignment import call_sites, op_family
from postmortem.checks.common import NOT_USER_SQL
from postmortem.ranges import rank_ranges

SOURCE_ORDER = ["flight_recorder", "nccl_log", "watchdog", "detail", "profiler"]
WINDOW = 8  # replay this many collectives before the divergence: enough to line the ranks up


@dataclass(frozen=True)
class Op:
    pg: str
    seq: int
    op: str
    in_numel: int
    out_numel: int
    dtype: str
    source: str
    file: str | None = None  # the record it came from (a dump and its entry), for its call site
    line: int | None = None
    peer: int | None = None  # a send's dst / a recv's src

    def key(self) -> tuple:
        return (self.op, self.in_numel, self.out_numel, self.dtype)


@dataclass
class Plan:
    world_size: int
    sequences: dict[int, list[Op]]  # replayed rank -> its ops, in order
    pg: str
    first_seq: int
    divergence: int | None  # the first seq where the recorded ranks disagree (or one is missing)
    culprits: list[int]
    kind: str  # "missing", "mismatch", "stuck" (all agree) or "none"
    folded: dict[int, list[int]] = field(default_factory=dict)  # replayed rank -> original ranks it stands for
    notes: list[str] = field(default_factory=list)
    groups: dict[str, list[int]] = field(default_factory=dict)  # process groups to create besides the default
    group_names: dict[str, str] = field(default_factory=dict)  # group -> its desc ("grads"), where recorded


def _numel(sizes: list) -> int:
    total = 0
    for shape in sizes or []:
        n = 1
        for d in shape or []:
            n *= int(d)
        total += n
    return total


def recorded(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, list[Op]]:
    """rank -> its recorded collectives (one source per rank and group: the best there is)."""
    rows = con.execute(
        """
        SELECT rank, pg, seq_id, op, numel_in, numel_out, sizes, dtypes, source, file, line_no FROM collectives
        WHERE run_id = ? AND rank IS NOT NULL AND seq_id IS NOT NULL AND op IS NOT NULL
        QUALIFY dense_rank() OVER (PARTITION BY rank, pg ORDER BY list_position(?, source)) = 1
        ORDER BY rank, pg, seq_id
        """, [run_id, SOURCE_ORDER]).fetchall()
    out: dict[int, list[Op]] = {}
    for rank, pg, seq, op, numel_in, numel_out, sizes, dtypes, source, file, line_no in rows:
        size_doc = json.loads(sizes) if sizes else {}
        dtype_doc = json.loads(dtypes) if dtypes else {}
        in_numel = _numel(size_doc.get("in")) if size_doc.get("in") else (numel_in or 0)
        out_numel = _numel(size_doc.get("out")) if size_doc.get("out") else (numel_out or in_numel)
        dtype = (dtype_doc.get("in") or dtype_doc.get("out") or ["Float"])[0] if isinstance(dtype_doc, dict) \
            else str(dtype_doc)
        ops = out.setdefault(int(rank), [])
        if ops and ops[-1].pg == str(pg) and ops[-1].seq == seq:  # DETAIL repeats a fingerprint
            continue
        ops.append(Op(pg=str(pg), seq=int(seq), op=str(op), in_numel=int(in_numel), out_numel=int(out_numel),
                      dtype=str(dtype), source=source, file=file, line=line_no))
    return out


# gloo's check on a receive: the bytes a peer sent vs the bytes this rank's tensor holds,
# and where this rank's main thread was when it aborted (faulthandler, or py-spy).
_GLOO_SIZE_REPORTS = f"""
    SELECT e.rank,
           TRY_CAST(regexp_extract(e.attrs->>'what', 'op.preamble.length <= op.nbytes. (\\d+) vs (\\d+)', 1) AS BIGINT),
           TRY_CAST(regexp_extract(e.attrs->>'what', 'op.preamble.length <= op.nbytes. (\\d+) vs (\\d+)', 2) AS BIGINT),
           (SELECT arg_min(file || ':' || line, depth) FROM stacks
            WHERE stacks.run_id = e.run_id AND stacks.rank = e.rank AND source IN ('faulthandler', 'pyspy')
              AND line IS NOT NULL AND {NOT_USER_SQL})
    FROM events e
    WHERE e.run_id = ? AND e.kind = 'terminate' AND e.attrs->>'what' LIKE '%doesn''t match expected size%'
"""


def stand_ins(con: duckdb.DuckDBPyConnection, run_id: str, by_rank: dict[int, list[Op]]) -> tuple[dict, list]:
    """Sequences for ranks that aborted on gloo's size check before they could dump anything.

    Such a rank issued what its peers issued up to the collective it died in (its stack's
    call site, matched to the peer's recorded call sites), and that collective held the
    bytes gloo reported: the peer's element count scaled by expected / received. Returns
    (rank -> ops, notes)."""
    reports = [r for r in con.execute(_GLOO_SIZE_REPORTS, [run_id]).fetchall()
               if r[0] is not None and r[0] not in by_rank and r[1] and r[2] and r[3]]
    if not reports or not by_rank:
        return {}, []
    sites = call_sites(con, run_id)
    peer = min(by_rank)
    out, notes = {}, []
    for rank, received, expected, site in reports:
        at = [i for i, o in enumerate(by_rank[peer]) if sites.get((o.file, o.line)) == site]
        if not at:
            continue
        ops = list(by_rank[peer][:at[-1] + 1])
        odd = ops[-1]
        ops[-1] = replace(odd, in_numel=odd.in_numel * expected // received,
                          out_numel=odd.out_numel * expected // received, source="stand-in", file=None, line=None)
        out[rank] = ops
        notes.append(f"rank {rank} left no collective record (it aborted on gloo's size check): replayed as rank "
                     f"{peer}'s sequence up to seq {odd.seq} ({odd.op} at {site}), where gloo's byte counts "
                     f"({expected} expected, {received} received) give it {ops[-1].in_numel} elements, not "
                     f"{odd.in_numel} (numel or dtype: the bytes can't tell)")
    return out, notes


def _majority(ops: list[Op]) -> Op:
    counts = Counter(o.key() for o in ops)
    best = max(counts.values())
    return next(o for o in ops if counts[o.key()] == best)


def caught_by_detail(seqs: dict[int, list[Op]], pg: str, world: int) -> tuple[dict[int, Op], str | None]:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL compares every collective's fingerprint across ranks
    before issuing it, so a mismatch it caught never reached the flight recorder. When every
    rank's recorder ends where its fingerprints' second-to-last entry does (DETAIL counts
    from 0, the recorder from 1), the last fingerprint is what each rank was about to issue
    next. Returns rank -> that op (numbered as the recorder would), and a note."""
    tails, ends = {}, set()
    for rank, ops in seqs.items():
        detail = [o for o in ops if o.source == "detail"]
        recorded = [o for o in ops if o.pg == pg and o.source != "detail"]
        if len(detail) < 2 or not recorded:
            return {}, None
        last, before, end = detail[-1], detail[-2], recorded[-1]
        if (op_family(before.op), before.in_numel) != (op_family(end.op), end.in_numel) or before.seq + 1 != end.seq:
            return {}, None
        out = last.in_numel * world if op_family(last.op) == "all_gather" else last.in_numel
        tails[rank] = replace(last, pg=pg, seq=end.seq + 1, out_numel=out, source="detail")
        ends.add(end.seq)
    if len(ends) != 1 or len({o.key() for o in tails.values()}) < 2:
        return {}, None
    seq = ends.pop() + 1
    return tails, (f"TORCH_DISTRIBUTED_DEBUG=DETAIL stopped its sequence {seq - 1} (the recorder's {seq}) before "
                   f"NCCL ran it: each rank's side of it is its last DETAIL fingerprint")


def plan(con: duckdb.DuckDBPyConnection, run_id: str, world_size: int | None = None) -> Plan:
    """What to replay: the default group's last window up to the first divergence."""
    seqs = recorded(con, run_id)
    if not seqs:
        return Plan(0, {}, "0", 0, None, [], "none", notes=["the run has no collective records to replay"])
    pgs = Counter(o.pg for ops in seqs.values() for o in ops)
    pg = "0" if "0" in pgs else pgs.most_common(1)[0][0]
    by_rank = {r: [o for o in ops if o.pg == pg] for r, ops in seqs.items()}
    by_rank = {r: ops for r, ops in by_rank.items() if ops}
    rebuilt, notes = stand_ins(con, run_id, by_rank)
    by_rank.update(rebuilt)
    world = world_size or max(by_rank) + 1
    tails, caught = caught_by_detail(seqs, pg, world)
    for rank, op in tails.items():
        by_rank[rank] = by_rank[rank] + [op]
    notes += [caught] if caught else []
    ranks = sorted(by_rank)
    last_seq = max(o.seq for ops in by_rank.values() for o in ops)
    first_seq = max(min(o.seq for o in ops) for ops in by_rank.values())  # ring buffers start at different points
    divergence, kind, culprits = None, "stuck", []
    for seq in range(first_seq, last_seq + 1):
        present = {r: next((o for o in by_rank[r] if o.seq == seq), None) for r in ranks}
        missing = [r for r, o in present.items() if o is None]
        if missing:
            divergence, kind, culprits = seq, "missing", missing
            break
        keys = Counter(o.key() for o in present.values())
        if len(keys) > 1:
            majority = _majority(list(present.values())).key()
            odd = [r for r, o in present.items() if o.key() != majority]
            divergence, kind, culprits = seq, "mismatch", odd
            break
    if divergence is None:
        divergence = last_seq if last_seq >= first_seq else None
    start = max(first_seq, (divergence or last_seq) - WINDOW)
    sequences = {r: [o for o in ops if o.seq >= start] for r, ops in by_rank.items()}
    absent = sorted(set(range(world)) - set(by_rank))
    if absent and kind == "stuck":
        # The ranks with a record agree and all wait in their last collective; a rank that left
        # none (killed, frozen, aborted before dumping) joined what they completed, not that.
        peer = min(by_rank)
        for r in absent:
            sequences[r] = [replace(o, source="stand-in") for o in sequences[peer] if o.seq < last_seq]
        kind, culprits, divergence = "missing", absent, last_seq
        notes.append(f"no collective records for rank(s) {rank_ranges(absent)}: replayed as issuing what rank {peer} "
                     f"issued before seq {last_seq}, the collective the recorded ranks were left waiting in")
    elif absent:
        notes.append(f"no collective records for rank(s) {rank_ranges(absent)}: replayed as if they issued nothing")
        for r in absent:
            sequences[r] = []
    return Plan(world_size=world, sequences=sequences, pg=pg, first_seq=start, divergence=divergence,
                culprits=culprits, kind=kind, notes=notes)


def fold(p: Plan, max_ranks: int) -> Plan:
    """A job larger than the machine: replay one rank per distinct sequence (the culprits
    keep their own), since ranks that issued the same sequence are interchangeable."""
    if len(p.sequences) <= max_ranks:
        return p
    classes: dict[tuple, list[int]] = {}
    for r, ops in sorted(p.sequences.items()):
        key = ("culprit", r) if r in p.culprits else tuple(o.key() for o in ops)
        classes.setdefault(key, []).append(r)
    if len(classes) > max_ranks:
        raise ValueError(f"{len(classes)} distinct rank sequences: more than the {max_ranks} processes allowed")
    keep = {members[0]: members for members in classes.values()}
    if len(keep) < 2:  # a collective needs peers: keep two of the one class
        first = next(iter(classes.values()))
        keep = {first[0]: first[:1], first[1]: first[1:]}
    order = sorted(keep)
    new_world = len(order)
    renumber = {old: new for new, old in enumerate(order)}

    def scaled(o: Op) -> Op:
        # all-gather outputs (and reduce-scatter inputs) hold world-size shards
        family = op_family(o.op)
        if family == "all_gather" and o.in_numel:
            return replace(o, out_numel=o.out_numel // p.world_size * new_world)
        if family == "reduce_scatter" and o.out_numel:
            return replace(o, in_numel=o.in_numel // p.world_size * new_world)
        return o

    return Plan(world_size=new_world, sequences={renumber[r]: [scaled(o) for o in p.sequences[r]] for r in order},
                pg=p.pg, first_seq=p.first_seq, divergence=p.divergence,
                culprits=[renumber[c] for c in p.culprits if c in renumber], kind=p.kind,
                folded={renumber[r]: keep[r] for r in order}, notes=p.notes + [
                    f"folded {p.world_size} ranks into {new_world}: "
                    + "; ".join(f"rank {renumber[r]} plays {keep[r][:4]}{'...' if len(keep[r]) > 4 else ''}"
                                for r in order)])


def fixed(p: Plan) -> Plan:
    """The corrected sequence: missing ranks join, odd sizes/dtypes/ops take the majority's."""
    if p.divergence is None or p.kind not in ("missing", "mismatch"):
        return p
    sequences = {r: list(ops) for r, ops in p.sequences.items()}
    seqs = sorted({o.seq for ops in sequences.values() for o in ops})
    for seq in seqs:
        present = {r: next((o for o in ops if o.seq == seq), None) for r, ops in sequences.items()}
        known = [o for o in present.values() if o is not None]
        if not known:
            continue
        majority = _majority(known)
        for r, o in present.items():
            if o is None or o.key() != majority.key():
                ops = [x for x in sequences[r] if x.seq != seq] + [replace(majority, source="fix")]
                sequences[r] = sorted(ops, key=lambda x: x.seq)
    return replace(p, sequences=sequences, notes=p.notes + ["--fix: every rank issues the majority's collective"])


# ---------------------------------------------------------------- several groups: a wait cycle

GROUP_WINDOW = 2  # per group, replay this many collectives before the last one every rank issued


def recorded_in_order(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, list[Op]]:
    """rank -> its flight-recorder collectives over all its groups, in the order it issued them
    (its dump's entry order), point-to-point left out (gloo does not record it)."""
    rows = con.execute(
        """
        SELECT rank, pg, seq_id, op, numel_in, numel_out, dtypes, file, line_no FROM collectives
        WHERE run_id = ? AND source = 'flight_recorder' AND rank IS NOT NULL AND seq_id IS NOT NULL
          AND op IS NOT NULL AND line_no IS NOT NULL
        ORDER BY rank, file, line_no
        """, [run_id]).fetchall()
    out: dict[int, list[Op]] = {}
    for rank, pg, seq, op, numel_in, numel_out, dtypes, file, line_no in rows:
        if op_family(op) in ("p2p", "coalesced"):
            continue
        doc = json.loads(dtypes) if dtypes else {}
        dtype = (doc.get("in") or doc.get("out") or ["Float"])[0] if isinstance(doc, dict) else "Float"
        out.setdefault(int(rank), []).append(Op(
            pg=str(pg), seq=int(seq), op=str(op), in_numel=int(numel_in or 0), out_numel=int(numel_out or numel_in or 0),
            dtype=str(dtype), source="flight_recorder", file=file, line=line_no))
    return out


def plan_groups(con: duckdb.DuckDBPyConnection, run_id: str, world_size: int | None = None) -> Plan | None:
    """Ranks whose last collectives are in different groups, each lacking one the other issued
    (two groups taken in different orders): every rank's sequence over all its groups, in its
    own order, from a few collectives before the last one all ranks issued in each group. None
    when no two groups end apart."""
    seqs = recorded_in_order(con, run_id)
    if len(seqs) < 2:
        return None
    last: dict[str, dict[int, int]] = {}
    for rank, ops in seqs.items():
        for o in ops:
            last.setdefault(o.pg, {})[rank] = max(last.get(o.pg, {}).get(rank, 0), o.seq)
    apart = {pg: ends for pg, ends in last.items() if len(ends) == len(seqs) and len(set(ends.values())) > 1}
    if len(apart) < 2:
        return None
    low = {pg: max(1, min(ends.values()) - GROUP_WINDOW + 1) for pg, ends in last.items()}
    sequences = {r: [o for o in ops if o.seq >= low[o.pg]] for r, ops in seqs.items()}
    world = world_size or max(seqs) + 1
    ranks = sorted(seqs)
    groups = {pg: ranks for pg in sorted(last, key=lambda g: (len(g), g)) if pg != "0"}
    first = min(low[pg] for pg in apart)
    ahead = {pg: sorted(r for r, e in ends.items() if e == max(ends.values())) for pg, ends in apart.items()}
    from postmortem.checks.collective_alignment import group_descs

    return Plan(world_size=world, sequences=sequences, pg=",".join(sorted(apart)), first_seq=first,
                divergence=max(min(ends.values()) + 1 for ends in apart.values()), culprits=[], kind="cycle",
                groups=groups, group_names=group_descs(con, run_id), notes=[
                    "several groups end apart: " + "; ".join(
                        f"group {pg}: rank(s) {rank_ranges(ahead[pg])} issued seq {max(last[pg].values())}, the "
                        f"others stopped at {min(last[pg].values())}" for pg in sorted(apart))
                    + "; each rank replays its collectives of every group in its own recorded order"])


def fixed_order(p: Plan) -> Plan:
    """The group order equalized: every rank issues every group's collectives of the window, in
    the order a rank that kept the job's order (not a culprit) issued them; those only others
    issued come after, in their order."""
    keeper = min((r for r in p.sequences if r not in p.culprits), default=min(p.sequences))
    order = [(o.pg, o.seq) for o in p.sequences[keeper]]
    ops = {(o.pg, o.seq): o for r in sorted(p.sequences) for o in p.sequences[r]}
    order += [k for r in sorted(p.sequences) for k in ((o.pg, o.seq) for o in p.sequences[r]) if k not in order]
    order = list(dict.fromkeys(order))
    sequences = {r: [replace(ops[k], source="fix") for k in order] for r in p.sequences}
    return replace(p, sequences=sequences, notes=p.notes + [
        f"--fix: every rank issues each group's collectives in rank {keeper}'s order"])


# ---------------------------------------------------------------- point-to-point: a missing send

_ANSWER = {"send": "recv", "isend": "recv", "recv": "send", "irecv": "send"}


def plan_p2p(con: duckdb.DuckDBPyConnection, run_id: str, world_size: int | None = None) -> Plan | None:
    """Ranks that timed out in a send or recv (gloo records neither in its flight recorder; the
    tracebacks' user lines name the peer), replayed as the wait-for graph they left: each rank
    issues its recorded wait, then answers the ranks that wait for it (a rank blocked in its own
    wait cannot send before it returns). The culprit's answer to the rank waiting for it at an
    earlier point is the one it skipped: the replay leaves it out, ``--fix`` issues it first."""
    from postmortem.checks.collective_hang import p2p_culprits, p2p_waits

    waits, unread = p2p_waits(con, run_id)
    culprits = sorted(p2p_culprits(waits, unread))
    if not waits or not culprits:
        return None
    # what a culprit skipped: its answer to the rank it waits for in return (it moved past that
    # point), or to every rank waiting for it when it waits for no one
    skipped = {(c, r) for c in culprits for r, w in waits.items()
               if w["peer"] == c and (c not in waits or waits[c]["peer"] == r)}
    sequences: dict[int, list[Op]] = {}
    for rank, w in sorted(waits.items()):
        op = _ANSWER[_ANSWER[w["op"]]]  # isend -> send, irecv -> recv
        ops = [Op(pg="0", seq=1, op=op, in_numel=1, out_numel=1, dtype="Float", source="traceback",
                  file=w["file"], line=w["line"], peer=w["peer"])]
        for waiter, theirs in sorted(waits.items()):
            if theirs["peer"] == rank and (rank, waiter) not in skipped:
                ops.append(Op(pg="0", seq=len(ops) + 1, op=_ANSWER[theirs["op"]], in_numel=1, out_numel=1,
                              dtype="Float", source="answer", peer=waiter))
        sequences[rank] = ops
    world = world_size or max(waits) + 1
    for rank in range(world):
        sequences.setdefault(rank, [])
    missing = "; ".join(f"rank {c} -> rank {r}" for c, r in sorted(skipped))
    return Plan(world_size=world, sequences=sequences, pg="0", first_seq=1, divergence=1, culprits=culprits,
                kind="p2p", notes=[
                    "point-to-point waits from the tracebacks (gloo records no send/recv): " + "; ".join(
                        f"rank {r} in {w['op']} with rank {w['peer']} at {w['site']}" for r, w in sorted(waits.items()))
                    + f"; left out, as in the run: {missing}; sizes not recorded: 1-element tensors"])


def fixed_p2p(p: Plan) -> Plan:
    """The missing send added: each culprit first answers the ranks that waited for it, then
    waits as it did."""
    sequences = {r: list(ops) for r, ops in p.sequences.items()}
    for c in p.culprits:
        answered = {o.peer for o in sequences.get(c, [])[1:]}
        waiting = [r for r, ops in p.sequences.items() if ops and ops[0].peer == c and r not in answered]
        first = [Op(pg="0", seq=0, op=_ANSWER[p.sequences[r][0].op], in_numel=1, out_numel=1, dtype="Float",
                    source="fix", peer=r) for r in sorted(waiting)]
        sequences[c] = first + sequences[c]
    return replace(p, sequences=sequences, notes=p.notes + [
        f"--fix: rank(s) {rank_ranges(p.culprits)} first send what the ranks waiting for them wait for"])

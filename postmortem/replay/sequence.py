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

SOURCE_ORDER = ["flight_recorder", "nccl_log", "watchdog", "detail", "profiler"]
# All-gather outputs (and reduce-scatter inputs) hold world-size shards: they scale when folding.
GATHER_OPS = {"all_gather", "_all_gather_base", "all_gather_into_tensor", "allgather_into_tensor_coalesced"}
SCATTER_OPS = {"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor"}
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
        SELECT rank, pg, seq_id, op, numel_in, numel_out, sizes, dtypes, source FROM collectives
        WHERE run_id = ? AND rank IS NOT NULL AND seq_id IS NOT NULL AND op IS NOT NULL
        QUALIFY dense_rank() OVER (PARTITION BY rank, pg ORDER BY list_position(?, source)) = 1
        ORDER BY rank, pg, seq_id
        """, [run_id, SOURCE_ORDER]).fetchall()
    out: dict[int, list[Op]] = {}
    for rank, pg, seq, op, numel_in, numel_out, sizes, dtypes, source in rows:
        size_doc = json.loads(sizes) if sizes else {}
        dtype_doc = json.loads(dtypes) if dtypes else {}
        in_numel = _numel(size_doc.get("in")) if size_doc.get("in") else (numel_in or 0)
        out_numel = _numel(size_doc.get("out")) if size_doc.get("out") else (numel_out or in_numel)
        dtype = (dtype_doc.get("in") or dtype_doc.get("out") or ["Float"])[0] if isinstance(dtype_doc, dict) \
            else str(dtype_doc)
        ops = out.setdefault(int(rank), [])
        if ops and ops[-1].pg == pg and ops[-1].seq == seq:
            continue
        ops.append(Op(pg=str(pg), seq=int(seq), op=str(op), in_numel=int(in_numel), out_numel=int(out_numel),
                      dtype=str(dtype), source=source))
    return out


def _majority(ops: list[Op]) -> Op:
    counts = Counter(o.key() for o in ops)
    best = max(counts.values())
    return next(o for o in ops if counts[o.key()] == best)


def plan(con: duckdb.DuckDBPyConnection, run_id: str, world_size: int | None = None) -> Plan:
    """What to replay: the default group's last window up to the first divergence."""
    seqs = recorded(con, run_id)
    if not seqs:
        return Plan(0, {}, "0", 0, None, [], "none", notes=["the run has no collective records to replay"])
    pgs = Counter(o.pg for ops in seqs.values() for o in ops)
    pg = "0" if "0" in pgs else pgs.most_common(1)[0][0]
    by_rank = {r: [o for o in ops if o.pg == pg] for r, ops in seqs.items()}
    by_rank = {r: ops for r, ops in by_rank.items() if ops}
    world = world_size or max(by_rank) + 1
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
    notes = []
    if len(by_rank) < world:
        absent = sorted(set(range(world)) - set(by_rank))
        notes.append(f"no collective records for rank(s) {absent}: replayed as if they issued nothing")
        for r in absent:
            sequences[r] = []
        if kind == "stuck":
            kind, culprits, divergence = "missing", absent, min((o.seq for ops in sequences.values() for o in ops
                                                                 if o.seq >= start), default=None)
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
        if o.op in GATHER_OPS and o.in_numel:
            return replace(o, out_numel=o.out_numel // p.world_size * new_world)
        if o.op in SCATTER_OPS and o.out_numel:
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

"""Flight-recorder dumps (pickle, or the JSON variant), into ``collectives``, ``rank_status`` and ``stacks``.

A dump is one rank's ring buffer of the collectives its process groups issued. The start
of a real one (PyTorch 2.11, NCCL 2.28.9, ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``), as plain data:

    {'version': '2.10', 'pg_config': {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1]'}},
     'comm_lib_version': '2.28.9',
     'pg_status': {'0': {'last_enqueued_collective': 36, 'last_started_collective': -1, 'last_completed_collective': 31}},
     'entries': [{'record_id': 31, 'pg_id': 0, 'process_group': ('0', 'default_pg'), 'collective_seq_id': 32,
                  'p2p_seq_id': 0, 'op_id': 32, 'profiling_name': 'nccl:all_reduce', 'time_created_ns': 1795959192840136332,
                  'input_sizes': [[4194304]], 'input_dtypes': ['Float'], 'output_sizes': [[4194304]], 'output_dtypes': ['Float'],
                  'state': 'scheduled', 'time_discovered_started_ns': None, 'time_discovered_completed_ns': None,
                  'retired': False, 'timeout_ms': 30000, 'is_p2p': False, 'thread_name': 'pt_autograd_0',
                  'frames': [{'name': 'all_reduce', 'filename': '.../distributed_c10d.py', 'line': 3174}, ...]}, ...]}

Versions 2.3 onward are read: fields a version lacks are NULL. The JSON variant
(``_dump_nccl_trace_json``; also gloo's) has no frames, prints ``pg_status`` numbers as
strings and unset times as 0. Pickles are loaded only through ``pickles.loads``, which
admits plain containers and scalars: a dump that asks for anything else is refused and
the file is recorded with the reason.

Rows:

- ``collectives`` (source ``flight_recorder``): one per entry. ``pg`` is the group's name
  (its GUID, "0" for the default group: what the watchdog's ``PG GUID`` says too),
  ``seq_id`` the ``collective_seq_id`` (``p2p_seq_id`` for send/recv), ``op`` the
  profiling name without its backend (``nccl:all_reduce`` -> ``all_reduce``; the peer of
  ``nccl:send 3->2`` goes to ``sizes.peer``), numel summed over tensors;
- ``rank_status``: one per entry of ``pg_status``, whose keys are the groups' local ids,
  mapped to names through the entries (local id 0 is always the default group "0"); a
  group with no entry left in the ring buffer can't be named and is left out;
- ``stacks`` (source ``flight_recorder``): the Python frames of the entries that had not
  completed (by their state, or by ``pg_status``: gloo leaves every entry "scheduled"), and
  of the last ``KEEP_COMPLETED`` completed ones per group, so that a 2000-entry buffer adds
  a few dozen frames, not a hundred thousand. ``origin_line`` is the entry's position, the
  ``line_no`` of its ``collectives`` row; ``thread_state`` is the entry's state;
- ``events``: ``pg_config`` (a group's desc and member ranks) per group, and the comm
  library's version.

The rank is the file's (``nccl_trace_rank_3``, ``_dump_3``, ``rank3``, from discovery),
else the one rank every group in ``pg_config`` has in common.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from postmortem.schema import conform, frame, json_attrs

from . import pickles
from .columns import frame_of
from .lines import open_binary
from .source import Source

KIND = "flight_recorder"
MAX_BYTES = pickles.MAX_BYTES
# Frames kept: every entry not completed, and the last few completed per group (where ranks
# that part ways are still side by side), not the whole ring buffer.
KEEP_COMPLETED = 4
_P2P_OPS = ("send", "recv")


def sniff(head: bytes, name: str) -> bool:
    """A dump's first keys name the flight recorder's fields; a memory snapshot's (``segments``,
    ``device_traces``) don't, and is left to its own parser."""
    if head[:1] == b"\x80":
        return b"pg_config" in head[:8192] or (b"profiling_name" in head and b"collective_seq_id" in head)
    if head.lstrip()[:1] == b"{":
        return b'"pg_config"' in head or (b'"profiling_name"' in head and b'"collective_seq_id"' in head)
    return False


def load(source: Source) -> dict:
    """The dump as plain data; ValueError saying why it can't be read."""
    with open_binary(source.path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"dump larger than {MAX_BYTES >> 20} MiB")
    if data.lstrip()[:1] == b"{":
        try:
            dump = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"not a readable JSON dump: {exc}"[:300]) from exc
    else:
        dump = pickles.loads(data)
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise ValueError("not a flight-recorder dump: no entries list")  # noqa: TRY004 - bad input, not a bad call
    return dump


def _int(value) -> int | None:
    """An int64, from an int or a string of digits; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        value = int(value)
    if isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
        return value
    return None


def _ranks(value) -> list[int] | None:
    """pg_config's ``ranks``: a string like "[0, 1]" (parsed as JSON, never evaluated), or a list."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        return value
    return None


def _groups(dump: dict) -> dict[str, dict]:
    groups = {}
    config = dump.get("pg_config")
    if isinstance(config, dict):
        for key, pg in config.items():
            if isinstance(pg, dict):
                name = str(pg.get("name", key))
                groups[name] = {"desc": pg.get("desc"), "ranks": _ranks(pg.get("ranks"))}
    return groups


def _named_in_entries(entries: list, groups: dict[str, dict]) -> dict[str, dict]:
    """The groups with the desc each entry's ``process_group`` (name, desc) gives, where
    pg_config has none: gloo's recorder fills no pg_config (``{'': {'name': '', 'desc': ''}}``),
    yet its entries say ``('1', 'grads')`` for a group made with ``new_group(group_desc="grads")``."""
    named = dict(groups)
    for e in entries:
        pg = e.get("process_group") if isinstance(e, dict) else None
        if isinstance(pg, (list, tuple)) and len(pg) == 2 and isinstance(pg[1], str) and pg[1]:
            name = str(pg[0])
            if not (named.get(name) or {}).get("desc"):
                named[name] = {"desc": pg[1], "ranks": (named.get(name) or {}).get("ranks")}
    return named


def dump_rank(dump: dict, groups: dict[str, dict]) -> int | None:
    """The rank a dump speaks for, from its contents: the one rank all its groups share."""
    rank = _int(dump.get("rank"))
    if rank is not None:
        return rank
    common = None
    for g in groups.values():
        if g["ranks"]:
            common = set(g["ranks"]) if common is None else common & set(g["ranks"])
    return next(iter(common)) if common and len(common) == 1 else None


def _listed(value) -> list:
    return value if isinstance(value, list) else []


_ENTRY_SCHEMA = {
    "rank": pa.int32(), "file": pa.string(), "position": pa.int64(), "pg_id": pa.int64(), "pg": pa.string(),
    "collective_seq_id": pa.int64(), "p2p_seq_id": pa.int64(), "is_p2p": pa.bool_(), "profiling_name": pa.string(),
    "state": pa.string(), "time_created_ns": pa.int64(), "time_discovered_started_ns": pa.int64(),
    "time_discovered_completed_ns": pa.int64(), "timeout_ms": pa.int64(),
    "input_sizes": pa.list_(pa.list_(pa.int64())), "output_sizes": pa.list_(pa.list_(pa.int64())),
    "input_dtypes": pa.list_(pa.string()), "output_dtypes": pa.list_(pa.string()),
}


def _entry_columns(entries: list, rank: int | None, file: str) -> dict[str, list]:
    """The entries as Python columns (one pass to pick and type-check fields; Polars runs once
    per batch of dumps, not per dump, in ``build``)."""
    dicts = [e if isinstance(e, dict) else {} for e in entries]

    def ints(key):
        return [_int(e.get(key)) for e in dicts]

    def strs(key):
        return [v if isinstance(v := e.get(key), str) else None for e in dicts]

    def bools(key):
        return [v if isinstance(v := e.get(key), bool) else None for e in dicts]

    def pg_name(e):
        pg = e.get("process_group")
        return str(pg[0]) if isinstance(pg, (list, tuple)) and pg else None

    def sizes(key):
        return [[[d for d in _listed(t) if _int(d) is not None] for t in _listed(e.get(key))] for e in dicts]

    def dtypes(key):
        return [[d for d in _listed(e.get(key)) if isinstance(d, str)] for e in dicts]

    return {
        "rank": [rank] * len(dicts), "file": [file] * len(dicts), "position": list(range(1, len(dicts) + 1)),
        "pg_id": ints("pg_id"), "pg": [pg_name(e) for e in dicts], "collective_seq_id": ints("collective_seq_id"),
        "p2p_seq_id": ints("p2p_seq_id"), "is_p2p": bools("is_p2p"), "profiling_name": strs("profiling_name"),
        "state": strs("state"), "time_created_ns": ints("time_created_ns"),
        "time_discovered_started_ns": ints("time_discovered_started_ns"),
        "time_discovered_completed_ns": ints("time_discovered_completed_ns"), "timeout_ms": ints("timeout_ms"),
        "input_sizes": sizes("input_sizes"), "output_sizes": sizes("output_sizes"),
        "input_dtypes": dtypes("input_dtypes"), "output_dtypes": dtypes("output_dtypes"),
    }


def _numel(sizes: pl.Expr) -> pl.Expr:
    """Elements over all tensors: the sum of each shape's product (a scalar's shape [] is 1)."""
    return sizes.list.eval(pl.element().list.eval(pl.element().product()).list.first().fill_null(1)).list.sum()  # safe: Polars list.eval


def _ts(ns: pl.Expr) -> pl.Expr:
    return pl.when(ns > 0).then(pl.from_epoch(ns // 1000, time_unit="us"))


def _collectives(df: pl.DataFrame) -> pl.DataFrame:
    name = pl.col("profiling_name").str.replace(r"^[\w.]+:", "")
    op = name.str.extract(r"^(\S+)", 1)
    peer = name.str.extract(r"^\S+ (\S+)", 1)
    is_p2p = pl.coalesce(pl.col("is_p2p"), op.is_in(_P2P_OPS))
    return conform("collectives", df.select(
        "rank",
        pl.lit("flight_recorder").alias("source"),
        "pg",
        pl.when(is_p2p).then(pl.col("p2p_seq_id")).otherwise(pl.col("collective_seq_id")).alias("seq_id"),
        op.alias("op"),
        _numel(pl.col("input_sizes")).alias("numel_in"),
        _numel(pl.col("output_sizes")).alias("numel_out"),
        pl.when(peer.is_not_null())
        .then(json_attrs(**{"in": pl.col("input_sizes"), "out": pl.col("output_sizes"), "peer": peer}))
        .otherwise(json_attrs(**{"in": pl.col("input_sizes"), "out": pl.col("output_sizes")})).alias("sizes"),
        json_attrs(**{"in": pl.col("input_dtypes"), "out": pl.col("output_dtypes")}).alias("dtypes"),
        "state",
        _ts(pl.col("time_created_ns")).alias("t_created"),
        _ts(pl.col("time_discovered_started_ns")).alias("t_started"),
        _ts(pl.col("time_discovered_completed_ns")).alias("t_completed"),
        "timeout_ms",
        "file",
        pl.col("position").alias("line_no"),
    ))


def _pg_status(dump: dict) -> dict[int, dict]:
    """pg_status by local group id (keys that are no id, values that are no dict, left out)."""
    status = dump.get("pg_status")
    items = status.items() if isinstance(status, dict) else []
    return {pg_id: s for k, s in items if (pg_id := _int(k)) is not None and isinstance(s, dict)}


def _rank_status(status: dict[int, dict], columns: dict[str, list], rank: int | None, source: Source) -> list[dict]:
    names = {pg_id: pg for pg_id, pg in zip(columns["pg_id"], columns["pg"]) if pg_id is not None and pg}
    names.setdefault(0, "0")
    rows = []
    for pg_id, s in status.items():
        if pg_id not in names:
            continue
        started = _int(s.get("last_started_collective"))
        rows.append({"rank": rank, "pg": names[pg_id], "last_enqueued": _int(s.get("last_enqueued_collective")),
                     "last_started": started if started is not None and started >= 0 else None,
                     "last_completed": _int(s.get("last_completed_collective")),
                     "source": "flight_recorder", "file": source.name})
    return rows


def _kept_positions(status: dict[int, dict], columns: dict[str, list]) -> list[int]:
    """The entries whose frames are kept: every one not completed, and the last KEEP_COMPLETED
    completed ones per group. Completed by its state, or by pg_status (gloo's recorder leaves
    every entry "scheduled")."""
    done_through = {pg_id: _int(s.get("last_completed_collective")) for pg_id, s in status.items()}
    kept, done_by_pg = [], {}
    for position, pg_id, pg, state, p2p, seq in zip(
        columns["position"], columns["pg_id"], columns["pg"], columns["state"], columns["is_p2p"],
        columns["collective_seq_id"],
    ):
        through = done_through.get(pg_id)
        done = state == "completed" or (not p2p and seq is not None and through is not None and seq <= through)
        if done:
            done_by_pg.setdefault(pg, []).append(position)
        else:
            kept.append(position)
    for positions in done_by_pg.values():
        kept += positions[-KEEP_COMPLETED:]
    return sorted(kept)


def _stacks(entries: list, positions: list[int], rank: int | None, source: Source) -> list[dict]:
    rows = []
    for position in positions:
        entry = entries[position - 1]
        if not isinstance(entry, dict):
            continue
        thread, state = entry.get("thread_name"), entry.get("state")
        for depth, f in enumerate(x for x in _listed(entry.get("frames")) if isinstance(x, dict)):
            rows.append({"rank": rank, "thread": thread if isinstance(thread, str) else None,
                         "thread_state": state if isinstance(state, str) else None,
                         "depth": depth, "function": str(f.get("name")), "file": str(f.get("filename")),
                         "line": _int(f.get("line")), "source": "flight_recorder", "origin": source.name,
                         "origin_line": position})
    return rows


def _events(dump: dict, groups: dict[str, dict], rank: int | None, source: Source) -> list[dict]:
    rows = [{"rank": rank, "file": source.name, "kind": "pg_config", "source": "flight_recorder",
             "message": f"process group {name} ({g['desc'] or 'no desc'}): ranks {g['ranks']}",
             "attrs": json.dumps({"pg": name, "desc": g["desc"], "ranks": g["ranks"]})}
            for name, g in groups.items()]
    version = dump.get("comm_lib_version") or dump.get("nccl_version")
    if isinstance(version, str) and re.match(r"\d+\.\d+\.\d+", version):
        rows.append({"rank": rank, "file": source.name, "kind": "version", "source": "flight_recorder",
                     "message": f"flight recorder {dump.get('version')}, comm library {version}",
                     "attrs": json.dumps({"component": "nccl", "version": version})})
    return rows


@dataclass
class Read:
    """One dump, read and taken apart in plain Python: ``build`` makes frames of many at once."""

    entries: dict[str, list]
    rank_status: list[dict]
    stacks: list[dict]
    events: list[dict]


def read(source: Source) -> Read:
    """Load one dump (ValueError when it can't be read) and pick its rows, no Polars work."""
    dump = load(source)
    groups = _groups(dump)
    rank = source.rank if source.rank is not None else dump_rank(dump, groups)
    if rank is None:
        source.notes.append("no rank in the file name, and pg_config does not single one out")
    entries = _listed(dump.get("entries"))
    groups = _named_in_entries(entries, groups)
    columns = _entry_columns(entries, rank, source.name)
    status = _pg_status(dump)
    return Read(columns, _rank_status(status, columns, rank, source),
                _stacks(entries, _kept_positions(status, columns), rank, source), _events(dump, groups, rank, source))


def build(reads: list[Read]) -> Iterator[tuple[str, pl.DataFrame]]:
    """The tables of many dumps, each built once (a dump costs microseconds, not a frame per table)."""
    # Arrow builds the nested size lists in C++; Polars' own constructor walks them in Python.
    entries = pa.table({key: pa.array([v for r in reads for v in r.entries[key]], type=arrow)
                        for key, arrow in _ENTRY_SCHEMA.items()})
    yield "collectives", _collectives(frame_of(entries))
    yield "rank_status", frame("rank_status", [row for r in reads for row in r.rank_status])
    yield "stacks", frame("stacks", [row for r in reads for row in r.stacks])
    yield "events", frame("events", [row for r in reads for row in r.events])


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    yield from build([read(source)])

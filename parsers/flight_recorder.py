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

import polars as pl

from postmortem.schema import conform, frame, json_attrs

from . import pickles
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
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
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


def _entries_frame(entries: list) -> pl.DataFrame:
    """The entries as columns: one pass to pick fields, the rest is expressions."""
    def col(key, kind=None):
        values = [e.get(key) if isinstance(e, dict) else None for e in entries]
        if kind is int:
            return [_int(v) for v in values]
        if kind is str:
            return [v if isinstance(v, str) else None for v in values]
        return values

    def pg_name(e):
        pg = e.get("process_group") if isinstance(e, dict) else None
        return str(pg[0]) if isinstance(pg, (list, tuple)) and pg else None

    def sizes(key):
        out = []
        for e in entries:
            value = e.get(key) if isinstance(e, dict) else None
            out.append([[d for d in _listed(t) if _int(d) is not None] for t in _listed(value)])
        return out

    return pl.DataFrame(
        {
            "position": list(range(1, len(entries) + 1)),
            "pg_id": col("pg_id", int),
            "pg": [pg_name(e) for e in entries],
            "collective_seq_id": col("collective_seq_id", int),
            "p2p_seq_id": col("p2p_seq_id", int),
            "is_p2p": [bool(v) if isinstance(v, bool) else None for v in col("is_p2p")],
            "profiling_name": col("profiling_name", str),
            "state": col("state", str),
            "retired": [bool(v) if isinstance(v, bool) else None for v in col("retired")],
            "time_created_ns": col("time_created_ns", int),
            "time_discovered_started_ns": col("time_discovered_started_ns", int),
            "time_discovered_completed_ns": col("time_discovered_completed_ns", int),
            "timeout_ms": col("timeout_ms", int),
            "input_sizes": sizes("input_sizes"),
            "output_sizes": sizes("output_sizes"),
            "input_dtypes": [[d for d in _listed(v) if isinstance(d, str)] for v in col("input_dtypes")],
            "output_dtypes": [[d for d in _listed(v) if isinstance(d, str)] for v in col("output_dtypes")],
            "thread_name": col("thread_name", str),
        },
        schema={
            "position": pl.Int64, "pg_id": pl.Int64, "pg": pl.String, "collective_seq_id": pl.Int64,
            "p2p_seq_id": pl.Int64, "is_p2p": pl.Boolean, "profiling_name": pl.String, "state": pl.String,
            "retired": pl.Boolean, "time_created_ns": pl.Int64, "time_discovered_started_ns": pl.Int64,
            "time_discovered_completed_ns": pl.Int64, "timeout_ms": pl.Int64,
            "input_sizes": pl.List(pl.List(pl.Int64)), "output_sizes": pl.List(pl.List(pl.Int64)),
            "input_dtypes": pl.List(pl.String), "output_dtypes": pl.List(pl.String), "thread_name": pl.String,
        },
        strict=False,
    )


def _numel(sizes: pl.Expr) -> pl.Expr:
    """Elements over all tensors: the sum of each shape's product (a scalar's shape [] is 1)."""
    return sizes.list.eval(pl.element().list.eval(pl.element().product()).list.first().fill_null(1)).list.sum()  # safe: Polars list.eval


def _ts(ns: pl.Expr) -> pl.Expr:
    return pl.when(ns > 0).then(pl.from_epoch(ns // 1000, time_unit="us"))


def _collectives(df: pl.DataFrame, rank: int | None, source: Source) -> pl.DataFrame:
    name = pl.col("profiling_name").str.replace(r"^[\w.]+:", "")
    op = name.str.extract(r"^(\S+)", 1)
    peer = name.str.extract(r"^\S+ (\S+)", 1)
    is_p2p = pl.coalesce(pl.col("is_p2p"), op.is_in(_P2P_OPS))
    return conform("collectives", df.select(
        pl.lit(rank, pl.Int32).alias("rank"),
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
        pl.lit(source.name).alias("file"),
        pl.col("position").alias("line_no"),
    ))


def _rank_status(dump: dict, df: pl.DataFrame, rank: int | None, source: Source) -> pl.DataFrame:
    status = dump.get("pg_status")
    if not isinstance(status, dict):
        return frame("rank_status")
    names = {pg_id: pg for pg_id, pg in df.select("pg_id", "pg").unique().iter_rows() if pg_id is not None and pg}
    names.setdefault(0, "0")
    rows = []
    for key, s in status.items():
        pg_id = _int(key)
        if not isinstance(s, dict) or pg_id not in names:
            continue
        started = _int(s.get("last_started_collective"))
        rows.append({"rank": rank, "pg": names[pg_id], "last_enqueued": _int(s.get("last_enqueued_collective")),
                     "last_started": started if started is not None and started >= 0 else None,
                     "last_completed": _int(s.get("last_completed_collective")),
                     "source": "flight_recorder", "file": source.name})
    return frame("rank_status", rows)


def _completed_through(dump: dict) -> pl.DataFrame:
    """pg_status's last completed collective per local group id."""
    status = dump.get("pg_status")
    rows = [{"pg_id": _int(k), "done": _int(v.get("last_completed_collective"))}
            for k, v in (status.items() if isinstance(status, dict) else []) if isinstance(v, dict)]
    return pl.DataFrame(rows, schema={"pg_id": pl.Int64, "done": pl.Int64})


def _stacks(dump: dict, entries: list, df: pl.DataFrame, rank: int | None, source: Source) -> pl.DataFrame:
    # Completed by its state, or by pg_status (gloo's recorder leaves every entry "scheduled").
    done = df.join(_completed_through(dump), on="pg_id", how="left").select(
        "position", "pg",
        ((pl.col("state") == "completed")
         | (~pl.col("is_p2p").fill_null(False) & (pl.col("collective_seq_id") <= pl.col("done")))).fill_null(False)
        .alias("done"))
    last_done = done.filter(pl.col("done")).group_by("pg").agg(pl.col("position").top_k(KEEP_COMPLETED)).explode(
        "position")["position"]
    keep = set(done.filter(~pl.col("done"))["position"].to_list()) | set(last_done.to_list())
    rows = []
    for position in sorted(keep):
        entry = entries[position - 1]
        frames = entry.get("frames") if isinstance(entry, dict) else None
        for depth, f in enumerate(x for x in _listed(frames) if isinstance(x, dict)):
            rows.append({"rank": rank, "thread": entry.get("thread_name") if isinstance(entry.get("thread_name"), str)
                         else None, "thread_state": entry.get("state") if isinstance(entry.get("state"), str) else None,
                         "depth": depth, "function": str(f.get("name")), "file": str(f.get("filename")),
                         "line": _int(f.get("line")), "source": "flight_recorder", "origin": source.name,
                         "origin_line": position})
    return frame("stacks", rows)


def _events(dump: dict, groups: dict[str, dict], rank: int | None, source: Source) -> pl.DataFrame:
    rows = [{"rank": rank, "file": source.name, "kind": "pg_config", "source": "flight_recorder",
             "message": f"process group {name} ({g['desc'] or 'no desc'}): ranks {g['ranks']}",
             "attrs": json.dumps({"pg": name, "desc": g["desc"], "ranks": g["ranks"]})}
            for name, g in groups.items()]
    version = dump.get("comm_lib_version") or dump.get("nccl_version")
    if isinstance(version, str) and re.match(r"\d+\.\d+\.\d+", version):
        rows.append({"rank": rank, "file": source.name, "kind": "version", "source": "flight_recorder",
                     "message": f"flight recorder {dump.get('version')}, comm library {version}",
                     "attrs": json.dumps({"component": "nccl", "version": version})})
    return frame("events", rows)


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    dump = load(source)
    groups = _groups(dump)
    rank = source.rank if source.rank is not None else dump_rank(dump, groups)
    if rank is None:
        source.notes.append("no rank in the file name, and pg_config does not single one out")
    entries = dump.get("entries") or []
    df = _entries_frame(entries)
    yield "collectives", _collectives(df, rank, source)
    yield "rank_status", _rank_status(dump, df, rank, source)
    yield "stacks", _stacks(dump, entries, df, rank, source)
    yield "events", _events(dump, groups, rank, source)

"""NCCL RAS reports (`ncclras`, NCCL >= 2.24) into ``events`` (kind ``ras_mismatch``) and ``rank_status``.

A line parser: ``textlog`` hands it frames of lines. RAS, asked during a hang, says which
ranks of a communicator have launched how many collectives. Real lines (NCCL 2.26.2, a
32-rank job; the format string is rasOutAppend's in src/ras/client_support.cc):

    #0-0 (fa93daea854b060b) MISMATCH
      Communicator ranks have different AllGather operation counts
      30 ranks have launched up to operation 640
      2 ranks have launched up to operation 641
      Rank 12 -- GPU 4 managed by process 323032 on node 10.0.0.1
      Rank 13 -- GPU 5 managed by process 323033 on node 10.0.0.1

Each "N ranks have launched up to operation K" line is a group of ranks; the ranks RAS lists
after a group line ("Rank 12 -- GPU ...", or one rank alone: "Rank 7 has launched up to
operation 60 -- GPU ...") are that group's, RAS's outliers. The job summary's "Processes
(total)" gives the communicator's size where the block does not list every rank. One event per
mismatch block; its attrs hold the op, the size and each group's count, operation and ranks;
each listed rank is a ``rank_status`` row (source ``nccl_ras``) at its group's operation count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import polars as pl

from postmortem.schema import frame

from . import scan
from .lines import following

_BLOCK = re.compile(r"^#(?P<group>\d+)-(?P<comm>\d+) \((?P<hash>[0-9a-f]+)\) MISMATCH\s*$")
_OP = re.compile(r"Communicator ranks have different (?P<op>\w+) operation counts")
_GROUP = re.compile(r"^\s*(?P<count>\d+) ranks have launched up to operation (?P<opcount>\d+)")
_NONE = re.compile(r"^\s*(?P<count>\d+) ranks have not launched any operations")
_RANK = re.compile(r"^\s*Rank (?P<rank>\d+)(?: has launched up to operation (?P<opcount>\d+)| has not launched any "
                   r"operations)? -- GPU")
# The job summary's numbers row, on the line after its header's second line (rasOutAppend's
# "(total)   per node  per process    (total)  (total)\n%7d  %9d  %11d  %9d  %7d\n").
_TOTAL_HEADER = r"^\s*\(total\)\s+per node\b"
_TOTAL = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$")
BLOCK_LINES = 200

LINES = rf"\) MISMATCH\s*$|{_TOTAL_HEADER}"
# (the numbers row is read as the line after its header: a row of numbers alone holds no literal
# a scan could find, and a regex over every line of every log costs 3-5 ms per 16 MB)
TRIGGER = scan.Trigger("ncclras", (") MISMATCH", "(total)"))


def _read_block(lines: list[dict]) -> dict:
    op, groups = None, []
    for row in lines[1:]:
        text = row["text"]
        m = _OP.search(text)
        if m:
            op = m["op"]
            continue
        m = _GROUP.match(text) or _NONE.match(text)
        if m:
            groups.append({"count": int(m["count"]), "op_count": int(m.groupdict().get("opcount") or 0),
                           "ranks": []})
            continue
        m = _RANK.match(text)
        if m:
            if m["opcount"] is not None or not groups:  # one rank alone, at its own count
                groups.append({"count": 1, "op_count": int(m["opcount"] or 0), "ranks": []})
            groups[-1]["ranks"].append(int(m["rank"]))
            continue
        if text.strip() and not text.startswith((" ", "\t")):
            break  # the next block or section
    return {"op": op, "groups": groups}


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    """One ``ras_mismatch`` event per RAS mismatch block in the chunk."""
    for header in own.filter(pl.col("text").str.contains(_TOTAL_HEADER)).select("file", "pos").to_dicts():
        numbers = following(df, header, 1, first=1)["text"]
        m = _TOTAL.match(numbers[0]) if numbers.len() else None
        if m:  # Nodes, processes per node, GPUs per process, processes (total), GPUs (total)
            state.setdefault("ras_processes", {})[header["file"]] = int(m[4])
    starts = own.filter(pl.col("text").str.contains(_BLOCK.pattern))
    events = []
    for start in starts.select("file", "pos", "line_no", "text", "ts_ff").to_dicts():
        m = _BLOCK.match(start["text"])
        block = _read_block(following(df, start, BLOCK_LINES).select("text").to_dicts())
        if not block["groups"]:
            continue
        events.append({"rank": None, "ts": start["ts_ff"], "file": start["file"], "line_no": start["line_no"],
                       "level": "W", "kind": "ras_mismatch", "message": start["text"].strip(),
                       "attrs": json.dumps({"comm": f"#{m['group']}-{m['comm']}", "comm_hash": m["hash"],
                                            "op": block["op"], "groups": block["groups"],
                                            "ranks": state.get("ras_processes", {}).get(start["file"])})})
    yield "events", frame("events", events)
    yield "rank_status", frame("rank_status", _listed_status(events))


# ---------------------------------------------------------------- ``ncclras -f json`` (NCCL >= 2.28.7)
# Its writer (src/ras/client_support.cc jsonWriteHeader / jsonStartCommunicator /
# jsonWriteRankData) prints {"nccl_version", ..., "communicators": [{"hash", "size", "ranks":
# [{"rank", "host", "pid", "status": {...}, "collective_counts": {"AllReduce": 65, ...}}],
# "missing_ranks": [{"rank", "status": {"unresponsive", "considered_dead"}}]}]}.

KIND = "ncclras_json"
MAX_JSON_BYTES = 64 << 20


def sniff(head: bytes, name: str) -> bool:
    start = head.lstrip()[:1]
    return start == b"{" and b'"nccl_version"' in head and b'"communicators' in head


def _listed_dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _counts(rank: dict) -> dict:
    counts = rank.get("collective_counts")
    return {k: v for k, v in counts.items() if isinstance(k, str)} if isinstance(counts, dict) else {}


def _count_groups(ranks: list[dict], op: str) -> list[dict]:
    """The ranks of one communicator grouped by how many ``op`` operations each launched."""
    by_count: dict[int, list[int]] = {}
    for r in ranks:
        n, rank = _counts(r).get(op), r.get("rank")
        if isinstance(n, int) and isinstance(rank, int) and not isinstance(rank, bool):
            by_count.setdefault(n, []).append(rank)
    return [{"count": len(v), "op_count": k, "ranks": sorted(v)} for k, v in sorted(by_count.items())]


def json_events(doc: dict, file: str) -> list[dict]:
    """One ``ras_mismatch`` event per communicator and op whose ranks launched different counts,
    as the text report's mismatch blocks give them (every rank listed); a communicator's missing
    ranks (RAS got no answer from them) are in its attrs."""
    events = []
    for i, comm in enumerate(_listed_dicts(doc.get("communicators"))):
        ranks = _listed_dicts(comm.get("ranks"))
        ops = sorted({op for r in ranks for op in _counts(r)})
        missing = [m.get("rank") for m in _listed_dicts(comm.get("missing_ranks"))]
        for op in ops:
            groups = _count_groups(ranks, op)
            if len(groups) < 2:
                continue
            events.append({"rank": None, "ts": None, "file": file, "line_no": None, "level": "W",
                           "kind": "ras_mismatch",
                           "message": f"communicator {str(comm.get('hash'))[:40]}: ranks have different {op[:40]} "
                                      "operation counts",
                           "attrs": json.dumps({"comm": f"#{i}", "comm_hash": str(comm.get("hash"))[:40], "op": op[:40],
                                                "groups": groups, "ranks": comm.get("size") if isinstance(
                                                    comm.get("size"), int) else None,
                                                "missing_ranks": [m for m in missing if isinstance(m, int)]})})
    return events


def parse(source) -> Iterator[tuple[str, pl.DataFrame]]:
    """A ``ncclras -f json`` report: its mismatches as ``ras_mismatch`` events, the ranks in them
    as ``rank_status``."""
    from .lines import open_binary

    with open_binary(source.path) as fh:
        data = fh.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        source.notes.append(f"larger than {MAX_JSON_BYTES} bytes: not read as a RAS report")
        return
    doc = json.loads(data.decode("utf-8", errors="replace"))
    if not isinstance(doc, dict):
        source.notes.append("not a JSON object")
        return
    events = json_events(doc, source.name)
    version = doc.get("nccl_version")
    if isinstance(version, str) and re.match(r"\d+\.\d+\.\d+", version):
        events.append({"rank": None, "file": source.name, "kind": "version", "source": "ncclras",
                       "message": f"NCCL RAS report, NCCL {version}",
                       "attrs": json.dumps({"component": "nccl", "version": re.match(r"\d+\.\d+\.\d+", version)[0]})})
    yield "events", frame("events", events)
    yield "rank_status", frame("rank_status", _listed_status([e for e in events if e["kind"] == "ras_mismatch"]))


def _listed_status(events: list[dict]) -> list[dict]:
    """Each rank RAS lists, at the operation count of its group: how far it got in the
    communicator (``last_enqueued``). RAS counts per NCCL communicator, not per process group
    sequence, so ``pg`` stays NULL: its counts are compared within its own report only."""
    rows = []
    for e in events:
        for g in json.loads(e["attrs"])["groups"]:
            rows += [{"rank": r, "pg": None, "last_enqueued": g["op_count"], "source": "nccl_ras",
                      "file": e["file"], "line_no": e["line_no"]} for r in g["ranks"]]
    return rows

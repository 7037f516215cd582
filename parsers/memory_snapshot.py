"""CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) into ``memory``, ``stacks`` and ``events``.

A snapshot is a pickle of plain data, read only through ``pickles.loads`` (the restricted
unpickler). Its shape (PyTorch 2.11, ``memory_snapshot_rank0.pickle`` of a real run):

    {"segments": [{"device": 0, "address": ..., "total_size": 16777216, "allocated_size": ...,
                   "blocks": [{"address": ..., "size": 16777216, "requested_size": ..., "state": "active_allocated",
                               "frames": [{"name": "main", "filename": "/workspace/jobs/train.py", "line": 141}, ...]}]}],
     "device_traces": [[{"action": "alloc", "addr": ..., "size": ..., "time_us": 1795959568972528, "frames": [...]},
                        ...]],                                    # alloc, free_requested, free_completed,
     "allocator_settings": {...}, "external_annotations": [...]}  # segment_alloc, segment_free, oom, ...

What it yields:

- ``memory`` (source ``snapshot``): the state at the dump (allocated = live blocks, reserved =
  segments); the allocated/reserved series replayed from the device trace, one row per
  ``ProfilerStep#N`` (from ``external_annotations``) or, without steps, per tenth of the trace;
  and one row per top allocation site (``site``, ``blocks``, allocated = its live bytes).
- ``stacks`` (source ``snapshot``): the Python frames of each top site's allocations, thread
  ``allocation site <k>``.
- ``events``: one ``memory_snapshot`` row whose attrs hold the totals, the fragmentation
  figures (inactive bytes in segments, largest free block), the ``oom`` action if recorded,
  and the allocator settings.

Which line kept the memory. Live blocks are grouped by their Python stack (the user's
frames: not torch, not the standard library, not Inductor's generated code); groups that
kept the most memory across steps come first. For each user frame the device trace gives
the bytes allocated under it while steps ran (after the first step it saw ended, before the
last one started) and the part of them still live at the dump. The site named for a group is
the innermost frame of its stack that is always called from the same place and kept at
least ``KEPT_SHARE`` of what it allocated: a layer's ``forward`` run by both training and
validation is called from two places and frees most of what it makes; the validation line
``out = model(x_val)`` whose outputs are kept is called from one and keeps them. Without a
trace that covers two step ends (``max_entries`` too small) the share is unknown and the
innermost frame called from one place is named. The site is where the kept memory was
allocated: when the tensor is then stored elsewhere (``outputs.append(out)``), the line named
is the one that made it, not the append.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import polars as pl

from postmortem.schema import frame

from . import pickles
from .lines import open_binary
from .source import Source

KIND = "memory_snapshot"
TOP_SITES = 5
STACK_DEPTH = 24
KEPT_SHARE = 0.3  # a frame that kept at least this share of what it allocated in steps holds on to memory
_LIVE = ("active_allocated", "active_pending_free")
# Frames that are not the user's code: the framework, the standard library, generated code.
_NOT_USER = ("site-packages/", "dist-packages/", "/torch/", "<frozen", "/lib/python3", "<string>",
             "torchinductor", "/triton/", "<eval_with_key>")


def sniff(head: bytes, name: str) -> bool:
    """A pickle whose first key is ``segments`` (or that names ``device_traces``)."""
    return head[:1] == b"\x80" and (b"segments" in head[:64] or b"device_traces" in head)


def _python_frames(frames) -> list[tuple[str, int, str]]:
    out = []
    for f in frames or ():
        if not isinstance(f, dict):
            continue
        file = f.get("filename")
        if isinstance(file, str) and file.endswith(".py"):
            out.append((file, int(f.get("line") or 0), str(f.get("name") or "")))
    return out


def _user(frames: list[tuple[str, int, str]]) -> tuple[tuple[str, int, str], ...]:
    return tuple(f for f in frames if not any(m in f[0] for m in _NOT_USER))


def _site(f: tuple[str, int, str]) -> str:
    return f"{f[0]}:{f[1]} in {f[2]}"


def _ts(time_us) -> datetime | None:
    if not isinstance(time_us, (int, float)) or time_us <= 0:
        return None
    return datetime.fromtimestamp(time_us / 1e6, tz=UTC).replace(tzinfo=None)


def _steps(annotations) -> dict[int, dict[str, int]]:
    """``ProfilerStep#N`` -> {"START": us, "END": us} from the snapshot's external annotations."""
    steps: dict[int, dict[str, int]] = {}
    for a in annotations or ():
        if not isinstance(a, dict):
            continue
        name = str(a.get("name") or "")
        if name.startswith("ProfilerStep#") and name[13:].isdigit() and isinstance(a.get("time_us"), (int, float)):
            steps.setdefault(int(name[13:]), {})[str(a.get("stage"))] = a["time_us"]
    return steps


_EFFECTS = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1), "segment_free": (0, -1)}


def _effect(action: dict) -> tuple[int, int]:
    """(change in allocated bytes, change in reserved bytes) of one trace action."""
    sign_alloc, sign_res = _EFFECTS.get(action.get("action"), (0, 0))
    size = int(action.get("size") or 0)
    return sign_alloc * size, sign_res * size


def _replay(trace: list, allocated_end: int, reserved_end: int, steps: dict, device: int,
            source: Source, rank) -> list[dict]:
    """Allocated/reserved after each step (or each tenth of the trace), replayed from the actions."""
    actions = [a for a in trace if isinstance(a, dict) and isinstance(a.get("time_us"), (int, float))]
    if not actions:
        return []
    net_alloc = sum(_effect(a)[0] for a in actions)
    net_res = sum(_effect(a)[1] for a in actions)
    # What was live before the trace began: the dump's totals less the trace's net change.
    alloc, res = allocated_end - net_alloc, reserved_end - net_res
    ends = sorted((v["END"], n) for n, v in steps.items() if "END" in v)
    if not ends:
        t0, t1 = actions[0]["time_us"], actions[-1]["time_us"]
        ends = [(t0 + (t1 - t0) * k / 10, None) for k in range(1, 11)]
    rows, i = [], 0
    for a in actions:
        while i < len(ends) and a["time_us"] > ends[i][0]:
            rows.append({"ts": _ts(ends[i][0]), "step": ends[i][1], "allocated": alloc, "reserved": res})
            i += 1
        d_alloc, d_res = _effect(a)
        alloc, res = alloc + d_alloc, res + d_res
    for end, step in ends[i:]:
        if end <= actions[-1]["time_us"]:
            rows.append({"ts": _ts(end), "step": step, "allocated": alloc, "reserved": res})
    # Only the step ends the trace covers: before its first action the figures are not known.
    first = actions[0]["time_us"]
    return [{**r, "rank": rank, "source": "snapshot", "file": source.name, "device": device}
            for r, (end, _) in zip(rows, ends) if end >= first]


def _retention(trace: list, steps: dict) -> tuple[dict, dict, dict, int | None, int | None]:
    """Bytes allocated while steps ran and still live at the dump: per user frame (with the
    bytes allocated under it in that window), and per user stack."""
    actions = [a for a in trace if isinstance(a, dict) and isinstance(a.get("time_us"), (int, float))]
    if not actions:
        return {}, {}, {}, None, None
    t0, t1 = actions[0]["time_us"], actions[-1]["time_us"]
    # Step boundaries the trace covers. A trace that saw fewer than two can't tell memory
    # kept across steps from the last step's own (max_entries too small): no retention then.
    ends = sorted(v["END"] for v in steps.values() if "END" in v and t0 <= v["END"] <= t1)
    if len(ends) < 2:
        return {}, {}, {}, None, None
    starts = sorted(v["START"] for v in steps.values() if "START" in v and v["START"] <= t1)
    lo, hi = ends[0], starts[-1]  # after the first step seen (warm-up), before the last (cut short)
    live: dict[int, tuple[int, tuple]] = {}
    allocated: dict[tuple, int] = defaultdict(int)
    for a in actions:
        act = a.get("action")
        if act == "alloc" and lo <= a["time_us"] < hi:
            stack = _user(_python_frames(a.get("frames")))
            size = int(a.get("size") or 0)
            for f in set(stack):
                allocated[f] += size
            live[a.get("addr")] = (size, stack)
        elif act == "free_completed":
            live.pop(a.get("addr"), None)
    kept: dict[tuple, int] = defaultdict(int)
    kept_stack: dict[tuple, int] = defaultdict(int)
    for size, stack in live.values():
        kept_stack[stack] += size
        for f in set(stack):
            kept[f] += size
    return allocated, kept, kept_stack, int(lo), int(hi)


def summarize(snap: dict, source: Source) -> dict[str, list[dict]]:
    """The rows of every table for one snapshot, as lists of dicts."""
    rank = source.rank
    segments = [s for s in snap.get("segments") or () if isinstance(s, dict)]
    traces = [t for t in snap.get("device_traces") or () if isinstance(t, list)]
    steps = _steps(snap.get("external_annotations"))
    by_device: dict[int, dict] = defaultdict(lambda: {"allocated": 0, "reserved": 0, "inactive": 0,
                                                      "largest_free": 0, "segments": 0, "blocks": 0})
    groups: dict[tuple, dict] = {}
    for seg in segments:
        dev = int(seg.get("device") or 0)
        d = by_device[dev]
        d["segments"] += 1
        d["reserved"] += int(seg.get("total_size") or 0)
        for b in seg.get("blocks") or ():
            if not isinstance(b, dict):
                continue
            size = int(b.get("size") or 0)
            if b.get("state") in _LIVE:
                d["allocated"] += size
                d["blocks"] += 1
                frames = _python_frames(b.get("frames"))
                key = _user(frames) or tuple(frames[:1])
                g = groups.setdefault(key, {"bytes": 0, "count": 0, "device": dev, "frames": frames})
                g["bytes"] += size
                g["count"] += 1
            elif b.get("state") == "inactive":
                d["inactive"] += size
                d["largest_free"] = max(d["largest_free"], size)
    trace = max(traces, key=len) if traces else []
    device = traces.index(trace) if trace else (next(iter(by_device)) if by_device else 0)
    timed = [a["time_us"] for a in trace if isinstance(a, dict) and isinstance(a.get("time_us"), (int, float))]
    when = _ts(max(timed)) if timed else None
    last_step = max((n for n, v in steps.items() if "START" in v), default=None)
    allocated_by, kept_by, kept_stack, lo, hi = _retention(trace, steps)

    # Where each frame is called from: a frame reached from several places (a layer's forward
    # that both training and validation run) is not where one of them keeps memory.
    callers: dict[tuple, set] = defaultdict(set)
    stacks_seen = list(groups) + [_user(_python_frames(a.get("frames"))) for a in trace
                                  if isinstance(a, dict) and a.get("action") == "alloc"]
    for stack in stacks_seen:
        for i, f in enumerate(stack):
            callers[f].add(stack[i + 1:])

    def site_of(key: tuple) -> tuple[str, int, str] | None:
        """The innermost frame of the stack that is always called from the same place and,
        when the trace covers steps, kept at least KEPT_SHARE of what it allocated in them.
        Failing that: the frame that kept the largest share; without a trace, the outermost
        frame below the script's top level (the call in the training loop)."""
        if not key:
            return None
        inner = [f for f in key if f[2] != "<module>"] or list(key)
        share = {f: kept_by.get(f, 0) / allocated_by[f] for f in inner if allocated_by.get(f)}
        for f in inner:
            if len(callers[f]) == 1 and (not allocated_by or share.get(f, 0.0) >= KEPT_SHARE):
                return f
        if share:
            return max(share, key=lambda f: (share[f], -inner.index(f)))
        return inner[-1]

    # Groups that kept the most memory across steps first, then by live bytes.
    ordered = sorted(groups.items(), key=lambda kv: (-kept_stack.get(kv[0], 0), -kv[1]["bytes"]))
    memory, stacks, sites = [], [], []
    for dev, d in sorted(by_device.items()):
        memory.append({"rank": rank, "ts": when, "step": last_step, "allocated": d["allocated"],
                       "reserved": d["reserved"], "source": "snapshot", "file": source.name, "device": dev})
    if trace:
        d = by_device.get(device, {"allocated": 0, "reserved": 0})
        memory += _replay(trace, d["allocated"], d["reserved"], steps, device, source, rank)
    for k, (key, g) in enumerate(ordered[:TOP_SITES], start=1):
        site = site_of(key)
        label = _site(site) if site else "(no Python frames recorded)"
        kept = kept_by.get(site, 0) if site else 0
        sites.append({"site": label, "bytes": g["bytes"], "blocks": g["count"],
                      "kept_across_steps": kept_stack.get(key, 0), "site_kept": kept,
                      "site_allocated": allocated_by.get(site, 0) if site else 0,
                      "stack": [_site(f) for f in key[:8]]})
        memory.append({"rank": rank, "ts": when, "step": last_step, "allocated": g["bytes"], "source": "snapshot",
                       "file": source.name, "device": g["device"], "site": label, "blocks": g["count"]})
        for depth, (file, line, func) in enumerate(g["frames"][:STACK_DEPTH]):
            stacks.append({"rank": rank, "thread": f"allocation site {k}", "thread_state": "live", "depth": depth,
                           "function": func, "file": file, "line": line, "source": "snapshot",
                           "origin": source.name})
    oom = next((a for a in reversed(trace) if isinstance(a, dict) and a.get("action") == "oom"), None)
    settings = snap.get("allocator_settings") if isinstance(snap.get("allocator_settings"), dict) else {}
    d = by_device.get(device) or {"allocated": 0, "reserved": 0, "inactive": 0, "largest_free": 0,
                                  "segments": 0, "blocks": 0}
    attrs = {
        "device": device, "allocated": d["allocated"], "reserved": d["reserved"], "inactive": d["inactive"],
        "largest_free_block": d["largest_free"], "segments": d["segments"], "live_blocks": d["blocks"],
        "trace_actions": len(trace), "steps": [min(steps), max(steps)] if steps else None,
        "retention_window_us": [lo, hi] if lo is not None else None,
        "oom": {"size": oom.get("size"), "device_free": oom.get("device_free"), "ts": str(_ts(oom.get("time_us")))}
        if oom else None,
        "expandable_segments": settings.get("expandable_segments"),
        "alloc_conf": settings.get("PYTORCH_CUDA_ALLOC_CONF") or None,
        "top_sites": sites,
    }
    top = sites[0]["site"] if sites else "none"
    event = {"rank": rank, "ts": when, "file": source.name, "level": "I", "kind": "memory_snapshot",
             "message": (f"memory snapshot: {d['allocated'] / 2**20:.1f} MiB allocated in {d['blocks']} live blocks, "
                         f"{d['reserved'] / 2**20:.1f} MiB reserved; top live allocation site {top}"),
             "attrs": json.dumps({k: v for k, v in attrs.items() if v is not None}, default=str)}
    return {"memory": memory, "stacks": stacks, "events": [event]}


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    with open_binary(source.path) as fh:
        data = fh.read(pickles.MAX_BYTES + 1)
    snap = pickles.loads(data)
    del data
    if not isinstance(snap, dict) or "segments" not in snap:
        source.notes.append("a pickle without `segments`: not a memory snapshot")
        return
    try:
        tables = {table: frame(table, rows) for table, rows in summarize(snap, source).items()}
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError, pl.exceptions.PolarsError) as exc:
        raise ValueError(f"a snapshot of unexpected shape: {type(exc).__name__}: {exc}"[:300]) from exc
    yield from tables.items()

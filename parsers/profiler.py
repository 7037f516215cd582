"""Kineto (``torch.profiler``) Chrome traces into ``kernels``, ``collectives``, ``memory`` and ``events``.

A real event (PyTorch 2.11.0+cu130, NCCL 2.28.9, an H200; ``vm_4934.*.pt.trace.json``):

    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "pid": 0, "tid": 17, "ts": 5102549517329.271, "dur": 77.984, "args": {"External id": 539, "device": 0,
     "stream": 17, "Collective name": "allreduce", "In msg nelems": 4194304, "Out msg nelems": 4194304,
     "Group size": 2, "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0, 1]", ...}}

What is read, and where it goes:

- the header: ``distributedInfo`` (rank, world size, backend, pg_config, NCCL version),
  ``deviceProperties``, ``baseTimeNanoseconds`` -> one ``events`` row of kind ``profiler_trace``
  (and ``version`` rows for NCCL and CUDA);
- ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events -> ``kernels`` (category ``nccl`` for
  ``ncclKernel_*`` and ``ncclDevKernel_*``, else ``compute``; ``memcpy``; ``memset``), each with
  the ``ProfilerStep#N`` it ran in;
- ``ProfilerStep#N`` spans -> ``kernels`` rows of category ``step_cpu`` (the CPU span) and
  ``step_gpu`` (the span of its kernels on the GPU), so one query over ``kernels`` gives a
  rank's step time next to its NCCL and compute time for that step
  (``SELECT rank, step, category, sum(dur) FROM kernels GROUP BY ALL``); and the step table:
  one ``events`` row of kind ``profiler_step`` per step, whose attrs say how the step split
  between collectives (the union of its NCCL kernels, or of its ``gloo:*`` spans when the
  collectives ran on the host) and the rest -- the same figures on GPU and CPU jobs;
- ``record_param_comms`` and ``nccl:*`` / ``gloo:*`` annotations -> ``collectives`` (source
  ``profiler``), timed by their NCCL kernel (joined on ``External id``) when there is one;
- ``[memory]`` instant events -> ``memory`` (source ``profiler``; device -1 is the CPU);
- ``cpu_op`` events -> only aggregates: the top ops by self time, as ``events`` of kind
  ``cpu_op_top``.

Streaming: the file (gzip or not) is read in blocks; the ``traceEvents`` array is cut after
the last complete event of each block and that batch decoded with msgspec into typed
structs of the few fields used, so memory holds one block plus the compact rows kept (the
rows are held until the end because ``ProfilerStep`` spans, needed to put a step on each
row, may come anywhere in the file). A cut that lands inside a string or a nested object
makes the batch invalid JSON, so it is never taken for an event boundary (after 64 such
misses an exact walk over strings and brackets finds it). A trace cut off mid-array (a killed
job) yields every complete event before the cut, then raises EOFError saying so, which marks
the file ``partial`` in ``files``; junk in the middle keeps the events before it the same way
(ValueError).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import msgspec
import polars as pl

from postmortem.schema import conform, frame

from .lines import open_binary
from .source import Source

KIND = "kineto_trace"
CHUNK_BYTES = 8 << 20
MAX_HEADER_BYTES = 64 << 20  # metadata before "traceEvents" larger than this: not a Kineto trace
MAX_BATCH_BYTES = 256 << 20  # no event boundary decodes within this much: give up on the file
TOP_OPS = 20

_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_LEADING_COMMA = re.compile(rb"\s*,?\s*")
_ARRAY_END = re.compile(rb"\}\s*\]")
# A whole string, a bracket, or the quote of a string that the buffer cuts off.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]|"', re.DOTALL)
_EMPTY_ARRAY = re.compile(rb"\s*\]")
_HEAD_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_NCCL_KERNEL = re.compile(r"^(?:void )?(?:nccl|rccl)\w*Kernel", re.IGNORECASE)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


# ---------------------------------------------------------------- typed decode


class _Args(msgspec.Struct, rename={
    "external_id": "External id", "collective": "Collective name", "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems", "group_size": "Group size", "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description", "pg_ranks": "Process Group Ranks", "seq": "Seq",
    "in_split": "In split size", "out_split": "Out split size", "total_allocated": "Total Allocated",
    "total_reserved": "Total Reserved", "nbytes": "Bytes", "device_id": "Device Id",
    "device_type": "Device Type", "stream": "stream", "device": "device", "dtype": "dtype",
}):
    """The args this parser uses; msgspec skips every other key without building it."""

    external_id: int | None = None
    stream: int | None = None
    device: int | None = None
    collective: str | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    group_size: int | None = None
    dtype: str | None = None
    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_ranks: Any = None
    seq: Any = None
    in_split: Any = None
    out_split: Any = None
    total_allocated: int | None = None
    total_reserved: int | None = None
    nbytes: int | None = None
    device_id: int | None = None
    device_type: int | None = None


class _Event(msgspec.Struct):
    ph: str | None = None
    cat: str | None = None
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args | None = None


_DECODE = msgspec.json.Decoder(list[_Event])
_DECODE_ANY = msgspec.json.Decoder()


def _int(value) -> int | None:
    """An int from a number or a numeric string (Seq, pg names, ...); None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _text(value) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


# ---------------------------------------------------------------- splitting the array


class _Malformed(ValueError):
    """The events stop being JSON in the middle of the array."""


class _TraceReader:
    """Cuts the ``traceEvents`` array of a Chrome trace into batches of decoded events.

    ``buf`` always starts with ``[`` followed by the next undecoded event, so a batch is
    decoded in place: the byte after the last complete event's ``}`` (whitespace or the
    comma) is overwritten with ``]`` for the decode and put back after it.
    """

    def __init__(self, source: Source):
        self.source = source
        self.header: dict = {}
        self.tail: dict = {}
        self.events = 0
        self.dropped = 0  # events that decoded as JSON but not as an event
        self.truncated: str | None = None

    def batches(self) -> Iterator[list[_Event]]:
        buf = bytearray()
        in_array = False
        cut_short: str | None = None
        with open_binary(self.source.path) as fh:
            while True:
                try:
                    piece = fh.read1(CHUNK_BYTES)
                except EOFError as exc:
                    cut_short = f"the gzip stream ends early ({exc})"
                    break
                if not piece:
                    break
                buf += piece
                if len(buf) < CHUNK_BYTES:
                    continue
                if not in_array:
                    m = _ARRAY_START.search(buf)
                    if m is None:
                        if len(buf) > MAX_HEADER_BYTES:
                            raise ValueError("no traceEvents array in the first 64 MiB: not a Kineto trace")
                        continue
                    self.header = _object_prefix(bytes(buf[: m.start()]))
                    buf[: m.end()] = b"["
                    in_array = True
                batch = self._complete(buf)
                if batch:
                    yield batch
                elif len(buf) > MAX_BATCH_BYTES:
                    raise _Malformed(f"no event decodes in 256 MiB of traceEvents after {self.events:,} events")
        if not in_array:
            m = _ARRAY_START.search(buf)
            if m is None:
                raise EOFError("the trace ends before its traceEvents array starts")
            self.header = _object_prefix(bytes(buf[: m.start()]))
            buf[: m.end()] = b"["
        yield from self._finish(buf, cut_short)

    def _decode(self, data) -> list[_Event] | None:
        """The events of the JSON array ``data``, or None when it is not valid JSON."""
        try:
            events = _DECODE.decode(data)
        except msgspec.ValidationError:
            # Valid JSON with a field of an unexpected type: convert event by event, leniently.
            events = []
            for raw in _DECODE_ANY.decode(data):
                try:
                    events.append(msgspec.convert(raw, _Event, strict=False))
                except msgspec.ValidationError:
                    self.dropped += 1
        except msgspec.DecodeError:
            return None
        self.events += len(events)
        return events

    def _complete(self, buf: bytearray) -> list[_Event]:
        """Decode the complete events at the start of ``buf`` and remove them from it."""
        end = len(buf)
        for _ in range(64):
            cut = _last_boundary(buf, end)
            if cut < 1:
                break
            saved = buf[cut + 1]
            buf[cut + 1] = 0x5D  # "]"
            with memoryview(buf) as view:
                events = self._decode(view[: cut + 2])
            buf[cut + 1] = saved
            if events is not None:
                rest = _LEADING_COMMA.match(buf, cut + 1).end()
                del buf[1:rest]
                return events
            end = cut  # the cut fell inside a string or a nested object: try an earlier one
        return self._complete_exactly(buf)

    def _complete_exactly(self, buf: bytearray) -> list[_Event]:
        """The slow, exact way: walk the array's strings and brackets to the end of the last
        complete event. For the rare batch whose events hold many ``}, {`` in their text."""
        depth, last_end = 0, 0
        for m in _TOKEN.finditer(buf, 1):
            c = buf[m.start()]
            if c == 0x22:  # '"'
                if m.end() - m.start() == 1:
                    break  # a string the buffer cuts off: nothing after it is complete
                continue
            if c in b"{[":
                depth += 1
            elif c in b"}]":
                depth -= 1
                if depth == 0:
                    last_end = m.end()
                elif depth < 0:
                    break  # the array's own "]"
        if not last_end:
            return []
        saved = bytes(buf[last_end:last_end + 1])
        buf[last_end:last_end + 1] = b"]"
        with memoryview(buf) as view:
            events = self._decode(view[: last_end + 1])
        buf[last_end:last_end + 1] = saved
        if events is None:
            raise _Malformed(f"malformed JSON in traceEvents after {self.events:,} events")
        rest = _LEADING_COMMA.match(buf, last_end).end()
        if rest < len(buf) and buf[rest:rest + 1] != b"]":
            del buf[1:rest]
        else:
            del buf[1:last_end]
        return events

    def _finish(self, buf: bytearray, cut_short: str | None) -> Iterator[list[_Event]]:
        events = self._complete(buf)  # all but the last event, which has no boundary after it
        if events:
            yield events
        if _EMPTY_ARRAY.match(buf, 1):
            self.tail = _object_suffix(bytes(buf[_EMPTY_ARRAY.match(buf, 1).end():]))
            self.truncated = cut_short and f"{cut_short}, after the traceEvents array"
            return
        for m in _ARRAY_END.finditer(buf):
            with memoryview(buf) as view:
                events = self._decode(view[: m.end()])
            if events is not None:
                self.tail = _object_suffix(bytes(buf[m.end():]))
                if events:
                    yield events
                self.truncated = cut_short and f"{cut_short}, after the traceEvents array"
                return
        # The array never ends: the file was cut off. Every complete event but one that ends
        # right at the cut was taken above; take that one too.
        body = buf.rstrip().rstrip(b",")
        if len(body) > 1:
            events = self._decode(body + b"]")
            if events:
                yield events
                buf = bytearray(b"[")
        why = cut_short or "the file ends"
        self.truncated = (f"{why} inside the traceEvents array: read {self.events:,} complete events, "
                          f"dropped the last {max(len(buf) - 1, 0):,} bytes (an event cut off)")


def _last_boundary(buf: bytearray, end: int) -> int:
    """Index of the ``}`` of the last ``}, {`` before ``end``, or -1."""
    while True:
        i = buf.rfind(b"}", 0, end)
        if i < 0 or _BOUNDARY.match(buf, i):
            return i
        end = i


def _object_prefix(data: bytes) -> dict:
    """The keys of ``{ "a": 1, "b": ...,`` (a JSON object cut before its next key)."""
    text = data.strip().rstrip(b",")
    if not text.startswith(b"{"):
        return {}
    try:
        doc = _DECODE_ANY.decode(text + b"}") if text != b"{" else {}
    except msgspec.DecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _object_suffix(data: bytes) -> dict:
    """The keys of ``, "traceName": "..." }`` (what follows the array)."""
    text = data.strip()
    if text.startswith(b","):
        text = text[1:]
    try:
        doc = _DECODE_ANY.decode(b"{" + text)
    except msgspec.DecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


# ---------------------------------------------------------------- sniffing


def sniff(head: bytes, name: str) -> bool:
    return head.lstrip()[:1] == b"{" and (b'"traceEvents"' in head or b'"schemaVersion"' in head)


def rank_from_head(head: bytes) -> int | None:
    """``distributedInfo.rank`` when the metadata before the events holds it."""
    m = _HEAD_RANK.search(head)
    return int(m[1]) if m else None


# ---------------------------------------------------------------- rows


class _Rows:
    """Per-batch column lists, turned into small frames after each batch."""

    def __init__(self):
        self.kernels: list[pl.DataFrame] = []
        self.memory: list[pl.DataFrame] = []
        self.ops: list[pl.DataFrame] = []
        self.comms: list[dict] = []
        self.annotations: list[dict] = []
        self.nccl_kernels: dict[int, tuple[float, float]] = {}  # External id -> (ts, dur)
        self.steps: dict[int, dict] = {}  # step -> {"ts", "dur", "gpu_ts", "gpu_dur"}
        self.pid: int | str | None = None  # the profiled process

    def add(self, batch: list[_Event]) -> None:
        k_ts, k_dur, k_name, k_cat, k_stream, k_dev = [], [], [], [], [], []
        m_ts, m_alloc, m_res, m_delta, m_dev = [], [], [], [], []
        o_tid, o_ts, o_dur, o_name, o_own = [], [], [], [], []
        for e in batch:
            cat = e.cat
            ts = e.ts
            if ts is None:
                continue
            if cat == "cpu_op":
                if e.dur is not None:
                    o_tid.append(e.tid)
                    o_ts.append(ts)
                    o_dur.append(e.dur)
                    o_name.append(e.name)
                    o_own.append(True)
                if e.name == "record_param_comms" and e.args is not None:
                    self.comms.append(_comm(e))
                if self.pid is None and e.pid is not None:
                    self.pid = e.pid
            elif cat == "cpu_instant_event":
                if e.name == "[memory]" and e.args is not None:
                    a = e.args
                    m_ts.append(ts)
                    m_alloc.append(a.total_allocated)
                    m_res.append(a.total_reserved)
                    m_delta.append(a.nbytes)
                    m_dev.append(-1 if a.device_type == 0 else a.device_id)  # type 0: the CPU allocator
            elif cat == "kernel" or cat in _COPY_CATEGORIES:
                a = e.args
                name = e.name
                if cat == "kernel":
                    if _NCCL_KERNEL.match(name):
                        category = "nccl"
                        if a is not None and a.external_id is not None:
                            self.nccl_kernels[a.external_id] = (ts, e.dur or 0.0)
                    else:
                        category = "compute"
                else:
                    category = _COPY_CATEGORIES[cat]
                k_ts.append(ts)
                k_dur.append(e.dur)
                k_name.append(name)
                k_cat.append(category)
                if a is not None:
                    k_stream.append(a.stream if a.stream is not None else e.tid)
                    k_dev.append(a.device)
                else:
                    k_stream.append(e.tid)
                    k_dev.append(None)
            elif cat == "user_annotation":
                name = e.name
                if e.dur is None:
                    continue
                step = _STEP.match(name) if name.startswith("ProfilerStep#") else None
                if step:
                    self.steps.setdefault(int(step[1]), {}).update(ts=ts, dur=e.dur)
                elif name.startswith(_COMM_PREFIXES):
                    self.annotations.append(_annotation(e))
                # Annotations nest cpu ops; they count for the ops' self time, not as ops.
                o_tid.append(e.tid)
                o_ts.append(ts)
                o_dur.append(e.dur)
                o_name.append(name)
                o_own.append(False)
            elif cat == "gpu_user_annotation":
                step = _STEP.match(e.name) if e.name.startswith("ProfilerStep#") else None
                if step:
                    self.steps.setdefault(int(step[1]), {}).update(gpu_ts=ts, gpu_dur=e.dur)
        if k_ts:
            self.kernels.append(pl.DataFrame(
                {"ts_rel": k_ts, "dur_f": k_dur, "name": k_name, "category": k_cat,
                 "stream": [_int(x) for x in k_stream], "device": k_dev},
                schema={"ts_rel": pl.Float64, "dur_f": pl.Float64, "name": pl.String, "category": pl.String,
                        "stream": pl.Int32, "device": pl.Int32}, strict=False))
        if m_ts:
            self.memory.append(pl.DataFrame(
                {"ts_rel": m_ts, "allocated": m_alloc, "reserved": m_res, "delta": m_delta, "device": m_dev},
                schema={"ts_rel": pl.Float64, "allocated": pl.Int64, "reserved": pl.Int64, "delta": pl.Int64,
                        "device": pl.Int32}, strict=False))
        if o_ts:
            self.ops.append(pl.DataFrame(
                {"tid": [str(t) for t in o_tid], "ts_rel": o_ts, "dur_f": o_dur, "name": o_name, "own": o_own},
                schema={"tid": pl.String, "ts_rel": pl.Float64, "dur_f": pl.Float64, "name": pl.String,
                        "own": pl.Boolean}, strict=False))


_COPY_CATEGORIES = {"gpu_memcpy": "memcpy", "Memcpy": "memcpy", "gpu_memset": "memset", "Memset": "memset"}
_COMM_PREFIXES = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")


def _comm(e: _Event) -> dict:
    a = e.args
    splits = {k: v for k, v in (("in_split", a.in_split), ("out_split", a.out_split))
              if v not in (None, "", "[]", [])}
    return {
        "tid": str(e.tid), "ts_rel": e.ts, "dur_f": e.dur, "op": _text(a.collective),
        "numel_in": _int(a.in_nelems), "numel_out": _int(a.out_nelems), "dtypes": _text(a.dtype),
        "pg": None if a.pg_name is None else str(a.pg_name), "seq_id": _int(a.seq), "external_id": a.external_id,
        "sizes": json.dumps({**splits, "group_size": a.group_size, "pg_desc": _text(a.pg_desc),
                             "pg_ranks": _text(a.pg_ranks)}),
    }


def _annotation(e: _Event) -> dict:
    a = e.args
    return {"tid": str(e.tid), "ts_rel": e.ts, "dur_f": e.dur, "op": e.name,
            "external_id": a.external_id if a is not None else None}


# ---------------------------------------------------------------- assembling the tables


def _abs_ts(col: str, base_us: int | None) -> pl.Expr:
    """Trace-relative microseconds to a UTC timestamp."""
    rel = pl.col(col).round(0).cast(pl.Int64, strict=False)
    return pl.from_epoch(rel + base_us if base_us is not None else rel, time_unit="us")


def _py_ts(rel: float | None, base_us: int | None) -> datetime | None:
    """A trace-relative time as a naive UTC datetime; None when it is not one."""
    if rel is None or base_us is None:
        return None
    try:
        return datetime(1970, 1, 1) + timedelta(microseconds=round(rel) + base_us)
    except (OverflowError, ValueError):
        return None


def _step_frame(steps: dict[int, dict], start: str, dur: str) -> pl.DataFrame:
    rows = [(n, s[start], s[start] + (s[dur] or 0.0)) for n, s in steps.items() if s.get(start) is not None]
    return pl.DataFrame(rows, schema={"step": pl.Int64, "s_start": pl.Float64, "s_end": pl.Float64},
                        orient="row").sort("s_start")


def _with_step(df: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Add the step whose span holds each row's ``ts_rel`` (NULL outside every span)."""
    if spans.is_empty() or df.is_empty():
        return df.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    joined = df.with_row_index("_row").sort("ts_rel").join_asof(
        spans, left_on="ts_rel", right_on="s_start", strategy="backward")
    return joined.with_columns(
        pl.when(pl.col("ts_rel") <= pl.col("s_end")).then(pl.col("step")).alias("step")
    ).sort("_row").drop("_row", "s_start", "s_end")


def _top_ops(ops: pl.DataFrame) -> list[dict]:
    """cpu ops by self time: a span's duration less that of the spans directly inside it on
    its thread (annotations nest ops and count as their parents, but are not reported)."""
    ops = ops.sort(["tid", "ts_rel", "dur_f"], descending=[False, False, True])
    self_time = [0.0] * ops.height
    stack: list[tuple[int, float]] = []  # (row, end) of the open spans
    last_tid = None
    for i, (tid, ts, dur) in enumerate(zip(ops["tid"].to_list(), ops["ts_rel"].to_list(), ops["dur_f"].to_list())):
        if tid != last_tid:
            stack.clear()
            last_tid = tid
        end = ts + dur
        while stack and stack[-1][1] < ts:
            stack.pop()
        if stack and end <= stack[-1][1] + 1e-3:
            self_time[stack[-1][0]] -= dur
        self_time[i] += dur
        stack.append((i, end))
    # summed in whole nanoseconds (a trace's unit), not as floats: the order a float sum takes, which
    # Polars' threads vary, moved a total across the 0.1 us it is rounded to between two analyses of
    # the same trace (646.2 and 646.3 us)
    ns = lambda col: (pl.col(col) * 1000).round(0).cast(pl.Int64)  # noqa: E731
    agg = (ops.with_columns(pl.Series("self_f", self_time)).filter("own")
           .group_by("name").agg(pl.len().alias("calls"), (ns("self_f").sum() / 1000).alias("self_us"),
                                 (ns("dur_f").sum() / 1000).alias("total_us"))
           .sort(["self_us", "name"], descending=[True, False]))
    total = agg["self_us"].sum() or 1.0
    return [{"name": r["name"], "calls": r["calls"], "self_us": round(r["self_us"], 1),
             "total_us": round(r["total_us"], 1), "self_share": round(r["self_us"] / total, 4)}
            for r in agg.head(TOP_OPS).to_dicts()]


def _collectives(rows: _Rows, rank, base_us, name: str) -> pl.DataFrame:
    """One row per ``record_param_comms`` (the c10d call, with its args), timed by its NCCL
    kernel when the kernel carries the same ``External id``; traces without it give one row
    per ``nccl:*`` / ``gloo:*`` annotation instead."""
    comms = rows.comms or rows.annotations
    if not comms:
        return frame("collectives")
    df = pl.DataFrame(comms, infer_schema_length=None)
    kernel = rows.nccl_kernels
    ext = df["external_id"].to_list()
    k_ts = [kernel[x][0] if x in kernel else None for x in ext]
    k_end = [kernel[x][0] + kernel[x][1] if x in kernel else None for x in ext]
    df = df.with_columns(pl.Series("k_ts", k_ts, dtype=pl.Float64), pl.Series("k_end", k_end, dtype=pl.Float64),
                         (pl.col("ts_rel") + pl.col("dur_f").fill_null(0.0)).alias("end_rel"))
    return conform("collectives", df.with_columns(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.lit("profiler").alias("source"),
        pl.lit("completed").alias("state"),
        _abs_ts("ts_rel", base_us).alias("t_created"),
        pl.coalesce(_abs_ts("k_ts", base_us), _abs_ts("ts_rel", base_us)).alias("t_started"),
        pl.coalesce(_abs_ts("k_end", base_us), _abs_ts("end_rel", base_us)).alias("t_completed"),
        pl.lit(name).alias("file"),
    ))


def _union_by_step(spans: pl.DataFrame) -> dict[int, tuple[float, int]]:
    """step -> (time covered by the union of its [start, end) spans, span count).

    Collectives overlap (gloo runs buckets on several threads, NCCL kernels on several
    streams): the time a rank spent in collectives is the union, not the sum."""
    if spans.is_empty():
        return {}
    merged = (
        spans.select("step", pl.col("ts_rel").alias("a"), (pl.col("ts_rel") + pl.col("dur_f")).alias("b"))
        .sort("step", "a")
        .with_columns(pl.col("b").cum_max().shift(1).over("step").alias("reach"))
        .with_columns((pl.col("reach").is_null() | (pl.col("a") > pl.col("reach"))).cum_sum().over("step").alias("g"))
        .group_by("step", "g").agg(pl.col("a").min(), pl.col("b").max(), pl.len().alias("n"))
        .group_by("step").agg((pl.col("b") - pl.col("a")).sum().alias("t"), pl.col("n").sum())
    )
    return {r["step"]: (r["t"], r["n"]) for r in merged.to_dicts()}


def _step_table(rows: _Rows, kernels: pl.DataFrame | None, cpu_spans: pl.DataFrame, rank, base_us,
                name: str) -> list[dict]:
    """One ``profiler_step`` event per ProfilerStep: its time, and how it split between
    collectives and the rest. With NCCL kernels, the time in collectives is the union of the
    step's NCCL kernels and compute the sum of its other kernels. Without (gloo, even on CUDA
    tensors) it is the union of the ``gloo:*`` / ``nccl:*`` spans that started in the step, on
    any thread, and ``other_us`` the rest of the step (compute, data loading, Python)."""
    if cpu_spans.is_empty():
        return []
    comm: dict[int, tuple[float, int]] = {}
    compute: dict[int, float] = {}
    source = None
    if kernels is not None and (kernels["category"] == "nccl").any():
        stepped = kernels.filter(pl.col("step").is_not_null())
        comm = _union_by_step(stepped.filter(pl.col("category") == "nccl"))
        compute = dict(stepped.filter(pl.col("category") == "compute").group_by("step")
                       .agg(pl.col("dur_f").sum()).iter_rows())
        source = "nccl_kernels"
    elif rows.annotations:
        spans = pl.DataFrame(rows.annotations, infer_schema_length=None).filter(pl.col("dur_f").is_not_null())
        comm = _union_by_step(_with_step(spans, cpu_spans).filter(pl.col("step").is_not_null()))
        source = "cpu_collective_spans"
    if kernels is not None and not compute:
        compute = dict(kernels.filter(pl.col("step").is_not_null() & (pl.col("category") == "compute"))
                       .group_by("step").agg(pl.col("dur_f").sum()).iter_rows())
    events = []
    for r in cpu_spans.to_dicts():
        n, dur = r["step"], r["s_end"] - r["s_start"]
        in_comm, count = comm.get(n, (0.0, 0)) if source else (None, None)
        attrs = {"step": n, "dur_us": round(dur, 1), "comm_source": source, "collectives": count,
                 "comm_us": None if in_comm is None else round(in_comm, 1),
                 "compute_us": round(compute[n], 1) if n in compute else None,
                 "other_us": round(max(dur - in_comm, 0.0), 1) if source == "cpu_collective_spans" else None}
        text = f"ProfilerStep#{n}: {dur / 1000:.1f} ms"
        if in_comm is not None:
            text += f", {in_comm / 1000:.1f} ms in collectives"
        if attrs["compute_us"] is not None:
            text += f", {attrs['compute_us'] / 1000:.1f} ms of compute kernels"
        events.append({"rank": rank, "ts": _py_ts(r["s_start"], base_us),
                       "file": name, "level": "I", "kind": "profiler_step", "message": text,
                       "attrs": json.dumps({k: v for k, v in attrs.items() if v is not None})})
    return events


def _info_event(reader: _TraceReader, rows: _Rows, source: Source, rank, base_us, window) -> list[dict]:
    h = {**reader.tail, **reader.header}
    dist = h.get("distributedInfo") if isinstance(h.get("distributedInfo"), dict) else {}
    devices = [{"id": d.get("id"), "name": d.get("name"), "total_bytes": d.get("totalGlobalMem")}
               for d in h.get("deviceProperties") or [] if isinstance(d, dict)]
    steps = sorted(rows.steps)
    ts = _py_ts(window[0], base_us) if base_us is not None else None
    attrs = {
        "world_size": dist.get("world_size"), "backend": dist.get("backend"), "pg_count": dist.get("pg_count"),
        "pg_config": dist.get("pg_config"), "nccl_version": dist.get("nccl_version"), "devices": devices,
        "base_time_ns": h.get("baseTimeNanoseconds"), "trace_name": h.get("traceName"),
        "window_us": None if window[0] is None else round(window[1] - window[0], 1),
        "steps": [steps[0], steps[-1]] if steps else None, "events": reader.events,
        "events_dropped": reader.dropped or None, "truncated": reader.truncated,
    }
    common = {"rank": rank, "ts": ts, "file": source.name, "level": "I",
              "pid": rows.pid if isinstance(rows.pid, int) else None}
    out = [{**common, "kind": "profiler_trace", "message": f"Kineto trace of {reader.events:,} events"
            + (f", ProfilerStep#{steps[0]}..#{steps[-1]}" if steps else ""),
            "attrs": json.dumps({k: v for k, v in attrs.items() if v is not None}, default=str)}]
    if dist.get("nccl_version"):
        out.append({**common, "kind": "version", "message": f"NCCL version {dist['nccl_version']} (profiler)",
                    "attrs": json.dumps({"component": "nccl", "version": str(dist["nccl_version"])})})
    cuda = h.get("cuda_runtime_version")
    if isinstance(cuda, int) and cuda > 0:
        version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        out.append({**common, "kind": "version", "message": f"CUDA runtime {version} (profiler)",
                    "attrs": json.dumps({"component": "cuda", "version": version})})
    return out


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    reader = _TraceReader(source)
    rows = _Rows()
    malformed = None
    try:
        for batch in reader.batches():
            rows.add(batch)
    except _Malformed as exc:  # junk in the middle: keep what came before it
        malformed = exc
    h = {**reader.tail, **reader.header}
    dist = h.get("distributedInfo") if isinstance(h.get("distributedInfo"), dict) else {}
    rank = _int(dist.get("rank"))
    if rank is None:
        rank = source.rank
    elif source.rank is None:
        source.rank = rank
    base_ns = _int(h.get("baseTimeNanoseconds"))
    base_us = base_ns // 1000 if base_ns else None

    kernels = pl.concat(rows.kernels) if rows.kernels else None
    memory = pl.concat(rows.memory) if rows.memory else None
    if base_us is None:
        # Older Kineto wrote epoch microseconds; without a base, relative times stay relative.
        probes = [f["ts_rel"].min() for f in (kernels, memory) if f is not None]
        probes += [s["ts"] for s in rows.steps.values() if s.get("ts") is not None]
        base_us = 0 if probes and min(probes) > 1e15 else None
    cpu_spans = _step_frame(rows.steps, "ts", "dur")
    gpu_spans = _step_frame(rows.steps, "gpu_ts", "gpu_dur")
    lo = [f["ts_rel"].min() for f in (kernels, memory) if f is not None] + list(cpu_spans["s_start"])
    hi = [f["ts_rel"].max() for f in (kernels, memory) if f is not None] + list(cpu_spans["s_end"])
    window = (min(lo), max(hi)) if lo else (None, None)
    ts_base = base_us if base_us is not None else 0

    if kernels is not None:
        kernels = _with_step(kernels, gpu_spans if not gpu_spans.is_empty() else cpu_spans)
        yield "kernels", conform("kernels", kernels.with_columns(
            pl.lit(rank, dtype=pl.Int32).alias("rank"), _abs_ts("ts_rel", ts_base).alias("ts"),
            pl.col("dur_f").round(0).cast(pl.Int64, strict=False).alias("dur")))
    steps = []
    for spans, category in ((cpu_spans, "step_cpu"), (gpu_spans, "step_gpu")):
        if not spans.is_empty():
            steps.append(spans.with_columns(
                pl.lit(rank, dtype=pl.Int32).alias("rank"), _abs_ts("s_start", ts_base).alias("ts"),
                (pl.col("s_end") - pl.col("s_start")).round(0).cast(pl.Int64, strict=False).alias("dur"),
                pl.format("ProfilerStep#{}", pl.col("step")).alias("name"), pl.lit(category).alias("category")))
    if steps:
        yield "kernels", pl.concat([conform("kernels", s) for s in steps])
    if memory is not None:
        memory = _with_step(memory, cpu_spans)
        yield "memory", conform("memory", memory.with_columns(
            pl.lit(rank, dtype=pl.Int32).alias("rank"), _abs_ts("ts_rel", ts_base).alias("ts"),
            pl.lit("profiler").alias("source"), pl.lit(source.name).alias("file")))
    yield "collectives", _collectives(rows, rank, ts_base, source.name)
    events = _info_event(reader, rows, source, rank, base_us, window)
    events += _step_table(rows, kernels, cpu_spans, rank, ts_base, source.name)
    if rows.ops:
        for op in _top_ops(pl.concat(rows.ops)):
            events.append({"rank": rank, "ts": None, "file": source.name, "level": "I", "kind": "cpu_op_top",
                           "message": op["name"][:2000],
                           "attrs": json.dumps({k: v for k, v in op.items() if k != "name"})})
    yield "events", frame("events", events)
    if malformed is not None:
        raise ValueError(f"{malformed}; the events before it were read")
    if reader.truncated:
        raise EOFError(reader.truncated)

"""TORCH_TRACE structured logs (``dedicated_log_torch_trace_rank_N_*.log``, gz too) into ``compiles``.

The files tlparse reads: a glog header and a JSON envelope per record, then the record's payload
on the tab-indented lines that follow (its md5 in ``has_payload``). Real lines (PyTorch
2.13.0+cpu, ``TORCH_TRACE=dir``):

    V1129 14:38:57.367000 11818 site-packages/torch/_dynamo/guards.py:5400] {"artifact": {"name": "recompile_reasons", "encoding": "json"}, "rank": 0, "frame_id": 4, "frame_compile_id": 2, "attempt": 0, "has_payload": "00b3f9852c0e90658615d6e23ddd234f"}
    	[
    	"4/1: scale == 1.01    # return self.head(self.blocks(x)) * scale  # ork/main/sample_logs/generate/train.py:55 in forward ...",

What is read: ``str`` (file-name interning), ``dynamo_start`` (the stack that started a compile),
``compilation_metrics`` (one per compile attempt: code object, timings, ``fail_type``/``fail_reason``,
``restart_reasons``, ``recompile_reason``), ``bwd_compilation_metrics`` failures, the artifacts
``recompile_reasons``, ``dynamo_graph_break_reason`` and the FX/AOT cache hit/miss/bypass ones,
and the guard dumps (``dynamo_cpp_guards_str``, older ``dynamo_guards``: count and kinds only).
Everything else (graphs, generated code, chromium events, tensor descriptions) is recognised by
its key and skipped without decoding its payload.

The file is read in chunks of lines (``CHUNK_BYTES``); each chunk is one Polars frame. Record
types, compile ids and the fields of the few records that matter come from expressions (a regex
on the glog header, ``str.json_path_match`` on the envelope); Python runs once per record that
matters (a compile's metrics, its recompile reasons, a graph break), never per line, and never
decodes a whole file. A chunk ends on a record boundary: the last record, which may continue in
the next block, is carried over (without its payload when nobody reads it). Measured on this
project's 2-core machine: a 100 MB trace (the recompile_limit sample's, 40 times over) in 2.3 s
at 280 MB RSS; tlparse 0.4.3 takes 21 s on it (it also writes its HTML report).

The rank is the one the file's name gives (as in tlparse's multi-rank report), else the records'.
Compile ids are tlparse's: ``frame/compile`` plus ``_attempt`` for a restart after a graph break.

Malformed envelopes, unknown record types, payloads whose md5 does not match and a cut-off
gzip stream are counted in ``source.notes`` (→ ``files.error``); none stops the parse.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import polars as pl

from postmortem.schema import frame

from . import dynamo
from .lines import line_series, newline_blocks, open_binary
from .runtime import TRACEBACK_FRAME
from .source import Source

KIND = "torch_trace"
CHUNK_BYTES = 8 << 20  # 100 MB in ~2.3 s at ~280 MB RSS on 2 cores (32 MB chunks: 630 MB)
# A record's payload nobody reads is dropped from the carry-over once it is this long.
MAX_CARRY_LINES = 1 << 16

_SNIFF = re.compile(rb"^[VIWECD]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] \{\"\w+\": ")
# The glog header before the envelope (matched on the header alone: envelopes run to 40 KB).
_HEADER = r"^(?<level>[VIWECD])(?<mon>\d\d)(?<day>\d\d) (?<hms>\d\d:\d\d:\d\d)\.(?<frac>\d+) +(?<thread>\d+) (?<emitter>\S+:\d+)$"
_META_KEYS = ("rank", "compiled_autograd_id", "frame_id", "frame_compile_id", "attempt", "has_payload", "stack")
# Record types PyTorch writes (tlparse's Envelope, src/types.rs, and later additions).
KNOWN = frozenset((
    "str", "dynamo_start", "dynamo_output_graph", "optimize_ddp_split_graph", "optimize_ddp_split_child",
    "compiled_autograd_graph", "dynamo_guards", "aot_forward_graph", "aot_backward_graph", "aot_inference_graph",
    "aot_joint_graph", "inductor_pre_grad_graph", "inductor_post_grad_graph", "dynamo_cpp_guards_str",
    "inductor_output_code", "compilation_metrics", "bwd_compilation_metrics",
    "aot_autograd_backward_compilation_metrics", "graph_dump", "link", "symbolic_shape_specialization",
    "propagate_real_tensors_provenance", "guard_added", "create_unbacked_symbol", "expression_created",
    "missing_fake_kernel", "mismatched_fake_kernel", "artifact", "describe_storage", "describe_tensor",
    "describe_source", "dump_file", "chromium_event", "guard_added_fast", "exported_program",
    "compilation_metrics_runtime", "bwd_compilation_metrics_runtime", "inductor_collective_schedule",
    "inductor_runtime_and_tensor_meta", "graph_execution", "dynamo_graph_break_reason",
))
_CACHE_ARTIFACTS = {
    f"{cache}_{outcome}": (cache, outcome)
    for cache in ("fx_graph_cache", "aotautograd_cache")
    for outcome in ("hit", "miss", "bypass")
}
_PAYLOAD_ARTIFACTS = ("recompile_reasons", "dynamo_graph_break_reason", "inductor_collective_schedule")
_METRICS_FIELDS = (
    "compile_id", "co_name", "co_filename", "co_firstlineno", "cache_size", "accumulated_cache_size", "fail_type",
    "fail_reason", "fail_user_frame_filename", "fail_user_frame_lineno", "restart_reasons", "recompile_reason",
    "entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s", "guard_count",
    "graph_op_count", "is_runtime", "num_graph_breaks",
)
_LIMIT_FAILURE = re.compile(r"(?i)recompile limit exceeded|cache_size_limit|recompile_limit|cache limit hit")


def sniff(head: bytes, name: str) -> bool:
    """A glog header followed by a JSON envelope on the first line: ``V1129 14:38:51.610000 11818 path:2350] {"``."""
    first = head.lstrip(b"\n")[:4096]
    return _SNIFF.match(first) is not None


# ------------------------------------------------------------------ reading records in chunks


def _pieces(source: Source) -> Iterator[tuple[pl.DataFrame, bool]]:
    """(frame of lines with line_no, whether the stream ended early) per block of lines."""
    next_line = 1
    with open_binary(source.path) as fh:
        for data, cut_off in newline_blocks(fh, CHUNK_BYTES):
            if cut_off and not data:
                yield pl.DataFrame(schema={"line_no": pl.Int64, "text": pl.String}), cut_off
                continue
            df = _split(data, next_line)
            next_line += df.height
            yield df, cut_off


def _split(data: bytes, first_line_no: int) -> pl.DataFrame:
    return pl.DataFrame({"text": line_series(data).str.strip_suffix("\r")}).with_columns(
        pl.int_range(first_line_no, first_line_no + pl.len(), dtype=pl.Int64).alias("line_no")
    ).select("line_no", "text")


def _records(source: Source, seen: dict) -> Iterator[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]]:
    """(headers, wanted records, their payload lines) per chunk; every record whole in one chunk."""
    carry: pl.DataFrame | None = None
    for piece, truncated in _pieces(source):
        df = piece if carry is None else pl.concat([carry, piece])
        carry = None
        df = df.with_columns(
            (~pl.col("text").str.starts_with("\t") & (pl.col("text").str.len_bytes() > 0)).alias("is_header")
        ).with_columns(pl.col("is_header").cast(pl.Int32).cum_sum().alias("rec"))
        if not truncated:
            last = df["rec"].max()
            if last:  # the last record may go on in the next block
                tail = df.filter(pl.col("rec") == last)
                df = df.filter(pl.col("rec") < last)
                if tail.height > MAX_CARRY_LINES and not _wanted_header(tail["text"][0]):
                    tail = tail.head(1)
                carry = tail.select("line_no", "text")
        yield from _chunk(df, final=truncated)
        seen["truncated"] = seen.get("truncated", False) or truncated
    if carry is not None:
        df = carry.with_columns(
            (~pl.col("text").str.starts_with("\t") & (pl.col("text").str.len_bytes() > 0)).alias("is_header")
        ).with_columns(pl.col("is_header").cast(pl.Int32).cum_sum().alias("rec"))
        yield from _chunk(df, final=True)


def _wanted_header(text: str) -> bool:
    kinds = ("dynamo_start", "compilation_metrics", "artifact", "dynamo_cpp_guards_str", "dynamo_guards", "str")
    return any(f'"{k}"' in text[:200] for k in kinds)


def _record_kind() -> pl.Expr:
    first = pl.col("env").str.extract(r'^\{"(\w+)"', 1)
    # Envelopes put the record's key first; if a meta key leads, take the first key that is not one.
    later = pl.col("env").str.extract(r'"(\w+)": [\{\[]', 1)
    return pl.when(first.is_in(list(_META_KEYS))).then(later).otherwise(first)


def _chunk(df: pl.DataFrame, final: bool = False) -> Iterator[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]]:
    """Split a chunk's lines into headers, the records that matter, and those records' payload lines.

    In the file's last chunk the last record is checked whatever its type (valid JSON, payload md5):
    a file cut while being written ends in a broken record.
    """
    if df.is_empty():
        return
    cut = pl.col("text").str.find("] {", literal=True)
    headers = df.filter(pl.col("is_header")).with_columns(
        pl.col("text").str.slice(0, cut).str.extract_groups(_HEADER).alias("h"),
        pl.col("text").str.slice(cut + 2).alias("env"),
    ).unnest("h").with_columns(
        pl.when(pl.col("level").is_not_null()).then(pl.col("env")).alias("env")
    ).with_columns(_record_kind().alias("kind"))
    headers = headers.with_columns(
        pl.when(pl.col("kind") == "artifact")
        .then(pl.col("env").str.extract(r'^\{"artifact": \{"name": "([^"]+)"', 1))
        .alias("artifact")
    )
    last = pl.lit(final) & (pl.col("rec") == pl.col("rec").max())
    wanted = headers.filter(
        pl.col("kind").is_in(["str", "dynamo_start", "compilation_metrics", "bwd_compilation_metrics",
                              "aot_autograd_backward_compilation_metrics", "dynamo_cpp_guards_str", "dynamo_guards"])
        | pl.col("artifact").is_in([*_PAYLOAD_ARTIFACTS, *_CACHE_ARTIFACTS])
        | last
    ).with_columns(
        (pl.col("kind").is_in(["dynamo_cpp_guards_str", "dynamo_guards"]) | pl.col("artifact").is_in(_PAYLOAD_ARTIFACTS)
         | last).fill_null(False).alias("needs_payload")
    )
    payload_recs = wanted.filter(pl.col("needs_payload"))["rec"]
    payload = df.filter(~pl.col("is_header") & pl.col("rec").is_in(payload_recs.implode())).select(
        "rec", pl.col("text").str.slice(1).alias("line"))
    yield headers, wanted, payload


# ------------------------------------------------------------------ turning records into rows


@dataclass
class _Compile:
    """What is known of one compile id before its compilation_metrics record arrives."""
    start: dict | None = None
    reasons: list[str] | None = None
    cache: dict[str, str] = field(default_factory=dict)
    guards: tuple[int, dict] | None = None
    breaks: int = 0
    collectives: list[str] | None = None


@dataclass
class _State:
    source: Source
    strings: dict[int, str] = field(default_factory=dict)
    frames: dict[int, tuple[str | None, str | None, int | None]] = field(default_factory=dict)
    compiles: dict[tuple, _Compile] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    malformed: list[int] = field(default_factory=list)
    md5_mismatch: list[int] = field(default_factory=list)
    unknown: Counter = field(default_factory=Counter)
    unparsed: list[int] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)

    def compile(self, key: tuple) -> _Compile:
        return self.compiles.setdefault(key, _Compile())


def _cid(ca: int | None, frame_id: int | None, compile_id: int | None, attempt: int | None) -> str | None:
    if frame_id is None or compile_id is None:
        return None
    cid = f"{frame_id}/{compile_id}" + (f"_{attempt}" if attempt else "")
    return f"!{ca}/{cid}" if ca is not None else cid


def _int(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _float(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


_METRICS_KINDS = ("compilation_metrics", "bwd_compilation_metrics", "aot_autograd_backward_compilation_metrics")
# The envelope's own keys follow the record's object: ``..., "rank": 0, "frame_id": 4, ...}``.
_TAIL = r'[}\]](, "(?:rank|compiled_autograd_id|frame_id|frame_compile_id|attempt|has_payload)": .*)\}$'


def _envelope_fields(wanted: pl.DataFrame, year: int) -> pl.DataFrame:
    """The wanted records' envelope fields, by expressions.

    Metrics envelopes run to 40 KB: they are parsed once (a validity check) plus once per field
    they are asked for; the compile id comes from the envelope's short tail.
    """
    env = pl.col("env")
    ts = pl.format("{}-{}-{} {}.{}", pl.lit(str(year)), pl.col("mon"), pl.col("day"), pl.col("hms"),
                   pl.col("frac").str.slice(0, 6)).str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    tail = pl.concat_str(pl.lit("{"), env.str.extract(_TAIL, 1).str.slice(2), pl.lit("}"))
    wanted = wanted.with_columns(
        env.str.json_path_match("$").is_not_null().alias("valid"),
        ts.alias("ts"),
        tail.str.json_path_match("$.rank").cast(pl.Int32, strict=False).alias("env_rank"),
        tail.str.json_path_match("$.compiled_autograd_id").cast(pl.Int64, strict=False).alias("ca"),
        tail.str.json_path_match("$.frame_id").cast(pl.Int64, strict=False).alias("frame_id"),
        tail.str.json_path_match("$.frame_compile_id").cast(pl.Int64, strict=False).alias("compile_id"),
        tail.str.json_path_match("$.attempt").cast(pl.Int64, strict=False).alias("attempt"),
        tail.str.json_path_match("$.has_payload").alias("md5"),
    )
    big = pl.col("kind").is_in(_METRICS_KINDS)
    small = wanted.filter(~big).with_columns(
        env.str.json_path_match("$.str[0]").alias("str_value"),
        env.str.json_path_match("$.str[1]").cast(pl.Int64, strict=False).alias("str_index"),
        env.str.json_path_match("$.dynamo_start.stack").alias("stack"),
    )
    bwd = wanted.filter(big & (pl.col("kind") != "compilation_metrics")).with_columns(
        pl.coalesce(env.str.json_path_match("$.bwd_compilation_metrics.fail_type"),
                    env.str.json_path_match("$.aot_autograd_backward_compilation_metrics.fail_type")).alias("bwd_fail"),
    )
    metrics = wanted.filter(pl.col("kind") == "compilation_metrics")
    return pl.concat([small, bwd, metrics], how="diagonal_relaxed").sort("line_no")


def _metrics_fields(env: str) -> dict:
    """The fields of one compilation_metrics record (one per compile attempt: few, decoded one by one)."""
    try:
        doc = json.loads(env)
    except ValueError:
        return {}
    m = doc.get("compilation_metrics") if isinstance(doc, dict) else None
    return {name: m.get(name) for name in _METRICS_FIELDS} if isinstance(m, dict) else {}


def _stack_frames(state: _State, stack_json: str | None) -> list[dict]:
    if not stack_json:
        return []
    try:
        stack = json.loads(stack_json)
    except ValueError:
        return []
    frames = []
    for f in stack if isinstance(stack, list) else []:
        if not isinstance(f, dict):
            continue
        name = f.get("filename")
        file = state.strings.get(name, f"<string {name}>") if isinstance(name, int) else str(name)
        frames.append({"file": file, "line": _int(f.get("line")), "function": f.get("name")})
    return frames


def _payload_text(lines: list[str] | None) -> str:
    return "\n".join(lines or [])


def _reasons(text: str) -> list[str] | None:
    """A recompile_reasons payload: a JSON list, or (one reason) the bare text PyTorch 2.13 writes
    although it says ``"encoding": "json"``; None when it looks like a list but is not one."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except ValueError:
            return None
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return [stripped] if stripped else []


def _reason_row(reason: str | None) -> dict:
    """Reason, class and user frame of a recompile reason (the same text TORCH_LOGS prints)."""
    if not reason:
        return {"reason": None, "reason_class": None, "user_frame": None, "info": {}}
    lines = reason.split("\n")
    entry = dynamo.parse_guard_entry(lines[0])
    frames = [{"file": m["file"], "line": int(m["line"]), "function": m["func"]}
              for m in map(TRACEBACK_FRAME.match, lines[1:]) if m]
    cls, info = dynamo.classify_guard(entry["guard"])
    user = dynamo.innermost_user(frames)
    return {"reason": entry["guard"][:dynamo.MAX_REASON], "reason_class": cls,
            "user_frame": dynamo.frame_text(user) if user else entry["where"],
            "info": {"cache_entry": entry["entry"], **info}}


def _handle(state: _State, rec: dict, payload: list[str] | None) -> None:
    kind, artifact = rec["kind"], rec["artifact"]
    if not rec["valid"]:
        state.malformed.append(rec["line_no"])
        return
    if payload is not None and rec["md5"] and hashlib.md5(_payload_text(payload).encode()).hexdigest() != rec["md5"]:
        state.md5_mismatch.append(rec["line_no"])
    if rec["env_rank"] is not None:
        state.ranks.add(rec["env_rank"])
    key = (rec["ca"], rec["frame_id"], rec["compile_id"])
    cid = _cid(rec["ca"], rec["frame_id"], rec["compile_id"], rec["attempt"])
    # The file's name (what discovery read, and what tlparse's multi-rank report goes by) names the
    # rank; records say it too. They agree unless files were renamed or copied; then the name wins.
    rank = state.source.rank if state.source.rank is not None else rec["env_rank"]
    common = {"rank": rank, "ts": rec["ts"],
              "frame_id": rec["frame_id"], "attempt": cid, "file": state.source.name, "line_no": rec["line_no"],
              "source": "torch_trace"}
    if kind == "str":
        if rec["str_index"] is not None and rec["str_value"] is not None:
            state.strings[rec["str_index"]] = rec["str_value"]
    elif kind == "dynamo_start":
        frames = _stack_frames(state, rec["stack"])
        top = frames[-1] if frames else None
        if top and rec["frame_id"] is not None:
            state.frames[rec["frame_id"]] = (top["function"], top["file"], top["line"])
        user = dynamo.innermost_user(frames)
        state.compile(key).start = {**common, "function": top["function"] if top else None,
                                    "code_file": top["file"] if top else None, "code_line": top["line"] if top else None,
                                    "user_frame": dynamo.frame_text(user) if user else None,
                                    "framework": dynamo.code_framework(top["file"], top["line"]) if top else None}
    elif artifact == "inductor_collective_schedule":
        try:
            ops = json.loads(_payload_text(payload) or "[]")
        except ValueError:
            state.malformed.append(rec["line_no"])
            return
        pending = state.compile(key)
        pending.collectives = (pending.collectives or []) + [_short_op(str(op)) for op in ops]
    elif artifact == "recompile_reasons":
        reasons = _reasons(_payload_text(payload))
        if reasons is None:
            state.malformed.append(rec["line_no"])
        state.compile(key).reasons = reasons or None
    elif artifact in _CACHE_ARTIFACTS:
        cache, outcome = _CACHE_ARTIFACTS[artifact]
        state.compile(key).cache[cache] = outcome
    elif artifact == "dynamo_graph_break_reason":
        row = dynamo.parse_graph_break(payload or [])
        if row is None:
            return
        pending = state.compile(key)
        pending.breaks += 1
        if row["user_frame"] is None and pending.start is not None:
            row["user_frame"] = pending.start["user_frame"]
        state.rows.append({**common, **row, "event": "graph_break"})
    elif kind in ("dynamo_cpp_guards_str", "dynamo_guards"):
        if kind == "dynamo_guards":
            count = sum(line.count('"code"') for line in payload or [])
            state.compile(key).guards = (count, {})
        else:
            state.compile(key).guards = dynamo.guard_kinds(payload or [])
    elif kind == "compilation_metrics":
        _metrics(state, rec, key, common)
    elif rec.get("bwd_fail"):
        reason = _bwd_reason(rec["env"])
        state.rows.append({**common, "event": "failure", "reason": f"{rec['bwd_fail']}: {reason}"[:1000],
                           "attrs": json.dumps({"fail_type": rec["bwd_fail"], "backward": True})})


def _bwd_reason(env: str) -> str:
    try:
        doc = json.loads(env)
    except ValueError:
        return ""
    m = next((v for k, v in doc.items() if k.endswith("compilation_metrics")), None) if isinstance(doc, dict) else None
    return str(m.get("fail_reason") or "").strip() if isinstance(m, dict) else ""


def _metrics(state: _State, rec: dict, key: tuple, common: dict) -> None:
    m = {name: None for name in _METRICS_FIELDS} | _metrics_fields(rec["env"])
    pending = state.compiles.pop(key, _Compile())
    start = pending.start or {}
    frame_id = rec["frame_id"]
    known = state.frames.get(frame_id, (None, None, None)) if frame_id is not None else (None, None, None)
    function = m["co_name"] or start.get("function") or known[0]
    code_file = m["co_filename"] or start.get("code_file") or known[1]
    code_line = _int(m["co_firstlineno"]) or start.get("code_line") or known[2]
    if frame_id is not None and function:
        state.frames[frame_id] = (function, code_file, code_line)
    reason_text = m["recompile_reason"] or (pending.reasons[0] if pending.reasons else None)
    reason = _reason_row(reason_text)
    fail_type, fail_reason = m["fail_type"], m["fail_reason"]
    restarts = [str(r) for r in m["restart_reasons"]] if isinstance(m["restart_reasons"], list) else []
    if fail_type and _LIMIT_FAILURE.search(f"{fail_type} {fail_reason or ''}"):
        event = "limit_hit"
    elif fail_type:
        event = "failure"
    elif (rec["compile_id"] or 0) > 0:
        event = "recompile"
    else:
        event = "compile"
    timings = {k: _float(m[k]) for k in ("entire_frame_compile_time_s", "backend_compile_time_s",
                                         "inductor_compile_time_s")}
    guards = pending.guards or (None, None)
    attrs = {**reason["info"], **{k: v for k, v in timings.items() if v is not None},
             "cache_size": _int(m["cache_size"]), "guard_count": _int(m["guard_count"]) or guards[0],
             "guard_kinds": guards[1] or None, "graph_op_count": _int(m["graph_op_count"]),
             "restart_reasons": [r.split("\n", 1)[0][:300] for r in restarts] or None,
             "cache": pending.cache or None, "fail_type": fail_type, "collectives": pending.collectives,
             "recompile_reasons": len(pending.reasons) if pending.reasons else None,
             "is_runtime": True if m["is_runtime"] is True else None}
    if event == "limit_hit":
        limit = re.search(r"(?:Limit type: |config\.)(\w+)", fail_reason or "")
        size = re.search(r"currently set to (\d+)", fail_reason or "")
        attrs.update(limit_type=limit[1] if limit else None, limit=int(size[1]) if size else None)
    row = {**common, "function": function, "code_file": code_file, "code_line": code_line, "event": event,
           "user_frame": reason["user_frame"] or start.get("user_frame"),
           "framework": dynamo.code_framework(code_file, code_line)}
    if event == "failure":
        user = f"{m['fail_user_frame_filename']}:{m['fail_user_frame_lineno']}" if m["fail_user_frame_filename"] else None
        row.update(reason=f"{fail_type}: {(fail_reason or '').strip()}"[:1000], user_frame=user or row["user_frame"])
    elif event in ("recompile", "limit_hit"):
        row.update(reason=reason["reason"], reason_class=reason["reason_class"])
    row["attrs"] = json.dumps({k: v for k, v in attrs.items() if v not in (None, [], {})})
    state.rows.append(row)
    # Before dynamo_graph_break_reason artifacts existed, restart reasons were the only record of a graph break.
    if restarts and not pending.breaks:
        for reason_text in restarts:
            state.rows.append({**common, "function": function, "code_file": code_file, "code_line": code_line,
                               "event": "graph_break", "reason": reason_text.split("\n", 1)[0][:1000],
                               "user_frame": start.get("user_frame"), "framework": start.get("framework"),
                               "attrs": json.dumps({"from": "restart_reasons"})})


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    state = _State(source)
    lines = 0
    seen: dict = {}
    for headers, wanted, payload in _records(source, seen):
        lines = max(lines, int(headers["line_no"].max() or 0)) if not headers.is_empty() else lines
        state.unparsed += headers.filter(pl.col("env").is_null())["line_no"].to_list()[:100]
        unknown = headers.filter(pl.col("env").is_not_null() & ~pl.col("kind").is_in(list(KNOWN)))
        state.unknown.update(unknown["kind"].fill_null("?").to_list())
        if wanted.is_empty():
            continue
        bodies = {r: lines_ for r, lines_ in payload.group_by("rec", maintain_order=True).agg(pl.col("line")).iter_rows()}
        for rec in _envelope_fields(wanted, source.year).to_dicts():
            _handle(state, rec, bodies.get(rec["rec"], []) if rec["needs_payload"] else None)
        if state.rows:
            yield "compiles", frame("compiles", state.rows)
            state.rows = []
    # Compiles that started and never finished: the process ended (or hung) while compiling.
    for pending in state.compiles.values():
        if pending.start is not None:
            state.rows.append({**pending.start, "event": "compile",
                               "reason": "started, no compilation_metrics: the process ended or hung while compiling",
                               "attrs": json.dumps({"unfinished": True})})
    if state.rows:
        yield "compiles", frame("compiles", state.rows)
    source.lines = lines or None
    _notes(state)
    if seen.get("truncated"):
        # After every row is out: the caller records the file as partial, with this reason.
        raise EOFError("the gzip stream ends early (file cut while being written)")


def _short_op(op: str) -> str:
    """``torch.ops._c10d_functional.all_reduce_.default`` -> ``all_reduce_``."""
    parts = op.split(".")
    return parts[-2] if len(parts) >= 2 and parts[-1] == "default" else parts[-1]


def _notes(state: _State) -> None:
    notes = state.source.notes
    named = state.source.rank
    if named is not None and state.ranks - {named}:
        said = ", ".join(map(str, sorted(state.ranks)))
        notes.append(f"records say rank {said}, the file name rank {named}: the file name's is used")
    if state.malformed:
        notes.append(f"{len(state.malformed)} malformed JSON record(s) or payload(s) (first at line "
                     f"{state.malformed[0]})")
    if state.md5_mismatch:
        notes.append(f"{len(state.md5_mismatch)} payload(s) not matching their has_payload md5 "
                     f"(first at line {state.md5_mismatch[0]})")
    if state.unparsed:
        notes.append(f"{len(state.unparsed)} line(s) without a glog header and JSON envelope "
                     f"(first at line {state.unparsed[0]})")
    if state.unknown:
        kinds = ", ".join(f"{k} x{n}" for k, n in state.unknown.most_common(5))
        notes.append(f"{sum(state.unknown.values())} record(s) of unknown type ({kinds})")

"""torch.compile's TORCH_LOGS text (recompiles, graph breaks, limit hits, guards) into ``compiles``.

A line parser of ``textlog``: it gets the chunk's line frames and yields ``compiles`` rows.
Real lines it reads (PyTorch 2.13.0+cpu, ``TORCH_LOGS=recompiles,graph_breaks``, torchrun):

    [rank0]:V1129 14:38:57.367000 11818 site-packages/torch/_dynamo/guards.py:5396] [4/1] [__recompiles] Recompiling function forward in /work/main/sample_logs/generate/train.py:53
    [rank0]:V1129 14:38:57.367000 11818 site-packages/torch/_dynamo/guards.py:5396] [4/1] [__recompiles]     - 4/0: scale == 1.0                                             # return self.head(self.blocks(x)) * scale  # ork/main/sample_logs/generate/train.py:55 in forward
    [rank0]:W1129 14:39:01.279000 11818 site-packages/torch/_dynamo/convert_frame.py:1994] [4/8] torch._dynamo hit config.recompile_limit (8)
    [rank0]:V1129 14:39:09.023000 12667 site-packages/torch/_dynamo/symbolic_convert.py:5124] [4/0] [__graph_breaks] Graph break in user code at /work/main/sample_logs/generate/train.py:64

and the older forms: the 2.1 header ``[2023-11-21 19:02:13,073] torch._dynamo.guards.__recompiles:
[DEBUG] ...``, 2.3's ``[__recompiles]`` without a compile id, reasons without the ``N/M:`` cache
entry, ``hit config.cache_size_limit (64)`` (2.5 and before), ``Graph break: <reason> from user code
at:`` (2.1, 2.2) and ``Reason:`` for ``Graph Break Reason:`` (2.3, 2.4); 2.0's limit hit whose
``   function: 'run' (...)`` / ``   reasons: ...`` lines carry no header, the ``UserWarning: Graph
break due to unsupported builtin sys.audit.`` of 2.1-2.5, and ``torch._dynamo.explain()``'s printout
(``  Break Reason 148:`` / ``    Reason: ...`` / ``    User Stack:`` / ``<FrameSummary file ...>``).

Exceptions raised to the user are ``failure`` rows: ``torch._dynamo.exc.BackendCompilerFailed:
backend='inductor' raised:`` (its cause, on the next line, in the reason), the class's bare name
(``Unsupported: ...``) when dynamo's ``from user code:`` / ``You can suppress this exception``
text follows, and Inductor's ``RuntimeError: Found NVIDIA GeForce GTX 1080 which is too old to be
supported by the triton GPU compiler``. The same lines under a logging header were logged
(``suppress_errors=True``: the frame runs eager), not raised, and give none.

Each multi-line record (a recompile with its guard failures, a limit hit with its ``function:`` and
``last reason:`` lines, a graph break with its reason and user traceback, a ``[__guards]`` dump) is a
*block*: the lines of one rank that share the compile id and the logging artifact (or the emitting
source line). Blocks are numbered with vectorized expressions; Python runs once per block, never
per line. The block parsers here also read TORCH_TRACE payloads (``torch_trace``): the text is the
same.

Rows are raw observations, one per logged record: a recompile seen in both TORCH_LOGS and
TORCH_TRACE is two rows (``source`` tells them apart); signatures count distinct compile ids.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator

import polars as pl
import pyarrow as pa

from postmortem.schema import conform, frame

from . import scan
from .columns import dictionary, from_buffer, series_of, values_of
from .lines import extract_groups, following, header_source, key_ids
from .runtime import TRACEBACK_FRAME, is_user_frame

try:  # the grouping of lines into records, in C (parsers/_lines.c), built where a compiler was at install
    from . import _lines as _records_c
except ImportError:  # pragma: no cover (CI builds it; tests/test_dynamo_parser.py holds both paths equal)
    _records_c = None

MAX_REASON = 1000
EXCEPTION_LOOKAHEAD = 80

# ------------------------------------------------------------------ shared: guards, frames

_CID = r"!?\d+(?:/\d+){1,2}(?:_\d+)?"
# A traceback.FrameSummary's repr, as torch._dynamo.explain() printed its user stacks before 2.2:
# "<FrameSummary file /path/attention.py, line 67 in <resume in forward>>"
_FRAME_SUMMARY = re.compile(r"^\s*<FrameSummary file (?P<file>.+?), line (?P<line>\d+) in (?P<func>.+)>\s*$")
_ENTRY = re.compile(rf"^(?:(?P<entry>{_CID}): ?)?(?P<rest>.*)$")
_WHERE = re.compile(r"# (?P<where>\S+:\d+) in (?P<func>\S+)(?: \(HINT: (?P<hint>[^)]*)\))?\s*$")
_LOCAL = re.compile(r"\b[LG]\['([^']+)'\]")
_TENSOR = re.compile(r"^tensor '(?P<src>.+?)' (?P<what>[\w ]+?) mismatch(?: at index (?P<dim>\d+))?\.? *"
                     r"(?:expected (?P<expected>[^,]+), actual (?P<actual>.+)|.*)$")
_EQUALS = re.compile(r"^(?P<src>[^=!<>()]+?) == (?P<value>-?[\d.]+(?:e[+-]?\d+)?|True|False|None|'[^']*'|\"[^\"]*\")$")
_TYPE_ID = re.compile(r"___check_(?:type|obj)_id\((?P<src>[^,]+),")
_TYPE_NAME = re.compile(r"type=<class '(?P<type>[^']+)'>")
_GLOBAL = re.compile(r"GLOBAL_STATE|___check_global_state|TORCH_FUNCTION_MODE_STACK|___check_torch_function_mode_stack"
                     r"|DEFAULT_DEVICE|utils_device\.CURRENT_DEVICE|grad_mode|autocast|___check_current_backend")
_SHAPE = re.compile(r"\b(?:size|stride|rank|numel) mismatch|\.size\(\)|\.stride\(\)|storage_offset|\blen\(|LENGTH_CHECK"
                    r"|\bs\d+\b")
_TYPE = re.compile(r"___check_type_id|___check_obj_id|\btype=<class|TYPE_MATCH|ID_MATCH|\bis not None\b|\bis None\b")
_TORCH_PATH = re.compile(r"(?:^|/)torch/")
_THIRD_PARTY = re.compile(r"(?:site|dist)-packages/")
_FRAMEWORKS = (
    ("nn/parallel/distributed.py", "ddp"),
    ("distributed/fsdp/", "fsdp"),
    ("distributed/_composable/fsdp", "fsdp"),
    ("distributed/tensor/", "dtensor"),
    ("distributed/pipelining/", "pipelining"),
    ("distributed/", "distributed"),
)


def normalize_source(source: str) -> str:
    """``L['x']`` (PyTorch before 2.5) and ``x`` (after) name the same guarded value."""
    return _LOCAL.sub(r"\1", source.strip())


def classify_guard(text: str) -> tuple[str, dict]:
    """The class of a guard failure and what it says: (class, {guard, dim, expected, actual}).

    Classes: ``shape`` (sizes, strides, ranks, lengths), ``dtype``, ``type_id`` (type or object
    identity), ``global_state`` (grad mode, autocast, function-mode stack, default device),
    ``python_scalar`` (a Python constant the graph was specialized on), ``other``.
    """
    text = text.strip()
    tensor = _TENSOR.match(text)
    if tensor:
        info = {"guard": normalize_source(tensor["src"]), "expected": tensor["expected"], "actual": tensor["actual"],
                "dim": int(tensor["dim"]) if tensor["dim"] else None}
        what = tensor["what"]
        cls = "dtype" if "dtype" in what else "shape" if re.search(r"size|stride|rank|numel", what) else "other"
        return cls, info
    if _GLOBAL.search(text):
        changed = re.search(r"changed: (\S+)", text)
        return "global_state", {"guard": changed[1] if changed else text.split(":")[0][:80]}
    if "dtype" in text and "mismatch" in text:
        return "dtype", {}
    if _SHAPE.search(text):
        src = re.search(r"(?:len\()?([LG]\['[^']+'\](?:\.\w+)*|[A-Za-z_][\w.]*)(?:\.size\(\)|\.stride\(\)|\))", text)
        return "shape", {"guard": normalize_source(src[1]) if src else None}
    type_id = _TYPE_ID.search(text)
    if type_id:
        type_name = _TYPE_NAME.search(text)
        return "type_id", {"guard": normalize_source(type_id["src"]), "expected": type_name["type"] if type_name else None}
    if _TYPE.search(text):
        return "type_id", {}
    equals = _EQUALS.match(text)
    if equals:
        return "python_scalar", {"guard": normalize_source(equals["src"]), "expected": equals["value"]}
    return "other", {}


def parse_guard_entry(line: str) -> dict:
    """One guard failure: ``4/0: scale == 1.0   # code  # path:55 in forward`` (cache entry, guard, where)."""
    m = _ENTRY.match(line.strip())
    entry, rest = (m["entry"], m["rest"]) if m else (None, line.strip())
    guard, _, comment = rest.partition("  # ")
    where = _WHERE.search(rest) if comment else None
    return {"entry": entry, "guard": guard.strip(), "where": where["where"] if where else None}


def frame_text(f: dict) -> str:
    return f"{f['file']}:{f['line']}"


def innermost_user(frames: list[dict]) -> dict | None:
    """The innermost frame (frames are outermost first) whose file is the user's own code."""
    return next((f for f in reversed(frames) if is_user_frame(f["file"])), None)


def _module_call(f: dict) -> bool:
    """nn.Module's call dispatch (``_call_impl``): every module call goes through it, whoever wrote the module."""
    return (f["file"].endswith("torch/nn/modules/module.py")
            and f.get("function") in ("_call_impl", "_wrapped_call_impl"))


def framework_of(location: str | None, frames: list[dict]) -> str | None:
    """Which part of torch a break at ``location`` sits in; None when it is the user's own code.

    A break is framework-internal when it is not in user code and the calls between the user's
    innermost frame and the break go through torch (DDP's forward, FSDP's hooks, ...). A break in
    a third-party library the user called is the user's (the call is where to act). nn.Module's
    call dispatch is no framework: a break found calling a module is that module's.
    """
    if frames and _module_call(frames[-1]) and location == frame_text(frames[-1]):
        location = None  # explain()'s stack ends at the dispatch that called the module it could not inline
    frames = [f for f in frames if not _module_call(f)]
    if location and is_user_frame(location.rsplit(":", 1)[0]):
        return None
    user = innermost_user(frames)
    below = frames[frames.index(user) + 1:] if user else frames
    paths = [f["file"] for f in below] + ([location.rsplit(":", 1)[0]] if location else [])
    torch_paths = [p for p in paths if _TORCH_PATH.search(p)]
    if not torch_paths:
        if user is None and location and not is_user_frame(location.rsplit(":", 1)[0]):
            if _TORCH_PATH.search(location):
                return "torch"
            # a third-party library's own line (its traceback cut to that frame) is the user's to act on,
            # as a call into it would be; Python's standard library is not
            return None if _THIRD_PARTY.search(location) else "stdlib"
        return None
    for marker, name in _FRAMEWORKS:
        if any(marker in p for p in torch_paths):
            return name
    return "torch"


def code_framework(code_file: str | None, code_line: int | None = None) -> str | None:
    """The framework a compiled frame belongs to (DDP's wrapper, torch's ``external_utils.inner``), or None."""
    if not code_file or is_user_frame(code_file) or code_file.startswith("<"):
        return None
    return framework_of(f"{code_file}:{code_line or 0}", [])


def _frames(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        m = TRACEBACK_FRAME.match(line) or _FRAME_SUMMARY.match(line)
        if m:
            out.append({"file": m["file"], "line": int(m["line"]), "function": (m["func"] or "").strip() or None})
    return out


def _attrs(**values) -> str | None:
    kept = {k: v for k, v in values.items() if v not in (None, [], {}, "")}
    return json.dumps(kept, default=str) if kept else None


def _short(text: str | None) -> str | None:
    return None if text is None else text[:MAX_REASON]


# ------------------------------------------------------------------ shared: block parsers


def parse_recompile(lines: list[str]) -> dict | None:
    """``Recompiling function F in FILE:LINE`` and its guard failures (first = the newest cache entry)."""
    head = re.match(r"^\s*Recompiling function (?P<fn>\S+) in (?P<file>.+?)(?::(?P<line>\d+))?\s*$", lines[0])
    if not head:
        return None
    entries: list[dict] = []
    for line in lines[1:]:
        s = line.strip()
        if not s.startswith("- "):
            continue  # "triggered by ...", "guard 0 failures:" (recompiles_verbose)
        item = s[2:]
        if item.startswith("User stack trace:"):
            continue
        if item[:1].isspace():
            f = TRACEBACK_FRAME.match(item)
            if f and entries:
                entries[-1]["frames"].append({"file": f["file"], "line": int(f["line"]), "function": f["func"]})
            continue
        entries.append({**parse_guard_entry(item), "frames": []})
    return _guarded({"function": head["fn"], "code_file": head["file"],
                     "code_line": int(head["line"]) if head["line"] else None}, entries)


def _guarded(row: dict, entries: list[dict]) -> dict:
    """A row's reason, class and user frame from its guard failures (the first one leads)."""
    first = entries[0] if entries else {"entry": None, "guard": "", "where": None, "frames": []}
    cls, info = classify_guard(first["guard"])
    user = innermost_user(first["frames"])
    row.update(reason=_short(first["guard"]), reason_class=cls,
               user_frame=frame_text(user) if user else first["where"],
               attrs=_attrs(cache_entry=first["entry"], failures=len(entries), **info))
    return row


def parse_recompile_tuple(text: str) -> dict | None:
    """PyTorch 2.0: ``('Recompiling function step in /path.py', "triggered by the following guard failure: L['t'] == 0")``."""
    m = re.match(r"""^\('Recompiling function (?P<fn>\S+) in (?P<file>[^']+)', ["'](?:triggered by the following """
                 r"""guard failure: )?(?P<guard>.*)["']\)\s*$""", text.strip())
    if not m:
        return None
    return _guarded({"function": m["fn"], "code_file": m["file"], "code_line": None},
                    [{"entry": None, "guard": m["guard"], "where": None, "frames": []}])


def parse_limit(lines: list[str]) -> dict | None:
    """``torch._dynamo hit config.recompile_limit (8)`` with its ``function:`` and ``last reason:`` lines."""
    head = re.search(r"hit config\.(?P<type>\w+) \((?P<limit>\d+)\)", lines[0])
    old = None if head else re.search(
        r"hit recompilation cache limit \((?P<limit>\d+)\) for function '(?P<fn>[^']*)' \((?P<file>.+?):(?P<line>\d+)\)"
        r"(?:, due to the following guard failures: \[\[(?P<q>['\"])(?P<guard>.*?)(?P=q)\])?", lines[0])
    if old:  # one line: the frame, then every cache entry's failed guards (the first is kept)
        head = {"type": "cache_size_limit", "limit": old["limit"]}
        lines = [lines[0], f"function: '{old['fn']}' ({old['file']}:{old['line']})"] + (
            [f"reasons: {old['guard']}"] if old["guard"] else [])
    if not head:
        return None
    fn = reason = None
    frames: list[dict] = []
    for line in lines[1:]:
        s = line.strip()
        if s.startswith("function:"):
            fn = re.match(r"function: '(?P<fn>[^']*)' \((?P<file>.+?):(?P<line>\d+)\)", s)
        elif s.startswith(("last reason:", "reasons:")):
            reason = s.split(":", 1)[1].strip()
        else:
            f = TRACEBACK_FRAME.match(line)
            if f:
                frames.append({"file": f["file"], "line": int(f["line"]), "function": f["func"]})
    entry = parse_guard_entry(reason) if reason else {"entry": None, "guard": "", "where": None}
    row = _guarded({"function": fn["fn"] if fn else None, "code_file": fn["file"] if fn else None,
                    "code_line": int(fn["line"]) if fn else None}, [{**entry, "frames": frames}])
    attrs = json.loads(row["attrs"] or "{}")
    attrs.pop("failures", None)  # the limit message quotes only the last reason
    attrs.update(limit_type=head["type"], limit=int(head["limit"]))
    row["attrs"] = json.dumps(attrs)
    return row


_GB_HEAD = re.compile(r"^\s*Graph break (?:\((?P<note>[^)]*)\) )?in user code at (?P<file>.+):(?P<line>\d+)\s*$")
_GB_OLD = re.compile(r"^\s*Graph break: (?P<reason>.*?) ?from user code at:\s*$")
# The first words of the `Tensor.item()` warning's head (variables/tensor.py), its tail a block of its own
# only where they were cut off.
_ITEM_HEAD = "Graph break from `Tensor.item()`"
# The tail of the `Tensor.item()` warning, logged without the graph_breaks artifact (2.3+)
_ITEM_TAIL = r"^\s*Graph break: from user code at:\s*$"
# 2.1-2.5's warn_once of an unsupported builtin (a pybind / C extension call), a Python warning:
# "Graph break due to unsupported builtin sys.audit. This function is either a Python builtin ..."
_GB_WARNING = re.compile(r"^\s*(?P<reason>Graph break due to .+?)(?:\.\s+(?P<rest>[A-Z].*))?$")
# torch._dynamo.explain()'s printout: "  Break Reason 148:" then "    Reason: ..." and "    User Stack:"
_GB_EXPLAIN = re.compile(r"^\s*Break Reason (?P<n>\d+):\s*$")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)]\.)\s+(?=[A-Z])")
_GENERIC_REASON = ("Encountered graph break when attempting to trace",)


def _warned_graph_break(line: str) -> dict | None:
    """The unsupported-builtin warning: no location (the warning names dynamo's own line), the
    callee in the reason, the message's last sentence (what to do) as the hint."""
    m = _GB_WARNING.match(line)
    if not m:
        return None
    hint = _SENTENCE_END.split(m["rest"])[-1].strip().rstrip(".") if m["rest"] else None
    return {"function": None, "code_file": None, "code_line": None, "reason": _short(m["reason"]), "user_frame": None,
            "framework": None, "attrs": _attrs(headline=_short(m["reason"]), hints=[hint] if hint else [], kind="warning")}


def parse_graph_break(lines: list[str], item_tail: bool = False) -> dict | None:
    """A graph break's location, reason (headline and explanation), hints and user traceback.

    Reads ``Graph break in user code at F:L`` / ``Graph Break Reason:`` (2.5+) or ``Reason:``
    (2.3, 2.4) blocks, ``Graph break: <reason> from user code at:`` (2.1, 2.2, and the tail of the
    ``Tensor.item()`` warning), in TORCH_LOGS or a TORCH_TRACE ``dynamo_graph_break_reason`` payload;
    ``torch._dynamo.explain()``'s ``Break Reason N:`` blocks (the break is where its user stack
    ends) and the ``Graph break due to unsupported builtin`` warning. ``item_tail``: the lines are the
    ``Tensor.item()`` warning's second half, its head cut off.
    """
    if lines[0].lstrip().startswith("Graph break due to "):
        return _warned_graph_break(lines[0])
    head = _GB_HEAD.match(lines[0])
    old = None if head else _GB_OLD.match(lines[0])
    item = item_tail or lines[0].lstrip().startswith(_ITEM_HEAD)
    explain = _GB_EXPLAIN.match(lines[0])
    if not (head or old or item or explain):
        return None
    reason = old["reason"] if old else None
    headline = explanation = gb = None
    hints: list[str] = []
    trace_lines: list[str] = []
    in_trace = old is not None
    for line in lines[1:]:
        s = line.strip()
        if in_trace:
            if s.startswith(("Traceback (most recent call last)", "NOTE:")):
                break
            trace_lines.append(line)
            continue
        if s.startswith(("Graph Break Reason:", "Reason:")) and reason is None:
            reason = s.split(":", 1)[1].strip()
        elif s.startswith("Explanation:"):
            explanation = s.split(":", 1)[1].strip()
        elif s.startswith("Hint:"):
            hints.append(s.split(":", 1)[1].strip())
        elif "compile-graph-break-site/gb/" in s:
            m = re.search(r"gb/(gb\d+)\.html", s)
            gb = m[1] if m else None
        elif (s.startswith(("User code traceback:", "Graph break: from user code at:", "User Stack:"))
              or _GB_OLD.match(line)):
            in_trace = True
        elif s.startswith("torch._dynamo.config.") and item:
            hints.append(s)
        elif s and headline is None and reason and reason.startswith(_GENERIC_REASON) and not s.startswith(
                ("Developer debug context", "For more details", "=====")):
            headline = s
    frames = _frames(trace_lines)
    if head:
        location = f"{head['file']}:{head['line']}"
    elif frames:
        location = frame_text(frames[-1])
    else:
        location = None
    if item:
        reason = reason or _ITEM_HEAD
        headline = _ITEM_HEAD
    headline = headline or (reason or "").rstrip(":") or None
    user = innermost_user(frames)
    if user is None and location and is_user_frame(location.rsplit(":", 1)[0]):
        user = {"file": location.rsplit(":", 1)[0], "line": int(location.rsplit(":", 1)[1])}
    text = headline or ""
    if explanation and explanation not in text:
        text = f"{text}: {explanation}" if text else explanation
    file, _, line = (location or "").rpartition(":")
    called = [f for f in frames if not _module_call(f)]  # explain()'s stack ends in nn.Module's dispatch
    return {"function": called[-1]["function"] if called else None, "code_file": file or None,
            "code_line": int(line) if line.isdigit() else None, "reason": _short(text) or None,
            "user_frame": frame_text(user) if user else None, "framework": framework_of(location, frames),
            "attrs": _attrs(headline=_short(headline), hints=hints[:4], gb=gb, kind="item_warning" if item else None,
                            suppressed=bool(head and head["note"]) or None, frames=len(frames) or None,
                            explain=int(explain["n"]) if explain else None)}


_GUARD_KIND = re.compile(r"^[\s|]*\+- (?P<kind>[A-Z][A-Z0-9_]+):")


def guard_kinds(lines: list[str]) -> tuple[int, dict[str, int]]:
    """(guards, {kind: count}) of a guard dump: the C++ guard tree (``| +- TENSOR_MATCH: ...``) or,
    before it (2.2, 2.3), one guard per line."""
    kinds = Counter(m["kind"] for m in map(_GUARD_KIND.match, lines) if m)
    if kinds:
        return sum(kinds.values()), dict(kinds)
    plain = [s for s in (line.strip() for line in lines) if s and not s.startswith(("GUARDS", "Guard eval", "Guard latency",
                                                                                      "TREE_GUARD_MANAGER", "+-"))]
    return len(plain), {}


# ------------------------------------------------------------------ TORCH_LOGS text lines

# Header-less lines: a Python warning raised in dynamo's code ("/…/torch/_dynamo/variables/functions.py:663:
# UserWarning: Graph break due to unsupported builtin sys.audit. …"), the first line of explain()'s break
# reason, and the lines that continue a 2.0 limit hit or an explain() break reason.
_DYNAMO_WARNING = r"^(?<wfile>\S*_dynamo/\S+\.py):(?<wline>\d+): (?:\w+\.)*\w*Warning: (?<wbody>.*)$"
_EXPLAIN_START = r"^\s*Break Reason \d+:\s*$"
_LIMIT_CONTINUED = r"^\s+(?:function: '|reasons?: |last reason: )"
# The limit hit's message pasted without its log header (the message alone, as a user quotes it)
_BARE_LIMIT = r"^\s*torch(?:\._)?dynamo hit config\.\w+ \(\d+\)\s*$"
# torchdynamo's first wording (mid-2022), one line under Python logging's default format:
# "WARNING:torchdynamo.convert_frame:torchdynamo hit recompilation cache limit (64) for function 'forward'
# (/…/model.py:381), due to the following guard failures: [['len(alignments) == 0'], ...]"
_OLD_LIMIT = r"torchdynamo hit recompilation cache limit \(\d+\) for function '"
# torch._dynamo's CompileProfiler report (2.0-2.2): its "Recompilation" table, one row a frame, the
# frame's recompile count and its guard failures (one a line, the first on the row):
#   Function                        Recompiles  Recompile Reasons
#   ----------------------------  ------------  ------------------------------
#   'forward' (2657887092.py:11)             8  __nn_module_guard_0(L['self'])
#                                               __nn_module_guard_0(L['self'])
_PROFILER_RECOMPILES = r"^\s*Function\s+Recompiles\s+Recompile Reasons\s*$"
_PROFILER_ROW = re.compile(r"^\s*'(?P<fn>[^']*)' \((?P<file>.+?):(?P<line>\d+)\)\s+(?P<n>\d+)\s+(?P<reason>\S.*?)\s*$")
_PROFILER_MORE = re.compile(r"^\s{8,}(?P<reason>\S.*?)\s*$")
_EXPLAIN_CONTINUED = r"^\s+(?:Reason: |User Stack:\s*$|<FrameSummary file |File \"[^\"]+\", line \d+)"
# Exceptions raised to the user: torch._dynamo.exc.* / torch._inductor.exc.*, those classes by their bare
# name (then only with the text dynamo appends to its exceptions, see _exceptions), and Inductor's own
# RuntimeErrors about the GPU or Triton (torch/_inductor/scheduler.py, 2.0-2.5).
_DYNAMO_EXC = ("Unsupported", "BackendCompilerFailed", "InternalTorchDynamoError", "TorchRuntimeError", "UserError",
               "UncapturedHigherOrderOpError", "FailOnRecompileLimitHit", "CacheLimitExceeded")
_INDUCTOR_EXC = ("InductorError", "LoweringException", "GPUTooOldForTriton", "TritonMissing", "InvalidCxxCompiler",
                 "CppCompileError")
_BARE_EXC = "|".join(_DYNAMO_EXC + _INDUCTOR_EXC)
_INDUCTOR_MESSAGE = (r"Found .+ which is too old to be supported by the triton GPU compiler"
                     r"|Cannot find a working triton installation")
# (IPython/Jupyter names the exception on its traceback's first line:
# "CacheLimitExceeded      Traceback (most recent call last)")
_RAISED = (rf"^\s*(?:torch\._(?:dynamo|inductor)\.exc\.\w+|(?:{_BARE_EXC}): |RuntimeError: (?:{_INDUCTOR_MESSAGE})"
           rf"|(?:{_BARE_EXC})\s+Traceback \(most recent call last\))")
# (``_dynamo\``: the header's source path on Windows, "site-packages\torch\_dynamo\convert_frame.py:964]")
_PREFILTER = (r"_dynamo[/.\\]|Graph break|Recompiling function|torch\._inductor\.exc\."
              rf"|{_EXPLAIN_START}|{_LIMIT_CONTINUED}|{_EXPLAIN_CONTINUED}|{_RAISED}|{_BARE_LIMIT}|{_OLD_LIMIT}"
              rf"|{_PROFILER_RECOMPILES}")
# "[4/1] [__recompiles] " before the body: stripped by a replace, taken apart (once per distinct message).
_MSG_PREFIX = rf"^(?:\[{_CID}\] )?(?:\[__\w+\] ?)?"
_MSG_FIELDS = rf"^(?:\[(?<cid>{_CID})\] )?(?:\[__(?<art>\w+)\] ?)?"
# PyTorch 2.1's header: "[2023-11-21 19:02:13,073] [0/1] torch._dynamo.guards.__recompiles: [DEBUG] ..."
_OLD_HEADER = (rf"^\[(?<date>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d),(?<ms>\d{{3}})\] (?:\[(?<cid2>{_CID})\] )?"
               r"(?<logger>torch\._dynamo[\w.]*?)(?:\.__(?<art2>\w+))?: \[(?<lvl>[A-Z]+)\] ?(?<body2>.*)$")
_EXCEPTION = re.compile(r"^(?P<type>torch\._(?:dynamo|inductor)\.exc\.\w+)(?::\s?(?P<msg>.*))?$")
# What makes a header-less line an anchor (``_headless``: the old header's logger, a warning of dynamo's
# code, explain()'s break reason, a limit hit quoted or in torchdynamo's first wording).
_ANCHORS = (_OLD_HEADER, _DYNAMO_WARNING, _EXPLAIN_START, _BARE_LIMIT, _OLD_LIMIT)


def _dynamo_lines(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The chunk's dynamo lines, in line order: where each is (``file`` and its number ``file_no``,
    ``row``, ``line_no``, ``rank``, ``tee``), its time (``ts``, else ``ts_ff``), ``_m``, the number of
    its message, and for a line without an artifact tag the line of torch that logged it
    (``emitter``); and what each message says, by its number (``cid``, ``art``, block ``kind``, ``body``)."""
    lines = df.select("file", "file_no", "row", "line_no", "rank", "tee", "ts", "ts_ff", "msg", "text", "src_at",
                      "src_end")
    has_header = df["src_at"].is_not_null()
    glog = lines.filter(df["wanted"] & has_header)
    headless = lines.filter(df["wanted"] & ~has_header)
    # A graph break or recompile is logged again at every step and on every rank, word for word:
    # a message is taken apart once, however often it repeats. ``_m`` numbers the distinct messages
    # (a block's are its identity, shorter than its text), in one pass over the lines, where a join
    # to the distinct messages made a second; a message's row of ``messages`` is its number.
    codes, distinct = dictionary(glog["msg"])
    codes = codes.alias("_m")
    messages = _message_fields(distinct.alias("msg").to_frame())
    glog = glog.select("file", "file_no", "row", "line_no", "rank", "tee", "ts", "ts_ff").with_columns(
        codes, _emitters(glog, messages["art"].is_null().gather(codes)))
    said = messages.select("cid", "art", "kind", "body")
    if headless.height and _anchored(headless):
        # (a header-less line is numbered apart from every message and every other line: its block is its own)
        other = _headless(headless)
        other = other.with_columns(pl.int_range(said.height, said.height + other.height, dtype=pl.UInt32).alias("_m"))
        said = pl.concat([said, other.select(said.columns).cast(dict(said.schema))])
        # (each in line order: merged, not sorted)
        glog = glog.merge_sorted(other.select(glog.columns).cast(dict(glog.schema)), key="row")
    return glog, said


def _emitters(glog: pl.DataFrame, untagged: pl.Series) -> pl.Series:
    """The emitting source line of each line without an artifact tag (only those are grouped by the
    line of torch that logged them), NULL for the others."""
    rows = untagged.arg_true()
    emitter = pl.repeat(None, glog.height, dtype=pl.String, eager=True).alias("emitter")
    if rows.len() == 0:
        return emitter
    return emitter.scatter(rows, header_source(glog.select(pl.col("text", "src_at", "src_end").gather(rows)))["src"])


def _anchored(lines: pl.DataFrame) -> bool:
    """Whether any of the header-less lines is an anchor of ``_headless`` (a record's first line, which
    the lines after it may continue): where none is, none is kept (a traceback's frames, which
    explain()'s user stacks hold too, are most header-less lines, and then alone)."""
    text = pl.col("text")
    return lines.select(pl.any_horizontal(*(text.str.contains(p) for p in _ANCHORS)).any()).item()


def _headless(lines: pl.DataFrame) -> pl.DataFrame:
    """Lines without a glog header (few): PyTorch 2.0-2.3's own header, a Python warning from
    dynamo's code, explain()'s printout, and the unprefixed lines that continue them.

    A record's first line (an *anchor*) says what it is; the header-less lines just after it
    (``   function: 'run' (...)`` under 2.0's limit hit, ``    User Stack:`` under a break
    reason) take its emitter and compile id, so that the block holds them. Such a line right
    after the one before it (or two lines after, in explain()'s stacks: a traceback frame is
    followed by its code) continues the anchor above, when it is a line that kind of record
    holds; any other is dropped.
    """
    text = pl.col("text")
    old = extract_groups("text", _OLD_HEADER)
    warned = extract_groups("text", _DYNAMO_WARNING)
    o = lambda f: old.struct.field(f)
    w = lambda f: warned.struct.field(f)
    lines = lines.with_columns(
        o("cid2").alias("cid"), o("art2").alias("art"),
        pl.coalesce(o("body2"), w("wbody"), text).alias("body"),
        pl.coalesce(pl.format("{}.{}", o("date"), o("ms")).str.to_datetime(
            "%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us"), pl.col("ts")).alias("ts"),
        pl.coalesce(o("logger"), pl.format("{}:{}", w("wfile"), w("wline")),
                    pl.when(text.str.contains(_EXPLAIN_START)).then(pl.lit("torch._dynamo.explain"))).alias("emitter"),
        pl.when(o("logger").is_not_null() | text.str.contains(_BARE_LIMIT) | text.str.contains(_OLD_LIMIT))
        .then(pl.lit("logging"))
        .when(w("wfile").is_not_null()).then(pl.lit("warning"))
        .when(text.str.contains(_EXPLAIN_START)).then(pl.lit("explain")).alias("_anchor"),
        pl.when(text.str.contains(_LIMIT_CONTINUED)).then(pl.lit("logging"))
        .when(text.str.contains(_EXPLAIN_CONTINUED)).then(pl.lit("explain")).alias("_continues"),
    ).filter(pl.col("_anchor").is_not_null() | pl.col("_continues").is_not_null())
    if lines.is_empty():
        return lines.with_columns(pl.lit(None, pl.String).alias("kind"))
    gap = pl.col("line_no") - pl.col("line_no").shift(1).over("file")
    seg = ["file", "_seg"]
    lines = lines.sort("row").with_columns(
        (pl.col("_anchor").is_not_null() | gap.is_null()
         | (gap > pl.when(pl.col("_continues") == "explain").then(2).otherwise(1))).cum_sum().over("file").alias("_seg"),
    ).with_columns(pl.col("_anchor").first().over(seg).alias("_of"))
    kind = (
        pl.when(pl.col("_anchor") == "logging").then(_kind())
        .when((pl.col("_anchor") == "warning") & pl.col("body").str.starts_with("Graph break due to "))
        .then(pl.lit("graph_break"))
        .when(pl.col("_anchor") == "explain").then(pl.lit("graph_break"))
    )
    return lines.filter(
        (pl.col("_anchor").is_not_null() & ((pl.col("_anchor") != "warning") | kind.is_not_null()))
        | (pl.col("_anchor").is_null() & (pl.col("_continues") == pl.col("_of")))
    ).with_columns(
        *(pl.col(c).first().over(seg) for c in ("cid", "art", "emitter")),
        kind.alias("kind"),
    )


def _message_fields(messages: pl.DataFrame) -> pl.DataFrame:
    """Each glog message's compile id, artifact, body (what follows them) and block kind."""
    msg = pl.col("msg")
    fields = messages.with_columns(msg.str.replace(_MSG_PREFIX, "").alias("body"))
    prefix = extract_groups("_prefix", _MSG_FIELDS)
    return fields.with_columns(msg.str.head(msg.str.len_chars() - pl.col("body").str.len_chars()).alias("_prefix")).select(
        "msg", "body", prefix.struct.field("cid").alias("cid"), prefix.struct.field("art").alias("art"),
    ).with_columns(_kind().alias("kind"))


def _kind() -> pl.Expr:
    body = pl.col("body")
    return (
        pl.when(body.str.starts_with("Recompiling function")).then(pl.lit("recompile"))
        .when(body.str.starts_with("('Recompiling function")).then(pl.lit("recompile_tuple"))
        .when(body.str.contains(r"^Graph break (?:\([^)]*\) )?in user code at ")).then(pl.lit("graph_break"))
        .when(body.str.starts_with(_ITEM_HEAD)).then(pl.lit("graph_break"))
        .when(body.str.starts_with("Graph break: ") & (pl.col("art") == "graph_breaks")).then(pl.lit("graph_break"))
        # "Graph break: from user code at:" outside the graph_breaks artifact: the second half of the
        # `Tensor.item()` warning (variables/tensor.py), a block of its own only where its head was cut
        .when(body.str.contains(_ITEM_TAIL)).then(pl.lit("item_tail"))
        .when(body.str.contains("torch._dynamo hit config.", literal=True)
              | body.str.contains("torchdynamo hit config.", literal=True)
              | body.str.contains(_OLD_LIMIT)).then(pl.lit("limit"))
        .when((pl.col("art") == "guards") & (body.str.strip_chars() == "GUARDS:")).then(pl.lit("guards"))
        .when(body.str.contains(r"^Step 1: torchdynamo start tracing \S+ .+:\d+$")).then(pl.lit("start"))
        .otherwise(pl.lit(None))
    )


def _blocks(dyn: pl.DataFrame, said: pl.DataFrame) -> pl.DataFrame:
    """One row per block (a start line and the lines of its stream up to the next start), in the
    order they start: its start line's place and time, its kind and compile id, and its messages'
    numbers (``_m``: what they say is ``said``'s by that number)."""
    kind = said["kind"].gather(dyn["_m"])
    streams = _streams(dyn, said)
    # The `Tensor.item()` warning's "Graph break: from user code at:" continues the block its head
    # ("Graph break from `Tensor.item()`, consider setting:") began; with the head cut off it is the block.
    # (worked out over every line only where there is such a line)
    if (kind == "item_tail").any():
        item_head = said["body"].str.starts_with(_ITEM_HEAD).gather(dyn["_m"])
        head = pl.when(pl.col("kind").is_not_null() & (pl.col("kind") != "item_tail")).then(pl.col("_item_head"))
        kind = pl.DataFrame([kind.alias("kind"), item_head.alias("_item_head"), streams.alias("_stream")]).select(
            pl.when(pl.col("kind").is_null() | (pl.col("kind") != "item_tail")).then(pl.col("kind"))
            .when(head.forward_fill().shift(1).over("_stream").fill_null(False)).then(pl.lit(None))
            .otherwise(pl.lit("item_tail")).alias("kind"),
        ).to_series()
    at = dyn.select("file", "rank", "line_no", "row", pl.coalesce("ts", "ts_ff").alias("when")).with_columns(
        kind.alias("kind"), said["cid"].gather(dyn["_m"]).alias("cid"))
    if _records_c is None:
        return _blocks_by_polars(at, streams, dyn["_m"])
    firsts, offsets, order = _records_c.stream_blocks(values_of(streams), values_of(kind.is_not_null().cast(pl.UInt8)))
    members = dyn["_m"].gather(from_buffer(pa.uint32(), len(order) // 4, order)).to_arrow()
    messages = pa.LargeListArray.from_arrays(from_buffer(pa.int64(), len(offsets) // 8, offsets).to_arrow(), members)
    return at.select(pl.all().gather(from_buffer(pa.uint32(), len(firsts) // 4, firsts))).with_columns(
        series_of(messages).cast(pl.List(pl.UInt32)).alias("_m"))


def _blocks_by_polars(at: pl.DataFrame, streams: pl.Series, messages: pl.Series) -> pl.DataFrame:
    """``_blocks``' rows where its C part was not built: each line's block numbered within its stream,
    the lines grouped by stream and block."""
    columns = at.columns
    at = at.with_columns(streams.alias("_stream"), messages.alias("_m")).with_columns(
        pl.col("kind").is_not_null().cast(pl.Int32).cum_sum().over("_stream").alias("_block"))
    return (at.filter(pl.col("_block") > 0).group_by(["_stream", "_block"], maintain_order=True)
            .agg(*(pl.col(c).first() for c in columns), pl.col("_m")).select(*columns, "_m"))


def _streams(dyn: pl.DataFrame, said: pl.DataFrame) -> pl.Series:
    """Each line's stream, numbered: its file, rank, tee flag and compile id, and its artifact or,
    where it has none, its emitter (artifact lines of one compile id form one stream whatever line
    of torch emitted them: a guard dump comes from three; other lines are grouped by their
    emitting source line). An artifact (a word) is never an emitter (a path, a logger's dotted name)."""
    m = dyn["_m"]
    art = _numbers(said["art"])
    emitted = (said["art"].is_null().gather(m) & dyn["emitter"].is_not_null()).arg_true()
    stream = art.gather(m).scatter(emitted, _numbers(dyn["emitter"].gather(emitted)) + art.max() + 1)
    rank = dyn["rank"]
    parts = [dyn["file_no"], rank.fill_null(0).reinterpret(signed=False), rank.is_null().cast(pl.UInt32),
             dyn["tee"].cast(pl.UInt32).fill_null(2), _numbers(said["cid"]).gather(m), stream]
    if _records_c is None:
        return key_ids(pl.DataFrame([p.alias(str(i)) for i, p in enumerate(parts)]), [str(i) for i in range(len(parts))])
    return from_buffer(pa.uint32(), len(m), _records_c.row_ids(tuple(values_of(p.cast(pl.UInt32)) for p in parts)))


def _blocks_in_one_pass(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """``_blocks(*_dynamo_lines(df))`` with the lines' streams and blocks found by C in one pass over
    the frame's rows (``message_blocks``), where ``_dynamo_lines`` and ``_blocks`` filter, gather and
    number its 170,000 dynamo lines a column at a time (a pair of 16 MB TORCH_LOGS rank logs: the
    parser's 24 -> 16 ms); what a message says is still worked out once a message (``_message_fields``). None where
    C was not built, where no line has a glog header, or where a header-less line is an anchor
    (``_headless``: PyTorch 2.0-2.3's own header, explain()'s printout), which only the general path
    reads: ``tests/test_dynamo_parser.py`` holds the two paths equal."""
    if _records_c is None:
        return None
    has_header = df["src_at"].is_not_null()
    selected = (df["wanted"] & has_header).fill_null(False)
    if not selected.any():
        return None
    headless = df.select("text").filter(df["wanted"] & ~has_header)
    if headless.height and _anchored(headless):
        return None
    codes, distinct = dictionary(df["msg"], selected)
    if codes.null_count() != selected.len() - selected.sum():  # (a line without a message: the general path)
        return None
    said = _message_fields(distinct.alias("msg").to_frame()).select("cid", "art", "kind", "body")
    untagged = said["art"].is_null()
    emitter = pl.repeat(_NO_EMITTER, df.height, dtype=pl.UInt32, eager=True)
    if untagged.any():  # (the few lines without an artifact tag: each its emitting line of torch, numbered)
        emitter = dictionary(_emitters(df, (selected & untagged.gather(codes)).fill_null(False)))[0]
        emitter = emitter.fill_null(_NO_EMITTER)
    rank = df["rank"]
    firsts, offsets, members = _records_c.message_blocks(
        values_of(selected.cast(pl.UInt8)), values_of(codes), values_of(df["file_no"].cast(pl.UInt32)),
        values_of(rank.fill_null(0).reinterpret(signed=False)), values_of(rank.is_null().cast(pl.UInt8)),
        values_of(df["tee"].cast(pl.UInt32).fill_null(2)), values_of(emitter),
        values_of(_numbers(said["art"])), values_of(untagged.cast(pl.UInt8)), values_of(_numbers(said["cid"])),
        values_of(_starts(said)))
    at = from_buffer(pa.uint32(), len(firsts) // 4, firsts)
    started = codes.gather(at)
    messages = pa.LargeListArray.from_arrays(from_buffer(pa.int64(), len(offsets) // 8, offsets).to_arrow(),
                                             from_buffer(pa.uint32(), len(members) // 4, members).to_arrow())
    blocks = df.select(pl.col("file", "rank", "line_no", "row").gather(at),
                       pl.coalesce("ts", "ts_ff").gather(at).alias("when")).with_columns(
        said["kind"].gather(started).alias("kind"), said["cid"].gather(started).alias("cid"),
        series_of(messages).cast(pl.List(pl.UInt32)).alias("_m"))
    return blocks, said


_NO_EMITTER = (1 << 32) - 1  # (message_blocks: a line without an emitting line of torch)


def _starts(said: pl.DataFrame) -> pl.Series:
    """Whether each message starts a block, as ``message_blocks`` reads it (a byte): 0 no, 1 yes, 2 yes
    and it is the `Tensor.item()` warning's head, 3 it is that warning's tail (``_blocks``: a block
    only where the head before it in its stream was cut off)."""
    kind = pl.col("kind")
    return said.select(
        pl.when(kind.is_null()).then(0).when(kind == "item_tail").then(3)
        .when(pl.col("body").str.starts_with(_ITEM_HEAD)).then(2).otherwise(1)
        .cast(pl.UInt8)).to_series()


def _numbers(values: pl.Series) -> pl.Series:
    """Each of ``values`` numbered (``dictionary``), NULL one of them (the number after the others')."""
    codes, distinct = dictionary(values)
    return codes.fill_null(distinct.len())


# What dynamo appends to the exceptions it raises (torch/_dynamo/exc.py, augment_exc_message), by
# which a bare "Unsupported: ..." (the class name without its module) is known to be dynamo's.
_AUGMENTED = ("from user code:", "You can suppress this exception and fall back to eager",
              'Set TORCH_LOGS="+dynamo"', "Set TORCHDYNAMO_VERBOSE")
_BARE = re.compile(rf"^(?P<type>{_BARE_EXC}): ?(?P<msg>.*)$")
_INDUCTOR_RAISED = re.compile(rf"^(?P<type>RuntimeError): (?P<msg>(?:{_INDUCTOR_MESSAGE}).*)$")
_IPYTHON_RAISED = re.compile(rf"^(?P<type>{_BARE_EXC})\s+Traceback \(most recent call last\)(?P<msg>)$")


def _raised(text: str) -> tuple[re.Match, str] | None:
    """The exception a line names and how it was told apart: module-qualified, bare, Inductor's RuntimeError,
    or the class IPython names on its traceback's first line."""
    text = text.strip()
    for pattern, how in ((_EXCEPTION, "qualified"), (_BARE, "bare"), (_INDUCTOR_RAISED, "inductor"),
                         (_IPYTHON_RAISED, "ipython")):
        m = pattern.match(text)
        if m:
            return m, how
    return None


def _exceptions(df: pl.DataFrame, own: pl.DataFrame) -> list[dict]:
    """Compile exceptions raised to the user (fullgraph=True, a backend failure): ``torch._dynamo.exc.Unsupported:
    ...``, the same class by its bare name when dynamo's own text follows it, or Inductor's RuntimeError
    that the GPU is too old for Triton. A line under a logging header (suppress_errors=True logs the
    failure and runs the frame eager) is not one: only a header-less line is."""
    # (the few first)
    starts = own.filter(pl.col("wanted") & pl.col("level").is_null()).filter(pl.col("text").str.contains(_RAISED))
    rows = []
    cause_of: tuple[str, int] | None = None  # (file, line) of the line a "... raised:" message continues on
    for start in starts.select("file", "pos", "line_no", "rank", "tee", "text", "ts_ff").to_dicts():
        found = _raised(start["text"])
        if not found or cause_of == (start["file"], start["line_no"]):
            continue  # the cause of the exception above ("BackendCompilerFailed: backend='inductor' raised:")
        m, how = found
        block = following(df, start, EXCEPTION_LOOKAHEAD, first=1).filter(
            pl.col("rank").eq_missing(start["rank"]) & (pl.col("tee") == start["tee"])
        )["text"].to_list()
        lines_after = []
        for line in block:
            s = line.strip()
            if s.startswith(("Set TORCHDYNAMO_VERBOSE", "Traceback (most recent", "The above exception",
                             "During handling")) or _EXCEPTION.match(s):
                break
            lines_after.append(line)
        if how == "bare" and not any(marker in line for line in block for marker in _AUGMENTED):
            continue
        explanation = next((s.split(":", 1)[1].strip() for s in map(str.strip, lines_after)
                            if s.startswith("Explanation:")), None)
        user_code = next((i for i, s in enumerate(lines_after) if s.strip() == "from user code:"), None)
        user_lines: list[str] = []
        for line in lines_after[user_code + 1:] if user_code is not None else []:
            if not line.strip() and user_lines:
                break
            user_lines.append(line)
        frames = _frames(user_lines)
        user = innermost_user(frames)
        message = (m["msg"] or "").strip()
        exc_type = m["type"] if how not in ("bare", "ipython") else (
            f"torch._{'inductor' if m['type'] in _INDUCTOR_EXC else 'dynamo'}.exc.{m['type']}")
        reason = f"{m['type'].rsplit('.', 1)[-1]}: {message}" if message else m["type"].rsplit(".", 1)[-1]
        if message.endswith("raised:") and lines_after and lines_after[0].strip():
            reason += f" {lines_after[0].strip()}"  # the backend's own exception, on the next line
            cause_of = (start["file"], start["line_no"] + 1)
        if explanation:
            reason += f" ({explanation})"
        rows.append({"rank": start["rank"], "ts": start["ts_ff"], "event": "failure", "reason": _short(reason),
                     "function": frames[-1]["function"] if frames else None,
                     "code_file": frames[-1]["file"] if frames else None,
                     "code_line": frames[-1]["line"] if frames else None,
                     "user_frame": frame_text(user) if user else None,
                     "file": start["file"], "line_no": start["line_no"], "source": "torch_logs",
                     "attrs": _attrs(exception_type=exc_type, raised_by="inductor" if how == "inductor" else None)})
    return rows


def _profiler_recompiles(df: pl.DataFrame, own: pl.DataFrame) -> list[dict]:
    """The CompileProfiler report's recompilation table: a ``recompile`` record per frame, whose
    ``recompiles`` attr is the count the table gives (what recompile-storm counts), its reason the
    first guard failure listed."""
    rows = []
    # the table is printed: its header line starts the text, where a logged line has its glog header
    starts = (own.filter(pl.col("wanted") & pl.col("src_end").is_null())
              .filter(pl.col("text").str.contains(_PROFILER_RECOMPILES)))
    for start in starts.select("file", "pos", "line_no", "rank", "ts_ff").to_dicts():
        block = following(df, start, EXCEPTION_LOOKAHEAD, first=1).select("text", "line_no").rows()
        row = None
        for text, line_no in block:
            if set(text.strip()) <= {"-", " "} and row is None and text.strip():
                continue  # the table's rule under its header
            m = _PROFILER_ROW.match(text)
            if m:
                row = {"fn": m["fn"], "file": m["file"], "line": int(m["line"]), "n": int(m["n"]),
                       "reasons": [m["reason"]], "line_no": line_no}
                rows.append((start, row))
            elif row is not None and (more := _PROFILER_MORE.match(text)):
                row["reasons"].append(more["reason"])
            else:
                break
    out = []
    for start, row in rows:
        cls, info = classify_guard(row["reasons"][0])
        out.append({"rank": start["rank"], "ts": start["ts_ff"], "event": "recompile", "function": row["fn"],
                    "code_file": row["file"], "code_line": row["line"], "reason": _short(row["reasons"][0]),
                    "reason_class": cls, "framework": code_framework(row["file"], row["line"]),
                    "file": start["file"], "line_no": row["line_no"], "source": "torch_logs",
                    "attrs": _attrs(recompiles=row["n"], failures=len(row["reasons"]), report="compile_profiler",
                                    **info)})
    return out


def _parse_block(kind: str, body: list[str]) -> dict | None:
    """A block's own fields and event (nothing of where it was logged), or None."""
    if kind == "recompile":
        row = parse_recompile(body)
        event = "recompile"
    elif kind == "recompile_tuple":
        row = parse_recompile_tuple(body[0])
        event = "recompile"
    elif kind == "limit":
        row = parse_limit(body)
        event = "limit_hit"
    elif kind in ("graph_break", "item_tail"):
        row = parse_graph_break(body, item_tail=kind == "item_tail")
        event = "graph_break"
    elif kind == "guards":
        count, kinds = guard_kinds(body[1:])
        row = {"attrs": _attrs(guards=count, guard_kinds=kinds)}
        event = "compile"
    elif kind == "start":
        m = re.match(r"^Step 1: torchdynamo start tracing (?P<fn>\S+) (?P<file>.+):(?P<line>\d+)$", body[0])
        row = {"function": m["fn"], "code_file": m["file"], "code_line": int(m["line"])} if m else None
        event = "compile"
    else:
        return None
    if row is None:
        return None
    if event != "graph_break":
        row["framework"] = code_framework(row.get("code_file"), row.get("code_line"))
    return {**row, "event": event}


def _frame_id(cid: str | None) -> int | None:
    frame_id = re.match(r"^!?(?:\d+/)?(\d+)/\d+", cid) if cid and cid.count("/") == 2 else (
        re.match(r"^!?(\d+)/", cid) if cid else None)
    return int(frame_id[1]) if frame_id else None


def _block_numbers(blocks: pl.DataFrame) -> pl.Series:
    """Each block numbered by its kind and messages (``_m``): equal for blocks of both equal, from 0
    as each first appears. In C, a block's messages hashed as a whole (a unique and a join on the list
    column hashed them element by element: three 16 MB logs' 9,600 blocks, ~4 ms)."""
    if _records_c is None:
        return key_ids(blocks, ["kind", "_m"]).cast(pl.UInt32)
    messages = blocks["_m"].rechunk().to_arrow()
    lists = _records_c.list_ids(values_of(series_of(messages.offsets).cast(pl.Int64)),
                                values_of(series_of(messages.values).cast(pl.UInt32)))
    kind = dictionary(blocks["kind"])[0].fill_null((1 << 32) - 1)
    parts = (from_buffer(pa.uint32(), blocks.height, lists), kind)
    return from_buffer(pa.uint32(), blocks.height, _records_c.row_ids(tuple(values_of(p) for p in parts)))


def _block_rows(blocks: pl.DataFrame, bodies: pl.Series) -> pl.DataFrame:
    """A ``compiles`` row per block. A block's text is parsed once however often it repeats (a
    graph break logged at every step, every rank's copy in a console): Python runs once per
    distinct block, and the parsed fields are joined back onto every block that holds it. Blocks of
    the same messages (``_m``) hold the same text: ``bodies``, by message number."""
    blocks = blocks.with_columns(_block_numbers(blocks).alias("_d"))
    distinct = blocks.filter(pl.col("_d").is_first_distinct())
    text = bodies.to_list()
    parsed = [(d, _parse_block(kind, [text[m] for m in ms]))
              for d, kind, ms in distinct.select("_d", "kind", "_m").iter_rows()]
    fields = frame("compiles", [row for _, row in parsed if row is not None]).with_columns(
        pl.Series("_d", [d for d, row in parsed if row is not None], dtype=pl.UInt32)
    ).drop("rank", "ts", "attempt", "frame_id", "line_no", "source", "file")
    cids = blocks.select(pl.col("cid").unique())
    cids = cids.with_columns(pl.Series("frame_id", [_frame_id(c) for c in cids["cid"]], dtype=pl.Int32))
    rows = (
        blocks.join(fields, on="_d", how="inner", maintain_order="left")
        .join(cids, on="cid", how="left", maintain_order="left", nulls_equal=True)
        .with_columns(pl.col("cid").alias("attempt"), pl.col("when").alias("ts"), pl.lit("torch_logs").alias("source"))
    )
    return conform("compiles", rows)


# Every line _dynamo_lines and _exceptions look at matches this: textlog marks them (``wanted``).
LINES = _PREFILTER
# The branch of LINES that a TORCH_LOGS line's header holds ("torch/_dynamo/guards.py:4760]"): all
# lines of a run under one such header match.
HEADER_LINES = r"_dynamo[/.\\]"
# A literal of each branch of _PREFILTER: "reason" stands for "reason: ", "reasons: " and "last reason: ",
# '"File "' for a frame of explain()'s user stack, "_dynamo." for torch._dynamo.exc., "dynamo hit config."
# for a limit hit quoted alone.
TRIGGER = scan.Trigger("dynamo", ("_dynamo/", "_dynamo.", "_dynamo\\", "Graph break", "Recompiling function",
                                  "torch._inductor.exc.",
                                  "Break Reason ", "function: '", "reason", "Reason: ", "User Stack:",
                                  "<FrameSummary file ", 'File "', *(f"{e}: " for e in _DYNAMO_EXC + _INDUCTOR_EXC),
                                  "RuntimeError: Found ", "RuntimeError: Cannot find a working triton installation",
                                  "dynamo hit config.", "hit recompilation cache limit (", "Recompile Reasons",
                                  "Traceback (most recent call last)"),
                       per_line=False)  # "_dynamo/" is in the header of every TORCH_LOGS line


# Most lines of a TORCH_LOGS log are dynamo's: ``own`` is every own line of the chunk (textlog), and
# this parser reads the wanted ones of it, by ``wanted``.
OWN_UNFILTERED = True


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    """The compile records that start in this chunk; ``df`` adds lookahead rows to ``own`` (its own
    lines, ``wanted`` marking those LINES matches)."""
    last_own_row = own["row"].filter(own["wanted"]).max()
    if last_own_row is None:
        return
    found = _blocks_in_one_pass(df)
    if found is None:
        dyn, said = _dynamo_lines(df)
        found = (_blocks(dyn, said), said) if not dyn.is_empty() else None
    if found is not None:
        blocks, said = found
        yield "compiles", _block_rows(blocks.filter(pl.col("row") <= last_own_row), said["body"])
    exceptions = _exceptions(df, own)
    if exceptions:
        yield "compiles", frame("compiles", exceptions)
    profiled = _profiler_recompiles(df, own)
    if profiled:
        yield "compiles", frame("compiles", profiled)

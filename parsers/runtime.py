"""How processes ended: log headers, tracebacks, torchrun failure reports, signals, OOMs.

Reads line frames from ``textlog`` and yields rows for ``events``, ``failures`` and
``stacks``. Real lines this module reads (PyTorch 2.11, torchrun console):

    [rank0]:[E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught ...
    [rank0]: Traceback (most recent call last):
    [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 ...
    terminate called after throwing an instance of 'c10::DistBackendError'
    W1129 13:34:43.644000 3596 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 3641 closing signal SIGTERM
      exitcode  : -6 (pid: 3640)

Single-line records are found with vectorized expressions over every line; multi-line
blocks (tracebacks, torchrun's failure table) are assembled in Python from the few lines
the expressions marked as their start.
"""

from __future__ import annotations

import json
import re
import signal as signals
from collections.abc import Iterator
from datetime import datetime

import polars as pl

from postmortem.schema import conform, frame, json_attrs

from . import scan
from .lines import extract_groups, following, header_source

MAX_MESSAGE = 2000
TRACEBACK_MAX_LINES = 400

_TRACEBACK_START = "Traceback (most recent call last):"
_NOTABLE = (
    r"(?i)\b(?:error|fatal|fail(?:ed|ure)?|abort(?:ed)?|exception|xid|nvrm|ecc|assertion|killed|nan|inf|"
    r"overflow|skipping step|segmentation fault)\b|died with <Signals\.|exits with return code"
)
MESSAGE_TAIL_LINES = 30
MAX_BARE_EXCEPTIONS = 200  # per chunk of lines
TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
_FAULTHANDLER_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
# An exception line on its own: a (dotted) class name ending the way exception classes do, then
# ": message" or the line's end ("torch.OutOfMemoryError: CUDA out of memory", "Unsupported: ...",
# "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:"). Warnings are not.
_BARE_EXCEPTION = (r"^\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Failed|Failure|Unsupported|LimitHit|Interrupt)"
                   r"(?::\s|:?$)")
# Messages PyTorch only ever raises, printed without their class by a loop that logs str(error)
# (or pasted so): at the start of the line, they are the error, not a quote of it. DDP's reducer
# (torch/csrc/distributed/c10d/reducer.cpp, REDUCER_CHECK, every version since 1.1).
# The same error's last lines, which name the rank and its parameters ("Parameter indices which
# did not receive grad for rank 1: 17 18 ...", and with TORCH_DISTRIBUTED_DEBUG the names'
# "Parameters which did not receive grad for rank 1: ..."), pasted without the lines above them.
_DDP_UNUSED_TAIL = r"Parameter(?:s| indices) which did not receive grad for rank \d+:"
_CLASSLESS_ERROR = (r"^\s*(?:Expected to have finished reduction in the prior iteration before starting a new one"
                    r"|" + _DDP_UNUSED_TAIL + r")")
_DDP_UNUSED_HEAD = "Expected to have finished reduction in the prior iteration"
_TABLE_FIELD = re.compile(r"^\s+(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_TABLE_ENTRY = re.compile(r"^\[(?P<rank>\d+)\]:$")

_OOM_FIGURES = {
    "tried_to_allocate": r"Tried to allocate ([\d.]+ [KMGT]?i?B)",
    "capacity": r"total capacity of ([\d.]+ [KMGT]?i?B)|([\d.]+ [KMGT]?i?B) total capacity",
    "free": r"of which ([\d.]+ [KMGT]?i?B) is free|([\d.]+ [KMGT]?i?B) free",
    "in_use": r"this process has ([\d.]+ [KMGT]?i?B) memory in use",
    "allowed": r"([\d.]+ [KMGT]?i?B) allowed",
    "allocated_by_pytorch": r"([\d.]+ [KMGT]?i?B) is allocated by PyTorch|([\d.]+ [KMGT]?i?B) already allocated",
    "reserved_unallocated": r"([\d.]+ [KMGT]?i?B) is reserved by PyTorch but unallocated",
    "reserved_total": r"([\d.]+ [KMGT]?i?B) reserved in total by PyTorch",
}
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 1000, "MB": 10**6, "GB": 10**9, "TB": 10**12}

_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}

# A frame is the user's when it is none of these: the innermost such frame is where the
# user's code was.
# (/tmp/torchinductor_<user>/ holds Inductor's generated code: not the user's either.)
_NOT_USER = ("site-packages/", "dist-packages/", "/torch/", "<frozen", "/lib/python3", "<string>", "/bin/torchrun",
             "torchinductor_")

_VERSION_PATTERNS = {
    "torch": r"(?i)\b(?:py)?torch(?:[ _]?version)?\s*[=:]\s*v?(\d+\.\d+\.\d+[\w.+-]*)",
    "nccl": r"NCCL version:? (\d+\.\d+\.\d+)",
    "cuda": r"(?:NCCL version \d+\.\d+\.\d+\+cuda|CUDA (?:runtime )?version\s*[=:]\s*)(\d+\.\d+)",
    "python": r"\bPython v?(3\.\d+\.\d+)\b",
}


def signal_name(number: int) -> str | None:
    try:
        return signals.Signals(number).name
    except ValueError:
        return None


def to_bytes(figure: str) -> int | None:
    value, _, unit = figure.partition(" ")
    try:
        return int(float(value) * _UNITS[unit])
    except (ValueError, KeyError):
        return None


def oom_figures(message: str) -> dict[str, int]:
    """The byte figures of a CUDA OOM message, whichever PyTorch version wrote it."""
    figures = {}
    for key, pattern in _OOM_FIGURES.items():
        m = re.search(pattern, message)
        if m:
            value = to_bytes(next(g for g in m.groups() if g))
            if value is not None:
                figures[key] = value
    return figures


def is_user_frame(path: str) -> bool:
    return not any(marker in path for marker in _NOT_USER)


def _attrs(**values) -> str:
    return json.dumps({k: v for k, v in values.items() if v is not None}, default=str)


def _short(text: str | None) -> str | None:
    return None if text is None else text[:MAX_MESSAGE]


# ---------------------------------------------------------------- single-line records


# A launcher that names the worker by its command line: DeepSpeed's ("[launch.py:434:sigkill_handler]
# ['/usr/bin/python3', '-u', 'main.py', '--local_rank=0', ...] exits with return code = -9") and
# torch.distributed.launch's ("CalledProcessError: Command '[... '--local_rank=7' ...]' died with
# <Signals.SIGSEGV: 11>.").
_LAUNCHED = (r"--local_rank=(?<lr>\d+)\b.*(?:exits with return code = (?<code>-?\d+)"
             r"|died with <Signals\.SIG\w+: (?<signum>\d+)>)")


# The same launcher line when the command it quotes names no local rank (a user who replaced the
# command with a placeholder before pasting it, as in pytorch/pytorch#29889: "CalledProcessError:
# Command <the command> died with <Signals.SIGSEGV: 11>."): the worker's death by that signal,
# which worker it was the line does not say.
_LAUNCHER_SIGNAL = re.compile(r"died with <Signals\.(SIG\w+): \d+>")


def _launcher_signal(text: str) -> str | None:
    """The signal a launcher's CalledProcessError says its worker died of, where no local rank is named
    (one that names it is an agent_failure, given its rank by ``ranks_from_local_ranks``)."""
    m = _LAUNCHER_SIGNAL.search(text)
    return m[1] if m and "--local_rank=" not in text else None


# c10d's process-group creation waiting for the others (torch <= 2.2): "Waiting in store based
# barrier to initialize process group for rank: 2, key: store_based_barrier_key:2 (world_size=8,
# worker_count=7, timeout=0:30:00)"
_STORE_BARRIER = (r"Waiting in store based barrier to initialize process group for rank: (?<rank>\d+), key: (?<key>\S+) "
                  r"\(world_size=(?<world>\d+), worker_count=(?<count>\d+)")


def _log_events(own: pl.DataFrame, state: dict) -> pl.DataFrame:
    """Warning-and-worse header lines, and the last timestamped line of each rank."""
    text = pl.col("msg")
    launched = extract_groups("msg", _LAUNCHED)
    barrier = extract_groups("msg", _STORE_BARRIER)
    kind = (
        pl.when(text.str.contains("Watchdog caught collective operation timeout", literal=True))
        .then(pl.lit("watchdog_timeout"))
        .when(text.str.contains("closing signal", literal=True))
        .then(pl.lit("agent_signal"))
        .when(barrier.struct.field("world").is_not_null())
        .then(pl.lit("store_barrier_wait"))
        .when(text.str.contains(r"failed \(exitcode: -?\d+\) local_rank") | launched.struct.field("lr").is_not_null())
        .then(pl.lit("agent_failure"))
        .otherwise(pl.lit("log"))
    )
    # Lines without a log header, or logged at INFO, that still say something went wrong: a kernel
    # log's Xid, a user's "step 7 loss nan", a CUDA kernel's assertion, DeepSpeed's "[INFO]
    # [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss
    # scale: 0, reducing to 0". The regex runs on those lines only.
    # (masks over own, set where they hold: a lookup of every row's position in a list of them, or
    # of its level in a list of levels, is a hash probe a row)
    level = own["level"]
    quiet = level.is_null() | (level == "I")
    notable = scan.contains_among(own["msg"], _NOTABLE, quiet)
    # an agent's line at any level (its message tested on the rows the scan found it on, where it says)
    agent = scan.matching(own["msg"], _AGENT, _AGENT_LINES, scan.holding(own, state.get("hits"), _AGENT))
    worse = (level == "W") | (level == "E") | (level == "F") | (level == "C")
    warnings = header_source(own.filter(worse.fill_null(False) | agent | notable))
    sent = extract_groups("msg", r"Sending process (?<pid>\d+) closing signal (?<sig>SIG\w+)")
    failed = extract_groups("msg", r"failed \(exitcode: (?<code>-?\d+)\) local_rank: (?<lr>\d+) \(pid: (?<pid>\d+)\)")
    events = warnings.select(
        "file",
        "rank",
        "ts",
        "line_no",
        "level",
        pl.col("src").alias("source"),
        kind.alias("kind"),
        pl.col("msg").str.slice(0, MAX_MESSAGE).alias("message"),
        # The agent names a worker by pid; the store maps it to the worker's rank.
        pl.coalesce(
            sent.struct.field("pid").cast(pl.Int32, strict=False),
            failed.struct.field("pid").cast(pl.Int32, strict=False),
            pl.col("pid"),
        ).alias("pid"),
        pl.when(sent.struct.field("sig").is_not_null())
        .then(json_attrs(signal=sent.struct.field("sig"),
                         target_pid=sent.struct.field("pid").cast(pl.Int64, strict=False)))
        .when(failed.struct.field("code").is_not_null())
        .then(json_attrs(exit_code=failed.struct.field("code").cast(pl.Int64, strict=False),
                         local_rank=failed.struct.field("lr").cast(pl.Int64, strict=False),
                         target_pid=failed.struct.field("pid").cast(pl.Int64, strict=False)))
        .when(barrier.struct.field("world").is_not_null())
        .then(json_attrs(barrier_rank=barrier.struct.field("rank").cast(pl.Int64, strict=False),
                         world_size=barrier.struct.field("world").cast(pl.Int64, strict=False),
                         worker_count=barrier.struct.field("count").cast(pl.Int64, strict=False),
                         key=barrier.struct.field("key")))
        .when(launched.struct.field("lr").is_not_null())
        .then(json_attrs(exit_code=pl.coalesce(launched.struct.field("code").cast(pl.Int64, strict=False),
                                               -launched.struct.field("signum").cast(pl.Int64, strict=False)),
                         local_rank=launched.struct.field("lr").cast(pl.Int64, strict=False)))
        .alias("attrs"),
    ).with_columns(
        # For agent lines the pid column names the worker acted on, so its rank is the worker's.
        pl.when(pl.col("kind").is_in(["agent_signal", "agent_failure"])).then(pl.lit(None))
        # A watchdog line of one unprefixed console names its own rank: "[Rank 2] Watchdog caught
        # ..." (the default group's rank is the global one; another group's "[PG 3 Rank 1]" is not).
        .when(pl.col("rank").is_null() & (pl.col("kind") == "watchdog_timeout"))
        .then(pl.col("message").str.extract(r"^\[(?:PG (?:ID )?0\b[^\]]*?)?Rank (\d+)\]", 1).cast(pl.Int32, strict=False))
        .otherwise(pl.col("rank"))
        .cast(pl.Int32).alias("rank")
    )
    # own is in line order: the last timed row of each rank is its last line. It ends a run of rows
    # of one file and rank, so the keys are compared with the next row's first, and only the runs'
    # last rows hashed (a rank's file is one run; hashing every row cost ~4 ms per 16 MB). The runs
    # are told by file number (a file's rows have one, and another file another), columns alone.
    rank = own["rank"]
    is_timed = rank.is_not_null() & own["ts"].is_not_null()
    # (the timed rows taken by the mask: a filter, where a gather by their positions costs ~10x)
    timed, file_no, timed_rank = is_timed.arg_true(), own["file_no"].filter(is_timed), rank.filter(is_timed)
    run_ends = timed.filter(file_no.ne_missing(file_no.shift(-1)) | timed_rank.ne_missing(timed_rank.shift(-1)))
    last_rows = (own.select("file", "rank").gather(run_ends).with_columns(run_ends.alias("_at"))
                 .unique(subset=["file", "rank"], keep="last", maintain_order=True)["_at"].sort())
    last = (
        header_source(own.gather(last_rows))
        .select("file", "rank", "ts", "line_no", "level", pl.col("src").alias("source"),
                pl.lit("last_line").alias("kind"), pl.col("msg").str.slice(0, MAX_MESSAGE).alias("message"), "pid")
    )
    return pl.concat([conform("events", events), conform("events", last)])


def _holding(own: pl.DataFrame, state: dict, trigger: scan.Trigger) -> pl.DataFrame:
    """The rows of ``own`` that may hold the trigger's literals: those the scan named, where it did."""
    mask = scan.holding(own, state.get("hits"), trigger)
    return own if mask is None else own.filter(mask)


def _version_events(own: pl.DataFrame) -> pl.DataFrame:
    """The first line per rank that names the version of torch, NCCL, CUDA or Python."""
    candidates = header_source(own.filter(pl.col("msg").str.contains(r"(?i)version|torch=|Python v")))
    parts = []
    for component, pattern in _VERSION_PATTERNS.items():
        found = candidates.with_columns(pl.col("msg").str.extract(pattern, 1).alias("version")).filter(
            pl.col("version").is_not_null()
        )
        if found.height:
            parts.append(
                found.group_by("file", "rank", maintain_order=True)
                .first()
                .select(
                    "rank", pl.col("ts_ff").alias("ts"), "line_no", "level", "pid",
                    pl.col("src").alias("source"),
                    pl.lit("version").alias("kind"),
                    pl.col("msg").str.slice(0, MAX_MESSAGE).alias("message"),
                    json_attrs(component=pl.lit(component), version=pl.col("version")).alias("attrs"),
                    "file",
                )
            )
    return pl.concat([conform("events", p) for p in parts]) if parts else frame("events")


# ---------------------------------------------------------------- multi-line blocks


def _rows(df: pl.DataFrame,
          columns=("file", "pos", "line_no", "rank", "tee", "text", "level", "ts", "ts_ff", "ts_bf", "pid")) -> list[dict]:
    return header_source(df).select(columns).to_dicts()


def _when(row: dict) -> tuple[datetime | None, dict]:
    """A block's time, and attrs saying how sure it is.

    Tracebacks and abort messages carry no timestamp: the time is that of the line before
    (``ts_from``), and the next timestamped line bounds it (``ts_before``); the store
    narrows it with the rank's other files.
    """
    if row["ts"] is not None:
        return row["ts"], {}
    return row["ts_ff"], {"ts_from": "previous line", "ts_before": row["ts_bf"]}


def _parse_traceback(lines: list[dict]) -> tuple[list[dict], dict | None, int]:
    """Frames and the exception line of a traceback that starts at lines[0].

    Lines of other ranks (interleaved in a console) are skipped. Returns the frames
    (outermost first), the exception line (or None when the block is cut off) and the
    count of lines consumed.
    """
    start = lines[0]
    base = len(start["text"]) - len(start["text"].lstrip())
    frames: list[dict] = []
    for i, row in enumerate(lines[1:TRACEBACK_MAX_LINES], start=1):
        if row["rank"] != start["rank"] or row["tee"] != start["tee"]:
            continue
        text = row["text"]
        stripped = text.strip()
        indent = len(text) - len(text.lstrip())
        if not stripped:
            continue
        if indent > base:
            m = TRACEBACK_FRAME.match(text)
            if m:
                frames.append({"file": m["file"], "line": int(m["line"]), "function": m["func"], "code": None})
            elif frames and frames[-1]["code"] is None:
                frames[-1]["code"] = stripped[:300]  # the frame's source line, as Python printed it
            continue
        return frames, row, i
    return frames, None, len(lines)


def _message_tail(lines: list[dict], start: dict) -> str | None:
    """The lines that continue an exception's message ("Missing key(s) in state_dict: ...")."""
    tail = []
    for row in lines[:MESSAGE_TAIL_LINES]:
        if row["rank"] != start["rank"] or row["tee"] != start["tee"]:
            continue
        text = row["text"].strip()
        if not text or row["level"] is not None or _TRACEBACK_START in text or text.startswith(
            ("During handling of the above", "The above exception")
        ):
            break
        tail.append(text)
    return "\n".join(tail)[:4000] or None


def _tracebacks(df: pl.DataFrame, own: pl.DataFrame, ended: set) -> Iterator[tuple[str, pl.DataFrame]]:
    """Tracebacks whose header starts in ``own``; the (file, line) of each one's exception line
    is added to ``ended``."""
    starts = own.filter(pl.col("text").str.contains(_TRACEBACK_START, literal=True))
    if starts.is_empty():
        return
    events, failures, stacks = [], [], []
    for start in _rows(starts):
        block = _rows(following(df, start, TRACEBACK_MAX_LINES))
        frames, last, used = _parse_traceback(block)
        if last is None:
            continue
        ended.add((last["file"], last["line_no"]))
        tail = _message_tail(block[used + 1:], start)
        exc = _EXCEPTION.match(last["text"].strip())
        exc_type = exc["type"] if exc else None
        exc_msg = (exc["msg"] or "") if exc else last["text"].strip()
        user = next((f for f in reversed(frames) if is_user_frame(f["file"])), None)
        where = f"{user['file']}:{user['line']}" if user else None
        ts, timing = _when(last)
        common = {"rank": start["rank"], "ts": ts, "file": start["file"], "pid": start["pid"]}
        events.append({**common, "line_no": last["line_no"], "level": "E", "kind": "exception",
                       "message": _short(last["text"].strip()),
                       "attrs": _attrs(exception_type=exc_type, traceback_line=start["line_no"], user_frame=where,
                                       user_function=user["function"] if user else None,
                                       user_code=user["code"] if user else None, frames=len(frames),
                                       message_tail=tail, **timing)})
        if start["rank"] is not None:
            failures.append({**common, "line_no": last["line_no"], "exception_type": exc_type,
                             "message": _short(exc_msg), "source": "traceback"})
        if sig := _launcher_signal(last["text"]):
            failures.append({**common, "line_no": last["line_no"], "signal": sig, "exception_type": exc_type,
                             "message": _short(exc_msg), "source": "signal"})
        for depth, f in enumerate(reversed(frames)):
            stacks.append({"rank": start["rank"], "pid": start["pid"], "thread": "MainThread", "depth": depth,
                           "function": f["function"], "file": f["file"], "line": f["line"],
                           "source": "traceback", "origin": start["file"], "origin_line": start["line_no"]})
        if exc_type and exc_type.endswith("OutOfMemoryError") or any(m in last["text"] for m in _OOM_MARKERS):
            figures = oom_figures(last["text"])
            events.append({**common, "line_no": last["line_no"], "level": "E", "kind": "oom",
                           "message": _short(last["text"].strip()), "attrs": _attrs(**figures, **timing)})
    yield "events", frame("events", events)
    yield "failures", frame("failures", failures)
    yield "stacks", frame("stacks", stacks)


def _frames_above(lines: list[dict], row: dict) -> list[dict]:
    """The ``File "...", line N`` frames of ``row``'s rank in the lines just above it, outermost
    first: a traceback whose header was cut off (a paste, a rotated log) still names them."""
    frames: list[dict] = []
    for above in reversed(lines):
        if above["rank"] != row["rank"] or above["tee"] != row["tee"]:
            continue
        m = TRACEBACK_FRAME.match(above["text"])
        if m:
            frames.append({"file": m["file"], "line": int(m["line"]), "function": m["func"]})
        elif not above["text"].startswith((" ", "\t")) or not above["text"].strip():
            break  # frames and their indented code lines end at the first unindented line
    return frames[::-1]


def _bare_exceptions(df: pl.DataFrame, own: pl.DataFrame, ended: set) -> Iterator[tuple[str, pl.DataFrame]]:
    """Exception lines with no traceback header above them (what users paste, a log cut by
    rotation, torchrun echoing a worker's error): ``[rank1]: torch.OutOfMemoryError: CUDA out of
    memory. ...``, ``RuntimeError: Error(s) in loading state_dict for Net:``. Each is an exception
    event with the frames just above it and the lines that continue its message; the lines of
    a traceback that ``_tracebacks`` read (``ended``) are not read again."""
    candidates = own.filter(pl.col("level").is_null()).filter(
        pl.col("text").str.contains(_BARE_EXCEPTION) | pl.col("text").str.contains(_CLASSLESS_ERROR))
    if candidates.is_empty():
        return
    # each is read with the lines around it (Python, a millisecond): a loop that logs the same
    # error every second for a day is read up to its first lines, not all of them
    candidates = candidates.head(MAX_BARE_EXCEPTIONS)
    events, failures = [], []
    for row in _rows(candidates):
        if (row["file"], row["line_no"]) in ended:
            continue
        text = row["text"].strip()
        exc = _EXCEPTION.match(text)
        exc_type = exc["type"] if exc else None
        above = _rows(df.slice(max(row["pos"] - 60, 0), min(row["pos"], 60)).filter(pl.col("file") == row["file"]))
        if re.match(r"\s*" + _DDP_UNUSED_TAIL, text) and any(
                _DDP_UNUSED_HEAD in r["text"] for r in above[-MESSAGE_TAIL_LINES:] if r["rank"] == row["rank"]):
            continue  # the message's tail, under its own first line: that line's exception holds it
        frames = _frames_above(above, row)
        user = next((f for f in reversed(frames) if is_user_frame(f["file"])), None)
        tail = _message_tail(_rows(following(df, row, MESSAGE_TAIL_LINES, first=1)), row)
        ts, timing = _when(row)
        common = {"rank": row["rank"], "ts": ts, "file": row["file"], "pid": row["pid"], "line_no": row["line_no"]}
        events.append({**common, "level": "E", "kind": "exception", "message": _short(text),
                       "attrs": _attrs(exception_type=exc_type, bare=True, frames=len(frames),
                                       user_frame=f"{user['file']}:{user['line']}" if user else None,
                                       user_function=user["function"] if user else None,
                                       message_tail=tail, **timing)})
        if row["rank"] is not None:
            failures.append({**common, "exception_type": exc_type, "message": _short((exc["msg"] or "") if exc else text),
                             "source": "exception_line"})
        if sig := _launcher_signal(text):
            failures.append({**common, "signal": sig, "exception_type": exc_type,
                             "message": _short((exc["msg"] or "") if exc else text), "source": "signal"})
    yield "events", frame("events", events)
    yield "failures", frame("failures", failures)


# The message itself, after nothing but exception names (two ranks' lines interleaved by a
# terminal: "OutOfMemoryErrorOutOfMemoryError.: : OutOfMemoryErrorCUDA out of memory. Tried to
# allocate 2.11 GiB (GPU 6; ..."), not a log line that quotes it.
_OOM_LINE = r"^\s*(?:[\w.]*(?:Error|Exception)[.: ]*)*CUDA (?:error: )?out of memory"
# The caching allocator's message, and the CUDA runtime's own (cudaErrorMemoryAllocation, a
# cudaMalloc outside the allocator: "RuntimeError: CUDA error: out of memory" from model.to).
_OOM_MARKERS = ("CUDA out of memory", "CUDA error: out of memory")


def _out_of_memory_lines(own: pl.DataFrame, ended: set) -> pl.DataFrame:
    """CUDA out-of-memory messages wherever they stand (an excerpt that starts at one, a line
    that interleaves two), but the ends of tracebacks, which ``_tracebacks`` read."""
    found = header_source(own.filter(pl.col("text").str.contains_any(list(_OOM_MARKERS)))
                          .filter(pl.col("msg").str.contains(_OOM_LINE)))
    rows = []
    for row in found.select("file", "line_no", "rank", "pid", "ts", "ts_ff", "ts_bf", "msg").to_dicts():
        if (row["file"], row["line_no"]) in ended:
            continue
        ts, timing = _when(row)
        rows.append({"rank": row["rank"], "ts": ts, "file": row["file"], "line_no": row["line_no"], "pid": row["pid"],
                     "level": "E", "kind": "oom", "message": _short(row["msg"].strip()),
                     "attrs": _attrs(**oom_figures(row["msg"]), **timing)})
    return frame("events", rows)


def _torchrun_failures(own: pl.DataFrame) -> Iterator[tuple[str, pl.DataFrame]]:
    """torchrun's ChildFailedError table: one failure per ``[rank]:`` entry."""
    marked = own.filter(pl.col("rank").is_null()).filter(
        pl.col("text").str.contains(r"^\[\d+\]:\s*$") | pl.col("text").str.contains(_TABLE_FIELD.pattern)
        | pl.col("text").str.starts_with("Root Cause (first observed failure)")
    )
    if marked.is_empty():
        return
    entries: list[dict] = []
    first_observed = False
    current: dict | None = None
    file = None
    for row in _rows(marked):
        if row["file"] != file:  # a table does not go on in the next file
            file, current, first_observed = row["file"], None, False
        text = row["text"].rstrip()  # pasted tables are often padded with spaces
        if text.startswith("Root Cause"):
            first_observed = True
            continue
        entry = _TABLE_ENTRY.match(text)
        if entry:
            current = {"entry_rank": int(entry["rank"]), "file": row["file"], "line_no": row["line_no"],
                       "first_observed": first_observed}
            entries.append(current)
            continue
        field = _TABLE_FIELD.match(text)
        if field and (current is None or field["key"] in current):
            # an excerpt that starts inside the table, past its "[0]:" line: the fields say the rank
            current = {"entry_rank": None, "file": row["file"], "line_no": row["line_no"],
                       "first_observed": first_observed}
            entries.append(current)
        if field and row["line_no"] - current["line_no"] <= 10:
            current.setdefault(field["key"], field["value"].strip())
    events, failures = [], []
    for e in entries:
        if "exitcode" not in e:
            continue
        code = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", e["exitcode"])
        rank = re.match(r"(\d+)(?: \(local_rank: (\d+)\))?", e.get("rank", ""))
        try:
            ts = datetime.strptime(e.get("time", ""), "%Y-%m-%d_%H:%M:%S")
        except ValueError:
            ts = None
        exit_code = int(code[1]) if code else None
        sig = signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None
        error_file = e.get("error_file")
        if not rank and e["entry_rank"] is None:
            continue
        row = {"rank": int(rank[1]) if rank else e["entry_rank"], "ts": ts, "exit_code": exit_code, "signal": sig,
               "pid": int(code[2]) if code and code[2] else None, "host": e.get("host"), "source": "torchrun",
               "message": _short(e.get("traceback")), "file": e["file"], "line_no": e["line_no"]}
        failures.append(row)
        events.append({"rank": row["rank"], "ts": ts, "file": e["file"], "line_no": e["line_no"], "level": "E",
                       "kind": "torchrun_failure", "message": _short(e.get("traceback")), "pid": row["pid"],
                       "attrs": _attrs(exit_code=exit_code, signal=sig, host=e.get("host"),
                                       local_rank=int(rank[2]) if rank and rank[2] else None,
                                       first_observed=e["first_observed"],
                                       error_file=None if error_file in (None, "<N/A>") else error_file)})
    yield "failures", frame("failures", failures)
    yield "events", frame("events", events)


def _faulthandler_threads(block: list[str]) -> list[tuple[str, list]]:
    """The thread sections of a faulthandler dump (its lines' text: "Current thread 0x...", "Thread
    0x...", each followed by its frames, innermost first), in the order printed."""
    threads: list[tuple[str, list]] = []
    for text in block:
        if text.startswith(("Current thread", "Thread 0x")):
            threads.append((text.split(" (", 1)[0], []))
            continue
        m = _FAULTHANDLER_FRAME.match(text)
        if m and threads:
            threads[-1][1].append(m)
        elif threads and text.strip() and not text.startswith(" ") and not text.startswith("<no Python frame>"):
            break  # the dump ended ("Extension modules: ...", the next log line)
    return threads


def _crashing_thread(threads: list[tuple[str, list]]) -> list[tuple[str, list]]:
    """The thread that crashed: the one faulthandler calls current (Python 3.12 lists the
    others first), else the first that has a frame (an abort from a thread of a library's
    own has none)."""
    current = [t for t in threads if t[0].startswith("Current thread")]
    with_frames = [t for t in threads if t[1]]
    return (current or with_frames or threads)[:1]


# UCX's signal handler (linked into MPI/HPC-X builds): "[host:1610 :0:1610] Caught signal 11
# (Segmentation fault: address not mapped to object at address (nil))", then "==== backtrace".
_UCX_SIGNAL = r"Caught signal (?P<signum>\d+) \((?P<reason>[^)]*)"


def fatal_start() -> pl.Expr:
    """The first line of a fatal block: C++ terminate, faulthandler, UCX's signal handler."""
    return (pl.col("text").str.starts_with("terminate called after throwing")
            | pl.col("text").str.starts_with("Fatal Python error:")
            | pl.col("text").str.contains(_UCX_SIGNAL))


def _fatal_blocks(df: pl.DataFrame, own: pl.DataFrame) -> Iterator[tuple[str, pl.DataFrame]]:
    """C++ ``terminate called`` blocks, Python faulthandler dumps and UCX's signal reports."""
    starts = own.filter(fatal_start())
    if starts.is_empty():
        return
    events, failures, stacks = [], [], []
    for start in _rows(starts):
        # (the block's lines of the start's rank: their text is all the dump is read from)
        block = following(df.select("file", "rank", "text"), start, 200).filter(
            pl.col("rank").eq_missing(start["rank"]))["text"].to_list()
        text = start["text"]
        ts, timing = _when(start)
        common = {"rank": start["rank"], "ts": ts, "file": start["file"], "line_no": start["line_no"],
                  "pid": start["pid"]}
        if text.startswith("terminate called"):
            m = re.search(r"instance of '([^']+)'", text)
            what = next((t.split("what():", 1)[1].strip() for t in block[1:40] if "what():" in t), None)
            events.append({**common, "level": "F", "kind": "terminate", "message": _short(text),
                           "attrs": _attrs(exception_type=m[1] if m else None, what=_short(what), **timing)})
            failures.append({**common, "signal": "SIGABRT", "exception_type": m[1] if m else None,
                             "message": _short(what or text), "source": "terminate"})
            continue
        ucx = re.search(_UCX_SIGNAL, text)
        if ucx:  # UCX's handler: "[host:pid:0:tid] Caught signal 11 (Segmentation fault: ...)"
            sig = signal_name(int(ucx["signum"]))
            events.append({**common, "level": "F", "kind": "fatal", "message": _short(text),
                           "attrs": _attrs(signal=sig, **timing)})
            failures.append({**common, "signal": sig, "message": _short(ucx["reason"]), "source": "ucx"})
            continue
        reason = text.split(":", 1)[1].strip()
        sig = _FATAL_SIGNALS.get(reason)
        events.append({**common, "level": "F", "kind": "fatal", "message": _short(text),
                       "attrs": _attrs(signal=sig, **timing)})
        failures.append({**common, "signal": sig, "message": _short(reason), "source": "faulthandler"})
        for thread, frames in _crashing_thread(_faulthandler_threads(block[1:])):
            for depth, m in enumerate(frames):
                stacks.append({"rank": start["rank"], "pid": start["pid"], "thread": thread, "depth": depth,
                               "function": m["func"], "file": m["file"], "line": int(m["line"]),
                               "source": "faulthandler", "origin": start["file"], "origin_line": start["line_no"]})
    yield "events", frame("events", events)
    yield "failures", frame("failures", failures)
    yield "stacks", frame("stacks", stacks)


# What the lines each step below reads from hold (a superset of the step's own test): a step whose
# trigger the chunk's bytes lack (``state["present"]``, textlog's scan) is skipped. The steps that
# read every line (warnings by level, each rank's last line) or few (bare exceptions, torchrun's
# table: unprefixed lines only) have none.
_TRACEBACK = scan.Trigger("runtime.traceback", (_TRACEBACK_START,))
_VERSION = scan.Trigger("runtime.version", ("version", "torch=", "Python v"), caseless=True)
_OOM = scan.Trigger("runtime.oom", _OOM_MARKERS)
_FATAL = scan.Trigger("runtime.fatal", ("terminate called after throwing", "Fatal Python error:", "Caught signal "))
# the agent's lines _log_events keeps at any level (torchrun's "Sending process 4711 closing signal
# SIGTERM", c10d's store barrier wait)
_AGENT = scan.Trigger("runtime.agent", ("closing signal SIG", "Waiting in store based barrier"))
_AGENT_LINES = "|".join(map(re.escape, _AGENT.literals))
TRIGGERS = (_TRACEBACK, _VERSION, _OOM, _FATAL, _AGENT)


def parse_lines(df: pl.DataFrame, own: pl.DataFrame, state: dict) -> Iterator[tuple[str, pl.DataFrame]]:
    """All runtime records in one chunk; ``df`` adds lookahead rows to ``own``."""
    present = state.get("present")
    yield "events", _log_events(own, state)
    if scan.is_present(present, _VERSION.name):
        yield "events", _version_events(_holding(own, state, _VERSION))
    ended: set = set()  # (file, line) of the exception lines the tracebacks read
    if scan.is_present(present, _TRACEBACK.name):
        yield from _tracebacks(df, own, ended)
    yield from _bare_exceptions(df, own, ended)
    if scan.is_present(present, _OOM.name):
        yield "events", _out_of_memory_lines(own, ended)
    yield from _torchrun_failures(own)
    if scan.is_present(present, _FATAL.name):
        yield from _fatal_blocks(df, _holding(own, state, _FATAL))

"""Plain-text logs (a rank's stdout/stderr, torchrun's console): read once, parsed by many.

This module owns the file; the line parsers (``runtime``, ``nccl``) own the formats. A big
file is read in chunks; small files (under ``BATCH_MAX_BYTES``) are read whole and parsed many
to a frame, one after another. Each frame of lines gets the log header every format shares
parsed once, into the columns

    file   String            the file the line is from (what the tables store)
    level  I/W/E/F/C/V/D     from a glog, c10 or Python-logging header
    ts     Datetime(us)      the header's time (the year comes from the run)
    ts_ff  Datetime(us)      ts, or the last one before it in this file (for untimed lines)
    ts_bf  Datetime(us)      ts, or the next one after it (an untimed line happened before it)
    msg    String            the text after the header
    src_at, src_end  Int64   where a glog header's "[pid ]src:line" lies in ``text``: the pid a
                             Python-logging header names and the emitting code location (e.g.
                             ``ProcessGroupNCCL.cpp:689``), taken apart by ``lines.header_source``
                             for the rows that need them

A line parser declares ``LINES``, a regex every line it reads a record from matches, unless it
reads every line. Such a parser is not called for a chunk none of whose own lines matches; when
called, its ``own`` holds only the lines that match, and its ``df`` (the chunk and its lookahead,
every line) has the Boolean column ``wanted`` that marks them. A parser may also declare
``TRIGGER`` (``scan.Trigger``: literals every line LINES matches holds): a chunk whose bytes the
scan found none in skips the parser before LINES runs, and LINES runs only on the lines that
hold one. A parser's ``state`` (a dict) lives as long as the file, or the batch: what it keeps
there is keyed by file; ``state["present"]`` is what the scan found in the chunk (None: not
scanned), ``state["hits"]`` in which rows, by ``pos`` (``scan.holding``). Blocks of lines (a
traceback) end where their file does. A parser may declare ``HEADER_LINES`` too: the part of
LINES a log header may hold (``_line_masks``). One whose lines are most of a log's (TORCH_LOGS'
dynamo records can be 85% of a rank's lines) may declare ``OWN_UNFILTERED``: its ``own`` is then
every own line, with ``wanted``, not a copy of the wanted ones (5 ms a 32 MB frame).

Headers seen in real PyTorch 2.11 logs:

    [E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught ...
    V1129 13:40:20.565000 5350 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] ...
    2026-11-29 13:33:12,646 [rank0] step 0 loss 1.4026 step_time 3.722s
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import polars as pl
import pyarrow as pa

from . import detail, dynamo, horovod, memory, nccl, ncclras, progress, ranktime, runtime, scan
from .columns import arrow_column, from_buffer
from .lines import (CHUNK_BYTES, LineChunk, blocks_of_lines, key_ids, line_chunks, read_line_chunks,
                    read_whole, split_block)
from .source import Source

try:  # the byte work of the header stage, in C (parsers/_lines.c), built where a compiler was at install
    from . import _lines as _headers_c
except ImportError:  # pragma: no cover (CI builds it; tests/test_native_headers.py fails without it)
    _headers_c = None

KIND = "text_log"
LINE_PARSERS = (runtime, nccl, ncclras, horovod, detail, dynamo, memory, ranktime, progress)
# One scan of each block finds them all (lines.read_line_chunks): the line parsers' TRIGGER (the
# literals every line their LINES matches holds) and the runtime steps' TRIGGERS.
scan.declare(*(p.TRIGGER for p in LINE_PARSERS if hasattr(p, "TRIGGER")), *runtime.TRIGGERS)

# The glog / c10 header, matched without capture groups (a DFA scan that stops where the header
# does). Nothing in it before its closing "]" can be a "]", so the first "]" of a line that has
# one ends it; its fields sit at fixed offsets or between its spaces. ASCII throughout, so
# Polars' byte offsets (find) and character offsets (slice) agree.
#   [level][mm][dd] [hh:mm:ss].[frac] +[pid +]src:line] msg
# (c10's own logger does not pad the month: "[E419 10:42:28.858931807 ProcessGroupNCCL.cpp:616]"
# is April 19; glog's does: "E0419 11:01:25.597000 245 torch/distributed/..."; before 2.2 c10
# printed no time at all: "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught ...")
# (``[!-\\^-~]``: printable ASCII but "]")
_GLOG_HEAD = r"^\[?[IWEFCVD](?:\d{3,4} \d\d:\d\d:\d\d\.\d{1,9}(?: +\d+)?)? +[!-\\^-~]+:\d+\]"
# Python logging's asctime, bare or in brackets (DeepSpeed, torchtitan, 2.0-2.2 dynamo warnings:
# "[2023-04-14 13:11:27,879] [INFO] [launch.py:428:sigkill_handler] Killing subprocess 13266").
_ASCTIME = (r"^\[?(?<date>\d{4}-\d\d-\d\d)[ T_](?<hms>\d\d:\d\d:\d\d)(?:[,.](?<frac>\d{1,6}))?\]?"
            r"\s*(?<msg>.*)$")
_ASCTIME_START = r"^\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d"
_ASCTIME_LEVEL = r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL|FATAL)\b"


@functools.cache
def _asctime_fields() -> pl.Expr:
    """Python logging's asctime: the capturing regex runs only on lines that start with a date
    (built once per process: building it compiles the regex)."""
    return pl.when(pl.col("text").str.contains(_ASCTIME_START)).then(pl.col("text")).str.extract_groups(_ASCTIME)


# Control characters no text log holds (tab, newlines, ESC of colours and form feed are text).
_CONTROL = bytes(b for b in range(32) if b not in b"\t\r\n\x1b\x0c")


def sniff(head: bytes, name: str) -> bool:
    """Text: no NUL bytes and few control characters. Invalid UTF-8 (a Latin-1 log, a line cut
    mid-character) is still text; it is read with replacement characters."""
    sample = head[:8192]
    if not sample or b"\x00" in sample:
        return False
    control = len(sample) - len(sample.translate(None, _CONTROL))
    undecodable = sample.decode("utf-8", errors="replace").count("\ufffd")
    return control <= len(sample) // 20 and undecodable <= len(sample) // 3


def _glog_fields(df: pl.DataFrame, year: int) -> pl.DataFrame:
    """Each line's glog / c10 header fields: ``_level``, ``_ts``, ``src_at`` and ``src_end``
    (all NULL where it has none; ``src_end`` never where it has one). They depend on the line's
    bytes up to its first "]" alone (nothing in a glog header before its end is a "]", and a
    space follows its time): ``text`` may be just those."""
    text = pl.col("text")
    # Offsets first, as columns: a slice whose bounds are expressions recomputes them per use.
    df = df.with_columns(
        pl.when(text.str.contains(_GLOG_HEAD)).then(text.str.find("]", literal=True)).alias("_close"),
        text.str.starts_with("[").cast(pl.Int64).alias("_start"),
        # where the time ends: its fraction (1 to 9 digits) starts at 15 (14 for an unpadded month), one later after a "["
        (text.str.slice(16, 10).str.find(" ", literal=True) + 16).alias("_time_end"),
    )
    close, start = pl.col("_close"), pl.col("_start")
    glog = close.is_not_null()
    # a header with no time ("[E ProcessGroupNCCL.cpp:737]") has its source right after the level
    time_end = pl.when(text.str.slice(start + 1, 1) == " ").then(start + 2).otherwise(pl.col("_time_end"))
    stamp = pl.when(glog).then(text.str.slice(start + 1, time_end - start - 1))  # "1129 13:33:42.672765297"
    df = df.with_columns(stamp.alias("_stamp"))
    stamp = pl.col("_stamp")
    stamp = pl.when(stamp.str.slice(3, 1) == " ").then(pl.concat_str(pl.lit("0"), stamp)).otherwise(stamp)
    return df.select(
        pl.when(glog).then(text.str.slice(start, 1)).alias("_level"),
        pl.concat_str(pl.lit(str(year)), stamp).str.strptime(pl.Datetime("us"), "%Y%m%d %H:%M:%S%.f",
                                                              strict=False).alias("_ts"),
        pl.when(glog).then(time_end).alias("src_at"),
        close.alias("src_end"),
    )


def _asctime_lines(df: pl.DataFrame) -> pl.DataFrame:
    """Level, ts and msg of lines without a glog header: from Python logging's asctime where the
    line starts with one (its level is a word of the message), else the whole line is the message."""
    asc = _asctime_fields()
    a = lambda f: asc.struct.field(f)  # noqa: E731
    asc_ts = pl.format("{} {}.{}", a("date"), a("hms"), a("frac").fill_null("0")).str.to_datetime(
        "%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us"
    )
    return df.select(
        a("msg").str.extract(_ASCTIME_LEVEL, 1).str.slice(0, 1).alias("level"),
        asc_ts.alias("ts"),
        pl.coalesce(a("msg"), pl.col("text")).alias("msg"),
    )


# A line up to its first "]" and the character after it; all of it where it has no "]". (A regex, not
# ``str.find`` and ``str.slice``: ``find`` counts bytes before Polars 2.2 and characters from it.)
_HEAD = r"^([^\]]*(?:\](?s:.)?)?)"


@dataclass
class HeaderRuns:
    """A frame's lines in runs of those whose bytes up to the first "]", and the one after it, are the same.

    A multi-line log record (a TORCH_LOGS graph break or guard dump, a warning with its stack)
    repeats its header on every line: what a header says is worked out on the first line of each
    run (``first``) and copied to the others (``spread``); where its message starts too (after the
    space a header is followed by). A line without a "]" is its own head.
    """

    head: pl.Series  # each line up to its first "]" and the character after it (all of it where it has no "]")
    first: pl.Series  # Boolean: the line starts a run
    run: pl.Series | None  # each line's run, numbered from 0 (None: every line starts one)
    # each line's glog header fields (``_header_fields``), where C worked them out with the runs
    fields: pl.DataFrame | None = None

    @classmethod
    def of(cls, text: pl.Series, year: int | None = None) -> HeaderRuns:
        """The runs of ``text``; with the ``year`` of its log, each line's header fields too, where C can."""
        if _headers_c is not None and year is not None and 1000 <= year <= 9999 and not text.null_count():
            return _native_runs(text, year)
        head = text.str.extract(_HEAD, 1)
        first = head.is_null() | head.ne_missing(head.shift(1))
        return cls(head, first, None if first.all() else first.cum_sum() - 1)

    def firsts(self, df: pl.DataFrame | pl.Series) -> pl.DataFrame | pl.Series:
        """The rows of ``df`` (the frame's own, or one of its columns) that start a run."""
        return df if self.run is None else df.filter(self.first)

    def spread(self, df: pl.DataFrame | pl.Series) -> pl.DataFrame | pl.Series:
        """Values worked out for the runs' first lines (``firsts``), given to every line of each run."""
        if self.run is None:
            return df
        return df.gather(self.run) if isinstance(df, pl.Series) else df.select(pl.all().gather(self.run))


def _native_runs(text: pl.Series, year: int) -> HeaderRuns:
    """``HeaderRuns.of`` and ``_header_fields`` in one pass of C over the lines' bytes: the heads and
    messages are string views into the lines' own buffers. A glog time of a shape other than
    "MMDD HH:MM:SS.f" (or not a real time) is left to Polars' strptime (``_glog_fields``), on
    those lines alone. ``tests/test_native_headers.py`` holds the two paths equal."""
    array = text.to_arrow(compat_level=pl.CompatLevel.newest())
    buffers = array.buffers()
    n, data = len(array), buffers[2:]
    views = buffers[1][array.offset * 16:(array.offset + n) * 16]
    # C writes into Arrow memory, which the columns stand on (a buffer Python owns would not do: see
    # columns.arrow_owned): each output's bytes a line, a bitmap's rounded up
    bits = (n + 7) // 8
    outs = (heads, firsts, glog, levels, src_at, src_at_valid, src_end, msgs, ts, ts_valid) = tuple(
        pa.allocate_buffer(size) for size in (16 * n, bits, bits, 16 * n, 8 * n, bits, 4 * n, 16 * n, 8 * n, bits))
    unknown = _headers_c.glog_headers(views, tuple(data), year, outs)

    head = arrow_column(pa.string_view(), n, heads, None, *data)
    first = arrow_column(pa.bool_(), n, firsts)
    fields = pl.DataFrame([
        arrow_column(pa.string_view(), n, levels, glog).alias("_level"),
        arrow_column(pa.timestamp("us"), n, ts, ts_valid).alias("_ts"),
        arrow_column(pa.int64(), n, src_at, src_at_valid).alias("src_at"),
        arrow_column(pa.uint32(), n, src_end, glog).alias("src_end"),
        arrow_column(pa.string_view(), n, msgs, glog, *data).alias("_msg"),
    ])
    if unknown:
        rows = from_buffer(pa.uint32(), len(unknown) // 4, unknown)
        stamps = _glog_fields(head.gather(rows).alias("text").to_frame(), year)["_ts"]
        fields = fields.with_columns(fields["_ts"].scatter(rows, stamps))
    return HeaderRuns(head, first, None if first.all() else first.cum_sum() - 1, fields)


def _header_fields(df: pl.DataFrame, year: int, runs: HeaderRuns) -> pl.DataFrame:
    """Each line's glog / c10 header fields (``_level``, ``_ts``, ``src_at``, ``src_end``, all NULL
    where it has none) and the message after the header (``_msg``): taken apart once a run."""
    # (taken from the line's head, its text up to the first "]": all a glog header's fields lie in it)
    heads = runs.firsts(runs.head)
    fields = _glog_fields(heads.alias("text").to_frame(), year)
    # the message starts after the header and the one space that follows it
    after = fields["src_end"] + 1
    fields = runs.spread(fields.with_columns(
        (after + (heads.str.slice(after, 1) == " ").cast(pl.UInt32)).alias("_msg_at")))
    msg = df.select(pl.col("text").str.slice(fields["_msg_at"])).to_series()
    return fields.drop("_msg_at").with_columns(msg.alias("_msg"))


def with_headers(df: pl.DataFrame, year: int, runs: HeaderRuns | None = None) -> pl.DataFrame:
    """Add level, ts and msg parsed from each line's log header, and where its source lies; the
    header of a run of lines (``HeaderRuns``) is taken apart once."""
    runs = runs or HeaderRuns.of(df["text"], year)
    fields = runs.fields if runs.fields is not None else _header_fields(df, year, runs)
    others = fields["src_end"].is_null()  # (the lines without a glog header)
    n_others = int(others.sum())
    out = df.with_columns(fields["src_at"], fields["src_end"])
    if not n_others:
        return out.with_columns(fields["_level"].alias("level"), fields["_ts"].alias("ts"), fields["_msg"].alias("msg"))
    if n_others == df.height:
        return out.with_columns(_asctime_lines(df.select("text")).get_columns())
    # the few lines without a glog header are parsed alone, their fields put in their rows
    # (the text alone: Polars 2.1 panics taking these fields from a filtered frame of several columns)
    asc = _asctime_lines(df.select("text").filter(others))
    where = others.arg_true()
    return out.with_columns(fields["_level"].scatter(where, asc["level"]).alias("level"),
                            fields["_ts"].scatter(where, asc["ts"]).alias("ts"),
                            fields["_msg"].scatter(where, asc["msg"]).alias("msg"))


def _line_masks(df: pl.DataFrame, present: frozenset[str] | None,
                hits: dict[str, pl.Series] | None, runs: HeaderRuns) -> dict[str, pl.Series | None]:
    """For each line parser that declares ``LINES`` (a regex every line it reads matches), whether
    each line matches it, before any header is parsed; None for a parser whose ``TRIGGER`` the
    scan did not find in the chunk (no line of it can match). Where the scan says which lines
    hold a trigger's literals (``hits``), LINES runs on those alone; where a parser declares
    ``HEADER_LINES`` (a part of LINES a line's header may hold), the lines of a run whose header
    matches it match, and LINES runs on the others."""
    masks: dict[str, pl.Series | None] = {}
    for p in LINE_PARSERS:
        trigger = getattr(p, "TRIGGER", None)
        if not hasattr(p, "LINES"):
            continue
        if trigger is not None and not scan.is_present(present, trigger.name):
            masks[p.__name__] = None
            continue
        text, holding, in_header = df["text"], None, None
        if trigger is not None:
            holding = scan.holding(df, hits, trigger)
        if hasattr(p, "HEADER_LINES"):
            in_header = runs.spread(runs.firsts(runs.head).str.contains(p.HEADER_LINES)).fill_null(False)
            outside = ~in_header
            rest = outside.arg_true()
            text = text.filter(outside)  # (as scan.contains_among: a filter, not a gather by position)
            holding = holding.filter(outside) if holding is not None else None
        if trigger is None:
            mask = text.str.contains(p.LINES)
        else:
            mask = scan.matching(text, trigger, p.LINES, holding)
        masks[p.__name__] = mask if in_header is None else in_header.scatter(rest, mask)
    return masks


def _file_lines(source: Source, chunk: LineChunk) -> tuple[pl.DataFrame, int]:
    """A chunk of one file's lines with what the file says about them (its name, its rank), the
    tee'd copies of ranks read elsewhere dropped; and how many rows are the chunk's own."""
    df = chunk.frame.with_row_index("row")
    if source.tee_ranks_elsewhere:
        df = df.filter(~(pl.col("tee") & pl.col("rank").is_in(list(source.tee_ranks_elsewhere))))
    # Rows [0, own) of the chunk come first: its own lines are a head of the frame.
    own_rows = df.height if chunk.own == chunk.frame.height else int((df["row"] < chunk.own).sum())
    if source.rank is not None and df["rank"].null_count():
        df = df.with_columns(pl.col("rank").fill_null(source.rank))
    return df.with_columns(pl.lit(source.name).alias("file")), own_rows


def _hit_rows(line_no: pl.Series, hits: dict[str, pl.Series] | None) -> dict[str, pl.Series] | None:
    """The scan's hits (``LineChunk.hits``: line numbers, per trigger) as the positions of the rows
    of a frame of one file's lines that hold them (``line_no`` in order; a line cut in two is two
    rows, a tee'd copy dropped none)."""
    if hits is None:
        return None
    low, high = (line_no[0], line_no[-1]) if line_no.len() else (0, -1)
    if high - low == line_no.len() - 1 and (line_no.len() < 2 or line_no.diff().min() >= 1):
        # (the numbers rise one a row: a line's row is its number less the first's)
        return {name: (lines.filter((lines >= low) & (lines <= high)) - low).cast(pl.UInt32)
                for name, lines in hits.items()}
    rows = {}
    for name, lines in hits.items():
        first, end = line_no.search_sorted(lines, side="left"), line_no.search_sorted(lines, side="right")
        rows[name] = pl.select(pl.int_ranges(first, end, dtype=pl.UInt32).explode().drop_nulls()).to_series()
    return rows


def _parse_frame(df: pl.DataFrame, own_rows: int, year: int, state: dict, last_ts: datetime | None = None,
                 present: frozenset[str] | None = None, hits: dict[str, pl.Series] | None = None,
                 file_no: pl.Series | None = None) -> Iterator[tuple[str, pl.DataFrame]]:
    """Every line parser's records from a frame of lines: a chunk of one file (``last_ts`` the
    time its earlier chunks ended on), or whole files one after another (``file_no``: each row's,
    numbered from 0); ``present`` what the scan found in their bytes and ``hits`` in which rows
    (their positions in ``df``)."""
    df = df.with_row_index("pos")
    runs = HeaderRuns.of(df["text"], year)
    masks = _line_masks(df, present, hits, runs)
    state["present"] = present
    state["hits"] = hits
    df = with_headers(df, year, runs)
    # the runs' heads and numbers, and the header fields df took copies of, let go before the parsers run:
    # their work then reuses that memory instead of faulting in new pages (9 MB of a 6-log frame)
    del runs
    file_no = file_no if file_no is not None else pl.repeat(0, df.height, dtype=pl.UInt32, eager=True)
    df = df.with_columns(file_no.alias("file_no"), *_filled_times(df["ts"], file_no, last_ts).get_columns())
    own = df.head(own_rows)
    if own.height:
        state["last_ts"] = own["ts_ff"][-1]
    for parser in LINE_PARSERS:
        if parser.__name__ not in masks:
            yield from _on_its_thread(parser, df, own, state)
            continue
        wanted = masks[parser.__name__]
        if wanted is not None and wanted.head(own_rows).any():
            narrowed = df.with_columns(wanted.alias("wanted"))
            own_wanted = narrowed.head(own_rows)
            if not getattr(parser, "OWN_UNFILTERED", False):
                own_wanted = own_wanted.filter("wanted")
            yield from _on_its_thread(parser, narrowed, own_wanted, state)


def _filled_times(ts: pl.Series, file_no: pl.Series, last_ts: datetime | None) -> pl.DataFrame:
    """``ts_ff`` (each line's time, or the last one before it in its file, else ``last_ts``) and
    ``ts_bf`` (or the next one after it in its file)."""
    files = file_no[-1] + 1 if file_no.len() else 1  # (numbered in order from 0: the last row's is the most)
    # each file's rows filled apart (a time is carried only where it was the same file's): they lie
    # one after another, each file's from where its number starts
    bounds = file_no.search_sorted(pl.Series(range(1, files), dtype=file_no.dtype)).to_list() if files > 1 else []
    parts = [ts.slice(start, end - start) for start, end in zip([0, *bounds], [*bounds, ts.len()])]
    ts_ff = pl.concat([p.forward_fill() for p in parts]) if len(parts) > 1 else ts.forward_fill()
    ts_bf = pl.concat([p.backward_fill() for p in parts]) if len(parts) > 1 else ts.backward_fill()
    if last_ts is not None:
        ts_ff = ts_ff.fill_null(last_ts)
    return pl.DataFrame([ts_ff.alias("ts_ff"), ts_bf.alias("ts_bf")])


def _file_numbers(group: list[Read]) -> pl.Series | None:
    """Each row's file in the frame of ``group``'s lines, numbered from 0 (files one after another, each
    read's in order); None where they are one file's."""
    parts, files = [], 0
    for r in group:
        names = r.lines["file"]
        # (a read of several files holds them one after another: one whose first and last line are one file's is one)
        ids = (key_ids(r.lines, ["file"]) if names[0] != names[-1]
               else pl.repeat(0, r.lines.height, dtype=pl.UInt32, eager=True))
        parts.append(ids + files)
        files += int(ids[-1]) + 1
    return pl.concat(parts) if files > 1 else None


@functools.cache
def _thread_of(parser_name: str) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix=parser_name)


def _on_its_thread(parser, df: pl.DataFrame, own: pl.DataFrame, state: dict) -> list[tuple[str, pl.DataFrame]]:
    """A line parser's records, parsed on a thread of its own, one parser at a time: Polars keeps
    the 32 regexes a thread used last compiled, and a frame's parsers use some fifty, each
    compiled again every frame where they share one thread (~0.5 ms each); no parser uses 32."""
    return _thread_of(parser.__name__).submit(lambda: list(parser.parse_lines(df, own, state))).result()


def parse(source: Source) -> Iterator[tuple[str, pl.DataFrame]]:
    """A file of any size, chunk by chunk."""
    state: dict = {}
    for chunk in read_line_chunks(source.path):
        df, own_rows = _file_lines(source, chunk)
        yield from _parse_frame(df, own_rows, source.year, state, state.get("last_ts"), chunk.present,
                                _hit_rows(df["line_no"], chunk.hits))
        if own_rows:
            source.lines = int(df["line_no"][own_rows - 1])


# A file smaller than a chunk is read whole (``read``) and parsed with others (``build``): a frame
# costs some 80 ms of fixed Polars work however few its lines (planning each step, and compiling
# its regexes again: Polars keeps 32 a thread, and the parsers use more), as much as 10 MB of lines.
BATCH_MAX_BYTES = CHUNK_BYTES


def batchable(source: Source) -> bool:
    return source.bytes < BATCH_MAX_BYTES and not source.compressed


@dataclass
class Read:
    lines: pl.DataFrame | None
    year: int
    present: frozenset[str] | None = None  # the triggers the scan found in the file (None: take all)
    hits: dict[str, pl.Series] | None = None  # positions in ``lines`` of each per-line trigger's rows
    # or, not yet split: the file's lines as one block of bytes, split and scanned with other files' in ``build``
    block: bytes | pa.Buffer | None = None
    source: Source | None = None


def read(source: Source) -> Read:
    """A plain file's lines as one block of bytes (read into Arrow memory: ``read_whole``), split in
    ``build`` with other files' (a split or a scan has a fixed cost of milliseconds, as much as a
    hundred kilobytes of lines cost); a console whose copies of ranks logged elsewhere are dropped,
    or a file grown past a block while read, as lines (one chunk: no lookahead to carry) with what
    the scan found in them."""
    if not source.tee_ranks_elsewhere and (whole := read_whole(source.path)) is not None:
        return Read(None, source.year, block=whole, source=source)
    blocks = list(blocks_of_lines(source.path))
    if len(blocks) == 1 and not source.tee_ranks_elsewhere:
        return Read(None, source.year, block=blocks[0], source=source)
    chunks = [(*_file_lines(source, chunk), chunk) for chunk in line_chunks(blocks)]
    if not chunks:
        return Read(None, source.year)
    lines = pl.concat([df for df, _, _ in chunks])
    if lines.height:
        source.lines = int(lines["line_no"][-1])
    if len(chunks) > 1:  # (not a size read whole; what the scan found is not kept for it)
        return Read(lines, source.year)
    _, _, chunk = chunks[0]
    return Read(lines, source.year, chunk.present, _hit_rows(lines["line_no"], chunk.hits))


def _split_together(reads: list[Read]) -> Read:
    """Files read as blocks (``read``) as lines: their blocks split and scanned as one, each
    file's lines then numbered from 1 and given its name and, where no prefix names one, its rank."""
    if len(reads) == 1:
        return _split_alone(reads[0])
    data = b"\n".join(r.block for r in reads)
    found = scan.block_scanner().scan(data)
    # each file's first line: where its bytes start (counting a block's newlines costs 6 ms per 16 MB)
    frame, hits, starts = split_block(data, 1, found, list(itertools.accumulate((len(r.block) + 1 for r in reads[:-1]),
                                                                            initial=0)))
    ends = [*starts[1:], frame["line_no"][-1] + 1]  # (the last row is the last line's, even a line cut in two)
    for r, start, end in zip(reads, starts, ends):
        r.source.lines = end - start
    # each row's file: the last whose first line is at or before the row's (a glued line cut in two is two rows)
    of = starts.search_sorted(frame["line_no"], side="right").cast(pl.Int64) - 1
    rows = _hit_rows(frame["line_no"], hits)  # (by the blocks' own line numbers)
    frame = frame.with_columns(
        (pl.col("line_no") - starts.gather(of) + 1).alias("line_no"),
        pl.coalesce(pl.col("rank"), pl.Series([r.source.rank for r in reads], dtype=pl.Int32).gather(of)).alias("rank"),
    )
    return Read(frame.with_row_index("row").with_columns(pl.Series([r.source.name for r in reads]).gather(of).alias("file")),
                reads[0].year, found.present if found else None, rows)


def _split_alone(read: Read) -> Read:
    """``_split_together`` of one file's block: its lines are numbered from 1 as split."""
    found = scan.block_scanner().scan(read.block)
    frame, hits, _ = split_block(read.block, 1, found)
    read.source.lines = int(frame["line_no"][-1]) if frame.height else 0
    if read.source.rank is not None:
        frame = frame.with_columns(pl.col("rank").fill_null(read.source.rank))
    return Read(frame.with_row_index("row").with_columns(pl.lit(read.source.name).alias("file")), read.year,
                found.present if found else None, _hit_rows(frame["line_no"], hits))


def _batch_scan(reads: list[Read]) -> tuple[frozenset[str] | None, dict[str, pl.Series] | None]:
    """What the scan found in files parsed as one frame (their lines one after another): every
    trigger any of them holds, and the rows, offset by where each file's lines start. Unknown for
    all where it is for one."""
    if any(r.present is None for r in reads):
        return None, None
    present = frozenset().union(*(r.present for r in reads))
    if any(r.hits is None for r in reads):
        return present, None
    parts: dict[str, list[pl.Series]] = {}
    offset = 0
    for r in reads:
        for name, rows in r.hits.items():
            parts.setdefault(name, []).append(rows + offset)
        offset += r.lines.height
    return present, {name: pl.concat(rows) for name, rows in parts.items()}


SPLIT_ALONE_BYTES = 1 << 20


def _as_lines(reads: list[Read]) -> list[Read]:
    """The reads, in order, with each run of files read as blocks split together."""
    out: list[Read] = []
    for as_block, run in itertools.groupby(reads, key=lambda r: r.block is not None):
        if not as_block:
            out += run
            continue
        # a big file's block is split alone: joined to others, its bytes would be copied (7 ms per 16 MB)
        # for a split's fixed cost, which its size already shares
        for alone, part in itertools.groupby(run, key=lambda r: len(r.block) >= SPLIT_ALONE_BYTES):
            out += [_split_alone(r) for r in part] if alone else [_split_together(list(part))]
    return out


def build(reads: list[Read]) -> Iterator[tuple[str, pl.DataFrame]]:
    """The records of many files, parsed as one frame (a ``file`` column tells them apart)."""
    for year in sorted({r.year for r in reads}):
        group = [r for r in _as_lines([r for r in reads if r.year == year]) if r.lines is not None and r.lines.height]
        if group:
            df = pl.concat([r.lines for r in group], rechunk=True).drop("row").with_row_index("row")
            found, file_no = _batch_scan(group), _file_numbers(group)
            # the files' own frames, copied into df, let go before it is parsed: the parsers' work reuses their
            # memory instead of taking fresh pages (six 16 MB logs: 19 MB less at a worker's peak)
            del group
            yield from _parse_frame(df, df.height, year, {}, None, *found, file_no)

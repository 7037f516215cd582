"""Text log files as Polars frames of lines, read in bounded chunks.

Every text parser (runtime, nccl, dynamo, ...) works on the frames this module yields, so a
log is read and split once however many parsers look at it. A frame has the columns

    line_no  Int64   1-based line number in the file
    rank     Int32   the rank named by the line's ``[rankN]:`` / ``[default3]:`` prefix, or NULL
    tee      Boolean the line carries torchrun's ``--tee`` prefix (``[default0]:``), i.e. it
                     is a copy of a worker's output in the agent's console
    text     String  the line with those prefixes removed (and a trailing CR)

A real line, from torchrun's console under PyTorch 2.11 (both prefixes present):

    [default0]:[rank0]:[E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog ...

Chunks end on a newline; each carries up to ``LOOKAHEAD`` lines of the next chunk so that
a parser of multi-line blocks (a traceback) can finish a block that crosses the cut. Rows
``[0, own)`` belong to the chunk; parsers of single lines look only at those.
"""

from __future__ import annotations

import functools
import gzip
import inspect
import io
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa

from . import scan
from .columns import arrow_column, arrow_owned, dictionary, from_buffer, values_of

try:  # the C part of splitting (parsers/_lines.c), built where a compiler was at install
    from . import _lines as _split_c
except ImportError:  # pragma: no cover (CI builds it; tests/test_ascii_split.py fails without it)
    _split_c = None

CHUNK_BYTES = 32 << 20
LOOKAHEAD = 400
# A line longer than this is cut before any regex sees it: real log lines are far shorter,
# and a 50 MB "line" of binary junk must not cost regex time.
MAX_LINE_CHARS = 64 << 10

# What launchers and log collectors put before a line, outermost first, each optional:
#    1: [rank1]:...                      srun --label: the task id, right-aligned to the widest
#   node04 [stderr] [rank14]:...         a runner that tags each line with its host and stream
#   [80746] [rank0]:...                  a line or pid number before a rank prefix (a log viewer's copy)
#   [1,3]<stderr>:...                    mpirun --tag-output: [job,rank]<stream>:  (horovodrun: [rank]<stream>:)
#   [default3]:[rank3]:...               torchrun's --tee prefix, then the rank's own prefix
#   (RayWorkerWrapper pid=4009) ...      Ray's tag of a worker process's output (name, pid, perhaps its ip),
#   (EngineCore_DP0 pid=1251450) ...     and vLLM's multiprocess executor's, which copies it
_PROCESS_TAG = r"(?:\((?:[\w.-]+ )?pid=\d+(?:, ip=[\d.]+)?\) )?"
_PREFIX = (rf"^{_PROCESS_TAG}(?: *(?<s0>\d{{1,6}}): )?(?:[\w.-]+ \[(?:stdout|stderr)\] )?"
           r"(?:\[\d+\] \[(?<w0>[A-Za-z_]+)(?<n0>\d+)\]:|\[(?:\d+,)?(?<m0>\d+)\]<(?:stdout|stderr)>:)?"
           r"(?:\[(?<w1>[A-Za-z_]+)(?<n1>\d+)\]:)?(?:\[(?<w2>[A-Za-z_]+)(?<n2>\d+)\]:)?")


@dataclass
class LineChunk:
    frame: pl.DataFrame
    own: int  # rows [0, own) belong to this chunk, the rest is lookahead
    # the triggers (``scan``) the chunk's own bytes hold; None: not scanned, take all as present
    present: frozenset[str] | None = None
    # for each per-line trigger the scan found, the numbers of the lines (own and lookahead) that
    # hold one of its literals; None: not known (no scan, or a block with too many matches)
    hits: dict[str, pl.Series] | None = None


def open_binary(path: Path) -> io.BufferedIOBase:
    """The file's bytes, gunzipped when it is gzip (by magic number, not by name), and as UTF-8
    when it is UTF-16 text (by its byte-order mark: Windows PowerShell's ``>`` writes UTF-16)."""
    fh = open(path, "rb")
    magic = fh.peek(2)[:2]
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh)  # type: ignore[return-value]
    if magic in (b"\xff\xfe", b"\xfe\xff"):
        return io.BufferedReader(_Utf16AsUtf8(fh), 1 << 20)
    return fh


class _Utf16AsUtf8(io.RawIOBase):
    """A UTF-16 text file read as UTF-8 bytes, in bounded pieces: every parser reads UTF-8."""

    def __init__(self, fh: io.BufferedReader):
        self._text = io.TextIOWrapper(fh, encoding="utf-16", errors="replace", newline="")
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            piece = self._text.read(1 << 16)
            if not piece:
                return 0
            self._pending = piece.encode("utf-8")
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._text.close()
        super().close()


@functools.lru_cache(maxsize=256)
def extract_groups(column: str, pattern: str) -> pl.Expr:
    """``pl.col(column).str.extract_groups(pattern)``, built once per process: building it
    compiles the regex (about a millisecond), and every chunk of every file asks for dozens."""
    return pl.col(column).str.extract_groups(pattern)


def per_distinct(df: pl.DataFrame, key: str, *exprs: pl.Expr) -> pl.DataFrame:
    """``df`` with ``exprs`` (over its column ``key``) added, computed once per distinct value of
    ``key`` and joined back: capture groups cost about a microsecond a line, and the fields they
    take apart (a line's rank prefix, a compile id) repeat over thousands of lines."""
    values = df.select(pl.col(key).unique()).with_columns(*exprs)
    return df.join(values, on=key, how="left", maintain_order="left", nulls_equal=True)


def key_ids(df: pl.DataFrame, key: list[str]) -> pl.Series:
    """A number for each row's ``key`` (some of ``df``'s columns; NULLs equal), equal for rows of
    equal keys. Rows of one key follow one another (a file's lines, a stream's records): the keys
    are compared with the row before, and only the first rows of such runs hashed; a window or a
    group over the number then hashes one integer a row instead of several strings."""
    changed = pl.any_horizontal(*(pl.col(c).ne_missing(pl.col(c).shift(1)) for c in key))
    first = df.select(changed).to_series().scatter(0, True) if df.height else pl.Series([], dtype=pl.Boolean)
    firsts = df.select(key).filter(first)
    ids = firsts.join(firsts.unique(key, maintain_order=True).with_row_index("_key"), on=key, how="left",
                      maintain_order="left", nulls_equal=True)["_key"]
    return ids.gather(first.cum_sum() - 1).alias("_key")


def following(df: pl.DataFrame, start: dict, lines: int, first: int = 0) -> pl.DataFrame:
    """``lines`` rows of ``df`` from ``first`` rows after ``start`` (one of its rows; 0 is the row
    itself), those of start's file only: a frame can hold several small files one after another."""
    return df.slice(start["pos"] + first, lines).filter(pl.col("file") == start["file"])


def header_source(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` (lines from ``textlog``) with ``pid`` and ``src`` taken from each glog header's
    "[pid ]src:line" (between ``src_at`` and ``src_end``; NULL for a line without one). Parsers
    ask for it on the rows they keep: every line has a header, few rows need what it names."""
    where = pl.col("text").str.slice(pl.col("src_at"), pl.col("src_end") - pl.col("src_at")).str.strip_chars_start(" ")
    parts = where.str.splitn(" ", 2)
    first, second = parts.struct.field("field_0"), parts.struct.field("field_1")
    return df.with_columns(pl.when(second.is_not_null()).then(first).cast(pl.Int32, strict=False).alias("pid"),
                           pl.coalesce(second.str.strip_chars_start(" "), first).alias("src"))


_PREFIXES = (rf"^{_PROCESS_TAG}(?: *\d{{1,6}}: )?(?:[\w.-]+ \[(?:stdout|stderr)\] )?"
             r"(?:\[\d+\] \[[A-Za-z_]+\d+\]:|\[(?:\d+,)?\d+\]<(?:stdout|stderr)>:)?"
             r"(?:\[[A-Za-z_]+\d+\]:){0,2}")
# A byte no log line holds in practice: the CSV reader's separator when it splits lines.
_NO_SEPARATOR = b"\x1f"
# An empty line read as "", not NULL, by the reader itself (a fill afterwards copies every line):
# Polars 2 names the option empty_string_is_null, Polars 1 missing_utf8_is_empty_string.
_EMPTY_LINES_AS_TEXT = ({"empty_string_is_null": False}
                        if "empty_string_is_null" in inspect.signature(pl.read_csv).parameters
                        else {"missing_utf8_is_empty_string": True})


def line_series(data: bytes, ascii: bool | None = None) -> pl.Series:
    """The lines of ``data`` (split on newlines; invalid UTF-8 replaced), one string per line.

    Polars' CSV reader splits and decodes on every core when given a separator the data never
    holds and no quoting; ``str.split`` on the decoded text is the fallback (a block holding
    the separator, or lines that do not add up to the block). ``ascii``: whether ``data`` is, if known.
    """
    if data and _NO_SEPARATOR not in data:
        raw = pl.read_csv(data, has_header=False, separator=_NO_SEPARATOR.decode(), quote_char=None,
                          new_columns=["raw"], infer_schema=False, encoding="utf8-lossy",
                          truncate_ragged_lines=True, **_EMPTY_LINES_AS_TEXT)["raw"]
        # The reader takes a final newline as the end of the last line, not as an empty line after it.
        if data.endswith(b"\n"):
            raw = raw.extend_constant("", 1)
        if _same_bytes(raw, data, data.isascii() if ascii is None else ascii):
            return raw.rechunk() if raw.n_chunks() > 1 else raw
        lines = data.count(b"\n") + 1
        if raw.len() == lines:
            return raw.rechunk()
    return pl.Series("raw", [data.decode("utf-8", errors="replace")]).str.split("\n").explode()


def _same_bytes(lines: pl.Series, data: bytes, ascii: bool) -> bool:
    """Whether ``lines`` are the lines of ``data``, checked without counting its newlines: when no
    line holds a replacement character (what decoding puts for invalid UTF-8, never shorter than
    the bytes it replaces; ASCII bytes hold none) every line is as long as its bytes, and then a
    line lost or cut would make them add up to less than ``data``."""
    if int(lines.str.len_bytes().sum()) + lines.len() - 1 != len(data):
        return False
    return ascii or not lines.str.contains("\ufffd", literal=True).any()


# The end of a tqdm progress bar ("[29:55<4:48:08, 155.57 examples/s]") with more text after it:
# tqdm ends its line only when the bar closes, so the next message another writer prints (a
# watchdog's timeout, a traceback) lands on the bar's terminal line.
_GLUED_BAR = r"(\[(?:\d+:)?\d\d:\d\d<[^\]\n]{0,40}?(?:/s|/it)\])([^\s\r])"
# What a block must hold for split_lines to do more than split it: a glued bar's end (the scan
# finds it with the parsers' triggers: Python's ``b"/s]" in data`` alone takes 23 ms over 16 MB of
# paths), or a CR (looked for where the lines are found: C's plain_line_starts, else memchr).
_BAR_END = scan.Trigger("lines.bar_end", ("/s]", "/it]"), per_line=False)
scan.declare(_BAR_END)


def _unglue(df: pl.DataFrame) -> pl.DataFrame:
    """Lines that hold a progress bar and then another message, as two rows of the same line
    number: each message is then read as if it began its own line."""
    return (df.with_columns(pl.col("raw").str.replace_all(_GLUED_BAR, "${1}\n${2}").str.split("\n"))
            .explode("raw"))


def _holds(data: bytes, present: frozenset[str] | None, trigger: scan.Trigger) -> bool:
    """Whether ``data`` holds one of the (case-sensitive) trigger's literals: as the scan found, or looked up."""
    if present is not None:
        return trigger.name in present
    return any(literal.encode() in data for literal in trigger.literals)


def split_lines(data: bytes | str, first_line_no: int, present: frozenset[str] | None = None) -> pl.DataFrame:
    """The lines of ``data`` (which holds no partial line but perhaps the last) as a frame;
    ``present``: the triggers the scan found in ``data``, if it was scanned."""
    if isinstance(data, str):
        data = data.encode("utf-8", errors="replace")
    return _frame_and_starts(data, first_line_no, present)[0]


def split_block(data: bytes, first_line_no: int, found: scan.Found | None,
                at: Sequence[int] = ()) -> tuple[pl.DataFrame, dict[str, pl.Series] | None, pl.Series]:
    """``split_lines`` of a scanned block; the numbers of the lines each per-line trigger's
    matches fall on (None where the scan did not record them); and those of the lines the byte
    offsets ``at`` fall on (``first_line_no`` is the first line's)."""
    frame, starts = _frame_and_starts(data, first_line_no, found.present if found else None)
    numbers = _line_numbers(starts, data, first_line_no, list(at))
    if found is None or found.ends is None:
        return frame, None, numbers
    # a match's last byte (end - 1) lies in the line it is on (every trigger's looked up at once)
    lines = _line_numbers(starts, data, first_line_no, [end - 1 for ends in found.ends.values() for end in ends])
    hits, at = {}, 0
    for name, ends in found.ends.items():
        hits[name] = lines.slice(at, len(ends)).unique()
        at += len(ends)
    return frame, hits, numbers


def _frame_and_starts(data: bytes, first_line_no: int,
                      present: frozenset[str] | None) -> tuple[pl.DataFrame, pl.Series | None]:
    """The frame of the lines of ``data``, and where each starts in it (None where decoding
    changed a line's length): split in C where every line is read as its bytes are (ASCII, no
    glued progress bar to cut, no CR to strip), else from the lines Polars decodes."""
    if not isinstance(data, bytes) and (_split_c is None or present is None):
        # (a block read into Arrow memory, where only bytes will do: no C part, or no scan to say what it holds)
        data = memoryview(data).tobytes()
    if _split_c is not None and len(data) < 1 << 31 and not _holds(data, present, _BAR_END):
        block = data if isinstance(data, pa.Buffer) else arrow_owned(data)
        starts = _split_c.plain_line_starts(block)  # (None: a byte is not ASCII, or is a CR)
        if starts is not None:
            return _ascii_frame(block, starts, first_line_no)
    data = data if isinstance(data, bytes) else memoryview(data).tobytes()  # (Polars decodes bytes)
    ascii = data.isascii()
    raw = line_series(data, ascii)
    return _lines_frame(raw, data, ascii, first_line_no, present), _line_starts(raw, data)


def _line_starts(raw: pl.Series, data: bytes) -> pl.Series | None:
    """Where each of the lines ``raw`` (those of ``data``) starts in ``data``, from their byte
    lengths, when decoding kept every line's length (a replacement character is never shorter than
    the bytes it replaces, so equal totals mean no line changed); None where it did not."""
    lengths = raw.str.len_bytes().cast(pl.Int64)
    if int(lengths.sum()) + raw.len() - 1 != len(data):
        return None
    return (lengths + 1).cum_sum() - (lengths + 1)


def _line_numbers(starts: pl.Series | None, data: bytes, first_line_no: int, offsets: list[int]) -> pl.Series:
    """The numbers of the lines the byte offsets of ``data`` fall on, in their order: the lines'
    ``starts`` searched, or where they are unknown, the newlines before each offset counted."""
    if starts is not None:
        # an offset lies in the line that starts at or before it
        at = starts.search_sorted(pl.Series(offsets, dtype=pl.Int64), side="right").cast(pl.Int64) - 1
        return at + first_line_no
    numbers, line, pos = {}, first_line_no, 0
    for offset in sorted(set(offsets)):
        line += data.count(b"\n", pos, offset)
        pos = offset
        numbers[offset] = line
    return pl.Series([numbers[offset] for offset in offsets], dtype=pl.Int64)


def _lines_frame(lines: pl.Series, data: bytes, ascii: bool, first_line_no: int,
                 present: frozenset[str] | None) -> pl.DataFrame:
    """The frame of ``lines`` (those of ``data``). The prefixes are removed with one anchored regex
    (a replace: its match is found by a DFA, where a capture group would need the slower engine
    on every line) and are what that took off the front; the rank and tee flag are parsed once
    per distinct prefix (a log has a handful) and joined."""
    df = pl.DataFrame({"raw": lines}).with_row_index("line_no", offset=first_line_no)
    if _holds(data, present, _BAR_END):
        df = _unglue(df)
    df = df.with_columns(_without_prefixes(df["raw"], ascii).get_columns())
    text_col = pl.col("text")
    if b"\r" in data:
        text_col = text_col.str.strip_suffix("\r")
    # (a line of more characters has more bytes: the cut, a copy of every line, only where one has)
    if len(data) > MAX_LINE_CHARS and (df["text"].str.len_bytes().max() or 0) > MAX_LINE_CHARS:
        text_col = text_col.str.slice(0, MAX_LINE_CHARS)
    return _with_prefix_fields(df).select(pl.col("line_no").cast(pl.Int64), "rank", "tee", text_col.alias("text"))


def _prefix_field_exprs() -> tuple[pl.Expr, pl.Expr]:
    """The ``rank`` and ``tee`` flag a line's ``prefix`` says."""
    parts = extract_groups("prefix", _PREFIX)
    n0, n1, n2, m0, s0 = (parts.struct.field(n).cast(pl.Int32, strict=False) for n in ("n0", "n1", "n2", "m0", "s0"))
    # a --tee word ("default") in the first rank prefix marks the agent console's copy of a worker's line
    first_word = pl.coalesce(parts.struct.field("w0"), parts.struct.field("w1"))
    return pl.coalesce(n2, n1, n0, m0, s0).alias("rank"), (first_word.is_not_null() & (first_word != "rank")).alias("tee")


# What each prefix a process has met says (rank, tee): a worker's files share a handful ("[rank3]:", "").
_PREFIX_FIELDS: dict[str, tuple[int | None, bool | None]] = {}
_PREFIX_FIELDS_MAX = 4096


# _PREFIX for Python's regex: on ASCII text it matches as Rust's does (\d and \w are ASCII's there)
_PREFIX_GROUPS = re.compile(_PREFIX.replace("(?<", "(?P<"))
_INT32 = range(-(1 << 31), 1 << 31)


def _ascii_prefix_fields(prefix: str) -> tuple[int | None, bool]:
    """``_prefix_field_exprs`` of one ASCII prefix, in Python: its numbers cast as Polars casts them
    (NULL past Int32), the rank the first that is one."""
    groups = _PREFIX_GROUPS.match(prefix).groupdict()  # (every part optional: it always matches)
    numbers = (int(groups[g]) for g in ("n2", "n1", "n0", "m0", "s0") if groups[g] is not None)
    word = groups["w0"] if groups["w0"] is not None else groups["w1"]
    return next((n for n in numbers if n in _INT32), None), word is not None and word != "rank"


def _prefix_fields(prefixes: pl.Series) -> tuple[pl.Series, pl.Series]:
    """The ``rank`` and ``tee`` flag each of ``prefixes`` (a frame's distinct ones) says
    (``_prefix_field_exprs``), each prefix taken apart once a process: an ASCII one by Python's regex
    (a new rank tag a log: the Polars call on a frame of a few rows costs ~0.7 ms, most of it planning
    and compiling), another by Polars'."""
    names = prefixes.to_list()
    known = {p: _PREFIX_FIELDS.get(p) for p in names}
    new = [p for p, fields in known.items() if fields is None]
    if new:
        found = {p: _ascii_prefix_fields(p) for p in new if p.isascii()}
        other = [p for p in new if p not in found]
        if other:
            found.update(zip(other, pl.Series("prefix", other, dtype=pl.String).to_frame()
                             .select(*_prefix_field_exprs()).rows()))
        known.update(found)
        if len(_PREFIX_FIELDS) + len(found) > _PREFIX_FIELDS_MAX:
            _PREFIX_FIELDS.clear()
        _PREFIX_FIELDS.update(found)
    return (pl.Series("rank", [known[p][0] for p in names], dtype=pl.Int32),
            pl.Series("tee", [known[p][1] for p in names], dtype=pl.Boolean))


def _with_prefix_fields(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` (lines with their ``prefix``) with the ``rank`` and ``tee`` flag their prefixes say.
    Lines come in runs of one prefix (a rank's own file holds one): each run's prefix is numbered
    (``dictionary``), and what it says found once a distinct prefix (``_prefix_fields``)."""
    # (no line has a NULL prefix; one would say what "" says: no rank, no tee)
    prefix = df["prefix"].fill_null("")
    first = prefix.ne_missing(prefix.shift(1))
    codes, distinct = dictionary(prefix.filter(first))
    number = codes.gather(first.cum_sum() - 1)
    return df.with_columns(*(c.gather(number) for c in _prefix_fields(distinct)))


def _ascii_frame(block: pa.Buffer, starts_buf: bytes, first_line_no: int) -> tuple[pl.DataFrame, pl.Series]:
    """``_lines_frame`` of an ASCII ``block`` (Arrow memory: ``read_whole``'s, or a copy) that holds
    no glued progress bar and no CR, whose lines start at ``starts_buf`` (int64: C's
    ``plain_line_starts``), and where its lines start: the byte work in C (``_lines.c``), each line's
    text a string view into the block instead of a copy of it. The decisions are
    ``_without_prefixes``' (its proof holds here): a line that starts with a common rank tag loses
    that tag, unless a tag of one is followed by a whole second tag; the regex takes the prefixes off
    every other line; what a prefix says (rank, tee) is found once a distinct prefix.
    ``tests/test_ascii_split.py`` holds the two paths equal."""
    n = len(starts_buf) // 8
    starts = from_buffer(pa.int64(), n, starts_buf)
    tags = _tags_common_in(_sample_lines(block, starts_buf)) if n >= 4 * _TAG_SAMPLE else []
    # each line's text, as C writes it: after its tag (a common one), or after the prefix the regex
    # takes off (the lines with none); and each line's prefix, numbered: the index of its tag, else
    # (after them) of the distinct prefix the regex took off it (few: most often none, "")
    texts = pa.allocate_buffer(16 * n)
    number = from_buffer(pa.int32(), n, _split_c.tag_views(block, starts_buf, tuple(t.encode() for t in tags), texts,
                                                            MAX_LINE_CHARS))
    prefixes = pl.Series(tags, dtype=pl.String)
    rest = (number == len(tags)).arg_true()
    rest_number = None
    if rest.len():
        rows = values_of(rest.cast(pl.UInt32))
        # (whole lines, their prefixes cut by the regex: no cut short of one, however long the line)
        whole = _split_c.row_views(block, starts_buf, rows, MAX_LINE_CHARS + (1 << 30))
        _, rest_prefix = _regex_cut(from_buffer(pa.string_view(), rest.len(), whole, block), True)
        codes, distinct = dictionary(rest_prefix)
        prefixes = prefixes.append(distinct)
        rest_number = (codes + len(tags)).cast(pl.UInt32)
        number = number.scatter(rest, rest_number.cast(pl.Int32))
        _split_c.cut_views(block, starts_buf, rows, values_of(rest_prefix.str.len_bytes().cast(pl.Int32)), texts,
                           MAX_LINE_CHARS)
    # what each prefix says, found once a prefix (a file's lines most often have one: its rank's tag, or none)
    if number.min() == number.max():
        rank, tee = (c.new_from_index(int(number[0]), n) if n else c.clear() for c in _prefix_fields(prefixes))
    elif len(tags) == 1 and rest_number is not None:
        # one common tag: each line but the few the regex cut has its fields, theirs set where they are
        # (a gather of every line costs ~0.5 ms a 16 MB log)
        rank, tee = (c.new_from_index(0, n).scatter(rest, c.gather(rest_number)) for c in _prefix_fields(prefixes))
    else:
        rank, tee = (c.gather(number.cast(pl.UInt32)) for c in _prefix_fields(prefixes))
    text = arrow_column(pa.string_view(), n, texts, None, block)
    return pl.DataFrame([pl.int_range(first_line_no, first_line_no + n, dtype=pl.Int64, eager=True).alias("line_no"),
                         rank.alias("rank"), tee.alias("tee"), text.alias("text")]), starts


def _sample_lines(data: bytes | pa.Buffer, starts: bytes) -> list[str]:
    """The lines of ASCII ``data`` (starting at ``starts``: int64 offsets) that ``_common_tags`` looks at."""
    at, data = memoryview(starts).cast("q"), memoryview(data)
    n = len(at)
    return [data[at[r]:at[r + 1] - 1 if r + 1 < n else len(data)].tobytes().decode()
            for r in range(0, n, n // _TAG_SAMPLE)]


# A rank tag, or two ("[rank59]:", "[default0]:[rank0]:"): what torchrun puts before most lines.
_TAG = r"\[[A-Za-z_]+\d+\]:"
_TAGS = re.compile(rf"(?:{_TAG}){{1,2}}")
_TAG_SAMPLE = 64  # lines whose prefixes say which tags are common


def _regex_cut(lines: pl.Series, ascii: bool) -> tuple[pl.Series, pl.Series]:
    """Each line without its prefixes (``_PREFIXES``), and those."""
    text = lines.str.replace(_PREFIXES, "")
    # (lengths in bytes are the string's own, in characters counted: the same where all is ASCII)
    length = (lambda c: c.str.len_bytes()) if ascii else (lambda c: c.str.len_chars())
    return text, lines.str.head(length(lines) - length(text))


def _common_tags(raw: pl.Series) -> list[str]:
    """The rank tags (``_TAGS``) that start a quarter or more of a sample of the lines (every
    (n // 64)th of n, at least ``4 * _TAG_SAMPLE``), most common first."""
    if raw.len() < 4 * _TAG_SAMPLE:
        return []
    return _tags_common_in(raw.gather(pl.int_range(0, raw.len(), raw.len() // _TAG_SAMPLE, eager=True)).to_list())


def _tags_common_in(sample: list[str]) -> list[str]:
    """The rank tags that start a quarter or more of the lines of ``sample``. (Python's regex over
    64 lines: a Polars call on a frame of a few rows costs ~1 ms, most of it planning. Which tags are
    common only says which lines C or a literal test cuts, not what is cut: ``_without_prefixes``.)"""
    prefixes = Counter(_PREFIX_RE.match(line)[0] for line in sample)  # (every part optional: it always matches)
    return [tag for tag, n in prefixes.most_common() if n * 4 >= len(sample) and tag and _TAGS.fullmatch(tag)]


_PREFIX_RE = re.compile(_PREFIXES)


def _starting_with(raw: pl.Series, tag: str) -> pl.Series:
    """The lines from which the prefix regex takes off ``tag`` and nothing more (see ``_without_prefixes``)."""
    at = raw.str.starts_with(tag)
    if tag.count("]:") > 1:
        return at
    # a "[" after one tag: another tag follows only where a whole one does (a c10d header,
    # "[rank3]:[I1129 13:33:42.672765297 ...]", does not); tested on those lines alone
    followed = scan.contains_among(raw, "^" + re.escape(tag) + _TAG,
                                   raw.str.starts_with(tag + "["))
    return at & ~followed


def _without_prefixes(raw: pl.Series, ascii: bool) -> pl.DataFrame:
    """Each line with its prefixes (``_PREFIXES``) taken off (``text``), and those (``prefix``).

    The regex costs some 150 ns a line; most lines of a rank's log start with one rank tag (or
    two), which is then all the regex takes off, and a literal test shows it. Proof, from the
    regex: each of its parts is optional and tried in order, so it takes each part that matches
    where the one before ended. A line that starts with a tag ("[", then a letter or "_") starts
    none of the parts before the tags (they start with "(", a space, a digit, a word character, or
    "[" and a digit); its first tag part is that tag, the only way "[letters digits]:" matches; and
    a second tag part matches only a whole second tag right after it. So a line that starts with tag T
    takes off exactly T where T is two tags, or T is one and no tag follows it.
    """
    tags = _common_tags(raw)
    if not tags:
        text, prefix = _regex_cut(raw, ascii)
        return pl.DataFrame([text.alias("text"), prefix.alias("prefix")])
    # every line as if it started with the most common tag; then the other tags' lines, then the regex's
    text = raw.str.slice(len(tags[0]))
    prefix = pl.repeat(tags[0], raw.len(), dtype=pl.String, eager=True)
    tagged = _starting_with(raw, tags[0])
    for tag in tags[1:]:
        at = _starting_with(raw, tag)
        rows = at.arg_true()
        text, prefix = text.scatter(rows, raw.gather(rows).str.slice(len(tag))), prefix.scatter(rows, tag)
        tagged = tagged | at
    rest = (~tagged).arg_true()
    if rest.len():
        rest_text, rest_prefix = _regex_cut(raw.gather(rest), ascii)
        text, prefix = text.scatter(rest, rest_text), prefix.scatter(rest, rest_prefix)
    return pl.DataFrame([text.alias("text"), prefix.alias("prefix")])


def read_blocks(fh: io.BufferedIOBase, size: int) -> Iterator[bytes]:
    """Blocks of about ``size`` bytes; a gzip stream that ends early yields all it had, then raises EOFError."""
    if not isinstance(fh, gzip.GzipFile):
        while block := fh.read(size):  # one read, no copying: a plain file cannot end early
            yield block
        return
    pieces: list[bytes] = []
    have = 0
    try:
        # Pieces of 1 MiB, so that what was decompressed before a break is not lost with it.
        while piece := fh.read1(1 << 20):
            pieces.append(piece)
            have += len(piece)
            if have >= size:
                yield b"".join(pieces)
                pieces, have = [], 0
    except EOFError:
        if pieces:
            yield b"".join(pieces)
        raise
    if pieces:
        yield b"".join(pieces)


def newline_blocks(fh: io.BufferedIOBase, size: int) -> Iterator[tuple[bytes, bool]]:
    """(block, cut_off) pairs: blocks of about ``size`` bytes, each cut after its last newline
    (the newline dropped), the rest carried into the next; the last block may end without one.

    When a gzip stream ends early the bytes read before the break come last, flagged
    ``cut_off`` (empty when the break fell on a newline), and nothing is raised: the caller
    decides what a broken stream means.
    """
    if not isinstance(fh, gzip.GzipFile) and fh.seekable():
        # A plain file: the partial last line is read again with the next block, not copied over.
        exact = True
        while True:
            # The end of the file, when it lies within a block, is read to the byte (and one more: a
            # file being written may have grown): a read of a block's size allocates, and faults in, all of it.
            left = os.fstat(fh.fileno()).st_size - fh.tell()
            if exact and 0 < left < size and os.pread(fh.fileno(), 1, fh.tell() + left - 1) == b"\n":
                # the last block, read without its final newline (cut off after, it would be copied)
                block = fh.read(left - 1)
                after = fh.read(2)
                if after == b"\n":
                    yield block, False
                    return
                fh.seek(-len(block) - len(after), io.SEEK_CUR)  # the file is being written: read on as below
                exact = False
                continue
            want = size if left >= size else left + 1
            block = fh.read(want)
            if not block:
                return
            at_end = len(block) < want
            cut = block.rfind(b"\n")
            while cut < 0 and not at_end:  # a line longer than a block: read on
                more = fh.read(size)
                at_end = len(more) < size
                more_cut = more.rfind(b"\n")
                cut = more_cut + len(block) if more_cut >= 0 else -1
                block += more
            if at_end or cut < 0:  # the end of the file
                yield (block[:-1] if block.endswith(b"\n") else block), False
                return
            fh.seek(cut + 1 - len(block), io.SEEK_CUR)
            yield block[:cut], False
    rest = b""
    try:
        for block in read_blocks(fh, size):
            data = rest + block if rest else block
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1 :]
            yield data[:cut], False
    except EOFError:
        yield rest, True
        return
    if rest:
        yield rest, False


def read_whole(path: Path, chunk_bytes: int = CHUNK_BYTES) -> pa.Buffer | None:
    """A plain file's one block of lines (``blocks_of_lines``: all its bytes but a final newline),
    read straight into memory Arrow owns, on which the C split's columns then stand with no copy
    (``arrow_owned``); None for a file that is empty, gzip or UTF-16, more than a block, or changed
    size while read (``blocks_of_lines`` reads those)."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if not 0 < size <= chunk_bytes:
            return None
        buffer = pa.allocate_buffer(size)
        view = memoryview(buffer).cast("B")
        got = 0
        while got < size:
            n = fh.readinto(view[got:])
            if not n:
                return None
            got += n
        if fh.read(1) or bytes(view[:2]) in (b"\x1f\x8b", b"\xff\xfe", b"\xfe\xff"):  # (open_binary's magic)
            return None
    return buffer.slice(0, size - 1) if view[size - 1] == 0x0A else buffer


def blocks_of_lines(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Blocks of whole lines (the last may lack its newline). A gzip stream that ends early
    yields what was read before the break, then raises EOFError."""
    with open_binary(path) as fh:
        for data, cut_off in newline_blocks(fh, chunk_bytes):
            if data or not cut_off:
                yield data
            if cut_off:
                raise EOFError("the gzip stream ends early (file cut while being written)")


def read_line_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[LineChunk]:
    """Yield the file's lines chunk by chunk, each with up to LOOKAHEAD lines of what follows
    (from as many of the next blocks as it takes: a small block may hold fewer lines)."""
    return line_chunks(blocks_of_lines(path, chunk_bytes))


def line_chunks(blocks: Iterable[bytes]) -> Iterator[LineChunk]:
    """``read_line_chunks`` of blocks of whole lines already read (``blocks_of_lines``)."""
    pending: list[pl.DataFrame] = []  # the next chunk to yield, then the blocks after it
    next_line = 1

    scanner = scan.block_scanner()
    found: list[scan.Found | None] = []  # what each pending block's bytes hold
    hits: list[dict[str, pl.Series] | None] = []  # and the lines its per-line triggers match

    def first() -> LineChunk:
        own = pending.pop(0)
        block = found.pop(0)
        chunk_hits = _merged(hits[: len(pending) + 1])
        hits.pop(0)
        return LineChunk(pl.concat([own, *pending]).head(own.height + LOOKAHEAD) if pending else own, own.height,
                         block.present if block else None, chunk_hits)

    for data in blocks:
        block = scanner.scan(data)
        current, block_hits, _ = split_block(data, next_line, block)
        if current.height:  # (not its height: a line cut in two is two rows of one number)
            next_line = int(current["line_no"][-1]) + 1
        pending.append(current)
        found.append(block)
        hits.append(block_hits)
        while len(pending) > 1 and sum(f.height for f in pending[1:]) >= LOOKAHEAD:
            yield first()
    while pending:
        yield first()


def _merged(blocks: list[dict[str, pl.Series] | None]) -> dict[str, pl.Series] | None:
    """One chunk's hits from those of its own block and the blocks its lookahead reaches into."""
    if any(b is None for b in blocks):
        return None
    if len(blocks) == 1:
        return blocks[0]
    names = {name for b in blocks for name in b}
    return {name: pl.concat([b[name] for b in blocks if name in b]) for name in names}

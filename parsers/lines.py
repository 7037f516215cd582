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
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from . import scan

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
_PREFIX = (r"^(?: *(?<s0>\d{1,6}): )?(?:[\w.-]+ \[(?:stdout|stderr)\] )?"
           r"(?:\[\d+\] \[(?<w0>[A-Za-z_]+)(?<n0>\d+)\]:|\[(?:\d+,)?(?<m0>\d+)\]<(?:stdout|stderr)>:)?"
           r"(?:\[(?<w1>[A-Za-z_]+)(?<n1>\d+)\]:)?(?:\[(?<w2>[A-Za-z_]+)(?<n2>\d+)\]:)?")


@dataclass
class LineChunk:
    frame: pl.DataFrame
    own: int  # rows [0, own) belong to this chunk, the rest is lookahead
    # the triggers (``scan``) the chunk's own bytes hold; None: not scanned, take all as present
    present: frozenset[str] | None = None


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


_PREFIXES = (r"^((?: *\d{1,6}: )?(?:[\w.-]+ \[(?:stdout|stderr)\] )?(?:\[\d+\] \[[A-Za-z_]+\d+\]:|\[(?:\d+,)?\d+\]<(?:stdout|stderr)>:)?"
             r"(?:\[[A-Za-z_]+\d+\]:){0,2})")
# A byte no log line holds in practice: the CSV reader's separator when it splits lines.
_NO_SEPARATOR = b"\x1f"


def line_series(data: bytes) -> pl.Series:
    """The lines of ``data`` (split on newlines; invalid UTF-8 replaced), one string per line.

    Polars' CSV reader splits and decodes on every core when given a separator the data never
    holds and no quoting; ``str.split`` on the decoded text is the fallback (a block holding
    the separator, or a count that disagrees).
    """
    lines = data.count(b"\n") + 1
    if data and _NO_SEPARATOR not in data:
        raw = pl.read_csv(data, has_header=False, separator=_NO_SEPARATOR.decode(), quote_char=None,
                          new_columns=["raw"], infer_schema=False, encoding="utf8-lossy",
                          truncate_ragged_lines=True)["raw"]
        # The reader takes a final newline as the end of the last line, not as an empty line after it.
        if raw.len() == lines - 1 and data.endswith(b"\n"):
            raw = raw.extend_constant("", 1)
        if raw.len() == lines:
            return raw.fill_null("").rechunk()
    return pl.Series("raw", [data.decode("utf-8", errors="replace")]).str.split("\n").explode()


# The end of a tqdm progress bar ("[29:55<4:48:08, 155.57 examples/s]") with more text after it:
# tqdm ends its line only when the bar closes, so the next message another writer prints (a
# watchdog's timeout, a traceback) lands on the bar's terminal line.
_GLUED_BAR = r"(\[(?:\d+:)?\d\d:\d\d<[^\]\n]{0,40}?(?:/s|/it)\])([^\s\r])"
# What a block must hold for split_lines to do more than split it (the scan finds them with the
# parsers' triggers: Python's ``b"/s]" in data`` alone takes 23 ms over 16 MB of paths).
_BAR_END = scan.Trigger("lines.bar_end", ("/s]", "/it]"))
_CR = scan.Trigger("lines.cr", ("\r",))
scan.declare(_BAR_END, _CR)


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
    ``present``: the triggers the scan found in ``data``, if it was scanned.

    The prefixes are found with one anchored regex and sliced off; the rank and tee flag are
    parsed once per distinct prefix (a log has a handful) and joined.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", errors="replace")
    raw = pl.col("raw")
    df = pl.DataFrame({"raw": line_series(data)}).with_row_index("line_no", offset=first_line_no)
    if _holds(data, present, _BAR_END):
        df = _unglue(df)
    df = df.with_columns(raw.str.extract(_PREFIXES, 1).fill_null("").alias("prefix"))
    df = df.with_columns(raw.str.slice(pl.col("prefix").str.len_bytes()).alias("text"))  # an ASCII prefix: bytes are chars
    parts = extract_groups("prefix", _PREFIX)
    n0, n1, n2, m0, s0 = (parts.struct.field(n).cast(pl.Int32, strict=False) for n in ("n0", "n1", "n2", "m0", "s0"))
    # a --tee word ("default") in the first rank prefix marks the agent console's copy of a worker's line
    first_word = pl.coalesce(parts.struct.field("w0"), parts.struct.field("w1"))
    df = per_distinct(df, "prefix", pl.coalesce(n2, n1, n0, m0, s0).alias("rank"),
                      (first_word.is_not_null() & (first_word != "rank")).alias("tee"))
    text_col = pl.col("text")
    if _holds(data, present, _CR):
        text_col = text_col.str.strip_suffix("\r")
    if len(data) > MAX_LINE_CHARS:
        text_col = text_col.str.slice(0, MAX_LINE_CHARS)
    return df.select(
        pl.col("line_no").cast(pl.Int64),
        "rank",
        "tee",
        text_col.alias("text"),
    )


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
        while block := fh.read(size):
            cut = block.rfind(b"\n")
            while cut < 0 and len(block) % size == 0:  # a line longer than a block: read on
                more = fh.read(size)
                if not more:
                    break
                cut = more.rfind(b"\n")
                cut = cut + len(block) if cut >= 0 else cut
                block += more
            if len(block) % size or cut < 0:  # the end of the file
                yield (block[:-1] if block.endswith(b"\n") else block), False
                return
            fh.seek(cut + 1 - len(block), io.SEEK_CUR)
            yield block[:cut], False
        return
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


def _blocks_of_lines(path: Path, chunk_bytes: int) -> Iterator[bytes]:
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
    pending: list[pl.DataFrame] = []  # the next chunk to yield, then the blocks after it
    next_line = 1

    scanner = scan.block_scanner()
    found: list[frozenset[str] | None] = []  # what each pending block's bytes hold

    def first() -> LineChunk:
        own = pending.pop(0)
        return LineChunk(pl.concat([own, *pending]).head(own.height + LOOKAHEAD) if pending else own, own.height,
                         found.pop(0))

    for data in _blocks_of_lines(path, chunk_bytes):
        present = scanner.present(data)
        current = split_lines(data, next_line, present)
        next_line += current.height
        pending.append(current)
        found.append(present)
        while len(pending) > 1 and sum(f.height for f in pending[1:]) >= LOOKAHEAD:
            yield first()
    while pending:
        yield first()

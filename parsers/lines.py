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

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

CHUNK_BYTES = 32 << 20
LOOKAHEAD = 400
# A line longer than this is cut before any regex sees it: real log lines are far shorter,
# and a 50 MB "line" of binary junk must not cost regex time.
MAX_LINE_CHARS = 64 << 10

_PREFIX = r"^(?:\[(?<w1>[A-Za-z_]+)(?<n1>\d+)\]:)?(?:\[(?<w2>[A-Za-z_]+)(?<n2>\d+)\]:)?"


@dataclass
class LineChunk:
    frame: pl.DataFrame
    own: int  # rows [0, own) belong to this chunk, the rest is lookahead

    @property
    def own_frame(self) -> pl.DataFrame:
        return self.frame.head(self.own)


def open_binary(path: Path) -> io.BufferedIOBase:
    """The file's bytes, gunzipped when it is gzip (by magic number, not by name)."""
    fh = open(path, "rb")
    if fh.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh)  # type: ignore[return-value]
    return fh


def split_lines(text: str, first_line_no: int) -> pl.DataFrame:
    raw = pl.Series("raw", [text]).str.split("\n").explode()
    df = pl.DataFrame({"raw": raw}).with_columns(
        pl.int_range(first_line_no, first_line_no + pl.len(), dtype=pl.Int64).alias("line_no")
    )
    parts = pl.col("raw").str.extract_groups(_PREFIX)
    n1 = parts.struct.field("n1").cast(pl.Int32, strict=False)
    n2 = parts.struct.field("n2").cast(pl.Int32, strict=False)
    w1 = parts.struct.field("w1")
    return df.select(
        "line_no",
        pl.coalesce(n2, n1).alias("rank"),
        (w1.is_not_null() & (w1 != "rank")).alias("tee"),
        pl.col("raw")
        .str.replace(r"^(?:\[[A-Za-z_]+\d+\]:){1,2}", "")
        .str.strip_suffix("\r")
        .str.slice(0, MAX_LINE_CHARS)
        .alias("text"),
    )


def read_blocks(fh: io.BufferedIOBase, size: int) -> Iterator[bytes]:
    """Blocks of about ``size`` bytes; a gzip stream that ends early yields all it had, then raises EOFError."""
    block = bytearray()
    try:
        while piece := fh.read1(1 << 20):
            block += piece
            if len(block) >= size:
                yield bytes(block)
                block.clear()
    except EOFError:
        if block:
            yield bytes(block)
        raise
    if block:
        yield bytes(block)


def _decoded_chunks(path: Path, chunk_bytes: int) -> Iterator[str]:
    """Decoded text pieces that each end on a newline (the last may not)."""
    with open_binary(path) as fh:
        rest = b""
        try:
            for block in read_blocks(fh, chunk_bytes):
                data = rest + block
                cut = data.rfind(b"\n")
                if cut < 0:
                    rest = data
                    continue
                rest = data[cut + 1 :]
                yield data[:cut].decode("utf-8", errors="replace")
        finally:
            # Even when the stream broke off, what was read before the break is parsed.
            if rest:
                yield rest.decode("utf-8", errors="replace")


def read_line_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[LineChunk]:
    """Yield the file's lines chunk by chunk, each with a lookahead into the next."""
    pending: pl.DataFrame | None = None
    next_line = 1
    for text in _decoded_chunks(path, chunk_bytes):
        current = split_lines(text, next_line)
        next_line += current.height
        if pending is not None:
            yield LineChunk(pl.concat([pending, current.head(LOOKAHEAD)]), pending.height)
        pending = current
    if pending is not None:
        yield LineChunk(pending, pending.height)

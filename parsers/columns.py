"""Helpers for columns of log lines that several parsers share, knowing nothing of any format:
a column's distinct values numbered once (``dictionary``), and a regex tested once a distinct
value (``contains_per_value``): a rank's log repeats its lines (28,000 INFO lines of a pair of
16 MB rank logs hold 76 messages), and a repeated line is then worked on once; and columns on
the memory C (parsers/_lines.c) writes or reads (``arrow_column``, ``from_buffer``, ``values_of``).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

try:  # the numbering of strings in C (parsers/_lines.c), built where a compiler was at install
    from . import _lines as _numbering_c
except ImportError:  # pragma: no cover (CI builds it; tests/test_columns.py fails without it)
    _numbering_c = None


def dictionary(values: pl.Series, where: pl.Series | None = None) -> tuple[pl.Series, pl.Series]:
    """Each of ``values`` numbered (uint32: 0, 1, ... as distinct values first appear; NULL stays NULL),
    and the distinct values in the order of their numbers: the codes of a dictionary of their own,
    made in one pass over them (a value repeated on thousands of lines is then worked on once).
    ``where`` (Boolean, NULL as False): only those rows are numbered, the others are NULL (as
    ``dictionary(values.filter(where))`` scattered back, without the filtered copy).
    Strings are numbered in C, by a hash table of the distinct ones (175,000 dynamo lines of 71
    messages: 5.6 -> 2.7 ms); Polars' categorical cast, the reference, numbers the rest."""
    if _numbering_c is not None and values.dtype == pl.String:
        return _strings_numbered_in_c(values, where)
    if where is None:
        return _numbered_by_polars(values)
    where = where.fill_null(False)
    codes, distinct = _numbered_by_polars(values.filter(where))
    return pl.repeat(None, values.len(), dtype=pl.UInt32, eager=True).scatter(where.arg_true(), codes), distinct


def arrow_column(kind: pa.DataType, n: int, values: pa.Buffer, valid: pa.Buffer | None = None,
                 *data: pa.Buffer) -> pl.Series:
    """A column of ``n`` values of ``kind`` standing on Arrow memory C wrote (``values``, ``valid`` its
    validity bitmap; string views: into ``data``), not a copy of it."""
    return series_of(pa.Array.from_buffers(kind, n, [valid, values, *data]))


class _ExportedArray:
    """A pyarrow array as only the Arrow PyCapsule interface shows it: Polars then takes it through
    that interface, not its pyarrow path, which imports ``pyarrow.compute`` in each process (~50 ms
    of building a Python function for every Arrow kernel) for a cast it makes only of a dictionary in
    several chunks, which these never are."""

    __slots__ = ("_of",)

    def __init__(self, of: pa.Array):
        self._of = of

    def __arrow_c_array__(self, requested_schema=None):
        return self._of.__arrow_c_array__(requested_schema)


class _ExportedStream:
    """A pyarrow table as a stream of batches, as ``_ExportedArray`` an array."""

    __slots__ = ("_of",)

    def __init__(self, of: pa.Table):
        self._of = of

    def __arrow_c_stream__(self, requested_schema=None):
        return self._of.__arrow_c_stream__(requested_schema)


def series_of(array: pa.Array) -> pl.Series:
    """``pl.from_arrow(array)``, zero-copy as it is, without importing ``pyarrow.compute`` (``_ExportedArray``)."""
    return pl.Series(_ExportedArray(array))


def frame_of(table: pa.Table) -> pl.DataFrame:
    """``pl.from_arrow(table)``, as ``series_of``."""
    return pl.DataFrame(_ExportedStream(table))


def from_buffer(kind: pa.DataType, n: int, values: bytes, data: pa.Buffer | None = None) -> pl.Series:
    """A column of ``n`` values of ``kind`` laid out in ``values`` (bytes C returned; string views:
    into ``data``), on a copy of them in Arrow memory (``arrow_owned``)."""
    return arrow_column(kind, n, arrow_owned(values), None, *([data] if data is not None else []))


def arrow_owned(data: bytes) -> pa.Buffer:
    """A copy of ``data`` in memory pyarrow allocated (0.8 ms for 16 MB), for a column to stand on.
    Not the bytes object itself: Polars may drop a column on a thread of its own pool while this
    thread, holding the GIL, waits for that pool; a buffer of Python's would need the GIL to be
    released, and both would wait for ever (seen: a worker stuck pickling its frames)."""
    buffer = pa.allocate_buffer(len(data))
    memoryview(buffer).cast("B")[:] = data
    return buffer


def values_of(column: pl.Series) -> pa.Buffer:
    """The values of a numeric column without NULLs, as the bytes C reads."""
    array = column.to_arrow()
    width = array.type.byte_width
    return array.buffers()[1][array.offset * width:(array.offset + len(array)) * width]


def _strings_numbered_in_c(values: pl.Series, where: pl.Series | None = None) -> tuple[pl.Series, pl.Series]:
    array = values.to_arrow(compat_level=pl.CompatLevel.newest())  # (string views, as Polars holds them)
    n, offset = len(array), array.offset
    buffers = array.buffers()
    valid, skipped = buffers[0], values.is_null() if values.null_count() else None
    if where is not None:  # (the rows numbered: those of a value, where wanted; C skips the others as NULLs)
        taken = where.fill_null(False) if skipped is None else where.fill_null(False) & ~skipped
        bits = taken.to_arrow()
        valid, offset, skipped = bits.buffers()[1], bits.offset, ~taken
    codes = pa.allocate_buffer(4 * n)  # (Arrow memory the column then stands on: see arrow_owned)
    firsts = _numbering_c.view_dictionary(buffers[1][array.offset * 16:(array.offset + n) * 16], tuple(buffers[2:]),
                                          valid, offset, codes)
    numbers = arrow_column(pa.uint32(), n, codes).alias(values.name)
    if skipped is not None and skipped.any():
        numbers = numbers.scatter(skipped.arg_true(), None)
    return numbers, values.gather(from_buffer(pa.uint32(), len(firsts) // 4, firsts))


def _numbered_by_polars(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    coded = values.cast(pl.String).cast(pl.Categorical(pl.Categories.random()))
    distinct = coded.unique().drop_nulls()
    return coded.to_physical(), distinct.cast(pl.String).gather(distinct.to_physical().arg_sort())


def contains_per_value(text: pl.Series, pattern: str) -> pl.Series:
    """``text.str.contains(pattern)``, the regex run once a distinct value (NULL stays NULL): 28,000
    lines of 76 messages, 4.2 -> 1.2 ms; on lines all distinct it costs the numbering more
    (~30 ns a line, against the regex's ~150)."""
    codes, distinct = dictionary(text)
    return distinct.str.contains(pattern).gather(codes)

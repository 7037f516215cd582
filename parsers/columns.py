"""Helpers for columns of log lines that several parsers share, knowing nothing of any format:
a column's distinct values numbered once (``dictionary``), and a regex tested once a distinct
value (``contains_per_value``): a rank's log repeats its lines (28,000 INFO lines of a pair of
16 MB rank logs hold 76 messages), and a repeated line is then worked on once.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

try:  # the numbering of strings in C (parsers/_lines.c), built where a compiler was at install
    from . import _lines as _numbering_c
except ImportError:  # pragma: no cover (CI builds it; tests/test_columns.py fails without it)
    _numbering_c = None


def dictionary(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Each of ``values`` numbered (uint32: 0, 1, ... as distinct values first appear; NULL stays NULL),
    and the distinct values in the order of their numbers: the codes of a dictionary of their own,
    made in one pass over them (a value repeated on thousands of lines is then worked on once).
    Strings are numbered in C, by a hash table of the distinct ones (175,000 dynamo lines of 71
    messages: 5.6 -> 2.7 ms); Polars' categorical cast, the reference, numbers the rest."""
    if _numbering_c is not None and values.dtype == pl.String:
        return _strings_numbered_in_c(values)
    return _numbered_by_polars(values)


def _strings_numbered_in_c(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    array = values.to_arrow(compat_level=pl.CompatLevel.newest())  # (string views, as Polars holds them)
    n, offset = len(array), array.offset
    buffers = array.buffers()
    codes = pa.allocate_buffer(4 * n)  # (Arrow memory the column then stands on: see lines.arrow_owned)
    firsts = _numbering_c.view_dictionary(buffers[1][offset * 16:(offset + n) * 16], tuple(buffers[2:]), buffers[0],
                                          offset, codes)
    numbers = pl.from_arrow(pa.Array.from_buffers(pa.uint32(), n, [None, codes])).alias(values.name)
    if values.null_count():
        numbers = numbers.scatter(values.is_null().arg_true(), None)
    return numbers, values.gather(pl.Series(memoryview(firsts).cast("I").tolist(), dtype=pl.UInt32))


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

"""Helpers for columns of log lines that several parsers share, knowing nothing of any format:
a column's distinct values numbered once (``dictionary``), and a regex tested once a distinct
value (``contains_per_value``): a rank's log repeats its lines (28,000 INFO lines of a pair of
16 MB rank logs hold 76 messages), and a repeated line is then worked on once.
"""

from __future__ import annotations

import polars as pl


def dictionary(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Each of ``values`` numbered (uint32: 0, 1, ... as distinct values first appear; NULL stays NULL),
    and the distinct values in the order of their numbers: the codes of a dictionary of their own,
    made in one pass over them (a value repeated on thousands of lines is then worked on once)."""
    coded = values.cast(pl.String).cast(pl.Categorical(pl.Categories.random()))
    distinct = coded.unique().drop_nulls()
    return coded.to_physical(), distinct.cast(pl.String).gather(distinct.to_physical().arg_sort())


def contains_per_value(text: pl.Series, pattern: str) -> pl.Series:
    """``text.str.contains(pattern)``, the regex run once a distinct value (NULL stays NULL): 28,000
    lines of 76 messages, 4.2 -> 1.2 ms; on lines all distinct it costs the numbering more
    (~30 ns a line, against the regex's ~150)."""
    codes, distinct = dictionary(text)
    return distinct.str.contains(pattern).gather(codes)

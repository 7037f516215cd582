"""The column helpers the parsers share (parsers/columns.py): a column's distinct values numbered
as they first appear (strings in C, as Polars' categorical cast, the reference, numbers them), and
a regex tested once a distinct value saying what it says of every line."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_series_equal

from postmortem.parsers import columns


def test_values_are_numbered_as_they_first_appear_and_null_stays_null():
    codes, distinct = columns.dictionary(pl.Series(["b", None, "a", "b", "a", None, "c"]))
    assert codes.to_list() == [0, None, 1, 0, 1, None, 2]
    assert distinct.to_list() == ["b", "a", "c"]


def test_a_regex_tested_once_a_distinct_value_says_what_it_says_of_every_line():
    text = pl.Series(["step 1 loss nan", None, "NCCL INFO ok", "step 1 loss nan", "Error: x"] * 50)
    assert_series_equal(columns.contains_per_value(text, r"(?i)\bnan\b|error"),
                        text.str.contains(r"(?i)\bnan\b|error"), check_names=False)


_TEXT = st.one_of(st.none(), st.sampled_from(["", "a", "[rank3]:", "x" * 12, "x" * 13, "Graph break in user code at"]),
                  st.text(max_size=60), st.integers(0, 3000).map(lambda i: f"message {i} " + "y" * (i % 60)))


def _numbered_both_ways(values: pl.Series) -> None:
    assert columns._numbering_c is not None, "parsers/_lines.c was not built at install (is a C compiler there?)"
    codes, distinct = columns.dictionary(values)
    want_codes, want_distinct = columns._numbered_by_polars(values)
    assert_series_equal(codes, want_codes)
    assert_series_equal(distinct, want_distinct)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_TEXT, max_size=300), cut=st.integers(0, 50), chunks=st.integers(1, 3))
def test_strings_are_numbered_in_c_as_polars_numbers_them(values, cut, chunks):
    """Short strings (in their view) and long ones (in a buffer), a column's slice (its validity
    bits start mid-byte), a column in chunks."""
    series = pl.Series("text", values, dtype=pl.String)
    _numbered_both_ways(series)
    _numbered_both_ways(series.slice(min(cut, len(values))))
    parts = [series.slice(i * len(values) // chunks, len(values) // chunks + 1) for i in range(chunks)]
    _numbered_both_ways(pl.concat(parts, rechunk=False))


def test_more_distinct_strings_than_the_first_table_holds_are_numbered_as_polars_numbers_them():
    _numbered_both_ways(pl.Series("text", [f"line {i % 5000} of a log, " + "z" * (i % 90) for i in range(20_000)]))


@settings(max_examples=200, deadline=None)
@given(record=st.lists(st.one_of(st.none(), st.sampled_from(["aaaa", "aaab", "abaa", "x" * 20, "x" * 19 + "y", "z"])),
                       min_size=1, max_size=8),
       edits=st.lists(st.tuples(st.integers(0, 200), st.one_of(st.none(), st.sampled_from(["aaab", "x" * 20, "new"]))),
                      max_size=10),
       times=st.integers(1, 25))
def test_a_record_logged_again_and_again_is_numbered_as_polars_numbers_it(record, edits, times):
    """C first compares a string with the one that followed the string before it last time: the
    lines of a record repeated, some of them changed (another string of the same length, a NULL)."""
    values = record * times
    for at, value in edits:
        if values:
            values[at % len(values)] = value
    _numbered_both_ways(pl.Series("text", values, dtype=pl.String))

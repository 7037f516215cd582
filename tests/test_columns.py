"""The column helpers the parsers share (parsers/columns.py): a column's distinct values numbered
as they first appear, and a regex tested once a distinct value saying what it says of every line."""

from __future__ import annotations

import polars as pl
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

"""lines.key_ids: one number per distinct key of a frame's rows, found once per run of equal keys."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from postmortem.parsers.lines import key_ids

_ROWS = st.lists(st.tuples(st.sampled_from(["a.log", "b.log"]), st.one_of(st.none(), st.integers(0, 2)),
                           st.one_of(st.none(), st.sampled_from(["0/0", "1/0"]))), max_size=40)


@settings(max_examples=200, deadline=None)
@given(rows=_ROWS)
def test_rows_get_the_same_number_exactly_when_their_keys_are_equal_nulls_included(rows):
    df = pl.DataFrame(rows, schema={"file": pl.String, "rank": pl.Int32, "cid": pl.String}, orient="row")
    ids = key_ids(df, ["file", "rank", "cid"]).to_list()
    assert len(ids) == len(rows)
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (ids[i] == ids[j]) == (rows[i] == rows[j])

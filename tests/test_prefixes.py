"""A line's launcher prefixes come off as the prefix regex takes them off, whether a line goes
through the regex or the literal test of a common rank tag (lines._without_prefixes)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postmortem.parsers import lines

ROOT = Path(__file__).resolve().parents[1]


def _by_regex(raw: pl.Series) -> tuple[list[str], list[str]]:
    text = raw.str.replace(lines._PREFIXES, "")
    return text.to_list(), raw.str.head(raw.str.len_chars() - text.str.len_chars()).to_list()


def _cut(raw: pl.Series) -> tuple[list[str], list[str]]:
    out = lines._without_prefixes(raw, ascii=all(s.isascii() for s in raw.to_list()))
    return out["text"].to_list(), out["prefix"].to_list()


# What launchers put before a line (lines.py names each), and what may follow them: the start of
# a glog or c10 header, TORCH_LOGS, a traceback, another prefix's first characters.
_PREFIX_PARTS = ["[rank3]:", "[rank12]:", "[default0]:", "[default0]:[rank0]:", "[rank3]:[rank3]:",
                 "[1,3]<stderr>:", "[3]<stdout>:", "node04 [stderr] ", "(RayWorkerWrapper pid=4009) ",
                 "  1: ", "[80746] [rank0]:", "[Rank 3]:", "[rank]:", "[_x9]:", ""]
_BODIES = ["[E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught",
           "V1129 13:40:20.565000 5350 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] Recompiling",
           "[rank3]: Traceback (most recent call last):", "[rank3]:[W1129 x]", "[12] tail", "[r",
           "Traceback (most recent call last):", "", "   File \"train.py\", line 3, in <module>",
           "[default0]:[rank0]:[rank0]: nested", "[rank٣]:unicode digit", "ünïcode body"]


@settings(max_examples=150, deadline=None)
@given(common=st.sampled_from(_PREFIX_PARTS),
       lines_=st.lists(st.tuples(st.booleans(), st.sampled_from(_PREFIX_PARTS), st.sampled_from(_BODIES)),
                       min_size=1, max_size=40),
       repeat=st.integers(min_value=8, max_value=20))
def test_a_common_tag_comes_off_as_the_regex_takes_it_off(common, lines_, repeat):
    # mostly lines of the common tag (so that its literal test is used), some of others
    rows = [(common if use_common else other) + body for use_common, other, body in lines_] * repeat
    raw = pl.Series("raw", rows)
    assert _cut(raw) == _by_regex(raw)


def test_a_second_tag_after_a_common_one_comes_off_too():
    """The case the literal test must leave to the regex: one tag, then another ("[rank1]:[rank1]:")."""
    raw = pl.Series("raw", ["[rank1]:V1129 x"] * 300 + ["[rank1]:[rank1]:[E1129 y]", "[rank1]:[default1]:z"])
    text, prefix = _cut(raw)
    assert text[-2:] == ["[E1129 y]", "z"]
    assert prefix[-2:] == ["[rank1]:[rank1]:", "[rank1]:[default1]:"]
    assert (text, prefix) == _by_regex(raw)


@pytest.mark.parametrize("common", ["[1,3]<stderr>:", "node04 [stderr] ", "  1: ", "(RayWorkerWrapper pid=4009) ",
                                    "[80746] [rank0]:"])
def test_a_common_prefix_other_than_tags_is_left_to_the_regex(common):
    """Other parts of the prefix can be followed by more of it: only rank tags are known by their start."""
    raw = pl.Series("raw", [common + "V1129 x"] * 300 + [common + "[rank3]:[E1129 y]", common + "[rank3]:[rank3]:z"])
    text, _ = _cut(raw)
    assert text[-2:] == ["[E1129 y]", "z"]
    assert _cut(raw) == _by_regex(raw)


def test_our_runs_logs_lose_the_prefixes_the_regex_takes_off():
    checked = 0
    for path in sorted((ROOT / "sample_logs").rglob("*.log")):
        raw = lines.line_series(path.read_bytes())
        assert _cut(raw) == _by_regex(raw), path
        checked += bool(lines._common_tags(raw))
    assert checked >= 50  # logs long enough, and tagged enough, for the literal test to be used


@pytest.mark.parametrize("tag", ["[rank7]:", "[default7]:[rank7]:"])
def test_public_threads_lines_after_a_rank_tag_lose_what_the_regex_takes_off(tag):
    """The excerpts are short and most carry no tag of their own: each one's lines, as they are and
    after the tag torchrun puts before a rank's lines (so that the tag is common)."""
    for path in sorted((ROOT / "tests" / "realworld").rglob("*.log")):
        own = lines.line_series(path.read_bytes())
        raw = pl.concat([own, (tag + own).alias("raw").head(300)] * (1 + 300 // max(own.len(), 1)))
        assert lines._common_tags(raw) and _cut(raw) == _by_regex(raw), path


def _fields_by_polars(prefixes: list[str]) -> list[tuple]:
    return pl.Series("prefix", prefixes, dtype=pl.String).to_frame().select(*lines._prefix_field_exprs()).rows()


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(st.sampled_from(_PREFIX_PARTS + ["[rank99999999999]:", "[default2147483648]:[rank7]:",
                                                                 "[1,2147483647]<stdout>:", "  99999999: "]),
                                st.text(alphabet="[]:0123456789 rankdefault_<>,()=pidstdouterr", max_size=12)),
                      min_size=1, max_size=4))
def test_an_ascii_prefix_says_in_python_the_rank_and_tee_polars_finds_in_it(parts):
    """A new ASCII prefix (a log's rank tag) is taken apart by Python's regex, not a Polars call:
    the same rank (a number past Int32 is none, the next one counts) and tee flag."""
    prefix = "".join(parts)
    assert [lines._ascii_prefix_fields(prefix)] == _fields_by_polars([prefix])

"""Each line's log header taken apart in C (parsers/_lines.c, through textlog._native_runs) gives the
runs of lines and the columns (level, ts, msg, where the source lies) that the Polars path gives
(textlog.HeaderRuns.of and _header_fields, the reference): on every log of our runs and of the
public threads, and on headers of every shape the header regex admits, and some it does not."""

from __future__ import annotations

import contextlib
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal, assert_series_equal

from postmortem.parsers import lines, textlog

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _polars_only():
    native, textlog._headers_c = textlog._headers_c, None
    try:
        yield
    finally:
        textlog._headers_c = native


def _headers_both_ways(df: pl.DataFrame, year: int = 2026) -> None:
    assert textlog._headers_c is not None, "parsers/_lines.c was not built at install (is a C compiler there?)"
    got_runs = textlog.HeaderRuns.of(df["text"], year)
    assert got_runs.fields is not None
    got = textlog.with_headers(df, year, got_runs)
    with _polars_only():
        want_runs = textlog.HeaderRuns.of(df["text"], year)
        want = textlog.with_headers(df, year, want_runs)
    assert_series_equal(got_runs.head, want_runs.head, check_names=False)
    assert_series_equal(got_runs.first, want_runs.first, check_names=False)
    assert (got_runs.run is None) == (want_runs.run is None)
    if want_runs.run is not None:
        assert_series_equal(got_runs.run, want_runs.run, check_names=False)
    assert_frame_equal(got, want)


def _lines_of(text: str) -> pl.DataFrame:
    return lines.split_lines(text, 1).with_row_index("pos").with_columns(pl.lit("f.log").alias("file"))


def test_our_runs_logs_headers_come_apart_in_c_as_in_polars():
    logs = sorted((ROOT / "sample_logs").rglob("*.log"))
    assert len(logs) >= 150
    for path in logs:
        _headers_both_ways(_lines_of(path.read_bytes().decode("utf-8", errors="replace")))


def test_public_threads_headers_come_apart_in_c_as_in_polars():
    logs = sorted((ROOT / "tests" / "realworld").rglob("*.log"))
    assert len(logs) >= 100
    for path in logs:
        _headers_both_ways(_lines_of(path.read_bytes().decode("utf-8", errors="replace")))


def test_a_frame_of_several_files_and_chunks_comes_apart_the_same():
    """build() concatenates files split apart (their text in several buffers): a view's buffer is its own."""
    paths = sorted((ROOT / "sample_logs").rglob("stderr.log"))[:6]
    df = pl.concat([_lines_of(p.read_text(errors="replace")) for p in paths], rechunk=True)
    _headers_both_ways(df)
    _headers_both_ways(df.slice(7, df.height - 20))


# Headers as PyTorch prints them (glog, c10 with and without a time, an unpadded month, Python
# logging), and shapes near them the regex must refuse or strptime cannot read.
_LEVELS = list("IWEFCVDX[")
_DATES = ["1129", "419", "0229", "1301", "1131", "0000", "11290", "12", ""]
_TIMES = ["13:33:42", "23:59:59", "24:00:00", "13:60:00", "13:33:60", "1:33:42", "13:33"]
_FRACS = [".672765297", ".548000", ".5", ".1234567891", ".", "", ".12345678"]
_PIDS = ["", " 5350", "  12", " x1"]
_SOURCES = [" ProcessGroupNCCL.cpp:689]", " torch/_dynamo/guards.py:4760]", " a:b:1]", " :1]", " x.py:]",
            "  spaced.cpp:12]", " 123:45]", " no_close:1", " ünï.py:1]", "]"]
_AFTER = [" [Rank 0] Watchdog caught", "", "x", "  two spaces", "] more", " é", "é"]


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.tuples(st.booleans(), st.sampled_from(_LEVELS), st.sampled_from(_DATES),
                                st.sampled_from(_TIMES), st.sampled_from(_FRACS), st.sampled_from(_PIDS),
                                st.sampled_from(_SOURCES), st.sampled_from(_AFTER), st.integers(1, 3)),
                      min_size=1, max_size=30),
       year=st.sampled_from([2026, 2024, 2100, 2000]))
def test_headers_of_every_shape_come_apart_in_c_as_in_polars(parts, year):
    rows = []
    for bracket, level, date, time, frac, pid, source, after, repeat in parts:
        stamp = f"{date} {time}{frac}" if date else ""
        rows += [("[" if bracket else "") + level + stamp + pid + source + after] * repeat
    rows.append("2026-11-29 13:33:12,646 [rank0] INFO step 0")  # (a Python-logging line among them)
    _headers_both_ways(_lines_of("\n".join(rows)), year)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["V1129 13:40:20.565000 1 a.py:1]", "[E a.cpp:1]", "x]", "]", "", "é]"]),
                          st.text(alphabet="] xé界", max_size=4)), min_size=1, max_size=12))
def test_lines_that_start_with_the_head_of_the_line_before_come_apart_in_c_as_in_polars(lines_):
    # (runs of lines that share a head, and lines that almost do: one cut right after its "]", a
    # character of several bytes after it, a "]" after it, a line shorter than the head before it)
    _headers_both_ways(_lines_of("\n".join(head + tail for head, tail in lines_)))


@pytest.mark.parametrize("line", ["", "]", "x]", "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog",
                                  "E0419 11:01:25.597000 245 torch/distributed/elastic/x.py:1] y",
                                  "[E419 10:42:28.858931807 ProcessGroupNCCL.cpp:616] z",
                                  "V1129 13:40:20.565000 5350 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] r",
                                  "2026-11-29 13:33:12,646 plain", "no header at all", "ünïcode ] after"])
def test_single_lines_come_apart_in_c_as_in_polars(line):
    _headers_both_ways(_lines_of(line))
    _headers_both_ways(_lines_of("\n".join([line] * 3 + ["V1129 13:40:20.565000 1 a.py:1] w"])))

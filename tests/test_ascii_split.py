"""An ASCII block split in C (parsers/_lines.c, through lines._ascii_frame) gives the frame, and the
line starts, that the Polars path (lines._lines_frame, the reference) gives: on every log of our
runs and of the public threads, as they are and after a rank tag, and on lines made of the parts
launchers put before a line."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal, assert_series_equal

from postmortem.parsers import columns, lines, scan

ROOT = Path(__file__).resolve().parents[1]


def _split_in_c_alone(data: bytes, first_line_no: int = 1) -> tuple[pl.DataFrame, pl.Series]:
    """``lines._ascii_frame`` of ASCII ``data``, as ``lines.split_block`` calls it."""
    assert lines._split_c is not None, "parsers/_lines.c was not built at install (is a C compiler there?)"
    block = columns.arrow_owned(data)
    return lines._ascii_frame(block, lines._split_c.plain_line_starts(block), first_line_no)


def _split_both_ways(data: bytes, first_line_no: int = 1) -> None:
    raw = lines.line_series(data, True)
    want = lines._lines_frame(raw, data, True, first_line_no, None)
    got, starts = _split_in_c_alone(data, first_line_no)
    assert_frame_equal(got, want)
    assert_series_equal(starts, lines._line_starts(raw, data), check_names=False)


def _split_in_c(data: bytes, present: frozenset[str] | None) -> bool:
    """Whether split_block takes this block to C: ASCII, no glued progress bar, no CR."""
    return data.isascii() and b"\r" not in data and not lines._holds(data, present, lines._BAR_END)


def _logs(folder: str) -> list[Path]:
    return [p for p in sorted((ROOT / folder).rglob("*.log")) if _split_in_c(p.read_bytes(), None)]


def test_our_runs_logs_split_in_c_as_polars_splits_them():
    logs = _logs("sample_logs")
    assert len(logs) >= 150
    for path in logs:
        _split_both_ways(path.read_bytes(), 7)


@pytest.mark.parametrize("tag", ["", "[rank7]:", "[default7]:[rank7]:"])
def test_public_threads_lines_split_in_c_as_polars_splits_them(tag):
    """The excerpts are short and most carry no tag: each one's lines, as they are and repeated
    after the tag torchrun puts before a rank's lines (so that the tag is common)."""
    logs = _logs("tests/realworld")
    assert len(logs) >= 100
    for path in logs:
        own = path.read_bytes()
        _split_both_ways(b"\n".join([own] + [tag.encode() + line for line in own.split(b"\n")] * 300 if tag else [own]))


def test_split_block_gives_the_same_frame_hits_and_line_numbers_both_ways():
    path = next(p for p in _logs("sample_logs") if p.stat().st_size > 20_000)
    data = path.read_bytes()
    found = scan.block_scanner().scan(data)
    got = lines.split_block(data, 3, found, [0, len(data) // 2, len(data) - 1])
    c_module, lines._split_c = lines._split_c, None
    try:
        want = lines.split_block(data, 3, found, [0, len(data) // 2, len(data) - 1])
    finally:
        lines._split_c = c_module
    assert_frame_equal(got[0], want[0])
    assert got[1].keys() == want[1].keys() and all(got[1][k].equals(want[1][k]) for k in got[1])
    assert_series_equal(got[2], want[2], check_names=False)


@pytest.mark.parametrize("data", [b"", b"\n", b"\n\n", b"x", b"x\n", b"[rank1]:", b"[rank1]:\n[rank1]:[rank2]:",
                                  b"[rank1]:[E1 x.cpp:1] y\n" * 300 + b"[rank1]:[rank1]:z"])
def test_edge_blocks_split_in_c_as_polars_splits_them(data):
    _split_both_ways(data)


def test_a_line_longer_than_the_cut_is_cut_the_same():
    data = b"[rank0]:ok\n" * 300 + b"[rank0]:" + b"x" * (lines.MAX_LINE_CHARS + 100) + b"\n[rank0]:" + b"y" * 5
    _split_both_ways(data)
    assert _split_in_c_alone(data)[0]["text"].str.len_bytes().max() == lines.MAX_LINE_CHARS


_PREFIX_PARTS = ["[rank3]:", "[rank12]:", "[default0]:", "[default0]:[rank0]:", "[rank3]:[rank3]:",
                 "[1,3]<stderr>:", "node04 [stderr] ", "(RayWorkerWrapper pid=4009) ", "  1: ",
                 "[80746] [rank0]:", "[Rank 3]:", "[rank]:", "[_x9]:", ""]
_BODIES = ["[E1129 13:33:42.672765297 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught",
           "V1129 13:40:20.565000 5350 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] Recompiling",
           "[rank3]: Traceback (most recent call last):", "[rank3]:[W1129 x]", "[12] tail", "[r", "",
           "   File \"train.py\", line 3, in <module>", "[default0]:[rank0]:[rank0]: nested", "[rank3]",
           "[rank3]:", "short", "exactly twelv", "[rank4]:[rank"]


@settings(max_examples=150, deadline=None)
@given(common=st.sampled_from(_PREFIX_PARTS),
       lines_=st.lists(st.tuples(st.booleans(), st.sampled_from(_PREFIX_PARTS), st.sampled_from(_BODIES)),
                       min_size=1, max_size=40),
       repeat=st.integers(min_value=1, max_value=20), final_newline=st.booleans())
def test_lines_of_launchers_prefixes_split_in_c_as_polars_splits_them(common, lines_, repeat, final_newline):
    rows = [(common if use_common else other) + body for use_common, other, body in lines_] * repeat
    _split_both_ways(("\n".join(rows) + ("\n" if final_newline else "")).encode())


def test_frames_split_in_c_outlive_the_block_and_pickle_only_their_rows():
    """The text is a view into the block: a frame kept, filtered or sent to another process
    holds what it shows, whatever becomes of the name the block had."""
    import pickle

    data = b"".join(b"[rank0]:V1129 13:40:20.565000 1 a.py:1] line %d of a longer log\n" % i for i in range(5000))
    frame, _ = _split_in_c_alone(data)
    del data
    kept = frame.filter(pl.col("line_no") == 4000)
    assert kept["text"].to_list() == ["V1129 13:40:20.565000 1 a.py:1] line 3999 of a longer log"]
    assert len(pickle.dumps(kept)) < 10_000


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400), at=st.integers(min_value=0, max_value=400),
       newlines=st.lists(st.integers(min_value=0, max_value=600), max_size=40))
def test_line_starts_in_c_are_those_of_a_split_and_none_where_a_byte_is_not_ascii_or_a_cr(data, at, newlines):
    """C finds the lines 64 bytes at a time: newlines on each side of a chunk's edge, a non-ASCII
    byte or a CR in a chunk or in the tail after the last."""
    import pyarrow as pa

    text = bytearray(data.decode("latin-1").encode("ascii", "replace").replace(b"\r", b"?") * 2)
    for i in newlines:
        if i < len(text):
            text[i] = 10
    for block in (bytes(text), bytes(text[:at]) + data + bytes(text[at:]), bytes(text[:at]) + b"\r" + bytes(text[at:])):
        starts = lines._split_c.plain_line_starts(pa.py_buffer(block))
        if not block.isascii() or b"\r" in block:
            assert starts is None
            continue
        want = [0] + [i + 1 for i, b in enumerate(block) if b == 10]
        assert list(memoryview(starts).cast("q")) == want

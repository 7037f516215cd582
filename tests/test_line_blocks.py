"""A plain file's blocks of whole lines (lines.newline_blocks): every byte once, cut only after a
newline, whatever the block size, the file's end, or a line longer than a block; and a plain file
of one block read whole into Arrow memory (lines.read_whole): that block."""

from __future__ import annotations

import gzip
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from postmortem.parsers.lines import blocks_of_lines, newline_blocks, open_binary, read_whole


def _blocks(path, size):
    with open_binary(path) as fh:
        return list(newline_blocks(fh, size))


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=30),
       final_newline=st.booleans(), size=st.integers(min_value=1, max_value=64))
def test_blocks_are_the_file_cut_after_newlines(tmp_path_factory, lines, final_newline, size):
    # (a first line of text: a file that starts with gzip's magic or a byte-order mark is read as such)
    data = b"\n".join([b"log", *lines]) + (b"\n" if final_newline else b"")
    path = tmp_path_factory.mktemp("blocks") / "log.txt"
    path.write_bytes(data)
    blocks = _blocks(path, size)
    assert not any(cut_off for _, cut_off in blocks)
    # joined by the newlines they were cut at, the blocks are the file (its final newline aside)
    assert b"\n".join(b for b, _ in blocks) == (data[:-1] if data.endswith(b"\n") else data)


def _grows_once_its_size_is_taken(monkeypatch, path, line: bytes) -> None:
    """A live job's log: ``line`` is appended to it just after os.fstat takes its size (the first time)."""
    real_fstat, size = os.fstat, path.stat().st_size

    def stale_fstat(fd):  # the size as it was before the line was appended
        result = real_fstat(fd)
        if result.st_size == size:
            with open(path, "ab") as fh:
                fh.write(line)
        return result

    monkeypatch.setattr(os, "fstat", stale_fstat)


def test_a_file_that_grows_while_read_is_read_to_its_new_end(tmp_path, monkeypatch):
    """A live job's log gains lines between the size being taken and the read: what was appended is read too."""
    path = tmp_path / "log.txt"
    path.write_bytes(b"first\nsecond\n")
    _grows_once_its_size_is_taken(monkeypatch, path, b"third\n")
    blocks = _blocks(path, 1 << 20)
    assert b"\n".join(b for b, _ in blocks) == b"first\nsecond\nthird"


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=30),
       final_newline=st.booleans(), extra_newline=st.booleans())
def test_a_file_read_whole_into_arrow_memory_is_its_one_block(tmp_path_factory, lines, final_newline, extra_newline):
    """read_whole gives what blocks_of_lines gives a file of one block, byte for byte."""
    data = b"\n".join([b"log", *lines]) + (b"\n" if final_newline else b"") + (b"\n" if extra_newline else b"")
    path = tmp_path_factory.mktemp("whole") / "log.txt"
    path.write_bytes(data)
    whole = read_whole(path)
    assert whole is not None and whole.to_pybytes() == b"".join(blocks_of_lines(path))


def test_files_read_whole_only_where_plain_and_of_one_block(tmp_path):
    """An empty, gzip or UTF-16 file, or one bigger than a block, is left to blocks_of_lines."""
    cases = {"empty.log": b"", "gzipped.log.gz": gzip.compress(b"a\nb\n"), "utf16.log": "a\nb\n".encode("utf-16"),
             "big.log": b"x" * 100 + b"\n"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    assert [read_whole(tmp_path / name, chunk_bytes=64) for name in cases] == [None] * len(cases)
    assert read_whole(tmp_path / "big.log").to_pybytes() == b"x" * 100


def test_a_file_that_grows_while_read_whole_is_left_to_blocks_of_lines(tmp_path, monkeypatch):
    path = tmp_path / "log.txt"
    path.write_bytes(b"first\nsecond\n")
    _grows_once_its_size_is_taken(monkeypatch, path, b"third\n")
    assert read_whole(path) is None

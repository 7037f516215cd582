"""A plain file's blocks of whole lines (lines.newline_blocks): every byte once, cut only after a
newline, whatever the block size, the file's end, or a line longer than a block."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from postmortem.parsers.lines import newline_blocks, open_binary


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


def test_a_file_that_grows_while_read_is_read_to_its_new_end(tmp_path, monkeypatch):
    """A live job's log gains lines between the size being taken and the read: what was appended is read too."""
    path = tmp_path / "log.txt"
    path.write_bytes(b"first\nsecond\n")
    real_fstat = os.fstat

    def stale_fstat(fd):  # the size as it was before the last line was appended
        result = real_fstat(fd)
        with open(path, "ab") as fh:
            if result.st_size == len(b"first\nsecond\n"):
                fh.write(b"third\n")
        return result

    monkeypatch.setattr(os, "fstat", stale_fstat)
    blocks = _blocks(path, 1 << 20)
    assert b"\n".join(b for b, _ in blocks) == b"first\nsecond\nthird"

"""The block scan (parsers/scan.py): a trigger it misses would lose a parser's records, so every
trigger is checked against the exact test it stands for, on every line of the real sample logs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from postmortem.parsers import lines, runtime, scan, textlog

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
REALWORLD = Path(__file__).resolve().parent / "realworld"


def _all_lines() -> pl.DataFrame:
    """Every line of every plain-text log of both corpora, parsed as textlog parses it."""
    frames = []
    for root in (SAMPLES, REALWORLD):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".log", ".txt", ".out", ".err") and path.is_file() and path.stat().st_size < 8 << 20:
                frames.append(lines.split_lines(path.read_bytes(), 1).select("text"))
    return pl.concat(frames)


@pytest.fixture(scope="module")
def every_line() -> pl.DataFrame:
    df = _all_lines()
    assert df.height > 50_000  # the corpora, not an empty glob
    return df


# Each trigger and the exact test of the lines its owner reads.
_EXACT = {p.TRIGGER: pl.col("text").str.contains(p.LINES) for p in textlog.LINE_PARSERS if hasattr(p, "TRIGGER")}
_EXACT |= {
    runtime._TRACEBACK: pl.col("text").str.contains(runtime._TRACEBACK_START, literal=True),
    runtime._VERSION: pl.col("text").str.contains(r"(?i)version|torch=|Python v"),
    runtime._OOM: pl.col("text").str.contains_any(list(runtime._OOM_MARKERS)),
    runtime._FATAL: runtime.fatal_start(),
}


@pytest.mark.parametrize("trigger", list(_EXACT), ids=lambda t: t.name)
def test_every_line_its_owner_reads_holds_its_trigger(every_line, trigger):
    exact = every_line.filter(_EXACT[trigger])
    assert exact.height, f"{trigger.name}: no sample line to check it on"
    missed = exact.filter(~pl.col("text").str.contains(trigger.regex()))
    assert missed.is_empty(), missed["text"].head(5).to_list()
    # and the scan of the bytes finds it on each of those lines
    found = scan.Scanner([trigger])
    assert all(found.present(t.encode()) == {trigger.name} for t in exact["text"].head(200).to_list())


def test_matching_is_the_exact_regex(every_line):
    for p in textlog.LINE_PARSERS:
        if hasattr(p, "TRIGGER"):
            want = every_line.select(pl.col("text").str.contains(p.LINES)).to_series()
            assert scan.matching(every_line["text"], p.TRIGGER, p.LINES).equals(want, check_names=False), p.__name__


@pytest.mark.parametrize("line", ["RESERVED: 12 GiB", "re\u017ferved = 3 GB", "\u212aILLED by the OOM killer", "killed"])
def test_caseless_literals_fold_as_polars_does(line):
    trigger = scan.Trigger("t", ("reserved", "killed"), caseless=True)
    assert pl.Series([line]).str.contains(trigger.regex())[0]
    assert scan.Scanner([trigger]).present(line.encode()) == {"t"}


def test_absent_trigger_is_absent():
    trigger = scan.Trigger("t", ("Traceback (most recent call last):",))
    assert scan.Scanner([trigger]).present(b"[rank0]: Traceback (most recent call) last\nok\n") == frozenset()


def test_without_hyperscan_every_trigger_counts(monkeypatch):
    monkeypatch.setattr(scan, "hyperscan", None)
    found = scan.Scanner([scan.Trigger("t", ("x",))]).present(b"nothing here")
    assert found is None and scan.is_present(found, "t")


def test_split_lines_same_scanned_or_not():
    data = b"[rank0]: 45%|####5     | 9/20 [00:04<00:05,  2.01it/s]Traceback (most recent call last):\r\nnext\r\n"
    present = scan.block_scanner().present(data)
    assert "lines.bar_end" in present
    assert lines.split_lines(data, 1, present).equals(lines.split_lines(data, 1))
    assert lines.split_lines(data, 1).height == 4  # the bar, the message glued to it, the next line, the empty end
    # a CR alone, which the line split itself looks for (no trigger): stripped either way
    crlf = b"[rank0]: one\r\n[rank0]: two\r\n" * 200
    present = scan.block_scanner().present(crlf)
    assert lines.split_lines(crlf, 1, present).equals(lines.split_lines(crlf, 1))
    assert lines.split_lines(crlf, 1, present)["text"].head(2).to_list() == [" one", " two"]


def _text_files() -> list[Path]:
    return [path for root in (SAMPLES, REALWORLD) for path in sorted(root.rglob("*"))
            if path.suffix in (".log", ".txt", ".out", ".err") and path.is_file() and path.stat().st_size < 8 << 20]


def test_hit_lines_are_the_lines_holding_a_literal():
    """The per-line scan names exactly the lines a trigger's literals are in (its raw bytes, prefix and all)."""
    per_line = [t for t in scan._DECLARED.values() if t.per_line]
    found_any = set()
    for path in _text_files():
        data = path.read_bytes().rstrip(b"\n")
        found = scan.block_scanner().scan(data)
        _, hits, _ = lines.split_block(data, 1, found)
        raw = lines.line_series(data)
        for trigger in per_line:
            want = raw.str.contains(trigger.regex()).arg_true() + 1
            got = hits.get(trigger.name, pl.Series([], dtype=pl.Int64)).sort()
            assert got.to_list() == want.to_list(), (path.name, trigger.name)
            found_any |= {trigger.name} if want.len() else set()
    assert len(found_any) >= 8  # the corpora hold lines of most triggers


def test_hit_lines_where_decoding_changed_a_line():
    """Invalid UTF-8 (a Latin-1 byte) makes a decoded line longer than its bytes: the lines are then counted in the bytes."""
    data = (SAMPLES / "hang_dataloader_nccl" / "console.log").read_bytes().rstrip(b"\n")
    data = data.replace(b"\n", b"\xe9\n", 3)
    found = scan.block_scanner().scan(data)
    _, hits, _ = lines.split_block(data, 1, found)
    raw = lines.line_series(data)
    assert raw.str.contains("\ufffd").sum() == 3
    for name, got in hits.items():
        trigger = scan._DECLARED[name]
        assert got.sort().to_list() == (raw.str.contains(trigger.regex()).arg_true() + 1).to_list(), name


@pytest.mark.parametrize("latin1", [False, True], ids=["utf8", "latin1"])
def test_the_lines_byte_offsets_fall_on(latin1):
    """What a block's files start at, as line numbers: from the lines' lengths, or where decoding
    changed a line (a Latin-1 byte), from its newlines counted."""
    data = (SAMPLES / "hang_dataloader_nccl" / "console.log").read_bytes()
    if latin1:
        data = data.replace(b"\n", b"\xe9\n", 3)
    offsets = [0, 1, data.index(b"\n"), data.index(b"\n") + 1, len(data) // 2, len(data) - 1, 7]
    _, _, numbers = lines.split_block(data, 5, scan.block_scanner().scan(data), offsets)
    assert numbers.to_list() == [5 + data.count(b"\n", 0, offset) for offset in offsets]


def test_a_block_split_at_its_head_is_scanned_as_in_one_pass():
    """The presence-only triggers found in a block's head are not looked for in the rest: whatever
    the head's size, and where it cuts a literal in two, the scan finds what one pass over the
    whole block finds (every text log of the samples, one block)."""
    data = b"".join(path.read_bytes() for path in _text_files() if path.is_relative_to(SAMPLES))
    whole = scan.Scanner(scan._DECLARED.values())
    whole.HEAD_BYTES = len(data)
    one_pass = whole.scan(data)
    assert one_pass.ends and {"dynamo", "nccl", "runtime.traceback"} <= one_pass.present
    split = scan.Scanner(scan._DECLARED.values())
    first_dynamo = data.index(b"_dynamo")
    cuts = {first_dynamo - 1, first_dynamo + 3, first_dynamo + 8, 4096, len(data) // 5 - 1}
    for ends in one_pass.ends.values():  # heads ending inside a per-line literal's match, and just past it
        cuts |= {end - back for end in ends[:: max(1, len(ends) // 5)] for back in (0, 1, 2, 5)}
    for head in sorted(c for c in cuts if 0 < c < len(data) // 4):
        split.HEAD_BYTES = head
        assert split.scan(data) == one_pass, head


def test_a_block_with_too_many_matches_is_scanned_for_presence_alone():
    data = b"\n".join([b"[rank0]: mem 12 MiB allocated"] * 20_000)
    found = scan.block_scanner().scan(data)
    assert found.ends is None and "memory" in found.present
    assert found.present == scan.block_scanner().present(data)


def test_records_same_with_or_without_the_scans_lines(monkeypatch):
    """Every text log of both corpora, read in small chunks (lookahead crossing blocks): the records
    are the same whether the line parsers' regexes run on the lines the scan named or on all."""
    from postmortem.parsers.source import Source

    def records(path: Path) -> list[tuple[str, pl.DataFrame]]:
        monkeypatch.setattr(textlog, "read_line_chunks", lambda p: lines.read_line_chunks(p, chunk_bytes=64 << 10))
        source = Source(path=path, name=path.name, kind="text_log", rank=None, bytes=path.stat().st_size, year=2026)
        return list(textlog.parse(source))

    checked = 0
    for path in _text_files():
        with_hits = records(path)
        with monkeypatch.context() as m:
            m.setattr(scan, "holding", lambda df, hits, trigger: None)
            without = records(path)
        assert [t for t, _ in with_hits] == [t for t, _ in without], path
        for (table, a), (_, b) in zip(with_hits, without):
            assert a.equals(b), (path, table)
        checked += len(with_hits)
    assert checked > 1000

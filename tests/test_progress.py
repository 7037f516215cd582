"""Progress bars as evidence of work (parsers/progress.py, checks/progress.py), and the message
another writer glued onto a bar's terminal line read as a line of its own (parsers/lines.py)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from parsers.lines import read_line_chunks, split_lines
from postmortem import api

CASE = Path(__file__).resolve().parent / "realworld" / "c_llamafactory_tokenize_timeout_2424"


def test_a_watchdog_line_glued_to_a_progress_bar_is_read_as_its_own_line():
    lines = split_lines((CASE / "console.log").read_bytes(), 1)
    first = lines.filter(lines["line_no"] == 1)["text"].to_list()
    assert len(first) == 2
    assert first[0].startswith("Running tokenizer on dataset:") and first[0].endswith("155.57 examples/s]")
    assert first[1].startswith("[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout")
    assert lines["line_no"].to_list() == sorted(lines["line_no"].to_list())  # numbers stay the file's


def test_lines_after_a_glued_bar_keep_their_numbers_when_the_file_is_read_in_chunks():
    """A bar with a line glued on is two rows of one line: the next block's lines are numbered
    on from the file's lines, not from the rows."""
    path = CASE / "console.log"
    (whole,) = (chunk.frame for chunk in read_line_chunks(path))
    assert whole.height > whole["line_no"].n_unique()  # (the case holds a glued bar)
    chunks = list(read_line_chunks(path, chunk_bytes=64))  # (a line a block)
    assert len(chunks) > 2
    chunked = pl.concat([chunk.frame.head(chunk.own) for chunk in chunks])
    assert chunked.equals(whole)


def test_a_bar_becomes_a_progress_event_with_its_elapsed_time_count_and_rate():
    con, run_id, _ = api.load(CASE)
    rows = con.execute("SELECT line_no, attrs FROM events WHERE run_id = ? AND kind = 'progress'", [run_id]).fetchall()
    (line, attrs), = rows  # one bar, its longest-running state (a second process drew it at 0/2969526)
    attrs = json.loads(attrs)
    assert line == 1 and attrs["desc"] == "Running tokenizer on dataset"
    assert (attrs["n"], attrs["total"], attrs["elapsed_s"], attrs["rate"]) == (280000, 2969526, 29 * 60 + 55, 155.57)
    assert attrs["unit"] == "examples/s"


def test_the_seconds_per_item_rate_is_turned_into_items_per_second():
    # DeepSpeed's ZeRO-3 run: "  9%|███▍ | 16/174 [01:20<13:49,  5.25s/it][2021-04-06 ...] [INFO] ..."
    case = CASE.parent / "c_deepspeed_loss_scale_warmup_benign_931"
    con, run_id, _ = api.load(case)
    (line, attrs), = con.execute("SELECT line_no, attrs FROM events WHERE run_id = ? AND kind = 'progress'",
                                 [run_id]).fetchall()
    attrs = json.loads(attrs)
    assert line == 4 and attrs["desc"] == "console.log"  # a bar with no description is named by its file
    assert attrs["elapsed_s"] == 80 and abs(attrs["rate"] - 1 / 5.25) < 1e-9 and (attrs["n"], attrs["total"]) == (16, 174)
    glued = con.execute("SELECT message FROM events WHERE run_id = ? AND line_no = 4 AND kind = 'log'",
                        [run_id]).fetchone()[0]
    assert "OVERFLOW! Rank 0 Skipping step" in glued  # the message after the bar is read too


def test_the_rank_no_timeout_names_with_a_bar_that_moved_for_the_whole_timeout_was_busy_not_stuck():
    """Ranks 1-3 time out in one unprefixed console; rank 0 never prints a line of its own but
    the tokenizer bar ran 29:55 of the 30:00 timeout: rank 0 was working, the timeout too short."""
    verdict = api.analyze(CASE, keep=False)["verdict"]
    assert verdict["signature"] == "timeout-misconfigured" and verdict["culprit_ranks"] == [0]
    assert "Running tokenizer on dataset" in verdict["summary"] and "1800 s" in verdict["summary"]


def test_a_store_wait_names_the_rank_it_waited_for_and_a_bar_drawn_as_it_failed_shows_that_rank_was_busy():
    """Rank 1's NCCL setup gave up on the store key rank 0 never wrote ("retrieving ncclUniqueId
    from [0]"), on the terminal line where rank 0's tokenizer bar stood at 47%: no timeout is
    stated, but rank 0 was working when rank 1 failed, and rank 1 waited at main_process_first."""
    verdict = api.analyze(CASE.parent / "c_chatglm_tuning_tokenize_store_timeout_137", keep=False)["verdict"]
    assert verdict["signature"] == "timeout-misconfigured" and verdict["culprit_ranks"] == [0]
    assert verdict["user_line"].endswith("utils/common.py:506")
    assert "its length is not in the logs" in verdict["summary"]

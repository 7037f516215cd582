"""The runtime parser on real lines from the project's own sample runs (gloo, torch 2.13)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

from postmortem import api
from postmortem.parsers import runtime, textlog
from postmortem.parsers.lines import header_source, split_lines
from postmortem.parsers.source import Source


def rank_file(sample_dir: Path, rank: int, stream: str = "stderr") -> Path:
    (path,) = sample_dir.glob(f"logs/*/attempt_0/{rank}/{stream}.log")
    return path


def first_line(path: Path, predicate) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if predicate(line):
                return line.rstrip("\n")
    raise AssertionError(f"no such line in {path}")


def parse_file(path: Path, rank: int | None = None, year: int = 2026) -> dict[str, pl.DataFrame]:
    source = Source(path=path, name=path.name, kind="text_log", rank=rank, year=year)
    tables: dict[str, list[pl.DataFrame]] = {}
    for table, frame in textlog.parse(source):
        tables.setdefault(table, []).append(frame)
    return {t: pl.concat(frames) for t, frames in tables.items()}


def test_c10d_glog_header_gives_level_time_with_the_run_year_and_source(sample):
    line = first_line(rank_file(sample("rank_sigkill"), 0), lambda l: l.startswith("[rank0]:[I"))
    row = header_source(textlog.with_headers(split_lines(line, 1), 2026)).row(0, named=True)
    assert row["rank"] == 0 and row["tee"] is False
    assert row["level"] == "I"
    assert row["ts"].year == 2026 and row["ts"].month == 11 and row["ts"].day == 29
    assert row["src"].split(":")[0].endswith(".cpp") and row["src"].split(":")[1].isdigit()
    assert not row["msg"].startswith("[")


def test_python_logging_header_gives_pid_and_emitting_module(sample):
    line = first_line(rank_file(sample("rank_sigkill"), 1), lambda l: l.startswith("[rank1]:V"))
    row = header_source(textlog.with_headers(split_lines(line, 1), 2026)).row(0, named=True)
    assert row["level"] == "V"
    assert row["pid"] == json.loads((sample("rank_sigkill") / "expected.json").read_text())["failures"][1]["pid"]
    assert row["src"].startswith(("torch/", "site-packages/torch/"))
    assert row["ts"].microsecond % 1000 == 0  # Python logging prints milliseconds


def test_console_lines_keep_their_rank_from_the_tee_prefix(sample):
    line = first_line(sample("rank_exception") / "console.log", lambda l: l.startswith("[default1]:[rank1]:"))
    row = split_lines(line, 7).row(0, named=True)
    assert (row["rank"], row["tee"], row["line_no"]) == (1, True, 7)
    assert not row["text"].startswith("[default1]")


def test_traceback_gives_exception_user_frame_and_stack(sample):
    tables = parse_file(rank_file(sample("rank_exception"), 1), rank=1)
    exc = tables["events"].filter(pl.col("kind") == "exception").row(0, named=True)
    attrs = json.loads(exc["attrs"])
    assert attrs["exception_type"] == "ValueError"
    assert exc["message"].startswith("ValueError: bad batch at step 4")
    expected_line = json.loads((sample("rank_exception") / "expected.json").read_text())["user_line"]
    assert attrs["user_frame"].endswith(expected_line.split(":")[0] + ":" + expected_line.split(":")[1])
    failure = tables["failures"].row(0, named=True)
    assert (failure["rank"], failure["exception_type"], failure["source"]) == (1, "ValueError", "traceback")
    stack = tables["stacks"].sort("depth")
    assert stack["depth"].to_list() == list(range(stack.height))
    assert stack.row(0, named=True)["function"] == attrs["user_function"]  # innermost frame first


def test_traceback_from_a_console_is_split_by_rank(sample):
    tables = parse_file(sample("rank_exception") / "console.log")
    exceptions = tables["events"].filter(pl.col("kind") == "exception")
    by_rank = dict(zip(exceptions["rank"].to_list(), exceptions["message"].to_list()))
    assert by_rank[1].startswith("ValueError")
    assert "Connection closed by peer" in by_rank[0]


def test_torchrun_failure_table_rows_name_rank_pid_and_signal_not_the_entry_index(sample):
    expected = json.loads((sample("rank_sigkill") / "expected.json").read_text())["failures"]
    tables = parse_file(sample("rank_sigkill") / "console.log")
    rows = tables["failures"].filter(pl.col("source") == "torchrun").sort("rank").to_dicts()
    assert [(r["rank"], r["exit_code"], r["signal"], r["pid"]) for r in rows] == [
        (e["rank"], e["exitcode"], e["signal"], e["pid"]) for e in sorted(expected, key=lambda e: e["rank"])
    ]
    assert all(isinstance(r["ts"], datetime) for r in rows)
    assert rows[1]["message"] == "Signal 9 (SIGKILL) received by PID %d" % rows[1]["pid"]
    first = tables["events"].filter(pl.col("kind") == "torchrun_failure").to_dicts()
    assert {json.loads(e["attrs"])["first_observed"] for e in first if e["rank"] == 1} == {True}


def test_agent_closing_signal_names_the_worker_pid(sample):
    tables = parse_file(sample("hang_dataloader") / "console.log")
    sent = tables["events"].filter(pl.col("kind") == "agent_signal").row(0, named=True)
    attrs = json.loads(sent["attrs"])
    assert attrs["signal"] == "SIGTERM"
    assert sent["pid"] == attrs["target_pid"]
    assert sent["rank"] is None  # the store maps the pid to a rank, not the parser


def test_cpp_terminate_block_is_an_abort_with_its_what_message(sample):
    tables = parse_file(rank_file(sample("dtype_mismatch"), 1), rank=1)
    term = tables["failures"].filter(pl.col("source") == "terminate").row(0, named=True)
    assert term["signal"] == "SIGABRT"
    assert term["exception_type"] == "gloo::EnforceNotMet"
    assert "op.preamble.length <= op.nbytes" in term["message"]


def test_gloos_size_check_in_its_older_wording_is_a_collective_mismatch(tmp_path):
    # e_prime_diloco_gloo_preamble_size_mismatch_68: gloo before its 2025 message (pytorch/gloo#456)
    # printed the enforce alone, without "Received data size doesn't match expected size"
    (tmp_path / "console.log").write_text(
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
        "op.preamble.length <= op.nbytes. 1046204 vs 1040256\n")
    report = api.analyze(tmp_path, keep=False)
    assert report["verdict"]["signature"] == "collective-mismatch"
    assert "gloo received 1046204 bytes where the receiving rank expected 1040256" in report["verdict"]["summary"]


def test_versions_come_from_the_lines_that_print_them(sample):
    tables = parse_file(rank_file(sample("healthy"), 0, "stdout"), rank=0)
    versions = {json.loads(a)["component"]: json.loads(a)["version"]
                for a in tables["events"].filter(pl.col("kind") == "version")["attrs"]}
    assert versions["torch"].startswith("2.")


@pytest.mark.parametrize(
    "message, figures",
    [
        # PyTorch's own format string (c10/cuda/CUDACachingAllocator.cpp); no GPU OOM can run here.
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacity of "
         "139.80 GiB of which 135.44 GiB is free. Including non-PyTorch memory, this process has 4.35 GiB memory in "
         "use. 2.80 GiB allowed; Of the allocated memory 2.77 GiB is allocated by PyTorch, and 22.04 MiB is reserved "
         "by PyTorch but unallocated.",
         {"tried_to_allocate": 32 << 20, "allocated_by_pytorch": int(2.77 * (1 << 30)),
          "reserved_unallocated": int(22.04 * (1 << 20)), "allowed": int(2.80 * (1 << 30))}),
        # The pre-2.0 wording (same source, older release).
        ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
         "14.56 GiB already allocated; 3.75 MiB free; 14.75 GiB reserved in total by PyTorch)",
         {"tried_to_allocate": 20 << 20, "capacity": int(15.78 * (1 << 30)),
          "allocated_by_pytorch": int(14.56 * (1 << 30)), "reserved_total": int(14.75 * (1 << 30))}),
    ],
)
def test_oom_figures_in_bytes_for_both_wordings(message, figures):
    found = runtime.oom_figures(message)
    for key, value in figures.items():
        assert found[key] == value


def test_untimed_traceback_is_moved_to_the_ranks_last_sign_of_life(sample):
    con, run_id, _ = api.ingest(sample("rank_exception"), keep=False)
    ts = con.execute(
        "SELECT ts FROM failures WHERE run_id = ? AND rank = 1 AND source = 'traceback'", [run_id]
    ).fetchone()[0]
    # rank 1 logged its steps to stdout; the error, in stderr, came after the last of them
    last_step = con.execute(
        "SELECT max(ts) FROM memory WHERE run_id = ? AND rank = 1 AND source = 'log'", [run_id]).fetchall()[0][0]
    assert last_step is not None and ts >= last_step


def test_each_ranks_last_line_event_is_its_last_timed_line_in_a_console_where_ranks_interleave(sample):
    # torchrun's console: rank 0's and rank 1's "[rankN]:" lines alternate, untimed traceback lines between
    path = sample("hang_dataloader_console") / "console.log"
    timed = re.compile(r"^\[rank(\d+)\]:\[?[IWEFV]\d{4} \d\d:\d\d:\d\d")
    last: dict[int, int] = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if m := timed.match(line):
            last[int(m[1])] = number
    assert len(last) == 2
    events = parse_file(path)["events"].filter(pl.col("kind") == "last_line")
    assert dict(events.select("rank", "line_no").iter_rows()) == last

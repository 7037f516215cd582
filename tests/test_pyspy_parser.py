"""py-spy dumps (text and --json) of real hung ranks into stacks."""

from __future__ import annotations

import json

from postmortem.parsers import pyspy
from postmortem.parsers.source import Source


def parse(path, rank=None):
    source = Source(path=path, name=path.name, kind="pyspy", rank=rank)
    return {table: frame for table, frame in pyspy.parse(source)}


def test_text_and_json_dumps_of_one_process_give_the_same_frames(sample):
    dumps = sample("hang_dataloader") / "pyspy"
    text = parse(dumps / "rank1.txt", rank=1)["stacks"]
    as_json = parse(dumps / "rank1.json", rank=1)["stacks"]
    main = lambda df: [(r["depth"], r["function"], r["line"]) for r in df.to_dicts() if r["thread"] == "MainThread"]
    assert main(text) == main(as_json)
    assert text["pid"].unique().to_list() == as_json["pid"].unique().to_list()


def test_text_dump_names_the_user_frame_the_rank_is_stuck_in(sample):
    expected = json.loads((sample("hang_dataloader") / "expected.json").read_text())["user_line"]
    stacks = parse(sample("hang_dataloader") / "pyspy" / "rank1.txt", rank=1)["stacks"]
    frames = [f"{r['file']}:{r['line']}" for r in stacks.sort("depth").to_dicts() if r["thread"] == "MainThread"]
    assert expected.split("/")[-1] in frames
    assert stacks["thread_state"].unique().to_list() in (["idle"], ["active"], ["active+gil"])


def test_text_dump_header_gives_the_pid_command_and_python_version(sample):
    events = parse(sample("hang_dataloader") / "pyspy" / "rank0.txt", rank=0)["events"]
    kinds = dict(zip(events["kind"], events["attrs"]))
    assert "train.py" in json.loads(kinds["process"])["command"]
    assert json.loads(kinds["version"])["version"].startswith("3.")

"""Memory figures from text logs (parsers/memory.py) and CUDA memory snapshots (parsers/memory_snapshot.py).

Lines of this project's own runs are read from sample_logs/. The other frameworks' lines are
quoted verbatim from runs their users posted, with where they were posted; none comes from a
framework's source code.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postmortem.parsers import memory_snapshot, textlog
from postmortem.parsers.source import Source

MiB = 1 << 20
GiB = 1 << 30

# torchtitan, posted in pytorch/torchtitan PR #3393 (a run's log).
TORCHTITAN = ("[rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - step: 14  loss:  3.24405  grad_norm:  0.8319  "
              "memory:  9.46GiB(64.99%)  tps: 7,282  tflops: 0.52  mfu: 0.17%")
# Megatron-DeepSpeed's report_memory, posted in HabanaAI/Model-References PR #34 (a run's log).
MEGATRON = ("[Rank 4] (after 3 iterations) memory (MB) | allocated: 65639.96411132812 | max allocated: "
            "96745.81176757812 | reserved: 96883.21484375 | max reserved: 96883.21484375")
# DeepSpeed's see_memory_usage, posted in deepspeedai/DeepSpeed issue #522 (a run's log).
DEEPSPEED = ("[2022-02-21 23:35:27,338] [INFO] [utils.py:827:see_memory_usage] MA 4.96 GB         Max_MA 5.09 GB"
             "         CA 6.39 GB         Max_CA 6 GB")
# A Hugging Face Trainer log dict with memory metrics, posted in huggingface/optimum-habana PR #89 (a run's log).
HF_TRAINER = ("{'loss': 0.6188, 'learning_rate': 2.9130434782608696e-05, 'epoch': 0.09, 'memory_allocated (GB)': 3.82, "
              "'max_memory_allocated (GB)': 6.32, 'total_memory_available (GB)': 29.85}")
# torch.cuda.memory_summary(), printed in pytorch/pytorch PR #91854 (its output on a GPU).
MEMORY_SUMMARY = """\
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |   1024 KiB |   1024 KiB |   1024 KiB |      0 B   |
|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |
|       from small pool |   1024 KiB |   1024 KiB |   1024 KiB |      0 B   |
|---------------------------------------------------------------------------|
| Active memory         |   1024 KiB |   1024 KiB |   1024 KiB |      0 B   |
|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |
|       from small pool |   1024 KiB |   1024 KiB |   1024 KiB |      0 B   |
|---------------------------------------------------------------------------|"""
# The same block as printed by PyTorch 1.6 (pytorch/pytorch PR #38884): "KB" meant KiB there.
MEMORY_SUMMARY_OLD_ROWS = """\
|                  PyTorch CUDA memory summary, device ID 0                 |
|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
| Allocated memory      |    1024 B  |  133632 B  |  273920 B  |  272896 B  |
| GPU reserved memory   |    2048 KB |    2048 KB |    2048 KB |       0 B  |"""


def parse_text(tmp_path: Path, text: str, rank: int | None = None) -> dict[str, pl.DataFrame]:
    path = tmp_path / "rank.log"
    path.write_text(text if text.endswith("\n") else text + "\n")
    source = Source(path=path, name="rank.log", kind="text_log", rank=rank, year=2026)
    out: dict[str, list[pl.DataFrame]] = {}
    for table, df in textlog.parse(source):
        out.setdefault(table, []).append(df)
    return {t: pl.concat(frames) for t, frames in out.items()}


def memory_rows(tmp_path: Path, text: str, rank: int | None = None) -> list[dict]:
    return parse_text(tmp_path, text, rank)["memory"].sort("line_no").to_dicts()


def stdout_log(sample_dir: Path, rank: int) -> Path:
    (path,) = sample_dir.glob(f"logs/*/attempt_0/{rank}/stdout.log")
    return path


# ---------------------------------------------------------------- this project's per-step lines


def test_cpu_sample_step_lines_give_a_per_step_series_per_rank(sample):
    """The gloo samples log `mem_alloc_mb` (the process RSS on CPU) on every step line."""
    path = stdout_log(sample("healthy"), 0)
    lines = [line for line in path.read_text().splitlines() if "mem_alloc_mb" in line]
    source = Source(path=path, name="stdout.log", kind="text_log", rank=0, year=2026)
    memory = pl.concat([df for table, df in textlog.parse(source) if table == "memory"]).sort("step")
    assert memory.height == len(lines) == 10
    assert memory["step"].to_list() == list(range(10))
    assert set(memory["source"]) == {"log"} and set(memory["rank"]) == {0}
    first = float(lines[0].rsplit("mem_alloc_mb ", 1)[1])
    assert memory["allocated"][0] == round(first * MiB)
    assert memory["reserved"].null_count() == memory.height  # the CPU line has no reserved figure


def test_gpu_step_line_gives_allocated_and_reserved(tmp_path):
    # The format train.py prints on CUDA (sample_logs/generate/train.py mem_fields), a real line of its run.
    line = "2026-11-29 13:39:35,511 [rank0] step 3 loss 2.4577 step_time 0.018s mem_alloc_mb 913.5 mem_reserved_mb 1220.0"
    (row,) = memory_rows(tmp_path, line)  # one file for all ranks: the rank comes from the message
    assert row["rank"] == 0 and row["step"] == 3
    assert row["allocated"] == round(913.5 * MiB) and row["reserved"] == round(1220.0 * MiB)
    assert row["ts"].year == 2026 and row["ts"].second == 35


# ---------------------------------------------------------------- other frameworks' lines


def test_torchtitan_memory_is_the_peak_reserved_of_the_step(tmp_path):
    (row,) = memory_rows(tmp_path, TORCHTITAN)
    assert row["rank"] == 0 and row["step"] == 14
    assert row["peak_reserved"] == round(9.46 * GiB)
    assert row["allocated"] is None and row["reserved"] is None


def test_megatron_report_memory_gives_all_four_figures_its_rank_and_iteration(tmp_path):
    (row,) = memory_rows(tmp_path, MEGATRON)
    assert row["rank"] == 4 and row["step"] == 3
    assert row["allocated"] == round(65639.96411132812 * MiB)
    assert row["peak_allocated"] == round(96745.81176757812 * MiB)
    assert row["reserved"] == row["peak_reserved"] == round(96883.21484375 * MiB)


def test_deepspeed_see_memory_usage_reads_ma_and_ca_in_binary_gigabytes(tmp_path):
    (row,) = memory_rows(tmp_path, DEEPSPEED, rank=2)
    assert row["rank"] == 2 and row["step"] is None
    assert row["allocated"] == round(4.96 * GiB) and row["peak_allocated"] == round(5.09 * GiB)
    assert row["reserved"] == round(6.39 * GiB) and row["peak_reserved"] == 6 * GiB


def test_hf_trainer_log_dict_gives_current_and_max_allocated(tmp_path):
    (row,) = memory_rows(tmp_path, HF_TRAINER)
    assert row["allocated"] == round(3.82 * GiB) and row["peak_allocated"] == round(6.32 * GiB)
    assert row["reserved"] is None  # total_memory_available is the device's size, not a figure of the job


def test_memory_summary_block_gives_one_sample_and_an_event_with_the_retry_count(tmp_path):
    tables = parse_text(tmp_path, MEMORY_SUMMARY, rank=1)
    (row,) = tables["memory"].to_dicts()
    assert row["rank"] == 1 and row["device"] == 0 and row["source"] == "log"
    assert row["allocated"] == row["peak_allocated"] == 1024 * 1024
    assert row["reserved"] is None  # this excerpt stops before the reserved row
    (event,) = tables["events"].filter(pl.col("kind") == "memory_summary").to_dicts()
    assert '"malloc_retries": 0' in event["attrs"] and '"ooms": 0' in event["attrs"]


def test_old_memory_summary_units_are_binary(tmp_path):
    (row,) = memory_rows(tmp_path, MEMORY_SUMMARY_OLD_ROWS)
    assert row["allocated"] == 1024 and row["peak_allocated"] == 133632
    assert row["reserved"] == 2048 * 1024


def test_a_max_figure_is_never_taken_for_the_current_one(tmp_path):
    text = "step 7 max_mem_alloc_mb 1500.0 mem_alloc_mb 900.0"
    (row,) = memory_rows(tmp_path, text)
    assert row["allocated"] == 900 * MiB and row["peak_allocated"] == 1500 * MiB


def test_words_that_only_start_like_a_memory_key_are_not_figures(tmp_path):
    text = "step 5 mem_allocator ready with 4 pools; memory_reserved_pct 12"
    assert parse_text(tmp_path, text).get("memory", pl.DataFrame()).height == 0


def test_oom_message_becomes_a_sample_with_source_oom(tmp_path):
    """The OOM's own figures: allocated by PyTorch; reserved = allocated + reserved-but-unallocated.
    The line is a real one of a PyTorch 2.11 run on an H200 (the team's reference corpus)."""
    oom = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total "
           "capacity of 139.80 GiB of which 135.44 GiB is free. Including non-PyTorch memory, this process has 4.35 GiB "
           "memory in use. 2.80 GiB allowed; Of the allocated memory 2.77 GiB is allocated by PyTorch, and 22.04 MiB "
           "is reserved by PyTorch but unallocated.")
    (row,) = memory_rows(tmp_path, oom)
    assert row["source"] == "oom" and row["rank"] == 0
    assert row["allocated"] == round(2.77 * GiB)
    assert row["reserved"] == round(2.77 * GiB) + round(22.04 * MiB)


REAL_LINES = [TORCHTITAN, MEGATRON, DEEPSPEED, HF_TRAINER, *MEMORY_SUMMARY.splitlines()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(REAL_LINES), st.integers(0, 400), st.text(max_size=8)), max_size=12))
def test_mutated_real_memory_lines_never_raise(tmp_path_factory, edits):
    lines = []
    for line, at, junk in edits:
        at = at % (len(line) + 1)
        lines.append(line[:at] + junk + line[at:])
    parse_text(tmp_path_factory.mktemp("m"), "\n".join(lines) or "x")


# ---------------------------------------------------------------- memory snapshots


def test_snapshot_sniff_claims_snapshots_only():
    snapshot_head = b"\x80\x04\x95\x01\x00\x01\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94(}\x94("
    fr_head = b"\x80\x02}(X\x07\x00\x00\x00versionq\x00X\x04\x00\x00\x002.10q\x01X\t\x00\x00\x00pg_configq\x02}"
    assert memory_snapshot.sniff(snapshot_head, "memory_snapshot_rank0.pickle")
    assert not memory_snapshot.sniff(fr_head, "nccl_trace_rank_0")
    assert not memory_snapshot.sniff(b'{"traceEvents": []}', "x.json")


@pytest.mark.parametrize("payload", [
    b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.",
])
def test_a_snapshot_that_asks_for_code_is_refused(tmp_path, payload):
    path = tmp_path / "memory_snapshot_rank0.pickle"
    path.write_bytes(payload)
    source = Source(path=path, name=path.name, kind=memory_snapshot.KIND, rank=0)
    with pytest.raises(ValueError):
        list(memory_snapshot.parse(source))


def _snapshot(sample) -> dict:
    from postmortem.parsers import pickles

    return pickles.loads(sample("memory_leak").joinpath("memory_snapshot_rank0.pickle").read_bytes())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_real_snapshot_with_odd_values_raises_only_value_errors(sample, tmp_path_factory, data):
    snap = _snapshot(sample)
    odd = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3), st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.floats(allow_nan=True))
    segments, trace = snap["segments"], snap["device_traces"][0]
    for _ in range(data.draw(st.integers(1, 6))):
        where = data.draw(st.sampled_from(["segment", "block", "frame", "action", "top"]))
        seg = segments[data.draw(st.integers(0, len(segments) - 1))]
        if where == "segment":
            seg[data.draw(st.sampled_from(sorted(seg)))] = data.draw(odd)
        elif where == "block" and isinstance(seg.get("blocks"), list) and seg["blocks"]:
            if isinstance(seg["blocks"][0], dict):
                seg["blocks"][0][data.draw(st.sampled_from(["size", "state", "frames", "address"]))] = data.draw(odd)
        elif where == "frame" and isinstance(seg.get("frames"), list) and seg["frames"]:
            seg["frames"][0] = data.draw(odd)
        elif where == "action" and trace:
            action = trace[data.draw(st.integers(0, len(trace) - 1))]
            action[data.draw(st.sampled_from(["action", "size", "time_us", "addr", "frames"]))] = data.draw(odd)
        elif where == "top":
            snap[data.draw(st.sampled_from(["segments", "device_traces", "external_annotations"]))] = data.draw(odd)
    import pickle

    path = tmp_path_factory.mktemp("s") / "memory_snapshot_rank0.pickle"
    path.write_bytes(pickle.dumps(snap))  # writing our own test data; reading goes through pickles.loads
    try:
        list(memory_snapshot.parse(Source(path=path, name=path.name, kind=memory_snapshot.KIND, rank=0)))
    except ValueError:
        pass

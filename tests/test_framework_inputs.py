"""Frameworks' own files and lines as inputs: HF Trainer's trainer_state.json and log dicts,
Lightning's metrics.csv and console, Megatron's iteration lines, torchtitan's step lines, memory
figures in the users' and nvidia-smi's wordings.

Every line here is real: from this project's framework samples (sample_logs/<scenario>/, made by
sample_logs/generate/frameworks/make_samples.py) or from the public thread named beside it,
except the one line built from Megatron-LM's format string, which says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from postmortem.parsers import hf_trainer_state, memory, metrics_csv, nvidia_smi_csv, textlog
from postmortem.parsers.source import Source

from postmortem import api
from postmortem.checks.memory_leak import _few_but_steep
from postmortem.discover import classify


def _source(path: Path, kind: str) -> Source:
    return Source(path=path, name=path.name, kind=kind, bytes=path.stat().st_size)


def _tables(path: Path, module) -> dict[str, pl.DataFrame]:
    out: dict[str, list[pl.DataFrame]] = {}
    for table, df in module.parse(_source(path, module.KIND)):
        out.setdefault(table, []).append(df)
    return {t: pl.concat(dfs) for t, dfs in out.items()}


def _lines(tmp_path: Path, *lines: str) -> dict[str, pl.DataFrame]:
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return _tables(path, textlog)


def _finding(report: dict, signature: str) -> dict | None:
    return next((f for f in report["findings"] if f["signature"] == signature), None)


def _analyze(tmp_path: Path, name: str, *lines: str) -> dict:
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / name).write_text("\n".join(lines) + "\n")
    return api.analyze(folder, keep=False)


# ---------------------------------------------------------------- HF Trainer


def test_trainer_state_is_sniffed_by_content_not_name(sample):
    path = sample("hf_trainer_non_finite_loss") / "out" / "trainer_state.json"
    head = path.read_bytes()[:65536]
    assert classify(head, "whatever.json") == "hf_trainer_state"
    assert classify(head, "trainer_state.json") == "hf_trainer_state"


def test_trainer_state_entries_become_events_at_the_line_each_entry_opens(sample):
    path = sample("hf_trainer_non_finite_loss") / "out" / "trainer_state.json"
    events = _tables(path, hf_trainer_state)["events"]
    history = json.loads(path.read_text())["log_history"]
    assert events.height == len(history)
    assert set(events["kind"]) == {"train_metrics"} and events["rank"].null_count() == events.height
    step4 = events.filter(pl.col("attrs").str.json_path_match("$.step") == "4").row(0, named=True)
    assert '"grad_norm": NaN' in step4["message"] and json.loads(step4["attrs"])["grad_norm"] == "nan"
    lines = path.read_text().splitlines()
    assert lines[step4["line_no"] - 1].strip() == "{"
    assert lines[step4["line_no"]].strip() == '"epoch": 0.4,'


def test_trainer_state_memory_figures_become_memory_rows_with_the_entrys_step():
    # optimum-habana's Trainer adds memory figures to the log dict (the line parsers/memory.py quotes)
    entry = {"loss": 0.6188, "learning_rate": 2.9130434782608696e-05, "epoch": 0.09,
             "memory_allocated (GB)": 3.82, "max_memory_allocated (GB)": 6.32,
             "total_memory_available (GB)": 29.85, "step": 40}
    events = hf_trainer_state.entry_rows([entry], [12], "trainer_state.json")
    msgs = events.select("file", "rank", pl.col("ts").alias("ts_ff"), "line_no", pl.col("message").alias("msg"),
                         pl.lit(40, pl.Int64).alias("step"))
    row = memory.figures_from_messages(msgs).row(0, named=True)
    assert row["step"] == 40 and row["line_no"] == 12
    assert row["allocated"] == round(3.82 * 2**30) and row["peak_allocated"] == round(6.32 * 2**30)


def test_hf_sample_is_non_finite_loss_at_step_4_from_trainer_state(report_of):
    """The Trainer's nan filter kept the logged loss finite; grad_norm is nan from step 4 on."""
    report = report_of("hf_trainer_non_finite_loss")
    assert report["verdict"]["signature"] == "non-finite-loss"
    found = _finding(report, "non-finite-loss")
    assert "at step 4" in found["summary"]
    assert found["evidence"][0]["file"].endswith("trainer_state.json")


def test_transformers_5_log_dicts_with_string_figures_read_as_nan_grad_norms(sample, tmp_path):
    """The console's own log-dict lines (tqdm's bar before each; transformers 5 prints figures as
    strings: 'grad_norm': 'nan'), alone in a file."""
    console = (sample("hf_trainer_non_finite_loss") / "console.log").read_text().splitlines()
    dicts = [line for line in console if "'grad_norm': 'nan'" in line]
    assert len(dicts) >= 3
    report = _analyze(tmp_path, "console.log", *dicts)
    assert report["verdict"]["signature"] == "non-finite-loss"


def test_hf_console_alone_names_the_nan_grad_norms_but_no_rank(sample, tmp_path):
    """What a user most often has: the console. Its log dicts name no rank (only rank 0 prints
    them) beside [rankN]:-prefixed warnings; they count since no ranked line is bad."""
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "console.log").write_bytes((sample("hf_trainer_non_finite_loss") / "console.log").read_bytes())
    report = api.analyze(folder, keep=False)
    assert report["verdict"]["signature"] == "non-finite-loss"
    assert report["verdict"]["culprit_ranks"] == []


def test_accelerate_launch_rank_exception_names_the_raising_rank_and_its_line(report_of, sample):
    """accelerate launch --multi_gpu on CPU: one console, accelerate's defaults warning first, the
    ranks' [rankN]: tracebacks, then accelerate's own traceback (ChildFailedError) and torch
    elastic's failure table. Rank 1 raised; rank 0's gloo error and SIGTERM are its consequences."""
    report = report_of("hf_trainer_rank_exception_accelerate")
    expected = json.loads((sample("hf_trainer_rank_exception_accelerate") / "expected.json").read_text())
    assert report["verdict"]["signature"] == "rank-crash"
    assert report["verdict"]["culprit_ranks"] == [1]
    assert report["verdict"]["user_line"].endswith("/" + expected["user_line"])
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[1]["exit_code"] == 1 and not ranks[1]["consequence"]
    # the failure table's exit codes are read under accelerate's traceback
    assert ranks[0]["consequence"] and ranks[0]["exit_code"] == -15 and ranks[0]["signal"] == "SIGTERM"


def test_accelerate_launchers_own_traceback_is_no_ranks_error(report_of, sample):
    """accelerate launch's own traceback (multi_gpu_launcher -> ChildFailedError), unprefixed, in
    the same console as the ranks' [rankN]: tracebacks: it is the launcher's, so no rank ends with
    it and no rank is made up for it."""
    console = (sample("hf_trainer_rank_exception_accelerate") / "console.log").read_text().splitlines()
    at = next(i for i, line in enumerate(console) if line.startswith("Traceback (most recent call last):"))
    assert any("ChildFailedError" in line for line in console[at:])
    report = report_of("hf_trainer_rank_exception_accelerate")
    assert all("ChildFailedError" not in json.dumps(r) for r in report["ranks"])
    assert report["ranks_seen"] == [0, 1] and report["world_size"] == 2


def test_accelerate_launch_non_finite_loss_is_found_at_step_4_naming_no_rank(report_of):
    report = report_of("hf_trainer_non_finite_loss_accelerate")
    assert report["verdict"]["signature"] == "non-finite-loss"
    assert "at step 4" in _finding(report, "non-finite-loss")["summary"]
    assert report["verdict"]["culprit_ranks"] == []


def test_a_rank_prefix_glued_to_a_progress_bar_makes_the_console_mixed(sample):
    """Line 1 starts with [rank1]:, line 2 has rank 0's warning glued to tqdm's bar: the file is
    not rank 1's (it was, and every log dict of rank 0 was blamed on rank 1)."""
    from postmortem.discover import rank_from_content

    head = (sample("hf_trainer_non_finite_loss") / "console.log").read_bytes()
    assert head.startswith(b"[rank1]:") and b"it/s][rank0]:[W" in head
    assert rank_from_content(head) == (None, False)


# ---------------------------------------------------------------- Lightning


def test_metrics_csv_is_sniffed_by_its_header_and_numbers(sample):
    path = sample("lightning_non_finite_loss") / "out" / "lightning_logs" / "version_0" / "metrics.csv"
    assert classify(path.read_bytes(), "m.csv") == "metrics_csv"
    assert classify(b"name,age\nbob,3\n", "m.csv") != "metrics_csv"  # no step column, not numbers


def test_metrics_csv_rows_name_every_cell_and_keep_their_step(sample):
    path = sample("lightning_non_finite_loss") / "out" / "lightning_logs" / "version_0" / "metrics.csv"
    events = _tables(path, metrics_csv)["events"]
    row = events.filter(pl.col("line_no") == 6).row(0, named=True)  # "0,4,nan"
    assert row["message"] == "step=4, train_loss=nan, epoch=0"
    assert json.loads(row["attrs"]) == {"step": 4} and row["rank"] is None


def test_lightning_sample_is_non_finite_loss_at_step_4_naming_no_rank(report_of):
    report = report_of("lightning_non_finite_loss")
    found = _finding(report, "non-finite-loss")
    assert report["verdict"]["signature"] == "non-finite-loss"
    assert "at step 4" in found["summary"] and report["verdict"]["culprit_ranks"] == []


def test_lightning_progress_bar_train_loss_nan_is_a_non_finite_loss(sample, tmp_path):
    """The console's last two lines, rich's progress bar: '... v_num: 0.000' / 'train_loss: nan'."""
    tail = (sample("lightning_non_finite_loss") / "console.log").read_text().splitlines()[-2:]
    assert "train_loss: nan" in tail[-1]
    assert _analyze(tmp_path, "console.log", *tail)["verdict"]["signature"] == "non-finite-loss"


def test_lightning_rank_exception_names_the_raising_rank_from_console_order(report_of):
    """No line is timed: rank 0's 'Connection closed by peer' comes after rank 1's ValueError."""
    report = report_of("lightning_rank_exception")
    assert report["verdict"]["signature"] == "rank-crash"
    assert report["verdict"]["culprit_ranks"] == [1]


def test_device_stats_monitor_columns_are_the_allocators_figures_per_step(sample):
    """Lightning's DeviceStatsMonitor logs torch.cuda.memory_stats() at each batch's start and end
    into metrics.csv, some 250 columns: the header alone outgrows the sniffer's first 8 KB."""
    path = sample("lightning_memory_leak_cuda") / "out" / "lightning_logs" / "version_0" / "metrics.csv"
    head = path.read_bytes()[:65536]
    assert b"\n" in head and head.index(b"\n") > 8192
    assert classify(head, "metrics.csv") == "metrics_csv"
    mem = _tables(path, metrics_csv)["memory"]
    # one row at each batch's start and one at its end (two log calls a step): the later is the end's
    last = mem.sort("line_no").group_by("step", maintain_order=True).last().sort("step")
    assert last["step"].to_list() == list(range(150))
    table = pl.read_csv(path, infer_schema=False)
    ends = table.filter(pl.col("DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current").is_not_null())
    assert last["allocated"].to_list() == [
        int(v) for v in ends["DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current"]]
    assert last["peak_reserved"].to_list() == [
        int(v) for v in ends["DeviceStatsMonitor.on_train_batch_end/reserved_bytes.all.peak"]]


def test_lightning_cuda_leak_sample_is_a_memory_leak_from_metrics_csv(report_of):
    report = report_of("lightning_memory_leak_cuda")
    assert report["verdict"]["signature"] == "memory-leak"
    leak = _finding(report, "memory-leak")
    assert leak["evidence"][0]["file"].endswith("metrics.csv")


def test_nvidia_smi_log_beside_the_cuda_run_is_read_as_device_memory(sample):
    path = sample("lightning_memory_leak_cuda") / "out" / "gpu.csv"
    assert path.read_text().startswith("timestamp, index, memory.used [MiB], memory.total [MiB]\n")
    rows = _tables(path, nvidia_smi_csv)["memory"]
    assert set(rows["source"]) == {"nvidia-smi"} and set(rows["device"]) == {0}
    assert rows["ts"].null_count() == 0 and rows["reserved"].max() > 1000 * 2**20


# ---------------------------------------------------------------- Megatron / torchtitan


# https://github.com/bigscience-workshop/Megatron-DeepSpeed/issues/396 (Megatron-DeepSpeed)
_MEGATRON_NAN_NORM = [
    (" iteration     5426/  250000 | consumed samples:        43408 | consumed tokens:     88899584 | elapsed time per "
    "iteration (ms): 4247.9 | learning rate: 2.999E-04 | global batch size:     8 | loss scale: 1.0 | grad norm: nan | "
    "actual seqlen:  2048 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: "
    "1.883 | TFLOPs: 78.36 |"),
    (" iteration     5427/  250000 | consumed samples:        43416 | consumed tokens:     88915968 | elapsed time per "
    "iteration (ms): 4225.8 | learning rate: 2.999E-04 | global batch size:     8 | loss scale: 1.0 | grad norm: nan | "
    "actual seqlen:  2048 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: "
    "1.893 | TFLOPs: 78.77 |"),
    (" iteration     5428/  250000 | consumed samples:        43424 | consumed tokens:     88932352 | elapsed time per "
    "iteration (ms): 4229.2 | learning rate: 2.999E-04 | global batch size:     8 | loss scale: 1.0 | grad norm: nan | "
    "actual seqlen:  2048 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: "
    "1.892 | TFLOPs: 78.71 |"),
]
# https://github.com/epfLLM/Megatron-LLM/issues/33 (Megatron-LLM): two healthy iterations
_MEGATRON_HEALTHY = [
    ("iteration     3383/    8000 | consumed samples:       216512 | elapsed time per iteration (ms): 7613.1 | "
    "learning rate: 6.680E-06 | global batch size:    64 | lm loss: 7.334521E-01 | loss scale: 1.0 | grad norm: 0.752 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 |"),
    ("iteration     3384/    8000 | consumed samples:       216576 | elapsed time per iteration (ms): 7845.5 | "
    "learning rate: 6.678E-06 | global batch size:    64 | lm loss: 7.072597E-01 | loss scale: 1.0 | grad norm: 0.741 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 |"),
]


def test_megatron_nan_grad_norm_on_three_iterations_is_non_finite_loss_at_the_first(tmp_path):
    report = _analyze(tmp_path, "train.log", *_MEGATRON_NAN_NORM)
    assert report["verdict"]["signature"] == "non-finite-loss"
    assert "at step 5426" in _finding(report, "non-finite-loss")["summary"]


def test_megatron_nan_iteration_counter_above_zero_is_non_finite_loss(tmp_path):
    # No public log with a non-zero counter was found: this is the healthy line 3384 with the
    # counter as Megatron-LM's training_log format string prints a count of 1
    # (' number of nan iterations: {:3d} |', megatron/training/training.py).
    line = _MEGATRON_HEALTHY[1].replace("number of nan iterations:   0", "number of nan iterations:   1")
    report = _analyze(tmp_path, "train.log", _MEGATRON_HEALTHY[0], line)
    assert report["verdict"]["signature"] == "non-finite-loss"
    assert "at step 3384" in _finding(report, "non-finite-loss")["summary"]


def test_megatrons_nan_check_in_the_local_grad_norm_that_raised_is_non_finite_loss(tmp_path):
    # alibaba/Pai-Megatron-Patch#60 (Megatron's check_for_nan_in_grad asserting in the backward pass;
    # node name re-rendered): an explicit non-finite check that raised, not a rank that merely crashed.
    report = _analyze(tmp_path, "train.log", "Traceback (most recent call last):",
                      "    assert not total_norm.isnan(), (",
                      "AssertionError: Rank 3: found NaN in local grad norm in backwards pass. Device: 3, node: node01")
    assert report["verdict"]["signature"] == "non-finite-loss"


def test_megatron_healthy_iterations_are_not_a_finding(tmp_path):
    assert _finding(_analyze(tmp_path, "train.log", *_MEGATRON_HEALTHY), "non-finite-loss") is None


def test_torchtitan_step_line_gives_its_step_and_peak_memory(tmp_path):
    # https://github.com/pytorch/torchtitan/pull/3393
    got = _lines(tmp_path, "[rank0]:[titan] 2026-05-18 16:08:16,958 - root - INFO - step: 54  loss:  2.77350  "
                           "grad_norm:  0.5348  memory:  9.46GiB(64.99%)  tps: 7,084  tflops: 0.51  mfu: 0.16%")
    row = got["memory"].row(0, named=True)
    assert row["step"] == 54 and row["rank"] == 0 and row["peak_reserved"] == round(9.46 * 2**30)


# ---------------------------------------------------------------- memory in other wordings


def test_old_megatron_report_memory_with_cached_gives_all_four_figures(tmp_path):
    # https://github.com/facebookresearch/higher/issues/6 (Megatron's report_memory before "reserved")
    got = _lines(tmp_path, "memory (MB) | allocated: 678.73095703125 | max allocated: 678.73095703125 | "
                           "cached: 734.0 | max cached: 734.0")
    row = got["memory"].row(0, named=True)
    assert row["allocated"] == round(678.73095703125 * 2**20) and row["reserved"] == 734 * 2**20
    assert row["peak_allocated"] == round(678.73095703125 * 2**20) and row["peak_reserved"] == 734 * 2**20


def test_bare_allocated_and_reserved_with_a_unit_are_figures(tmp_path):
    # https://github.com/pytorch/torchtitan/issues/979
    row = _lines(tmp_path, "allocated: 31894.55 MB, reserved: 58676.00 MB")["memory"].row(0, named=True)
    assert row["allocated"] == round(31894.55 * 2**20) and row["reserved"] == 58676 * 2**20


def test_cuda_memory_call_with_a_device_index_gives_that_device(tmp_path):
    # https://github.com/NVlabs/nvdiffrast/issues/23
    rows = _lines(tmp_path, "torch.cuda.memory_allocated(0) 318986240", "torch.cuda.memory_reserved(1) 608174080",
                  "torch.cuda.max_memory_allocated(0) 685223936")["memory"].sort("line_no")
    assert rows.select("device", "allocated", "reserved", "peak_allocated").rows() == [
        (0, 318986240, None, None), (1, None, 608174080, None), (0, None, None, 685223936)]


def test_nvidia_smi_figures_are_device_memory_of_their_own_source(tmp_path):
    rows = _lines(
        tmp_path,
        "nvidia-smi GPU-1 memory (MB) 1494",  # https://github.com/NVlabs/nvdiffrast/issues/23
        # https://github.com/GopeedLab/gopeed/issues/1339 (nvidia-smi 570.211.01's table)
        "|  0%   31C    P0             70W /  300W |    3446MiB /  46068MiB |      0%      Default |",
    )["memory"].sort("line_no")
    assert set(rows["source"]) == {"nvidia-smi"}
    assert rows.select("device", "reserved", "allocated").rows() == [(1, 1494 * 2**20, None), (None, 3446 * 2**20, None)]


# ---------------------------------------------------------------- a short series


def test_four_points_count_only_when_each_rises_and_the_last_doubles_the_first():
    pts = lambda ys: [{"value": y} for y in ys]
    assert _few_but_steep(pts([678.7, 1357.5, 12340.3, 23322.6]))  # higher#6's report_memory() figures
    assert not _few_but_steep(pts([400.0, 900.0, 900.0, 900.0]))  # a warm-up: optimizer state, then flat
    assert not _few_but_steep(pts([1000.0, 1100.0, 1200.0, 1300.0]))  # rising, but not doubling
    assert not _few_but_steep(pts([100.0, 300.0, 900.0]))  # three points are too few


# ---------------------------------------------------------------- nvidia-smi --query-gpu CSV

# Real nvidia-smi output pasted in a public repository's notes (found with the code index, which
# does not name the repository): two RTX 5080s, and one RTX 4090 queried with other fields.
_SMI_CSV = "index, memory.used [MiB], memory.total [MiB]\n0, 103 MiB, 16303 MiB\n1, 8311 MiB, 16303 MiB\n"
_SMI_CSV_FIELDS = ("utilization.gpu [%], memory.used [MiB], memory.total [MiB], name\n"
                   "0 %, 678 MiB, 49140 MiB, NVIDIA GeForce RTX 4090\n")


def test_nvidia_smi_csv_is_sniffed_by_its_header_and_not_taken_for_metrics():
    assert classify(_SMI_CSV.encode(), "gpu.log") == "nvidia_smi_csv"
    assert classify(_SMI_CSV_FIELDS.encode(), "gpu.csv") == "nvidia_smi_csv"
    assert classify(b"epoch,step,train_loss\n0,3,10.485387802124023\n", "gpu.csv") == "metrics_csv"


def test_nvidia_smi_csv_rows_are_each_devices_used_memory(tmp_path):
    path = tmp_path / "gpu.csv"
    path.write_text(_SMI_CSV)
    rows = _tables(path, nvidia_smi_csv)["memory"]
    assert rows.select("device", "reserved", "line_no", "source").rows() == [
        (0, 103 * 2**20, 2, "nvidia-smi"), (1, 8311 * 2**20, 3, "nvidia-smi")]
    assert rows["rank"].null_count() == rows.height  # a device is not a rank


def test_deepspeed_timer_line_gives_global_step_and_both_allocated_figures(tmp_path):
    # DeepSpeed's engine timer (timer.py:260), as pasted in a public repository's training notes
    # (found with the code index): micro_step is not the step, global_step is
    row = _lines(tmp_path, "[2024-08-15 21:12:21,418] [INFO] [timer.py:260:stop] epoch=0/micro_step=1200/global_step=600, "
                           "RunningAvgSamplesPerSec=51.18608989565034, CurrSamplesPerSec=56.79136995208808, "
                           "MemAllocated=15.78GB, MaxMemAllocated=43.28GB")["memory"].row(0, named=True)
    assert row["step"] == 600
    assert row["allocated"] == round(15.78 * 2**30) and row["peak_allocated"] == round(43.28 * 2**30)

"""The TORCH_LOGS parser (parsers/dynamo.py) on real lines: the project's own sample runs
(torch 2.13.0+cpu), and lines older PyTorch versions printed, quoted from PyTorch's tracker.

No older torch could be installed here to print them again: the package registry offers
CPU-only wheels of 2.13 alone, and the CUDA wheels of 2.1-2.5 are several GB each. So the
older wordings below are verbatim lines from users' logs in pytorch/pytorch issues, each
named where it is used.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postmortem.parsers import dynamo, textlog
from postmortem.parsers.lines import read_line_chunks
from postmortem.parsers.source import Source

TRAIN = Path(__file__).resolve().parent.parent / "sample_logs" / "generate" / "train.py"


def train_line(text: str, after: str | None = None) -> int:
    """The line of train.py (which made the samples) holding ``text``, after the line holding ``after``."""
    lines = TRAIN.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines[start:], start) if text in line) + 1


def user_line(sample_dir: Path) -> str:
    return json.loads((sample_dir / "expected.json").read_text())["user_line"]


def rank_file(sample_dir: Path, rank: int, stream: str = "stderr") -> Path:
    (path,) = sample_dir.glob(f"logs/*/attempt_0/{rank}/{stream}.log")
    return path


def compiles_of(path: Path, rank: int | None = None) -> pl.DataFrame:
    source = Source(path=path, name=path.name, kind="text_log", rank=rank, year=2026)
    frames = [df for table, df in textlog.parse(source) if table == "compiles"]
    return pl.concat(frames) if frames else pl.DataFrame()


def write_log(tmp_path: Path, text: str, name: str = "rank0.log") -> Path:
    path = tmp_path / name
    path.write_text(text.lstrip("\n"))
    return path


def attrs(row: dict) -> dict:
    return json.loads(row["attrs"] or "{}")


# ------------------------------------------------------------------ the project's own runs (torch 2.13)


def test_each_recompile_is_one_row_with_its_compile_id_guard_class_and_value(sample):
    rows = compiles_of(rank_file(sample("recompile_limit"), 0), rank=0).filter(pl.col("event") == "recompile")
    frame = rows["frame_id"][0]
    assert rows["attempt"].to_list() == [f"{frame}/{i}" for i in range(1, 9)]
    first = rows.row(0, named=True)
    assert first["function"] == "forward" and first["code_file"].endswith("generate/train.py")
    assert first["code_line"] == train_line("def forward", after="class MLP") and first["rank"] == 0
    assert first["frame_id"] == int(first["attempt"].split("/")[0])
    assert first["reason"] == "scale == 1.0" and first["reason_class"] == "python_scalar"
    # The guarded line, from the reason's user stack: where the logs point (expected.json's user_line).
    assert first["user_frame"].endswith(user_line(sample("recompile_limit")))
    assert attrs(first) == {"cache_entry": f"{frame}/0", "failures": 1, "guard": "scale", "expected": "1.0"}
    # Each recompile lists every rejected cache entry, newest first; the newest one leads.
    last = rows.row(-1, named=True)
    assert last["reason"] == "scale == 1.07" and attrs(last)["failures"] == 8
    assert rows["source"].unique().to_list() == ["torch_logs"]


def test_the_limit_hit_names_the_frame_the_limit_and_the_users_line(sample):
    (hit,) = compiles_of(rank_file(sample("recompile_limit"), 1), rank=1).filter(
        pl.col("event") == "limit_hit").iter_rows(named=True)
    assert hit["attempt"].endswith("/8") and hit["rank"] == 1
    assert (hit["function"], hit["code_line"]) == ("forward", train_line("def forward", after="class MLP"))
    assert hit["reason"] == "scale == 1.07" and hit["reason_class"] == "python_scalar"
    assert hit["user_frame"].endswith(user_line(sample("recompile_limit")))
    assert attrs(hit)["limit_type"] == "recompile_limit" and attrs(hit)["limit"] == 8


def test_graph_breaks_keep_the_users_line_and_ddp_breaks_are_framework_internal(sample):
    rows = compiles_of(rank_file(sample("graph_breaks"), 0), rank=0).filter(pl.col("event") == "graph_break")
    ddp = rows.filter(pl.col("attempt") == "0/0").row(0, named=True)
    assert ddp["code_file"].endswith("torch/nn/parallel/distributed.py") and ddp["framework"] == "ddp"
    call = f"train.py:{train_line('out = cmodel(x, loss_scale_for(step))')}"
    assert ddp["user_frame"].endswith(call)  # the user's call into the DDP module
    assert ddp["reason"].startswith("Unsupported method call: Dynamo does not know how to trace method")
    item = rows.filter(pl.col("attrs").str.contains('"gb": "gb0124"')).row(0, named=True)
    planted = user_line(sample("graph_breaks"))
    assert item["framework"] is None and item["user_frame"].endswith(planted)
    assert (item["code_line"], item["function"]) == (int(planted.split(":")[1]), "forward")
    assert item["reason"].startswith("Unsupported Tensor.item() call with capture_scalar_outputs=False")
    assert "capture_scalar_outputs = True" in attrs(item)["hints"][0]
    branch = rows.filter(pl.col("reason").str.starts_with("Data-dependent branching")).row(0, named=True)
    assert branch["user_frame"].endswith(f"train.py:{int(planted.split(':')[1]) + 2}")  # the `if` two lines on
    # The duplicate of a break already shown has no traceback: still not the user's code.
    suppressed = rows.filter(pl.col("attempt") == "2/0").row(0, named=True)
    assert attrs(suppressed)["suppressed"] is True and suppressed["framework"] is not None


def test_the_tensor_item_warning_is_a_graph_break_at_the_users_line(sample):
    rows = compiles_of(rank_file(sample("graph_breaks"), 1), rank=1)
    (warning,) = rows.filter(pl.col("attrs").str.contains('"kind": "item_warning"')).iter_rows(named=True)
    assert warning["event"] == "graph_break"
    assert warning["user_frame"].endswith(user_line(sample("graph_breaks"))) and warning["framework"] is None
    assert "torch._dynamo.config.capture_scalar_outputs = True" in attrs(warning)["hints"]


def test_resumed_code_recompiles_on_the_value_that_crossed_the_break(sample):
    rows = compiles_of(rank_file(sample("graph_breaks"), 0), rank=0).filter(pl.col("event") == "recompile")
    line = user_line(sample("graph_breaks")).split(":")[1]
    assert rows["function"].unique().to_list() == [f"torch_dynamo_resume_in_forward_at_{line}"]
    assert set(rows["reason_class"]) == {"python_scalar"}
    assert all(a["guard"] == "___stack0" for a in map(attrs, rows.iter_rows(named=True)))


def test_console_copies_of_ranks_with_their_own_files_are_not_counted_twice(sample):
    from postmortem import api

    con, run_id, _ = api.load(sample("recompile_limit"))
    per_file = con.execute(
        "SELECT file, count(*) FROM compiles WHERE run_id = ? AND source = 'torch_logs' GROUP BY file", [run_id]
    ).fetchall()
    assert {f.rsplit("/", 2)[-2] for f, _ in per_file} == {"0", "1"}  # stderr of each rank, not console.log


def test_blocks_cut_by_a_chunk_boundary_give_the_same_rows(sample, monkeypatch):
    path = rank_file(sample("graph_breaks"), 0)
    whole = compiles_of(path, rank=0)
    monkeypatch.setattr(textlog, "read_line_chunks", functools.partial(read_line_chunks, chunk_bytes=4096))
    cut = compiles_of(path, rank=0)
    assert cut.drop("ts").sort("line_no").equals(whole.drop("ts").sort("line_no"))


# ------------------------------------------------------------------ older PyTorch wordings (real lines)


def test_cache_size_limit_wording_of_torch_2_5(tmp_path):
    # pytorch/pytorch#139474 (torch 2.5, 8 ranks); the first three lines end rank 6's block.
    log = write_log(tmp_path, """
[rank6]:W1101 02:43:39.336000 143 site-packages/torch/_dynamo/convert_frame.py:896] [1/64]    last reason: 1/0: tensor 'L['images']' size mismatch at index 2. expected 1696, actual 1248
[rank6]:W1101 02:43:39.336000 143 site-packages/torch/_dynamo/convert_frame.py:896] [1/64] To log all recompilation reasons, use TORCH_LOGS="recompiles".
[rank6]:W1101 02:43:39.336000 143 site-packages/torch/_dynamo/convert_frame.py:896] [1/64] To diagnose recompilation issues, see https://pytorch.org/docs/main/torch.compiler_troubleshooting.html.
[rank3]:W1101 02:43:40.706000 140 site-packages/torch/_dynamo/convert_frame.py:896] [1/64] torch._dynamo hit config.cache_size_limit (64)
[rank3]:W1101 02:43:40.706000 140 site-packages/torch/_dynamo/convert_frame.py:896] [1/64]    function: 'forward' (/workspace/modeling/decoder/detail_capture.py:131)
[rank3]:W1101 02:43:40.706000 140 site-packages/torch/_dynamo/convert_frame.py:896] [1/64]    last reason: 1/0: tensor 'L['images']' size mismatch at index 2. expected 1696, actual 1248
""", name="console.log")
    (hit,) = compiles_of(log).iter_rows(named=True)  # rank 6's tail has no start: not a record
    assert (hit["event"], hit["rank"], hit["attempt"], hit["frame_id"]) == ("limit_hit", 3, "1/64", 1)
    assert (hit["function"], hit["code_file"], hit["code_line"]) == (
        "forward", "/workspace/modeling/decoder/detail_capture.py", 131)
    assert hit["reason_class"] == "shape"
    assert attrs(hit) == {"cache_entry": "1/0", "guard": "images", "expected": "1696", "actual": "1248", "dim": 2,
                          "limit_type": "cache_size_limit", "limit": 64}
    assert str(hit["ts"]) == "2026-11-01 02:43:40.706000"


def test_torch_2_1_header_and_reasons_without_a_cache_entry(tmp_path):
    # pytorch/pytorch#114293 (November 2023, torch 2.1): Python logging's own header.
    log = write_log(tmp_path, """
[2023-11-21 19:02:13,073] torch._dynamo.guards.__recompiles: [DEBUG] Recompiling function accumulate in <ipython-input-6-4764417fa0ae>:6
[2023-11-21 19:02:13,073] torch._dynamo.guards.__recompiles: [DEBUG]     triggered by the following guard failure(s):
[2023-11-21 19:02:13,073] torch._dynamo.guards.__recompiles: [DEBUG]     - L['end'] == 10                                                # for i in range(start+1, end):  # <ipython-input-6-4764417fa0ae>:9 in accumulate
""")
    (row,) = compiles_of(log, rank=0).iter_rows(named=True)
    assert (row["event"], row["function"], row["code_line"]) == ("recompile", "accumulate", 6)
    assert row["reason"] == "L['end'] == 10" and row["reason_class"] == "python_scalar"
    assert attrs(row)["guard"] == "end" and attrs(row)["expected"] == "10"
    assert row["user_frame"] == "<ipython-input-6-4764417fa0ae>:9"
    assert str(row["ts"]) == "2023-11-21 19:02:13.073000"


def test_torch_2_3_recompiles_without_a_compile_id(tmp_path):
    # pytorch/pytorch#123784 (April 2024): no [0/1] before the artifact.
    log = write_log(tmp_path, """
V0410 16:18:11.049000 139689102684672 torch/_dynamo/guards.py:2199] [__recompiles] Recompiling function fn in /home/dberard/local/scripts/global_recompile.py:3
V0410 16:18:11.049000 139689102684672 torch/_dynamo/guards.py:2199] [__recompiles]     triggered by the following guard failure(s):
V0410 16:18:11.049000 139689102684672 torch/_dynamo/guards.py:2199] [__recompiles]     - ___check_global_state()
""")
    (row,) = compiles_of(log, rank=2).iter_rows(named=True)
    assert (row["event"], row["rank"], row["attempt"], row["function"]) == ("recompile", 2, None, "fn")
    assert row["reason_class"] == "global_state"


def test_torch_2_0_single_line_recompile(tmp_path):
    # pytorch/pytorch#99091 (April 2023, torch 2.0).
    log = write_log(tmp_path, """
[2023-04-13 21:42:57,808] torch._dynamo.convert_frame.__recompiles: [DEBUG] ('Recompiling function step in /home/ubuntu/dynamax/dynamax/linear_gaussian_ssm/demos/kf_linreg_jax_vs_pt.py', "triggered by the following guard failure: L['t'] == 0")
""")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert (row["function"], row["reason"], row["reason_class"]) == ("step", "L['t'] == 0", "python_scalar")


@pytest.mark.parametrize("guard, cls, info", [
    # torch 2.13.0+cpu (this project's runs and a run made to see each guard kind)
    ("scale == 1.0", "python_scalar", {"guard": "scale", "expected": "1.0"}),
    ("___stack0 == 20.59107208251953", "python_scalar", {"guard": "___stack0"}),
    ("tensor 'x' size mismatch at index 0. expected 4, actual 5", "shape", {"guard": "x", "dim": 0, "actual": "5"}),
    ("tensor 'x' rank mismatch. expected 1, actual 2", "shape", {"guard": "x"}),
    ("tensor 'x' dtype mismatch. expected Float, actual Double", "dtype", {"expected": "Float", "actual": "Double"}),
    ("GLOBAL_STATE changed: grad_mode", "global_state", {"guard": "grad_mode"}),
    ("___check_type_id(scale, 139729027038432), type=<class 'int'>", "type_id", {"guard": "scale", "expected": "int"}),
    # pytorch/pytorch#127483 (torch 2.4), #161119 (2.8), #154707 (an empty reason)
    ("L['self'].mode == 2", "python_scalar", {"guard": "self.mode", "expected": "2"}),
    ("tensor 'hidden_states' size mismatch at index 0. expected 1, actual 22", "shape", {"guard": "hidden_states"}),
    ("", "other", {}),
])
def test_guard_failures_are_classified(guard, cls, info):
    got_cls, got = dynamo.classify_guard(guard)
    assert got_cls == cls
    assert {k: got.get(k) for k in info} == info


def test_guard_dumps_are_counted_by_kind_and_the_fullgraph_error_is_a_failure(tmp_path):
    # A real torch 2.13.0+cpu run with TORCH_LOGS="guards" and torch.compile(fullgraph=True) on a
    # function calling torch._dynamo.graph_break().
    log = write_log(tmp_path, """
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4786] [0/0] [__guards] GUARDS:
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] 
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] TREE_GUARD_MANAGER:
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] +- RootGuardManager
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] | +- TORCH_FUNCTION_MODE_STACK: ___check_torch_function_mode_stack()
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] | +- DEFAULT_DEVICE: utils_device.CURRENT_DEVICE == None                           # _dynamo/output_graph.py:1122 in init_ambient_guards
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] | +- GuardManager: source=L['x'], accessed_by=FrameLocalsGuardAccessor(key='x', framelocals_idx=0), type=<class 'torch.Tensor'>, tag_safe=(False, False)
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] | | +- DIMENSION_DYNAMIC_MARKING_GUARD: hasattr(L['x'], '_dynamo_dynamic_indices') == False           # return (x * scale).sum()  # mk/gen.py:4 in f
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] | | +- DIMENSION_DYNAMIC_MARKING_GUARD: hasattr(L['x'], '_dynamo_weak_dynamic_indices') == False      # return (x * scale).sum()  # mk/gen.py:4 in f
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] | +- GuardManager: source=L['scale'], accessed_by=FrameLocalsGuardAccessor(key='scale', framelocals_idx=1), type=<class 'float'>, tag_safe=(False, False)
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] | | +- EQUALS_MATCH: L['scale'] == 0.5                                             # return (x * scale).sum()  # mk/gen.py:4 in f
V1129 14:49:42.310000 31904 torch/_dynamo/guards.py:4483] [0/0] [__guards] 
V1129 14:49:42.331000 31904 torch/_dynamo/guards.py:4519] [0/0] [__guards] Guard eval latency = 42.24 us
I1129 14:49:42.481000 31904 torch/_dynamo/symbolic_convert.py:5335] [1/0] Step 1: torchdynamo start tracing g /tmp/mk/gen.py:13
Traceback (most recent call last):
  File "/tmp/mk/gen.py", line 17, in <module>
    torch.compile(g, fullgraph=True, backend="eager")(torch.randn(3))
  File "/tmp/torchvenv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 1177, in compile_wrapper
    raise e.with_traceback(
torch._dynamo.exc.Unsupported: Call to `torch._dynamo.graph_break()`
  Explanation: User-inserted graph break. Message: None
  Hint: Remove the `torch._dynamo.graph_break()` call.

  Developer debug context: Called `torch._dynamo.graph_break()` with args `[]`, kwargs `{}`

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0025.html

from user code:
   File "/tmp/mk/gen.py", line 14, in g
    torch._dynamo.graph_break()

Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're reporting a bug to PyTorch). For even more developer context, set TORCH_LOGS="+dynamo"
""")
    rows = compiles_of(log, rank=0)
    guards = rows.filter(pl.col("attempt") == "0/0").row(0, named=True)
    assert guards["event"] == "compile"
    assert attrs(guards)["guards"] == 5
    assert attrs(guards)["guard_kinds"] == {"TORCH_FUNCTION_MODE_STACK": 1, "DEFAULT_DEVICE": 1,
                                            "DIMENSION_DYNAMIC_MARKING_GUARD": 2, "EQUALS_MATCH": 1}
    start = rows.filter(pl.col("attempt") == "1/0").row(0, named=True)
    assert (start["event"], start["function"], start["code_line"]) == ("compile", "g", 13)
    (failure,) = rows.filter(pl.col("event") == "failure").iter_rows(named=True)
    assert failure["reason"] == ("Unsupported: Call to `torch._dynamo.graph_break()` "
                                 "(User-inserted graph break. Message: None)")
    assert failure["user_frame"] == "/tmp/mk/gen.py:14" and failure["function"] == "g"
    assert attrs(failure)["exception_type"] == "torch._dynamo.exc.Unsupported"


def test_a_logged_limit_traceback_at_info_level_is_not_a_failure(tmp_path):
    # torch 2.13 with TORCH_LOGS="+dynamo" logs the limit's Unsupported at INFO: nothing was raised.
    log = write_log(tmp_path, """
I1129 14:49:42.479000 31904 torch/_dynamo/convert_frame.py:2413] torch._dynamo.exc.Unsupported: Dynamo recompile limit exceeded
I1129 14:49:42.479000 31904 torch/_dynamo/convert_frame.py:2413]   Explanation: Dynamo attempted to recompile the code object too many times, exceeding the recompile_limit cache size limit (currently set to 3).
""")
    assert compiles_of(log, rank=0).is_empty()


# ------------------------------------------------------------------ lines of tests/realworld (public threads)


def test_the_limit_message_quoted_without_its_log_header_is_a_limit_hit(tmp_path):
    # mstar-project/mstar#167 (torch 2.13): the issue quotes the message alone; a sentence that only
    # mentions the limit is not one.
    log = write_log(tmp_path, """
torch._dynamo hit config.recompile_limit (8)
We never hit config.recompile_limit (8) before the upgrade.
""")
    (hit,) = compiles_of(log).iter_rows(named=True)
    assert (hit["event"], hit["function"], hit["line_no"]) == ("limit_hit", None, 1)
    assert attrs(hit)["limit_type"] == "recompile_limit" and attrs(hit)["limit"] == 8


def test_torch_2_0_limit_hit_takes_its_unprefixed_function_and_reasons_lines(tmp_path):
    # pytorch/torchdynamo#1955 (Dec 2022): only the first line carries the logging header.
    log = write_log(tmp_path, """
[2022-12-22 03:54:03,390] torch._dynamo.convert_frame: [WARNING] torch._dynamo hit config.cache_size_limit (64)
   function: 'run' (<ipython-input-3-d766d9f4b6a6>:5)
   reasons:  set(kwargs.keys()) == {'output_attentions', 'return_dict', 'input_features', 'output_hidden_states'}
to diagnose recompilation issues, see https://github.com/pytorch/torchdynamo/blob/main/TROUBLESHOOTING.md.
[2022-12-22 03:54:12,536] torch._dynamo.convert_frame: [WARNING] torch._dynamo hit config.cache_size_limit (64)
   function: 'forward' (/root/anaconda3/envs/whisper_kernl/lib/python3.9/site-packages/transformers/models/whisper/modeling_whisper.py:861)
   reasons:  ___check_obj_id(past_key_values, 94636661886208)
to diagnose recompilation issues, see https://github.com/pytorch/torchdynamo/blob/main/TROUBLESHOOTING.md.
   function: 'not_this' (/far/away.py:1)
""")
    first, second = compiles_of(log).iter_rows(named=True)
    assert (first["event"], first["function"], first["code_file"], first["code_line"]) == (
        "limit_hit", "run", "<ipython-input-3-d766d9f4b6a6>", 5)
    assert first["reason"].startswith("set(kwargs.keys()) == {'output_attentions'")
    assert attrs(first)["limit_type"] == "cache_size_limit" and attrs(first)["limit"] == 64
    assert (second["function"], second["code_line"], second["reason_class"]) == ("forward", 861, "type_id")
    assert attrs(second)["guard"] == "past_key_values"


def test_one_recompile_record_keeps_its_compile_id_as_the_frames_recompile_count(tmp_path):
    # huggingface/diffusers#11970: a single [1/37] record listing the cache entries it rejected.
    log = write_log(tmp_path, """
V0721 23:40:59.397000 2159156 torch/_dynamo/guards.py:3006] [1/37] [__recompiles] Recompiling function forward in /home/user/work/diffusers/src/diffusers/models/transformers/transformer_flux.py:381
V0721 23:40:59.397000 2159156 torch/_dynamo/guards.py:3006] [1/37] [__recompiles]     triggered by the following guard failure(s):
V0721 23:40:59.397000 2159156 torch/_dynamo/guards.py:3006] [1/37] [__recompiles]     - 1/36: ___check_obj_id(self._modules['attn'].processor, 140462015041104)
V0721 23:40:59.397000 2159156 torch/_dynamo/guards.py:3006] [1/37] [__recompiles]     - 1/35: ___check_obj_id(self._modules['attn'].processor, 140462015040240)
""")
    (row,) = compiles_of(log, rank=0).iter_rows(named=True)
    assert (row["event"], row["attempt"], row["frame_id"], row["function"], row["code_line"]) == (
        "recompile", "1/37", 1, "forward", 381)
    assert row["reason_class"] == "type_id" and attrs(row)["cache_entry"] == "1/36" and attrs(row)["failures"] == 2


def test_rank_prefixed_recompiles_of_a_torchrun_console_are_each_ranks(tmp_path):
    # pytorch/pytorch#138813 (torch 2.5, FSDP): rank 0's record starts before the excerpt.
    log = write_log(tmp_path, """
[rank0]:V1024 16:27:53.546000 1770485 site-packages/torch/_dynamo/guards.py:2813] [1/4] [__recompiles]     - 1/0: tensor 'L['x']' size mismatch at index 1. expected 128, actual 1024
[rank1]:V1024 16:27:53.910000 1770486 site-packages/torch/_dynamo/guards.py:2813] [1/4] [__recompiles] Recompiling function forward in /home/user/compile_debug.py:150
[rank1]:V1024 16:27:53.910000 1770486 site-packages/torch/_dynamo/guards.py:2813] [1/4] [__recompiles]     triggered by the following guard failure(s):
[rank1]:V1024 16:27:53.910000 1770486 site-packages/torch/_dynamo/guards.py:2813] [1/4] [__recompiles]     - 1/3: tensor 'L['x']' size mismatch at index 1. expected 512, actual 1024
""", name="console.log")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert (row["rank"], row["attempt"], row["code_file"], row["code_line"]) == (1, "1/4", "/home/user/compile_debug.py", 150)
    assert row["reason_class"] == "shape" and attrs(row)["guard"] == "x" and attrs(row)["actual"] == "1024"


def test_the_unsupported_builtin_warning_is_a_graph_break_of_the_user(tmp_path):
    # pytorch/pytorch#133185: the Python warning dynamo's warn_once prints (the location is dynamo's own line).
    log = write_log(tmp_path, """
/opt/conda/envs/monodle/lib/python3.11/site-packages/torch/_dynamo/variables/functions.py:663: UserWarning: Graph break due to unsupported builtin sys.audit. This function is either a Python builtin (e.g. _warnings.warn) or a third-party C/C++ Python extension (perhaps created with pybind). If it is a Python builtin, please file an issue on GitHub so the PyTorch team can add support for it and see the next case for a workaround. If it is a third-party C/C++ Python extension, please either wrap it into a PyTorch-understood custom operator (see https://pytorch.org/tutorials/advanced/custom_ops_landing_page.html for more details) or, if it is traceable, use torch.compiler.allow_in_graph.
  torch._dynamo.utils.warn_once(msg)
/opt/conda/envs/monodle/lib/python3.11/site-packages/torch/_dynamo/variables/functions.py:700: UserWarning: something else dynamo warns about
""")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert row["event"] == "graph_break" and row["reason"] == "Graph break due to unsupported builtin sys.audit"
    assert row["framework"] is None and row["code_file"] is None  # the call is the user's, wherever it is
    assert attrs(row)["hints"][0].endswith("use torch.compiler.allow_in_graph")


def test_explain_break_reasons_are_graph_breaks_at_the_users_line(tmp_path):
    # NVIDIA/TransformerEngine#705 (torch 2.1.2): torch._dynamo.explain() printed; the stack ends
    # in nn.Module's call dispatch, calling a module dynamo skips.
    log = write_log(tmp_path, """
  Break Reason 148:
    Reason: inline in skipfiles: Linear.forward  | _fn /mnt/main0/home/user/micromamba/envs/testenv/lib/python3.10/site-packages/torch/_dynamo/eval_frame.py
    User Stack:
      <FrameSummary file /mnt/main0/home/user/testenv/projects/esm3/oss/attention.py, line 67 in <resume in forward>>
      <FrameSummary file /mnt/main0/home/user/micromamba/envs/testenv/lib/python3.10/site-packages/torch/nn/modules/module.py, line 1527 in _call_impl>
  Break Reason 149:
    Reason: inline in skipfiles: LayerNormMLP.forward  | _fn /mnt/main0/home/user/micromamba/envs/testenv/lib/python3.10/site-packages/torch/_dynamo/eval_frame.py
    User Stack:
      <FrameSummary file /mnt/main0/home/user/testenv/projects/esm3/oss/blocks.py, line 32 in <resume in forward>>
      <FrameSummary file /mnt/main0/home/user/micromamba/envs/testenv/lib/python3.10/site-packages/torch/nn/modules/module.py, line 1527 in _call_impl>
""", name="explain.txt")
    first, second = compiles_of(log).iter_rows(named=True)
    assert first["event"] == "graph_break" and first["reason"].startswith("inline in skipfiles: Linear.forward")
    assert first["user_frame"] == "/mnt/main0/home/user/testenv/projects/esm3/oss/attention.py:67"
    assert first["framework"] is None and attrs(first)["explain"] == 148 and attrs(first)["frames"] == 2
    assert second["user_frame"].endswith("oss/blocks.py:32") and second["reason"].startswith("inline in skipfiles: LayerNormMLP")


def test_explain_of_torch_2_2_and_later_lists_traceback_frames(tmp_path):
    # The same printout from torch 2.2 on (torch/_dynamo/backends/debugging.py: traceback.format_list).
    log = write_log(tmp_path, """
  Break Reason 1:
    Reason: builtin: print [<class 'torch._dynamo.variables.constant.ConstantVariable'>] False
    User Stack:
  File "/home/user/toy.py", line 6, in toy_example
    print("woo")
""")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert row["user_frame"] == "/home/user/toy.py:6" and row["function"] == "toy_example"


def test_a_tail_only_backend_failure_is_one_failure_with_its_cause(tmp_path):
    # apple/ml-cross-entropy#41: the traceback's head was not pasted; the cause is on the next line.
    log = write_log(tmp_path, """
  File "/home/user/repos/praxis/.venv/lib/python3.13/site-packages/torch/_inductor/scheduler.py", line 3428, in create_backend
    raise RuntimeError(
torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:
RuntimeError: Found NVIDIA GeForce GTX 1070 which is too old to be supported by the triton GPU compiler, which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of CUDA capability 6.1

Set TORCH_LOGS="+dynamo" and TORCHDYNAMO_VERBOSE=1 for more information
""")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert row["event"] == "failure" and attrs(row)["exception_type"] == "torch._dynamo.exc.BackendCompilerFailed"
    assert row["reason"].startswith("BackendCompilerFailed: backend='inductor' raised: RuntimeError: Found NVIDIA GeForce GTX 1070")


def test_inductors_too_old_gpu_error_alone_is_a_compile_failure(tmp_path):
    # karpathy/nanoGPT#157: only the last line was pasted (torch/_inductor/scheduler.py's message).
    log = write_log(tmp_path, """
RuntimeError: Found NVIDIA GeForce GTX 1080 which is too old to be supported by the triton GPU compiler, which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of CUDA capability 6.1
RuntimeError: some other error of the user's
""")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert row["event"] == "failure" and attrs(row) == {"exception_type": "RuntimeError", "raised_by": "inductor"}


def test_a_bare_unsupported_is_dynamos_only_with_the_text_dynamo_appends(tmp_path):
    # pytorch/pytorch#108650 (torch 2.1 nightly): the class name without its module, then dynamo's
    # "from user code:" and suppress_errors footer. The second block (ours) lacks them: not dynamo's.
    log = write_log(tmp_path, """
Unsupported: inline in skipfiles: Logger.info  | info /usr/lib/python3.10/logging/__init__.py

from user code:
   File "/usr/local/lib/python3.10/dist-packages/diffusers/models/unet_2d_condition.py", line 762, in forward
    logger.info("Forward upsample size to force interpolation output size.")


You can suppress this exception and fall back to eager by setting:
    import torch._dynamo
    torch._dynamo.config.suppress_errors = True
""")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert row["event"] == "failure" and attrs(row)["exception_type"] == "torch._dynamo.exc.Unsupported"
    assert row["reason"] == "Unsupported: inline in skipfiles: Logger.info  | info /usr/lib/python3.10/logging/__init__.py"
    assert (row["function"], row["code_line"]) == ("forward", 762)
    other = write_log(tmp_path, "Unsupported: format version 3\nexiting\n", name="other.log")
    assert compiles_of(other).is_empty()


def test_fail_on_recompile_limit_is_a_limit_hit_and_a_failure(tmp_path):
    # pytorch/pytorch#167504: fullgraph=True turns the hit into FailOnRecompileLimitHit.
    log = write_log(tmp_path, """
W1110 17:56:13.321000 77473 torch/_dynamo/convert_frame.py:1550] [0/8] torch._dynamo hit config.recompile_limit (8)
W1110 17:56:13.321000 77473 torch/_dynamo/convert_frame.py:1550] [0/8]    function: 'forward' (/data/users/user/pytorch/test.py:30)
W1110 17:56:13.321000 77473 torch/_dynamo/convert_frame.py:1550] [0/8]    last reason: 0/7: ___check_type_id(self, 224599728)                        # a = self.net1(x)  # test.py:31 in forward

  File "/data/users/user/pytorch/torch/_dynamo/convert_frame.py", line 1567, in _compile
    raise FailOnRecompileLimitHit(
torch._dynamo.exc.FailOnRecompileLimitHit: recompile_limit reached with fullgraph=True.
""")
    rows = compiles_of(log, rank=0)
    assert rows["event"].to_list() == ["limit_hit", "failure"]
    failure = rows.row(1, named=True)
    assert failure["reason"] == "FailOnRecompileLimitHit: recompile_limit reached with fullgraph=True."


def test_a_failure_logged_under_suppress_errors_is_not_raised(tmp_path):
    # 2noise/ChatTTS#235: suppress_errors=True logs the backend failure as a WARNING; the frame runs eager.
    log = write_log(tmp_path, """
[2024-06-18 23:38:49,504] torch._dynamo.convert_frame: [WARNING]     raise RuntimeError(
[2024-06-18 23:38:49,504] torch._dynamo.convert_frame: [WARNING] torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:
[2024-06-18 23:38:49,504] torch._dynamo.convert_frame: [WARNING] RuntimeError: Found NVIDIA GeForce GTX TITAN X which is too old to be supported by the triton GPU compiler, which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of CUDA capability 5.2
""")
    assert compiles_of(log).filter(pl.col("event") == "failure").is_empty()


# ------------------------------------------------------------------ never raises


def test_the_tensor_item_warnings_tail_is_a_break_where_its_head_was_cut(tmp_path):
    # sgl-project/SpecForge#222: the PR quotes the warning from its second line on, so the block's
    # "Graph break from `Tensor.item()`" head is gone; its "Graph break: from user code at:" tail is the break.
    log = write_log(tmp_path, """
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0]     torch._dynamo.config.capture_scalar_outputs = True
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0] or:
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0]     env TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS=1
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0] to include these operations in the captured graph.
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0]
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0] Graph break: from user code at:
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0]   File "/home/user/SpecForge/.venv/lib/python3.12/site-packages/specforge/core/eagle3.py", line 789, in _compute_metric_acc
[rank1]:W0906 20:38:55.305000 5696 torch/_dynamo/variables/tensor.py:1047] [7/0]     ).sum().item() / (loss_mask.sum().item() + 1e-6)
""", name="console.log")
    (row,) = compiles_of(log).iter_rows(named=True)
    assert (row["event"], row["rank"], row["attempt"]) == ("graph_break", 1, "7/0")
    assert row["reason"] == "Graph break from `Tensor.item()`"
    assert (row["function"], row["code_line"]) == ("_compute_metric_acc", 789)
    # a third-party library's own line (no user frame below it) is not the standard library: the break is the user's
    assert row["framework"] is None


def test_the_tensor_item_warning_whole_is_one_break_not_two(tmp_path):
    # rusty1s/pytorch_scatter#457: head and tail of one warning, one record.
    log = write_log(tmp_path, """
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0] Graph break from `Tensor.item()`, consider setting:
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0]     torch._dynamo.config.capture_scalar_outputs = True
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0] or:
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0]     env TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS=1
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0] to include these operations in the captured graph.
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0] 
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0] Graph break: from user code at:
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0]   File "/workspaces/molcrafts/molpot/src/molpot/potential/base.py", line 32, in forward
W0811 21:16:49.580000 11928 torch/_dynamo/variables/tensor.py:776] [0/0]     inputs = module(inputs)
""")
    (row,) = compiles_of(log, rank=0).iter_rows(named=True)
    assert row["event"] == "graph_break" and attrs(row)["kind"] == "item_warning"
    assert row["user_frame"] == "/workspaces/molcrafts/molpot/src/molpot/potential/base.py:32"


def test_a_limit_hit_logged_on_windows_keeps_its_function_and_reason_lines(tmp_path):
    # deepbeepmeep/Wan2GP#653: the header's source path has backslashes.
    log = write_log(tmp_path, r"""
W0810 18:28:53.521000 10244 site-packages\torch\_dynamo\convert_frame.py:964] [2/256] torch._dynamo hit config.accumulated_recompile_limit (256)
W0810 18:28:53.521000 10244 site-packages\torch\_dynamo\convert_frame.py:964] [2/256]    function: 'check_empty_cuda_cache' (C:\Users\user\.conda\envs\Wan2GP\lib\site-packages\mmgp\offload.py:2261)
W0810 18:28:53.521000 10244 site-packages\torch\_dynamo\convert_frame.py:964] [2/256]    last reason: 2/255: len(args) == 1
""")
    (hit,) = compiles_of(log, rank=0).iter_rows(named=True)
    assert (hit["event"], hit["attempt"], hit["function"], hit["code_line"]) == (
        "limit_hit", "2/256", "check_empty_cuda_cache", 2261)
    assert hit["reason"] == "len(args) == 1"
    assert attrs(hit)["limit_type"] == "accumulated_recompile_limit" and attrs(hit)["limit"] == 256


def test_torchdynamos_first_limit_wording_of_2022(tmp_path):
    # pytorch/torchdynamo#330 (June 2022): one line, under Python logging's default format, cut by the paste.
    log = write_log(tmp_path, """
cuda eval  tacotron2                          WARNING:torchdynamo.convert_frame:torchdynamo hit recompilation cache limit (64) for function 'forward' (/home/user/torchbenchmark/torchbenchmark/models/tacotron2/model.py:381), due to the following guard failures: [['len(alignments) == 0'], ['len(alignments) == 0'], ['len(alignments) == 0'],
""")
    (hit,) = compiles_of(log, rank=0).iter_rows(named=True)
    assert (hit["event"], hit["function"], hit["code_line"]) == ("limit_hit", "forward", 381)
    assert hit["code_file"] == "/home/user/torchbenchmark/torchbenchmark/models/tacotron2/model.py"
    assert hit["reason"] == "len(alignments) == 0"
    assert attrs(hit)["limit_type"] == "cache_size_limit" and attrs(hit)["limit"] == 64


def test_the_compile_profilers_recompilation_table_gives_each_frames_count(tmp_path):
    # pytorch/pytorch#110803: torch._dynamo's CompileProfiler report, one row a frame.
    log = write_log(tmp_path, """
Recompilation
-------------
These subgraphs were recompiled more than once due to guard failures
Guard failures indicate some condition assumed to be static by the tracer changed,
making it unsafe to reuse the compiled program.

Function                        Recompiles  Recompile Reasons
----------------------------  ------------  ------------------------------
'forward' (2657887092.py:11)             8  __nn_module_guard_0(L['self'])
                                            __nn_module_guard_0(L['self'])
""")
    (row,) = compiles_of(log, rank=0).iter_rows(named=True)
    assert (row["event"], row["function"], row["code_file"], row["code_line"]) == (
        "recompile", "forward", "2657887092.py", 11)
    assert row["reason"] == "__nn_module_guard_0(L['self'])"
    assert attrs(row)["recompiles"] == 8 and attrs(row)["failures"] == 2


def test_an_ipython_traceback_names_the_dynamo_exception_on_its_first_line(tmp_path):
    # HomebrewML/HeavyBall#16 (torch 2.5 in Jupyter): the paste is cut before the exception's own last line.
    log = write_log(tmp_path, """
---------------------------------------------------------------------------
CacheLimitExceeded                        Traceback (most recent call last)
Cell In[21], line 5
      3 results = []
      4 for i in range(runs):
----> 5     result, stats = train_run(1e-3)
""")
    (row,) = compiles_of(log, rank=0).filter(pl.col("event") == "failure").iter_rows(named=True)
    assert attrs(row)["exception_type"] == "torch._dynamo.exc.CacheLimitExceeded"


def _sample_lines() -> list[str]:
    from .conftest import SAMPLES

    (path,) = (SAMPLES / "graph_breaks").glob("logs/*/attempt_0/0/stderr.log")
    return path.read_text().splitlines()[:330]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_real_dynamo_lines_never_raise(tmp_path, data):
    lines = _sample_lines()
    ops = data.draw(st.lists(st.tuples(st.sampled_from(["drop", "dup", "cut", "swap"]),
                                       st.integers(0, len(lines) - 1)), max_size=25))
    for op, i in ops:
        i %= max(len(lines), 1)
        if not lines:
            break
        if op == "drop":
            lines.pop(i)
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: len(lines[i]) // 2]
        elif op == "swap" and i + 1 < len(lines):
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
    path = tmp_path / "mutated.log"
    path.write_text("\n".join(lines))
    rows = compiles_of(path, rank=0)
    assert rows.is_empty() or set(rows["event"]) <= {"compile", "recompile", "graph_break", "limit_hit", "failure"}


# ------------------------------------------------------------------ records grouped in C as in Polars


def _compiles_both_ways(path: Path, monkeypatch, rank: int | None = None) -> None:
    """The records of a log, grouped in C (parsers/_lines.c: streams numbered, blocks gathered) and by
    the Polars reference where it was not built: the same rows."""
    assert dynamo._records_c is not None, "parsers/_lines.c was not built at install (is a C compiler there?)"
    got = compiles_of(path, rank)
    with monkeypatch.context() as m:
        m.setattr(dynamo, "_records_c", None)
        want = compiles_of(path, rank)
    assert got.equals(want), path


def test_our_runs_and_the_public_threads_records_are_grouped_in_c_as_in_polars(monkeypatch):
    root = Path(__file__).resolve().parent.parent
    logs = [p for folder in ("sample_logs", "tests/realworld") for p in sorted((root / folder).rglob("*.log"))
            if "_dynamo" in p.read_text(errors="replace")]
    assert len(logs) >= 40
    for path in logs:
        _compiles_both_ways(path, monkeypatch)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_interleaved_ranks_and_streams_are_grouped_in_c_as_in_polars(tmp_path, monkeypatch, data):
    """Real lines of a run, each given one of a few rank prefixes (a console's interleaved ranks, tee'd
    copies among them) and shuffled in runs: streams of several ranks and compile ids cut into each other."""
    lines = _sample_lines()
    prefixes = ["", "[rank0]:", "[rank1]:", "[default1]:[rank1]:"]
    picked = data.draw(st.lists(st.tuples(st.integers(0, len(lines) - 1), st.integers(1, 30),
                                          st.sampled_from(prefixes)), min_size=1, max_size=40))
    out = [prefix + line for at, n, prefix in picked for line in lines[at:at + n]]
    path = tmp_path / "console.log"
    path.write_text("\n".join(out))
    _compiles_both_ways(path, monkeypatch)


def test_a_lines_stream_is_its_file_rank_tee_flag_compile_id_and_artifact_or_emitter(tmp_path, monkeypatch):
    """The numbers _streams gives (from numbered parts, in C) against the stream's definition, taken
    on the text: lines of one stream, and only those, share a number."""
    lines = [line.removeprefix("[rank0]:") for line in _sample_lines()]
    out = [prefix + line for i, line in enumerate(lines)
           for prefix in (["[rank0]:", "[rank1]:", "[default1]:[rank1]:"][i % 3],)]
    path = tmp_path / "console.log"
    path.write_text("\n".join(out + [line for line in lines[:50]]))
    frames = {}

    def keep(parser, df, own, state):
        if parser is dynamo:
            frames["df"] = df
        return list(parser.parse_lines(df, own, state))

    monkeypatch.setattr(textlog, "_on_its_thread", keep)
    list(textlog.parse(Source(path=path, name=path.name, kind="text_log", rank=None, year=2026)))
    dyn, said = dynamo._dynamo_lines(frames["df"])
    m = dyn["_m"]
    by_text = dyn.with_columns(said["cid"].gather(m).alias("cid"),
                               pl.coalesce(said["art"].gather(m), dyn["emitter"], pl.lit("")).alias("stream"))
    want = dynamo.key_ids(by_text, ["file", "rank", "tee", "cid", "stream"])
    got = dynamo._streams(dyn, said)
    assert by_text["rank"].n_unique() == 3 and by_text["tee"].n_unique() == 2 and by_text["cid"].n_unique() > 3
    assert got.to_list() == want.to_list()


def _dynamo_frames(path: Path, monkeypatch) -> list[pl.DataFrame]:
    """The frames of lines textlog hands the dynamo parser for a log."""
    frames = []

    def keep(parser, df, own, state):
        if parser is dynamo:
            frames.append(df)
        return list(parser.parse_lines(df, own, state))

    with monkeypatch.context() as m:
        m.setattr(textlog, "_on_its_thread", keep)
        list(textlog.parse(Source(path=path, name=path.name, kind="text_log", rank=None, year=2026)))
    return frames


def test_records_found_in_one_pass_are_those_of_the_lines_filtered_and_grouped(monkeypatch):
    """_blocks_in_one_pass (one C pass over the frame's rows) against _blocks(*_dynamo_lines(df)) (the
    dynamo lines filtered out, numbered and grouped a column at a time), on every frame of our runs and
    the public threads that holds dynamo lines: the same blocks, and the same messages; and the one pass
    declines only frames holding what the general path alone reads."""
    root = Path(__file__).resolve().parent.parent
    logs = [p for folder in ("sample_logs", "tests/realworld") for p in sorted((root / folder).rglob("*.log"))
            if "_dynamo" in p.read_text(errors="replace")]
    taken = declined = 0
    for path in logs:
        for df in _dynamo_frames(path, monkeypatch):
            dyn, said = dynamo._dynamo_lines(df)
            got = dynamo._blocks_in_one_pass(df)
            if got is None:
                declined += 1
                continue
            taken += 1
            if dyn.is_empty():
                assert got[0].is_empty(), path
                continue
            assert got[0].equals(dynamo._blocks(dyn, said)), path
            assert got[1].equals(said), path
    assert taken >= 40 and declined < taken, (taken, declined)


def test_records_found_in_one_pass_of_interleaved_ranks_and_untagged_lines(tmp_path, monkeypatch):
    """Real lines under several rank prefixes, tee'd copies among them, and lines without an artifact tag
    (grouped by the line of torch that logged them): the one pass groups them as the general path."""
    lines = [line.removeprefix("[rank0]:") for line in _sample_lines()]
    untagged = [line for line in lines if "_dynamo" in line and "[__" not in line]
    assert untagged, "the sample holds dynamo lines without an artifact tag"
    out = [["[rank0]:", "[rank1]:", "[default1]:[rank1]:"][i % 3] + line for i, line in enumerate(lines)]
    path = tmp_path / "console.log"
    path.write_text("\n".join(out + lines[:50]))
    (df,) = _dynamo_frames(path, monkeypatch)
    dyn, said = dynamo._dynamo_lines(df)
    got = dynamo._blocks_in_one_pass(df)
    assert got is not None and dyn["emitter"].is_not_null().any()
    assert got[0].equals(dynamo._blocks(dyn, said)) and got[0].height > 10


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=st.lists(st.tuples(st.sampled_from(["graph_break", "recompile", None]),
                                 st.lists(st.integers(0, 5), max_size=4)), max_size=60))
def test_blocks_are_numbered_in_c_by_their_kind_and_messages_as_in_polars(blocks, monkeypatch):
    """Equal blocks (kind and messages, in order) one number, from 0 as each first appears: in C (a
    block's messages hashed as a whole) as by the Polars reference."""
    frame = pl.DataFrame({"kind": [k for k, _ in blocks], "_m": [m for _, m in blocks]},
                         schema={"kind": pl.String, "_m": pl.List(pl.UInt32)})
    got = dynamo._block_numbers(frame)
    with monkeypatch.context() as m:
        m.setattr(dynamo, "_records_c", None)
        want = dynamo._block_numbers(frame)
    seen: dict = {}
    reference = [seen.setdefault((k, tuple(ms)), len(seen)) for k, ms in blocks]
    assert got.to_list() == want.to_list() == reference

"""The compile signatures (recompile-storm, recompile-limit, rank-divergent-compile, graph-break)
on the project's real runs, and on real lines of older PyTorch versions."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from postmortem import api

from .conftest import SAMPLES, sample_dir

COMPILE_SIGNATURES = {"recompile-storm", "recompile-limit", "rank-divergent-compile", "graph-break"}


def expected(name: str) -> dict:
    return json.loads((sample_dir(name) / "expected.json").read_text())


def finding(report: dict, signature: str) -> dict:
    return next(f for f in report["findings"] if f["signature"] == signature)


def said(f: dict) -> str:
    return f["summary"] + f["remediation"] + json.dumps(f["evidence"])


def scenarios(*names: str) -> list[str]:
    """The scenarios of these names present in sample_logs/ (CPU runs and their _cuda variants)."""
    return [n for n in names if (SAMPLES / n / "expected.json").is_file()]


@pytest.mark.parametrize("name", scenarios("recompile_limit", "recompile_limit_cuda"))
def test_recompile_limit_names_the_frame_the_guard_and_the_fix(report_of, name):
    report = report_of(name)
    assert report["verdict"]["signature"] == "recompile-limit"
    limit = finding(report, "recompile-limit")
    assert limit["severity"] == "error" and limit["ranks"] == []  # every rank hit it: no culprit rank
    assert "forward" in limit["summary"] and "config.recompile_limit (8)" in limit["summary"]
    assert "runs eager" in limit["summary"] and "`scale == 1.07`" in limit["summary"]
    assert expected(name)["user_line"] in limit["summary"]
    assert "torch.tensor(value)" in limit["remediation"] and "dynamic=True" in limit["remediation"]
    storm = finding(report, "recompile-storm")
    assert storm["role"] == "context"  # refined by the limit hit
    assert "recompiled 8 times" in storm["summary"] and "1.0, 1.01, 1.02" in storm["summary"]


@pytest.mark.parametrize("name", scenarios("recompile_shapes", "recompile_shapes_cuda"))
def test_shape_recompiles_name_the_tensor_and_mark_dynamic(report_of, name):
    storm = finding(report_of(name), "recompile-storm")
    assert storm["role"] == "root_cause"
    assert "forward" in storm["summary"] and "shape guard on `x`" in storm["summary"]
    assert "torch._dynamo.mark_dynamic(x, 0)" in storm["remediation"]
    # The user's frame leads; torch's own wrapper frame (external_utils.inner) recompiling on the
    # same batch comes after it.
    texts = [e["text"] for e in storm["evidence"]]
    assert texts[0].startswith("forward (") and any(t.startswith("inner (") for t in texts)


@pytest.mark.parametrize("name", scenarios("graph_breaks", "graph_breaks_cuda"))
def test_graph_breaks_blame_the_users_lines_and_keep_ddp_breaks_as_context(report_of, name):
    report = report_of(name)
    gb = finding(report, "graph-break")
    assert report["verdict"]["signature"] == "graph-break" and gb["severity"] == "warning"
    assert expected(name)["user_line"] in gb["summary"]
    assert "Tensor.item()" in gb["summary"] and "capture_scalar_outputs" in gb["remediation"]
    user = [e for e in gb["evidence"] if not e["text"].startswith("in framework code")]
    internal = [e for e in gb["evidence"] if e["text"].startswith("in framework code (ddp)")]
    assert len(user) == 3 and internal  # .item(), print(), the tensor-valued if; DDP's own breaks
    # The code after the .item() break recompiles on the float that crossed it: that is this
    # finding's consequence, not a separate recompile storm.
    assert "recompiled up to" in gb["summary"]
    assert "recompile-storm" not in {f["signature"] for f in report["findings"]}


def test_a_healthy_ddp_run_with_only_ddp_internal_breaks_has_no_compile_finding(report_of):
    report = report_of("healthy")
    assert not COMPILE_SIGNATURES & {f["signature"] for f in report["findings"]}


@pytest.mark.parametrize("name", scenarios("recompile_limit", "recompile_shapes_cuda", "graph_breaks"))
def test_ranks_that_compiled_alike_are_not_divergent(report_of, name):
    assert "rank-divergent-compile" not in {f["signature"] for f in report_of(name)["findings"]}


def _copy_traces(src: Path, dst: Path) -> dict[int, Path]:
    """The sample's TORCH_TRACE files, gunzipped into dst (rank -> path)."""
    out = {}
    for path in sorted((src / "torch_trace").glob("*.log.gz")):
        rank = int(path.name.split("_rank_")[1].split("_")[0])
        target = dst / path.name.removesuffix(".gz")
        with gzip.open(path) as fh, open(target, "wb") as w:
            shutil.copyfileobj(fh, w)
        out[rank] = target
    return out


def test_a_rank_that_compiled_fewer_times_is_named_against_the_majority(tmp_path):
    # Three ranks from the recompile_limit run's two real traces: rank 2 is rank 0's file with its
    # envelope rank rewritten; rank 1 stops after its fourth recompile (as if its step loop had
    # ended early on a data-dependent branch). Ranks 0 and 2 agree; rank 1 is the odd one.
    job = tmp_path / "job"
    job.mkdir()
    files = _copy_traces(sample_dir("recompile_limit"), job)
    text = files[0].read_text()
    (job / "dedicated_log_torch_trace_rank_2_copy.log").write_text(text.replace('"rank": 0,', '"rank": 2,'))
    lines = files[1].read_text().split("\n")
    stop = [i for i, line in enumerate(lines) if '{"compilation_metrics"' in line][8]  # after 4/4: 12 compile ids
    files[1].write_text("\n".join(lines[: stop + 1]))
    report = api.analyze(job, keep=False)
    div = finding(report, "rank-divergent-compile")
    assert div["ranks"] == [1] and div["severity"] == "error"
    assert "compile ids" in div["summary"] and "ranks 0, 2 | rank 1" in div["summary"]
    assert "rank 1: 12 compile id(s)" in div["summary"] and "forward recompiled 4x" in div["summary"]


def test_records_holding_a_cache_outcome_or_a_collective_schedule_are_read_whole():
    """rank-divergent-compile reads every record whose attrs hold a cache outcome or a collective
    schedule, however many records are alike (of the rest, only each compile id's first and each
    rank's last): the graph_breaks run's records, two from the middle given such attrs as the
    TORCH_TRACE parser writes them (no sample's trace logged an FX-cache artifact or a compiled
    collective)."""
    from postmortem.checks import rank_divergent_compile as check

    con, run_id, _ = api.ingest(sample_dir("graph_breaks"), keep=False)
    assert check._keys_held(con, run_id) == []
    read = {(r["file"], r["line_no"]) for r in check._rows(con, run_id)}
    left_out = con.execute("SELECT rowid, file, line_no FROM compiles WHERE run_id = ? AND rank IS NOT NULL "
                           "ORDER BY rank, line_no", [run_id]).fetchall()
    left_out = [row for row in left_out if row[1:] not in read]
    assert len(left_out) >= 2
    (cached, *_), (scheduled, *_) = left_out[0], left_out[-1]
    con.execute("""UPDATE compiles SET attrs = json_merge_patch(attrs, '{"cache": {"fx_graph_cache": "hit"}}')
                   WHERE rowid = ?""", [cached])
    con.execute("""UPDATE compiles SET attrs = json_merge_patch(attrs, '{"collectives": ["all_reduce"]}')
                   WHERE rowid = ?""", [scheduled])
    assert check._keys_held(con, run_id) == ["cache", "collectives"]
    rows = {(r["file"], r["line_no"]): r for r in check._rows(con, run_id)}
    assert json.loads(rows[left_out[0][1:]]["cache"]) == {"fx_graph_cache": "hit"}
    assert json.loads(rows[left_out[-1][1:]]["collectives"]) == ["all_reduce"]


def test_cache_size_limit_lines_of_torch_2_5_give_the_recompile_limit_verdict(tmp_path):
    # pytorch/pytorch#139474 (torch 2.5): the older `cache_size_limit` wording, real lines of rank 3.
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank3.log").write_text(
        "[rank3]:W1101 02:43:40.706000 140 site-packages/torch/_dynamo/convert_frame.py:896] [1/64] "
        "torch._dynamo hit config.cache_size_limit (64)\n"
        "[rank3]:W1101 02:43:40.706000 140 site-packages/torch/_dynamo/convert_frame.py:896] [1/64]    "
        "function: 'forward' (/workspace/modeling/decoder/detail_capture.py:131)\n"
        "[rank3]:W1101 02:43:40.706000 140 site-packages/torch/_dynamo/convert_frame.py:896] [1/64]    "
        "last reason: 1/0: tensor 'L['images']' size mismatch at index 2. expected 1696, actual 1248\n")
    report = api.analyze(job, keep=False)
    assert report["verdict"]["signature"] == "recompile-limit"
    limit = finding(report, "recompile-limit")
    assert "config.cache_size_limit (64)" in limit["summary"]
    assert "detail_capture.py:131" in limit["summary"] and "(shape)" in limit["summary"]
    assert "torch._dynamo.mark_dynamic(images, dim)" in limit["remediation"]


# ------------------------------------------------------------------ lines of tests/realworld (public threads)


def _job(tmp_path: Path, name: str, text: str) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    (job / name).write_text(text.lstrip("\n"))
    return job


def test_one_record_of_compile_id_1_37_is_a_storm_of_37_recompiles(tmp_path):
    # huggingface/diffusers#11970: the excerpt holds one record; its compile id counts the recompiles.
    prefix = "V0721 23:40:59.397000 2159156 torch/_dynamo/guards.py:3006] [1/37] [__recompiles] "
    job = _job(tmp_path, "console.log", "".join(prefix + line + "\n" for line in [
        "Recompiling function forward in /home/user/work/diffusers/src/diffusers/models/transformers/transformer_flux.py:381",
        "    triggered by the following guard failure(s):",
        "    - 1/36: ___check_obj_id(self._modules['attn'].processor, 140462015041104)",
        "    - 1/35: ___check_obj_id(self._modules['attn'].processor, 140462015040240)",
    ]))
    report = api.analyze(job, keep=False)
    assert report["verdict"]["signature"] == "recompile-storm"
    storm = finding(report, "recompile-storm")
    assert "recompiled 37 times" in storm["summary"] and "type_id guard" in storm["summary"]


def test_torch_2_0_recompiles_of_a_log_without_ranks_are_a_storm(tmp_path):
    # pytorch/pytorch#99091 (torch 2.0): one process, a Python int specialized on every step.
    line = ("[2023-04-13 21:42:5{i},808] torch._dynamo.convert_frame.__recompiles: [DEBUG] ('Recompiling function "
            "step in /home/ubuntu/dynamax/dynamax/linear_gaussian_ssm/demos/kf_linreg_jax_vs_pt.py', "
            "\"triggered by the following guard failure: L['t'] == {i}\")\n")
    job = _job(tmp_path, "console.log", "TORCH_LOGS=recompiles python kf.py\n" + "".join(line.format(i=i) for i in range(4)))
    report = api.analyze(job, keep=False)
    assert report["verdict"]["signature"] == "recompile-storm"
    storm = finding(report, "recompile-storm")
    assert "recompiled 4 times" in storm["summary"] and "`t`" in storm["summary"] and "0, 1, 2, 3" in storm["summary"]
    assert "kf_linreg_jax_vs_pt.py" in storm["summary"] and "torch.tensor(value)" in storm["remediation"]


def test_fail_on_recompile_limit_hit_is_a_compile_failure_not_a_silent_limit(tmp_path):
    # pytorch/pytorch#167504: with fullgraph=True the limit hit raises and the program stops.
    job = _job(tmp_path, "console.log", """
W1110 17:56:13.321000 77473 torch/_dynamo/convert_frame.py:1550] [0/8] torch._dynamo hit config.recompile_limit (8)
W1110 17:56:13.321000 77473 torch/_dynamo/convert_frame.py:1550] [0/8]    function: 'forward' (/data/users/user/pytorch/test.py:30)
W1110 17:56:13.321000 77473 torch/_dynamo/convert_frame.py:1550] [0/8]    last reason: 0/7: ___check_type_id(self, 224599728)                        # a = self.net1(x)  # test.py:31 in forward

  File "/data/users/user/pytorch/torch/_dynamo/convert_frame.py", line 1567, in _compile
    raise FailOnRecompileLimitHit(
torch._dynamo.exc.FailOnRecompileLimitHit: recompile_limit reached with fullgraph=True.
""")
    report = api.analyze(job, keep=False)
    assert report["verdict"]["signature"] == "compile-failure"
    assert "FailOnRecompileLimitHit" in finding(report, "compile-failure")["summary"]
    limit = finding(report, "recompile-limit")
    assert "after 8 recompiles" in limit["summary"]  # the hit's compile id 0/8


@pytest.mark.parametrize("text, said", [
    # karpathy/nanoGPT#157: Inductor's RuntimeError alone
    (("RuntimeError: Found NVIDIA GeForce GTX 1080 which is too old to be supported by the triton GPU compiler, "
      "which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is "
      "of CUDA capability 6.1\n"), "GTX 1080 which is too old"),
    # pytorch/pytorch#108650: a bare Unsupported with dynamo's footer
    (("Unsupported: inline in skipfiles: Logger.info  | info /usr/lib/python3.10/logging/__init__.py\n\n"
      "from user code:\n"
      '   File "/usr/local/lib/python3.10/dist-packages/diffusers/models/unet_2d_condition.py", line 762, in forward\n'
      '    logger.info("Forward upsample size to force interpolation output size.")\n\n\n'
      "You can suppress this exception and fall back to eager by setting:\n    import torch._dynamo\n"
      "    torch._dynamo.config.suppress_errors = True\n"), "inline in skipfiles: Logger.info"),
])
def test_compile_exceptions_without_a_traceback_are_compile_failures(tmp_path, text, said):
    report = api.analyze(_job(tmp_path, "console.log", "python train.py\n" + text), keep=False)
    assert report["verdict"]["signature"] == "compile-failure"
    assert said in finding(report, "compile-failure")["summary"]


@pytest.mark.parametrize("name, text, user_line", [
    # pytorch/pytorch#133185: the unsupported-builtin warning
    ("stderr.log", ("/opt/conda/envs/monodle/lib/python3.11/site-packages/torch/_dynamo/variables/functions.py:663: "
                    "UserWarning: Graph break due to unsupported builtin sys.audit. This function is either a Python "
                    "builtin (e.g. _warnings.warn) or a third-party C/C++ Python extension (perhaps created with "
                    "pybind). If it is a third-party C/C++ Python extension, please either wrap it into a "
                    "PyTorch-understood custom operator or, if it is traceable, use torch.compiler.allow_in_graph.\n"
                    "  torch._dynamo.utils.warn_once(msg)\n"), None),
    # NVIDIA/TransformerEngine#705: explain()'s break reasons
    ("explain.txt", ("  Break Reason 148:\n    Reason: inline in skipfiles: Linear.forward  | _fn /env/lib/python3.10/"
                     "site-packages/torch/_dynamo/eval_frame.py\n    User Stack:\n      <FrameSummary file "
                     "/home/user/esm3/oss/attention.py, line 67 in <resume in forward>>\n      <FrameSummary file "
                     "/env/lib/python3.10/site-packages/torch/nn/modules/module.py, line 1527 in _call_impl>\n"),
     "attention.py:67"),
])
def test_graph_break_warnings_and_explain_output_give_the_graph_break_verdict(tmp_path, name, text, user_line):
    report = api.analyze(_job(tmp_path, name, "python train.py\n" + text), keep=False)
    assert report["verdict"]["signature"] == "graph-break"
    gb = finding(report, "graph-break")
    assert "in framework code" not in gb["summary"] and "1 graph break(s) in user code" in gb["summary"]
    if user_line:
        assert user_line in gb["summary"] and report["verdict"]["user_line"].endswith(user_line)
        assert "in <resume in forward>" in gb["summary"]  # the user's function, not nn.Module's dispatch
    else:
        assert "unsupported builtin sys.audit" in gb["summary"] and "allow_in_graph" in gb["remediation"]

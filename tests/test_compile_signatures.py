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

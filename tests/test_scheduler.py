"""Scheduler integration: the Slurm epilog recipe, the Python API, the published JSON Schema."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

import postmortem

from .conftest import sample_dir, scenario_names

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads(resources.files("postmortem").joinpath("schema/report-1.json").read_text())


@pytest.mark.parametrize("name", scenario_names())
def test_every_samples_report_validates_against_the_published_schema(name):
    jsonschema.validate(postmortem.analyze(sample_dir(name), keep=False), SCHEMA)


def test_slurm_epilog_writes_the_verdict_next_to_the_job_and_never_fails(tmp_path):
    jobs = tmp_path / "jobs"
    shutil.copytree(sample_dir("rank_sigkill"), jobs / "4242")
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice", "SLURM_JOB_NODELIST": "gpu[01-02]",
           "POSTMORTEM_LOG_ROOT": str(jobs), "POSTMORTEM_ONLY_NODE": "gpu01", "SLURMD_NODENAME": "gpu01",
           "POSTMORTEM_DB": str(tmp_path / "history.duckdb"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(ROOT / "examples/slurm/epilog.sh")], env=env, timeout=300)
    assert result.returncode == 0
    verdict = json.loads((jobs / "4242" / "postmortem.json").read_text())
    assert verdict["job"]["id"] == "4242" and verdict["job"]["user"] == "alice"
    assert verdict["job"]["labels"]["nodelist"] == "gpu[01-02]"
    assert verdict["verdict"]["signature"] == json.loads((jobs / "4242" / "expected.json").read_text())["root_cause"]
    assert (jobs / "4242" / "postmortem.rc").read_text().strip() == "1"  # a critical finding

    env["SLURMD_NODENAME"] = "gpu02"  # another node of the job leaves the work to the first
    (jobs / "4242" / "postmortem.json").unlink()
    assert subprocess.run(["bash", str(ROOT / "examples/slurm/epilog.sh")], env=env, timeout=60).returncode == 0
    assert not (jobs / "4242" / "postmortem.json").exists()

    env["SLURM_JOB_ID"] = "9999"  # a job without logs: nothing to do, still exit 0
    assert subprocess.run(["bash", str(ROOT / "examples/slurm/epilog.sh")], env=env, timeout=60).returncode == 0


def test_python_api_returns_what_the_cli_prints_as_json(tmp_path):
    report = postmortem.analyze(sample_dir("hang_dataloader"), keep=False)
    printed = subprocess.run(
        [sys.executable, "-m", "postmortem", "analyze", str(sample_dir("hang_dataloader")), "-f", "json", "-q",
         "--no-history"], capture_output=True, text=True, timeout=120).stdout
    cli = json.loads(printed)
    assert set(cli) == set(report) and cli["verdict"] == report["verdict"]
    assert [f["signature"] for f in cli["findings"]] == [f["signature"] for f in report["findings"]]

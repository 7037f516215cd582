"""A job fanned out from a real scenario (benchmarks/synth.py) gets the scenario's verdict."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from postmortem import api

from .conftest import sample_dir, scenario_names

_spec = importlib.util.spec_from_file_location(
    "synth", Path(__file__).resolve().parent.parent / "benchmarks" / "synth.py")
synth = importlib.util.module_from_spec(_spec)
sys.modules["synth"] = synth  # dataclasses look their module up while the class is built
_spec.loader.exec_module(synth)


def _fans_out(name: str) -> bool:
    """synth.py fans out torchrun's per-rank layout (logs/<run>/attempt_N/<rank>/stdout.log, with
    the console and the dumps named by rank): a folder without it (one shared console of a plain
    python, srun or console-only run, a framework's own launcher) has no rank's files to copy."""
    return any(sample_dir(name).glob("logs/*/attempt_*/*/stdout.log"))


@pytest.mark.parametrize("name", [n for n in scenario_names() if _fans_out(n)])
def test_an_8_rank_synthesized_job_gets_its_sources_verdict(name, tmp_path):
    job = synth.synthesize(sample_dir(name), tmp_path / "job", ranks=8, per_node=4, pad_mb=0.5, seed=7)
    report = api.analyze(job, keep=False)
    assert report["world_size"] == 8 and report["ranks_seen"] == list(range(8))
    expected = json.loads((sample_dir(name) / "expected.json").read_text())
    assert report["verdict"]["signature"] == expected["root_cause"]
    culprits = set(expected["culprit_ranks"])
    if culprits == set(range(expected["world_size"])):
        culprits = set(range(8))  # every source rank failed: every copy does too
    if culprits and report["verdict"]["signature"]:
        assert set(report["verdict"]["culprit_ranks"]) == culprits

"""Shared fixtures: the project's own real samples, and a throw-away history database."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from postmortem import api

SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
# Every scenario folder (one with an expected.json) is in one of these: our runs', and the public threads'.
CORPORA = [SAMPLES, Path(__file__).resolve().parent / "realworld"]
_REPORTS: dict[str, dict] = {}


def sample_dir(name: str) -> Path:
    path = SAMPLES / name
    if not (path / "expected.json").is_file():
        raise AssertionError(f"sample_logs/{name} is missing: regenerate it with sample_logs/generate/generate.py")
    return path


def scenario_names() -> list[str]:
    return sorted(p.parent.name for p in SAMPLES.glob("*/expected.json"))


_EVALUATED: dict[Path, dict] = {}


def evaluated(scenario: Path) -> dict:
    """`postmortem eval`'s row for one scenario folder, computed once per test session (the
    per-scenario tests and the calibration test judge the same verdicts)."""
    if scenario not in _EVALUATED:
        (_EVALUATED[scenario],) = api.evaluate([scenario])
    return _EVALUATED[scenario]


@pytest.fixture
def sample():
    return sample_dir


@pytest.fixture
def report_of():
    """The report of a sample, analyzed once per test session without touching history."""

    def get(name: str) -> dict:
        if name not in _REPORTS:
            _REPORTS[name] = api.analyze(sample_dir(name), keep=False)
        return _REPORTS[name]

    return get


@pytest.fixture
def history(tmp_path, monkeypatch) -> Path:
    db = tmp_path / "history.duckdb"
    monkeypatch.setenv("POSTMORTEM_DB", str(db))
    return db


@pytest.fixture
def copy_sample(tmp_path):
    """A writable copy of a sample, for tests that plant bad files beside real ones."""

    def make(name: str, as_name: str | None = None) -> Path:
        target = tmp_path / (as_name or name)
        shutil.copytree(sample_dir(name), target, symlinks=True)
        return target

    return make

"""Cross-run analytics over the history: the bad-node detector, signature trends, run compare."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from postmortem import api
from postmortem.cli import app
from postmortem.errors import PostmortemError

from .conftest import sample_dir, scenario_names

_spec = importlib.util.spec_from_file_location("synth", Path(__file__).resolve().parent.parent / "benchmarks/synth.py")
synth = importlib.util.module_from_spec(_spec)
sys.modules["synth"] = synth
_spec.loader.exec_module(synth)


@pytest.fixture(scope="module")
def busy_history(tmp_path_factory) -> Path:
    """Every sample run, plus three 16-rank jobs whose culprit rank sat on the same bad node."""
    root = tmp_path_factory.mktemp("history")
    db = root / "history.duckdb"
    for name in scenario_names():
        api.analyze(sample_dir(name), db=db)
    for i, name in enumerate(("rank_sigkill", "hang_dataloader", "native_crash")):
        job = synth.synthesize(sample_dir(name), root / f"job{i}", ranks=16, per_node=4, seed=i,
                               host_prefix="gpu", faulty_host="gpu-bad-07")
        api.analyze(job, db=db)
    return db


def test_history_hosts_ranks_the_planted_bad_node_first(busy_history):
    hosts = api.history("hosts", db=busy_history)
    assert hosts[0]["host"] == "gpu-bad-07"
    assert hosts[0]["faulty_runs"] == 3 and hosts[0]["runs_on_host"] == 3
    assert "gpu000" not in {h["host"] for h in hosts}  # healthy nodes of the same jobs are not suspects


def test_history_signatures_counts_root_causes(busy_history):
    rows = {r["signature"]: r for r in api.history("signatures", db=busy_history)}
    assert rows["rank-crash"]["as_root_cause"] >= 2 and rows["collective-hang"]["as_root_cause"] >= 2


def test_history_views_answer_sql(busy_history):
    con = duckdb.connect(str(busy_history), read_only=True)
    assert con.execute("select count(*) from v_runs").fetchall()[0][0] == len(scenario_names()) + 3
    bad = con.execute("select count(distinct run_id) from v_host_faults where host = 'gpu-bad-07'").fetchall()
    assert bad == [(3,)]


def test_history_run_compare_shows_new_and_gone_findings(busy_history):
    runs = {r["source_dir"].rsplit("/", 1)[-1]: r["run_id"] for r in api.runs(db=busy_history, limit=100)}
    diff = api.history("compare", db=busy_history, run=runs["rank_sigkill"], other=runs["healthy"])
    assert [f["signature"] for f in diff["new_findings"]] == ["rank-crash"]
    assert diff["gone_findings"] == []


def test_history_cli_and_bad_windows(busy_history):
    result = CliRunner().invoke(app, ["history", "hosts", "--db", str(busy_history), "--since", "1d"])
    assert result.exit_code == 0 and "gpu-bad-07" in result.output
    with pytest.raises(PostmortemError, match="--since takes"):
        api.history("hosts", db=busy_history, since="last tuesday")

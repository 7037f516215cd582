"""The stacks people already run read what postmortem exports: Prometheus (the textfile collector's
format, checked by promtool itself), a Grafana dashboard over those metrics, and Spark SQL over the
Parquet tree (real pyspark, local[1]) giving the counts DuckDB gives over the same files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from postmortem import api
from postmortem.cli import app

from .conftest import sample_dir

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "examples" / "grafana" / "postmortem-dashboard.json"
# Failures of different kinds on different ranks, and a clean run: every metric gets samples.
RUNS = ["hang_dataloader", "rank_sigkill", "recompile_shapes", "healthy"]
README_SPARK = re.compile(r"```sql\n(-- Spark SQL.*?)```", re.DOTALL)


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("history") / "history.duckdb"
    for name in RUNS:
        api.analyze(sample_dir(name), db=db)
    return db


def cli(*args):
    return CliRunner().invoke(app, list(args))


def samples(text: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = re.fullmatch(r'(\w+)(?:\{(.*)\})? (\S+)', line)
            assert m, line
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
            out.append((m[1], labels, float(m[3])))
    return out


def test_prometheus_export_passes_promtool_and_counts_what_the_history_holds(history, tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "the test needs promtool: apt-get install prometheus (.ci/run installs it)"
    target = tmp_path / "textfile" / "postmortem.prom"
    target.parent.mkdir()
    result = cli("export", "--prometheus", str(target), "--db", str(history))
    assert result.exit_code == 0, result.output
    text = target.read_text()
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # promtool lints too: names, units, HELP
    assert not list(target.parent.glob(".*.tmp"))  # written beside and renamed: no half file left behind
    got = samples(text)
    names = {name for name, _, _ in got}
    assert {"postmortem_findings_total", "postmortem_last_run_timestamp_seconds",
            "postmortem_host_suspect_score", "postmortem_runs_total"} <= names
    con = duckdb.connect(str(history), read_only=True)
    per_signature = dict(con.execute("SELECT signature, count(*) FROM findings GROUP BY signature").fetchall())
    exported: dict[str, float] = {}
    for name, labels, value in got:
        if name == "postmortem_findings_total":
            assert set(labels) == {"signature", "severity", "host", "job"}
            exported[labels["signature"]] = exported.get(labels["signature"], 0) + value
    assert exported == per_signature  # every finding once (each names ranks on one host here)
    runs, newest = con.execute("SELECT count(*), epoch(max(analyzed_at)) FROM runs").fetchone()
    assert [v for n, _, v in got if n == "postmortem_runs_total"] == [runs] == [len(RUNS)]
    assert [v for n, _, v in got if n == "postmortem_last_run_timestamp_seconds"] == [pytest.approx(newest, abs=1e-3)]
    hosts = {labels["host"]: v for n, labels, v in got if n == "postmortem_host_suspect_score"}
    assert hosts and all(0 < v < 1 for v in hosts.values())


def test_grafana_dashboard_is_json_over_the_exported_metrics(history, tmp_path):
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    assert exprs and all(panel.get("title") for panel in board["panels"])
    used = {name for expr in exprs for name in re.findall(r"\bpostmortem_\w+", expr)}
    target = tmp_path / "postmortem.prom"
    assert cli("export", "--prometheus", str(target), "--db", str(history)).exit_code == 0
    exported = {name for name, _, _ in samples(target.read_text())}
    assert used and used <= exported, used - exported
    assert {"postmortem_findings_total", "postmortem_host_suspect_score",
            "postmortem_last_run_timestamp_seconds"} <= used
    variables = [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    assert all(set(re.findall(r"\bpostmortem_\w+", q)) <= exported for q in variables)


def test_spark_sql_from_the_readme_counts_what_duckdb_counts_over_the_same_parquet(history, tmp_path):
    from pyspark.sql import SparkSession

    tree = tmp_path / "pm"
    assert cli("export", "--parquet", str(tree), "--db", str(history)).exit_code == 0
    block = README_SPARK.search((ROOT / "README.md").read_text())[1]
    sql = re.sub(r"--[^\n]*", "", block).replace("/shared/pm/", f"{tree}/")  # the README's comments, its path
    statements = [s.strip() for s in sql.split(";") if s.strip()]
    query = statements[-1]
    assert query.upper().startswith("SELECT")
    duck = sorted(duckdb.sql(query.replace("FROM pm_findings", f"FROM read_parquet('{tree}/findings/**/*.parquet', "
                                           "hive_partitioning = true)")).fetchall())
    assert duck and sum(n for _, n in duck) >= 3  # the hang, the crash and the storm each have a root cause
    spark = (SparkSession.builder.master("local[1]").appName("postmortem-test")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
             .config("spark.sql.warehouse.dir", str(tmp_path / "warehouse")).getOrCreate())
    try:
        for statement in statements[:-1]:
            spark.sql(statement)
        got = sorted((r[0], r[1]) for r in spark.sql(query).collect())
    finally:
        spark.stop()
    assert got == duck

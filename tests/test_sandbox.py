"""User SQL (signature files, `postmortem sql`) reaches the run's or the history's tables and nothing else:
no file, URL, ATTACH, COPY, INSTALL or LOAD; each refusal is one sentence and exit 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from postmortem import api, catalog, engine, store
from postmortem.cli import app

from .test_engine import write_sig

runner = CliRunner()

SECRET = "only-on-this-machine-7f3a"


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret.csv"
    path.write_text(f"key\n{SECRET}\n")
    return path


def reaching_out(secret, tmp_path) -> dict[str, str]:
    """What a hostile query might try, each as a signature query or a `postmortem sql` statement."""
    return {
        "read_text": f"SELECT 0 AS rank, content AS text FROM read_text('{secret}')",
        "read_csv": f"SELECT 0 AS rank, key AS text FROM read_csv('{secret}')",
        "a file as a table": f"SELECT 0 AS rank, key AS text FROM '{secret}'",
        "http": "SELECT 0 AS rank, * FROM read_csv('https://example.com/data.csv')",
        "COPY TO": f"COPY (SELECT 1) TO '{tmp_path / 'copied.csv'}'",
        "ATTACH": f"ATTACH '{tmp_path / 'other.duckdb'}' AS other",
        "INSTALL": "INSTALL httpfs",
        "LOAD": "LOAD httpfs",
    }


CASES = ["read_text", "read_csv", "a file as a table", "http", "COPY TO", "ATTACH", "INSTALL", "LOAD"]


@pytest.mark.parametrize("case", CASES)
def test_a_signature_file_that_reaches_outside_the_run_is_refused_with_exit_2(case, sample, secret_file, tmp_path,
                                                                            history):
    sigs = tmp_path / "sigs"
    sigs.mkdir()
    query = reaching_out(secret_file, tmp_path)[case].replace('"', '\\\\"')
    write_sig(sigs / "evil.toml", id="evil", query=query, summary="{text}")
    result = runner.invoke(app, ["analyze", str(sample("rank_exception")), "--signatures", str(sigs), "-f", "json"])
    assert result.exit_code == 2, result.output
    assert "evil.toml" in result.output and "refused" in result.output and "Traceback" not in result.output
    assert SECRET not in result.output
    assert not (tmp_path / "copied.csv").exists() and not (tmp_path / "other.duckdb").exists()
    assert not history.exists()  # nothing stored, so nothing read lands in the history either


@pytest.mark.parametrize("case", CASES)
def test_signatures_test_refuses_the_same(case, sample, secret_file, tmp_path):
    query = reaching_out(secret_file, tmp_path)[case].replace('"', '\\\\"')
    sig = write_sig(tmp_path / "evil.toml", id="evil", query=query, summary="{text}")
    result = runner.invoke(app, ["signatures", "test", str(sig), str(sample("rank_exception"))])
    assert result.exit_code == 2 and "refused" in result.output and SECRET not in result.output, result.output


@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_postmortem_sql_reaches_only_the_history(case, write, sample, secret_file, tmp_path, history):
    api.analyze(sample("healthy"))
    args = ["sql", reaching_out(secret_file, tmp_path)[case]] + (["--write"] if write else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and SECRET not in result.output
    assert len(result.output.strip().splitlines()) == 1  # one sentence
    assert not (tmp_path / "copied.csv").exists() and not (tmp_path / "other.duckdb").exists()
    ok = runner.invoke(app, ["sql", "SELECT count(*) FROM runs", "-f", "csv"])  # the history is still there
    assert ok.exit_code == 0 and ok.output.strip().splitlines()[-1] == "1"


@pytest.mark.parametrize("case", CASES)
def test_sql_over_a_parquet_tree_reaches_only_that_tree(case, sample, secret_file, tmp_path, history):
    api.analyze(sample("healthy"))
    tree = tmp_path / "pq"
    api.export(tree)
    result = runner.invoke(app, ["sql", "--parquet", str(tree), reaching_out(secret_file, tmp_path)[case]])
    assert result.exit_code == 2 and SECRET not in result.output, result.output
    ok = runner.invoke(app, ["sql", "--parquet", str(tree), "SELECT count(*) FROM findings", "-f", "csv"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("name", ["hang_dataloader_nccl", "recompile_limit", "memory_leak", "straggler",
                                  "allgather_shard_mismatch", "graph_breaks", "rank_sigkill"])
def test_every_builtin_signature_runs_on_the_sandboxed_connection(name, sample):
    con, run_id, _ = api.load(sample(name))
    store.sandbox(con)
    problems: list = []
    sigs, broken = catalog.load_all()
    engine.match(con, run_id, sigs, problems)
    assert broken == [] and problems == []

"""The command line: verbs, help with examples, formats, exit codes, one-sentence errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from postmortem import __version__, api
from postmortem.cli import app

runner = CliRunner()
VERBS = ["analyze", "ingest", "sql", "runs", "show", "signatures", "eval", "history"]


def run(*args, env=None):
    return runner.invoke(app, list(args), env=env)


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and __version__ in result.output


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help_with_an_example(verb):
    result = run(verb, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.output and f"postmortem {verb}" in result.output


def test_analyze_json_has_the_report_keys(sample, history):
    result = run("analyze", str(sample("rank_sigkill")), "--format", "json", "--quiet")
    assert result.exit_code == 1, result.output  # a critical finding: rank-crash
    report = json.loads(result.stdout)
    assert report["schema"] == "postmortem.report/1"
    assert {"run_id", "source_dir", "world_size", "ranks_seen", "verdict", "findings", "files"} <= set(report)
    assert set(report["verdict"]) == {"signature", "summary", "culprit_ranks", "confidence", "user_line",
                                      "evidence_kind", "cannot_tell", "collect"}
    assert report["verdict"]["evidence_kind"] == "text_log" and not report["verdict"]["cannot_tell"]
    assert report["world_size"] == 2 and report["ranks_seen"] == [0, 1]
    assert report["ranks"][0]["rank"] == 1 and "SIGKILL" in report["ranks"][0]["ended"]


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_text_and_markdown_name_each_rank_and_how_it_ended(sample, history, fmt):
    result = run("analyze", str(sample("rank_exception")), "--format", fmt)
    assert result.exit_code == 1, result.output
    assert "ValueError" in result.stdout and "by peer" in result.stdout  # rank 1 raised; rank 0 lost its peer


def test_sql_runs_show_over_history(sample, history):
    report = json.loads(run("analyze", str(sample("healthy")), "-f", "json", "-q").stdout)
    out = run("sql", "select rank, count(*) as n from events group by rank order by rank", "--format", "csv")
    assert out.exit_code == 0 and out.stdout.splitlines()[0] == "rank,n"
    as_json = json.loads(run("sql", "select run_id from runs", "--format", "json").stdout)
    assert as_json == [{"run_id": report["run_id"]}]
    assert report["run_id"] in run("runs").stdout
    shown = json.loads(run("show", report["run_id"], "--format", "json").stdout)
    assert shown["run_id"] == report["run_id"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["analyze", "/no/such/dir"], "No such file or directory"),
        (["analyze", ".", "--format", "yaml"], "--format must be one of"),
        (["show", "nope"], "No run 'nope'"),
        (["sql", "select * from no_such_table"], "SQL error"),
    ],
)
def test_user_mistakes_exit_2_with_one_sentence_and_no_traceback(sample, history, args, message):
    run("analyze", str(sample("healthy")), "-q")
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_an_unchanged_directory_is_shown_from_history_and_a_changed_one_analyzed_again(copy_sample, history):
    job = copy_sample("rank_sigkill")
    first = json.loads(runner.invoke(app, ["analyze", str(job), "-f", "json", "-q"]).stdout)
    again = runner.invoke(app, ["analyze", str(job), "-f", "json"])
    assert "unchanged since run " + first["run_id"] in again.stderr
    assert json.loads(again.stdout) == first and again.exit_code == 1
    fresh = json.loads(runner.invoke(app, ["analyze", str(job), "-f", "json", "-q", "--fresh"]).stdout)
    assert fresh["run_id"] != first["run_id"]
    console = job / "console.log"
    console.write_text(console.read_text() + "\n")  # the job wrote one more line
    changed = json.loads(runner.invoke(app, ["analyze", str(job), "-f", "json", "-q"]).stdout)
    assert changed["run_id"] not in (first["run_id"], fresh["run_id"])
    assert len(api.runs(db=history)) == 3


def test_a_log_piped_to_standard_input_is_analyzed_and_an_empty_one_is_one_sentence(tmp_path):
    from pathlib import Path

    case = Path(__file__).resolve().parent / "realworld" / "m_llmc_cuda_oom_model_to_206"
    (log,) = [p for p in case.iterdir() if p.name != "expected.json"]
    result = CliRunner().invoke(app, ["analyze", "-", "--no-history", "--format", "json", "--quiet"],
                                input=log.read_bytes())
    assert json.loads(result.stdout)["verdict"]["signature"] == "cuda-oom", result.output
    empty = CliRunner().invoke(app, ["analyze", "-", "--no-history"], input=b"")
    assert empty.exit_code == 2 and "Standard input was empty" in empty.output


def _command(*args: str, **kwargs):
    """The installed command as a user runs it (its own process: the quick exit of cli.main included)."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.run([sys.executable, "-m", "postmortem", *args], text=True, timeout=300, **streams)


def test_the_command_writes_its_whole_report_and_exits_with_the_verdicts_status():
    from .conftest import sample_dir

    run = _command("analyze", str(sample_dir("hang_dataloader_nccl")), "--no-history", "-q", "-f", "json")
    rep = json.loads(run.stdout)  # (the whole of it: flushed before the process is gone)
    assert rep["verdict"]["signature"] == "collective-hang"
    assert run.returncode == 1 and run.stderr == ""


def test_a_report_that_cannot_be_written_is_said_in_one_line():
    from .conftest import sample_dir

    with open("/dev/full", "w") as full:  # (Linux: every write to it fails, "No space left on device")
        run = _command("analyze", str(sample_dir("graph_breaks")), "--no-history", "-q", "-f", "text", stdout=full)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "postmortem: Cannot write the report to standard output: No space left on device."]


def test_a_command_line_is_parsed_without_importing_pydantic():
    # typer 0.29 imports pydantic and builds an adapter for each parameter at every invocation
    # (~70 ms before the verb runs; pyproject keeps typer below it): a newer typer that does so fails here.
    code = ("import sys\n"
            "from typer.testing import CliRunner\n"
            "from postmortem.cli import app\n"
            "result = CliRunner().invoke(app, ['analyze', '/nonexistent/dir', '--no-history'])\n"
            "print(result.exit_code, 'pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2", "False"]

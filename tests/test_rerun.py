"""`postmortem rerun`: real jobs (torchrun + gloo on CPU, plain Python) run, stopped, reaped and ingested."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from postmortem import api
from postmortem.cli import app
from postmortem.replay import rerun

runner = CliRunner()
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]

# A two-rank gloo job: "ok" trains 8 steps; "hang" stops rank 1 in a sleep at step 3 (rank 0 then
# waits in its all-reduce); "crash" raises on rank 1 at step 2.
JOB = textwrap.dedent("""
    import sys, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode = sys.argv[1]
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        if mode == "hang" and rank == 1 and step == 3:
            time.sleep(3600)
        if mode == "crash" and rank == 1 and step == 2:
            raise ValueError("bad batch at step 2")
        model(torch.randn(4, 8)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        print(f"[rank{rank}] step {step}", flush=True)
    dist.destroy_process_group()
    # torch 2.13's gloo can abort in static destructors at interpreter exit ("terminate called
    # without an active exception", seen in this suite): a healthy job here leaves without them.
    sys.stdout.flush()
    import os
    os._exit(0)
""")

# A launcher that ignores SIGTERM and starts a worker in a session of its own (as torchrun does)
# that ignores it too: only SIGKILL, to every process of the job, ends it.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", worker], start_new_session=True)
    print(f"launcher started worker {child.pid}", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return str(path)


def cli(*args):
    return runner.invoke(app, list(args))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_rerun_help_has_an_example():
    result = cli("rerun", "--help")
    assert result.exit_code == 0 and "Example:" in result.output and "postmortem rerun" in result.output


def test_healthy_job_completes_and_is_ingested_as_a_new_run_whose_id_is_printed(history, job, tmp_path):
    out = tmp_path / "rerun"
    result = cli("rerun", "--out", str(out), "-f", "text", "--", *TORCHRUN, job, "ok")
    assert result.exit_code == 0, result.output
    assert "[rank1] step 7" in result.stdout  # the console streams through
    (run_id,) = [r["run_id"] for r in api.runs()]
    assert f"rerun {run_id}:" in result.stdout and "exited with code 0" in result.stdout
    assert "[rank1] step 7" in (out / "console.log").read_text()
    assert sorted(p.parent.name for p in out.glob("logs/*/attempt_0/*/stderr.log")) == ["0", "1"]  # PET_* worked
    report = api.show(run_id)
    assert report["world_size"] == 2 and report["verdict"]["signature"] is None
    assert report["job"]["labels"]["command"].endswith(f"{job} ok")


def test_hanging_job_is_dumped_and_killed_at_the_timeout_and_every_process_reaped(history, job, tmp_path):
    result = rerun.rerun([*TORCHRUN, job, "hang"], out=tmp_path / "rerun", timeout_s=12, grace_s=6)
    assert result["ended"] == "timeout"
    assert result["seconds"] <= 12 + 6 + 0.5
    assert len(result["pids"]) >= 3  # torchrun and its two workers (each in a session of its own)
    assert not [pid for pid in result["pids"] if _alive(pid)]
    assert rerun.pyspy_exe(), "py-spy is a test dependency"
    assert sorted(result["pyspy"]) == ["pyspy/rank0.txt", "pyspy/rank1.txt"]
    assert "job.py" in (tmp_path / "rerun" / "pyspy" / "rank1.txt").read_text()
    assert result["run_id"] in [r["run_id"] for r in api.runs()]
    assert api.show(result["run_id"])["job"]["labels"]["rerun_ended"] == "timeout"


def test_processes_ignoring_sigterm_are_killed_after_the_grace_period(history, tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    result = rerun.rerun([sys.executable, str(script)], out=tmp_path / "rerun", timeout_s=2, grace_s=2)
    assert result["ended"] == "timeout" and result["seconds"] <= 2 + 2 + 0.5
    assert len(result["pids"]) == 2, result
    assert not [pid for pid in result["pids"] if _alive(pid)]
    assert result["exit_code"] == -signal.SIGKILL


def test_rerun_against_a_prior_run_reuses_its_command_and_lists_the_shared_signature(history, job, tmp_path):
    first = rerun.rerun([*TORCHRUN, job, "crash"], out=tmp_path / "first", timeout_s=60)
    assert first["verdict"]["signature"] == "rank-crash" and first["verdict"]["culprit_ranks"] == [1]
    result = cli("rerun", "--against", first["run_id"][:15], "--yes", "--out", str(tmp_path / "second"), "-f", "json",
                 "-q")
    assert result.exit_code == 1, result.output  # a critical finding, as analyze would exit
    second = json.loads(result.stdout)
    assert second["against"] == first["run_id"] and second["command"] == first["command"]
    assert second["diff"]["both"] == [{"signature": "rank-crash", "in": "both", "original_role": "root_cause",
                                       "original_ranks": [1], "rerun_role": "root_cause", "rerun_ranks": [1]}]
    assert second["diff"]["only_original"] == [] and second["diff"]["only_rerun"] == []
    assert api.show(second["run_id"])["job"]["labels"]["rerun_of"] == first["run_id"]
    text = cli("rerun", "--against", first["run_id"], "-y", "--out", str(tmp_path / "third"), "-q", "--timeout", "60")
    assert "rank-crash" in text.stdout and "both" in text.stdout and "root_cause ranks [1]" in text.stdout


def test_profile_writes_a_kineto_trace_per_rank_that_is_ingested(history, job, tmp_path):
    out = tmp_path / "rerun"
    result = rerun.rerun([*TORCHRUN, job, "ok"], out=out, timeout_s=60, profile=True)
    assert result["exit_code"] == 0
    assert sorted(p.name.split(".")[0] for p in (out / "profiler").glob("*.pt.trace.json")) == ["rank0", "rank1"]
    _, rows = api.query(f"SELECT rank FROM files WHERE run_id = '{result['run_id']}' AND kind = 'kineto_trace' "
                            "ORDER BY rank")
    assert rows == [(0,), (1,)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["rerun"], "Give the command to run after --"),
        (["rerun", "--against", "nope", "--", "true"], "No run 'nope'"),
        (["rerun", "--", "no-such-command-here", "x"], "No such command: no-such-command-here"),
        (["rerun", "--against", "HEALTHY"], "record no command line"),
        (["rerun", "--format", "yaml", "--", "true"], "--format must be one of"),
    ],
)
def test_bad_input_exits_2_with_one_sentence_and_no_traceback(sample, history, args, message):
    healthy = api.analyze(sample("healthy"))["run_id"]  # its logs record no command line
    result = cli(*[healthy if a == "HEALTHY" else a for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([r for r in api.runs() if r["run_id"] != healthy]) == 0  # nothing ran, nothing ingested


def test_a_command_planted_in_a_pyspy_file_is_shown_but_never_run_without_yes(sample, history, tmp_path):
    # A log directory is input: a py-spy file whose Process line names a shell must not make
    # `rerun --against` start that shell. The planted dump is a real one with its command replaced.
    logs = tmp_path / "logs"
    logs.mkdir()
    planted = tmp_path / "planted-side-effect"
    real = (sample("hang_dataloader") / "pyspy" / "rank1.txt").read_text().splitlines()
    real[0] = f'Process 1841: /bin/sh -c "touch {planted}"'
    (logs / "rank0.txt").write_text("\n".join(real) + "\n")
    run_id = api.analyze(logs)["run_id"]
    assert api.show(run_id)["job"]["command"].startswith("/bin/sh -c")  # recorded, as the logs say
    result = cli("rerun", "--against", run_id, "--out", str(tmp_path / "out"), "-q")  # stdin is not a terminal
    assert result.exit_code == 2, result.output
    assert "never run unasked" in result.output and "/bin/sh -c" in result.output and "Traceback" not in result.output
    assert not planted.exists() and not (tmp_path / "out").exists()
    assert [r["run_id"] for r in api.runs()] == [run_id]  # nothing ran, nothing ingested


def test_an_output_directory_that_is_not_empty_is_refused(history, tmp_path):
    (tmp_path / "old.log").write_text("x")
    result = cli("rerun", "--out", str(tmp_path), "--", "true")
    assert result.exit_code == 2 and "not empty" in result.output


def test_instrument_env_keeps_the_users_own_settings_and_points_every_dump_into_the_out_dir(tmp_path):
    env, chosen = rerun.instrument_env(tmp_path, {"TORCH_LOGS": "+dynamo", "PATH": os.environ["PATH"]}, detail=True)
    assert env["TORCH_LOGS"] == "+dynamo" and "TORCH_LOGS" not in chosen
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "nccl_trace_rank_")
    assert env["TORCH_TRACE"] == str(tmp_path / "torch_trace") and env["PET_LOG_DIR"] == str(tmp_path / "logs")
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and env["NCCL_DEBUG"] == "INFO"

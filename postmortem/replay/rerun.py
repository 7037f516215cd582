"""Re-run the user's own job with every instrument on, ingest what it leaves, diff the findings.

    postmortem rerun [--against RUN_ID] [--timeout S] [--out DIR] [--profile] -- torchrun ... train.py ...

Pure orchestration: the command runs in its own session with TORCH_LOGS, TORCH_TRACE, the
flight recorder (dump on timeout), NCCL_DEBUG, faulthandler and torchrun's per-rank log files
(``PET_LOG_DIR``/``PET_REDIRECTS``/``PET_TEE``, which torchrun reads as the defaults of
``--log-dir``/``--redirects``/``--tee``: a flag the user gave still wins) pointed into one
directory; its console is kept there as ``console.log``. At the deadline every Python process
of the job is dumped with py-spy (when installed), then the job is stopped: SIGTERM, a grace
period, SIGKILL, and every process reaped. The directory is then analyzed like any other
(``api.analyze``) and its findings compared with the original run's.

The job's processes are found by a token in their environment as well as by parentage:
torchrun starts each worker in a session of its own, so a process group alone misses them.
torch is not imported here; it runs in the user's job.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from postmortem import api, processes
from postmortem.errors import PostmortemError
from postmortem.processes import TOKEN_VARIABLE
from postmortem.ranges import rank_ranges

log = logging.getLogger(__name__)

SCHEMA = "postmortem.rerun/1"
# What a rerun turns on; a value the user already has in the environment wins.
INSTRUMENTS = {
    "TORCH_LOGS": "dynamo,recompiles,graph_breaks",  # INFO dynamo (compile starts/ends) + the two the signatures read
    "TORCH_CPP_LOG_LEVEL": "INFO",  # c10d init options (the collective timeout in force), store connections
    "TORCH_FR_BUFFER_SIZE": "2000",  # the flight recorder's ring (torch >= 2.6 name)
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # ... and its older name
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,COLL",  # communicator setup and one line per collective
    "PYTHONFAULTHANDLER": "1",  # a native crash prints every thread's Python stack
    "PYTHONUNBUFFERED": "1",  # the console is complete up to the kill
    "PET_REDIRECTS": "3",  # torchrun: stdout and stderr of every rank into --log-dir ...
    "PET_TEE": "3",  # ... and on the console as well
}
PROFILE_WINDOW = (2, 3)  # --profile: skip this many optimizer steps, then record this many
PYSPY_TIMEOUT_S = 10.0


@dataclass
class Outcome:
    """How the command ended."""

    ended: str  # exited, timeout, interrupted
    exit_code: int | None
    seconds: float
    pids: list[int] = field(default_factory=list)  # every process of the job seen
    pyspy: list[str] = field(default_factory=list)  # dump files written, relative to the out dir
    left_running: list[int] = field(default_factory=list)  # still alive after the command exited: killed
    survivors: list[int] = field(default_factory=list)  # alive after SIGKILL (should stay empty)


def instrument_env(out: Path, base: Mapping[str, str], detail: bool = False, profile_site: Path | None = None,
                   token: str = "") -> tuple[dict[str, str], dict[str, str]]:
    """The child's environment, and the variables the rerun set in it (for the report)."""
    chosen = {k: v for k, v in INSTRUMENTS.items() if k not in base}
    dump_prefix = str(out / "nccl_trace_rank_")
    chosen.update({
        "TORCH_TRACE": str(out / "torch_trace"),
        "TORCH_FR_DUMP_TEMP_FILE": dump_prefix,  # <prefix><rank>: the file name the flight recorder writes
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_prefix,  # its older name
        "PET_LOG_DIR": str(out / "logs"),
    })
    if detail:
        chosen["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if profile_site is not None:
        chosen["POSTMORTEM_PROFILE_DIR"] = str(out / "profiler")
        chosen["POSTMORTEM_PROFILE_WINDOW"] = ",".join(map(str, PROFILE_WINDOW))
        chosen["PYTHONPATH"] = os.pathsep.join(p for p in (str(profile_site), base.get("PYTHONPATH")) if p)
    env = {**base, **chosen, TOKEN_VARIABLE: token}
    return env, chosen


def recorded_command(against: str, db: Path | None) -> tuple[str, list[str], list[str]]:
    """(run id, command, notes): the command a run in the history recorded, launched as it was.

    The logs record the worker's command line (py-spy's ``Process <pid>: python -u train.py ...``);
    a run of several ranks was started by torchrun, so it is launched again under
    ``torch.distributed.run`` with one process per recorded rank.
    """
    rep = api.show(against, db=db)
    run_id = rep["run_id"]
    # A rerun's label holds the launcher's exact command; py-spy's line only a worker's.
    line = rep["job"]["labels"].get("command") or rep["job"].get("command")
    if not line:
        raise PostmortemError(f"Run {run_id}'s logs record no command line (only py-spy dumps and reruns do); "
                              "give the command after --, e.g. postmortem rerun --against "
                              f"{run_id} -- torchrun --nproc-per-node 2 train.py.")
    argv = shlex.split(line)
    notes = [f"command recorded in run {run_id}: {line}"]
    world = rep["world_size"] or 1
    if world > 1 and len(rep.get("hosts") or []) > 1:
        raise PostmortemError(f"Run {run_id} spanned {len(rep['hosts'])} hosts; a rerun starts one node's worth, "
                              "so give the command after --.")
    is_python = Path(argv[0]).name.startswith("python")
    if world > 1 and is_python and not _is_torchrun(argv):
        rest = argv[1:]
        while rest and rest[0] in ("-u", "-B", "-O", "-OO", "-s", "-E"):
            rest = rest[1:]
        launcher = [argv[0], "-m", "torch.distributed.run"] if shutil.which(argv[0]) else ["torchrun"]
        argv = launcher + ["--nproc-per-node", str(world)] + rest
        notes.append(f"that is one worker of {world}: launched again as {shlex.join(argv)}")
    return run_id, argv, notes


def _is_torchrun(argv: list[str]) -> bool:
    return Path(argv[0]).name == "torchrun" or any(
        a == "-m" and b in ("torch.distributed.run", "torch.distributed.launch") for a, b in itertools.pairwise(argv))


# ---- processes -------------------------------------------------------------------------------------


def pyspy_exe() -> str | None:
    """py-spy on PATH, or installed beside this Python (a venv whose bin/ is not on PATH)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def _pyspy_dumps(job: processes.JobProcesses, out: Path, budget_s: float) -> list[str]:
    """py-spy dump of each rank's main Python process (ranks from RANK in its environment; the
    job's Python processes by pid when none has a rank). Bounded by ``budget_s`` in all."""
    exe = pyspy_exe()
    if exe is None:
        log.info("py-spy is not on PATH: no stack dumps")
        return []
    procs = {}
    for pid in sorted(job.scan()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = Path(f.read().split(b"\0")[0].decode(errors="replace")).name
        except OSError:
            continue
        if argv0.startswith("python") or argv0 in ("torchrun", "pt_main_thread"):
            procs[pid] = processes.environ(pid).get("RANK")
    ranked = {pid: r for pid, r in procs.items() if r is not None and r.isdigit()}
    # A rank's DataLoader workers inherit its RANK: keep the topmost process of each rank.
    targets = {pid: f"rank{r}" for pid, r in ranked.items()
               if ranked.get((processes.stat(pid) or (0,))[0]) != r} if ranked else {pid: f"pid{pid}" for pid in procs}
    written = []
    end = time.monotonic() + budget_s
    (out / "pyspy").mkdir(exist_ok=True)
    for pid, name in sorted(targets.items(), key=lambda kv: kv[1]):
        left = end - time.monotonic()
        if left <= 0.5:
            log.warning("no time left for py-spy dumps of %s", name)
            break
        path = out / "pyspy" / f"{name}.txt"
        try:
            with open(path, "wb") as f:
                subprocess.run([exe, "dump", "--pid", str(pid)], check=False, stdout=f, stderr=subprocess.STDOUT,
                               timeout=min(left, PYSPY_TIMEOUT_S), stdin=subprocess.DEVNULL)
            written.append(str(path.relative_to(out)))
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.warning("py-spy dump of %s (pid %d) failed: %s", name, pid, exc)
    return written


def execute(argv: list[str], out: Path, env: Mapping[str, str], timeout_s: float, grace_s: float = 10.0,
            echo: Callable[[bytes], None] | None = None, token: str | None = None) -> Outcome:
    """Run ``argv`` with its console teed to ``out/console.log`` (and ``echo``); stop it at
    ``timeout_s`` (py-spy dumps, SIGTERM, SIGKILL at ``timeout_s + grace_s``) and reap it all."""
    token = token or env.get(TOKEN_VARIABLE) or secrets.token_hex(8)
    env = {**env, TOKEN_VARIABLE: token}
    was_subreaper = processes.subreaper(True)
    t0 = time.monotonic()
    try:
        with open(out / "console.log", "wb") as console:
            try:
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except FileNotFoundError as exc:
                raise PostmortemError(f"No such command: {argv[0]}.") from exc
            except PermissionError as exc:
                raise PostmortemError(f"Cannot run {argv[0]}: {exc.strerror}.") from exc
            job = processes.JobProcesses([proc.pid], token)
            tee = threading.Thread(target=_tee, args=(proc.stdout, console, echo), daemon=True)
            tee.start()
            outcome = Outcome(ended=_wait(proc, job, t0 + timeout_s), exit_code=None, seconds=0.0)
            if outcome.ended == "exited":
                outcome.left_running = sorted(job.alive())
                if outcome.left_running:
                    _stop(job, proc, time.monotonic() + min(grace_s, 5.0))
            else:
                hard_end = min(time.monotonic(), t0 + timeout_s) + grace_s
                job.scan()
                outcome.pyspy = _pyspy_dumps(job, out, budget_s=grace_s / 2)
                _stop(job, proc, hard_end)
            outcome.survivors = sorted(job.alive())
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            job.reap()
            tee.join(timeout=2.0)
    finally:
        if not was_subreaper:
            processes.subreaper(False)
    outcome.exit_code = proc.returncode
    outcome.seconds = round(time.monotonic() - t0, 1)
    outcome.pids = sorted(job.seen)
    return outcome


def _wait(proc: subprocess.Popen, job: processes.JobProcesses, deadline: float) -> str:
    """Wait for the command to exit, noting the job's processes as they come: exited, timeout or interrupted."""
    next_scan = 0.0
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if now >= next_scan:
                job.scan()
                next_scan = now + 1.0
            time.sleep(min(0.1, max(deadline - now, 0.0)))
    except KeyboardInterrupt:
        return "interrupted"
    return "exited"


def _stop(job: processes.JobProcesses, proc: subprocess.Popen, hard_end: float) -> None:
    """SIGTERM the command's process group (torchrun passes it on to its workers), then every
    process of the job halfway to ``hard_end``, then SIGKILL whatever is left just before it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        pass
    halfway = time.monotonic() + (hard_end - time.monotonic()) / 2
    for stage_end, sig in ((halfway, signal.SIGTERM), (hard_end - 0.3, signal.SIGKILL)):
        while time.monotonic() < stage_end:
            proc.poll()
            if not job.alive():
                return
            time.sleep(0.1)
        job.signal(sig, job.alive())
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(20):  # SIGKILL is not instant: wait for the kernel to finish them
        proc.poll()
        if not job.alive():
            return
        time.sleep(0.02)


def _tee(stream, console, echo: Callable[[bytes], None] | None) -> None:
    fd = stream.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        console.write(chunk)
        console.flush()
        if echo is not None:
            try:
                echo(chunk)
            except (OSError, ValueError):
                echo = None  # the terminal went away: keep the log anyway
    stream.close()


# ---- findings --------------------------------------------------------------------------------------


def diff(original: list[dict], rerun: list[dict]) -> dict:
    """Signatures found in both runs, only in the original, only in the rerun (replay
    confirmations left out), each with its role and culprit ranks in each run."""

    def by_signature(findings):
        out: dict[str, dict] = {}
        for f in findings:
            if f["role"] == "confirmation":
                continue
            seen = out.setdefault(f["signature"], {"role": f["role"], "severity": f["severity"], "ranks": set()})
            seen["ranks"] |= set(f["ranks"] or [])
        return out

    a, b = by_signature(original), by_signature(rerun)

    def row(sig, side, where):
        row = {"signature": sig, "in": where}
        for name, found in side:
            row[f"{name}_role"] = found[sig]["role"] if sig in found else None
            row[f"{name}_ranks"] = sorted(found[sig]["ranks"]) if sig in found else None
        return row

    sides = (("original", a), ("rerun", b))
    return {
        "both": [row(s, sides, "both") for s in sorted(a.keys() & b.keys())],
        "only_original": [row(s, sides, "original") for s in sorted(a.keys() - b.keys())],
        "only_rerun": [row(s, sides, "rerun") for s in sorted(b.keys() - a.keys())],
    }


# ---- the verb --------------------------------------------------------------------------------------


def _profile_site(tmp: Path) -> Path:
    """A directory holding a sitecustomize that loads ``profile_window`` by path (the job's Python
    need not have postmortem installed) and chains to the one it shadows."""
    site = tmp / "site"
    site.mkdir()
    module = Path(__file__).with_name("profile_window.py")
    (site / "sitecustomize.py").write_text(
        "# written by postmortem rerun --profile\n"
        "import importlib.util as _u\n"
        f"_spec = _u.spec_from_file_location('_postmortem_profile_window', {str(module)!r})\n"
        "_m = _u.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_m)\n"
        "_m.install(__file__)\n", encoding="utf-8")
    return site


def rerun(argv: list[str] | None, db: Path | None = None, against: str | None = None, out: Path | None = None,
          timeout_s: float = 600.0, grace_s: float = 10.0, profile: bool = False, detail: bool = False,
          fail_on: str = "error", echo: Callable[[bytes], None] | None = None,
          before_start: Callable[[list[str], Path], None] | None = None,
          confirm: Callable[[list[str]], bool] | None = None) -> dict:
    """Run the command (or the one ``against`` recorded), analyze what it left, diff with ``against``.

    A command recorded in a log directory is input like the rest of it: it runs only when
    ``confirm`` is given and says yes to its exact argv (the CLI asks on a terminal, or takes --yes).
    """
    if timeout_s <= 0 or grace_s < 0:
        raise PostmortemError("--timeout must be positive and --grace not negative (seconds).")
    api.exit_status([], fail_on)  # a bad --fail-on fails before the job runs, not after
    notes: list[str] = []
    original = None
    if against:
        original = api.show(against, db=db)  # an unknown id fails here, before anything runs
        against = original["run_id"]
    if not argv:
        if not against:
            raise PostmortemError("Give the command to run after -- (e.g. postmortem rerun -- torchrun "
                                  "--nproc-per-node 2 train.py), or --against RUN_ID to run the one it recorded.")
        against, argv, notes = recorded_command(against, db)
        if confirm is None or not confirm(argv):
            raise PostmortemError(f"Run {against} recorded the command `{shlex.join(argv)}`; a command read from "
                                  "logs is never run unasked: pass it after -- or add --yes to run it.")
    if "/" not in argv[0] and shutil.which(argv[0]) is None:
        raise PostmortemError(f"No such command: {argv[0]} (not on PATH).")
    out = Path(out) if out else Path.cwd() / datetime.now().strftime("postmortem-rerun-%Y%m%d-%H%M%S")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PostmortemError(f"{out} already exists and is not empty; give --out a new directory.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PostmortemError(f"Cannot create {out}: {exc.strerror}.") from exc
    out = out.resolve()
    token = secrets.token_hex(8)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"postmortem-rerun-{token}"
    try:
        site = None
        if profile:
            tmp.mkdir(parents=True)
            site = _profile_site(tmp)
        env, chosen = instrument_env(out, os.environ, detail=detail, profile_site=site, token=token)
        if before_start:
            before_start(argv, out)
        outcome = execute(argv, out, env, timeout_s, grace_s, echo=echo, token=token)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if outcome.survivors:
        notes.append(f"processes {outcome.survivors} survived SIGKILL (uninterruptible sleep?)")
    if outcome.left_running:
        notes.append(f"processes {outcome.left_running} were still running after the command exited: killed")
    if outcome.ended == "timeout" and not outcome.pyspy:
        notes.append("no py-spy dumps: py-spy is not on PATH" if pyspy_exe() is None
                     else "no py-spy dumps: no Python process of the job was left to dump")
    labels = {"rerun": "true", "command": shlex.join(argv), "rerun_ended": outcome.ended,
              "rerun_exit_code": str(outcome.exit_code)}
    if against:
        labels["rerun_of"] = against
    try:
        report = api.analyze(out, db=db, keep=True, fail_on=fail_on, labels=labels)
    except PostmortemError as exc:
        raise PostmortemError(f"The rerun ({outcome.ended}, exit code {outcome.exit_code}) left nothing "
                              f"to analyze in {out}: {exc}") from exc
    return {
        "schema": SCHEMA,
        "run_id": report["run_id"],
        "against": against,
        "command": argv,
        "out_dir": str(out),
        "ended": outcome.ended,
        "exit_code": outcome.exit_code,
        "seconds": outcome.seconds,
        "timeout_s": timeout_s,
        "pids": outcome.pids,
        "pyspy": outcome.pyspy,
        "instruments": chosen,
        "notes": notes,
        "verdict": report["verdict"],
        "diff": diff(original["findings"], report["findings"]) if original else None,
        "report": report,
    }


def describe(result: dict) -> str:
    """One sentence: what ran, how it ended, what the rerun found."""
    how = {"exited": f"exited with code {result['exit_code']}",
           "timeout": f"was stopped at the {result['timeout_s']:g} s timeout",
           "interrupted": "was interrupted"}[result["ended"]]
    verdict = result["verdict"]
    found = (f"{verdict['signature']} on rank(s) {rank_ranges(verdict['culprit_ranks'])}"
             if verdict["signature"] and verdict["culprit_ranks"] else verdict["signature"] or verdict["summary"])
    return f"rerun {result['run_id']}: `{shlex.join(result['command'])}` {how} after {result['seconds']} s; {found}"

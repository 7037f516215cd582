"""`postmortem watch`: real torchrun + gloo jobs (CPU) watched live, started by watch or attached to.

The job is tests/fixtures/watch_job.py: rank 2 blocks forever on a threading.Event at step 5
under a 10-minute process-group timeout, or (healthy) every rank finishes its steps with uneven
step times. The timing bound is the issue's: the verdict within 45 s of the block.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from postmortem import api, processes, watch
from postmortem.cli import app

FIXTURE = Path(__file__).parent / "fixtures" / "watch_job.py"
GRACE_S = 3
JOB_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(autouse=True)
def _no_job_left(tmp_path):
    """Whatever happens in a test, no process of its job outlives it (a blocked rank never exits)."""
    yield
    for pid in _processes_running(tmp_path / "watch_job.py"):
        os.kill(pid, 9)


def _job_script(tmp_path: Path) -> Path:
    """The fixture under a path of this test's own, so the job's processes can be told apart."""
    path = tmp_path / "watch_job.py"
    shutil.copy(FIXTURE, path)
    return path


def _blocking_line(script: Path) -> str:
    """file:line of the wait nothing ends (the line the verdict must name)."""
    number = next(i for i, line in enumerate(script.read_text().splitlines(), 1) if "done.wait()" in line)
    return f"{script.name}:{number}"


def _torchrun(nproc: int, script: Path, *args: str, launcher: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
            *launcher, str(script), *args]


def _watch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "postmortem", "watch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=JOB_ENV, text=True)


def _documents(proc: subprocess.Popen) -> list[tuple[float, dict]]:
    """Each JSON line watch prints, with the wall time it arrived."""
    docs = []
    for line in proc.stdout:
        docs.append((time.time(), json.loads(line)))
    return docs


def _processes_running(script: Path, watcher: subprocess.Popen | None = None) -> list[int]:
    """Live processes whose command line names the job's script: torchrun and its workers (and
    the watcher that started them, unless it is given)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or (watcher is not None and int(name) == watcher.pid):
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read()
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(script).encode() in argv and state not in ("Z", "X"):
            found.append(int(name))
    return found


def _blocked_at(log_root: Path) -> float:
    """The wall time rank 2 logged just before it blocked."""
    for path in log_root.rglob("stdout.log"):
        m = re.search(r"\[rank2\] blocking at step 5 at unix time (\d+\.\d+)", path.read_text())
        if m:
            return float(m[1])
    raise AssertionError(f"rank 2 never logged its block under {log_root}")


def _assert_hang_verdict(doc: dict, script: Path, dumped: tuple[str, ...] = ("0", "1", "2", "3")) -> None:
    assert doc["schema"] == "postmortem.watch/1"
    assert doc["verdict"]["signature"] == "collective-hang"
    assert doc["verdict"]["culprit_ranks"] == [2]
    assert doc["verdict"]["user_line"] == _blocking_line(script)
    assert doc["culprit_innermost"]["2"].startswith("Condition.wait (threading.py")  # Event.wait's innermost
    assert doc["stalled_s"] >= 10
    assert 2 in doc["stalled_ranks"]
    assert sorted(doc["evidence"]["pyspy"]) == list(dumped)  # every rank this watcher holds was dumped


def _assert_gone_within_grace(script: Path, pids: list[int], since: float) -> None:
    deadline = since + GRACE_S + 5
    while time.time() < deadline and (_processes_running(script) or any(_alive(p) for p in pids)):
        time.sleep(0.2)
    assert _processes_running(script) == []
    assert [p for p in pids if _alive(p)] == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_started_job_names_the_blocked_rank_and_its_line_within_45s_and_kill_leaves_no_process(tmp_path):
    script = _job_script(tmp_path)
    out = tmp_path / "watch"
    proc = _watch("--stall", "10", "-f", "json", "--action", "kill", "--grace", str(GRACE_S), "--db",
                  str(tmp_path / "h.duckdb"), "--out", str(out), "--",
                  *_torchrun(4, script, "--steps", "200", "--hang-rank", "2", "--hang-step", "5"))
    docs = _documents(proc)
    proc.wait(timeout=60)
    arrived, stall = docs[0]
    _assert_hang_verdict(stall, script)
    assert arrived - _blocked_at(out / "logs") <= 45
    assert stall["action_taken"] == "kill"
    assert len(stall["pids"]) >= 5  # torchrun and its 4 workers
    _assert_gone_within_grace(script, stall["pids"], arrived)
    final = docs[-1][1]
    assert final["ended"] == "killed" and final["killed"]["survivors"] == []
    assert proc.returncode == 1
    # The stall's analysis is a run in the history, labelled watch.
    stored = api.show(stall["run_id"], db=tmp_path / "h.duckdb")
    assert stored["job"]["labels"]["watch"] == "true"
    assert stored["verdict"]["culprit_ranks"] == [2]


@pytest.mark.parametrize(("nproc", "how", "where"), [(8, "lock", "lock.acquire()"),
                                                     (4, "sleep", "time.sleep(1)"),
                                                     (4, "spin", "residual := (residual")])
def test_a_rank_blocked_on_a_lock_in_a_sleep_loop_or_computing_forever_is_named_with_its_line(
        tmp_path, nproc, how, where):
    script = _job_script(tmp_path)
    out = tmp_path / "watch"
    proc = _watch("--stall", "10", "-f", "json", "--action", "kill", "--grace", str(GRACE_S), "--no-history",
                  "--out", str(out), "--", *_torchrun(nproc, script, "--steps", "200", "--hang-rank", "2",
                                                      "--block-with", how))
    docs = _documents(proc)
    proc.wait(timeout=60)
    arrived, stall = docs[0]
    lines = script.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if where in line and "#" in line)  # the commented one
    assert stall["verdict"]["signature"] == "collective-hang"
    assert stall["verdict"]["culprit_ranks"] == [2]
    assert stall["verdict"]["user_line"] == f"{script.name}:{number}"
    assert sorted(stall["evidence"]["pyspy"], key=int) == [str(r) for r in range(nproc)]
    assert stall["evidence"]["pyspy"]["2"]["moved"] is False  # the same stack in both dumps
    # A rank computing forever uses its CPU: it is the others, waiting for it, that are frozen.
    assert stall["stalled_ranks"] == ([r for r in range(nproc) if r != 2] if how == "spin" else list(range(nproc)))
    assert arrived - _blocked_at(out / "logs") <= 45
    _assert_gone_within_grace(script, stall["pids"], arrived)


def test_attached_by_log_directory_names_the_blocked_rank_and_kill_ends_the_job(tmp_path):
    script = _job_script(tmp_path)
    logs = tmp_path / "joblogs"
    logs.mkdir()
    job = subprocess.Popen(_torchrun(4, script, "--steps", "200", "--hang-rank", "2", "--hang-step", "5",
                                     launcher=("--log-dir", str(logs), "--redirects", "3")),
                           env=JOB_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc = _watch(str(logs), "--stall", "10", "-f", "json", "--action", "kill", "--grace", str(GRACE_S),
                      "--no-history")
        docs = _documents(proc)
        proc.wait(timeout=60)
        arrived, stall = docs[0]
        _assert_hang_verdict(stall, script)
        assert arrived - _blocked_at(logs) <= 45
        assert job.pid in stall["pids"]  # torchrun's agent, found as the ranks' parent
        assert job.wait(timeout=GRACE_S + 5) is not None
        _assert_gone_within_grace(script, stall["pids"], arrived)
        assert (logs / "postmortem-watch" / "pyspy" / "rank2.txt").is_file()
        assert proc.returncode == 1
    finally:
        _end([job], script)


def test_healthy_eight_rank_job_with_uneven_steps_exits_0_with_no_verdict(tmp_path):
    script = _job_script(tmp_path)
    proc = _watch("--stall", "10", "-f", "json", "--action", "kill", "--no-history", "--out", str(tmp_path / "w"),
                  "--", *_torchrun(8, script, "--steps", "25"))
    docs = _documents(proc)
    proc.wait(timeout=60)
    assert len(docs) == 1, [d["schema"] for _, d in docs]
    final = docs[0][1]
    assert final["stalls"] == 0 and final["verdict"] is None
    assert final["ended"] == "exited" and final["exit_code"] == 0
    assert sorted(final["ranks"]) == [str(r) for r in range(8)]
    # every line each rank wrote was counted, its last ones too (the launcher may exit between two looks)
    logs = tmp_path / "w" / "logs"
    written = {str(rank): sum(f.read_bytes().count(b"\n") for f in logs.glob(f"*/attempt_0/{rank}/*.log"))
               for rank in range(8)}
    assert all(n >= 26 for n in written.values()), written  # its first line and one a step
    assert {r: p["lines"] for r, p in final["ranks"].items()} == written
    assert proc.returncode == 0


def test_read_rest_counts_what_a_rank_wrote_since_the_last_look(tmp_path):
    log = tmp_path / "stdout.log"
    log.write_bytes(b"step 1\n")
    # as a look that found the file and its first line leaves a rank
    progress = watch.RankProgress(0, os.getpid(), offsets={log: 7}, lines=1, last_line="step 1")
    with open(log, "ab") as f:
        f.write(b"step 2\nstep 3\n")
    watch.read_rest(progress)
    assert (progress.lines, progress.last_line, progress.offsets[log]) == (3, "step 3", 21)


def test_read_new_reads_only_what_was_appended(tmp_path):
    log = tmp_path / "stdout.log"
    log.write_bytes(b"step 1\nstep 2\n")
    count, offset, last = watch.read_new(log, 0)
    assert (count, offset, last) == (2, 14, "step 2")
    assert watch.read_new(log, offset) == (0, 14, "")
    with open(log, "ab") as f:
        f.write(b"step 3\npartial")
    assert watch.read_new(log, offset) == (1, 28, "step 3")


def test_a_rank_computing_without_logging_progresses_and_a_sleeping_one_freezes(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ranks = {0: watch.RankProgress(0, busy.pid), 1: watch.RankProgress(1, idle.pid)}
        start = time.monotonic()
        for p in ranks.values():
            watch.look(p, start, time.time(), 1.0, None)
        ranks[0].progressed_at = ranks[1].progressed_at = start - 100  # both last seen long ago
        # Five looks a second apart, as watch takes them: on a loaded machine the computing process
        # may get less than a tenth of a core in one second, not in all of them.
        for _ in range(5):
            time.sleep(1.0)
            now = time.monotonic()
            for p in ranks.values():
                watch.look(p, now, time.time(), 1.0, None)
            if ranks[0].progressed_at > start:
                break
        assert watch.frozen(ranks, now, stall_s=10) == [1]
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def test_a_node_answering_a_stall_names_its_ranks_frozen_since_it_began_though_its_clock_started_later(tmp_path):
    # Node 1's watcher started its stall clock 3 s after node 0's ranks last moved; 10 s on, node
    # 0 saw the stall. Node 1's rank 2 has been frozen all along (its last move was seen a look
    # late), rank 3 moved 6 s into the stall: only rank 2 is stalled, though 10 s of node 1's own
    # clock have not passed.
    since = time.time() - 10
    node1 = watch._AttachedWatcher(watch.Options(stall_s=10), tmp_path / "out", processes.JobProcesses([]),
                                   dict, tmp_path, lambda doc: None, lambda text: None)
    node1.started, node1.started_wall = True, since + 3
    node1.ranks = {2: watch.RankProgress(2, 1, progressed_at=time.monotonic() - 7, progressed_wall=since + 3),
                   3: watch.RankProgress(3, 1, progressed_at=time.monotonic() - 4, progressed_wall=since + 6)}
    assert watch.frozen(node1.ranks, time.monotonic(), 10) == []
    assert node1.stalled_in({"id": "x", "by": "node0", "at": since + 10, "since": since}) == [2]
    node1.ranks[2].progressed_wall = since + 1  # seen moving once more, a look after node 0's last
    assert node1.stalled_in({"id": "x", "by": "node0", "at": since + 10, "since": since}) == [2]


def test_two_watchers_seeing_one_stall_in_the_same_look_answer_one_trigger(tmp_path, monkeypatch):
    # Both nodes' ranks froze together and both watchers look on the same tick: node 1 read that
    # no stall was reported yet, then node 0 reported it before node 1 wrote. Two triggers would
    # leave each node answering its own, and the leader reading its node's ranks alone.
    node0, node1 = watch.Meeting(tmp_path, "node0"), watch.Meeting(tmp_path, "node1")
    first = node0.trigger([0, 1], time.time() - 10)
    monkeypatch.setattr(node1, "_last_stall", lambda: 0)  # what node 1 read before node 0 wrote
    assert node1.trigger([2, 3], time.time() - 10) == first
    monkeypatch.undo()
    assert node0.latest() == first and node1.latest() == first
    assert sorted(p.name for p in (tmp_path / "triggers").iterdir()) == ["1.json"]
    assert node1.pending() == first  # node 1 answers node 0's trigger ...
    node1.answer(first["id"], [2, 3], [2, 3])
    assert node1.pending() is None and node0.answers(first["id"])[0]["stalled"] == [2, 3]
    later = node1.trigger([3], time.time())  # ... and a later stall is the next one
    assert later["id"] == "2" and later["by"] == "node1" and node0.pending() == later


def test_on_a_file_system_without_hard_links_a_stall_is_still_reported_once(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(watch.os, "link", no_links)
    node0, node1 = watch.Meeting(tmp_path, "node0"), watch.Meeting(tmp_path, "node1")
    first = node0.trigger([0, 1], time.time() - 10)
    assert json.loads((tmp_path / "triggers" / "1.json").read_text()) == first
    monkeypatch.setattr(node1, "_last_stall", lambda: 0)
    assert node1.trigger([2, 3], time.time() - 10) == first
    assert sorted(p.name for p in (tmp_path / "triggers").iterdir()) == ["1.json"]


def test_a_trigger_left_by_an_earlier_watch_is_not_answered(tmp_path):
    earlier = watch.Meeting(tmp_path, "earlier")
    earlier.trigger([1], time.time() - 100)
    trigger_file = tmp_path / "triggers" / "1.json"
    doc = json.loads(trigger_file.read_text())
    trigger_file.write_text(json.dumps({**doc, "at": time.time() - watch.ANSWER_WAIT_S - 1}))
    assert watch.Meeting(tmp_path, "now").pending() is None
    trigger_file.write_text(json.dumps({**doc, "at": time.time() - 1}))
    assert watch.Meeting(tmp_path, "now").pending()["id"] == "1"


def test_bad_input_is_one_sentence_and_exit_2(tmp_path):
    runner = CliRunner()
    for args, words in ((["--action", "restart", "--", "true"], "--action must be one of"),
                        (["--stall", "0", "--", "true"], "--stall and --interval must be positive"),
                        ([str(tmp_path), "--pids", "x1"], "--pids takes process ids"),
                        (["--", str(tmp_path / "no-such-job.sh")], "No such command"),
                        ([], "Give the job's command after --")):
        result = runner.invoke(app, ["watch", *args])
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output
        assert "Traceback" not in result.output
    assert not any(tmp_path.iterdir())  # nothing was created for a command that does not exist



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workers_of(agent: subprocess.Popen, count: int, timeout_s: float = 90) -> list[int]:
    """The pids of an agent's worker processes, once it has started ``count`` of them."""
    end = time.time() + timeout_s
    while time.time() < end:
        children = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == agent.pid:
                        children.append(int(name))
            except (OSError, ValueError):
                continue
        if len(children) >= count:
            return sorted(children)
        time.sleep(0.5)
    raise AssertionError(f"agent {agent.pid} did not start {count} workers")


def _two_nodes(tmp_path: Path, script: Path) -> tuple[Path, list[subprocess.Popen]]:
    """A 4-rank job as two torchrun agents of 2 ranks each (nodes 0 and 1 of a static rendezvous)
    on this machine, each writing its logs under the same shared directory; rank 2 blocks at step 5."""
    shared = tmp_path / "shared"
    shared.mkdir()
    port = str(_free_port())
    agents = []
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port,
                "--log-dir", str(shared / f"node{node}"), "--redirects", "3",
                str(script), "--steps", "200", "--hang-rank", "2", "--hang-step", "5"]
        agents.append(subprocess.Popen(argv, env=JOB_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return shared, agents


def _end(agents: list[subprocess.Popen], script: Path) -> None:
    """Kill what is left of a job the test started: its agents and every worker (a worker outlives
    a SIGKILLed agent, blocked forever)."""
    for pid in _processes_running(script):
        os.kill(pid, 9)
    for agent in agents:
        if agent.poll() is None:
            agent.kill()
        agent.wait()


def test_two_nodes_sharing_a_log_directory_dump_their_own_ranks_and_rank_0s_node_names_the_culprit(tmp_path):
    script = _job_script(tmp_path)
    shared, agents = _two_nodes(tmp_path, script)
    try:
        pids = [_workers_of(agent, 2) for agent in agents]
        watchers = [_watch(str(shared), "--pids", ",".join(map(str, node_pids)), "--stall", "10", "-f", "json",
                           "--action", "kill", "--grace", str(GRACE_S), "--no-history") for node_pids in pids]
        results: list[list] = [[], []]
        readers = [threading.Thread(target=lambda i=i: results[i].extend(_documents(watchers[i]))) for i in (0, 1)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(timeout=120)
        for w in watchers:
            w.wait(timeout=30)
        assert results[0] and results[1], [w.stderr.read() for w in watchers]
        (arrived, leader), (_, other) = results[0][0], results[1][0]
        _assert_hang_verdict(leader, script, dumped=("0", "1"))  # read on node 0 from both nodes' dumps
        assert arrived - _blocked_at(shared) <= 45
        assert leader["nodes"]["silent"] == [] and leader["nodes"]["ranks_not_dumped"] == []
        assert len(leader["nodes"]["answered"]) == 2
        assert other["report"] is None and other["read_by"] in leader["nodes"]["answered"]
        assert sorted(other["evidence"]["pyspy"]) == ["2", "3"]  # node 1 dumped its own ranks only
        assert other["verdict"]["culprit_ranks"] == [2]  # ... and got rank 0's node's verdict
        for agent in agents:
            assert agent.wait(timeout=GRACE_S + 5) is not None
        _assert_gone_within_grace(script, [p for node in pids for p in node], arrived)
    finally:
        _end(agents, script)


def test_a_node_whose_watcher_never_answers_is_named(tmp_path):
    script = _job_script(tmp_path)
    shared, agents = _two_nodes(tmp_path, script)
    try:
        node0 = _workers_of(agents[0], 2)
        _workers_of(agents[1], 2)
        proc = _watch(str(shared), "--pids", ",".join(map(str, node0)), "--stall", "10", "-f", "json",
                      "--action", "kill", "--grace", str(GRACE_S), "--no-history")
        docs = _documents(proc)
        proc.wait(timeout=30)
        stall = docs[0][1]
        assert stall["nodes"]["ranks_not_dumped"] == [2, 3]  # node 1 has no watcher: nobody dumped its ranks
        assert sorted(stall["evidence"]["pyspy"]) == ["0", "1"]
        assert stall["verdict"]["culprit_ranks"] != [0] and stall["verdict"]["culprit_ranks"] != [1]
    finally:
        _end(agents, script)


class _Lines:
    """watch's JSON lines, read by one thread as they come: ``next(timeout_s)`` or None."""

    def __init__(self, proc: subprocess.Popen):
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.queue.put(json.loads(line)) for line in proc.stdout],
                         daemon=True).start()

    def next(self, timeout_s: float) -> dict | None:
        try:
            return self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None


def test_report_prints_a_stall_once_and_keeps_watching_until_the_job_ends(tmp_path):
    script = _job_script(tmp_path)
    proc = _watch("--stall", "10", "-f", "json", "--action", "report", "--no-history", "--out", str(tmp_path / "w"),
                  "--", *_torchrun(4, script, "--steps", "200", "--hang-rank", "2"))
    lines = _Lines(proc)
    try:
        stall = lines.next(120)
        assert stall is not None and stall["verdict"]["culprit_ranks"] == [2]
        assert stall["action_taken"] == "report"
        assert lines.next(15) is None  # still stalled: not reported again
        assert proc.poll() is None and len(_processes_running(script, proc)) == 5  # the job and the watch go on
        for pid in _processes_running(script, proc):  # the job ends (here: the test kills it)
            os.kill(pid, 9)
        final = lines.next(30)
        proc.wait(timeout=30)
        assert final["stalls"] == 1 and final["ended"] == "exited"
        assert proc.returncode == 1  # a stall's finding was reported
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _processes_running(script):
            os.kill(pid, 9)


def test_dump_stops_watching_and_leaves_the_job_running(tmp_path):
    script = _job_script(tmp_path)
    out = tmp_path / "w"
    proc = _watch("--stall", "10", "-f", "json", "--action", "dump", "--no-history", "--out", str(out),
                  "--", *_torchrun(4, script, "--steps", "200", "--hang-rank", "2"))
    try:
        docs = _documents(proc)
        proc.wait(timeout=30)
        stall, final = docs[0][1], docs[-1][1]
        assert stall["verdict"]["culprit_ranks"] == [2] and stall["action_taken"] == "dump"
        assert final["ended"] == "watching_stopped" and final["killed"] is None
        assert (out / "pyspy" / "rank2.txt").is_file()
        assert len(_processes_running(script)) == 5  # torchrun and its 4 ranks, still there
        assert proc.returncode == 1
    finally:
        for pid in _processes_running(script):
            os.kill(pid, 9)

"""Watch a live distributed job: per-rank progress, a stall's evidence taken while the ranks are
still there, the same analysis as ``analyze``, then report, dump or kill.

    postmortem watch --stall 60 --action kill -- torchrun --nproc-per-node 8 train.py
    postmortem watch /shared/job-1234/logs --stall 120          (a job started elsewhere)

What it reads, every ``--interval`` seconds and nothing more: the bytes each rank's log files
gained since the last look (the files on the rank process's stdout/stderr and any it has open
under the log directory, found in ``/proc/<pid>/fd``), and the CPU time of each rank's process
(``/proc/<pid>/stat`` fields 14-15). A rank whose logs did not grow and that used less than
``CPU_PROGRESS_SHARE`` of a core for ``--stall`` seconds is frozen; one frozen rank is a stall
(all of them frozen, or some advancing while others wait, as ranks 0, 1 and 3 do in an
all_reduce that rank 2 never joins).

What it writes, on a stall: ``py-spy dump`` of every rank twice, ``DUMP_GAP_S`` apart, the second
kept as ``pyspy/rank<N>.txt`` (py-spy's own text, e.g.
``Thread 28991 (idle): "MainThread"`` / ``    wait_for_eval_signal (watch_job.py:26)``) where
discovery takes the rank from the name; a flight-recorder dump through ProcessGroupNCCL's debug
pipe (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``: writing to ``<prefix><rank>.pipe`` makes the rank dump
without stopping) when a rank has one; then ``api.ingest`` reads the directory into a run
labelled ``watch`` in the history, exactly as ``analyze`` would.

A job is started the way ``rerun`` starts one (its instruments, its own session, every process
found by a token in its environment); an attached job's ranks are the processes that carry
``RANK`` in their environment and write into the log directory, or the pids given. Nothing read
from a log or from a process's command line is ever run.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from postmortem import api, processes, summary
from postmortem.errors import PostmortemError
from postmortem.parsers import pyspy as pyspy_parser
from postmortem.parsers.source import Source
from postmortem.ranges import rank_ranges
from postmortem.replay import rerun

log = logging.getLogger(__name__)

SCHEMA = "postmortem.watch/1"
ACTIONS = ("report", "dump", "kill")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A rank waiting in a gloo collective or on a lock uses ~1 clock tick in 3 s (background threads);
# one computing a step uses most of a core even when it shares a core with others.
CPU_PROGRESS_SHARE = 0.10
DUMP_GAP_S = 2.0  # between the two py-spy dumps of a rank: a stuck rank's stack is the same in both
PYSPY_TIMEOUT_S = 15.0
READ_CHUNK = 1 << 20  # new bytes read per log file per look, at most: the rest is counted, not read
FR_DUMP_PREFIX = "nccl_trace_rank_"  # what instrument_env sets TORCH_FR_DUMP_TEMP_FILE to, under the out dir
FR_PIPE_PREFIX = "fr_pipe_rank_"  # ProcessGroupNCCL makes <prefix><rank>.pipe and dumps when it is written to
RANK_RESCAN_S = 5.0  # how often the process table is read again for new or restarted ranks
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


# ---- the process table -------------------------------------------------------------------------


def cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of a process (all its threads), in clock ticks; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # stat fields 14 and 15, counted after the name


def written_files(pid: int, under: Path | None = None) -> list[Path]:
    """Regular files a process writes its logs to: its stdout and stderr, and any file it has
    open under ``under``. torchrun's ``--redirects`` puts a worker's stdout on attempt_N/<r>/stdout.log."""
    found = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if not target.is_absolute() or target.name.endswith(" (deleted)"):
            continue
        inside = under is not None and target.is_relative_to(under)
        if (fd in ("1", "2") or inside) and target.is_file() and target not in found:
            found.append(target)
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def is_launcher(pid: int) -> bool:
    """Whether a process is torchrun's agent (read from its argv, never run)."""
    argv = _cmdline(pid)
    return bool(argv) and (Path(argv[0]).name in LAUNCHERS or any(a in LAUNCHERS for a in argv[1:3]))


def ranks_of(pids: Iterable[int]) -> dict[int, int]:
    """rank -> pid: each process whose environment says RANK, the topmost one of each rank
    (a rank's DataLoader workers and compile workers inherit its RANK)."""
    ranked = {}
    for pid in pids:
        value = processes.environ(pid).get("RANK", "")
        if value.isdigit():
            ranked[pid] = int(value)
    by_rank: dict[int, int] = {}
    for pid, rank in sorted(ranked.items()):
        parent = (processes.stat(pid) or (0,))[0]
        if ranked.get(parent) != rank:
            by_rank.setdefault(rank, pid)
    return by_rank


def ranks_writing_into(directory: Path) -> dict[int, int]:
    """rank -> pid of the processes that carry RANK and write a file under ``directory``."""
    me = os.getpid()
    candidates = [pid for pid in processes.all_pids() if pid != me and any(
        f.is_relative_to(directory) for f in written_files(pid, directory))]
    return ranks_of(candidates)


def stop(tree: processes.JobProcesses, grace_s: float) -> list[int]:
    """SIGTERM every process of the job (torchrun passes it on to its workers too), SIGKILL what is
    left after ``grace_s``, and wait for the kernel to finish them: the pids that survived."""
    tree.signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and tree.alive():
        tree.reap()
        time.sleep(0.1)
    tree.signal(signal.SIGKILL)
    for _ in range(50):
        tree.reap()
        if not tree.alive():
            break
        time.sleep(0.05)
    return sorted(tree.alive())


# ---- progress ------------------------------------------------------------------------------------


@dataclass
class RankProgress:
    """What one rank has done, as seen from outside it."""

    rank: int
    pid: int
    offsets: dict[Path, int] = field(default_factory=dict)  # bytes of each log file already seen
    lines: int = 0
    last_line: str = ""
    cpu: int | None = None  # clock ticks at the last look
    progressed_at: float = 0.0  # monotonic time of its last sign of progress
    progressed_wall: float = 0.0  # the same, as a Unix time
    spoke: bool = False  # wrote a log line (or has no log file to write one to): past its imports
    gone: bool = False
    # the job was started by this watch: a file first seen holds only what it wrote since, all of
    # it counted (when attaching to a running job, what a file held before is not news)
    counts_whole_files: bool = False


def read_new(path: Path, offset: int) -> tuple[int, int, str]:
    """(new lines, new offset, last complete line) of a file grown past ``offset``: only new bytes
    are read, at most READ_CHUNK of them (the offset still moves to the end)."""
    try:
        size = path.stat().st_size
    except OSError:
        return 0, offset, ""
    if size < offset:  # truncated or rotated: start over
        offset = 0
    if size == offset:
        return 0, offset, ""
    with open(path, "rb") as f:
        f.seek(max(offset, size - READ_CHUNK))
        data = f.read(size - f.tell())
    complete = data[: data.rfind(b"\n") + 1]
    last = complete.rstrip(b"\n").rsplit(b"\n", 1)[-1].decode(errors="replace")[:300]
    return data.count(b"\n"), size, last


def read_rest(progress: RankProgress) -> None:
    """Count what a rank wrote since the last look into the files it was seen writing."""
    for path, offset in list(progress.offsets.items()):
        count, progress.offsets[path], last = read_new(path, offset)
        progress.lines += count
        progress.last_line = last or progress.last_line


def look(progress: RankProgress, now: float, wall: float, interval_s: float, under: Path | None) -> None:
    """Update one rank's progress: its log files' new lines and its CPU time since the last look."""
    ticks = cpu_ticks(progress.pid)
    if ticks is None:
        # It exited since the last look: what it wrote last is still in the files it had open.
        read_rest(progress)
        progress.gone = True
        return
    moved = False
    files = written_files(progress.pid, under)
    if not files:
        progress.spoke = True
    for path in files:
        offset = progress.offsets.get(path)
        if offset is None:  # a file seen for the first time
            count, progress.offsets[path], last = read_new(path, 0)
            progress.spoke = progress.spoke or progress.offsets[path] > 0
            if progress.counts_whole_files:
                progress.lines += count
                progress.last_line = last or progress.last_line
            continue
        count, progress.offsets[path], last = read_new(path, offset)
        if count or progress.offsets[path] != offset:
            moved = progress.spoke = True
            progress.lines += count
            progress.last_line = last or progress.last_line
    if progress.cpu is not None and ticks - progress.cpu >= CPU_PROGRESS_SHARE * interval_s * CLOCK_TICKS:
        moved = True
    progress.cpu = ticks
    if moved or not progress.progressed_at:
        progress.progressed_at, progress.progressed_wall = now, wall


def frozen(ranks: Mapping[int, RankProgress], now: float, stall_s: float) -> list[int]:
    """The live ranks that showed no progress for ``stall_s`` seconds."""
    return sorted(r for r, p in ranks.items() if not p.gone and now - p.progressed_at >= stall_s)


def still_since(ranks: Mapping[int, RankProgress], wall: float) -> list[int]:
    """The live ranks that showed no progress after the Unix time ``wall``: those of this node
    stalled in a stall another node's watcher saw (whose clock may have started before ours)."""
    return sorted(r for r, p in ranks.items() if not p.gone and p.progressed_wall <= wall)


# ---- evidence ------------------------------------------------------------------------------------


def pyspy_twice(ranks: Mapping[int, int], out: Path, gap_s: float = DUMP_GAP_S,
                between: Callable[[], None] | None = None) -> dict[int, dict]:
    """py-spy every rank (in parallel), ``gap_s`` later again; the second dump of each rank is
    written to ``out/pyspy/rank<N>.txt``. rank -> {file, innermost: [first, second], moved}."""
    exe = rerun.pyspy_exe()
    if exe is None:
        raise PostmortemError("py-spy is not installed (pip install py-spy): watch needs it to see where ranks are.")

    def dump_all() -> dict[int, str]:
        procs = {rank: subprocess.Popen([exe, "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                 for rank, pid in ranks.items()}
        texts = {}
        for rank, proc in procs.items():
            try:
                texts[rank] = proc.communicate(timeout=PYSPY_TIMEOUT_S)[0].decode(errors="replace")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                log.warning("py-spy dump of rank %d timed out", rank)
        return texts

    first = dump_all()
    if between:
        between()
    time.sleep(gap_s)
    second = dump_all()
    (out / "pyspy").mkdir(parents=True, exist_ok=True)
    taken = {}
    for rank, text in second.items():
        path = out / "pyspy" / f"rank{rank}.txt"
        path.write_text(text, encoding="utf-8")
        before, after = innermost(first.get(rank, "")), innermost(text)
        taken[rank] = {"file": str(path.relative_to(out)), "innermost": [before, after],
                       "moved": before != after}
    return taken


def innermost(dump: str) -> str | None:
    """The main thread's innermost frame of a py-spy text dump, as ``function (file:line)``."""
    stacks, _ = pyspy_parser.parse_text(dump, Source(path=Path("-"), name="-", kind=pyspy_parser.KIND))
    main = [s for s in stacks if s["thread"] == "MainThread"] or stacks
    if not main:
        return None
    top = min(main, key=lambda s: s["depth"])
    return f"{top['function']} ({top['file']}:{top['line']})"


def ask_flight_recorder(ranks: Mapping[int, int], default_prefix: Path | None) -> list[str]:
    """Write to each rank's ProcessGroupNCCL debug pipe (a dump without stopping the rank):
    the pipes written to. A rank without one (gloo, monitoring off) is left alone."""
    asked = []
    for rank, pid in ranks.items():
        prefix = processes.environ(pid).get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") or (
            str(default_prefix) if default_prefix else "")
        if not prefix:
            continue
        pipe = f"{prefix}{rank}.pipe"
        try:
            if not stat.S_ISFIFO(os.stat(pipe).st_mode):
                continue
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO when nobody reads it: no NCCL group
        except OSError:
            continue
        try:
            os.write(fd, b"1\n")
            asked.append(pipe)
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def collective_timeout_s(con, run_id: str) -> float | None:
    """The collective timeout in force, when the logs say it (ProcessGroupNCCL's init options,
    a watchdog line, the flight recorder's entries); gloo says nothing of it."""
    row = con.execute(
        """
        SELECT min(t) FROM (
            SELECT TRY_CAST(attrs->>'timeout_ms' AS BIGINT) AS t FROM events
            WHERE run_id = ? AND kind IN ('pg_init', 'watchdog_timeout')
            UNION ALL SELECT timeout_ms FROM collectives WHERE run_id = ?
        ) WHERE t > 0
        """, [run_id, run_id]).fetchone()
    return row[0] / 1000 if row and row[0] else None


def _iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# ---- the loop ------------------------------------------------------------------------------------


@dataclass
class Options:
    stall_s: float = 60.0
    interval_s: float = 1.0
    action: str = "report"
    grace_s: float = 10.0
    db: Path | None = None
    keep: bool = True
    fail_on: str = "error"
    labels: dict[str, str] = field(default_factory=dict)


def check_options(options: Options) -> None:
    if options.action not in ACTIONS:
        raise PostmortemError(f"--action must be one of {', '.join(ACTIONS)}, not {options.action!r}.")
    if options.stall_s <= 0 or options.interval_s <= 0 or options.grace_s < 0:
        raise PostmortemError("--stall and --interval must be positive and --grace not negative (seconds).")
    if options.interval_s > options.stall_s:
        raise PostmortemError("--interval must not be longer than --stall.")
    api.exit_status([], options.fail_on)
    if rerun.pyspy_exe() is None:
        raise PostmortemError("py-spy is not installed (pip install py-spy): watch needs it to see where ranks wait.")


class Watcher:
    """One watch: the job's processes, its ranks' progress, and what it found."""

    def __init__(self, options: Options, out: Path, tree: processes.JobProcesses,
                 find_ranks: Callable[[], dict[int, int]], log_dir: Path | None,
                 emit: Callable[[dict], None], note: Callable[[str], None], command: list[str] | None = None):
        self.options, self.out, self.tree, self.find_ranks = options, out, tree, find_ranks
        self.log_dir, self.emit, self.note, self.command = log_dir, emit, note, command
        self.ranks: dict[int, RankProgress] = {}
        self.stalls: list[dict] = []
        self.armed = True  # a stall is reported once; progress re-arms it
        self.found_at = -RANK_RESCAN_S
        self.started = False  # every rank has written a line: the job is past its start
        self.started_wall = 0.0  # when the stall clock started (Unix time)
        self.looks = 0
        self.expected: int | None = None  # ranks on this node (set for --pids)

    def refresh_ranks(self, now: float, wall: float) -> None:
        # Finding the ranks reads the process table: every RANK_RESCAN_S, or when one is gone.
        complete = self.ranks and len(self.ranks) >= self.local_world_size()
        if now - self.found_at < RANK_RESCAN_S and complete and not any(p.gone for p in self.ranks.values()):
            found = {}
        else:
            found, self.found_at = self.find_ranks(), now
        for rank, pid in found.items():
            known = self.ranks.get(rank)
            if known is None or known.pid != pid:  # a new rank, or torchrun restarted it
                self.ranks[rank] = RankProgress(rank, pid, progressed_at=now, progressed_wall=wall,
                                                counts_whole_files=self.command is not None)
        for p in self.ranks.values():
            look(p, now, wall, self.options.interval_s, self.log_dir)

    def local_world_size(self) -> int:
        """How many ranks to expect here: the pids given, or what torchrun tells its workers
        (LOCAL_WORLD_SIZE), read once."""
        if self.expected is None:
            for p in self.ranks.values():
                value = processes.environ(p.pid).get("LOCAL_WORLD_SIZE", "")
                if value.isdigit():
                    self.expected = int(value)
                    break
        return self.expected or 1

    def step(self) -> dict | None:
        """One look at every rank; a stall's document when this look found one."""
        self.looks += 1
        now, wall = time.monotonic(), time.time()
        self.refresh_ranks(now, wall)
        stuck = self.stalled_ranks(now, wall)
        return self.on_stall(stuck, now) if stuck else None

    def stalled_ranks(self, now: float, wall: float) -> list[int]:
        """The frozen ranks, once per stall (progress re-arms it), after the job's start."""
        live = [p for p in self.ranks.values() if not p.gone]
        if not self.started:
            # Ranks that finished importing wait for the others in the rendezvous: the stall clock
            # starts once every rank has written a line.
            if not live or len(live) < self.local_world_size() or not all(p.spoke for p in live):
                return []
            self.started, self.started_wall = True, wall
            for p in live:
                p.progressed_at, p.progressed_wall = now, wall
        stuck = frozen(self.ranks, now, self.options.stall_s)
        if not stuck:
            self.armed = True
            return []
        if not self.armed:
            return []
        self.armed = False
        return stuck

    def on_stall(self, stuck: list[int], now: float) -> dict | None:
        since, since_wall = self.since(stuck)
        self.note(f"stall: rank(s) {rank_ranges(stuck)} showed no progress for {now - since:.0f} s; "
                  f"taking py-spy dumps of {len(self.live())} rank(s)")
        dumps, asked = self.evidence()
        return self.verdict_doc(stuck, since, since_wall, dumps, asked)

    def live(self) -> dict[int, int]:
        return {r: p.pid for r, p in self.ranks.items() if not p.gone}

    def since(self, stuck: list[int]) -> tuple[float, float]:
        """When the stalled ranks (all live ones when none is named) last progressed: monotonic, wall."""
        ranks = [self.ranks[r] for r in stuck] or [p for p in self.ranks.values() if not p.gone]
        return min(p.progressed_at for p in ranks), min(p.progressed_wall for p in ranks)

    def evidence(self) -> tuple[dict[int, dict], list[str]]:
        live = self.live()
        fr_prefix = self.out / FR_PIPE_PREFIX if self.command else None
        asked: list[str] = []
        dumps = pyspy_twice(live, self.out, between=lambda: asked.extend(ask_flight_recorder(live, fr_prefix)))
        return dumps, asked

    def verdict_doc(self, stuck: list[int], since: float, since_wall: float, dumps: dict[int, dict],
                    asked: list[str]) -> dict:
        """Analyze the directory as a run labelled watch; the stall's document."""
        labels = {"watch": "true", "watch_stalled_ranks": rank_ranges(stuck),
                  "watch_stalled_s": f"{time.monotonic() - since:.0f}", **self.options.labels}
        if self.command:
            labels["command"] = shlex.join(self.command)
        analyzed = self.analyzed_dir()
        run_id = report = timeout_s = error = None
        try:
            con, run_id, _ = api.ingest(analyzed, db=self.options.db, keep=self.options.keep,
                                        fail_on=self.options.fail_on, labels=labels)
            report = summary.report(con, run_id)
            timeout_s = collective_timeout_s(con, run_id)
            con.close()
        except PostmortemError as exc:  # the action still runs: a hung job must not outlive its analysis
            error = f"the stalled job's logs in {analyzed} could not be analyzed: {exc}"
            self.note(error)
        stalled_s = round(time.monotonic() - since, 1)
        doc = {
            "schema": SCHEMA, "run_id": run_id, "source_dir": str(analyzed),
            "command": self.command, "ranks": self.rank_table(time.monotonic()),
            "stalled_ranks": stuck, "stalled_since": _iso(since_wall), "stalled_s": stalled_s,
            "timeout_s": timeout_s, "timeout_at": _iso(since_wall + timeout_s) if timeout_s else None,
            "timeout_left_s": round(timeout_s - stalled_s, 1) if timeout_s else None,
            "evidence": {"pyspy": dumps, "flight_recorder_pipes": asked},
            "verdict": report and report["verdict"],
            "culprit_innermost": culprit_frames(report["verdict"], self.out / "pyspy") if report else {},
            "action_taken": self.options.action, "killed": None, "pids": sorted(self.tree.alive()), "report": report,
            "analysis_error": error,
        }
        self.stalls.append(doc)
        return doc

    def analyzed_dir(self) -> Path:
        return self.out

    def last_look(self) -> None:
        """Every rank's files read to their end once the watch is over: the job can end, or be
        killed, between two looks, and then its ranks' last lines came after the last one."""
        for progress in self.ranks.values():
            read_rest(progress)

    def rank_table(self, now: float) -> dict[str, dict]:
        return {str(r): {"pid": p.pid, "lines": p.lines, "cpu_s": round((p.cpu or 0) / CLOCK_TICKS, 2),
                         "idle_s": round(now - p.progressed_at, 1), "last_line": p.last_line, "gone": p.gone}
                for r, p in sorted(self.ranks.items())}


def culprit_frames(verdict: dict, pyspy_dir: Path) -> dict[str, str | None]:
    """rank -> the innermost frame py-spy saw in each culprit rank's main thread (its wait), from
    the dumps in ``pyspy_dir`` (this node's or another's, on a shared directory)."""
    frames = {}
    for rank in verdict.get("culprit_ranks") or []:
        try:
            frames[str(rank)] = innermost((pyspy_dir / f"rank{rank}.txt").read_text(encoding="utf-8"))
        except OSError:
            continue
    return frames


def watch_command(argv: list[str], options: Options, out: Path | None = None,
                  emit: Callable[[dict], None] = lambda doc: None, note: Callable[[str], None] = log.info,
                  echo: Callable[[bytes], None] | None = None) -> dict:
    """Start ``argv`` with rerun's instruments and watch it until it exits, or until a stall's
    action (dump, kill) ends the watch. Returns the final document."""
    check_options(options)
    cpu0 = time.process_time()
    if shutil.which(argv[0]) is None:  # before anything is created
        where = "not on PATH" if "/" not in argv[0] else "no executable file there"
        raise PostmortemError(f"No such command: {argv[0]} ({where}).")
    out = _new_dir(out, "postmortem-watch")
    token = secrets.token_hex(8)
    env, chosen = rerun.instrument_env(out, os.environ, token=token)
    env.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", str(out / FR_PIPE_PREFIX))
    was_subreaper = processes.subreaper(True)
    t0 = time.monotonic()
    # The job writes its console to the file itself: it outlives a watch that stops (--action dump).
    try:
        with open(out / "console.log", "wb") as console:
            try:
                proc = subprocess.Popen(argv, env=env, stdout=console, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except FileNotFoundError as exc:
                raise PostmortemError(f"No such command: {argv[0]}.") from exc
            except PermissionError as exc:
                raise PostmortemError(f"Cannot run {argv[0]}: {exc.strerror}.") from exc
        tree = processes.JobProcesses([proc.pid], token)
        watcher = Watcher(options, out, tree, lambda: ranks_of(tree.alive()), out / "logs", emit, note, argv)
        tail = _Tail(out / "console.log", echo)
        ended, killed = _loop(watcher, tree, lambda: proc.poll() is not None, tail, options)
        if ended == "exited" and tree.alive():  # workers left behind by a launcher that exited
            stop(tree, min(options.grace_s, 5.0))
        elif ended == "interrupted":  # Ctrl-C on the watch of a job it started ends the job, as rerun's does
            killed = {"pids": sorted(tree.seen), "survivors": stop(tree, options.grace_s), "seconds": None}
        tree.reap()
        tail.poll()
        watcher.last_look()
    finally:
        if not was_subreaper:
            processes.subreaper(False)
    exit_code = proc.returncode if ended != "watching_stopped" else None
    report = None
    if ended == "exited" and exit_code and not watcher.stalls:  # it failed on its own: say why, as rerun would
        labels = {"watch": "true", "command": shlex.join(argv), **options.labels}
        try:
            report = api.analyze(out, db=options.db, keep=options.keep, fail_on=options.fail_on, labels=labels)
        except PostmortemError as exc:
            note(f"the job left nothing to analyze: {exc}")
    final = {"schema": SCHEMA, "command": argv, "out_dir": str(out), "ended": ended, "exit_code": exit_code,
             "seconds": round(time.monotonic() - t0, 1), "pids": sorted(tree.seen), "instruments": chosen,
             "stalls": len(watcher.stalls), "killed": killed, "ranks": watcher.rank_table(time.monotonic()),
             "looks": watcher.looks, "watch_cpu_s": round(time.process_time() - cpu0, 2),
             "verdict": watcher.stalls[-1]["verdict"] if watcher.stalls else (report or {}).get("verdict"),
             "report": report}
    return final


def watch_directory(directory: Path, options: Options, pids: list[int] | None = None,
                    emit: Callable[[dict], None] = lambda doc: None,
                    note: Callable[[str], None] = log.info, wait_s: float | None = None) -> dict:
    """Attach to a job started elsewhere whose logs go to ``directory``: its ranks are ``pids``, or
    the processes carrying RANK that write under it (found within ``wait_s``, the stall by default)."""
    check_options(options)
    cpu0 = time.process_time()
    directory = Path(directory)
    if not directory.is_dir():
        raise PostmortemError(f"{directory} is not a directory.")
    directory = directory.resolve()
    if pids:
        missing = [p for p in pids if cpu_ticks(p) is None]
        if missing:
            raise PostmortemError(f"No such process: {', '.join(map(str, missing))}.")
        by_rank = ranks_of(pids)
        given = sorted(pids)

        def find() -> dict[int, int]:
            return by_rank or {i: p for i, p in enumerate(given)}
    else:
        def find() -> dict[int, int]:
            return ranks_writing_into(directory)
    deadline = time.monotonic() + (options.stall_s if wait_s is None else wait_s)
    found = find()
    while not found and time.monotonic() < deadline:
        time.sleep(min(options.interval_s, 1.0))
        found = find()
    if not found:
        raise PostmortemError(f"No running process with RANK in its environment writes into {directory}; "
                              "give the ranks' pids with --pids.")
    roots = sorted(set(found.values()) | {parent for pid in found.values()
                                          if (parent := (processes.stat(pid) or (0,))[0]) and is_launcher(parent)})
    tree = processes.JobProcesses(roots)
    tree.scan()
    out = directory / "postmortem-watch"
    watcher = _AttachedWatcher(options, out, tree, find, directory, emit, note)
    if pids:
        watcher.expected = len(find())
    t0 = time.monotonic()
    ended, killed = _loop(watcher, tree, lambda: all(p.gone for p in watcher.ranks.values()) and bool(watcher.ranks),
                          None, options)
    watcher.last_look()
    return {"schema": SCHEMA, "command": None, "out_dir": str(directory), "ended": ended, "exit_code": None,
            "seconds": round(time.monotonic() - t0, 1), "pids": sorted(tree.seen), "instruments": {},
            "stalls": len(watcher.stalls), "killed": killed, "ranks": watcher.rank_table(time.monotonic()),
            "looks": watcher.looks, "watch_cpu_s": round(time.process_time() - cpu0, 2),
            "verdict": watcher.stalls[-1]["verdict"] if watcher.stalls else None, "report": None}


class Meeting:
    """How the watchers of one job's nodes agree on a stall, through files in the shared log
    directory (no process of our own beyond the watchers):

        postmortem-watch/watchers/<id>.json         each watcher, its host and ranks, written at start
        postmortem-watch/triggers/<stall>.json      {"id", "by", "at", "since"}: a watcher saw stall 1, 2, ...
        postmortem-watch/answers/<stall>/<id>.json  a watcher dumped its ranks for that stall
        postmortem-watch/verdicts/<stall>.json      the verdict the leader (the node holding rank 0) read

    Every file is written whole and renamed into place, so a reader never sees half of one; a
    trigger is created only where none is (``_create``), so of two watchers that see one stall in
    the same look only one reports it and both answer that one.
    """

    def __init__(self, root: Path, me: str):
        self.root, self.me = root, me
        self.answered: set[str] = set()

    def _staged(self, path: Path, doc: dict) -> Path:
        """``doc`` written whole beside ``path``, under a name of this watcher's, to be put in place."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{self.me}.tmp")
        tmp.write_text(json.dumps(doc, default=str), encoding="utf-8")
        return tmp

    def _write(self, path: Path, doc: dict) -> None:
        os.replace(self._staged(path, doc), path)

    def _create(self, path: Path, doc: dict) -> bool:
        """``_write``, unless ``path`` exists (another watcher's): linked into place, as a link fails
        where the name exists (on NFS too); on a file system without links, created exclusively and
        then written. Whether this watcher's ``doc`` is the one there."""
        tmp = self._staged(path, doc)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, default=str))
        return True

    def _read(self, path: Path) -> dict | None:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def register(self, ranks: list[int], world_size: int | None) -> None:
        self._write(self.root / "watchers" / f"{self.me}.json",
                    {"watcher": self.me, "host": os.uname().nodename, "ranks": ranks, "world_size": world_size})

    def watchers(self) -> list[dict]:
        found = (self._read(p) for p in sorted((self.root / "watchers").glob("*.json")))
        return [w for w in found if w and isinstance(w.get("ranks"), list)]

    def _last_stall(self) -> int:
        """The number of the last stall reported here (0: none yet)."""
        return max((int(p.stem) for p in (self.root / "triggers").glob("*.json") if p.stem.isdigit()), default=0)

    def latest(self) -> dict | None:
        number = self._last_stall()
        return self._read(self.root / "triggers" / f"{number}.json") if number else None

    def pending(self) -> dict | None:
        """The latest stall, when this watcher has not answered it yet and the leader still waits
        for answers (a trigger left in the directory by an earlier watch is not news)."""
        trigger = self.latest()
        if not trigger or not trigger.get("id") or trigger["id"] in self.answered:
            return None
        at = trigger.get("at")
        return trigger if isinstance(at, (int, float)) and time.time() - at < ANSWER_WAIT_S else None

    def trigger(self, stuck: list[int], since_wall: float) -> dict:
        """Report a stall as the next one; when another watcher reported that one first (it saw
        the same stall in the same look), its trigger: created only where none is (``_create``),
        two watchers can never both report stall N."""
        number = self._last_stall() + 1
        doc = {"id": str(number), "by": self.me, "at": time.time(), "since": since_wall, "stalled_ranks": stuck}
        path = self.root / "triggers" / f"{number}.json"
        return doc if self._create(path, doc) else self._read(path) or doc

    def answer(self, stall_id: str, ranks: list[int], stalled: list[int]) -> None:
        self.answered.add(stall_id)
        self._write(self.root / "answers" / stall_id / f"{self.me}.json",
                    {"watcher": self.me, "ranks": ranks, "stalled": stalled})

    def answers(self, stall_id: str) -> list[dict]:
        found = (self._read(p) for p in sorted((self.root / "answers" / stall_id).glob("*.json")))
        return [a for a in found if a and isinstance(a.get("ranks"), list)]

    def leader(self, trigger: dict) -> str:
        """The watcher holding rank 0; the one that saw the stall when no watcher holds it."""
        return next((w["watcher"] for w in self.watchers() if 0 in w["ranks"]), trigger.get("by") or self.me)

    def publish(self, stall_id: str, doc: dict) -> None:
        self._write(self.root / "verdicts" / f"{stall_id}.json", doc)

    def verdict(self, stall_id: str) -> dict | None:
        return self._read(self.root / "verdicts" / f"{stall_id}.json")


def wait_for(check: Callable[[], object], timeout_s: float, step_s: float = 0.25) -> object:
    """``check()``'s first truthy value within ``timeout_s`` (its last value otherwise)."""
    end = time.monotonic() + timeout_s
    value = check()
    while not value and time.monotonic() < end:
        time.sleep(step_s)
        value = check()
    return value


ANSWER_WAIT_S = 30.0  # how long the leader waits for every node's dumps; a node silent that long is named


class _AttachedWatcher(Watcher):
    """A job started elsewhere, maybe on many nodes sharing its log directory: dumps go under it,
    a stall seen by any node's watcher is answered by all (``Meeting``), and the watcher of the
    node holding rank 0 reads the whole directory into one verdict."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.meeting = Meeting(self.out, f"{os.uname().nodename}-{os.getpid()}")
        self.registered: list[int] = []

    def analyzed_dir(self) -> Path:
        return self.log_dir

    def world_size(self) -> int | None:
        for p in self.ranks.values():
            value = processes.environ(p.pid).get("WORLD_SIZE", "")
            if value.isdigit():
                return int(value)
        return None

    def step(self) -> dict | None:
        doc = super().step()
        if sorted(self.ranks) != self.registered:
            self.registered = sorted(self.ranks)
            self.meeting.register(self.registered, self.world_size())
        if doc is None and (trigger := self.meeting.pending()) and self.ranks:
            self.note(f"watcher {trigger.get('by')} saw a stall: dumping this node's rank(s) "
                      f"{rank_ranges(sorted(self.live()))}")
            doc = self.answer(trigger, [])
        return doc

    def on_stall(self, stuck: list[int], now: float) -> dict | None:
        latest = self.meeting.latest()
        if latest and latest.get("id") in self.meeting.answered and time.time() - latest.get("at", 0) < self.options.stall_s:
            return None  # the stall another node reported a moment ago: already answered
        trigger = self.meeting.pending() or self.meeting.trigger(stuck, self.since(stuck)[1])
        self.note(f"stall: rank(s) {rank_ranges(stuck)} showed no progress for {now - self.since(stuck)[0]:.0f} s; "
                  f"taking py-spy dumps of {len(self.live())} rank(s)")
        return self.answer(trigger, stuck)

    def answer(self, trigger: dict, stuck: list[int]) -> dict:
        stuck = stuck or self.stalled_in(trigger)
        since, since_wall = self.since(stuck)
        dumps, asked = self.evidence()
        self.meeting.answer(trigger["id"], sorted(dumps), stuck)
        leader = self.meeting.leader(trigger)
        if leader != self.meeting.me:
            self.note(f"dumps written; the verdict is read by watcher {leader} (the node holding rank 0)")
            verdict = wait_for(lambda: self.meeting.verdict(trigger["id"]), 2 * ANSWER_WAIT_S)
            doc = {"schema": SCHEMA, "run_id": (verdict or {}).get("run_id"), "source_dir": str(self.log_dir),
                   "command": None, "ranks": self.rank_table(time.monotonic()), "stalled_ranks": stuck,
                   "stalled_since": _iso(since_wall), "stalled_s": round(time.monotonic() - since, 1),
                   "timeout_s": None, "timeout_at": None, "timeout_left_s": None,
                   "evidence": {"pyspy": dumps, "flight_recorder_pipes": asked},
                   "verdict": (verdict or {}).get("verdict"), "culprit_innermost": {}, "read_by": leader,
                   "action_taken": self.options.action, "killed": None, "pids": sorted(self.tree.alive()),
                   "report": None}
            self.stalls.append(doc)
            return doc
        nodes = self.wait_for_nodes(trigger["id"])
        everywhere = sorted({r for a in self.meeting.answers(trigger["id"]) for r in a.get("stalled") or []
                             if isinstance(r, int)} | set(stuck))
        doc = self.verdict_doc(everywhere, since, since_wall, dumps, asked)
        doc["nodes"] = nodes
        self.meeting.publish(trigger["id"], {"run_id": doc["run_id"], "verdict": doc["verdict"], "nodes": nodes})
        return doc

    def stalled_in(self, trigger: dict) -> list[int]:
        """This node's ranks stalled in another node's stall: no progress seen in its later half
        (each node sees progress at its own looks, up to --interval late), nor since this watcher's
        clock started when that was later. The nodes' watchers start apart: a full --stall of our
        own clock would leave out ranks stalled all along."""
        since = trigger.get("since")
        if not isinstance(since, (int, float)) or not self.started:
            return frozen(self.ranks, time.monotonic(), self.options.stall_s)
        return still_since(self.ranks, max(since + self.options.stall_s / 2, self.started_wall))

    def wait_for_nodes(self, stall_id: str) -> dict:
        """Wait for every registered watcher's dumps (and every rank of the job to be dumped);
        who answered, which watchers did not, which ranks no watcher dumped."""
        world = self.world_size()

        def complete() -> bool:
            answered = {a["watcher"] for a in self.meeting.answers(stall_id)}
            dumped = {r for a in self.meeting.answers(stall_id) for r in a["ranks"]}
            registered = {w["watcher"] for w in self.meeting.watchers()}
            return registered <= answered and (world is None or dumped >= set(range(world)))

        wait_for(complete, ANSWER_WAIT_S)
        answers = self.meeting.answers(stall_id)
        answered = sorted(a["watcher"] for a in answers)
        dumped = {r for a in answers for r in a["ranks"]}
        silent = sorted(w["watcher"] for w in self.meeting.watchers() if w["watcher"] not in answered)
        missing = sorted(set(range(world)) - dumped) if world else []
        if silent or missing:
            self.note(f"no dumps from watcher(s) {', '.join(silent) or '-'}; rank(s) "
                      f"{rank_ranges(missing) or '-'} not dumped")
        return {"answered": answered, "silent": silent, "ranks_not_dumped": missing, "world_size": world}


def _loop(watcher: Watcher, tree: processes.JobProcesses, finished: Callable[[], bool], tail: _Tail | None,
          options: Options) -> tuple[str, dict | None]:
    """Look every interval until the job ends or a stall's action ends the watch:
    (how it ended: exited, killed, watching_stopped, interrupted; the kill's outcome)."""
    last_scan = time.monotonic()
    try:
        while not finished():
            started = time.monotonic()
            if tail:
                tail.poll()
            doc = watcher.step()
            if doc is not None:
                if options.action == "kill":
                    watcher.emit(doc)
                    watcher.note(f"killing the job: SIGTERM, SIGKILL after {options.grace_s:g} s")
                    t_kill = time.monotonic()
                    survivors = stop(tree, options.grace_s)
                    doc["killed"] = {"pids": sorted(tree.seen), "survivors": survivors,
                                     "seconds": round(time.monotonic() - t_kill, 1)}
                    if tail:
                        tail.poll()
                    return "killed", doc["killed"]
                watcher.emit(doc)
                if options.action == "dump":
                    return "watching_stopped", None
            if started - last_scan >= RANK_RESCAN_S:  # processes that came and left between kills' scans
                tree.scan()
                last_scan = started
            time.sleep(max(0.0, options.interval_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return "interrupted", None
    return "exited", None


class _Tail:
    """The console file's new bytes, passed to ``echo`` (the job writes the file itself)."""

    def __init__(self, path: Path, echo: Callable[[bytes], None] | None):
        self.path, self.echo, self.offset = path, echo, 0

    def poll(self) -> None:
        if self.echo is None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        if data:
            try:
                self.echo(data)
            except (OSError, ValueError):
                self.echo = None


def _new_dir(out: Path | None, stem: str) -> Path:
    out = Path(out) if out else Path.cwd() / datetime.now().strftime(f"{stem}-%Y%m%d-%H%M%S")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PostmortemError(f"{out} already exists and is not empty; give --out a new directory.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PostmortemError(f"Cannot create {out}: {exc.strerror}.") from exc
    return out.resolve()


def describe_stall(doc: dict) -> str:
    """A stall's verdict in a few lines: culprit, its wait, the user line, how long, time left."""
    v = doc["verdict"] or {}
    lines = [f"note: {doc['analysis_error']}"] if doc.get("analysis_error") else []
    lines += [(f"stalled {doc['stalled_s']:g} s (since {doc['stalled_since']}): rank(s) "
              f"{rank_ranges(doc['stalled_ranks'])} made no progress")]
    if v.get("signature"):
        lines.append(f"verdict: {v['signature']} — culprit rank(s) {rank_ranges(v.get('culprit_ranks') or []) or '?'}")
    else:
        lines.append(f"verdict: {v.get('summary') or 'no finding'}")
    for rank, frame in doc["culprit_innermost"].items():
        lines.append(f"rank {rank} waits in {frame}")
    if v.get("user_line"):
        lines.append(f"user line: {v['user_line']}")
    if v.get("summary") and v.get("signature"):
        lines.append(v["summary"])
    if doc["timeout_s"]:
        lines.append(f"collective timeout {doc['timeout_s']:g} s: fires at {doc['timeout_at']} "
                     f"(in {doc['timeout_left_s']:g} s)")
    else:
        lines.append("collective timeout: not in the logs (gloo does not print it)")
    nodes = doc.get("nodes") or {}
    if nodes.get("silent") or nodes.get("ranks_not_dumped"):
        lines.append(f"never answered: watcher(s) {', '.join(nodes['silent']) or '-'}; rank(s) "
                     f"{rank_ranges(nodes['ranks_not_dumped']) or '-'} not dumped")
    if doc.get("read_by"):
        lines.append(f"this node's ranks were dumped; watcher {doc['read_by']} (rank 0's node) reads the verdict")
    lines.append(f"run {doc['run_id']} (label watch) — action: {doc['action_taken']}")
    return "\n".join(lines)


def describe_end(final: dict) -> str:
    how = {"exited": f"the job exited with code {final['exit_code']}" if final["command"] else "the job's ranks exited",
           "killed": "the job was killed", "watching_stopped": "watch stopped (the job is left running)",
           "interrupted": "watch was interrupted"}[final["ended"]]
    return f"{how} after {final['seconds']:g} s; {final['stalls']} stall(s) seen"


def to_json(doc: dict) -> str:
    return json.dumps(doc, default=str)


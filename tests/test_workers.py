"""Starting the parsing workers: their server started early for `postmortem analyze` of a big
directory (before the command imports Polars and the parsers, so that both import at once), and
parsing in the process itself where no worker could start (a script read from standard input)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from multiprocessing import forkserver

from postmortem import api, workers

from .conftest import sample_dir


def test_a_directory_is_big_enough_by_the_bytes_of_its_files_links_not_followed(tmp_path):
    job = tmp_path / "job"
    (job / "node0").mkdir(parents=True)
    (job / "node0" / "stderr.log").write_bytes(b"x" * 600)
    (job / "console.log").write_bytes(b"y" * 400)
    outside = tmp_path / "elsewhere.log"
    outside.write_bytes(b"z" * 5000)
    (job / "link.log").symlink_to(outside)
    (job / "linked_dir").symlink_to(tmp_path)
    assert workers._holds_at_least(str(job), 1000)
    assert not workers._holds_at_least(str(job), 1001)


def test_only_analyze_of_a_directory_that_big_starts_the_server_early(tmp_path, monkeypatch):
    started, pools = [], []
    monkeypatch.setattr(forkserver, "ensure_running", lambda: started.append(os.environ["POLARS_MAX_THREADS"]))
    monkeypatch.setattr(workers, "_EarlyPool", pools.append)  # (no server here to fork workers from)
    monkeypatch.setattr(workers, "_EARLY", {})
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    monkeypatch.setattr(workers, "PARALLEL_MIN_BYTES", 1000)
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir()
    big.mkdir()
    (small / "stderr.log").write_bytes(b"x" * 999)
    (big / "stderr.log").write_bytes(b"x" * 1000)
    history = tmp_path / "history.duckdb"
    history.write_bytes(b"x" * 5000)
    assert not workers.start_early([])
    assert not workers.start_early(["history", str(big)])
    assert not workers.start_early(["analyze", str(small)])
    assert not workers.start_early(["analyze", "--db", str(history), str(small)])
    assert not started
    # the job is the directory, wherever it stands among the options
    assert workers.start_early(["analyze", "--db", str(history), str(big), "--format", "json"])
    assert started == [workers.WORKER_ENVIRONMENT["POLARS_MAX_THREADS"]]  # started with the workers' settings
    assert "POLARS_MAX_THREADS" not in os.environ  # and this process's own left as they were
    assert pools == [workers.worker_context()]  # and the workers forked from it as soon as it is ready


def test_parsing_workers_get_one_polars_thread_unless_the_user_chose_otherwise(monkeypatch):
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:1")  # the user's own allocator setting
    with workers.worker_environment():
        assert os.environ["POLARS_MAX_THREADS"] == "1"
        assert os.environ["_RJEM_MALLOC_CONF"] == "narenas:1"
    # what was added for the workers is gone again, what the user set is untouched
    assert "POLARS_MAX_THREADS" not in os.environ
    assert os.environ["_RJEM_MALLOC_CONF"] == "narenas:1"


def test_parsing_workers_allocator_options_follow_the_defaults_polars_sets_for_itself(monkeypatch):
    # importing Polars puts its own default in _RJEM_MALLOC_CONF where the user set nothing: not a choice to keep
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "dirty_decay_ms:500,muzzy_decay_ms:1000")
    with workers.worker_environment():
        assert os.environ["_RJEM_MALLOC_CONF"] == (
            "dirty_decay_ms:500,muzzy_decay_ms:1000," + workers.WORKER_ENVIRONMENT["_RJEM_MALLOC_CONF"])
    assert os.environ["_RJEM_MALLOC_CONF"] == "dirty_decay_ms:500,muzzy_decay_ms:1000"


_PARALLEL = "from postmortem import pipeline\npipeline.PARALLEL_MIN_BYTES = 0  # the big-job path, on a small job\n"
# (the command's head start, on a small job: ``sys.argv[1]`` is the job)
_START_EARLY = ("from postmortem import workers\nworkers.PARALLEL_MIN_BYTES = 0\n"
                "assert workers.start_early(['analyze', sys.argv[1]])\n")


def _run(code: str, job, timeout: int = 300) -> subprocess.CompletedProcess:
    """``code`` run by a Python of its own, the job its argument."""
    return subprocess.run([sys.executable, "-c", code, str(job)], capture_output=True, text=True, timeout=timeout)


def _verdict(report: dict) -> tuple:
    return report["verdict"], [f["signature"] for f in report["findings"]]


def test_a_server_started_early_serves_the_workers_with_their_settings_and_the_report_is_the_same():
    job = sample_dir("hang_dataloader")
    code = _PARALLEL + (
        "import json, os, sys\nfrom concurrent.futures import ProcessPoolExecutor\nfrom multiprocessing import forkserver\n"
        "from postmortem import api\n" + _START_EARLY +
        "server = forkserver._forkserver._forkserver_pid\n"
        # (a pool opened outside worker_environment: what its worker sees is the server's)
        "with ProcessPoolExecutor(1, mp_context=workers.worker_context()) as pool:\n"
        "    assert pool.submit(os.getenv, 'POLARS_MAX_THREADS').result() == '1'\n"
        "report = api.analyze(sys.argv[1], keep=False)\n"
        "assert forkserver._forkserver._forkserver_pid == server, 'a second server was started'\n"
        "print(json.dumps([report['verdict'], [f['signature'] for f in report['findings']]]))\n"
    )
    out = _run(code, job)
    assert out.returncode == 0, out.stderr
    assert tuple(json.loads(out.stdout)) == _verdict(api.analyze(job, keep=False))


def test_the_workers_are_forked_while_the_command_imports_and_the_pipeline_parses_on_them():
    job = sample_dir("hang_dataloader")
    code = _PARALLEL + (
        "import json, multiprocessing, sys\n"
        "from postmortem import api\n" + _START_EARLY +
        "workers._EARLY[workers.worker_context()].join(120)\n"
        "forked = len(multiprocessing.active_children())\n"
        "made, make = [], workers._executor\n"
        "workers._executor = lambda *args: made.append(args) or make(*args)\n"
        "report = api.analyze(sys.argv[1], keep=False)\n"
        "print(json.dumps([forked, len(made), len(workers._EARLY), report['verdict'],\n"
        "                  [f['signature'] for f in report['findings']]]))\n"
    )
    out = _run(code, job)
    assert out.returncode == 0, out.stderr
    forked, made, left, *verdict = json.loads(out.stdout)
    assert forked == min(workers.usable_cores(), workers.EARLY_WORKERS)  # before any task was handed out
    assert made == 0 and left == 0  # the pipeline parsed on that pool, not one of its own
    assert tuple(verdict) == _verdict(api.analyze(job, keep=False))


def test_a_command_that_leaves_without_parsing_leaves_no_worker_and_says_nothing():
    # A run found in the history is shown without parsing: the workers forked early, idle, are told
    # to leave (the command's exit would otherwise wait for them for ever), none is left half-forked.
    code = ("import sys\nfrom postmortem import cli\n" + _START_EARLY +
            "workers._EARLY[workers.worker_context()].join(120)\n"
            "cli._quick_exit(0)\n")
    out = _run(code, sample_dir("hang_dataloader"), timeout=120)
    assert out.returncode == 0
    assert out.stderr == ""


def test_a_program_that_calls_the_api_keeps_numpy_in_the_pools_it_forks_from_the_same_server():
    # (the command's server imports no NumPy, nor does the command; a program's own pool may share the server)
    job = sample_dir("hang_dataloader")
    code = _PARALLEL + (
        "import sys\nfrom concurrent.futures import ProcessPoolExecutor\n"
        "from postmortem import api, workers\n"
        "api.analyze(sys.argv[1], keep=False)\n"
        "with ProcessPoolExecutor(1, mp_context=workers.worker_context()) as pool:\n"
        "    pool.submit(exec, 'import numpy').result()\n"
        "import numpy\n"
    )
    out = _run(code, job)
    assert out.returncode == 0, out.stderr


def test_a_script_read_from_standard_input_parses_a_big_job_in_its_own_process(tmp_path):
    # (a worker imports the script that started its parent first: one read from stdin names no file)
    job = sample_dir("hang_dataloader")
    code = _PARALLEL + (
        "import json\nfrom postmortem import api\n"
        f"report = api.analyze({str(job)!r}, keep=False)\n"
        "print(json.dumps([report['verdict'], [f['signature'] for f in report['findings']]]))\n"
    )
    out = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert tuple(json.loads(out.stdout)) == _verdict(api.analyze(job, keep=False))


def _threads_cores() -> tuple[int, list[str]]:
    """(In a worker) the worker's pid, and the cores each of its threads may run on, after Polars has
    worked on a frame (its pool's threads are started then)."""
    import time

    import polars as pl

    time.sleep(0.05)
    pl.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]}).filter(pl.Series([True, False, True])).join(
        pl.DataFrame({"b": ["x"]}), on="b")
    allowed = []
    for status in sorted(os.listdir("/proc/self/task")):
        with open(f"/proc/self/task/{status}/status") as f:
            allowed += [line.split()[1] for line in f if line.startswith("Cpus_allowed_list")]
    return os.getpid(), allowed


def test_each_worker_and_its_threads_are_bound_to_one_core_of_those_allowed_the_next_for_the_next():
    mine = os.sched_getaffinity(0)
    context = workers.worker_context()
    with workers.pool(2, context) as pool:
        # (tasks enough, each long enough, that both workers take some)
        seen = dict(f.result() for f in [pool.submit(_threads_cores) for _ in range(16)])
    assert len(seen) == 2
    cores = set()
    for allowed in seen.values():
        assert len(set(allowed)) == 1 and allowed[0].isdigit(), allowed  # every thread: one core, the same
        cores.add(int(allowed[0]))
    assert cores <= mine
    assert len(cores) == min(2, len(mine))  # a core each, where there are two
    assert os.sched_getaffinity(0) == mine  # this process is not bound


def test_a_worker_that_cannot_be_bound_to_a_core_parses_unbound(monkeypatch):
    # (an initializer that raises kills its worker, and the pool with it: the whole analysis)
    def refuse(pid, cores):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    counter = multiprocessing.Value("i", 0)
    workers.pin_to_a_core(counter)
    assert counter.value == 1  # the next worker still takes the next core


def test_a_server_that_cannot_start_early_leaves_the_command_to_go_on(tmp_path, monkeypatch):
    def refuse():
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(forkserver, "ensure_running", refuse)
    monkeypatch.setattr(workers, "PARALLEL_MIN_BYTES", 1000)
    (tmp_path / "stderr.log").write_bytes(b"x" * 1000)
    assert not workers.start_early(["analyze", str(tmp_path)])


def _threads_after_importing_the_cli(helper: bool, env: dict[str, str]) -> tuple[int, str | None]:
    """(threads, OPENBLAS_NUM_THREADS afterwards) of a process that imported the CLI as the command does."""
    code = ("import os, time\n"
            "from postmortem import entry, workers\n"
            + ("with workers.environment(entry.ONE_BLAS_THREAD):\n    import postmortem.cli\n" if helper
               else "import postmortem.cli\n")
            + "time.sleep(0.05)\n"
            "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    threads, blas = out.split()
    return int(threads), None if blas == "None" else blas


def test_the_command_starts_no_blas_threads_and_what_it_starts_gets_the_users_environment():
    # The command's process (not its workers) imports numpy through pyarrow: OpenBLAS would start a
    # thread a core beside the first, each spinning a while for work that never comes.
    assert len(os.sched_getaffinity(0)) >= 2, "OpenBLAS starts its threads only where there are cores for them"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    plain, _ = _threads_after_importing_the_cli(False, env)
    fewer, left = _threads_after_importing_the_cli(True, env)
    assert fewer < plain
    assert left is None  # a job under watch, a replay: started with the user's environment
    _, users = _threads_after_importing_the_cli(True, {**env, "OPENBLAS_NUM_THREADS": "3"})
    assert users == "3"


def _built_in_the_server() -> int:
    from postmortem.parsers import scan

    return scan.scanner.cache_info().currsize


def test_a_worker_has_what_its_first_task_would_build_from_its_server():
    # The scan compiles its Hyperscan databases at the first block (~10 ms): built once in the
    # server, not in every worker's first task.
    context = workers.worker_context()
    assert context is not None and context.get_start_method() == "forkserver"
    with workers.worker_environment(), workers.pool(1, context) as pool:
        scanners = pool.submit(_built_in_the_server).result(timeout=60)
    assert scanners >= 1


def _huge_pages_of_a_touched_buffer() -> tuple[int, int]:
    """(In a worker) whether its huge pages are off (prctl PR_GET_THP_DISABLE), and the kB of huge
    pages under a 16 MB pyarrow buffer once every page of it is written."""
    import ctypes

    import pyarrow as pa

    off = ctypes.CDLL(None).prctl(42, 0, 0, 0, 0)
    buffer = pa.allocate_buffer(16 << 20)
    view = memoryview(buffer).cast("B")
    view[::4096] = b"\x01" * len(range(0, len(view), 4096))
    huge, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= buffer.address < high
            elif inside and head == "AnonHugePages:":
                huge = int(line.split()[1])
    return off, huge


def test_a_worker_faults_its_memory_in_small_pages():
    # pyarrow's allocator maps its arenas for transparent huge pages: each first touch would zero
    # 2 MiB however little of it is used, what a job analyzed just after it was written pays most
    context = workers.worker_context()
    assert context is not None and context.get_start_method() == "forkserver"
    with workers.worker_environment(), workers.pool(1, context) as pool:
        off, huge_kb = pool.submit(_huge_pages_of_a_touched_buffer).result(timeout=60)
    assert off == 1
    assert huge_kb == 0


def test_a_worker_parsing_every_kind_of_file_never_imports_pyarrow_compute():
    # (~50 ms of a process's start, the server's or a worker's: Polars' pyarrow path imports it)
    code = ("import sys\nfrom pathlib import Path\nfrom postmortem import discover, parsing\n"
            "for scenario in sys.argv[1:]:\n    parsing.parse_in_worker(discover.discover(Path(scenario)).sources)\n"
            "print('pyarrow.compute' in sys.modules)")
    kinds = {"hang_dataloader_nccl": "flight_recorder, pyspy, text_log", "straggler": "kineto",
             "recompile_limit": "torch_trace, dynamo"}
    out = subprocess.run([sys.executable, "-c", code, *(str(sample_dir(s)) for s in kinds)],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_command_hands_its_first_task_to_the_workers_before_it_imports_duckdb():
    # (~70 ms of the command's start, where the workers' server waits for it: imported once a
    # database is needed, it runs beside the workers)
    code = ("import sys\nfrom postmortem import workers\nworkers.without_numpy()\nimport postmortem.cli\n"
            + _PARALLEL +
            "imported = 'duckdb' in sys.modules\n"
            "class Submitter(pipeline._Submitter):\n"
            "    def __init__(self, *args):\n"
            "        print(imported, 'duckdb' in sys.modules, flush=True)\n"
            "        super().__init__(*args)\n"
            "pipeline._Submitter = Submitter\n"
            "pipeline.load(sys.argv[1])\n")
    out = _run(code, sample_dir("hang_dataloader_nccl"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_what_the_workers_server_imports_holds_no_database_and_no_engine():
    # The server imports on another core while the command imports its own modules: the sooner it
    # is done, the sooner the workers start. A worker parses; it never queries.
    code = ("import sys, postmortem.worker_preload\n"
            "print(sorted(m for m in ('duckdb', 'postmortem.engine', 'postmortem.store', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""How the parsing workers start: their environment, their start method, and their server
started early, while the command that will use it is still importing.

Light on purpose (the standard library only): ``postmortem.entry`` imports it before Polars,
DuckDB and the parsers, so that the workers' server imports those on one core while this
process imports them on the other (``start_early``). ``pipeline`` decides whether a job is
big enough for workers (``PARALLEL_MIN_*``) and runs them.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import random
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

PARALLEL_MIN_BYTES = 64 << 20  # below this, starting worker processes costs more than it saves
PARALLEL_MIN_FILES = 96  # ... unless this many files are parsed one by one: each costs ~30 ms of Polars work however small
PARALLEL_MIN_BATCHED = 2000  # ... or this many are read to be built with others (~2 ms each)

# What the parsing workers are started with, where the user has not set it: each worker parses
# files of its own, so Polars' threads within one only contend with the other workers (~20% more
# CPU). Freed memory stays with the worker for the next file, never returned to the kernel, which
# would hand it back as fresh pages, each a fault: Polars' allocator (jemalloc) does not decay its
# freed pages, and Python's (glibc's malloc) takes a 16 MB block of a log from its heap, not a
# mapping of its own, and does not trim the heap. A worker's memory is then what its largest file
# took, as at its peak before. (64 ranks of 16 MB, against Polars' own 0.5 s of decay: 1.1M -> 0.19M
# page faults in the workers, 3.6 -> 1.6 s of system time; the same peak RSS.) The same holds for
# pyarrow's allocator (mimalloc), which holds the buffers C writes a frame's columns into (14 MB for a
# 16 MB log's headers alone): it gives freed memory back 10 ms after it is freed, and the next frame's
# buffers fault it in again, zeroed (a pair of 16 MB logs, pinned: 230-300 -> 11-40 page faults,
# 108-111 -> 100-102 ms). And jemalloc keeps one arena for all of a worker's threads, not one a
# thread of several: a worker runs each line parser on a thread of its own (``textlog``), one at a
# time, and what one freed another then takes again, where an arena of its own would fault in fresh
# pages (a worker's first task of six 16 MB logs: 72k -> 65k page faults, ~3 us each on this VM; the
# 64-rank job's workers 176k -> 158k).
# NumPy, which pyarrow imports, starts OpenBLAS's threads, which spin ~0.1 s of CPU before they
# sleep; a worker never multiplies a matrix.
WORKER_ENVIRONMENT = {"POLARS_MAX_THREADS": "1", "_RJEM_MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1,narenas:1",
                      "MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
                      "MIMALLOC_PURGE_DELAY": "-1", "OPENBLAS_NUM_THREADS": "1"}

# What Polars itself puts in _RJEM_MALLOC_CONF at import where the user set nothing (polars/__init__.py:
# its default, then the user's options after it), so in this process it is there before a pool starts:
# a value of these is not the user's choice, and the workers' options go after it (jemalloc takes the last).
# (A server started before Polars is imported gets the workers' options alone, and Polars, imported
# there, puts its default before them: the same.)
_POLARS_JEMALLOC_DEFAULTS = ("dirty_decay_ms:500,muzzy_decay_ms:1000",
                             "dirty_decay_ms:500,muzzy_decay_ms:1000,thp:always,metadata_thp:always")

# What the workers' server imports once, for every worker it forks: the script that started this
# process (what a worker imports first), and what a worker runs with what it would otherwise build
# in its first task (``worker_preload``).
_PRELOAD = ["__main__", "postmortem.worker_preload"]


def _users_own(name: str) -> bool:
    value = os.environ.get(name)
    return value is not None and not (name == "_RJEM_MALLOC_CONF" and value in _POLARS_JEMALLOC_DEFAULTS)


def worker_environment() -> contextlib.AbstractContextManager[None]:
    """Workers spawned inside see WORKER_ENVIRONMENT (only what the user has not set)."""
    return environment(WORKER_ENVIRONMENT)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Inside, ``values`` in this process's environment, where the user has not set them (a
    default Polars put in _RJEM_MALLOC_CONF is not the user's: the value goes after it); outside,
    the environment as it was."""
    before = {name: os.environ.get(name) for name in values if not _users_own(name)}
    for name, value in before.items():
        os.environ[name] = values[name] if value is None else f"{value},{values[name]}"
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def without_numpy() -> None:
    """NumPy is not imported in this process from here on (an import of it fails, as where it is not
    installed), unless it was already. Nothing ``analyze`` or a parsing worker runs uses it, but pyarrow
    imports it where it is installed: 0.1 s of CPU (its C modules and OpenBLAS) in each process, at the
    start, where the command's imports and the workers' server's are what the first task waits for
    (64 ranks of 16 MB: 3.15 -> 3.06 s). pyarrow, Polars and DuckDB each work without it. Only for the
    ``analyze`` command and the server it starts (``start_early``): a program that calls the API may
    use NumPy, and a pool of its own may be forked from the same server."""
    sys.modules.setdefault("numpy", None)


def _main_importable() -> bool:
    """Whether a worker can import what started this process, as every worker started by a server
    or spawned does first: not where it was read from standard input (``python - < script``), whose
    ``__file__`` names no file (the worker would die, and the pool with it)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return getattr(main, "__spec__", None) is not None or path is None or os.path.isfile(path)


def worker_context(without_numpy_there: bool = False) -> multiprocessing.context.BaseContext | None:
    """How parsing workers start: forked from a server process that imported the parsers once
    (multiprocessing's forkserver, preloaded), where the platform has one; else spawned. Never
    forked from this process, whose Polars and DuckDB thread pools may be mid-use. A spawned worker
    imports Polars, pyarrow, Hyperscan and the parsers itself, 0.3 s of CPU each (0.45 s from the
    ``postmortem`` script, whose every import a spawned worker repeats); from the server, a worker
    costs milliseconds, and the server stays for the process's next job. The server is started, and
    keeps, the environment of the first pool (``worker_environment``), or of ``start_early``.
    None where no worker could start (``_main_importable``): the files are then parsed here.
    ``without_numpy_there``: a server started now imports no NumPy (``without_numpy``)."""
    if not _main_importable():
        return None
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["postmortem.no_numpy", *_PRELOAD] if without_numpy_there else _PRELOAD)
    return context


def usable_cores() -> int:
    """How many cores this process may run on: those of its affinity mask (a batch job's cpuset, a
    container's), not all the machine has, where the platform says."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextlib.contextmanager
def pool(processes: int, context: multiprocessing.context.BaseContext) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``processes`` parsing workers started by ``context``, each bound to a core
    (``start_worker``), the first to a core drawn at random: two analyses at once on a machine of
    many cores (a scheduler's epilogs) then seldom bind their workers to the same few; or the pool
    ``start_early`` began, whose workers are forked already: one a core (up to ``EARLY_WORKERS``),
    as a pool of its own would fork for a job of as many tasks (a smaller one leaves some idle).
    Leaving it, what was not begun is given up and the workers' exit is not waited for: two
    processes freeing what they held while this one goes on (~30 ms of the end of an analysis,
    which runs on one core)."""
    early = _EARLY.pop(context, None)
    executor = (early.take() if early is not None else None) or _executor(processes, context)
    try:
        yield executor
    finally:
        if early is not None:
            early.stop()
        executor.shutdown(wait=False, cancel_futures=True)


def _executor(processes: int, context: multiprocessing.context.BaseContext) -> ProcessPoolExecutor:
    first = random.randrange(usable_cores())
    return ProcessPoolExecutor(max_workers=processes, mp_context=context, initializer=start_worker,
                               initargs=(context.Value("i", first),))


class _EarlyPool(threading.Thread):
    """A pool whose workers are forked while this process still imports what it needs before its
    first task (``start_early``), on a thread of its own, which waits on the server (ready first: it
    imports less) while the imports go on: a worker's fork costs 20-60 ms, which the first tasks no
    longer wait for (the 64-rank job, six runs each: its first task began 2-7 ms after discovery, the
    second 2-72 ms; forked as tasks came, 37-70 and 62-113 ms). A pool forks a worker for a task
    submitted while none is idle: here, a task that does nothing, for each of the first
    ``EARLY_WORKERS`` cores (more fork theirs as tasks come, as they would have)."""

    def __init__(self, context: multiprocessing.context.BaseContext):
        super().__init__(name="postmortem-early-pool", daemon=True)
        self.context = context
        self.made = threading.Event()
        self.stopping = False
        self.executor: ProcessPoolExecutor | None = None
        self.start()

    def run(self) -> None:
        try:
            # (made here, not by the caller: the shared counter's module imports ctypes, which the command needs later)
            self.executor = _executor(usable_cores(), self.context)
        except Exception:  # (``pool`` makes one, or says why it cannot)
            return
        finally:
            self.made.set()
        for _ in range(min(usable_cores(), EARLY_WORKERS)):
            if self.stopping:
                return
            try:
                self.executor.submit(os.getpid)
            except Exception:  # (a server that cannot fork: the pool forks as tasks come, or says why)
                return

    def take(self) -> ProcessPoolExecutor | None:
        """The pool, once made (None where it could not be)."""
        self.made.wait()
        return self.executor

    def stop(self) -> None:
        """No more workers forked: the one being forked is waited for. A process that left while its
        pool forked a worker would leave the worker to find the pool's queues gone (and say so)."""
        self.stopping = True
        self.join()


EARLY_WORKERS = 8
_EARLY: dict[multiprocessing.context.BaseContext, _EarlyPool] = {}  # (``start_early``'s pool, until ``pool`` takes it)


def _close_unused_early_pools() -> None:
    """At exit, a pool ``start_early`` began that nothing took (the run was in the history, the job
    smaller than it looked): its workers, once forked, are told to leave and waited for."""
    while _EARLY:
        early = _EARLY.popitem()[1]
        early.stop()
        if early.executor is not None:
            early.executor.shutdown(wait=True, cancel_futures=True)


def start_worker(counter) -> None:
    """A parsing worker's initializer: bound to a core (``pin_to_a_core``), its memory in small
    pages (``small_pages_only``)."""
    pin_to_a_core(counter)
    small_pages_only()


def small_pages_only() -> None:
    """This process faults its memory in 4 KiB pages from here on, never in transparent huge pages
    (Linux's ``prctl(PR_SET_THP_DISABLE)``; elsewhere nothing). pyarrow's allocator
    (mimalloc) asks for huge pages on every arena it maps, so a worker's first touch of each 2 MiB
    zeroed all of it. A worker keeps what it frees (``WORKER_ENVIRONMENT``): a huge page saves it
    nothing after its first task (the 64-rank job just after another run: 2.79 vs 2.75 s), while
    the first touch is what costs, most on a VM whose host takes freed guest memory back (the same
    job after 25 s idle: 3.33 -> 2.91 s, 184 -> 2 huge-page faults; the workers' time in the kernel's
    page zeroing 470 and 242 -> 25 and 16 ms)."""
    if sys.platform.startswith("linux"):
        from .processes import prctl  # (here, in the worker: ctypes is not among what the command imports first)

        prctl(41, 1)  # PR_SET_THP_DISABLE


def pin_to_a_core(counter) -> None:
    """This worker is bound to one core of those this process may use, the next one (``counter``,
    shared by the pool's workers, says which), all its threads with it.

    A worker is one thread's work: its Python thread hands each Polars operation over a frame (a
    filter, a join, a select of several columns) to Polars' pool thread and waits for it, some 600
    times a pair of 16 MB logs. Between threads on two cores that hand-off is a wake-up across
    cores, ~100 us of CPU on a VM; on one core, ~25 us (a frame's filter, here: 115 -> 27 us)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[index % len(cores)]})
    except OSError:  # (a core taken away meanwhile, a sandbox that forbids it: unbound, as before)
        pass


def _holds_at_least(directory: str, size: int, max_entries: int = 100_000) -> bool:
    """Whether the files under ``directory`` (links not followed) hold ``size`` bytes or more; a
    tree of more than ``max_entries`` entries is taken to (it is not walked to its end)."""
    total = seen = 0
    pending = [directory]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > max_entries:
                        return True
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                        if total >= size:
                            return True
        except OSError:  # (unreadable: discovery says so, in its own words)
            continue
    return False


def start_early(argv: Sequence[str]) -> bool:
    """For ``postmortem analyze`` of a directory big enough for parsing workers: their server is
    started now, before this process imports Polars, DuckDB and the parsers, so that it imports them
    on another core meanwhile (on 2 cores, 64 ranks of 16 MB: the server's 0.35 s of imports were on
    the critical path, after this process's own). Whether a directory on the command line is that big
    is a guess from its bytes (``pipeline`` decides from what discovery finds): a wrong one costs the
    server's start alone (its imports, 0.35-0.5 s of CPU on another core: so does a directory whose
    run is in the history already, shown without parsing), or leaves it to start as before. The
    pool's workers are forked from it as soon as it is ready (``_EarlyPool``), for ``pool`` to hand
    out. True where it was started."""
    if len(argv) < 2 or argv[0] != "analyze" or usable_cores() < 2:
        return False
    if not any(os.path.isdir(arg) and _holds_at_least(arg, PARALLEL_MIN_BYTES)
               for arg in argv[1:] if not arg.startswith("-")):
        return False
    context = worker_context(without_numpy_there=True)  # (this process is the command: the server is its alone)
    if context is None or context.get_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver

    try:
        with worker_environment():
            forkserver.ensure_running()
    except Exception:  # (only a head start: where the server cannot start now, the pipeline starts it, or says why)
        return False
    if context not in _EARLY:  # (one pool, whatever calls this again before a pipeline takes it)
        _EARLY[context] = _EarlyPool(context)
        atexit.register(_close_unused_early_pools)
    return True

"""The pipeline behind the API: discover -> parse -> load (a staging DuckDB) -> match.

``load`` reads a log directory into a run's tables: discovery's files are parsed (``parsing``:
one by one, big ones chunk by chunk, small ones read whole and built many to a frame), on worker
processes when the job is big enough to pay for them, in tasks (``_tasks``) handed out largest
first; rows reach the staging database in batches.
``match`` runs every signature over the run on a sandboxed connection, with each finding's
confidence fitted on known scenarios (``calibrator``), and stores the findings and the verdict.
``postmortem.api`` is the public face of both; ``job`` builds a multi-node run and matches it
the same way.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from . import __version__, calibration, catalog, engine, parsing, store, summary, workers
from . import discover as discovery
from . import parsers as parser_package
from . import signatures as signature_package
from .errors import PostmortemError
from .parsers.source import Source
from .workers import PARALLEL_MIN_BATCHED, PARALLEL_MIN_BYTES, PARALLEL_MIN_FILES

if TYPE_CHECKING:  # (DuckDB is imported where it is used: store's docstring says why)
    import duckdb

log = logging.getLogger(__name__)

# progress(files_done, bytes_done, files_total, bytes_total, current_name)
Progress = Callable[[int, int, int, int, str], None]


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


LAST_ROUND_ROWS = 8192  # a batch's rows once the last round of tasks is out (``_parse_all``)

# Files smaller than this travel to a worker in batches: a task's round trip (pickling the
# sources and the frames, the result's wake-up) costs milliseconds, as much as parsing a small log.
BATCH_BYTES = 4 << 20
# ... a batch of files of one kind, up to this many: a parser builds a task's files of its kind as one
# frame, whose fixed cost (~60 ms for text logs: planning each step's expressions) is then paid once,
# not once for each of several batches of mixed kinds (the 64-rank job's 72 small text logs in three
# tasks 0.24 s of CPU, in one 0.13 s)
BATCH_FILES = 128


def _tasks(sources: list[Source]) -> list[list[Source]]:
    """Largest files first: one a task, or, where their parser builds them with others, as many
    as ``parsing.BUILD_BYTES`` holds; then the small ones in batches of one kind. The tasks in order
    of their bytes, most first: the last are the smallest (what the main process takes while the
    workers start)."""
    tasks: list[list[Source]] = []
    small: dict[str, list[Source]] = {}
    built: list[Source] = []
    built_bytes = 0
    for source in sorted(sources, key=lambda s: -s.bytes):
        if source.bytes >= BATCH_BYTES and not parsing.batched(source):
            tasks.append([source])
            continue
        if source.bytes >= BATCH_BYTES:
            if built and built_bytes + source.bytes > parsing.BUILD_BYTES:
                tasks.append(built)
                built, built_bytes = [], 0
            built.append(source)
            built_bytes += source.bytes
            continue
        small.setdefault(source.kind, []).append(source)
    if built:
        tasks.append(built)
    for of_kind in small.values():
        batch: list[Source] = []
        batch_bytes = 0
        for source in of_kind:
            batch.append(source)
            batch_bytes += source.bytes
            if batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_FILES:
                tasks.append(batch)
                batch, batch_bytes = [], 0
        if batch:
            tasks.append(batch)
    return sorted(tasks, key=lambda task: -sum(s.bytes for s in task))


class _Submitter(threading.Thread):
    """Hands ``queue``'s tasks (from its front) to ``pool``, each future into ``futures``, on a thread
    of its own; ``take_last`` takes one from the back instead, for the caller to parse."""

    def __init__(self, pool: ProcessPoolExecutor, queue: collections.deque, futures: dict):
        super().__init__(name="postmortem-submit", daemon=True)
        self.pool, self.queue, self.futures = pool, queue, futures
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            while True:
                with self.lock:
                    if not self.queue:
                        return
                    task = self.queue.popleft()
                self.futures[self.pool.submit(parsing.parse_in_worker, task)] = task
        except BaseException as exc:  # (raised where the caller joins: no task is lost unsaid)
            self.error = exc

    def take_last(self) -> list[Source] | None:
        with self.lock:
            return self.queue.pop() if self.queue else None

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


def _parse_all(found: discovery.Discovery, run_id: str,
               progress: Progress | None) -> tuple[duckdb.DuckDBPyConnection, list[dict]]:
    """Parse every file into a new staging database: in this process for a small job, across all
    cores for a big one. The database and the files' rows."""
    sources = found.sources
    total_files, total_bytes = len(sources), sum(s.bytes for s in sources)
    done_files = done_bytes = 0
    rows = []
    processes = min(workers.usable_cores(), len(sources))
    # A file read on its own and built with others of its kind costs a fraction of one parsed alone.
    one_by_one = sum(1 for s in sources if not parsing.batched(s))
    small_job = (total_bytes < PARALLEL_MIN_BYTES and one_by_one < PARALLEL_MIN_FILES
                 and len(sources) - one_by_one < PARALLEL_MIN_BATCHED)
    context = None if small_job or processes < 2 else workers.worker_context()
    if context is None:
        def before(source: Source) -> None:
            nonlocal done_files, done_bytes
            if progress:
                progress(done_files, done_bytes, total_files, total_bytes, source.name)
            done_files += 1
            done_bytes += source.bytes
        out = store.Batcher(store.staging(), run_id)
        rows = parsing.parse_files(out, sources, before)
        out.flush()
        return out.con, rows
    with workers.worker_environment(), workers.pool(processes, context) as pool:
        queue = collections.deque(_tasks(sources))  # (largest first)
        futures: dict = {}

        def finished(task: list[Source], result: tuple[list[dict], dict[str, pl.DataFrame]]) -> None:
            nonlocal rows, done_files, done_bytes
            task_rows, frames = result
            rows += task_rows
            done_files += len(task)
            done_bytes += sum(s.bytes for s in task)
            # Once only the last round of work is left, batches are small: what comes in goes in
            # while the workers parse that round, not all after it, one core idle (the 64-rank job's
            # last 42k rows, 0.15 s). Not a batch a result: a job's last tasks are its many small
            # files, and each insert costs ~10 ms however few its rows (512 ranks: 48 more, 0.5 s).
            if total_bytes - done_bytes <= processes * parsing.BUILD_BYTES:
                out.max_rows = min(out.max_rows, LAST_ROUND_ROWS)
            for table, frame in frames.items():
                out.add(table, frame)
            if progress:
                progress(done_files, done_bytes, total_files, total_bytes, task[-1].name)

        # The first task handed to the pool waits for its server to import the parsers (~0.3 s of a
        # core): the tasks are handed over on a thread of their own, and until the first is, this
        # process takes the last tasks (the smallest) off the queue and parses them itself. The
        # staging database is made once they are handed over (~30 ms the workers do not wait).
        submitter = _Submitter(pool, queue, futures)
        out = store.Batcher(store.staging(), run_id)
        # The workers have the cores: meanwhile DuckDB inserts what they send on one thread of its
        # own (more would only contend with them: 828k rows, 2.1 -> 1.2 s of CPU).
        out.con.execute("SET threads = 1")
        try:
            while not futures and (task := submitter.take_last()) is not None:
                finished(task, parsing.parse_in_worker(task))  # (its frames as a worker's: they concatenate)
            submitter.join()
            # meanwhile, what the matching reads once the workers are done is made ready: the built-in
            # signatures parsed and the analyzer's digest (~15 ms that would be in the single-core end;
            # None as run_fingerprint asks for it without --signatures: lru_cache keys f() apart from f(None))
            catalog.builtin()
            analyzer_digest(None)
            for future in as_completed(futures):
                # popped: a finished future keeps its result, every parsed frame of the job otherwise
                task = futures.pop(future)
                finished(task, future.result())
        finally:
            out.con.execute("RESET threads")
    out.flush()
    return out.con, rows


def load(
    path: str | Path,
    progress: Progress | None = None,
    limits: discovery.Limits = discovery.Limits(),
    labels: dict[str, str] | None = None,
) -> tuple[duckdb.DuckDBPyConnection, str, discovery.Discovery]:
    """Discover and parse a log directory into a new staging database (nothing matched yet)."""
    found = discovery.discover(Path(path), limits)
    run_id = new_run_id()
    con, parsed = _parse_all(found, run_id, progress)
    rows = list(found.skipped) + parsed
    store.compact(con)  # every parsed row is in: what queries them from here reads them compressed
    if progress:
        total = sum(s.bytes for s in found.sources)
        progress(len(found.sources), total, len(found.sources), total, "")
    if not found.sources:
        archives = [s["path"] for s in found.skipped if s["kind"] == "archive"]
        if found.skipped and all(s["kind"] == "empty" for s in found.skipped):
            raise PostmortemError(f"Nothing to analyze in {found.root}: every file there is empty.")
        raise PostmortemError(
            f"Nothing readable in {found.root}: {len(found.skipped)} file(s), none of them a log this tool reads"
            + (f"; {archives[0]} is an archive: unpack it and analyze the directory." if archives else ".")
        )
    store.append(con, "files", run_id, summary.files_frame(rows))
    summary.attribute_ranks_by_pid(con, run_id)
    summary.ranks_from_local_ranks(con, run_id)
    summary.refine_untimed(con, run_id)
    store.append(con, "runs", run_id, summary.runs_frame(summary.run_facts(con, run_id, found, labels)))
    return con, run_id, found


@functools.lru_cache(maxsize=8)
def analyzer_digest(signatures: Path | None = None) -> str:
    """What a verdict depends on besides the input: this postmortem's code, schema and
    signatures, and the user's signature files."""
    roots = [Path(__file__).parent, Path(parser_package.__file__).parent, Path(signature_package.__file__).parent]
    files = sorted(f for root in roots for f in root.rglob("*") if f.suffix in (".py", ".toml", ".sql", ".json"))
    if signatures is not None and Path(signatures).is_dir():
        files += sorted(Path(signatures).glob("*.toml"))
    digest = hashlib.sha256(__version__.encode())
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def run_fingerprint(found: discovery.Discovery, signatures: str | Path | None = None) -> str:
    """The input files (names, sizes, mtimes) and the analyzer: equal fingerprints, equal reports."""
    both = f"{found.fingerprint}:{analyzer_digest(Path(signatures) if signatures else None)}"
    return hashlib.sha256(both.encode()).hexdigest()[:16]


def match(con: duckdb.DuckDBPyConnection, run_id: str, signatures: str | Path | None = None,
          fail_on: str = "error") -> list[engine.Finding]:
    """Every signature over the run (the user's ``signatures`` directory too), on a connection
    that sees the run's tables and nothing else; the findings and the verdict are stored."""
    sigs, broken = catalog.load_all(Path(signatures) if signatures else None)
    store.sandbox(con)  # signature SQL (the user's too) sees the run's tables and nothing else
    findings = engine.match(con, run_id, sigs, broken, calibrate=calibrator(con, run_id, sigs))
    for origin, why in broken:
        log.warning("signature %s skipped: %s", origin, why)
    store.append(con, "findings", run_id, summary.findings_frame([f.row() for f in findings]))
    top = engine.verdict(findings)
    con.execute("UPDATE runs SET verdict = ?, exit_status = ? WHERE run_id = ?",
                [top.signature if top else None, exit_status([f.severity for f in findings], fail_on), run_id])
    return findings


def exit_status(severities: list[str], fail_on: str = "error") -> int:
    """DESIGN.md's exit codes: 1 when a finding is at least ``fail_on`` severe, else 0."""
    if fail_on not in catalog.SEVERITIES:
        raise PostmortemError(f"--fail-on must be one of {', '.join(catalog.SEVERITIES)}, not {fail_on!r}.")
    threshold = catalog.SEVERITIES.index(fail_on)
    return int(any(catalog.SEVERITIES.index(s) >= threshold for s in severities if s in catalog.SEVERITIES))


def calibrator(con: duckdb.DuckDBPyConnection, run_id: str, sigs: list[catalog.Signature]):
    """Sets a finding's evidence kind and its confidence fitted on known scenarios (calibration.py)."""
    kind_of = dict(con.execute("SELECT path, kind FROM files WHERE run_id = ? AND status = 'parsed'",
                               [run_id]).fetchall())
    table = calibration.load()
    builtin = {s.id for s in sigs if s.origin == "built-in"}

    def calibrate(finding: engine.Finding) -> None:
        finding.evidence_kind = calibration.evidence_kind((e["file"] for e in finding.evidence), kind_of,
                                                          any(e["rank"] is not None for e in finding.evidence))
        if finding.signature in builtin:  # a user's signature of the same id is not what was fitted
            finding.confidence = calibration.fitted(table, finding.signature, finding.evidence_kind,
                                                    finding.confidence)
    return calibrate

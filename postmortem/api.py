"""The Python API that the CLI and job schedulers both call.

    from postmortem import analyze
    report = analyze("/jobs/1234/logs")      # the JSON report's structure, as a dict
    report["verdict"]["summary"]

Data flows one way: discover -> parse -> load (staging DuckDB) -> summarize -> persist.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from . import discover as discovery
from . import store, summary
from .errors import PostmortemError
from .parsers import FILE_PARSERS
from .parsers.source import Source

log = logging.getLogger(__name__)

_PARSERS = {parser.KIND: parser for parser in FILE_PARSERS}

# progress(files_done, bytes_done, files_total, bytes_total, current_name)
Progress = Callable[[int, int, int, int, str], None]


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def _parse_file(con: duckdb.DuckDBPyConnection, run_id: str, source: Source) -> dict:
    """Parse one file into the staging tables; never raises for what is in the file."""
    parser = _PARSERS[source.kind]
    row = {"path": source.name, "kind": source.kind, "rank": source.rank, "bytes": source.bytes, "parser": parser.__name__.rsplit(".", 1)[-1], "status": "parsed", "error": None}
    try:
        for table, frame in parser.parse(source):
            store.append(con, table, run_id, frame)
    except (OSError, EOFError, ValueError, UnicodeError) as exc:
        row["status"] = "partial"
        source.notes.append(f"stopped reading: {type(exc).__name__}: {exc}"[:500])
    except Exception as exc:  # a parser bug must cost one file, not the run
        log.exception("parser %s failed on %s", row["parser"], source.name)
        row["status"] = "partial"
        source.notes.append(f"parser error: {type(exc).__name__}: {exc}"[:500])
    row["lines"] = source.lines
    if source.notes:
        row["error"] = "; ".join(source.notes)
    return row


def ingest(
    path: str | Path,
    db: str | Path | None = None,
    progress: Progress | None = None,
    keep: bool = True,
) -> tuple[duckdb.DuckDBPyConnection, str, discovery.Discovery]:
    """Parse a log directory into a staging database; persist it to history when ``keep``.

    Returns the staging connection (for analysis), the run id and what discovery found.
    """
    found = discovery.discover(Path(path))
    con = store.staging()
    run_id = new_run_id()
    total_files, total_bytes = len(found.sources), sum(s.bytes for s in found.sources)
    done_files = done_bytes = 0
    rows = list(found.skipped)
    for source in found.sources:
        if progress:
            progress(done_files, done_bytes, total_files, total_bytes, source.name)
        rows.append(_parse_file(con, run_id, source))
        done_files += 1
        done_bytes += source.bytes
    if progress:
        progress(done_files, done_bytes, total_files, total_bytes, "")
    store.append(con, "files", run_id, summary.files_frame(rows))
    if not found.sources:
        raise PostmortemError(
            f"Nothing readable in {found.root}: {len(found.skipped)} file(s), none of them a log this tool reads."
        )
    summary.attribute_ranks_by_pid(con, run_id)
    summary.refine_untimed(con, run_id)
    run = summary.run_facts(con, run_id, found)
    store.append(con, "runs", run_id, summary.runs_frame(run))
    if keep:
        store.persist(con, Path(db) if db else store.default_db_path(), run_id)
    return con, run_id, found


def analyze(
    path: str | Path,
    db: str | Path | None = None,
    progress: Progress | None = None,
    keep: bool = True,
) -> dict:
    """Analyze a job's log directory: the report dict of DESIGN.md's JSON contract."""
    con, run_id, _ = ingest(path, db=db, progress=progress, keep=keep)
    return summary.report(con, run_id)


def show(run_id: str, db: str | Path | None = None) -> dict:
    """The report of a run already in history (a unique prefix of its id is enough)."""
    con = store.open_history(Path(db) if db else store.default_db_path())
    matches = [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE starts_with(run_id, ?) ORDER BY run_id", [run_id]).fetchall()]
    if not matches:
        raise PostmortemError(f"No run {run_id!r} in the history; `postmortem runs` lists them.")
    if len(matches) > 1:
        raise PostmortemError(f"{run_id!r} matches {len(matches)} runs ({', '.join(matches[:5])}); give more of the id.")
    return summary.report(con, matches[0])


def runs(db: str | Path | None = None, limit: int = 50) -> list[dict]:
    con = store.open_history(Path(db) if db else store.default_db_path())
    cur = con.execute(
        "SELECT run_id, analyzed_at, source_dir, world_size, verdict, exit_status FROM runs "
        "ORDER BY analyzed_at DESC LIMIT ?", [limit])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def query(sql: str, db: str | Path | None = None, write: bool = False) -> tuple[list[str], list[tuple]]:
    """Run SQL over the history; read-only unless ``write``."""
    con = store.open_history(Path(db) if db else store.default_db_path(), write=write)
    try:
        cur = con.execute(sql)
    except duckdb.Error as exc:
        raise PostmortemError(f"SQL error: {str(exc).splitlines()[0]}") from exc
    if cur.description is None:
        return [], []
    return [d[0] for d in cur.description], cur.fetchall()

"""The DuckDB side: the tables of a run, and the history database they land in.

A run is parsed into an in-memory *staging* database (one per analysis), analyzed there,
then copied into the history file in a single transaction. The history file is locked
only for that copy, so analyses running side by side wait for each other briefly
instead of failing, and a crash mid-ingest leaves no half run behind.

This is the only module that writes a database. DuckDB is imported by the functions that use it
(here, by ``_connect``, which opens every connection), and in the modules that read a run
(``api``, ``engine``, ``pipeline``, ``summary``), not where they are imported: the ``analyze``
command hands its first files to the parsing workers before it needs a database, and the ~70 ms
of importing DuckDB then run beside them, not before them.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from .errors import PostmortemError
from .schema import ADDED_COLUMNS, SCHEMA_VERSION, TABLES, add_column_ddl, ddl, view_ddl

if TYPE_CHECKING:
    import duckdb

DEFAULT_DB = Path("~/.local/share/postmortem/history.duckdb")
LOCK_WAIT_S = 120.0

# version -> statements that bring a database from version-1 to it. Version 1 is the
# first schema; later versions append ALTER/CREATE steps here and never edit old ones.
MIGRATIONS: dict[int, list[str]] = {
    1: [ddl(t, version=1) for t in TABLES] + view_ddl(),
    **{v: [add_column_ddl(t, c) for t, c in cols] + view_ddl() for v, cols in ADDED_COLUMNS.items()},
}


def default_db_path() -> Path:
    return Path(os.environ.get("POSTMORTEM_DB") or DEFAULT_DB).expanduser()


STAGING_MEMORY = "1GB"  # past this the staging tables spill to a temporary directory: a big job stays bounded


def _connect(*args, **kwargs) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect``: every connection this module opens, DuckDB imported at the first."""
    import duckdb

    return duckdb.connect(*args, **kwargs)


def staging() -> duckdb.DuckDBPyConnection:
    """An in-memory database with every table of the schema, empty."""
    con = _connect(config={"memory_limit": STAGING_MEMORY,
                           "temp_directory": str(Path(tempfile.gettempdir()) / f"postmortem-{os.getpid()}")})
    # Compressed (``compact``, once the rows are in): the text of a million records holding a handful of
    # values is then a dictionary, which DuckDB's functions read once a value, not once a row.
    con.execute("ATTACH ':memory:' AS staging (COMPRESS)")
    con.execute("USE staging")
    con.execute("DETACH memory")  # the uncompressed default: gone, a cursor of this connection starts in staging too
    for table in TABLES:
        con.execute(ddl(table))
    return con


def compact(con: duckdb.DuckDBPyConnection) -> None:
    """Compress what was appended to a staging database (``staging``): once the bulk of the rows is
    in, before they are queried (``pipeline.load``, ``job.assemble``), so that queries read them
    compressed (512 ranks' 1.6M compile records, their text a few values: the graph-break query
    570 -> 380 ms, rank-divergent-compile's 440 -> 245 ms)."""
    con.execute("CHECKPOINT")


def append(con: duckdb.DuckDBPyConnection, table: str, run_id: str, df: pl.DataFrame) -> None:
    """Append a parser's frame (columns per schema, no run_id) to ``table``."""
    if df.height == 0:
        return
    # (as Arrow string views, Polars' own layout: the default conversion to large strings copies every
    # string, 0.8 s of the main process's 1.2 s for the 64-rank job)
    con.register("_incoming", _json_marked(table, df.to_arrow(compat_level=pl.CompatLevel.newest())))
    try:
        con.execute(f"INSERT INTO {table} SELECT ? AS run_id, * FROM _incoming", [run_id])
    finally:
        con.unregister("_incoming")


# Each table's JSON columns: text a parser's own encoder wrote (``schema.json_attrs``, ``json.dumps``).
_JSON_COLUMNS = {table: [name for name, typ, _ in columns if typ == "JSON"] for table, columns in TABLES.items()}
_TEXT = (pa.string(), pa.large_string(), pa.string_view())
_JSON_TYPE = getattr(pa, "json_", None)  # (Arrow's JSON extension type: pyarrow 19 on)


def _json_marked(table: str, data: pa.Table) -> pa.Table:
    """``data`` with the text of the table's JSON columns typed as Arrow's JSON (``arrow.json``), which
    DuckDB takes into a JSON column as it is, where text typed as a string is parsed first, every value
    of every row, to prove it JSON (the 64-rank job's 205k compile records: ~45 ms of the command's
    CPU). ``tests/test_store.py`` holds what the parsers write there JSON. As it was where pyarrow has
    no JSON type (before 19)."""
    for name in _JSON_COLUMNS[table] if _JSON_TYPE is not None else ():
        at = data.schema.get_field_index(name)
        if at >= 0:
            data = data.set_column(at, name, _as_json(data.column(at)))
    return data


def _as_json(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column of text, or of a dictionary of text (a Categorical's), as JSON; any other as it is."""
    kind = column.type
    if pa.types.is_dictionary(kind) and kind.value_type in _TEXT:
        kind = pa.dictionary(kind.index_type, _JSON_TYPE(kind.value_type), kind.ordered)
        chunks = [pa.DictionaryArray.from_arrays(c.indices, pa.ExtensionArray.from_storage(kind.value_type, c.dictionary))
                  for c in column.chunks]
    elif kind in _TEXT:
        kind = _JSON_TYPE(kind)
        chunks = [pa.ExtensionArray.from_storage(kind, c) for c in column.chunks]
    else:
        return column
    return pa.chunked_array(chunks, kind)


class Batcher:
    """Collects parsers' frames and appends them in large batches: a DuckDB insert costs
    about a millisecond however small, and a job can have thousands of small files. A batch
    is also bounded in bytes: a graph break logged at every step of 512 ranks is a million
    rows of long text, and what waits here is held twice while DuckDB copies it in. And in rows:
    while workers parse, what they sent goes in as it comes (~1 us a row), not all after the
    last of them has finished (0.3 s of one core, the other idle, for the 64-rank job's 200k rows);
    but not in batches much smaller than DuckDB's row groups (122,880 rows): the compile records'
    inserts cost more in more of them (the 64-rank job's command 1.24 -> 1.15 s of CPU with 100k rows
    a batch, not 50k; its peak RSS the same, the 512-rank job's 428 -> 471-488 MiB). A full batch
    inserts only the tables that fill it, largest first, until what waits is under half the bounds:
    the others' few rows wait for the last flush, where each table is inserted once anyway (the
    64-rank job: 24 inserts of a few hundred rows each while the workers parse, ~3 ms of CPU each,
    were in the batches of its compile records: 38 -> 14 inserts). Each table's rows still go in in
    the order they came."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, max_rows: int = 100_000,
                 max_bytes: int = 64 << 20):
        self.con, self.run_id, self.max_rows, self.max_bytes = con, run_id, max_rows, max_bytes
        self.pending: dict[str, list[pl.DataFrame]] = {}
        self.held: dict[str, tuple[int, int]] = {}  # table -> rows and bytes waiting

    @property
    def rows(self) -> int:
        return sum(rows for rows, _ in self.held.values())

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.held.values())

    def add(self, table: str, df: pl.DataFrame) -> None:
        if df.height == 0:
            return
        size = df.estimated_size()
        self.pending.setdefault(table, []).append(df)
        rows, held = self.held.get(table, (0, 0))
        self.held[table] = (rows + df.height, held + size)
        if self.rows >= self.max_rows or self.bytes >= self.max_bytes:
            self._flush_largest()

    def _flush_largest(self) -> None:
        """Insert the tables that fill the batch, largest first, until what waits is under half of each bound."""
        def share(table: str) -> float:
            rows, size = self.held[table]
            return max(rows / self.max_rows, size / self.max_bytes)

        for table in sorted(self.pending, key=share, reverse=True):
            if self.rows < self.max_rows // 2 and self.bytes < self.max_bytes // 2:
                break
            self._insert(table)

    def _insert(self, table: str) -> None:
        # chunks side by side, not copied into one: DuckDB reads them through Arrow as they are
        frames = self.pending.pop(table)
        del self.held[table]
        append(self.con, table, self.run_id, pl.concat(frames, how="vertical_relaxed", rechunk=False))

    def flush(self) -> None:
        for table in list(self.pending):
            self._insert(table)


def _schema_version(con: duckdb.DuckDBPyConnection, catalog: str) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_catalog = ? AND table_name = 'schema_version'",
        [catalog],
    ).fetchall()[0][0]
    if not exists:
        return 0
    return con.execute(f"SELECT coalesce(max(version), 0) FROM {catalog}.schema_version").fetchall()[0][0]


def migrate(con: duckdb.DuckDBPyConnection, catalog: str) -> None:
    """Bring the attached database ``catalog`` up to SCHEMA_VERSION."""
    current = _schema_version(con, catalog)
    if current > SCHEMA_VERSION:
        raise PostmortemError(
            f"The history database was written by a newer postmortem (schema {current}, this one knows "
            f"{SCHEMA_VERSION}); upgrade postmortem or use another --db."
        )
    if current == SCHEMA_VERSION:
        return
    previous = con.execute("SELECT current_database()").fetchall()[0][0]
    con.execute(f"USE {catalog}")
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER, applied_at TIMESTAMP)")
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                con.execute(statement)
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, _now()])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        con.execute(f"USE {previous}")


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _retry_locked(action, what: str, wait_s: float):
    """Run ``action`` until the history file's lock is free, for at most ``wait_s``."""
    import duckdb

    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            return action()
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise PostmortemError(f"Could not open the history database {what}: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def sandbox(con: duckdb.DuckDBPyConnection, allowed: Path | None = None) -> duckdb.DuckDBPyConnection:
    """From here on SQL on ``con`` reaches only its own tables (and the files under ``allowed``):
    no file, URL, ATTACH, COPY, INSTALL or LOAD, and the settings locked so no query can undo it.
    Signature files and `postmortem sql` are user SQL over logs from machines we may not trust."""
    if con.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]:
        if con.execute("SELECT current_setting('enable_external_access')").fetchall()[0][0]:
            raise PostmortemError("The database's settings are locked with external access on; cannot sandbox it.")
        return con  # another connection to the same file already sandboxed it
    if allowed is not None:
        con.execute("SET allowed_directories = ?", [[str(allowed.resolve()) + os.sep]])
    for setting in ("autoinstall_known_extensions", "autoload_known_extensions", "enable_external_access"):
        con.execute(f"SET {setting} = false")
    con.execute("SET lock_configuration = true")
    return con


def _rows_of(con: duckdb.DuckDBPyConnection, table: str, run_id: str | None):
    """A table's rows (one run's, or all) as a stream of Arrow batches: a sandboxed connection
    cannot ATTACH or COPY, so its rows travel to the history or Parquet through Arrow."""
    where = "WHERE run_id = $run_id" if run_id else ""
    return con.sql(f"SELECT * FROM {table} {where}", params={"run_id": run_id} if run_id else None).to_arrow_reader()


def persist(con: duckdb.DuckDBPyConnection, db_path: Path, run_id: str, wait_s: float = LOCK_WAIT_S) -> None:
    """Copy run ``run_id`` from the staging database into the history file, atomically."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    history = _retry_locked(lambda: _connect(str(db_path)), str(db_path), wait_s)
    try:
        migrate(history, history.execute("SELECT current_database()").fetchall()[0][0])
        history.execute("BEGIN TRANSACTION")
        try:
            for table in TABLES:
                history.register("_incoming", _rows_of(con, table, run_id))
                history.execute(f"INSERT INTO {table} SELECT * FROM _incoming")
                history.unregister("_incoming")
            history.execute("COMMIT")
        except Exception:
            history.execute("ROLLBACK")
            raise
    finally:
        history.close()


def open_history(db_path: Path, write: bool = False, wait_s: float = LOCK_WAIT_S) -> duckdb.DuckDBPyConnection:
    """A connection to the history file; read-only unless ``write``."""
    if not db_path.exists():
        if not write:
            raise PostmortemError(
                f"No history database at {db_path} yet: run `postmortem analyze DIR` first, or pass --db."
            )
        db_path.parent.mkdir(parents=True, exist_ok=True)
    con = _retry_locked(lambda: _connect(str(db_path), read_only=not write), str(db_path), wait_s)
    catalog = con.execute("SELECT current_database()").fetchall()[0][0]
    if write:
        migrate(con, catalog)
    elif _schema_version(con, catalog) > SCHEMA_VERSION:
        raise PostmortemError(f"The history database {db_path} was written by a newer postmortem; upgrade it.")
    return con


def export_parquet(con: duckdb.DuckDBPyConnection, out: Path, run_id: str | None = None) -> dict[str, int]:
    """Write every table (one run, or all) as hive-partitioned Parquet: OUT/<table>/date=…/job=…/.

    Partitions are by the analysis date and the job id, so a cluster's epilogs can each write
    their runs into one shared tree and DuckDB, Spark or Trino query it as one table. ``con``
    may be sandboxed: the rows are written by a connection of this function's own.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    runs = con.sql("SELECT run_id, strftime(analyzed_at, '%Y-%m-%d') AS date, "
                   "regexp_replace(coalesce(job_id, 'none'), '[^A-Za-z0-9._-]', '_', 'g') AS job FROM runs "
                   + ("WHERE run_id = $run_id" if run_id else ""), params={"run_id": run_id} if run_id else None
                   ).to_arrow_table()
    writer = _connect()
    try:
        writer.register("_runs", runs)
        for table in TABLES:
            count = con.execute(f"SELECT count(*) FROM {table} " + ("WHERE run_id = $run_id" if run_id else ""),
                                {"run_id": run_id} if run_id else {}).fetchall()[0][0]
            if not count:
                continue
            target = str(out / table).replace("'", "''")
            writer.register("_rows", _rows_of(con, table, run_id))
            # the partition columns come from the run (its date and job), joined to each row
            writer.execute(f"""COPY (SELECT t.*, r.date, r.job FROM _rows t JOIN _runs r USING (run_id))
                               TO '{target}' (FORMAT PARQUET, PARTITION_BY (date, job), OVERWRITE_OR_IGNORE,
                                              FILENAME_PATTERN '{{uuid}}')""")
            writer.unregister("_rows")
            written[table] = count
    finally:
        writer.close()
    return written


def _parquet_files_sql(root: Path, table: str, patterns: list[str]) -> str | None:
    """A SELECT over the table's Parquet files under ``root`` matching each depth of ``patterns``
    that has files (None when none has): a tree holds whole runs (date=/job=/) beside nodes'
    rows of a multi-node job (date=/job=/node=/), and DuckDB reads one partition depth per scan."""
    scans = []
    for pattern in patterns:
        if next(iter((root / table).glob(pattern)), None) is not None:
            glob = str(root / table / pattern).replace("'", "''")
            scans.append(f"SELECT * FROM read_parquet('{glob}', hive_partitioning = true, union_by_name = true, "
                         "hive_types_autocast = false)")
    return " UNION ALL BY NAME ".join(scans) or None


def parquet_history(root: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory connection whose tables and views read a Parquet tree written by export_parquet
    (and by export_node: a multi-node job's nodes, each a run of its own here)."""
    if not root.is_dir():
        raise PostmortemError(f"No such directory: {root}")
    con = _connect()
    found = 0
    for table in TABLES:
        scan = _parquet_files_sql(root, table, ["date=*/job=*/*.parquet", "date=*/job=*/node=*/*.parquet"])
        if scan:
            con.execute(f"CREATE VIEW {table} AS {scan}")
            found += 1
        else:
            con.execute(ddl(table))
    if not found:
        raise PostmortemError(f"{root} holds no postmortem Parquet tables (runs/, events/, ...).")
    for statement in view_ddl():
        con.execute(statement)
    return sandbox(con, allowed=root)


def partition_value(value: str) -> str:
    """A job id or node name as it is spelled in a partition directory (job=…, node=…): letters,
    digits, '.', '_' and '-' kept, anything else '_' (a path separator in an id must not nest)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value) or "_"


def export_node(con: duckdb.DuckDBPyConnection, root: Path, run_id: str, job: str, node: str) -> dict[str, int]:
    """Write one node's run of a multi-node job as ROOT/<table>/date=…/job=JOB/node=NODE/rows.parquet,
    replacing whatever this node wrote for this job before, on any date: an epilog run twice
    leaves one copy. The new files are written aside first (ROOT/.incoming-…) and moved into
    place, so a reader sees the node's old rows or its new ones, table by table, never half a file."""
    job, node = partition_value(job), partition_value(node)
    date = con.execute("SELECT strftime(analyzed_at, '%Y-%m-%d') FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    aside = root / f".incoming-job={job}-node={node}-{secrets.token_hex(4)}"
    written: dict[str, int] = {}
    writer = _connect()
    try:
        for table in TABLES:
            count = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]
            if not count:
                continue
            (aside / table).mkdir(parents=True)
            target = str(aside / table / "rows.parquet").replace("'", "''")
            writer.register("_rows", _rows_of(con, table, run_id))
            writer.execute(f"COPY (SELECT * FROM _rows) TO '{target}' (FORMAT PARQUET)")
            writer.unregister("_rows")
            written[table] = count
        for table in TABLES:
            for old in (root / table).glob(f"date=*/job={job}/node={node}"):
                shutil.rmtree(old)
            if table in written:
                place = root / table / f"date={date}" / f"job={job}" / f"node={node}"
                place.parent.mkdir(parents=True, exist_ok=True)
                (aside / table).rename(place)
    finally:
        writer.close()
        shutil.rmtree(aside, ignore_errors=True)
    return written


JOB_TABLES = ("runs", "findings")  # a job's analysis; the rows it was made from are the nodes'
# The job's analysis sits beside its nodes, as a partition of that depth (Spark and Trino read a
# table whose partitions are all date/job/node); no host is named so (a host name has no '_').
JOB_ANALYSIS = "_job"


def export_job_verdict(con: duckdb.DuckDBPyConnection, root: Path, run_id: str, job: str) -> dict[str, int]:
    """Write a multi-node job's analysis (its run and findings, not the nodes' rows again) as
    ROOT/<table>/date=…/job=JOB/node=_job/analysis.parquet, replacing the job's earlier analysis:
    history questions over the tree (which signature fired, on which host) see one verdict per job."""
    job = partition_value(job)
    date = con.execute("SELECT strftime(analyzed_at, '%Y-%m-%d') FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    written: dict[str, int] = {}
    writer = _connect()
    try:
        for table in JOB_TABLES:
            for old in (root / table).glob(f"date=*/job={job}/node={JOB_ANALYSIS}/analysis.parquet"):
                old.unlink()
            count = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]
            if not count:
                continue
            place = root / table / f"date={date}" / f"job={job}" / f"node={JOB_ANALYSIS}"
            place.mkdir(parents=True, exist_ok=True)
            aside = place / f".analysis-{secrets.token_hex(4)}.parquet"
            writer.register("_rows", _rows_of(con, table, run_id))
            writer.execute(f"COPY (SELECT * FROM _rows) TO '{str(aside).replace(chr(39), chr(39) * 2)}' (FORMAT PARQUET)")
            writer.unregister("_rows")
            aside.rename(place / "analysis.parquet")
            written[table] = count
    finally:
        writer.close()
    return written


def job_nodes(root: Path, job: str) -> list[str]:
    """The nodes that wrote rows of ``job`` under ``root`` (export_node), by name."""
    job = partition_value(job)
    return sorted({p.name.removeprefix("node=") for p in (root / "runs").glob(f"date=*/job={job}/node=*")
                   if any(p.glob("*.parquet"))} - {JOB_ANALYSIS})


def job_tables(root: Path, job: str) -> duckdb.DuckDBPyConnection:
    """A sandboxed connection (it reads only under ``root``) whose tables are every node's rows of
    ``job``, read in place from the Parquet files, each row with its ``node`` (and ``date``, ``job``)."""
    job = partition_value(job)
    con = _connect()
    for table in TABLES:
        scan = _parquet_files_sql(root, table, [f"date=*/job={job}/node=*/*.parquet"])
        if scan is not None:  # the nodes' rows, not an earlier analysis of the job (pruned by partition)
            scan = f"SELECT * FROM ({scan}) WHERE node <> '{JOB_ANALYSIS}'"
        else:  # no node had rows of this table: empty, with the partition columns
            con.execute(ddl(table))
            scan = f"SELECT *, NULL::VARCHAR AS date, NULL::VARCHAR AS job, NULL::VARCHAR AS node FROM {table}"
            con.execute(f"ALTER TABLE {table} RENAME TO _empty_{table}")
            scan = scan.replace(f"FROM {table}", f"FROM _empty_{table}")
        con.execute(f"CREATE VIEW {table} AS {scan}")
    return sandbox(con, allowed=root)

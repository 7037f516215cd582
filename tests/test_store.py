"""The history database: one transaction per run, migrations, read-only queries, concurrent writers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from postmortem import api, store
from postmortem.errors import PostmortemError
from postmortem.schema import SCHEMA_VERSION, TABLES

from .conftest import CORPORA


def test_a_run_lands_in_history_and_show_rebuilds_the_same_report(sample, history):
    report = api.analyze(sample("rank_sigkill"), db=history)
    assert [r["run_id"] for r in api.runs(db=history)] == [report["run_id"]]
    again = api.show(report["run_id"][:17], db=history)
    assert again == report
    names, rows = api.query("select rank, count(*) from events group by rank order by rank", db=history)
    assert names == ["rank", "count_star()"] and [r[0] for r in rows if r[0] is not None] == [0, 1]


def test_history_has_every_table_and_the_schema_version(sample, history):
    api.analyze(sample("healthy"), db=history)
    con = duckdb.connect(str(history), read_only=True)
    tables = {r[0] for r in con.execute("select table_name from information_schema.tables").fetchall()}
    assert set(TABLES) | {"schema_version"} <= tables
    assert con.execute("select max(version) from schema_version").fetchone()[0] == SCHEMA_VERSION


def test_an_ingested_runs_connection_and_its_cursors_see_the_same_tables(sample):
    """``api.ingest``'s connection (the compressed staging database, matched) and a cursor of it, as a
    caller running their own queries would open one, count the same rows in every table."""
    con, run_id, _ = api.ingest(sample("hang_dataloader_nccl"), keep=False)
    cursor = con.cursor()
    for table in TABLES:
        sql = f"select count(*) from {table} where run_id = ?"
        assert cursor.execute(sql, [run_id]).fetchone() == con.execute(sql, [run_id]).fetchone()
    assert con.execute("select count(*) from events where run_id = ?", [run_id]).fetchone()[0] > 0
    assert cursor.execute("select verdict from runs where run_id = ?", [run_id]).fetchone()[0] == "collective-hang"


FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("history_v*.duckdb")), ids=lambda p: p.stem)
def test_a_history_written_by_every_earlier_schema_stays_readable(fixture, sample, tmp_path):
    """tests/fixtures/history_v<N>.duckdb: a history as schema N wrote it (one analyzed run,
    committed when N was current). Today's postmortem migrates it, shows the old run as it was
    stored, and adds a new run beside it."""
    db = tmp_path / fixture.name
    shutil.copy(fixture, db)
    (old,) = api.runs(db=db)
    report = api.show(old["run_id"], db=db)
    assert report["verdict"]["signature"] == "rank-crash" and report["verdict"]["culprit_ranks"] == [1]
    new = api.analyze(sample("healthy"), db=db)
    assert {r["run_id"] for r in api.runs(db=db)} == {old["run_id"], new["run_id"]}
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("select max(version) from schema_version").fetchall()[0][0] == SCHEMA_VERSION


def test_a_failure_while_copying_a_run_leaves_no_half_run(sample, history):
    api.analyze(sample("healthy"), db=history)  # an earlier, complete run
    con, run_id, _ = api.ingest(sample("rank_exception"), keep=False)
    con.execute("ALTER TABLE failures RENAME TO failures_gone")  # the copy breaks after runs/files/events
    with pytest.raises(duckdb.Error):
        store.persist(con, history, run_id)
    check = duckdb.connect(str(history), read_only=True)
    for table in ("runs", "files", "events"):
        assert check.execute(f"select count(*) from {table} where run_id = ?", [run_id]).fetchone()[0] == 0
    assert check.execute("select count(*) from runs").fetchone()[0] == 1


def test_a_history_from_a_newer_postmortem_is_refused_with_a_sentence(tmp_path):
    db = tmp_path / "future.duckdb"
    con = duckdb.connect(str(db))
    con.execute("create table schema_version (version integer, applied_at timestamp)")
    con.execute("insert into schema_version values (?, now())", [SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(PostmortemError, match="newer postmortem"):
        api.query("select 1", db=db)


def test_sql_is_read_only_unless_write_is_asked(sample, history):
    api.analyze(sample("healthy"), db=history)
    with pytest.raises(PostmortemError, match="SQL error"):
        api.query("delete from runs", db=history)
    api.query("delete from runs", db=history, write=True)
    assert api.query("select count(*) from runs", db=history)[1] == [(0,)]


def test_no_history_yet_is_a_clear_error(tmp_path):
    with pytest.raises(PostmortemError, match="No history database"):
        api.runs(db=tmp_path / "none.duckdb")


def test_two_analyses_writing_the_same_history_at_once_both_land(sample, history):
    code = "import sys; from postmortem import api; api.analyze(sys.argv[1], db=sys.argv[2])"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(sample(name)), str(history)])
             for name in ("healthy", "rank_sigkill")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert len(api.runs(db=history)) == 2


def test_batched_appends_stay_under_their_bounds_and_keep_every_tables_rows_in_order(sample):
    """The parsers' frames of a real run, a few rows at a time and the tables interleaved, through
    a Batcher of small bounds: what waits stays under them after every frame, and each staging
    table ends up holding what one insert of its frames would have put there, in the same order."""
    from postmortem import discover, parsing

    _, frames = parsing.parse_in_worker(discover.discover(sample("hang_dataloader_nccl")).sources)
    assert len(frames) >= 4 and sum(df.height for df in frames.values()) > 200
    # (seven rows at a time, the tables in turn)
    pieces = [(table, df.slice(at, 7)) for at in range(0, max(df.height for df in frames.values()), 7)
              for table, df in frames.items() if at < df.height]
    small = store.Batcher(store.staging(), "r", max_rows=40, max_bytes=16 << 10)
    for table, df in pieces:
        small.add(table, df)
        assert small.rows < 40 and small.bytes < 16 << 10
    small.flush()
    assert small.rows == small.bytes == 0 and not small.pending
    whole = store.Batcher(store.staging(), "r", max_rows=10**9, max_bytes=1 << 40)
    for table, df in frames.items():
        whole.add(table, df)
    whole.flush()
    for table in frames:
        got = small.con.sql(f"SELECT * FROM {table}").fetchall()
        assert got == whole.con.sql(f"SELECT * FROM {table}").fetchall() and len(got) == frames[table].height, table


def test_a_full_batch_inserts_the_tables_that_fill_it_and_the_few_rows_of_others_wait(sample):
    """A batch that reaches its bound inserts its largest tables, not every table: a table of a few
    rows (a run's events beside its compile records) waits for the last flush, not an insert a batch."""
    from postmortem import discover, parsing

    _, frames = parsing.parse_in_worker(discover.discover(sample("hang_dataloader_nccl")).sources)
    big, few = max(frames, key=lambda t: frames[t].height), min(frames, key=lambda t: frames[t].height)
    assert frames[big].height >= 40 and frames[few].height < 10
    batch = store.Batcher(store.staging(), "r", max_rows=frames[big].height // 2 + frames[few].height)
    batch.add(few, frames[few])
    batch.add(big, frames[big])  # (over the bound: the big table goes in, the few rows are left)
    count = lambda t: batch.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]  # noqa: E731
    assert count(big) == frames[big].height and count(few) == 0 and batch.rows == frames[few].height
    batch.flush()
    assert count(few) == frames[few].height and batch.rows == batch.bytes == 0


def test_what_the_parsers_write_in_a_json_column_is_json():
    """A JSON column's text reaches DuckDB unchecked (``store._json_marked``): in every sample's and every
    real-world case's parsed frames, each value of a JSON column parses as JSON."""
    import json

    from postmortem import discover, parsing

    cases = [p.parent for root in CORPORA for p in sorted(root.glob("*/expected.json"))]
    checked = 0
    for case in cases:
        _, frames = parsing.parse_in_worker(discover.discover(case).sources)
        for table, df in frames.items():
            for name in store._JSON_COLUMNS[table]:
                for value in df[name].drop_nulls().unique().cast(str):
                    json.loads(value)
                    checked += 1
    assert len(cases) > 200 and checked > 1000

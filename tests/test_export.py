"""Scale-out: runs as hive-partitioned Parquet, queried like the history."""

from __future__ import annotations

from postmortem import api

from .conftest import sample_dir


def test_export_and_query_parquet_match_the_history(tmp_path, history):
    for name in ("rank_sigkill", "hang_dataloader"):
        api.analyze(sample_dir(name), db=history, labels={"job_id": f"job/{name}"})
    written = api.export(tmp_path / "pq", db=history)
    assert written["runs"] == 2 and written["events"] > 0
    for table in ("runs", "events", "findings"):
        for job in ("job_rank_sigkill", "job_hang_dataloader"):
            assert list((tmp_path / "pq" / table).glob(f"date=*/job={job}/*.parquet")), (table, job)
    sql = "select signature, count(*) from v_findings group by 1 order by 1"
    assert api.query(sql, parquet=tmp_path / "pq") == api.query(sql, db=history)


def test_each_nodes_ingest_adds_to_one_parquet_tree(tmp_path):
    tree = tmp_path / "shared"
    for name in ("rank_exception", "native_crash"):
        api.ingest(sample_dir(name), keep=False, parquet=tree)
    names, rows = api.query("select verdict from runs order by verdict", parquet=tree)
    assert [r[0] for r in rows] == ["native-crash", "rank-crash"]

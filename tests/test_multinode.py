"""Multi-node jobs: every node ingests its own logs into one Parquet tree, and the job is analyzed
from there (`ingest DIR --parquet ROOT --job ID --node NAME`, `analyze --parquet ROOT --job ID`).

Each real multi-rank sample is laid out as a multi-node job keeps its logs: its files are copied,
unedited and at their own relative paths, into one folder per node, each rank's files (logs,
flight-recorder dumps, py-spy dumps, traces) on the node that holds the rank, ranks in blocks
(0-1 on the first node, ...). Files that speak for no single rank (torchrun's console, with every
rank's lines and the agent's) go to the first node whole, as a scheduler's merged job output does.

The clock-skew tests shift one node's clock: every timestamp in its files (log headers in both
glog and Python-logging form, torchrun's failure table, torchelastic's error.json, the
flight-recorder dumps' *_ns times) is moved by the same number of seconds, as a host whose clock is
that far off would have printed them. The shift is the test's; nothing else in the files changes.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from postmortem.parsers import pickles

from postmortem import api, discover

from .conftest import sample_dir, scenario_names

CRASH_OR_HANG = {"rank-crash", "native-crash", "collective-hang", "collective-mismatch", "timeout-misconfigured",
                 "collective-timeout"}


def _ranks_of(sample: Path) -> list[int]:
    return sorted({s.rank for s in discover.discover(sample).sources if s.rank is not None})


def _multi_rank(names: list[str]) -> list[str]:
    return [n for n in names if len(_ranks_of(sample_dir(n))) >= 2]


MULTI_RANK = _multi_rank(scenario_names())


def _expected(name: str) -> dict:
    return json.loads((sample_dir(name) / "expected.json").read_text())


def split_into_nodes(sample: Path, out: Path, nodes: int) -> dict[str, list[int]]:
    """Copy a sample's files into ``nodes`` node folders (gpu-00, gpu-01, ...), ranks in blocks.
    Returns each node's ranks."""
    ranks = _ranks_of(sample)
    per_node = -(-len(ranks) // nodes)
    node_of = {r: f"gpu-{i // per_node:02d}" for i, r in enumerate(ranks)}
    first = "gpu-00"
    for source in discover.discover(sample).sources:
        if source.name == "expected.json":
            continue  # the scenario's answer, not one of the job's files
        target = out / node_of.get(source.rank, first) / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(sample / source.name, target)
    return {n: [r for r in ranks if node_of[r] == n] for n in sorted(set(node_of.values()))}


# The timestamps a skewed host prints, in the forms the samples hold them.
GLOG = re.compile(rb"(?m)(^|\]:|\[)([IWEFVD])(\d\d)(\d\d) (\d\d:\d\d:\d\d)\.(\d+)")
ISO = re.compile(rb"(\d{4}-\d\d-\d\d)([ T_])(\d\d:\d\d:\d\d)(?:([,.])(\d+))?")
EPOCH_S = re.compile(rb'("timestamp": ")(\d{9,11})(")')


def _shift_text(data: bytes, seconds: float, year: int) -> bytes:
    delta = timedelta(seconds=seconds)

    def glog(m: re.Match) -> bytes:
        frac = m[6].decode()
        when = datetime.strptime(f"{year}{m[3].decode()}{m[4].decode()} {m[5].decode()}", "%Y%m%d %H:%M:%S")
        when += timedelta(microseconds=int(frac[:6].ljust(6, "0"))) + delta
        digits = (f"{when.microsecond:06d}" + frac[6:])[: len(frac)] if len(frac) >= 6 else \
            f"{when.microsecond:06d}"[: len(frac)]
        return m[1] + m[2] + when.strftime("%m%d %H:%M:%S").encode() + b"." + digits.encode()

    def iso(m: re.Match) -> bytes:
        frac = (m[5] or b"").decode()
        when = datetime.strptime(f"{m[1].decode()} {m[3].decode()}", "%Y-%m-%d %H:%M:%S")
        when += timedelta(microseconds=int(frac[:6].ljust(6, "0")) if frac else 0) + delta
        text = when.strftime(f"%Y-%m-%d{m[2].decode()}%H:%M:%S")
        if frac:
            text += m[4].decode() + f"{when.microsecond:06d}"[: len(frac)]
        return text.encode()

    data = GLOG.sub(glog, data)
    data = ISO.sub(iso, data)
    return EPOCH_S.sub(lambda m: m[1] + str(int(m[2]) + round(seconds)).encode() + m[3], data)


def _shift_ns(value, seconds: float):
    """Every *_ns time in a flight-recorder dump (plain containers only), moved."""
    if isinstance(value, dict):
        return {k: (v + round(seconds * 1e9) if isinstance(k, str) and k.endswith("_ns") and isinstance(v, int)
                    and v > 10 ** 17 else _shift_ns(v, seconds)) for k, v in value.items()}
    if isinstance(value, list):
        return [_shift_ns(v, seconds) for v in value]
    return value


def shift_node_clock(node_dir: Path, seconds: float, year: int = 2026) -> None:
    """Rewrite every timestamp of a node's files as a host whose clock is ``seconds`` off prints them."""
    for path in sorted(p for p in node_dir.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        packed = raw[:2] == b"\x1f\x8b"
        data = gzip.decompress(raw) if packed else raw
        if data[:1] == b"\x80":  # a pickle: a flight-recorder dump (read through the restricted unpickler)
            try:
                data = pickle.dumps(_shift_ns(pickles.loads(data), seconds), protocol=4)
            except pickles.UnsafePickle:
                continue
        else:
            data = _shift_text(data, seconds, year)
        path.write_bytes(gzip.compress(data, mtime=0) if packed else data)


def ingest_job(nodes_dir: Path, tree: Path, job: str, nodes: list[str]) -> None:
    for node in nodes:
        api.ingest_node(nodes_dir / node, tree, job=job, node=node, keep=False)


def _verdict(report: dict) -> tuple[str | None, list[int]]:
    return report["verdict"]["signature"], sorted(report["verdict"]["culprit_ranks"] or [])


def _want(name: str) -> tuple[str | None, list[int]]:
    """What `analyze DIR` says of the whole folder: `postmortem eval sample_logs/` holds it to expected.json."""
    expected = _expected(name)
    return expected.get("root_cause"), sorted(expected.get("culprit_ranks") or [])


@pytest.mark.parametrize("name", MULTI_RANK)
def test_a_sample_split_across_two_nodes_gets_the_verdict_of_its_whole_folder(name, tmp_path):
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "job-1", list(layout))
    report = api.analyze_job(tmp_path / "pq", "job-1", keep=False)
    signature, culprits = _want(name)
    assert report["verdict"]["signature"] == signature, report["verdict"]
    if culprits:
        assert sorted(report["verdict"]["culprit_ranks"]) == culprits, report["verdict"]
    user_line = _expected(name).get("user_line")
    if user_line:
        assert api._same_line(user_line, report["verdict"]["user_line"]), report["verdict"]
    assert [n["node"] for n in report["nodes"]] == list(layout)
    assert {r for n in report["nodes"] for r in n["ranks"]} == {r for rs in layout.values() for r in rs}
    assert report["missing"]["ranks"] == [] and report["missing"]["nodes"] == []


def test_the_whole_folder_and_the_two_node_job_agree_rank_by_rank(tmp_path):
    """The same run facts and rank endings, not just the verdict: a real crash (rank 1's exception)."""
    name = "rank_exception"
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "job-1", list(layout))
    job = api.analyze_job(tmp_path / "pq", "job-1", keep=False)
    whole = api.analyze(sample_dir(name), keep=False)
    assert (job["world_size"], job["ranks_seen"]) == (whole["world_size"], whole["ranks_seen"])
    assert [(e["rank"], e["ts"], e["ended"]) for e in job["ranks"]] == [
        (e["rank"], e["ts"], e["ended"]) for e in whole["ranks"]]
    assert job["verdict"]["user_line"] == whole["verdict"]["user_line"]


HANG_SAMPLES = [n for n in MULTI_RANK if _expected(n).get("root_cause") == "collective-hang"
                and len(_ranks_of(sample_dir(n))) >= 4]


@pytest.mark.parametrize("name", HANG_SAMPLES)
def test_a_hang_split_across_four_nodes_still_names_the_rank_that_never_came(name, tmp_path):
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 4)
    assert len(layout) == 4
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "job-4", list(layout))
    report = api.analyze_job(tmp_path / "pq", "job-4", keep=False)
    assert _verdict(report) == _want(name)


# Hang samples of two ranks: fanned out to 8 ranks on 4 nodes by benchmarks/synth.py (the real
# run's lines, ids rewritten; each node folder holds its ranks' logs, console and dumps).
TWO_RANK_HANGS = [n for n in MULTI_RANK if _expected(n).get("root_cause") == "collective-hang"
                  and len(_ranks_of(sample_dir(n))) < 4]


@pytest.mark.parametrize("name", TWO_RANK_HANGS)
def test_a_hang_fanned_out_to_four_nodes_gets_the_verdict_of_its_whole_folder(name, tmp_path):
    from .test_synth import synth

    job = synth.synthesize(sample_dir(name), tmp_path / "job", ranks=8, per_node=2, pad_mb=0, seed=7)
    nodes = sorted(p.name for p in job.iterdir() if p.is_dir())
    assert len(nodes) == 4
    ingest_job(job, tmp_path / "pq", "job-4", nodes)
    report = api.analyze_job(tmp_path / "pq", "job-4", keep=False)
    whole = api.analyze(job, keep=False)
    assert _verdict(report) == _verdict(whole) == _want(name), (report["verdict"], whole["verdict"])
    assert report["missing"]["ranks"] == [] and report["missing"]["nodes"] == []


SKEWED = [n for n in MULTI_RANK if _expected(n).get("root_cause") in CRASH_OR_HANG]


# +30 s for every other sample, -30 s for the rest: both directions, each sample once (the 2-core CI).
SHIFTS = [(name, 30.0 if i % 2 == 0 else -30.0) for i, name in enumerate(SKEWED)]


@pytest.mark.parametrize(("name", "seconds"), SHIFTS)
def test_one_node_thirty_seconds_off_keeps_the_verdict_and_reports_its_offset(name, seconds, tmp_path):
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    skewed = list(layout)[-1]
    shift_node_clock(tmp_path / "nodes" / skewed, seconds)
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "job-s", list(layout))
    report = api.analyze_job(tmp_path / "pq", "job-s", keep=False)
    assert _verdict(report) == _want(name)
    clock = next(n for n in report["nodes"] if n["node"] == skewed)
    notes = " ".join(report["clock"]["notes"])
    if clock["clock_offset_s"] is None:
        assert f"{skewed}'s clock against gpu-00 cannot be estimated" in notes
    else:
        assert abs(clock["clock_offset_s"] - seconds) < 1.0, clock
        assert clock["corrected"]
        assert f"{skewed}'s clock is {clock['clock_offset_s']:+.1f} s against gpu-00" in notes
        assert "times below are corrected" in notes
        job_finding = next(f for f in report["findings"] if f["signature"] == "multi-node-job")
        assert f"{clock['clock_offset_s']:+.1f} s against gpu-00" in job_finding["summary"]


def test_the_offset_is_estimated_from_the_logs_of_a_crash_and_of_a_hang(tmp_path):
    """Where both nodes' ranks printed moments shared by every rank (step lines, completed
    collectives), the offset is found: not "cannot be estimated"."""
    for name in ("rank_exception", "hang_dataloader_nccl"):
        layout = split_into_nodes(sample_dir(name), tmp_path / name, 2)
        shift_node_clock(tmp_path / name / "gpu-01", 30.0)
        ingest_job(tmp_path / name, tmp_path / f"pq-{name}", "j", list(layout))
        report = api.analyze_job(tmp_path / f"pq-{name}", "j", keep=False)
        clock = next(n for n in report["nodes"] if n["node"] == "gpu-01")
        assert clock["clock_offset_s"] == pytest.approx(30.0, abs=1.0), (name, clock)
        assert clock["clock_uncertainty_s"] < 1.0


def test_re_ingesting_a_node_leaves_one_copy_of_its_rows(tmp_path):
    name = "hang_dataloader"
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "j", list(layout))
    once = api.query("SELECT node, count(*) FROM events GROUP BY node ORDER BY node", parquet=tmp_path / "pq")
    api.ingest_node(tmp_path / "nodes" / "gpu-01", tmp_path / "pq", job="j", node="gpu-01", keep=False)
    twice = api.query("SELECT node, count(*) FROM events GROUP BY node ORDER BY node", parquet=tmp_path / "pq")
    assert once == twice
    runs = api.query("SELECT count(*) FROM runs", parquet=tmp_path / "pq")[1][0][0]
    assert runs == 2
    report = api.analyze_job(tmp_path / "pq", "j", keep=False)
    assert _verdict(report) == _want(name)


def test_a_node_that_never_ingested_is_named_in_the_verdict(tmp_path):
    """gpu-01's epilog never ran: the job's other node (with the merged console, where rank 1's
    lines are too) is analyzed, and the verdict says which node is missing."""
    name = "hang_dataloader"
    split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "j", ["gpu-00"])
    report = api.analyze_job(tmp_path / "pq", "j", keep=False, nodes=["gpu-00", "gpu-01"])
    assert report["verdict"]["summary"].endswith("(node gpu-01 expected by the scheduler did not ingest)")
    assert report["missing"]["nodes"] == ["gpu-01"]
    finding = next(f for f in report["findings"] if f["signature"] == "multi-node-job")
    assert finding["severity"] == "warning" and "gpu-01" in finding["summary"]


def test_ranks_no_node_wrote_are_named_with_the_node_that_did_not_ingest(tmp_path):
    """An NCCL hang on 2 nodes without the launcher's merged console: gpu-01 never ingested, so
    rank 1 left nothing, and the world size NCCL's init line states (nranks 2) shows it missing."""
    name = "hang_dataloader_nccl"
    split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    for merged in (tmp_path / "nodes" / "gpu-00").glob("console.log"):
        merged.unlink()  # the launcher's merged output would hold rank 1's lines too
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "j", ["gpu-00"])
    report = api.analyze_job(tmp_path / "pq", "j", keep=False, nodes=["gpu-00", "gpu-01"])
    assert report["world_size"] == 2
    assert "(rank 1 left no rows: node gpu-01 did not ingest)" in report["verdict"]["summary"]
    assert report["missing"]["ranks"] == [1]


def test_the_missing_sentence_names_ranges_and_nodes():
    from postmortem.job import Job, missing_sentence

    job = Job("4711", "gpu-00", {}, {}, missing_ranks=list(range(24, 32)), missing_nodes=["gpu-07"])
    assert missing_sentence(job) == "ranks 24-31 left no rows: node gpu-07 did not ingest"
    job.missing_nodes = []
    assert missing_sentence(job) == "ranks 24-31 left no rows: no node that ingested ran them"


def test_the_cli_ingests_each_node_and_analyzes_the_job_with_analyzes_exit_code(tmp_path):
    from typer.testing import CliRunner

    from postmortem.cli import app

    name = "rank_sigkill"
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    runner = CliRunner()
    for node in layout:
        result = runner.invoke(app, ["ingest", str(tmp_path / "nodes" / node), "--parquet", str(tmp_path / "pq"),
                                     "--job", "4711", "--node", node, "--no-history", "-q"])
        assert result.exit_code == 0, result.output
    job = runner.invoke(app, ["analyze", "--parquet", str(tmp_path / "pq"), "--job", "4711", "--no-history",
                              "-f", "json", "-q"])
    whole = runner.invoke(app, ["analyze", str(sample_dir(name)), "--no-history", "-f", "json", "-q"])
    assert job.exit_code == whole.exit_code == 1
    schema = json.loads(resources.files("postmortem").joinpath("schema/report-1.json").read_text())
    jsonschema.validate(json.loads(job.stdout), schema)
    assert _verdict(json.loads(job.stdout)) == _verdict(json.loads(whole.stdout))
    assert list((tmp_path / "pq" / "events").glob("date=*/job=4711/node=gpu-01/*.parquet"))
    none = runner.invoke(app, ["analyze", "--parquet", str(tmp_path / "pq"), "--job", "nope", "--no-history"])
    assert none.exit_code == 2 and "No node has ingested job 'nope'" in none.output


def test_an_analyzed_job_lands_in_the_history_like_any_run(tmp_path):
    name = "rank_sigkill"
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "j", list(layout))
    report = api.analyze_job(tmp_path / "pq", "j", db=tmp_path / "h.duckdb")
    shown = api.show(report["run_id"], db=tmp_path / "h.duckdb")
    assert _verdict(shown) == _verdict(report)
    assert any(f["signature"] == "multi-node-job" for f in shown["findings"])


def test_a_slurm_host_list_expands_to_the_node_names():
    from postmortem.job import expand_nodelist

    assert expand_nodelist("gpu-[00-02,07],login1") == ["gpu-00", "gpu-01", "gpu-02", "gpu-07", "login1"]
    assert expand_nodelist("node[9-11]") == ["node9", "node10", "node11"]


def test_every_nodes_slurm_epilog_ingests_and_the_last_one_analyzes_the_job(tmp_path):
    root = Path(__file__).resolve().parent.parent
    name = "rank_sigkill"
    layout = split_into_nodes(sample_dir(name), tmp_path / "local", 2)
    bin_dir = tmp_path / "bin"  # Slurm's own `scontrol show hostnames`, for a machine without Slurm
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'gpu-00\\ngpu-01\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    out = tmp_path / "shared" / "jobs" / "4242"
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-[00-01]",
           "POSTMORTEM_PARQUET": str(tmp_path / "shared" / "pq"), "POSTMORTEM_OUT": str(out),
           "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for node in layout:  # gpu-00's epilog finds gpu-01 missing and leaves the verdict to it
        env.update(SLURMD_NODENAME=node, POSTMORTEM_LOCAL_LOGS=str(tmp_path / "local" / node))
        done = subprocess.run(["bash", str(root / "examples/slurm/epilog-multinode.sh")], env=env, timeout=300,
                              check=False)
        assert done.returncode == 0
        assert (out / "postmortem.json").exists() == (node == "gpu-01")
    report = json.loads((out / "postmortem.json").read_text())
    assert _verdict(report) == _want(name)
    assert [n["node"] for n in report["nodes"]] == ["gpu-00", "gpu-01"] and report["missing"]["nodes"] == []
    assert (out / "postmortem.rc").read_text().strip() == "1"


def test_the_clock_statement_names_corrected_nodes_and_groups_the_agreeing_ones():
    from postmortem.job import Clock, Job, clock_sentences

    clocks = {"gpu-00": Clock("gpu-00", 0.0, 0.0, "the reference clock"),
              "gpu-01": Clock("gpu-01", 0.01, 0.05, "step lines", 4),
              "gpu-02": Clock("gpu-02", -0.02, 0.08, "step lines", 4),
              "gpu-03": Clock("gpu-03", 2.4, 0.1, "completed collectives", 12),
              "gpu-04": Clock("gpu-04")}
    job = Job("4711", "gpu-00", {n: [i] for i, n in enumerate(clocks)}, clocks)
    assert clock_sentences(job) == [
        "gpu-03's clock is +2.4 s against gpu-00 (± 0.10 s, from 12 completed collectives); times below are corrected",
        ("gpu-04's clock against gpu-00 cannot be estimated (no moment seen on the ranks of both: a step line, a "
        "collective completed everywhere, one sequence's watchdog timeouts): its times are as it printed them"),
        "the clocks of 2 nodes (gpu-01, gpu-02) agree with gpu-00's within ± 0.08 s: their times are as printed"]
    assert [n for n, c in clocks.items() if c.corrected] == ["gpu-03"]


def test_ranks_of_two_nodes_ending_closer_than_their_clocks_are_known_are_not_ordered():
    from postmortem.job import Clock, Job, order_warnings

    clocks = {"gpu-00": Clock("gpu-00", 0.0, 0.0, "the reference clock"),
              "gpu-01": Clock("gpu-01", 30.0, 0.4, "watchdog timeouts", 2)}
    job = Job("4711", "gpu-00", {"gpu-00": [0], "gpu-01": [1]}, clocks)
    endings = [{"rank": 1, "ts": "2026-11-29 15:54:42.011000", "ended": "SIGKILL"},
               {"rank": 0, "ts": "2026-11-29 15:54:42.300000", "ended": "exit 1"}]
    assert order_warnings(endings, job) == [
        ("rank 1 and rank 0 ended 0.29 s apart on different nodes, within their clocks' uncertainty (± 0.40 s): "
        "which ended first is not told by the times")]
    endings[1]["ts"] = "2026-11-29 15:54:43.000000"  # 1 s apart: more than the clocks' ± 0.4 s
    assert order_warnings(endings, job) == []
    job.ranks_by_node = {"gpu-00": [0, 1]}  # one node, one clock: its own order holds
    endings[1]["ts"] = "2026-11-29 15:54:42.300000"
    assert order_warnings(endings, job) == []


def test_the_job_id_comes_from_the_flag_the_scheduler_or_torchruns_rendezvous():
    from postmortem.errors import PostmortemError
    from postmortem.job import job_id_of

    assert job_id_of("given", {"job_id": "4711"}, "rdzv") == "given"
    assert job_id_of(None, {"job_id": "4711"}, "rdzv") == "4711"  # SLURM_JOB_ID
    kubeflow = {"pod": "bert-worker-3", "namespace": "research", "job_name": "bert"}  # PYTORCHJOB_NAME
    assert job_id_of(None, kubeflow, "rdzv") == "research/bert"
    assert job_id_of(None, {}, "rdzv-17") == "rdzv-17"  # torchrun's --log-dir layout
    with pytest.raises(PostmortemError, match="No job id"):
        job_id_of(None, {}, None)


def test_the_jobs_verdict_lands_in_the_parquet_tree_once_beside_the_nodes_rows(tmp_path):
    """History questions over the tree (DuckDB here, Spark or Trino alike) see the job's verdict;
    analyzing the job again replaces it, and the nodes' rows are not written a second time."""
    name = "rank_sigkill"
    layout = split_into_nodes(sample_dir(name), tmp_path / "nodes", 2)
    ingest_job(tmp_path / "nodes", tmp_path / "pq", "j", list(layout))
    events = api.query("SELECT count(*) FROM events", parquet=tmp_path / "pq")
    for _ in range(2):
        report = api.analyze_job(tmp_path / "pq", "j", keep=False)
    _, rows = api.query("SELECT run_id, verdict FROM runs WHERE verdict IS NOT NULL", parquet=tmp_path / "pq")
    assert rows == [(report["run_id"], _want(name)[0])]
    assert api.query("SELECT count(*) FROM events", parquet=tmp_path / "pq") == events
    culprits = api.query("SELECT DISTINCT culprit_rank FROM v_findings WHERE role = 'root_cause'", parquet=tmp_path / "pq")
    assert [r[0] for r in culprits[1]] == _want(name)[1]
    assert api.analyze_job(tmp_path / "pq", "j", keep=False)["nodes"] == report["nodes"]  # not read as a node

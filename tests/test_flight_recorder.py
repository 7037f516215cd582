"""Flight-recorder dumps: the parser, its sniffer, the restricted unpickler, and PyTorch's own analyzer.

Real dumps come from the project's samples (``nccl_watchdog_timeout``: the dump NCCL's
watchdog wrote on the timeout, PyTorch 2.11, H200). The JSON variant is written by a
one-rank gloo job run here with the system's torch when it has one.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postmortem.parsers import flight_recorder as fr
from postmortem.parsers import pickles
from postmortem.parsers.source import Source

from postmortem import api, discover
from postmortem.checks import collective_alignment as alignment

from .conftest import scenario_names

FR_SAMPLE = "nccl_watchdog_timeout"


def dumps_of(sample_dir: Path) -> list[Path]:
    return sorted(p for p in sample_dir.glob("nccl_trace_rank_*") if p.is_file())


def parse(path: Path, rank: int | None = None) -> dict:
    source = Source(path=path, name=path.name, kind=fr.KIND, rank=rank)
    tables = {}
    for table, frame in fr.parse(source):
        tables.setdefault(table, []).append(frame)
    import polars as pl
    return {t: pl.concat(f) for t, f in tables.items()}


# ---------------------------------------------------------------- the real dump


def test_dump_written_on_timeout_gives_collectives_status_and_stacks(sample):
    (dump,) = dumps_of(sample(FR_SAMPLE))[:1]
    raw = pickles.loads(dump.read_bytes())
    tables = parse(dump, rank=0)
    colls = tables["collectives"].to_dicts()
    assert len(colls) == len(raw["entries"])
    for row, entry in zip(colls, raw["entries"]):
        assert row["source"] == "flight_recorder" and row["pg"] == entry["process_group"][0]
        assert row["op"] == entry["profiling_name"].split(":", 1)[1].split(" ")[0]
        assert row["seq_id"] == (entry["p2p_seq_id"] if entry["is_p2p"] else entry["collective_seq_id"])
        assert row["state"] == entry["state"] and row["timeout_ms"] == entry["timeout_ms"]
        assert json.loads(row["sizes"])["in"] == entry["input_sizes"]
        numel = sum(eval_prod(s) for s in entry["input_sizes"])
        assert row["numel_in"] == numel
    (status,) = [s for s in tables["rank_status"].to_dicts() if s["pg"] == "0"]
    pg0 = raw["pg_status"]["0"]
    assert (status["last_enqueued"], status["last_completed"]) == (
        pg0["last_enqueued_collective"], pg0["last_completed_collective"])
    # Frames only of what had not completed, plus the last few completed per group: bounded.
    stacks = tables["stacks"].to_dicts()
    kept = {s["origin_line"] for s in stacks}
    for i in kept:
        if colls[i - 1]["state"] == "completed":
            later = [j for j, c in enumerate(colls, 1) if j > i and c["state"] == "completed"
                     and c["pg"] == colls[i - 1]["pg"]]
            assert len(later) < fr.KEEP_COMPLETED
    stuck = [s for s in stacks if s["thread_state"] != "completed"]
    assert stuck and any(s["file"].endswith("train.py") for s in stuck), "the user's frame is in the stuck entry"


def eval_prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_fr_dump_agrees_with_the_watchdog_on_the_timed_out_sequence(sample):
    con, run_id, _ = api.load(sample(FR_SAMPLE))
    timed_out = con.execute(
        "SELECT rank, pg, seq_id, op, numel_in FROM collectives WHERE run_id = ? AND source = 'watchdog' "
        "AND file LIKE 'logs/%'", [run_id]).fetchall()
    assert timed_out
    for rank, pg, seq, op, numel in timed_out:
        (row,) = con.execute(
            "SELECT op, numel_in, state FROM collectives WHERE run_id = ? AND source = 'flight_recorder' "
            "AND rank = ? AND pg = ? AND seq_id = ?", [run_id, rank, pg, seq]).fetchall()
        assert alignment.op_family(row[0]) == alignment.op_family(op) and row[1] == numel
        assert row[2] != "completed"


def test_files_are_recorded_as_flight_recorder_with_their_rank(sample):
    con, run_id, _ = api.load(sample(FR_SAMPLE))
    got = con.execute("SELECT path, rank, status FROM files WHERE run_id = ? AND kind = 'flight_recorder'",
                      [run_id]).fetchall()
    assert {p for p, _, _ in got} == {d.name for d in dumps_of(sample(FR_SAMPLE))}
    assert all(status == "parsed" and rank == int(path.rsplit("_", 1)[1]) for path, rank, status in got)


# ---------------------------------------------------------------- sniffing and names


def test_sniff_claims_dumps_and_leaves_memory_snapshots_to_their_parser(sample):
    (dump,) = dumps_of(sample(FR_SAMPLE))[:1]
    head = dump.read_bytes()[:65536]
    assert fr.sniff(head, dump.name) and discover.classify(head, dump.name) == "flight_recorder"
    # A real torch.cuda.memory._dump_snapshot() pickle (keys segments, device_traces).
    snapshots = sorted(sample("memory_leak").glob("memory_snapshot_rank*.pickle"))
    assert snapshots
    for snap in snapshots:
        head = snap.read_bytes()[:65536]
        assert head[:1] == b"\x80" and not fr.sniff(head, snap.name)
        assert discover.classify(head, snap.name) != "flight_recorder"


@pytest.mark.parametrize("name,rank", [("nccl_trace_rank_3", 3), ("traces/_dump_12", 12), ("fr_dump_rank0.pkl", 0),
                                       ("job/rank7/trace_1", 7), ("dump", None)])
def test_rank_from_a_dumps_file_name(name, rank):
    assert discover.rank_from_name(name) == rank


def test_rank_from_pg_config_when_the_name_has_none(sample, tmp_path):
    (dump,) = dumps_of(sample(FR_SAMPLE))[:1]
    copy = tmp_path / "trace"
    shutil.copy(dump, copy)
    raw = pickles.loads(dump.read_bytes())
    groups = fr._groups(raw)
    expected = fr.dump_rank(raw, groups)
    assert expected is not None
    assert set(parse(copy)["collectives"]["rank"].to_list()) == {expected}


# ---------------------------------------------------------------- the JSON variant

_GLOO_JOB = r"""
import os, sys, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
out = sys.argv[1]
dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"), rank=0, world_size=1)
dist.all_reduce(torch.ones(1024))
dist.all_gather_into_tensor(torch.empty(16), torch.ones(16))
dist.broadcast(torch.ones(3, 5, dtype=torch.int64), src=0)
# gloo marks an entry completed from its own thread: let the last one land before the two
# dumps, or they can disagree on pg_status' last completed collective.
import time; time.sleep(1)
with open(os.path.join(out, "fr_rank_0.pkl"), "wb") as fh:
    fh.write(c10d._dump_fr_trace(True, True, False))
with open(os.path.join(out, "fr_rank_0.json"), "wb") as fh:
    fh.write(c10d._dump_fr_trace_json(True, False))
os._exit(0)
"""


def _json_and_pickle(tmp_path: Path) -> tuple[Path, Path]:
    """The same recorder state as JSON and as pickle, from a real gloo job on this interpreter
    (torch is a test dependency: without it this fails)."""
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}
    run = subprocess.run([sys.executable, "-c", _GLOO_JOB, str(tmp_path)], capture_output=True, timeout=300, env=env,
                         check=False)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    assert (tmp_path / "fr_rank_0.json").stat().st_size > 0 and (tmp_path / "fr_rank_0.pkl").stat().st_size > 0
    return tmp_path / "fr_rank_0.json", tmp_path / "fr_rank_0.pkl"


def test_json_variant_gives_the_same_rows_as_the_pickle(tmp_path):
    as_json, as_pickle = _json_and_pickle(tmp_path)
    assert fr.sniff(as_json.read_bytes()[:65536], as_json.name)
    a, b = parse(as_json, rank=0), parse(as_pickle, rank=0)
    assert a["collectives"].height > 0
    assert a["collectives"].equals(b["collectives"].with_columns(a["collectives"]["file"]))
    assert a["rank_status"].drop("file").equals(b["rank_status"].drop("file"))


# ---------------------------------------------------------------- hostile pickles


class _RunsCommand:
    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return self.func, (self.arg,)


def _plant(target: Path, marker: Path) -> dict[str, str]:
    """Three pickles that would run a command if loaded with pickle.load; two look like dumps."""
    import builtins
    import subprocess as sp
    planted = {
        # a dump whose entries hold an object that calls os.system on load
        "nccl_trace_rank_0": pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "ranks": "[0, 1]"}},
                                           "entries": [_RunsCommand(os.system, f"touch {marker}")]}, protocol=2),
        # a dump whose version is computed by builtins.eval
        "_dump_1": pickle.dumps({"pg_config": {}, "version": _RunsCommand(builtins.eval,
                                 f"open({str(marker)!r}, 'w').close() or '2.10'")}, protocol=4),
        # a bare pickle (no dump keys at all) that calls subprocess.call
        "evil.pkl": pickle.dumps(_RunsCommand(sp.call, ["touch", str(marker)]), protocol=4),
    }
    for name, data in planted.items():
        (target / name).write_bytes(data)
    return planted


def test_malicious_pickles_are_refused_recorded_and_never_run(copy_sample, tmp_path):
    target = copy_sample("healthy")
    marker = tmp_path / "pwned"
    planted = _plant(target, marker)
    con, run_id, _ = api.ingest(target, keep=False)
    files = {p: (kind, status, error) for p, kind, status, error in con.execute(
        "SELECT path, kind, status, error FROM files WHERE run_id = ?", [run_id]).fetchall()}
    for name in planted:
        _, status, error = files[name]
        assert status in ("skipped", "partial") and error, (name, files[name])
    assert "refused global" in files["nccl_trace_rank_0"][2] and "system" in files["nccl_trace_rank_0"][2]
    assert "refused global" in files["_dump_1"][2] and "eval" in files["_dump_1"][2]
    assert not marker.exists(), "a planted command ran"
    # The run still landed, with the real logs read.
    assert con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM events WHERE run_id = ?", [run_id]).fetchone()[0] > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=4000), flip=st.integers(min_value=0, max_value=255))
def test_mutated_real_dump_is_read_or_refused_never_crashes(sample, tmp_path, cut, flip):
    (dump,) = dumps_of(sample(FR_SAMPLE))[:1]
    data = bytearray(dump.read_bytes())
    pos = cut % len(data)
    data[pos] = flip
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(bytes(data[: max(pos, 1)]) if cut % 3 == 0 else bytes(data))
    try:
        parse(path, rank=0)
    except ValueError:
        pass  # refused with a reason: discovery records it


# ---------------------------------------------------------------- PyTorch's own analyzer


def _fr_trace_findings(python3: str, dump_dir: Path) -> tuple[int, str, list[dict]]:
    """Run torchfrtrace and read back what it reports (anchors.md §1.5 gives its log texts)."""
    run = subprocess.run([python3, "-m", "torch.distributed.flight_recorder.fr_trace", str(dump_dir),
                          "-p", "nccl_trace_rank_", "--allow-incomplete-ranks"],
                         capture_output=True, text=True, timeout=300, check=False)
    out = run.stdout + run.stderr
    findings = []
    for block in re.split(r"\n(?=Not all ranks joining|Collective sequence number|Input/output mismatch)", out):
        head = re.match(r"(?:Not all ranks joining collective, sequence number: (\d+))|"
                        r"(?:Collective sequence number: (\d+) has errors)|"
                        r"(?:Input/output mismatch in the collective sequence number: (\d+))", block)
        group = re.search(r"group info: ([^:\n]+):", block)
        if not head or not group:
            continue
        missing = re.search(r"missing ranks: \{([\d, ]*)\}", block)
        error = re.search(r"Error type: (\w+)", block)
        findings.append({"kind": "missing" if head[1] else "mismatch", "seq": int(head[1] or head[2] or head[3]),
                         "pg": group[1], "error": error[1] if error else None,
                         "ranks": {int(r) for r in missing[1].split(",") if r.strip()} if missing else set()})
    return run.returncode, out, findings


def _gloo_dumps(sdir: Path) -> bool:
    dumps = [pickles.loads(d.read_bytes()) for d in dumps_of(sdir)]
    return bool(dumps) and all(
        str(e.get("profiling_name", "")).startswith("gloo:") for d in dumps for e in d.get("entries", []))


def test_every_problem_torchfrtrace_reports_is_in_our_tables(sample, copy_sample, tmp_path):
    """PyTorch's analyzer, run on each sample's dumps and on two-rank variants of the real
    dump (test_collective_alignment's mutations: a rank that never issued the stuck
    collective, and size / dtype / op drift): every collective it says a rank is missing
    from, or that ranks disagree on, shows in our tables and in our alignment."""
    from .test_collective_alignment import MISMATCHES, drop_stuck, with_rank1

    names = [n for n in scenario_names() if dumps_of(sample(n))]
    assert FR_SAMPLE in names
    cases = {n: sample(n) for n in names}
    cases["two_ranks_one_missing"] = with_rank1(copy_sample, drop_stuck, as_name="missing")
    for what, change, _ in MISMATCHES:
        cases[f"two_ranks_{what}_drift"] = with_rank1(copy_sample, change, as_name=f"{what}_drift")
    python3 = sys.executable  # torch (a test dependency) carries fr_trace since 2.6
    reported = 0
    for name, sdir in cases.items():
        con, run_id, _ = api.load(sdir)
        found = alignment.analyze(con, run_id)
        # Our view of every dump agrees with its pg_status, whatever fr_trace says.
        for rank, pg, enq, seq in con.execute(
                """SELECT s.rank, s.pg, s.last_enqueued, max(c.seq_id) FROM rank_status s JOIN collectives c
                   ON c.run_id = s.run_id AND c.rank = s.rank AND c.pg = s.pg AND c.source = 'flight_recorder'
                   AND c.op NOT IN ('send', 'recv')
                   WHERE s.run_id = ? AND s.source = 'flight_recorder' GROUP BY ALL""", [run_id]).fetchall():
            assert seq <= enq, (name, rank, pg)
        dump_dir = tmp_path / "dumps" / name
        dump_dir.mkdir(parents=True)
        for d in dumps_of(sdir):
            shutil.copy(d, dump_dir / d.name)
        rc, out, theirs = _fr_trace_findings(python3, dump_dir)
        if rc != 0 and "KeyError" in out and _gloo_dumps(sdir):
            # torchfrtrace can't read gloo's dumps (their pg_config names the group ""): we do.
            assert con.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND source = 'flight_recorder'",
                               [run_id]).fetchone()[0]
            continue
        assert rc == 0, out[-2000:]
        reported += len(theirs)
        for f in theirs:
            rows = con.execute(
                "SELECT rank, op, numel_in, numel_out, dtypes, state FROM collectives WHERE run_id = ? "
                "AND source = 'flight_recorder' AND pg = ? AND seq_id = ?", [run_id, f["pg"], f["seq"]]).fetchall()
            assert rows, (name, f)
            assert any(d.pg == f["pg"] and d.seq <= f["seq"] for d in found), (name, f)
            if f["kind"] == "missing":
                for r in f["ranks"]:
                    assert r not in {row[0] for row in rows}, (name, f)
                    (enq,) = con.execute("SELECT max(last_enqueued) FROM rank_status WHERE run_id = ? AND rank = ? "
                                         "AND pg = ?", [run_id, r, f["pg"]]).fetchone()
                    assert enq is None or enq < f["seq"], (name, f, enq)
            else:
                views = {(alignment.op_family(op), n_in, n_out, dt, st) for _, op, n_in, n_out, dt, st in rows}
                # ranks that differ, or one rank breaking all-gather's size rule on its own
                assert len(views) > 1 or any(d.kind == "mismatch" and d.seq == f["seq"] for d in found), (name, f)
    assert reported >= 4, "fr_trace reported the planted problems"

"""Post-mortem input is what something broken left behind: it must never run, crash the
analyzer or lose history. Hostile pickles, vanishing files, odd paths, concurrent and
killed writers."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
import tracemalloc

import duckdb
import pytest

from postmortem import api, engine
from postmortem.discover import Limits
from postmortem.errors import PostmortemError
from postmortem.parsers import pickles

from .conftest import sample_dir


class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Subprocess:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.marker)],))


class _Eval:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()",))


@pytest.mark.parametrize("payload", ["system", "subprocess", "eval", "nested"])
def test_pickles_that_would_run_code_are_refused_and_nothing_runs(tmp_path, payload):
    marker = tmp_path / "ran"
    obj = {"system": _System(marker), "subprocess": _Subprocess(marker), "eval": _Eval(),
           "nested": {"entries": [{"frames": [_System(marker)]}]}}[payload]
    data = pickle.dumps(obj, protocol=4)
    with pytest.raises(pickles.UnsafePickle, match="refused global"):
        pickles.loads(data)
    assert not marker.exists()


def test_plain_data_pickles_load_as_plain_data():
    doc = {"version": "2.10", "entries": [{"record_id": 1, "input_sizes": [[4096]], "state": "completed",
                                           "process_group": ("0", "default_pg"), "retired": True}]}
    assert pickles.loads(pickle.dumps(doc, protocol=4)) == doc


def _peak_traced_bytes(action) -> int:
    tracemalloc.start()
    try:
        action()
    except (ValueError, pickle.UnpicklingError):
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_pickle_claiming_a_huge_object_allocates_nothing():
    claims_256_mib = b"\x80\x04\x8e" + struct.pack("<Q", 256 << 20) + b"abc"  # BINBYTES8
    with pytest.raises(ValueError, match="truncated"):
        pickles.loads(claims_256_mib)
    assert _peak_traced_bytes(lambda: pickles.loads(claims_256_mib)) < 1 << 20
    # what the restriction is for: the C unpickler allocates the claim before reading it
    assert _peak_traced_bytes(lambda: pickle.loads(claims_256_mib)) >= 256 << 20


def test_a_pickle_with_a_bytearray_is_refused_before_it_is_allocated():
    claims = b"\x80\x05\x96" + struct.pack("<Q", 256 << 20) + b"abc"
    with pytest.raises(pickles.UnsafePickle, match="bytearray"):
        pickles.loads(claims)


def test_deeply_nested_and_truncated_pickles_are_bounded_errors():
    deep = b"\x80\x04" + b"]" * 100_000 + b"."
    assert pickles.loads(deep) == []
    whole = pickle.dumps({"entries": list(range(1000))}, protocol=4)
    for cut in (1, 7, len(whole) // 2, len(whole) - 1):
        with pytest.raises(ValueError):
            pickles.loads(whole[:cut])


def test_files_that_vanish_or_grow_while_the_job_is_read(copy_sample):
    job = copy_sample("rank_exception")
    (job / "vanishing.log").write_text("[rank0]:[E1129 14:23:26.100000000 x.cpp:1] soon gone\n")
    growing = job / "growing.log"
    growing.write_text("[rank1]:[W1129 14:23:26.100000000 x.cpp:1] first\n")

    def meddle(done, done_bytes, total, total_bytes, name):
        # Called before each file is parsed: the job is still writing, or cleaning up.
        if name == "console.log":
            (job / "vanishing.log").unlink(missing_ok=True)
            with open(growing, "a") as fh:
                fh.write("[rank1]:[E1129 14:23:27.100000000 x.cpp:2] written while being read\n" * 50)

    report = api.analyze(job, keep=False, progress=meddle)
    notes = {e["path"]: e for e in report["files"]["errors"]}
    assert notes["vanishing.log"]["status"] == "partial" and "No such file" in notes["vanishing.log"]["error"]
    assert report["verdict"]["signature"] == "rank-crash"


def test_sockets_spaces_and_non_utf8_names(copy_sample, tmp_path):
    job = copy_sample("rank_sigkill")
    odd = job / "logs with spaces"
    odd.mkdir()
    (odd / "rank 3 stderr.log").write_text("[rank3]:[E1129 14:23:26.100000000 x.cpp:1] from a spaced path\n")
    os.makedirs(os.fsencode(job) + b"/bad\xffname", exist_ok=True)
    with open(os.fsencode(job) + b"/bad\xffname/r.log", "wb") as fh:
        fh.write(b"[rank2]:[E1129 14:23:26.100000000 x.cpp:1] from a non-UTF-8 path\n")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s"))  # a socket inside the job dir needs a short path: link it in
    os.symlink(tmp_path / "s", job / "fr.sock")
    try:
        report = api.analyze(job, keep=False)
    finally:
        sock.close()
    assert 3 in report["ranks_seen"] and 2 in report["ranks_seen"]
    notes = {e["path"]: e["error"] for e in report["files"]["errors"]}
    assert "not a regular file" in notes["fr.sock"]


def test_limits_refuse_a_directory_too_large_with_a_sentence():
    with pytest.raises(PostmortemError, match="more than --max-files 2"):
        api.analyze(sample_dir("healthy"), keep=False, limits=Limits(max_files=2))
    with pytest.raises(PostmortemError, match="more than --max-bytes"):
        api.analyze(sample_dir("healthy"), keep=False, limits=Limits(max_bytes=1000))


def test_a_signature_query_that_runs_too_long_is_cut_off(tmp_path, monkeypatch, caplog):
    (tmp_path / "slow.toml").write_text(
        'id = "slow"\ntitle = "t"\nseverity = "info"\nrole = "context"\ndescription = "d"\n'
        'queries = ["SELECT count(*) AS rank FROM range(100000000000) a, range(1000) b"]\n')
    monkeypatch.setattr(engine, "QUERY_TIMEOUT_S", 1.0)
    report = api.analyze(sample_dir("rank_sigkill"), keep=False, signatures=tmp_path)
    assert "Interrupted" in caplog.text
    assert "slow" not in {f["signature"] for f in report["findings"]}
    assert report["verdict"]["signature"] == "rank-crash"


def _analyze_in_subprocess(path, db) -> subprocess.Popen:
    code = "import sys; from postmortem import api; api.analyze(sys.argv[1], db=sys.argv[2])"
    return subprocess.Popen([sys.executable, "-c", code, str(path), str(db)], stderr=subprocess.PIPE, text=True)


def test_eight_analyses_writing_one_history_at_once_all_land(history):
    names = ["healthy", "rank_sigkill", "rank_exception", "native_crash"] * 2
    procs = [_analyze_in_subprocess(sample_dir(n), history) for n in names]
    outcomes = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert [rc for rc, _ in outcomes] == [0] * 8, [err[-2000:] for rc, err in outcomes if rc]
    runs = api.runs(db=history)
    assert len(runs) == 8 and len({r["run_id"] for r in runs}) == 8


def test_an_analysis_killed_at_any_point_leaves_history_readable_and_whole(history):
    api.analyze(sample_dir("healthy"), db=history)
    for delay in (0.2, 0.8, 1.4, 2.0, 2.6):
        proc = _analyze_in_subprocess(sample_dir("rank_exception"), history)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    con = duckdb.connect(str(history), read_only=True)
    run_ids = {r[0] for r in con.execute("select run_id from runs").fetchall()}
    for table in ("files", "events", "failures", "findings"):
        orphans = con.execute(f"select count(*) from {table} where run_id not in (select run_id from runs)")
        assert orphans.fetchall()[0][0] == 0, table
    for run_id in run_ids:
        assert con.execute("select count(*) from files where run_id = ?", [run_id]).fetchall()[0][0] > 0


def test_thousands_of_tiny_files_are_each_recorded_and_parsed(tmp_path):
    """A job that wrote a tiny log per worker thread (issue #10: 100,000 of them): every file
    is recorded in ``files``, none is fatal, and small files travel to the workers in batches."""
    count = 1500
    line = (sample_dir("healthy") / "console.log").read_text().splitlines(keepends=True)[0]  # a real c10d line
    for i in range(count):
        folder = tmp_path / f"d{i // 500:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"worker{i:05d}.log").write_text(line)
    con, run_id, found = api.load(tmp_path)
    assert len(found.sources) == count
    status = con.execute("SELECT status, count(*), sum(lines) FROM files WHERE run_id = ? GROUP BY status",
                         [run_id]).fetchall()
    assert status == [("parsed", count, count)]

"""Discovery: what each file is and which rank it speaks for, and bad files recorded, not fatal."""

from __future__ import annotations

import gzip
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postmortem import api, pipeline
from postmortem.discover import discover, first_full_date, rank_from_content
from postmortem.errors import PostmortemError

from .conftest import sample_dir


def by_name(found):
    return {s.name: s for s in found.sources}


def test_torchrun_layout_and_prefixes_give_each_rank_file_its_rank(sample):
    found = discover(sample("rank_sigkill"))
    sources = by_name(found)
    for name, source in sources.items():
        if "/attempt_0/" in name:
            assert source.rank == int(name.split("/attempt_0/")[1].split("/")[0]), name
    console = sources["console.log"]
    assert console.rank is None
    assert console.tee_ranks_elsewhere == frozenset({0, 1})
    assert found.year == 2026


def test_file_name_gives_the_rank_when_the_content_does_not(tmp_path, sample):
    (stdout,) = sample("healthy").glob("logs/*/attempt_0/1/stdout.log")
    shutil.copy(stdout, tmp_path / "worker_rank_5.log")
    assert by_name(discover(tmp_path))["worker_rank_5.log"].rank == 5


def test_gzipped_logs_are_read_like_plain_ones(copy_sample):
    plain = api.analyze(copy_sample("rank_exception"), keep=False)
    gz_dir = copy_sample("rank_exception", "gz")
    for path in list(gz_dir.rglob("*.log")):
        with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()
    zipped = api.analyze(gz_dir, keep=False)
    assert [(e["rank"], e["ended"]) for e in zipped["ranks"]] == [(e["rank"], e["ended"]) for e in plain["ranks"]]
    assert zipped["files"]["parsed"] == plain["files"]["parsed"]


def test_bad_files_are_recorded_with_a_reason_and_the_run_still_lands(copy_sample, history):
    job = copy_sample("rank_sigkill")
    (job / "empty.log").write_bytes(b"")
    (job / "core.bin").write_bytes(bytes(range(256)) * 64)
    (job / "latin1.log").write_bytes("caf\xe9 step 1\n".encode("latin-1") + b"\xff\xfe\n")
    (stderr,) = job.glob("logs/*/attempt_0/0/stderr.log")
    whole = gzip.compress(stderr.read_bytes())
    (job / "truncated.log.gz").write_bytes(whole[: len(whole) // 2])  # a job killed while gzipping
    (job / "long_line.log").write_bytes(b"x" * (10 << 20) + b"\n[rank0]:[E1129 14:23:26.1 x.cpp:1] after\n")
    os.mkfifo(job / "fr_dump.pipe")
    os.symlink(job / "no-such-target", job / "dangling.log")
    os.symlink(job, job / "loop")
    report = api.analyze(job, db=history)
    files = {e["path"]: e for e in report["files"]["errors"]}
    assert files["empty.log"]["error"] == "empty file"
    assert "binary" in files["core.bin"]["error"]
    assert "not a regular file" in files["fr_dump.pipe"]["error"]
    assert "cannot stat" in files["dangling.log"]["error"]
    assert files["truncated.log.gz"]["status"] == "partial"
    assert "latin1.log" not in files and "long_line.log" not in files  # read, with replacement characters
    assert not any(p.startswith("loop/") for p in files)
    assert [e["rank"] for e in report["ranks"]][:1] == [1]
    assert api.runs(db=history)[0]["run_id"] == report["run_id"]


def test_missing_directory_and_nothing_readable_are_one_sentence_errors(tmp_path):
    with pytest.raises(PostmortemError, match="No such file or directory"):
        api.analyze(tmp_path / "nope", keep=False)
    (tmp_path / "empty.log").write_bytes(b"")
    with pytest.raises(PostmortemError, match="every file there is empty"):
        api.analyze(tmp_path, keep=False)
    (tmp_path / "junk.bin").write_bytes(b"\x00\x01" * 100)
    with pytest.raises(PostmortemError, match="Nothing readable"):
        api.analyze(tmp_path, keep=False)


def test_parsing_across_processes_gives_what_parsing_in_one_gives(monkeypatch):
    serial = api.analyze(sample_dir("hang_dataloader"), keep=False)
    monkeypatch.setattr(pipeline, "PARALLEL_MIN_BYTES", 0)  # the big-job path, on a small job
    parallel = api.analyze(sample_dir("hang_dataloader"), keep=False)
    for key in ("verdict", "ranks", "world_size", "ranks_seen", "versions"):
        assert parallel[key] == serial[key], key
    assert [f["signature"] for f in parallel["findings"]] == [f["signature"] for f in serial["findings"]]


def test_torchrun_local_rank_dirs_take_the_global_rank_their_logs_name(tmp_path):
    from .test_synth import synth

    job = synth.synthesize(sample_dir("rank_sigkill"), tmp_path / "job", ranks=8, per_node=4)
    sources = {s.name: s.rank for s in discover(job).sources}
    (error_file,) = [name for name in sources if name.startswith("node001/") and name.endswith("/1/error.json")]
    assert sources[error_file] == 5  # local rank 1 on the second node
    assert sources[error_file.replace("error.json", "stdout.log")] == 5


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_log_is_read_like_its_utf8_text(tmp_path, encoding):
    """Windows PowerShell's `>` writes UTF-16 with a byte-order mark. The log is a real one from
    the corpus (karpathy/llm.c#206's CUDA OOM); the re-encoding is this test's."""
    from pathlib import Path

    case = Path(__file__).resolve().parent / "realworld" / "m_llmc_cuda_oom_model_to_206"
    (log,) = [p for p in case.iterdir() if p.name != "expected.json"]
    text = log.read_text(encoding="utf-8")
    (tmp_path / "out.log").write_bytes(("\ufeff" + text).encode(encoding) if encoding.endswith("be")
                                       else text.encode(encoding))
    got = api.analyze(tmp_path, keep=False)
    want = api.analyze(case, keep=False)
    assert got["files"]["parsed"] == 1
    assert got["verdict"]["signature"] == want["verdict"]["signature"] == "cuda-oom"
    assert got["verdict"]["user_line"] == want["verdict"]["user_line"]


def test_one_file_handed_over_alone_is_analyzed_and_an_archive_is_named_as_one(tmp_path):
    from pathlib import Path

    case = Path(__file__).resolve().parent / "realworld" / "m_llmc_cuda_oom_model_to_206"
    (log,) = [p for p in case.iterdir() if p.name != "expected.json"]
    report = api.analyze(log, keep=False)  # `postmortem analyze paste.log`
    assert report["verdict"]["signature"] == "cuda-oom" and report["source_dir"] == str(log.resolve())
    assert report["files"]["parsed"] == 1
    import tarfile

    with tarfile.open(tmp_path / "logs.tar.gz", "w:gz") as tar:
        tar.add(log, arcname="logs/out.log")
    with pytest.raises(PostmortemError, match="logs.tar.gz is an archive: unpack it and analyze the directory"):
        api.analyze(tmp_path / "logs.tar.gz", keep=False)


# Heads made of the pieces prefixes and dates are made of, in any order: the fast searches must
# find what the plain regexes (the definitions they replaced) find.
_PIECES = st.lists(st.sampled_from([b"[rank3]:", b"[default1]:", b"[rank12]:", b"[rankx2]:", b"[w_4]:", b"\n", b"\r\n",
                                    b"x", b"_", b" ", b"2026-11-29 13:33:12", b"2019-01-02T03:04:05", b"20", b"-",
                                    b"[", b"]:", b"7"]), max_size=30).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(head=_PIECES)
def test_the_tee_prefixes_and_the_first_date_are_those_the_plain_regexes_find(head):
    tee = {int(n) for word, n in re.findall(rb"^\[([A-Za-z_]+?)(\d+)\]:", head, re.M) if word != b"rank"}
    ranks = {int(n) for n in re.findall(rb"\[rank(\d+)\]:", head)}
    one = lambda found: next(iter(found)) if len(found) == 1 else None  # noqa: E731
    assert rank_from_content(head) == ((one(tee), True) if tee else (one(ranks), False))
    date, fast = re.search(rb"\b(20\d\d)-(\d\d)-(\d\d)[ _T]\d\d:\d\d:\d\d", head), first_full_date(head)
    assert (date and (date.span(), date.groups())) == (fast and (fast.span(), fast.groups()))


def test_a_files_name_is_its_path_under_the_root_in_forward_slashes(tmp_path):
    """The names discovery gives files (the files table's path, the evidence's file) are their paths
    under the directory analyzed: the directory itself is ".", a root given with a trailing slash
    names its files the same, and a name that is not UTF-8 keeps its other characters."""
    from postmortem.discover import _rel

    root = tmp_path / "job"
    assert _rel(root, root) == "."
    assert _rel(root, root / "node0" / "rank3.log") == "node0/rank3.log"
    assert _rel(Path(str(root) + "/"), root / "a.log") == "a.log"
    assert _rel(root, tmp_path / "jobs" / "a.log") == str(tmp_path / "jobs" / "a.log")  # (not under it: as it is)
    assert _rel(root, root / "r\udcff.log") == "r\ufffd.log"

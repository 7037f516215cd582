"""The TORCH_TRACE parser (parsers/torch_trace.py) on the samples' real structured logs, and
against tlparse (the reference reader of these files) when it is installed."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postmortem import api
from postmortem.discover import discover
from postmortem.parsers import torch_trace
from postmortem.parsers.source import Source

from .conftest import SAMPLES

TRACE_SAMPLES = sorted({p.parent.parent.name for p in SAMPLES.glob("*/torch_trace/*.log.gz")
                        if (p.parent.parent / "expected.json").is_file()})


TRAIN = SAMPLES / "generate" / "train.py"


def train_line(text: str, after: str | None = None) -> int:
    """The line of train.py (which made the samples) holding ``text``, after the line holding ``after``."""
    lines = TRAIN.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines[start:], start) if text in line) + 1


def traces(sample_dir: Path) -> list[Path]:
    return sorted((sample_dir / "torch_trace").glob("dedicated_log_torch_trace_rank_*.log*"))


def parse(path: Path, rank: int | None = None) -> tuple[pl.DataFrame, Source]:
    source = Source(path=path, name=path.name, kind="torch_trace", rank=rank, bytes=path.stat().st_size, year=2026)
    frames = [df for table, df in torch_trace.parse(source) if table == "compiles"]
    return (pl.concat(frames) if frames else pl.DataFrame()), source


def attrs(row: dict) -> dict:
    return json.loads(row["attrs"] or "{}")


def test_discovery_reads_trace_files_with_the_rank_from_their_name(sample):
    found = discover(sample("recompile_limit"))
    kinds = {s.name: (s.kind, s.rank) for s in found.sources if "torch_trace" in s.name}
    assert sorted(kinds.values()) == [("torch_trace", 0), ("torch_trace", 1)]


def test_sniff_takes_trace_lines_and_leaves_torch_logs_text(sample):
    with gzip.open(traces(sample("recompile_limit"))[0]) as fh:
        head = fh.read(4096)
    assert torch_trace.sniff(head, "x.log")
    (stderr,) = sample("recompile_limit").glob("logs/*/attempt_0/0/stderr.log")
    assert not torch_trace.sniff(stderr.read_bytes()[:4096], stderr.name)
    dynamo_line = next(line for line in stderr.read_bytes().splitlines() if b"[__recompiles]" in line)
    assert not torch_trace.sniff(dynamo_line.split(b"]:", 1)[1], "x.log")  # a TORCH_LOGS line, prefix removed


def test_every_compile_id_of_the_recompile_limit_run(sample):
    rows, source = parse(traces(sample("recompile_limit"))[0], rank=0)
    assert source.notes == [] and source.lines > 10_000
    forward = train_line("def forward", after="class MLP")
    frame = rows.filter(pl.col("function") == "forward")["frame_id"][0]
    # DDP's wrapper frames 0-2 break and restart (attempt _1), its contextlib resume frame compiles
    # once, and MLP.forward compiles, recompiles 7 times and hits the limit at its 8th recompile.
    assert set(rows["attempt"]) == {"0/0", "0/0_1", "1/0", "1/0_1", "2/0", "2/0_1", "3/0",
                                    *(f"{frame}/{i}" for i in range(9))}
    assert rows["rank"].unique().to_list() == [0] and rows["source"].unique().to_list() == ["torch_trace"]
    recompiles = rows.filter(pl.col("event") == "recompile").sort("line_no")
    assert recompiles["attempt"].to_list() == [f"{frame}/{i}" for i in range(1, 8)]
    first = recompiles.row(0, named=True)
    assert (first["function"], first["code_line"], first["reason"], first["reason_class"]) == (
        "forward", forward, "scale == 1.0", "python_scalar")
    user_line = json.loads((sample("recompile_limit") / "expected.json").read_text())["user_line"]
    assert first["user_frame"].endswith(user_line)
    assert attrs(first)["cache_size"] == 1 and attrs(first)["entire_frame_compile_time_s"] > 0
    (hit,) = rows.filter(pl.col("event") == "limit_hit").iter_rows(named=True)
    # The limit's compilation_metrics has no code object: the frame is known from 4/0..4/7.
    assert (hit["attempt"], hit["function"], hit["code_line"], hit["reason"]) == (
        f"{frame}/8", "forward", forward, "scale == 1.07")
    assert attrs(hit)["limit_type"] == "recompile_limit" and attrs(hit)["limit"] == 8
    assert attrs(hit)["fail_type"] == "Unsupported"


def test_graph_break_records_and_guard_dumps(sample):
    rows, _ = parse(traces(sample("recompile_limit"))[1], rank=1)
    breaks = rows.filter(pl.col("event") == "graph_break").sort("line_no")
    assert breaks["attempt"].to_list() == ["0/0", "1/0", "2/0"]
    assert breaks["framework"].to_list() == ["ddp", "ddp", "ddp"]
    call = f"train.py:{train_line('out = cmodel(x, loss_scale_for(step))')}"
    assert all(f.endswith(call) for f in breaks["user_frame"])
    first = rows.filter(pl.col("attempt") == "0/0_1").row(0, named=True)
    assert first["framework"] == "torch"  # torch's external_utils.inner: DDP wrapped in torch.compile
    assert attrs(first)["guard_count"] == 12 and attrs(first)["guard_kinds"]["TYPE_MATCH"] >= 1
    assert attrs(first)["restart_reasons"] == ["Unsupported method call"]


def test_text_logs_and_trace_agree_on_recompiles(sample):
    con, run_id, _ = api.load(sample("recompile_limit"))
    pairs = con.execute(
        """
        SELECT t.rank, t.attempt, t.reason, t.reason_class, t.user_frame, x.reason, x.reason_class, x.user_frame
        FROM compiles t JOIN compiles x USING (run_id, rank, attempt, event)
        WHERE run_id = ? AND event = 'recompile' AND t.source = 'torch_logs' AND x.source = 'torch_trace'
        """, [run_id]).fetchall()
    assert len(pairs) == 14  # 4/1..4/7 on two ranks (4/8 is the limit hit in the trace)
    assert all(p[2:5] == p[5:8] for p in pairs)


@pytest.mark.parametrize("name", TRACE_SAMPLES)
def test_trace_files_of_every_sample_parse_without_notes(sample, name):
    for path in traces(sample(name)):
        rows, source = parse(path)
        assert source.notes == [], (path, source.notes)
        assert not rows.is_empty() and rows["attempt"].null_count() == 0


def test_chunk_boundaries_do_not_change_the_rows(sample, monkeypatch):
    path = traces(sample("recompile_limit"))[0]
    whole, _ = parse(path, rank=0)
    monkeypatch.setattr(torch_trace, "CHUNK_BYTES", 64 << 10)
    cut, _ = parse(path, rank=0)
    assert cut.sort("line_no").equals(whole.sort("line_no"))


# ------------------------------------------------------------------ damaged files: counted, never fatal


def _real_lines(sample_dir: Path) -> list[str]:
    with gzip.open(traces(sample_dir)[0], "rt") as fh:
        return fh.read().split("\n")


def test_a_cut_gzip_stream_keeps_what_was_read_and_marks_the_file_partial(sample, tmp_path):
    data = traces(sample("recompile_limit"))[0].read_bytes()
    d = tmp_path / "job" / "torch_trace"
    d.mkdir(parents=True)
    (d / "dedicated_log_torch_trace_rank_0_cut.log.gz").write_bytes(data[: len(data) // 2])
    con, run_id, _ = api.load(tmp_path / "job")
    status, error = con.execute("SELECT status, error FROM files WHERE run_id = ?", [run_id]).fetchone()
    assert status == "partial" and "gzip stream ends early" in error
    assert con.execute("SELECT count(*) FROM compiles WHERE run_id = ? AND event = 'recompile'",
                       [run_id]).fetchone()[0] >= 1


def test_malformed_records_unknown_types_and_bad_payloads_are_counted(sample, tmp_path):
    lines = _real_lines(sample("recompile_limit"))
    metrics = next(i for i, line in enumerate(lines) if '{"compilation_metrics"' in line)
    lines[metrics] = lines[metrics][: len(lines[metrics]) // 2]  # a record cut in half
    reasons = next(i for i, line in enumerate(lines) if '"recompile_reasons"' in line)
    lines[reasons + 1] = lines[reasons + 1] + " tampered"  # its payload no longer matches its md5
    head = lines[0].split("] {", 1)[0]
    lines.insert(5, head + '] {"brand_new_record": {}, "rank": 0}')
    path = tmp_path / "dedicated_log_torch_trace_rank_0_x.log"
    path.write_text("\n".join(lines))
    rows, source = parse(path, rank=0)
    notes = "; ".join(source.notes)
    assert "1 malformed JSON record(s) or payload(s)" in notes
    assert "1 payload(s) not matching their has_payload md5" in notes
    assert "record(s) of unknown type (brand_new_record x1)" in notes
    assert rows.filter(pl.col("event") == "recompile").height == 7  # the rest is still read


def test_a_compile_that_never_finished_is_kept(sample, tmp_path):
    lines = _real_lines(sample("recompile_limit"))
    start = max(i for i, line in enumerate(lines) if '{"dynamo_start"' in line)
    path = tmp_path / "dedicated_log_torch_trace_rank_0_x.log"
    path.write_text("\n".join(lines[: start + 3]))  # the process died while compiling 4/7
    rows, _ = parse(path, rank=0)
    (unfinished,) = rows.filter(pl.col("attrs").str.contains('"unfinished": true')).iter_rows(named=True)
    assert (unfinished["attempt"], unfinished["function"]) == ("4/7", "forward")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1), junk=st.binary(max_size=64), how=st.sampled_from(["truncate", "overwrite", "insert"]))
def test_mutated_real_trace_never_raises(tmp_path, cut, junk, how):
    data = "\n".join(_real_lines(SAMPLES / "recompile_limit")[:6000]).encode()
    at = int(len(data) * cut)
    if how == "truncate":
        data = data[:at]
    elif how == "overwrite":
        data = data[:at] + junk + data[at + len(junk):]
    else:
        data = data[:at] + junk + data[at:]
    path = tmp_path / "dedicated_log_torch_trace_rank_0_m.log"
    path.write_bytes(data)
    rows, _ = parse(path, rank=0)
    assert rows.is_empty() or rows["source"].unique().to_list() == ["torch_trace"]


# ------------------------------------------------------------------ the same files through tlparse


def _tlparse() -> str:
    found = shutil.which("tlparse") or shutil.which("tlparse", path=str(Path(sys.executable).parent))
    assert found, "tlparse is a test dependency (pip install -e '.[test]')"
    return found


_ROW = re.compile(r">\[(?P<cid>[^\]]+)\]</a>\s*</td>\s*<td>\s*(?:<pre>)?\s*(?P<type>\w+)")


def tlparse_report(trace: Path, tmp_path: Path) -> tuple[set[str], list[tuple[str, str]]]:
    """tlparse's compile ids (compile_directory.json) and failures-and-restarts rows (id, type)."""
    plain = tmp_path / trace.name.removesuffix(".gz")
    with gzip.open(trace) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    out = tmp_path / f"{plain.stem}_out"
    subprocess.run([_tlparse(), str(plain), "-o", str(out), "--overwrite", "--no-browser"],
                   check=True, capture_output=True, timeout=300)
    # "-/-" gathers the records written outside any compile (a CUDA run's runtime artifacts).
    ids = {k.strip("[]") for k in json.loads((out / "compile_directory.json").read_text())} - {"-/-"}
    html = (out / "failures_and_restarts.html").read_text()
    return ids, [(m["cid"], m["type"]) for m in _ROW.finditer(html)]


@pytest.mark.parametrize("name", TRACE_SAMPLES)
def test_compile_ids_and_failures_agree_with_tlparse(sample, tmp_path, name):
    for trace in traces(sample(name)):
        ids, table = tlparse_report(trace, tmp_path)
        rows, _ = parse(trace)
        assert set(rows["attempt"]) == ids, trace.name
        failures = sorted((cid, kind) for cid, kind in table if kind != "RestartAnalysis")
        ours = sorted((r["attempt"], attrs(r).get("fail_type")) for r in rows.filter(
            pl.col("event").is_in(["failure", "limit_hit"])).iter_rows(named=True))
        assert ours == failures, trace.name
        restarts = sorted(cid for cid, kind in table if kind == "RestartAnalysis")
        assert sorted(r["attempt"] for r in rows.filter(pl.col("event") != "graph_break").iter_rows(named=True)
                      if attrs(r).get("restart_reasons")) == restarts, trace.name

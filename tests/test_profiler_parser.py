"""The Kineto trace parser (parsers/profiler.py) on the real traces of the project's own GPU samples.

``straggler_cuda`` and ``memory_leak`` ran on an H200 with torch.profiler (CPU + CUDA
activity, steps 3-5, gzipped by tensorboard_trace_handler), gloo collectives on CUDA tensors.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postmortem.parsers import profiler
from postmortem.parsers.source import Source

from postmortem import api
from postmortem.discover import classify, discover, read_head


def traces(sample_dir: Path) -> list[Path]:
    found = sorted(sample_dir.glob("profiler/*.pt.trace.json*"))
    assert found, f"no profiler traces in {sample_dir}"
    return found


def parse(path: Path, rank: int | None = None) -> dict[str, pl.DataFrame]:
    source = Source(path=path, name=path.name, kind=profiler.KIND, rank=rank)
    out: dict[str, list[pl.DataFrame]] = {}
    for table, df in profiler.parse(source):
        out.setdefault(table, []).append(df)
    return {t: pl.concat(frames) for t, frames in out.items()}


def parse_cut(path: Path) -> tuple[dict[str, pl.DataFrame], str | None]:
    """Parse a file that may be cut off: the rows it yielded, and the EOFError's message."""
    source = Source(path=path, name=path.name, kind=profiler.KIND)
    out: dict[str, list[pl.DataFrame]] = {}
    try:
        for table, df in profiler.parse(source):
            out.setdefault(table, []).append(df)
    except EOFError as exc:
        return {t: pl.concat(f) for t, f in out.items()}, str(exc)
    return {t: pl.concat(f) for t, f in out.items()}, None


def plain_copy(path: Path, tmp_path: Path) -> Path:
    out = tmp_path / path.name.removesuffix(".gz")
    out.write_bytes(gzip.decompress(path.read_bytes()))
    return out


def event_ends(text: str) -> list[tuple[int, dict]]:
    """(offset just past each event, the event), read with the standard library's own decoder."""
    decoder = json.JSONDecoder()
    i = text.index("[", text.index('"traceEvents"')) + 1
    out = []
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "]":
            return out
        event, i = decoder.raw_decode(text, i)
        out.append((i, event))


def step_table(tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    steps = tables["events"].filter(pl.col("kind") == "profiler_step")
    return pl.DataFrame([{"rank": r, **json.loads(a)} for r, a in steps.select("rank", "attrs").iter_rows()])


# ---------------------------------------------------------------- discovery


def test_gzipped_trace_is_a_kineto_trace_ranked_by_its_distributed_info(sample):
    found = discover(sample("straggler_cuda"))
    by_name = {s.name: s for s in found.sources}
    for path in traces(sample("straggler_cuda")):
        head = read_head(path)
        assert classify(head, path.name) == profiler.KIND
        rank = json.loads(gzip.decompress(path.read_bytes()))["distributedInfo"]["rank"]
        assert profiler.rank_from_head(head) == rank
        assert by_name[path.relative_to(sample("straggler_cuda")).as_posix()].rank == rank


# ---------------------------------------------------------------- what goes where


def test_header_gives_rank_world_backend_and_devices(sample):
    path = traces(sample("memory_leak"))[0]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    tables = parse(path)
    (info,) = tables["events"].filter(pl.col("kind") == "profiler_trace").to_dicts()
    attrs = json.loads(info["attrs"])
    assert info["rank"] == doc["distributedInfo"]["rank"]
    assert attrs["world_size"] == 2 and attrs["backend"] == "gloo"
    assert attrs["devices"][0]["name"] == doc["deviceProperties"][0]["name"]
    assert attrs["base_time_ns"] == doc["baseTimeNanoseconds"]
    assert info["ts"].year == 2026  # baseTimeNanoseconds + the events' relative microseconds


def test_every_kernel_memcpy_and_memset_becomes_a_kernels_row_with_its_step(sample):
    path = traces(sample("memory_leak"))[0]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    want = {"kernel": 0, "gpu_memcpy": 0, "gpu_memset": 0}
    for e in doc["traceEvents"]:
        if e.get("cat") in want:
            want[e["cat"]] += 1
    kernels = parse(path)["kernels"]
    got = dict(kernels.group_by("category").len().iter_rows())
    assert got.get("compute", 0) + got.get("nccl", 0) == want["kernel"]
    assert got.get("memcpy", 0) == want["gpu_memcpy"] and got.get("memset", 0) == want["gpu_memset"]
    steps = sorted(int(e["name"].split("#")[1]) for e in doc["traceEvents"]
                   if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#"))
    spans = kernels.filter(pl.col("category") == "step_cpu")
    assert sorted(spans["step"].to_list()) == steps
    real = kernels.filter(pl.col("category").is_in(["compute", "memcpy", "memset"]))
    assert real["step"].null_count() < real.height // 10  # nearly every kernel ran inside a profiled step
    assert set(real["step"].drop_nulls()) <= set(steps)
    assert (real["device"] == 0).all()


@pytest.mark.parametrize("scenario", ["straggler", "straggler_cuda"])
def test_straggler_step_table_shows_per_rank_time_in_collectives_vs_the_rest(sample, scenario):
    """Done-when of issue 6: per rank and step, the time in collectives vs the rest (gloo, on CPU and
    on CUDA tensors: no NCCL kernels, so the collectives are the gloo:* spans)."""
    rows = pl.concat([step_table(parse(p)) for p in traces(sample(scenario))], how="diagonal")
    assert rows.height == 6 and set(rows["step"]) == {3, 4, 5}
    assert set(rows["comm_source"]) == {"cpu_collective_spans"}
    slow = rows.filter(pl.col("rank") == 1)  # the planted straggler: 0.3 s in its data path each step
    fast = rows.filter(pl.col("rank") == 0)
    assert (fast["comm_us"] > 0.85 * fast["dur_us"]).all()  # rank 0 spends its steps waiting in the all-reduce
    assert (slow["comm_us"] < 0.05 * slow["dur_us"]).all()
    assert (slow["other_us"] > 250_000).all()
    if scenario == "straggler_cuda":
        assert (rows["compute_us"] > 0).all()  # the GPU compute kernels of each step
    else:
        assert "compute_us" not in rows.columns  # no kernels on CPU


def test_cpu_trace_memory_samples_are_the_cpu_allocator(sample):
    memory = parse(traces(sample("straggler"))[0])["memory"]
    assert memory.height > 0 and set(memory["device"]) == {-1}
    assert (memory["allocated"] >= 0).all()


@pytest.mark.parametrize("scenario", ["straggler", "straggler_cuda"])
def test_gloo_annotations_become_collectives_timed_by_their_span(sample, scenario):
    by_rank = {}
    for path in traces(sample(scenario)):
        c = parse(path)["collectives"]
        by_rank[c["rank"][0]] = c
    for c in by_rank.values():
        assert set(c["op"]) == {"gloo:all_reduce"} and set(c["source"]) == {"profiler"}
        assert c.height == 6  # two DDP buckets x three steps
    waited = by_rank[0].select((pl.col("t_completed") - pl.col("t_started")).dt.total_milliseconds())
    assert (waited.to_series() >= 290).all()


def test_memory_instants_become_profiler_samples_with_device_and_step(sample):
    path = traces(sample("memory_leak"))[0]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    instants = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    memory = parse(path)["memory"]
    assert memory.height == len(instants) and set(memory["source"]) == {"profiler"}
    want = sorted((e["args"]["Total Allocated"], e["args"]["Total Reserved"], e["args"]["Bytes"]) for e in instants)
    assert sorted(memory.select("allocated", "reserved", "delta").iter_rows()) == want
    assert set(memory["device"]) == {-1 if e["args"]["Device Type"] == 0 else e["args"]["Device Id"] for e in instants}
    cuda = memory.filter(pl.col("device") >= 0)
    assert cuda.height and set(cuda["step"].drop_nulls()) <= {3, 4, 5}


def test_cpu_ops_are_kept_only_as_top_ops_by_self_time(sample):
    tables = parse(traces(sample("memory_leak"))[0])
    top = tables["events"].filter(pl.col("kind") == "cpu_op_top")
    assert 0 < top.height <= profiler.TOP_OPS
    attrs = [json.loads(a) for a in top["attrs"]]
    assert all(0 <= a["self_us"] <= a["total_us"] + 1e-3 for a in attrs)
    assert [a["self_us"] for a in attrs] == sorted((a["self_us"] for a in attrs), reverse=True)


def test_a_top_ops_total_is_the_exact_sum_of_its_calls_whatever_order_they_are_summed_in(sample):
    """Each top op's total time is the sum of its cpu_op events' durations in the trace, to the
    0.1 us it is reported in, taken exactly (decimal): a float sum, whose order Polars' threads vary,
    put memory_leak's CompiledFunctionBackward at 2042.4 us in one analysis and 2042.5 in another."""
    from decimal import Decimal

    for trace in traces(sample("straggler")) + traces(sample("memory_leak")):
        raw = trace.read_bytes()
        events = json.loads(gzip.decompress(raw) if trace.suffix == ".gz" else raw)["traceEvents"]
        exact: dict[str, Decimal] = {}
        for e in events:
            if e.get("cat") == "cpu_op" and "dur" in e and "ts" in e:
                exact[e["name"]] = exact.get(e["name"], Decimal(0)) + Decimal(str(e["dur"]))
        top = parse(trace)["events"].filter(pl.col("kind") == "cpu_op_top")
        assert top.height
        for name, attrs in zip(top["message"], top["attrs"]):
            # (rounded as Python rounds the float nearest the exact sum)
            assert json.loads(attrs)["total_us"] == round(float(exact[name]), 1), (trace.name, name)


# ---------------------------------------------------------------- robustness


@pytest.mark.parametrize("fraction", [0.13, 0.5, 0.87, 0.9999])
def test_truncated_trace_yields_every_complete_event_before_the_cut(sample, tmp_path, fraction):
    full = plain_copy(traces(sample("memory_leak"))[0], tmp_path)
    text = full.read_text()
    cut_at = int(len(text) * fraction)
    cut = tmp_path / "cut.pt.trace.json"
    cut.write_text(text[:cut_at])
    complete = [e for end, e in event_ends(text) if end <= cut_at]
    tables, why = parse_cut(cut)
    assert why is not None and "inside the traceEvents array" in why and f"{len(complete):,} complete events" in why
    kernels = sum(1 for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    got = tables.get("kernels", pl.DataFrame({"category": []}))
    assert got.filter(~pl.col("category").str.starts_with("step")).height == kernels
    memory = sum(1 for e in complete if e.get("name") == "[memory]")
    assert tables.get("memory", pl.DataFrame()).height == memory


def test_trace_cut_right_after_an_event_keeps_that_event(sample, tmp_path):
    full = plain_copy(traces(sample("memory_leak"))[0], tmp_path)
    text = full.read_text()
    ends = event_ends(text)
    end, _ = ends[len(ends) // 2]
    for tail in ("", ","):
        cut = tmp_path / f"cut{len(tail)}.json"
        cut.write_text(text[:end] + tail)
        _, why = parse_cut(cut)
        assert f"{len(ends) // 2 + 1:,} complete events" in why


def test_a_cut_trace_is_partial_in_files_with_the_reason(sample, tmp_path):
    run = tmp_path / "job"
    (run / "profiler").mkdir(parents=True)
    src = traces(sample("straggler_cuda"))[0]
    data = src.read_bytes()
    (run / "profiler" / src.name).write_bytes(data[: len(data) * 2 // 3])  # a gzip stream cut mid-way
    con, run_id, _ = api.load(run)
    (row,) = con.execute("SELECT status, error, rank FROM files WHERE run_id = ?", [run_id]).fetchall()
    assert row[0] == "partial" and "traceEvents" in row[1] and "gzip stream ends early" in row[1]
    assert row[2] == 0
    assert con.execute("SELECT count(*) FROM kernels WHERE run_id = ?", [run_id]).fetchall()[0][0] > 0


def test_minified_json_parses_to_the_same_rows(sample, tmp_path):
    path = traces(sample("memory_leak"))[1]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    compact = tmp_path / "compact.pt.trace.json"
    compact.write_text(json.dumps(doc, separators=(",", ":")))
    a, b = parse(path), parse(compact)
    for table in ("kernels", "memory", "collectives"):
        assert a[table].drop("file", strict=False).equals(b[table].drop("file", strict=False)), table


def test_event_text_that_looks_like_a_boundary_does_not_split_an_event(sample, tmp_path, monkeypatch):
    path = traces(sample("memory_leak"))[0]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = e["name"] + '}, {"ph": "X", "cat": "kernel"}, {'
    tricky = tmp_path / "tricky.pt.trace.json"
    tricky.write_text(json.dumps(doc, indent=1))
    monkeypatch.setattr(profiler, "CHUNK_BYTES", 4096)  # many cuts, some of them in those names
    kernels = parse(tricky)["kernels"].filter(~pl.col("category").str.starts_with("step"))
    assert kernels.height == sum(1 for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert kernels["name"].str.ends_with("{").sum() == sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel")


def test_small_blocks_give_the_same_rows_as_large_ones(sample, monkeypatch):
    path = traces(sample("straggler_cuda"))[0]
    big = parse(path)
    monkeypatch.setattr(profiler, "CHUNK_BYTES", 1500)
    small = parse(path)
    for table in ("kernels", "memory", "collectives"):
        assert big[table].equals(small[table]), table


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_traces_raise_only_the_errors_that_mark_a_file_partial(sample, tmp_path_factory, data):
    text = gzip.decompress(traces(sample("straggler_cuda"))[0].read_bytes())
    cuts = data.draw(st.lists(st.tuples(st.integers(0, len(text) - 1), st.binary(max_size=6)), max_size=5))
    mutated = bytearray(text)
    for at, junk in cuts:
        mutated[at:at + len(junk)] = junk
    path = tmp_path_factory.mktemp("t") / "x.pt.trace.json"
    path.write_bytes(bytes(mutated[: data.draw(st.integers(1, len(mutated)))]))
    try:
        parse(path)
    except (EOFError, ValueError):
        pass


def test_events_full_of_boundary_lookalikes_are_split_exactly(sample, tmp_path, monkeypatch):
    """More `}, {` inside one batch's strings than the fast cut tries: the exact walk takes over."""
    path = traces(sample("straggler"))[0]
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op":
            e["name"] += "}, {" * 100
    noisy = tmp_path / "noisy.pt.trace.json"
    noisy.write_text(json.dumps(doc))
    monkeypatch.setattr(profiler, "CHUNK_BYTES", 64 << 10)
    tables, why = parse_cut(noisy)
    assert why is None
    assert tables["memory"].height == sum(1 for e in doc["traceEvents"] if e.get("name") == "[memory]")
    top = tables["events"].filter(pl.col("kind") == "cpu_op_top")["message"]
    assert top.len() > 0 and top.str.ends_with("}, {").all()


def test_junk_in_the_middle_keeps_the_events_before_it(sample, tmp_path, monkeypatch):
    text = plain_copy(traces(sample("memory_leak"))[0], tmp_path).read_text()
    ends = event_ends(text)
    at, _ = ends[len(ends) // 2]
    broken = tmp_path / "broken.pt.trace.json"
    broken.write_text(text[:at] + ', {"ph": "X", "name": "\x00' + "\ufffd" * 10 + ' ]]]' + text[at:])
    monkeypatch.setattr(profiler, "CHUNK_BYTES", 4096)
    source = Source(path=broken, name=broken.name, kind=profiler.KIND)
    rows = {}
    with pytest.raises((ValueError, EOFError)) as caught:
        for table, df in profiler.parse(source):
            rows[table] = rows.get(table, 0) + df.height
    read = int(re.search(r"(?:read|after) ([\d,]+)", str(caught.value))[1].replace(",", ""))
    before = [e for end, e in ends if end <= at]
    assert read >= len(before)
    assert rows["memory"] >= sum(1 for e in before if e.get("name") == "[memory]") > 0

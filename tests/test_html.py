"""The HTML report as a person sees it: rendered by a real headless Chromium, screenshotted, and its
DOM read back. The culprit's timeline lane comes first and is marked, ranks that behaved alike fold
into one lane labelled by their range (a 512-rank job reads as a few lanes), charts carry axes and
units, the page never scrolls sideways, and it stays small and self-contained at 512 ranks."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from postmortem import api
from postmortem.html import to_html
from postmortem.ranges import rank_ranges

from .conftest import sample_dir

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Only the test adds this to a copy of the page (the report itself has no script): it writes what
# the browser measured into the DOM, which --dump-dom then shows.
MEASURE = ("<script>document.body.setAttribute('data-measured', JSON.stringify({scroll: "
           "document.documentElement.scrollWidth, client: document.documentElement.clientWidth}));</script>")


def browse(tmp_path, html_file, *args) -> subprocess.CompletedProcess:
    assert CHROMIUM, "the HTML test needs Chromium: apt-get install chromium (.ci/run installs it)"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
                           "--v=0", *args, html_file.as_uri()], check=False, capture_output=True, text=True, timeout=120)


def look(tmp_path, page: str, name: str, width: int = 1200) -> tuple[str, dict, Path]:
    """Render the page as a person's browser would: (the DOM Chromium built, its measured widths,
    the screenshot it took)."""
    plain = tmp_path / f"{name}.html"
    plain.write_text(page, encoding="utf-8")
    shot = tmp_path / f"{name}.png"
    result = browse(tmp_path, plain, f"--window-size={width},2400", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000, result.stderr[-2000:]
    if os.environ.get("POSTMORTEM_SCREENSHOTS"):  # where a person looks at them afterwards
        shutil.copy(shot, Path(os.environ["POSTMORTEM_SCREENSHOTS"]) / shot.name)
    assert not re.search(r"CONSOLE\(\d+\)", result.stderr), result.stderr[-2000:]
    measured = tmp_path / f"{name}.measured.html"
    measured.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = browse(tmp_path, measured, f"--window-size={width},2400", "--dump-dom").stdout
    widths = json.loads(unescape(re.search(r'data-measured="([^"]*)"', dom)[1]))
    return dom, widths, shot


def lanes(dom: str, svg_id: str = "timeline") -> list[tuple[str, str]]:
    """The lanes of a timeline, top to bottom: (class, ranks they stand for)."""
    svg = re.search(rf'<svg id="{svg_id}"[^>]*>(.*?)</svg>', dom, re.DOTALL)[1]
    return re.findall(r'<g class="(lane[^"]*)" data-ranks="([^"]*)"', svg)


def grid_rows(dom: str) -> list[tuple[str, str]]:
    """The collectives grid's rows: (row class, label)."""
    grid = re.search(r'<table id="collectives">(.*?)</table>', dom, re.DOTALL)[1]
    return re.findall(r'<tr(?: class="([^"]*)")?><th>([^<]*)</th>', grid)


@pytest.mark.parametrize("name", ["hang_dataloader", "rank_sigkill"])
def test_html_report_renders_and_names_the_culprit(tmp_path, name):
    report = api.analyze(sample_dir(name), keep=False, with_series=True)
    dom, widths, _ = look(tmp_path, to_html(report), name)
    culprit = re.search(r'<b id="culprit">([^<]*)</b>', dom)
    assert culprit and unescape(culprit[1]) == ", ".join(map(str, report["verdict"]["culprit_ranks"]))
    assert report["verdict"]["signature"] in dom
    assert widths["scroll"] <= widths["client"], widths


def test_html_escapes_log_text_and_loads_nothing_from_outside():
    report = api.analyze(sample_dir("rank_exception"), keep=False, with_series=True)
    report["ranks"][0]["ended"] = "<script>alert(1)</script>"
    page = to_html(report)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert not re.search(r"""(src|href)=["']?https?:""", page)


def test_hang_report_puts_the_stuck_rank_first_and_shows_where_it_stopped(tmp_path):
    name = "hang_dataloader"
    expected = json.loads((sample_dir(name) / "expected.json").read_text())
    report = api.analyze(sample_dir(name), keep=False, with_series=True)
    seq = int(re.search(r"sequence (\d+)", report["verdict"]["summary"])[1])
    dom, widths, _ = look(tmp_path, to_html(report), name, width=900)
    assert widths["scroll"] <= widths["client"], widths  # a narrow window scrolls only inside the boxes
    culprit = rank_ranges(expected["culprit_ranks"])
    for svg_id in ("timeline", "timeline-run"):  # the last minute, then the whole run
        drawn = lanes(dom, svg_id)
        assert drawn[0] == ("lane culprit", culprit), drawn
        assert all("culprit" not in cls for cls, _ in drawn[1:])
    first_lane = re.search(r'<g class="lane culprit".*?</g>', dom, re.DOTALL)[0]
    assert "culprit" in re.findall(r"<text[^>]*>([^<]*)", first_lane)[1]  # said in words, not only in red
    assert f"seq {seq - 1}" in first_lane  # the stuck rank's lane says where it stopped: the one before
    grid = re.search(r'<table id="collectives">(.*?)</table>', dom, re.DOTALL)[1]
    header = re.findall(r'<th class="cell[^"]*"[^>]*>([^<]*)</th>', grid)
    divergent = re.findall(r'<th class="cell divergent"[^>]*>([^<]*)</th>', grid)
    assert divergent == [f"0:{seq}"]  # the first sequence number the stuck rank never issued
    stuck = re.search(rf'<tr class="culprit"><th>rank {culprit}</th>(.*?)</tr>', grid, re.DOTALL)[1]
    cells = re.findall(r'<td class="cell([^"]*)"', stuck)
    assert "missing" in cells[header.index(f"0:{seq}")]


def _synth():
    spec = importlib.util.spec_from_file_location("synth", Path(__file__).resolve().parent.parent / "benchmarks"
                                                  / "synth.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["synth"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_512_rank_job_reads_as_a_few_folded_lanes_in_a_small_self_contained_page(tmp_path):
    name = "hang_dataloader"
    expected = json.loads((sample_dir(name) / "expected.json").read_text())
    job = _synth().synthesize(sample_dir(name), tmp_path / "job", ranks=512, per_node=8, pad_mb=0, seed=7)
    report = api.analyze(job, keep=False, with_series=True)
    page = to_html(report)
    assert len(page.encode()) < 2_000_000
    assert not re.search(r"<script|<link|<img|<iframe|url\(|@import", page, re.IGNORECASE)  # nothing to fetch, nothing to run
    dom, widths, _ = look(tmp_path, page, "job512")
    assert widths["scroll"] <= widths["client"], widths
    culprits = set(expected["culprit_ranks"])
    others = rank_ranges(sorted(set(range(512)) - culprits))
    drawn = lanes(dom)
    assert drawn[0] == ("lane culprit", rank_ranges(sorted(culprits)))
    assert ("lane", others) in drawn  # the 511 that waited alike are one lane
    assert len(drawn) <= 4
    assert f"ranks {others} (511)" in unescape(dom)  # and the lane's label says which and how many
    rows = grid_rows(dom)
    assert rows[0] == ("culprit", f"rank {rank_ranges(sorted(culprits))}")
    assert ("", f"ranks {others} (511)") in rows and len(rows) <= 4
    assert len(re.findall(r"<tr", re.search(r'<table id="endings">(.*?)</table>', dom, re.DOTALL)[1])) <= 6


def test_recompile_storm_report_draws_recompiles_per_frame_and_memory_with_axes(tmp_path):
    name = "recompile_shapes"
    report = api.analyze(sample_dir(name), keep=False, with_series=True)
    storm = next(f for f in report["findings"] if f["signature"] == "recompile-storm")
    function, times = re.search(r"^(\w+) \(.*?recompiled (\d+) times", storm["summary"]).groups()
    dom, widths, _ = look(tmp_path, to_html(report), name)
    assert widths["scroll"] <= widths["client"], widths
    bars = dict(re.findall(r"<title>(\w+) \([^<]*\): (\d+) recompiles</title>", dom))
    assert bars[function] == times  # the chart counts what the signature counted, each recompile once
    assert "recompiles of the frame (count)" in dom and "TORCH_TRACE" in dom  # its axis and its source
    timeline = re.search(r'<svg id="timeline-run".*?</svg>', dom, re.DOTALL)[0]
    assert len(re.findall(r'fill="#e7298a"><title>[^<]*recompile ', timeline)) >= int(times)
    memory = re.search(r"<h2>Memory per step</h2>(.*?)<h2>", dom, re.DOTALL)[1]
    assert "allocated (MiB)" in memory and ">step<" in memory  # both axes say what and in which unit
    y_ticks = [int(t) for t in re.findall(r'text-anchor="end">(\d+)</text>', memory)]
    assert len(y_ticks) >= 3 and y_ticks == sorted(y_ticks) and y_ticks[0] == 0


def test_straggler_is_marked_in_the_step_time_chart():
    report = api.analyze(sample_dir("straggler"), keep=False, with_series=True)
    expected = json.loads((sample_dir("straggler") / "expected.json").read_text())
    chart = re.search(r"<h2>Step time per rank</h2>(.*?)<h2>", to_html(report), re.DOTALL)[1]
    marked = re.findall(r'<text[^>]*class="culprit">rank (\d+)</text>', chart)
    assert [int(r) for r in marked] == expected["culprit_ranks"]
    assert "(straggler)" in chart and "mean step time (ms)" in chart and "ProfilerStep" in chart


def test_memory_chart_draws_the_device_capacity_when_it_is_on_the_scale():
    report = api.analyze(sample_dir("memory_leak"), keep=False, with_series=True)
    page = to_html(report)
    assert "off this scale" in page  # the sample's CPU job is far below the 139.8 GiB its OOM message names
    peak = max(p["allocated_mb"] for p in report["series"]["memory"]) * 2**20
    report["series"]["memory_limit_bytes"] = int(peak * 1.5)  # a device the job nearly filled
    chart = re.search(r"<h2>Memory per step</h2>(.*?)<h2>", to_html(report), re.DOTALL)[1]
    line = re.search(r'<line x1="70" y1="([\d.]+)"[^>]*stroke-dasharray="6 4"/><text[^>]*>device capacity', chart)
    axis_top, axis_bottom = map(float, re.search(r'<line x1="70" y1="([\d.]+)" x2="70" y2="([\d.]+)"', chart).groups())
    data_y = [float(y) for pts in re.findall(r'<polyline[^>]*points="([^"]*)"', chart)
              for y in re.findall(r",([\d.]+)", pts)]
    assert line and axis_top <= float(line[1]) < min(data_y) <= max(data_y) <= axis_bottom  # on the scale, above

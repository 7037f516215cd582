"""The HTML report renders in a real headless browser, with no console errors, and shows the verdict."""

from __future__ import annotations

import re
import shutil
import subprocess
from html import unescape

import pytest

from postmortem import api
from postmortem.html import to_html

from .conftest import sample_dir

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browse(tmp_path, html_file, *args) -> subprocess.CompletedProcess:
    assert CHROMIUM, "the HTML test needs Chromium: apt-get install chromium (.ci/run installs it)"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
                           "--v=0", *args, html_file.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["hang_dataloader", "rank_sigkill"])
def test_html_report_renders_and_names_the_culprit(tmp_path, name):
    report = api.analyze(sample_dir(name), keep=False, with_series=True)
    page = tmp_path / "report.html"
    page.write_text(to_html(report))
    shot = tmp_path / "report.png"
    result = browse(tmp_path, page, "--window-size=1200,1800", f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000, result.stderr[-2000:]
    assert not re.search(r"CONSOLE\(\d+\)", result.stderr), result.stderr[-2000:]
    dom = browse(tmp_path, page, "--dump-dom").stdout
    culprit = re.search(r'<b id="culprit">([^<]*)</b>', dom)
    assert culprit and unescape(culprit[1]) == ", ".join(map(str, report["verdict"]["culprit_ranks"]))
    assert report["verdict"]["signature"] in dom


def test_html_escapes_log_text_and_loads_nothing_from_outside():
    report = api.analyze(sample_dir("rank_exception"), keep=False, with_series=True)
    report["ranks"][0]["ended"] = "<script>alert(1)</script>"
    page = to_html(report)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert not re.search(r"""(src|href)=["']?https?:""", page)


def test_html_report_of_a_hang_shows_where_the_stuck_rank_stopped(tmp_path):
    report = api.analyze(sample_dir("hang_dataloader"), keep=False, with_series=True)
    seq = re.search(r"sequence (\d+)", report["verdict"]["summary"])[1]
    page = tmp_path / "hang.html"
    page.write_text(to_html(report))
    dom = browse(tmp_path, page, "--dump-dom").stdout
    grid = re.search(r'<table id="collectives">(.*?)</table>', dom, re.S)[1]
    header = re.findall(r'<th class="cell">([^<]*)</th>', grid)
    stuck = re.search(r"<tr><th>rank 1</th>(.*?)</tr>", grid, re.S)[1]
    cells = re.findall(r'<td class="cell([^"]*)"', stuck)
    assert f"0:{seq}" in header
    assert "missing" in cells[header.index(f"0:{seq}")]  # rank 1 never issued the sequence rank 0 waits in

"""The terminal report at 80 columns: the verdict first, each message once, plain text with no box
characters for logs and CI, and a rank table whose ranks and times stay whole."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from typer.testing import CliRunner

from postmortem import api, report
from postmortem.cli import app

from .conftest import sample_dir

BOX = re.compile("[\u2500-\u257f]")  # box drawing: ─ │ ╭ ┃ ┏ ...
SAMPLES = ["hang_dataloader", "rank_exception", "cuda_oom_spike", "rank_sigkill"]


def flat(text: str) -> str:
    return " ".join(text.split())


def messages(rep: dict) -> list[str]:
    """Every message the report holds: how each rank ended, its error and evidence lines, each finding's
    summary and evidence."""
    texts = []
    for e in rep["ranks"]:
        texts += [e["ended"], (e["evidence"] or {}).get("text"), (e.get("first_error") or {}).get("text")]
    for f in rep["findings"]:
        texts += [f["summary"], *(ev.get("text") for ev in f["evidence"])]
    return sorted({flat(t) for t in texts if t and len(flat(t)) >= 24})


@pytest.fixture(scope="module")
def reports():
    return {name: api.analyze(sample_dir(name), keep=False) for name in SAMPLES}


@pytest.mark.parametrize("name", SAMPLES)
def test_plain_text_at_80_columns_prints_each_message_once_and_no_boxes(reports, name):
    rep = reports[name]
    text = report.to_text(rep, width=80)
    assert not BOX.search(text)
    for line in text.splitlines():
        assert len(line) <= 80 or len(line.split()) == 1, line  # only a word longer than the line may pass it
    assert text.startswith("VERDICT") and flat(text).count(flat(rep["verdict"]["summary"])) == 1
    printed = flat(text)
    repeated = {m: printed.count(m) for m in messages(rep) if printed.count(m) > 1}
    assert not repeated, repeated
    for e in rep["ranks"]:  # every rank is still accounted for
        assert re.search(rf"^  rank [^\n]*\b{e['rank']}\b", text, re.MULTILINE), e["rank"]


@pytest.mark.parametrize("name", SAMPLES)
def test_rich_report_at_80_columns_starts_with_the_verdict_and_keeps_ranks_and_times_whole(reports, name):
    rep = reports[name]
    rich_text = report.render_rich(rep, width=80)
    assert rich_text.splitlines()[0].startswith("╭─ verdict")
    assert all(len(line) <= 80 for line in rich_text.splitlines())
    plain = report.to_text(rep, width=80)
    for e in rep["ranks"]:
        when = report._when(e, report._day(rep))
        assert re.search(rf"│ [\d, -]*\b{e['rank']}\b[^│]*│ {re.escape(when)} +│", rich_text), (e["rank"], when)
    # The rich report holds what the plain one holds, no more often: a message's rarest word counts the same.
    words_rich, words_plain = Counter(re.findall(r"\w+", rich_text)), Counter(re.findall(r"\w+", plain))
    for m in messages(rep):
        candidates = [w for w in re.findall(r"\w+", m) if 6 <= len(w) <= 14]
        if candidates:
            rare = min(candidates, key=lambda w: words_plain[w])
            assert words_rich[rare] <= words_plain[rare], (rare, m)


def test_analyze_format_text_width_80_from_the_command_line():
    result = CliRunner().invoke(app, ["analyze", str(sample_dir("rank_exception")), "--no-history", "--format",
                                      "text", "--width", "80", "--quiet"])
    assert result.exit_code == 1, result.output
    assert not BOX.search(result.stdout) and result.stdout.startswith("VERDICT")
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in result.stdout.splitlines())
    assert "ValueError" in result.stdout

"""Renderers: a report dict in, text out. Pure functions, so formats never disagree.

The terminal (rich) and plain-text reports print the verdict first and each message once: a rank's
error quoted again by a finding's summary, or the same teardown on 511 ranks, prints as
"(message above)" or as one row of folded ranks ("0, 2-511 (511)").
"""

from __future__ import annotations

import io
import json
import textwrap
from dataclasses import dataclass

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .ranges import rank_ranges


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str)


def _versions(report: dict) -> str:
    parts = [f"{name} {v}" for name, v in report["versions"].items() if v]
    return ", ".join(parts) or "not in the logs"


def _short_path(path: str | None) -> str:
    """torchrun's run directories have long random names; the attempt/rank/stream part is what reads."""
    if not path:
        return ""
    parts = path.split("/")
    if "attempt_0" in parts or any(p.startswith("attempt_") for p in parts):
        i = next(i for i, p in enumerate(parts) if p.startswith("attempt_"))
        return "/".join(["…"] + parts[i:])
    return path


def _where(ev: dict | None) -> str:
    if not ev:
        return ""
    return f"{_short_path(ev.get('file'))}:{ev['line']}" if ev.get("line") else _short_path(ev.get("file"))


def _ts(ending: dict) -> str:
    """An inferred time is a lower bound: the error came after the rank's last timestamp."""
    if not ending["ts"]:
        return "?"
    return f">= {ending['ts']}" if ending.get("ts_inferred") else ending["ts"]


def _clip(text: str | None, n: int) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def _verdict_finding(report: dict) -> dict | None:
    return next((f for f in report["findings"] if f["signature"] == report["verdict"].get("signature")), None)


def _day(report: dict) -> str:
    return str(report.get("started_at") or "")[:10]


def _when(ending: dict, day: str) -> str:
    """The rank's end time, the date left out when it is the run's first day (the facts give it): at 80
    columns the time of day is what tells ranks apart. An inferred time is a lower bound."""
    ts = str(ending["ts"] or "")
    if not ts:
        return "?"
    short = ts[11:23] if day and ts.startswith(day) else ts[:23]
    return f">= {short}" if ending.get("ts_inferred") else short


# --- each message once --------------------------------------------------------------------------------------------

SHOWN = "(message above)"
MIN_REPEAT = 24  # shorter texts ("SIGTERM", a file name) say what they are each time


class Shown:
    """The messages already printed. The report's own messages (each rank's ending, error and evidence
    line, each finding's evidence) are known up front; once a printed text contains one, a later text
    that quotes it says "(message above)" instead (a rank's error inside a finding's summary, the
    remediation repeating the verdict's error)."""

    def __init__(self, report: dict):
        self.known = _messages(report)
        self.texts: list[str] = []

    def once(self, text: str | None) -> str:
        text = " ".join((text or "").split())
        for seen in self.texts:
            if seen in text:
                text = text.replace(seen, SHOWN)
        return text

    def new(self, text: str | None) -> str:
        """The text as it should print now; what it shows is recorded as shown."""
        out = self.once(text)
        flat = " ".join((text or "").split())
        self.texts += [m for m in self.known if m in flat and m not in self.texts]
        if len(flat) >= MIN_REPEAT and flat not in self.texts:
            self.texts.append(flat)
        self.texts.sort(key=len, reverse=True)
        return out


def _messages(report: dict) -> list[str]:
    texts = []
    for e in report["ranks"]:
        texts += [e.get("ended"), (e.get("evidence") or {}).get("text"), (e.get("first_error") or {}).get("text")]
    for f in report["findings"]:
        texts += [ev.get("text") for ev in f["evidence"]]
    flat = {" ".join(t.split()) for t in texts if t}
    return sorted((t for t in flat if len(t) >= MIN_REPEAT), key=len, reverse=True)


@dataclass
class Row:
    """One line of the rank table: the ranks that ended the same way, consecutively, first to end first."""
    ranks: list[int]
    when: str
    how: str
    where: str
    text: str


def _rank_rows(report: dict, shown: Shown) -> list[Row]:
    day = _day(report)
    rows: list[Row] = []
    last_key = None
    for e in report["ranks"]:
        ev = e["evidence"] or {}
        key = (e["ended"], ev.get("line"), ev.get("text"), e["rank"] in (report["verdict"].get("culprit_ranks") or []))
        if rows and key == last_key:
            rows[-1].ranks.append(e["rank"])
            continue
        last_key = key
        how = shown.new(_clip(e["ended"], 300))
        if how == SHOWN:  # still say how, in its first words: "exit 1 after ValueError (message above)"
            how = f'{_clip(e["ended"].split(": ")[0], 60)} {SHOWN}'
        text = shown.new(ev.get("text"))
        rows.append(Row([e["rank"]], _when(e, day), how, _where(ev), "" if text == SHOWN else _clip(text, 200)))
    return rows


def _who(ranks: list[int]) -> str:
    return rank_ranges(ranks) + (f" ({len(ranks)})" if len(ranks) > 1 else "")


def _verdict_lines(report: dict, shown: Shown) -> list[tuple[str, str]]:
    """The verdict as (style, text) pieces, in reading order; the terminal and plain renderers both use it."""
    verdict = report["verdict"]
    out = [("bold", shown.new(verdict["summary"] or ""))]
    finding = _verdict_finding(report)
    if finding:
        confidence = f"{finding['confidence']:.0%}" if finding.get("confidence") is not None else "not stated"
        line = f"{finding['signature']}  culprit rank(s) {rank_ranges(finding['ranks']) or 'none named'}  " \
               f"confidence {confidence}"
        if finding.get("evidence_kind"):
            line += f" (fitted, from {finding['evidence_kind']} evidence)"
        out.append(("bold red", line))
        shown.new(finding["summary"])
        if verdict.get("user_line"):
            out.append(("", f"user line {verdict['user_line']}"))
        if finding["remediation"]:
            out += [("", ""), ("bold", "What to do"), ("", shown.new(finding["remediation"]))]
        if finding["evidence"]:
            out += [("", ""), ("bold", "Evidence")]
            for ev in finding["evidence"][:6]:
                out.append(("cyan", f"rank {ev.get('rank')}  {_where(ev)}"))
                out.append(("indent", _clip(shown.new(ev.get("text")), 240)))
    if verdict.get("collect"):
        out += [("", ""), ("bold", "To tell for sure, collect" if verdict["signature"] else
                           "If the job did fail, collect")]
        out += [("", f"- {what}") for what in verdict["collect"]]
    return out


def _facts(report: dict) -> list[tuple[str, str]]:
    hosts = report["hosts"]
    return [("run", report["run_id"]), ("logs", report["source_dir"]), ("world size", str(report["world_size"])),
            ("ranks seen", rank_ranges(report["ranks_seen"]) or "none"),
            ("hosts", ", ".join(hosts[:8]) + (f" and {len(hosts) - 8} more" if len(hosts) > 8 else "")
             or "not in the logs"),
            ("versions", _versions(report)), ("time span", f"{report['started_at']} .. {report['ended_at']}")]


def _finding_rows(report: dict, shown: Shown) -> list[tuple[str, str, str, str, str]]:
    verdict = _verdict_finding(report)
    return [(f["role"], f["signature"], f["severity"], rank_ranges(f["ranks"]),
             "(the verdict above)" if f is verdict else _clip(shown.new(f["summary"]), 400))
            for f in report["findings"]]


def _file_notes(report: dict) -> list[str]:
    files = report["files"]
    lines = [f"files: {files['parsed']} parsed, {files['skipped']} skipped, {len(files['errors'])} with notes"]
    lines += [f"  {err['path']} ({err['kind']}, {err['status']}): {err['error']}" for err in files["errors"][:20]]
    return lines


def to_rich(report: dict) -> Group:
    """The terminal report: the verdict panel first, then the run's facts, how each rank ended and the
    other findings, each message printed once. Log text always goes in as Text, never as markup: a
    line like "[/path/pair.cc:553]" is not a rich tag."""
    shown = Shown(report)
    head = Text()
    for style, text in _verdict_lines(report, shown):
        head.append(("  " + text if style == "indent" else text) + "\n", style=None if style == "indent" else style)
    parts = [Panel(head, title="verdict", title_align="left")]
    facts = Table.grid(padding=(0, 2))
    facts.add_column(no_wrap=True)
    facts.add_column(overflow="fold")
    for name, value in _facts(report):
        facts.add_row(name, Text(value))
    parts.append(facts)
    ranks = Table(title="How each rank ended, first to end first", title_justify="left", expand=False)
    ranks.add_column("rank", no_wrap=True, max_width=18, overflow="fold")
    ranks.add_column("when", no_wrap=True, min_width=12)
    ranks.add_column("how it ended, evidence", overflow="fold", ratio=1, min_width=30)
    for row in _rank_rows(report, shown):
        cell = Text(row.how)
        cell.append(f"\n{row.where}" if row.where else "", style="cyan")
        if row.text:
            cell.append(f"\n{row.text}")
        ranks.add_row(_who(row.ranks), row.when, cell)
    parts.append(ranks)
    if report["findings"]:
        findings = Table(title="Findings", title_justify="left")
        findings.add_column("finding", overflow="fold", max_width=22)  # role, id, severity stacked: fits 80 columns
        findings.add_column("ranks", overflow="fold", max_width=14)
        findings.add_column("summary", overflow="fold", ratio=1, min_width=24)
        for role, signature, severity, ranks_text, summary in _finding_rows(report, shown):
            findings.add_row(Text(f"{signature}\n{role}, {severity}"), ranks_text, Text(summary))
        parts.append(findings)
    parts += [Text(line, style="dim") for line in _file_notes(report)]
    return Group(*parts)


def _wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """Wrapped at spaces only, so joining the lines gives the message back word for word."""
    return textwrap.wrap(text, width=width, initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_long_words=False, break_on_hyphens=False) or [first or ""]


def to_text(report: dict, width: int = 100) -> str:
    """Plain text for logs and CI: no box characters, no colour, lines wrapped at ``width``; the same
    content as the terminal report, in the same order, each message once."""
    width = max(width, 40)
    shown = Shown(report)
    lines = ["VERDICT"]
    for style, text in _verdict_lines(report, shown):
        lines += _wrap(text, width, "    " if style == "indent" else "  ") if text else [""]
    lines += ["", "RUN"]
    for name, value in _facts(report):
        lines += _wrap(value, width, " " * 14, f"  {name:<12}")
    lines += ["", "HOW EACH RANK ENDED, FIRST TO END FIRST"]
    for row in _rank_rows(report, shown):
        head = f"  rank {_who(row.ranks)}  {row.when}  "
        lines += _wrap(row.how, width, "      ", head) if len(head) < width // 2 else [head.rstrip()] + \
            _wrap(row.how, width, "      ")
        if row.where:
            lines += _wrap(row.where, width, "      ")
        if row.text:
            lines += _wrap(row.text, width, "      ")
    if report["findings"]:
        lines += ["", "FINDINGS"]
        for role, signature, severity, ranks_text, summary in _finding_rows(report, shown):
            lines += _wrap(f"{role}  {signature}  {severity}  rank(s) {ranks_text or 'none named'}", width, "    ", "  ")
            lines += _wrap(summary, width, "      ")
    lines += ["", *_file_notes(report)]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_rich(report: dict, width: int | None = None) -> str:
    """The terminal report as it prints at ``width`` columns, without colour (what a test reads)."""
    console = Console(width=width or 100, record=True, file=io.StringIO(), color_system=None)
    console.print(to_rich(report))
    return console.export_text()


def to_markdown(report: dict) -> str:
    v = report["verdict"]
    lines = [f"## postmortem: {v['summary']}", ""]
    finding = next((f for f in report["findings"] if f["signature"] == v.get("signature")), None)
    if finding:
        lines += [f"**{finding['signature']}**, culprit rank(s) {finding['ranks']}, "
                  f"confidence {finding['confidence']:.0%}", "", "**What to do:** " + finding["remediation"], ""]
        for ev in finding["evidence"][:6]:
            lines.append(f"- rank {ev.get('rank')} `{_where(ev)}`: {_clip(ev.get('text'), 200)}")
        lines.append("")
    lines += [
        f"- run `{report['run_id']}`, logs `{report['source_dir']}`",
        f"- world size {report['world_size']}, ranks seen {rank_ranges(report['ranks_seen']) or 'none'}, hosts {', '.join(report['hosts'])}",
        f"- versions: {_versions(report)}",
        "",
        "| rank | when | how it ended | evidence |",
        "| --- | --- | --- | --- |",
    ]
    for e in report["ranks"]:
        ev = e["evidence"] or {}
        text = (ev.get("text") or "").replace("|", "\\|")[:200]
        lines.append(f"| {e['rank']} | {_ts(e)} | {e['ended'].replace('|', '/')} | `{_where(ev)}` {text} |")
    if report["findings"]:
        lines += ["", "| role | signature | ranks | summary |", "| --- | --- | --- | --- |"]
        for f in report["findings"]:
            lines.append(f"| {f['role']} | {f['signature']} | {f['ranks']} | {f['summary']} |")
    return "\n".join(lines) + "\n"

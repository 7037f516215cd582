"""Renderers: a report dict in, text out. Pure functions, so formats never disagree."""

from __future__ import annotations

import io
import json

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .engine import rank_ranges


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


def _verdict_panel(report: dict) -> Panel:
    verdict = report["verdict"]
    head = Text()
    head.append(verdict["summary"] or "", style="bold")
    finding = next((f for f in report["findings"] if f["signature"] == verdict.get("signature")), None)
    if finding:
        head.append(f"\n{finding['signature']}", style="bold red")
        culprits = rank_ranges(finding["ranks"]) or "none named"
        head.append(f"  culprit rank(s) {culprits}  confidence {finding['confidence']:.0%}")
        if verdict.get("user_line"):
            head.append(f"\nuser line {verdict['user_line']}")
        if finding["remediation"]:
            head.append("\n\nWhat to do\n", style="bold")
            head.append(finding["remediation"])
        if finding["evidence"]:
            head.append("\n\nEvidence\n", style="bold")
            for ev in finding["evidence"][:6]:
                head.append(f"rank {ev.get('rank')}  {_where(ev)}  ", style="cyan")
                head.append(_clip(ev.get("text"), 160) + "\n")
    return Panel(head, title="verdict", title_align="left")


def to_rich(report: dict) -> Group:
    """The terminal report. Log text always goes in as Text, never as markup: a line like
    "[/path/pair.cc:553]" is not a rich tag."""
    facts = Table.grid(padding=(0, 2))
    facts.add_row("run", report["run_id"])
    facts.add_row("logs", Text(report["source_dir"]))
    facts.add_row("world size", str(report["world_size"]))
    facts.add_row("ranks seen", rank_ranges(report["ranks_seen"]) or "none")
    facts.add_row("hosts", Text(", ".join(report["hosts"]) or "not in the logs"))
    facts.add_row("versions", Text(_versions(report)))
    facts.add_row("time span", f"{report['started_at']} .. {report['ended_at']}")
    ranks = Table(title="How each rank ended, first to end first", title_justify="left")
    ranks.add_column("rank", no_wrap=True)
    ranks.add_column("when", no_wrap=True)
    ranks.add_column("how", overflow="fold", ratio=3)
    ranks.add_column("evidence", overflow="fold", ratio=2)
    for e in report["ranks"]:
        ev = e["evidence"] or {}
        ranks.add_row(str(e["rank"]), _ts(e), Text(_clip(e["ended"], 200)),
                      Text(f"{_where(ev)}\n{_clip(ev.get('text'), 120)}"))
    parts = [_verdict_panel(report), facts, ranks]
    if report["findings"]:
        findings = Table(title="Findings", title_justify="left")
        findings.add_column("role", no_wrap=True)
        findings.add_column("signature", no_wrap=True)
        findings.add_column("severity", no_wrap=True)
        findings.add_column("ranks", no_wrap=True)
        findings.add_column("summary", overflow="fold")
        for f in report["findings"]:
            findings.add_row(f["role"], f["signature"], f["severity"], ", ".join(map(str, f["ranks"])),
                             Text(_clip(f["summary"], 400)))
        parts.append(findings)
    files = report["files"]
    parts.append(Text(f"files: {files['parsed']} parsed, {files['skipped']} skipped, "
                      f"{len(files['errors'])} with notes", style="dim"))
    for err in files["errors"][:20]:
        parts.append(Text(f"  {err['path']} ({err['kind']}, {err['status']}): {err['error']}", style="dim"))
    return Group(*parts)


def to_text(report: dict, width: int = 120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
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

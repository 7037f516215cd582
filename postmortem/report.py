"""Renderers: a report dict in, text out. Pure functions, so formats never disagree."""

from __future__ import annotations

import io
import json

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str)


def _versions(report: dict) -> str:
    parts = [f"{name} {v}" for name, v in report["versions"].items() if v]
    return ", ".join(parts) or "not in the logs"


def _where(ev: dict | None) -> str:
    if not ev:
        return ""
    return f"{ev['file']}:{ev['line']}" if ev.get("line") else (ev.get("file") or "")


def _ts(ending: dict) -> str:
    """An inferred time is a lower bound: the error came after the rank's last timestamp."""
    if not ending["ts"]:
        return "?"
    return f">= {ending['ts']}" if ending.get("ts_inferred") else ending["ts"]


def to_rich(report: dict) -> Group:
    verdict = report["verdict"]
    head = Text()
    head.append(verdict["summary"] or "", style="bold")
    if verdict.get("signature"):
        head.append(f"\n{verdict['signature']}  culprit ranks {verdict['culprit_ranks']}", style="red")
    facts = Table.grid(padding=(0, 2))
    facts.add_row("run", report["run_id"])
    facts.add_row("logs", Text(report["source_dir"]))
    facts.add_row("world size", str(report["world_size"]))
    facts.add_row("ranks seen", ", ".join(map(str, report["ranks_seen"])) or "none")
    facts.add_row("hosts", ", ".join(report["hosts"]) or "not in the logs")
    facts.add_row("versions", _versions(report))
    facts.add_row("time span", f"{report['started_at']} .. {report['ended_at']}")
    ranks = Table(title="How each rank ended (first to end first)", title_justify="left")
    for col in ("rank", "when", "how", "evidence", "last event"):
        ranks.add_column(col, overflow="fold")
    for e in report["ranks"]:
        ev = e["evidence"] or {}
        last = e["last_event"] or {}
        # Log text goes in as Text, never as markup: a line like "[/path/pair.cc:553]" is not a tag.
        ranks.add_row(str(e["rank"]), _ts(e), Text(e["ended"]),
                      Text(f"{_where(ev)}\n{(ev.get('text') or '')[:100]}"),
                      Text(f"{last.get('ts') or ''} {_where(last)}"))
    parts = [Panel(head, title="verdict"), facts, ranks]
    if report["findings"]:
        findings = Table(title="Findings", title_justify="left")
        for col in ("role", "signature", "severity", "ranks", "summary"):
            findings.add_column(col, overflow="fold")
        for f in report["findings"]:
            findings.add_row(f["role"], f["signature"], f["severity"], str(f["ranks"]), Text(f["summary"]))
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
    if v.get("signature"):
        lines += [f"**{v['signature']}**, culprit ranks {v['culprit_ranks']}, confidence {v['confidence']}", ""]
    lines += [
        f"- run `{report['run_id']}`, logs `{report['source_dir']}`",
        f"- world size {report['world_size']}, ranks seen {report['ranks_seen']}, hosts {', '.join(report['hosts'])}",
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

"""The HTML report: one self-contained file (inline CSS and SVG, no script, no network).

A pure function of the report dict plus its ``series`` (what the charts draw), like every
renderer: ``to_html(report)``. Every piece of log text is escaped.
"""

from __future__ import annotations

from html import escape

from .engine import rank_ranges

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
STATE_COLORS = {"completed": "#cfe8cf", "started": "#ffe0a3", "scheduled": "#ffd0a0", "timed_out": "#f4a3a3"}

CSS = """
body { font: 14px/1.45 -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
.verdict { border: 2px solid #c0392b; border-radius: 6px; padding: 12px 16px; background: #fdf3f2; }
.verdict.clean { border-color: #27ae60; background: #f1faf4; }
.sig { font-weight: 600; color: #c0392b; } .muted { color: #777; }
table { border-collapse: collapse; width: 100%; margin: 6px 0; }
th, td { border: 1px solid #e3e3e3; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.num { text-align: right; }
tr.culprit td { background: #fdecea; font-weight: 600; }
td.mono { white-space: nowrap; }
code, .mono { font-family: SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; }
.cell { text-align: center; font-family: Menlo, Consolas, monospace; font-size: 11px; }
.missing { background: #f4a3a3; font-weight: 700; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 6px; border-radius: 3px; font-size: 12px; }
svg text { font: 11px sans-serif; fill: #444; }
"""


def _e(value) -> str:
    return escape("" if value is None else str(value))


def _verdict(report: dict) -> str:
    v = report["verdict"]
    finding = next((f for f in report["findings"] if f["signature"] == v.get("signature")), None)
    if not finding:
        return f'<div class="verdict clean" id="verdict"><h1>{_e(v["summary"])}</h1></div>'
    evidence = "".join(
        f'<li><span class="muted">rank {_e(ev.get("rank"))}</span> <code>{_e(ev.get("file"))}:{_e(ev.get("line"))}'
        f'</code> {_e((ev.get("text") or "")[:300])}</li>' for ev in finding["evidence"][:8])
    return (
        f'<div class="verdict" id="verdict"><h1>{_e(v["summary"])}</h1>'
        f'<p><span class="sig">{_e(finding["signature"])}</span> &middot; culprit rank(s) '
        f'<b id="culprit">{_e(", ".join(map(str, finding["ranks"])))}</b> &middot; confidence '
        f'{finding["confidence"]:.0%}</p>'
        f'<p><b>What to do.</b> {_e(finding["remediation"])}</p><ul>{evidence}</ul></div>'
    )


def _facts(report: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v) or "not in the logs"
    rows = [("run", report["run_id"]), ("logs", report["source_dir"]), ("job", (report.get("job") or {}).get("id")),
            ("world size", report["world_size"]), ("ranks seen", rank_ranges(report["ranks_seen"])),
            ("hosts", ", ".join(report["hosts"])), ("versions", versions),
            ("time span", f'{report["started_at"]} .. {report["ended_at"]}')]
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def _endings(report: dict) -> str:
    culprits = set(report["verdict"].get("culprit_ranks") or [])
    rows = []
    for e in report["ranks"]:
        ev = e["evidence"] or {}
        when = (">= " if e.get("ts_inferred") else "") + (e["ts"] or "?")
        cls = ' class="culprit"' if e["rank"] in culprits else ""
        rows.append(f'<tr{cls}><td class="num">{e["rank"]}</td><td class="mono">{_e(when)}</td><td>{_e(e["ended"])}'
                    f'</td><td><code>{_e(ev.get("file"))}:{_e(ev.get("line"))}</code><br>'
                    f'{_e((ev.get("text") or "")[:200])}</td></tr>')
    return ("<table><tr><th>rank</th><th>when</th><th>how it ended</th><th>evidence</th></tr>"
            + "".join(rows) + "</table>")


def _collectives(series: dict) -> str:
    tail = series.get("collectives") or []
    if not tail:
        return '<p class="muted">No collective records (flight recorder, NCCL COLL lines, watchdog) in the logs.</p>'
    ranks = sorted({r["rank"] for r in tail})
    groups = sorted({(r["pg"] or "", r["seq_id"]) for r in tail}, key=lambda k: (k[0], k[1]))[-16:]
    by_key = {(r["rank"], r["pg"] or "", r["seq_id"]): r for r in tail}
    head = "".join(f'<th class="cell">{_e(pg + ":" if pg else "")}{seq}</th>' for pg, seq in groups)
    body = []
    for rank in ranks:
        cells = []
        for pg, seq in groups:
            r = by_key.get((rank, pg, seq))
            if r is None:
                cells.append('<td class="cell missing" title="this rank never issued it">&mdash;</td>')
            else:
                color = STATE_COLORS.get(r["state"] or "", "#eee")
                cells.append(f'<td class="cell" style="background:{color}" title="{_e(r["state"])} '
                             f'({_e(r["source"])})">{_e((r["op"] or "?")[:10])}</td>')
        body.append(f'<tr><th>rank {rank}</th>{"".join(cells)}</tr>')
    legend = "".join(f'<span style="background:{c}">{s}</span>' for s, c in STATE_COLORS.items())
    return (f'<p class="legend">{legend}<span class="missing">never issued</span></p>'
            f'<table id="collectives"><tr><th>rank \\ seq</th>{head}</tr>{"".join(body)}</table>')


def _line_chart(points_by_rank: dict, y_label: str, width: int = 1000, height: int = 260) -> str:
    all_points = [p for pts in points_by_rank.values() for p in pts]
    if not all_points:
        return '<p class="muted">No samples in the logs.</p>'
    xs, ys = [p[0] for p in all_points], [p[1] for p in all_points]
    x0, x1, y1 = min(xs), max(xs) or 1, max(ys) or 1
    left, bottom = 60, 30
    sx = lambda x: left + (x - x0) / ((x1 - x0) or 1) * (width - left - 10)  # noqa: E731
    sy = lambda y: height - bottom - y / y1 * (height - bottom - 10)  # noqa: E731
    lines = []
    for i, (rank, pts) in enumerate(sorted(points_by_rank.items())):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>'
                     f'<text x="{width - 70}" y="{14 + 13 * i}" style="fill:{color}">rank {rank}</text>')
    axes = (f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="#999"/>'
            f'<line x1="{left}" y1="10" x2="{left}" y2="{height - bottom}" stroke="#999"/>'
            f'<text x="{left + 6}" y="14">{_e(y_label)}</text><text x="4" y="{height - bottom}">0</text>'
            f'<text x="4" y="14">{y1:.0f}</text><text x="{left}" y="{height - 8}">step {x0}</text>'
            f'<text x="{width - 80}" y="{height - 8}">step {x1}</text>')
    return f'<svg width="{width}" height="{height}" role="img">{axes}{"".join(lines)}</svg>'


def _bars(items: list[tuple[str, float]], unit: str, width: int = 1000) -> str:
    if not items:
        return '<p class="muted">Nothing recorded.</p>'
    top = max(v for _, v in items) or 1
    rows = []
    for i, (label, value) in enumerate(items[:30]):
        w = value / top * (width - 330)
        rows.append(f'<text x="0" y="{16 + 18 * i}">{_e(label[:45])}</text>'
                    f'<rect x="300" y="{5 + 18 * i}" width="{w:.1f}" height="13" fill="{PALETTE[0]}"/>'
                    f'<text x="{305 + w:.1f}" y="{16 + 18 * i}">{value:g} {_e(unit)}</text>')
    return f'<svg width="{width}" height="{18 * min(len(items), 30) + 10}" role="img">{"".join(rows)}</svg>'


def _findings(report: dict) -> str:
    if not report["findings"]:
        return '<p class="muted">No findings.</p>'
    rows = "".join(
        f'<tr><td>{_e(f["role"])}</td><td class="sig">{_e(f["signature"])}</td><td>{_e(f["severity"])}</td>'
        f'<td>{_e(", ".join(map(str, f["ranks"])))}</td><td>{_e(f["summary"])}</td></tr>' for f in report["findings"])
    return ("<table><tr><th>role</th><th>signature</th><th>severity</th><th>ranks</th><th>summary</th></tr>"
            + rows + "</table>")


def to_html(report: dict) -> str:
    series = report.get("series") or {}
    memory = {}
    for p in series.get("memory") or []:
        memory.setdefault(p["rank"], []).append((p["step"], p["allocated_mb"]))
    recompiles = [(f'{r["function"]} ({r["where"]})', r["recompiles"]) for r in series.get("recompiles") or []]
    steps = [(f'rank {r["rank"]}', round(r["step_ms"], 1)) for r in series.get("step_time") or []]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>postmortem {_e(report["run_id"])}</title>
<style>{CSS}</style></head><body>
{_verdict(report)}
<h2>Run</h2>{_facts(report)}
<h2>How each rank ended, first to end first</h2>{_endings(report)}
<h2>Last collectives per rank: which rank stopped where</h2>{_collectives(series)}
<h2>Memory allocated per step (MiB)</h2>{_line_chart(memory, "MiB")}
<h2>Recompiles per frame</h2>{_bars(recompiles, "recompiles")}
<h2>Step time per rank</h2>{_bars(steps, "ms")}
<h2>Findings</h2>{_findings(report)}
<p class="muted">files: {report["files"]["parsed"]} parsed, {report["files"]["skipped"]} skipped &middot;
postmortem {_e(report.get("postmortem_version"))}</p>
</body></html>
"""

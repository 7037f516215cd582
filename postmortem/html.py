"""The HTML report: one self-contained file (inline CSS and SVG, no script, no network).

A pure function of the report dict plus its ``series`` (what the charts draw, from
``summary.series`` and ``timeline.series``), like every renderer: ``to_html(report)``. Every piece
of log text is escaped; hovering a mark shows its evidence line through a plain SVG ``<title>``,
e.g. ``rank 1 · recompile forward [0/3] · logs/.../stderr.log:57``.

What it draws, top to bottom: the verdict; the per-rank timeline (ranks that behaved alike folded
into one lane labelled by their range, the culprit's lane first and marked), over the last minute
before the first failure and then over the whole run; how each rank ended; the collectives around
the first divergence; memory per step, step time per rank, recompiles per frame; the findings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape

from .ranges import rank_ranges

PALETTE = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
CULPRIT_COLOR = "#c0392b"
STATE_COLORS = {"completed": "#cfe8cf", "started": "#ffe0a3", "scheduled": "#ffd0a0", "timed_out": "#f4a3a3"}
COMPILE_COLORS = {"compile": "#6a3d9a", "recompile": "#e7298a", "graph_break": "#999999", "limit_hit": "#b30000",
                  "failure": "#b30000"}
WINDOW_US = 60_000_000  # the default window: the last minute before the first failure
AFTER_FAILURE_US = 20_000_000  # and what followed it closely (the teardown of the other ranks)
MAX_LANES = 40  # beyond this many distinct behaviours, the rest are listed, not drawn
CHART_WIDTH = 1040

CSS = """
body { font: 14px/1.45 -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1100px;
       padding: 0 12px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
.verdict { border: 2px solid #c0392b; border-radius: 6px; padding: 12px 16px; background: #fdf3f2; }
.verdict.clean { border-color: #27ae60; background: #f1faf4; }
.sig { font-weight: 600; color: #c0392b; } .muted { color: #777; } .caption { color: #555; font-size: 12px; margin: 2px 0; }
table { border-collapse: collapse; width: 100%; margin: 6px 0; }
th, td { border: 1px solid #e3e3e3; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.num { text-align: right; }
tr.culprit td, tr.culprit th { background: #fdecea; font-weight: 600; }
td.mono { white-space: nowrap; }
code, .mono { font-family: SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; }
.scroll { overflow: auto; max-height: 420px; border: 1px solid #e3e3e3; }
.scroll table { width: auto; margin: 0; }
.scroll-y { overflow-y: auto; max-height: 360px; border: 1px solid #e3e3e3; }
.scroll-y table { margin: 0; table-layout: fixed; } .scroll-y td { overflow-wrap: anywhere; }
.cell { text-align: center; font-family: Menlo, Consolas, monospace; font-size: 11px; white-space: nowrap; }
th.cell.divergent { background: #f4a3a3; }
.missing { background: #f4a3a3; font-weight: 700; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 6px; border-radius: 3px; font-size: 12px; }
svg { display: block; max-width: 100%; height: auto; }
svg text { font: 11px sans-serif; fill: #444; } svg text.lane-label { font-weight: 600; fill: #222; }
svg text.culprit { fill: #c0392b; }
"""


def _e(value) -> str:
    return escape("" if value is None else str(value))


def _us(ts: str | None) -> int | None:
    """A report timestamp ('2026-11-29 15:57:30.483000', UTC) as epoch microseconds."""
    if not ts:
        return None
    try:
        moment = datetime.fromisoformat(str(ts)).replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(moment.timestamp() * 1_000_000)


def _clock(ts_us: int) -> str:
    return datetime.fromtimestamp(ts_us / 1e6, UTC).strftime("%H:%M:%S")


def _verdict_finding(report: dict) -> dict | None:
    return next((f for f in report["findings"] if f["signature"] == report["verdict"].get("signature")), None)


def _verdict(report: dict) -> str:
    v = report["verdict"]
    finding = _verdict_finding(report)
    if not finding:
        return f'<div class="verdict clean" id="verdict"><h1>{_e(v["summary"])}</h1></div>'
    evidence = "".join(
        f'<li><span class="muted">rank {_e(ev.get("rank"))}</span> <code>{_e(ev.get("file"))}:{_e(ev.get("line"))}'
        f'</code> {_e((ev.get("text") or "")[:300])}</li>' for ev in finding["evidence"][:8])
    confidence = f'{finding["confidence"]:.0%}' if finding.get("confidence") is not None else "not stated"
    return (
        f'<div class="verdict" id="verdict"><h1>{_e(v["summary"])}</h1>'
        f'<p><span class="sig">{_e(finding["signature"])}</span> &middot; culprit rank(s) '
        f'<b id="culprit">{_e(", ".join(map(str, finding["ranks"])))}</b> &middot; confidence {confidence}</p>'
        f'<p><b>What to do.</b> {_e(finding["remediation"])}</p><ul>{evidence}</ul></div>'
    )


def _facts(report: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v) or "not in the logs"
    rows = [("run", report["run_id"]), ("logs", report["source_dir"]), ("job", (report.get("job") or {}).get("id")),
            ("world size", report["world_size"]), ("ranks seen", rank_ranges(report["ranks_seen"])),
            ("hosts", ", ".join(report["hosts"][:20]) + (f" and {len(report['hosts']) - 20} more"
                                                       if len(report["hosts"]) > 20 else "")),
            ("versions", versions), ("time span", f'{report["started_at"]} .. {report["ended_at"]}')]
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


# --- lanes: ranks that behaved alike, folded -------------------------------------------------------------------


@dataclass
class Lane:
    ranks: list[int]
    culprit: bool
    ending: dict | None = None  # the report's ending of the lane's first rank
    marks: list[dict] = field(default_factory=list)
    spans: list[dict] = field(default_factory=list)

    @property
    def rank(self) -> int:
        """The rank whose marks the lane draws: the lowest of those folded into it."""
        return self.ranks[0]

    @property
    def label(self) -> str:
        if len(self.ranks) == 1:
            return f"rank {self.rank}"
        return f"ranks {rank_ranges(self.ranks)} ({len(self.ranks)})"

    @property
    def short_label(self) -> str:
        """What fits the label column; the whole list is the label's hover title."""
        return self.label if len(self.label) <= 26 else f"ranks {rank_ranges(self.ranks)[:12]}… ({len(self.ranks)})"


def fold_lanes(report: dict, series: dict) -> list[Lane]:
    """One lane per behaviour: ranks with the same fold key share a lane, culprits never share one with
    non-culprits; culprit lanes first, then the rest in the order their ranks ended (first to end first)."""
    culprits = set(report["verdict"].get("culprit_ranks") or [])
    key_of = {row["rank"]: row["fold_key"] for row in series.get("fold_keys") or []}
    ending_of = {e["rank"]: e for e in report["ranks"]}
    order = {e["rank"]: i for i, e in enumerate(report["ranks"])}
    ranks = sorted(set(key_of) | set(ending_of) | set(report.get("ranks_seen") or []))
    groups: dict[tuple, list[int]] = {}
    for rank in ranks:
        ending = ending_of.get(rank) or {}
        groups.setdefault((rank in culprits, key_of.get(rank, ""), _ending_kind(ending)), []).append(rank)
    lanes = [Lane(ranks=members, culprit=is_culprit, ending=ending_of.get(members[0]))
             for (is_culprit, _, _), members in groups.items()]
    lanes.sort(key=lambda lane: (not lane.culprit, order.get(lane.rank, len(order)), lane.rank))
    drawn = {lane.rank: lane for lane in lanes[:MAX_LANES]}
    for m in series.get("marks") or []:
        if m["rank"] in drawn:
            drawn[m["rank"]].marks.append(m)
    for s in series.get("spans") or []:
        if s["rank"] in drawn:
            drawn[s["rank"]].spans.append(s)
    return lanes


def _ending_kind(ending: dict) -> str:
    """How a rank ended, without its numbers: ranks torn down alike fold, a rank that crashed does not."""
    return f'{ending.get("signal")}/{ending.get("exit_code")}/{bool(ending.get("consequence"))}'


# --- the timeline ------------------------------------------------------------------------------------------------

LABEL_W, AXIS_H = 190, 26
PG_ROW_H, MAX_PG_ROWS = 11, 4  # one row of the lane per process group (the rest share the last)


def _first_failure_us(report: dict) -> int | None:
    times = [_us(e["ts"]) for e in report["ranks"] if e.get("ts") and e.get("ended") != "no failure recorded"]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def _window(report: dict, lanes: list[Lane]) -> tuple[int, int] | None:
    """The whole run's time span, from the report's facts and the marks."""
    times = [m["ts_us"] for lane in lanes for m in lane.marks if m.get("ts_us")]
    times += [t for t in (_us(report.get("started_at")), _us(report.get("ended_at"))) if t]
    times += [t for lane in lanes for t in [_us((lane.ending or {}).get("ts"))] if t]
    return (min(times), max(times)) if times else None


def _x(t: int, t0: int, t1: int) -> float:
    return LABEL_W + (t - t0) / max(t1 - t0, 1) * (CHART_WIDTH - LABEL_W - 12)


def _tick_step_s(span_s: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600):
        if span_s / step <= 8:
            return step
    return 86400


def _time_axis(t0: int, t1: int, first_failure: int | None, height: int) -> str:
    step_us = int(_tick_step_s((t1 - t0) / 1e6) * 1e6)
    out = [f'<line x1="{LABEL_W}" y1="{AXIS_H - 4}" x2="{CHART_WIDTH - 12}" y2="{AXIS_H - 4}" stroke="#999"/>']
    tick = (t0 // step_us + 1) * step_us
    while tick < t1:
        x = _x(tick, t0, t1)
        if x > CHART_WIDTH - 40:  # a label cut by the edge reads as a wrong time
            break
        label = _clock(tick) if step_us >= 1_000_000 else f"{_clock(tick)}.{tick // 100_000 % 10}"
        out.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 8}" x2="{x:.1f}" y2="{height}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="middle">{label}</text>')
        tick += step_us
    out.append(f'<text x="4" y="{AXIS_H - 10}">time (UTC)</text>')
    if first_failure and t0 <= first_failure <= t1:
        x = _x(first_failure, t0, t1)
        out.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 4}" x2="{x:.1f}" y2="{height}" stroke="{CULPRIT_COLOR}" '
                   f'stroke-dasharray="4 3"><title>first failure {_e(_clock(first_failure))}</title></line>')
    return "".join(out)


def _hover(lane: Lane, *parts) -> str:
    return _e(" · ".join(str(p) for p in [lane.label, *parts] if p not in (None, "")))


def _where(mark: dict) -> str:
    return f'{mark.get("file") or ""}:{mark.get("line_no") or ""}'.strip(":")


def _lane_height(pg_rows: dict) -> int:
    return PG_ROW_H * max(1, min(len(pg_rows), MAX_PG_ROWS)) + 36


def _lane_svg(lane: Lane, top: int, t0: int, t1: int, pg_rows: dict, names: dict, memory_max: float) -> str:
    """One lane: a row per process group (its collectives' span, ticks, and the sequence number where the
    rank stopped), then compiles, then warnings, errors and the rank's end, memory along the bottom."""
    inside = [m for m in lane.marks if t0 <= m["ts_us"] <= t1]
    lane_h = _lane_height(pg_rows)
    band = top + 3 + PG_ROW_H * max(1, min(len(pg_rows), MAX_PG_ROWS))  # below the collectives' rows
    fill = "#fdecea" if lane.culprit else "#fafafa"
    out = [f'<g class="lane{" culprit" if lane.culprit else ""}" data-ranks="{_e(rank_ranges(lane.ranks))}">',
           f'<rect x="0" y="{top}" width="{CHART_WIDTH}" height="{lane_h - 2}" fill="{fill}"/>']
    if lane.culprit:
        out.append(f'<rect x="0" y="{top}" width="5" height="{lane_h - 2}" fill="{CULPRIT_COLOR}"/>')
    label_class = "lane-label culprit" if lane.culprit else "lane-label"
    out.append(f'<text class="{label_class}" x="10" y="{top + 17}">{_e(lane.short_label)}<title>{_e(lane.label)}'
               '</title></text>')
    if lane.culprit:
        out.append(f'<text class="culprit" x="10" y="{top + 32}">&#9664; culprit</text>')
    elif len(lane.ranks) > 1:
        out.append(f'<text x="10" y="{top + 32}">alike: rank {lane.rank} drawn</text>')
    for m in inside:  # step boundaries behind everything
        if m["kind"] == "step":
            x = _x(m["ts_us"], t0, t1)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + lane_h - 2}" stroke="#bbb" '
                       f'stroke-dasharray="2 2"><title>{_hover(lane, m["label"], _where(m))}</title></line>')
    for s in lane.spans:  # collectives: a bar per process group from its first to its last record
        if s["last_us"] is None or s["last_us"] < t0 or s["first_us"] > t1:
            continue
        row_top = top + 3 + PG_ROW_H * pg_rows.get(s["pg"], 0)
        color = PALETTE[pg_rows.get(s["pg"], 0) % len(PALETTE)]
        x0, x1 = _x(max(s["first_us"], t0), t0, t1), _x(min(s["last_us"], t1), t0, t1)
        name = names.get(s["pg"]) or f'pg {s["pg"]}'
        title = _hover(lane, f"{name}: {s['collectives']} collectives",
                       f"last seq {s['last_seq']} {s['last_op']} ({s['last_state']})")
        out.append(f'<rect x="{x0:.1f}" y="{row_top}" width="{max(x1 - x0, 2):.1f}" height="8" fill="{color}" '
                   f'opacity="0.35"><title>{title}</title></rect>')
        if s["last_us"] <= t1:
            out.append(f'<text x="{x1 + 3:.1f}" y="{row_top + 8}" style="fill:{color}">{_e(name)} seq '
                       f'{s["last_seq"]}</text>')
    for m in inside:
        x, kind, title = _x(m["ts_us"], t0, t1), m["kind"], _hover(lane, m["label"], m.get("detail"), _where(m))
        if kind == "collective":
            row_top = top + 3 + PG_ROW_H * pg_rows.get(m.get("pg") or "", 0)
            out.append(f'<rect x="{x:.1f}" y="{row_top - 1}" width="1.5" height="10" fill="#333"><title>{title}'
                       f'</title></rect>')
        elif kind in COMPILE_COLORS:
            out.append(f'<rect x="{x - 2:.1f}" y="{band + 1}" width="4" height="10" fill="{COMPILE_COLORS[kind]}">'
                       f'<title>{title}</title></rect>')
        elif kind == "memory" and memory_max:
            h = max(1.0, (m["value"] or 0) / memory_max * 10)
            out.append(f'<rect x="{x - 1:.1f}" y="{top + lane_h - 4 - h:.1f}" width="3" height="{h:.1f}" '
                       f'fill="#2ca02c"><title>{title}</title></rect>')
        elif kind in ("warning", "error"):
            color = "#e69500" if kind == "warning" else CULPRIT_COLOR
            out.append(f'<circle cx="{x:.1f}" cy="{band + 18}" r="3.5" fill="{color}"><title>{title}</title></circle>')
    end = _us((lane.ending or {}).get("ts"))
    if end and t0 <= end <= t1 and lane.ending.get("ended") != "no failure recorded":
        x = _x(end, t0, t1)
        out.append(f'<path d="M{x - 5:.1f},{band + 13} l10,10 m0,-10 l-10,10" stroke="#000" stroke-width="2">'
                   f'<title>{_hover(lane, "ended " + lane.ending["ts"], lane.ending["ended"])}</title></path>')
    out.append("</g>")
    return "".join(out)


def _timeline_svg(lanes: list[Lane], t0: int, t1: int, first_failure: int | None, series: dict, css_id: str) -> str:
    drawn = lanes[:MAX_LANES]
    pgs = sorted({s["pg"] for lane in drawn for s in lane.spans}, key=lambda pg: (len(pg), pg))
    pg_rows = {pg: min(i, MAX_PG_ROWS - 1) for i, pg in enumerate(pgs)}
    lane_h = _lane_height(pg_rows)
    height = AXIS_H + lane_h * len(drawn)
    memory_max = max((m["value"] or 0 for lane in drawn for m in lane.marks if m["kind"] == "memory"), default=0)
    names = series.get("group_names") or {}
    body = "".join(_lane_svg(lane, AXIS_H + i * lane_h, t0, t1, pg_rows, names, memory_max)
                   for i, lane in enumerate(drawn))
    return (f'<svg id="{css_id}" class="timeline" viewBox="0 0 {CHART_WIDTH} {height}" width="{CHART_WIDTH}" '
            f'height="{height}" role="img">{_time_axis(t0, t1, first_failure, height)}{body}</svg>')


TIMELINE_LEGEND = (
    '<p class="legend"><span style="background:#dde8f3">collectives of a process group (bar: first to last record; '
    'label: the sequence number where the rank stopped)</span><span style="border:1px dashed #999">step start</span>'
    f'<span style="background:{COMPILE_COLORS["compile"]};color:#fff">compile</span>'
    f'<span style="background:{COMPILE_COLORS["recompile"]};color:#fff">recompile</span>'
    f'<span style="background:{COMPILE_COLORS["graph_break"]};color:#fff">graph break</span>'
    '<span style="background:#2ca02c;color:#fff">memory allocated</span>'
    '<span style="background:#e69500;color:#fff">warning</span>'
    f'<span style="background:{CULPRIT_COLOR};color:#fff">error</span><span>&#10005; the rank\'s end</span></p>')


def _timeline(report: dict, series: dict) -> str:
    lanes = fold_lanes(report, series)
    span = _window(report, lanes)
    if not lanes or not span:
        return '<p class="muted">No timed records of any rank in the logs.</p>'
    first_failure = _first_failure_us(report)
    start, end = span
    if first_failure:
        w0, w1 = max(start, first_failure - WINDOW_US), min(end, first_failure + AFTER_FAILURE_US)
        what = f"the last minute before the first failure ({_clock(first_failure)} UTC)"
    else:
        w0, w1 = max(start, end - WINDOW_US), end
        what = "the run's last minute (no rank failed)"
    folded = sum(len(lane.ranks) for lane in lanes)
    note = (f'{folded} ranks in {len(lanes)} lanes: ranks that did the same (same sequence numbers reached per '
            'process group, same compile events, same errors, same end) share a lane; hover a mark for its evidence.')
    if len(lanes) > MAX_LANES:
        rest = [r for lane in lanes[MAX_LANES:] for r in lane.ranks]
        note += f" {len(lanes) - MAX_LANES} more lanes not drawn: ranks {_e(rank_ranges(rest))}."
    whole = _timeline_svg(lanes, start, max(end, start + 1), first_failure, series, "timeline-run")
    return (f'<p class="caption">{_e(note)} Sources: compiles (TORCH_LOGS / TORCH_TRACE), collectives (flight '
            'recorder, NCCL and watchdog lines), memory and step lines, warnings and errors of each rank\'s logs.</p>'
            f'{TIMELINE_LEGEND}<h3>{_e(what)}</h3>{_timeline_svg(lanes, w0, max(w1, w0 + 1), first_failure, series, "timeline")}'
            f'<h3>the whole run ({_clock(start)} .. {_clock(end)} UTC)</h3>{whole}')


# --- how each rank ended, folded -------------------------------------------------------------------------------


def _endings(report: dict) -> str:
    """First to end first; consecutive ranks that ended the same way (same words, same evidence line)
    are one row, so 510 identical teardowns read as one."""
    culprits = set(report["verdict"].get("culprit_ranks") or [])
    rows: list[tuple[list[int], dict]] = []
    for e in report["ranks"]:
        ev = e["evidence"] or {}
        same = (e["ended"], ev.get("line"), ev.get("text"), e["rank"] in culprits)
        if rows and rows[-1][1]["same"] == same:
            rows[-1][0].append(e["rank"])
            rows[-1][1]["last_ts"] = e["ts"]
        else:
            rows.append(([e["rank"]], {"same": same, "first": e, "last_ts": e["ts"]}))
    out = []
    for ranks, row in rows:
        e, ev = row["first"], row["first"]["evidence"] or {}
        when = (">= " if e.get("ts_inferred") else "") + (e["ts"] or "?")
        if row["last_ts"] != e["ts"]:
            when += f' .. {row["last_ts"]}'
        cls = ' class="culprit"' if e["rank"] in culprits else ""
        who = rank_ranges(ranks) + (f" ({len(ranks)})" if len(ranks) > 1 else "")
        more = f' <span class="muted">(rank {e["rank"]}\'s; the others\' alike)</span>' if len(ranks) > 1 else ""
        out.append(f'<tr{cls}><td class="num">{_e(who)}</td><td><code>{_e(when)}</code></td><td>{_e(e["ended"])}'
                   f'</td><td><code>{_e(ev.get("file"))}:{_e(ev.get("line"))}</code>{more}<br>'
                   f'{_e((ev.get("text") or "")[:200])}</td></tr>')
    return ('<div class="scroll-y"><table id="endings"><col style="width:10%"><col style="width:15%"><col>'
            '<col style="width:38%"><tr><th>rank</th><th>when</th><th>how it ended</th><th>evidence</th></tr>'
            + "".join(out) + "</table></div>")


# --- the collectives grid --------------------------------------------------------------------------------------


def _cell(row: dict | None) -> tuple[str, str, str]:
    """(css class, style, text) of one rank's record at one sequence number."""
    if row is None:
        return "cell missing", "", "\u2014"
    return "cell", f'background:{STATE_COLORS.get(row["state"] or "", "#eee")}', (row["op"] or "?")[:12]


def _collectives(report: dict, series: dict) -> str:
    rows = series.get("grid") or []
    if not rows:
        return '<p class="muted">No collective records (flight recorder, NCCL COLL lines, watchdog) in the logs.</p>'
    names = series.get("group_names") or {}
    columns = sorted({(r["pg"], r["seq_id"]) for r in rows}, key=lambda k: (k[0], k[1]))
    divergent = {(r["pg"], r["first_divergent"]) for r in rows if r["first_divergent"] is not None}
    by_key = {(r["rank"], r["pg"], r["seq_id"]): r for r in rows}
    culprits = set(report["verdict"].get("culprit_ranks") or [])
    folded: dict[tuple, list[int]] = {}
    for rank in sorted({r["rank"] for r in rows}):
        cells = tuple(_cell(by_key.get((rank, pg, seq))) for pg, seq in columns)
        folded.setdefault((rank in culprits, cells), []).append(rank)
    ordered = sorted(folded.items(), key=lambda item: (not item[0][0], item[1][0]))
    groups: list[tuple[str, int]] = []
    for pg, _ in columns:
        if groups and groups[-1][0] == pg:
            groups[-1] = (pg, groups[-1][1] + 1)
        else:
            groups.append((pg, 1))
    group_head = "".join(f'<th colspan="{n}" class="cell">{_e(names.get(pg) or "process group " + pg)}'
                         f'{_e(" (pg " + pg + ")" if names.get(pg) else "")}</th>' for pg, n in groups)
    seq_head = "".join(f'<th class="cell{" divergent" if (pg, seq) in divergent else ""}" '
                       f'title="{_e(names.get(pg) or pg)} sequence {seq}">{_e(pg)}:{seq}</th>' for pg, seq in columns)
    body = []
    for (is_culprit, cells), ranks in ordered:
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)} ({len(ranks)})"
        tds = "".join(f'<td class="{cls}" style="{style}">{_e(text)}</td>' if style else
                      f'<td class="{cls}" title="never issued">{_e(text)}</td>' for cls, style, text in cells)
        row_class = ' class="culprit"' if is_culprit else ""
        body.append(f"<tr{row_class}><th>{_e(label)}</th>{tds}</tr>")
    legend = "".join(f'<span style="background:{c}">{s}</span>' for s, c in STATE_COLORS.items())
    where = ", ".join(f"{names.get(pg) or 'pg ' + pg} at sequence {seq}" for pg, seq in sorted(divergent))
    caption = (f"First divergence: {where}; shown with {8} sequence numbers either side." if where else
               "No divergence between ranks: the last sequence numbers of each group.")
    return (f'<p class="caption">{_e(caption)} Rows: ranks whose records match fold into one row. Sources: flight '
            f'recorder dumps, NCCL COLL lines, watchdog lines.</p>'
            f'<p class="legend">{legend}<span class="missing">never issued</span></p>'
            f'<div class="scroll" id="collectives-box"><table id="collectives"><tr><th rowspan="2">rank \\ group, seq'
            f'</th>{group_head}</tr><tr>{seq_head}</tr>{"".join(body)}</table></div>')


# --- charts ----------------------------------------------------------------------------------------------------


def _nice_ticks(top: float, n: int = 5) -> list[float]:
    """Round axis values from 0 to top: steps of 1, 2, 2.5 or 5 times a power of ten."""
    if top <= 0:
        return [0.0]
    magnitude = 10 ** math.floor(math.log10(top / n))
    step = next(s * magnitude for s in (1, 2, 2.5, 5, 10) if s * magnitude >= top / n)
    return [i * step for i in range(int(top / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.0f}" if v >= 100 or v == int(v) else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _memory_unit(max_bytes: float) -> tuple[str, float]:
    return ("GiB", 2**30) if max_bytes >= 2**30 else ("MiB", 2**20)


def _memory_chart(report: dict, series: dict) -> str:
    points = series.get("memory") or []
    if not points:
        return '<p class="muted">No memory samples per step in the logs.</p>'
    culprits = set(report["verdict"].get("culprit_ranks") or [])
    by_rank: dict[int, list[tuple[int, float]]] = {}
    for p in points:
        by_rank.setdefault(p["rank"], []).append((p["step"], p["allocated_mb"] * 2**20))
    limit = series.get("memory_limit_bytes")
    data_max = max(v for pts in by_rank.values() for _, v in pts)
    show_limit = bool(limit) and limit <= 4 * data_max
    unit, scale = _memory_unit(max(data_max, limit if show_limit else 0))
    top = max(data_max, limit if show_limit else 0) / scale * 1.08
    steps = sorted({s for pts in by_rank.values() for s, _ in pts})
    lines: list[tuple[str, str, list[tuple[float, float]], bool]] = []
    if len(by_rank) <= len(PALETTE):
        for i, (rank, pts) in enumerate(sorted(by_rank.items())):
            color = CULPRIT_COLOR if rank in culprits else PALETTE[i % len(PALETTE)]
            lines.append((f"rank {rank}" + (" (culprit)" if rank in culprits else ""), color,
                          [(s, v / scale) for s, v in sorted(pts)], rank in culprits))
    else:
        per_step: dict[int, list[float]] = {}
        for rank, pts in by_rank.items():
            for s, v in pts:
                per_step.setdefault(s, []).append(v / scale)
        lo = [(s, min(per_step[s])) for s in steps]
        hi = [(s, max(per_step[s])) for s in steps]
        median = [(s, sorted(per_step[s])[len(per_step[s]) // 2]) for s in steps]
        lines.append((f"highest of {len(by_rank)} ranks", "#9ecae1", hi, False))
        lines.append((f"median of {len(by_rank)} ranks", PALETTE[0], median, False))
        lines.append((f"lowest of {len(by_rank)} ranks", "#9ecae1", lo, False))
        for rank in sorted(culprits & set(by_rank))[:4]:
            lines.append((f"rank {rank} (culprit)", CULPRIT_COLOR, [(s, v / scale) for s, v in sorted(by_rank[rank])],
                          True))
    hlines = [(limit / scale, f"device capacity {limit / 2**30:.1f} GiB (from the OOM message)")] if show_limit else []
    chart = _xy_chart(lines, (steps[0], steps[-1]), top, "step", f"allocated ({unit})", hlines)
    caption = ("Memory allocated per rank at each step (the highest sample of the step), from the ranks' memory log "
               "lines and profiler traces (the memory table).")
    if limit and not show_limit:
        caption += f" Device capacity {limit / 2**30:.1f} GiB (from the OOM message) is off this scale."
    return f'<p class="caption">{_e(caption)}</p>{chart}'


def _xy_chart(lines, x_range: tuple[float, float], y_top: float, x_label: str, y_label: str,
              hlines: list[tuple[float, str]] = (), height: int = 280, integer_x: bool = True) -> str:
    left, right, top_pad, bottom = 70, 170, 12, 40
    x0, x1 = x_range
    plot_w, plot_h = CHART_WIDTH - left - right, height - top_pad - bottom
    sx = lambda x: left + (x - x0) / ((x1 - x0) or 1) * plot_w
    sy = lambda y: top_pad + plot_h - y / (y_top or 1) * plot_h
    out = [f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{left + plot_w}" y2="{top_pad + plot_h}" stroke="#666"/>',
           f'<line x1="{left}" y1="{top_pad}" x2="{left}" y2="{top_pad + plot_h}" stroke="#666"/>']
    for v in _nice_ticks(y_top):
        if v > y_top:
            continue
        y = sy(v)
        out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    for v in _nice_ticks(x1 - x0, 8):
        x = sx(x0 + v)
        if x0 + v > x1 or (integer_x and v != int(v)):  # no step 1.5
            continue
        out.append(f'<line x1="{x:.1f}" y1="{top_pad + plot_h}" x2="{x:.1f}" y2="{top_pad + plot_h + 4}" stroke="#666"/>'
                   f'<text x="{x:.1f}" y="{top_pad + plot_h + 16}" text-anchor="middle">{_fmt(x0 + v)}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">{_e(x_label)}</text>'
               f'<text x="14" y="{top_pad + plot_h / 2}" transform="rotate(-90 14 {top_pad + plot_h / 2})" '
               f'text-anchor="middle">{_e(y_label)}</text>')
    for value, label in hlines:
        y = sy(value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="{CULPRIT_COLOR}" '
                   f'stroke-dasharray="6 4"/><text x="{left + 4}" y="{y - 4:.1f}" style="fill:{CULPRIT_COLOR}">'
                   f'{_e(label)}</text>')
    for i, (label, color, pts, bold) in enumerate(lines):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        title = _e(f"{label}: " + ", ".join(f"{_fmt(x)}: {_fmt(y)}" for x, y in pts[:40]))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="{2.5 if bold else 1.5}" points="{path}">'
                   f'<title>{title}</title></polyline>'
                   f'<text x="{left + plot_w + 10}" y="{top_pad + 12 + 14 * i}" style="fill:{color}">{_e(label)}</text>')
    return f'<svg viewBox="0 0 {CHART_WIDTH} {height}" width="{CHART_WIDTH}" height="{height}" role="img">{"".join(out)}</svg>'


def _bar_chart(items: list[tuple[str, float, bool]], unit: str, axis_label: str) -> str:
    """Horizontal bars with a value axis; a marked bar (the straggler, the culprit) is red and says so."""
    if not items:
        return '<p class="muted">Nothing recorded.</p>'
    label_w, row_h, top_pad = 330, 18, 22
    top = max(v for _, v, _ in items) * 1.1 or 1
    plot_w = CHART_WIDTH - label_w - 90
    height = top_pad + row_h * len(items) + 30
    out = [f'<line x1="{label_w}" y1="{top_pad - 4}" x2="{label_w}" y2="{height - 26}" stroke="#666"/>']
    for v in _nice_ticks(top):
        if v > top:
            continue
        x = label_w + v / top * plot_w
        out.append(f'<line x1="{x:.1f}" y1="{top_pad - 4}" x2="{x:.1f}" y2="{height - 26}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{height - 12}" text-anchor="middle">{_fmt(v)}</text>')
    out.append(f'<text x="{label_w + plot_w / 2}" y="12" text-anchor="middle">{_e(axis_label)}</text>')
    for i, (label, value, marked) in enumerate(items):
        y = top_pad + row_h * i
        w = value / top * plot_w
        color = CULPRIT_COLOR if marked else PALETTE[0]
        label_class = ' class="culprit"' if marked else ""
        out.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end"{label_class}>'
                   f'{_e(label[:55])}</text><rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="13" fill="{color}">'
                   f'<title>{_e(label)}: {_fmt(value)} {_e(unit)}</title></rect>'
                   f'<text x="{label_w + w + 4:.1f}" y="{y + 12}">{_fmt(value)} {_e(unit)}'
                   f'{" (straggler)" if marked else ""}</text>')
    return f'<svg viewBox="0 0 {CHART_WIDTH} {height}" width="{CHART_WIDTH}" height="{height}" role="img">{"".join(out)}</svg>'


def _step_chart(report: dict, series: dict) -> str:
    rows = series.get("step_time") or []
    if not rows:
        return '<p class="muted">No step times in the logs (they come from profiler traces\' ProfilerStep spans).</p>'
    straggler = next((f for f in report["findings"] if f["signature"] == "straggler"), None)
    slow = set(straggler["ranks"]) if straggler else set()
    ordered = sorted(rows, key=lambda r: -r["step_ms"])
    shown = ordered if len(ordered) <= 32 else ordered[:24] + [r for r in ordered[24:] if r["rank"] in slow]
    items = [(f'rank {r["rank"]}', round(r["step_ms"], 1), r["rank"] in slow) for r in shown]
    median = sorted(r["step_ms"] for r in rows)[len(rows) // 2]
    caption = (f"Mean step time per rank, slowest first, from the profiler traces' ProfilerStep spans (the kernels "
               f"table); median {median:.1f} ms over {len(rows)} ranks.")
    caption += (f" Straggler: rank {rank_ranges(sorted(slow))} (the straggler finding)." if slow else
                " No straggler finding.")
    if len(shown) < len(rows):
        caption += f" The {len(shown)} slowest of {len(rows)} ranks are drawn."
    return f'<p class="caption">{_e(caption)}</p>{_bar_chart(items, "ms", "mean step time (ms)")}'


def _recompile_chart(series: dict) -> str:
    rows = series.get("recompiles_per_frame") or []
    if not rows:
        return '<p class="muted">No recompiles in the logs.</p>'
    items = [(f'{r["function"]} ({r["where"]})', r["recompiles"], False) for r in rows]
    caption = ("Recompiles per compiled frame on the rank that recompiled it most (ranks listed on hover), from "
               "dynamo's recompile records: TORCH_LOGS=recompiles lines and TORCH_TRACE files, each recompile "
               "counted once (the compiles table).")
    return f'<p class="caption">{_e(caption)}</p>{_bar_chart(items, "recompiles", "recompiles of the frame (count)")}'


def _findings(report: dict) -> str:
    if not report["findings"]:
        return '<p class="muted">No findings.</p>'
    rows = "".join(
        f'<tr><td>{_e(f["role"])}</td><td class="sig">{_e(f["signature"])}</td><td>{_e(f["severity"])}</td>'
        f'<td>{_e(rank_ranges(f["ranks"]))}</td><td>{_e(f["summary"])}</td></tr>' for f in report["findings"])
    return ("<table><tr><th>role</th><th>signature</th><th>severity</th><th>ranks</th><th>summary</th></tr>"
            + rows + "</table>")


def to_html(report: dict) -> str:
    series = report.get("series") or {}
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>postmortem {_e(report["run_id"])}</title>
<style>{CSS}</style></head><body>
{_verdict(report)}
<h2>What each rank was doing</h2>{_timeline(report, series)}
<h2>Run</h2>{_facts(report)}
<h2>How each rank ended, first to end first</h2>{_endings(report)}
<h2>Collectives around the first divergence: which rank stopped where</h2>{_collectives(report, series)}
<h2>Memory per step</h2>{_memory_chart(report, series)}
<h2>Step time per rank</h2>{_step_chart(report, series)}
<h2>Recompiles per frame</h2>{_recompile_chart(series)}
<h2>Findings</h2>{_findings(report)}
<p class="muted">files: {report["files"]["parsed"]} parsed, {report["files"]["skipped"]} skipped &middot;
postmortem {_e(report.get("postmortem_version"))}</p>
</body></html>
"""

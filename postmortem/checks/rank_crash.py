"""rank-crash: the rank that ended first by its own failure, by timestamps.

Not torchrun's "first observed failure": the agent notices ranks in whatever order it
polls them. A rank whose own error blames a peer ("Connection reset by peer", a
collective timeout) is a consequence, never the culprit.
"""

from __future__ import annotations

import re
from collections import defaultdict

import duckdb

from postmortem.ranges import rank_ranges
from postmortem.summary import PEER_CAUSED

from .common import endings as rank_endings

_FATAL_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"}


def _case(ending: dict) -> str:
    if ending["signal"] == "SIGKILL":
        return "sigkill"
    if ending["signal"] in _FATAL_SIGNALS:
        return "native"
    if ending["ended"].startswith("exit "):
        return "exit"  # an exit code and nothing of the error itself
    if "Error" in ending["ended"] or "Exception" in ending["ended"] or "exit" in ending["ended"]:
        return "exception"
    return "default"


def _user_line(con: duckdb.DuckDBPyConnection, run_id: str, evidence: dict | None) -> str | None:
    if not evidence or evidence.get("file") is None:
        return None
    row = con.execute(
        """
        SELECT attrs->>'user_frame' FROM events
        WHERE run_id = ? AND file = ? AND line_no = ? AND attrs->>'user_frame' IS NOT NULL LIMIT 1
        """, [run_id, evidence["file"], evidence["line"]]).fetchall()
    return row[0][0] if row else None


def _grouped(endings: list[dict]) -> str:
    """How the other ranks ended, alike ones together: "ranks 0, 2-511: RuntimeError: ... by peer"."""
    if not endings:
        return "no other rank failed"
    groups: dict[str, list[int]] = defaultdict(list)
    for e in endings:
        # ports, pids and addresses differ between ranks that ended the same way
        groups[re.sub(r"\d+", "N", e["ended"][:100])].append(e["rank"])
    parts = []
    for _, ranks in sorted(groups.items(), key=lambda g: min(g[1])):
        first = next(e for e in endings if e["rank"] == ranks[0])
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"
        ended = first["ended"] if len(first["ended"]) <= 160 else first["ended"][:159] + "…"
        parts.append(f"{who}: {ended}")
    return "; ".join(parts)


def _rankless(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """In logs that name no rank at all (an excerpt, a launcher's console of unprefixed workers),
    the first uncaught exception that is not a peer's consequence: a process died of it, which
    rank it was the logs do not say."""
    ((ranks,),) = con.execute("SELECT ranks_seen FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if ranks:
        return []
    for file, line, message, user_frame in con.execute(
        """
        SELECT file, line_no, message, attrs->>'user_frame' FROM events
        WHERE run_id = ? AND kind = 'exception' AND rank IS NULL ORDER BY file, line_no
        """, [run_id]).fetchall():
        if not PEER_CAUSED.search(message or ""):
            return [{"rank": None, "ts": None, "file": file, "line": line, "text": message, "culprit": True,
                     "who": "a process the logs name no rank for", "how": message.rstrip("."), "case": "exception",
                     "user_line": user_frame or "unknown", "others": "no other rank is named",
                     "confidence": 0.6}]
    return []


def check(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    endings = rank_endings(con, run_id)
    failed = [e for e in endings if e["ended"] != "no failure recorded"]
    if not endings:
        return _rankless(con, run_id)
    if not failed or failed[0]["consequence"]:
        return []
    first, others = failed[0], failed[1:]
    ev = first["evidence"] or {}
    rows = [{
        "rank": first["rank"], "ts": first["ts"], "file": ev.get("file"), "line": ev.get("line"),
        "text": ev.get("text"), "culprit": True, "who": f"rank {first['rank']}", "how": first["ended"],
        "case": _case(first),
        "signal": first["signal"], "pid": first["pid"], "host": first["host"],
        "user_line": _user_line(con, run_id, ev) or "unknown",
        "others": _grouped(others),
        "confidence": 0.9 if others else 0.75,
    }]
    for o in others:
        oev = o["evidence"] or {}
        rows.append({"rank": o["rank"], "ts": o["ts"], "file": oev.get("file"), "line": oev.get("line"),
                     "text": oev.get("text"), "culprit": False})
    return rows

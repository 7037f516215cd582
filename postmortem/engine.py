"""The signature engine: run every signature over a run's tables, then rank what matched.

A signature's SQL queries (or its named Python check) return evidence rows with the
columns ``rank, ts, file, line, text`` and any extra columns its templates use; a
``culprit`` column, when present, says which rows name the culprit ranks. A signature
matches when any evidence row comes back.

Ranking: a root cause that ``refines`` another (``native-crash`` refines ``rank-crash``)
and shares a culprit rank turns the other into context; root causes ``explain`` the
symptoms they list. The verdict is the surviving root cause with the highest severity
and confidence; with none, the most severe symptom.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import logging
import re
import string
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .catalog import SEVERITIES, Signature
from .checks import Busy, defer_when_busy, shared_results
from .errors import PostmortemError
from .ranges import rank_ranges

if TYPE_CHECKING:  # (DuckDB is imported where it is used: store's docstring says why)
    import duckdb

log = logging.getLogger(__name__)

QUERY_TIMEOUT_S = 30.0
MAX_EVIDENCE = 20


@dataclass
class Finding:
    signature: str
    role: str
    severity: str
    confidence: float
    ranks: list[int]
    summary: str
    evidence: list[dict]
    remediation: str
    refines: list[str] = field(default_factory=list)
    explains: list[str] = field(default_factory=list)
    user_line: str | None = None  # the user's source line (file:line) the evidence names, where it names one
    evidence_kind: str | None = None  # the strongest kind of file its evidence comes from (calibration.py)

    def row(self) -> dict:
        return {"signature": self.signature, "role": self.role, "severity": self.severity,
                "confidence": round(self.confidence, 2), "ranks": self.ranks, "summary": self.summary,
                "evidence": json.dumps(self.evidence, default=str), "remediation": self.remediation,
                "user_line": self.user_line, "evidence_kind": self.evidence_kind}


class _Template(string.Formatter):
    """str.format with plain names only: a template can't reach attributes or items."""

    def get_field(self, field_name, args, kwargs):
        if not field_name.isidentifier():
            raise ValueError(f"template field {field_name!r} must be a plain name")
        value = kwargs.get(field_name)
        return ("?" if value is None else value), field_name


# An optional part of a template, [[ like this: {field} ]]: written only where every field in it is
# known, so that an excerpt without ranks or a traceback reads "CUDA out of memory: ..." rather
# than "rank(s) unknown ran out of CUDA memory at unknown: ...".
_OPTIONAL = re.compile(r"\[\[(.*?)\]\]", re.S)
_UNKNOWN = ("", "unknown", "?")


def _known(value) -> bool:
    return value is not None and not (isinstance(value, str) and value.strip() in _UNKNOWN)


def _optional_parts(template: str, values: dict) -> str:
    def part(m: re.Match) -> str:
        fields = [name for _, name, _, _ in string.Formatter().parse(m[1]) if name]
        return m[1] if all(_known(values.get(name)) for name in fields) else ""
    return _OPTIONAL.sub(part, template)


def render(template: str, values: dict) -> str:
    # TOML's multi-line strings wrap at the author's width: a single newline is a space,
    # a blank line a paragraph break.
    template = re.sub(r"(?<!\n)\n(?!\n)", " ", template.strip())
    try:
        return _Template().format(_optional_parts(template, values), **values).strip()
    except (ValueError, IndexError, KeyError) as exc:
        return f"{template.strip()} (template error: {exc})"


class Refused(PostmortemError):
    """A signature reached for something besides the run's tables (a file, a URL, an extension, a write)."""


def _select_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    import duckdb

    statements = con.extract_statements(sql)
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise Refused("a signature query must be a single SELECT over the run's tables")


def _run_query(con: duckdb.DuckDBPyConnection, sql: str, run_id: str, timeout_s: float) -> list[dict]:
    import duckdb

    _select_only(con, sql)
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        params = {"run_id": run_id} if "$run_id" in sql else None
        try:
            cur = con.execute(sql, params) if params else con.execute(sql)
        except duckdb.PermissionException as exc:  # the connection is sandboxed (store.sandbox)
            raise Refused(f"it reached outside the run's tables ({str(exc).splitlines()[0]})") from exc
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        timer.cancel()


def _run_check(con: duckdb.DuckDBPyConnection, name: str, run_id: str) -> list[dict]:
    if not name.isidentifier():
        raise ValueError(f"check {name!r} is not a check name")
    module = importlib.import_module(f"postmortem.checks.{name}")  # built-in checks only
    return module.check(con, run_id)


def evidence_rows(con: duckdb.DuckDBPyConnection, sig: Signature, run_id: str,
                  timeout_s: float | None = None) -> list[dict]:
    timeout_s = QUERY_TIMEOUT_S if timeout_s is None else timeout_s
    rows: list[dict] = []
    if sig.check:
        rows += _run_check(con, sig.check, run_id)
    for sql in sig.queries:
        rows += _run_query(con, sql, run_id, timeout_s)
    return rows


def _confidence(sig: Signature, rows: list[dict]) -> float:
    for r in rows:
        if r.get("confidence") is not None:
            return float(r["confidence"])
    return sig.confidence


def to_finding(sig: Signature, rows: list[dict]) -> Finding:
    culprits = [r for r in rows if r.get("culprit", True)]
    ranks = sorted({int(r["rank"]) for r in culprits if r.get("rank") is not None})
    first = culprits[0] if culprits else rows[0]
    values = {k: v for k, v in first.items()}
    values.update(ranks=rank_ranges(ranks) or "unknown", n=len(culprits), n_ranks=len(ranks),
                  all_ranks=rank_ranges([int(r["rank"]) for r in rows if r.get("rank") is not None]))
    evidence = [{"rank": r.get("rank"), "file": r.get("file"), "line": r.get("line"),
                 "ts": str(r["ts"]) if r.get("ts") is not None else None,
                 "text": (str(r["text"])[:500] if r.get("text") is not None else None)}
                for r in rows[:MAX_EVIDENCE]]
    remediation = sig.remediation
    if isinstance(remediation, dict):
        remediation = remediation.get(str(first.get("case")), remediation.get("default", ""))
    return Finding(signature=sig.id, role=sig.role, severity=sig.severity, confidence=_confidence(sig, rows),
                   ranks=ranks, summary=render(sig.summary or sig.title, values),
                   evidence=evidence, remediation=render(remediation, values),
                   refines=list(sig.refines), explains=list(sig.explains), user_line=_user_line(culprits or rows))


_USER_LINE = re.compile(r"[^\s:()\[\]]+\.py:\d+")


def _user_line(rows: list[dict]) -> str | None:
    """The first file:line a row's ``user_line`` column names ("train.py:185 in fetch_batch",
    not "unknown"): the user's own line the verdict points at."""
    for r in rows:
        m = _USER_LINE.search(str(r.get("user_line") or ""))
        if m:
            return m[0]
    return None


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Set roles (a refined root cause becomes context) and order: verdict first."""
    roots = [f for f in findings if f.role == "root_cause"]
    for specific in roots:
        # the ranks the specific finding speaks of: its culprits, and the others its evidence names
        # (a collective mismatch blames the rank with the odd size; the rank that crashed first
        # raising the mismatch is in its evidence: that crash is the mismatch, not another cause)
        seen = set(specific.ranks) | {e["rank"] for e in specific.evidence if e.get("rank") is not None}
        for general in roots:
            if general.signature in specific.refines and (
                not general.ranks or not specific.ranks or set(general.ranks) & seen
            ):
                general.role = "context"
    for root in roots:
        if root.role != "root_cause":
            continue
        for f in findings:
            if f.role == "symptom" and f.signature in root.explains:
                f.summary += f" (explained by {root.signature} on rank(s) {', '.join(map(str, root.ranks))})"
    order = {"root_cause": 0, "symptom": 1, "context": 2}
    return sorted(findings, key=lambda f: (order.get(f.role, 3), -SEVERITIES.index(f.severity), -f.confidence,
                                           f.signature))


def match(con: duckdb.DuckDBPyConnection, run_id: str, signatures: list[Signature],
          problems: list[tuple[str, str]] | None = None,
          calibrate: Callable[[Finding], None] | None = None) -> list[Finding]:
    """Every signature that matches the run, ranked. A signature that fails is reported, not fatal.
    ``calibrate`` sets each finding's fitted confidence before the ranking reads it."""
    found = []
    with shared_results():
        for sig, rows, exc in _evidence_of_each(con, run_id, signatures):
            if isinstance(exc, Refused):  # not broken but hostile: the analysis stops and says which file
                raise PostmortemError(f"Signature {sig.origin} ({sig.id}) was refused: {exc}.") from exc
            if exc is not None:  # a broken user signature must not stop the others
                log.warning("signature %s failed: %s", sig.id, exc)
                if problems is not None:
                    problems.append((sig.origin if sig.origin != "built-in" else sig.id, f"failed: {exc}"))
                continue
            if rows:
                found.append(to_finding(sig, rows))
    for finding in found if calibrate else ():
        calibrate(finding)
    return rank_findings(found)


# Signatures queried at once: DuckDB runs a query without the GIL, so one signature's Python (a
# check's loops, planning) runs beside another's query (the 64-rank job's 20: 0.30 -> 0.21 s).
MATCH_THREADS = 2


def _evidence_of_each(con: duckdb.DuckDBPyConnection, run_id: str,
                      signatures: list[Signature]) -> Iterator[tuple[Signature, list[dict] | None, Exception | None]]:
    """Each signature's evidence rows, or what it raised, in the signatures' order: each on a
    cursor of its own (a connection to the same database, sandboxed as it is), in the caller's
    context (``shared_results``). One whose check asks for a shared value that another is computing
    (``checks.Busy``) goes back behind the signatures not begun, which run meanwhile; once none is
    left to begin, it waits for the value."""
    context = contextvars.copy_context()
    pool = ThreadPoolExecutor(MATCH_THREADS, thread_name_prefix="signature")
    lock = threading.Lock()
    futures: list[Future] = []
    waiting = len(signatures)  # handed to the pool and not begun

    def of(i: int, sig: Signature) -> tuple[Signature, list[dict] | None, Exception | None] | None:
        nonlocal waiting
        with lock:
            waiting -= 1
            others = waiting > 0
        run = context.copy()
        if others:
            run.run(defer_when_busy)
        cursor = con.cursor()
        try:
            return sig, run.run(evidence_rows, cursor, sig, run_id), None
        except Busy:
            with lock:
                waiting += 1
                futures[i] = pool.submit(of, i, sig)
            return None  # (its result is the new future's)
        except Exception as exc:  # (told apart by the caller, in the signatures' order)
            return sig, None, exc
        finally:
            cursor.close()

    try:
        with lock:
            futures += [pool.submit(of, i, sig) for i, sig in enumerate(signatures)]
        for i in range(len(signatures)):
            while (result := futures[i].result()) is None:
                pass
            yield result
    finally:  # (a refused signature stops the matching: the ones not begun are not run)
        pool.shutdown(cancel_futures=True)


def verdict(findings: list[Finding]) -> Finding | None:
    roots = [f for f in findings if f.role == "root_cause"]
    if roots:
        return roots[0]
    symptoms = [f for f in findings if f.role == "symptom" and f.severity in ("error", "critical")]
    return symptoms[0] if symptoms else None

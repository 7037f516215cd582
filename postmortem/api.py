"""The Python API that the CLI and job schedulers both call.

    from postmortem import analyze
    report = analyze("/jobs/1234/logs")      # the JSON report's structure, as a dict
    report["verdict"]["summary"]

Data flows one way: discover -> parse -> load (staging DuckDB) -> match -> summarize -> persist;
the steps live in ``pipeline``, this module is their public face.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from . import calibration, catalog, engine, pipeline, store, summary
from . import discover as discovery
from .errors import PostmortemError
from .pipeline import Progress, exit_status, load  # noqa: F401  (public: the CLI, watch and rerun call them)

if TYPE_CHECKING:  # (DuckDB is imported where it is used: store's docstring says why)
    import duckdb

log = logging.getLogger(__name__)

def reusable_run(path: str | Path, db: str | Path | None = None, signatures: str | Path | None = None,
                 limits: discovery.Limits = discovery.Limits()) -> str | None:
    """A run in history made from the same files by the same analyzer, if there is one:
    showing it takes a fraction of a second, analyzing again gives the same report."""
    history = Path(db) if db else store.default_db_path()
    if not history.is_file():
        return None
    found = discovery.discover(Path(path), limits)
    con = store.open_history(history)
    try:
        rows = con.execute("SELECT run_id FROM runs WHERE source_dir = ? AND fingerprint = ? "
                           "ORDER BY analyzed_at DESC LIMIT 1", [str(found.root), pipeline.run_fingerprint(found, signatures)])
        return next(iter(rows.fetchall()), [None])[0]
    finally:
        con.close()


def ingest(
    path: str | Path,
    db: str | Path | None = None,
    progress: Progress | None = None,
    keep: bool = True,
    signatures: str | Path | None = None,
    fail_on: str = "error",
    limits: discovery.Limits = discovery.Limits(),
    labels: dict[str, str] | None = None,
    parquet: str | Path | None = None,
) -> tuple[duckdb.DuckDBPyConnection, str, discovery.Discovery]:
    """Load a log directory, match the signatures, and persist it all to history when ``keep``
    (and as Parquet under ``parquet``, the scale-out path: one tree written by every node).

    Returns the staging connection, the run id and what discovery found.
    """
    con, run_id, found = load(path, progress, limits, labels)
    con.execute("UPDATE runs SET fingerprint = ? WHERE run_id = ?",
                [pipeline.run_fingerprint(found, signatures), run_id])
    pipeline.match(con, run_id, signatures, fail_on)
    if parquet is not None:
        store.export_parquet(con, Path(parquet), run_id)
    if keep:
        store.persist(con, Path(db) if db else store.default_db_path(), run_id)
    return con, run_id, found


def analyze(path: str | Path, with_series: bool = False, **options) -> dict:
    """Analyze a job's log directory: the report dict of DESIGN.md's JSON contract.

    ``options`` are ingest's (db, progress, keep, signatures, fail_on, limits, labels,
    parquet); ``with_series`` adds the per-step series the HTML report draws.
    """
    con, run_id, _ = ingest(path, **options)
    try:
        report = summary.report(con, run_id)
        if with_series:
            report["series"] = summary.series(con, run_id)
    finally:
        con.close()  # (the staging database: what spilled to its temporary files goes with it)
    return report


def test_signature(signature_file: str | Path, path: str | Path) -> tuple[catalog.Signature, list[dict]]:
    """Run one signature file against a log directory: (the signature, its evidence rows)."""
    file = Path(signature_file)
    try:
        sig = catalog.parse_signature(file.read_text(encoding="utf-8"), str(file))
    except OSError as exc:
        raise PostmortemError(f"Cannot read {file}: {exc.strerror}") from exc
    except ValueError as exc:
        raise PostmortemError(f"{file} is not a valid signature: {exc}") from exc
    con, run_id, _ = load(path)
    store.sandbox(con)
    try:
        rows = engine.evidence_rows(con, sig, run_id)
    except engine.Refused as exc:
        raise PostmortemError(f"{file} was refused: {exc}.") from exc
    except Exception as exc:
        raise PostmortemError(f"{file} failed on {path}: {exc}") from exc
    return sig, rows


def show(run_id: str, db: str | Path | None = None, with_series: bool = False) -> dict:
    """The report of a run already in history (a unique prefix of its id is enough)."""
    con = store.open_history(Path(db) if db else store.default_db_path())
    run_id = _resolve_run(con, run_id)
    report = summary.report(con, run_id)
    if with_series:
        report["series"] = summary.series(con, run_id)
    return report


def runs(db: str | Path | None = None, limit: int = 50) -> list[dict]:
    con = store.open_history(Path(db) if db else store.default_db_path())
    cur = con.execute(
        "SELECT run_id, analyzed_at, source_dir, world_size, verdict, exit_status FROM runs "
        "ORDER BY analyzed_at DESC LIMIT ?", [limit])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def query(sql: str, db: str | Path | None = None, write: bool = False,
          parquet: str | Path | None = None) -> tuple[list[str], list[tuple]]:
    """Run SQL over the history (read-only unless ``write``), or over a Parquet tree."""
    import duckdb

    if parquet is not None:
        con = store.parquet_history(Path(parquet))
    else:
        con = store.sandbox(store.open_history(Path(db) if db else store.default_db_path(), write=write))
    try:
        cur = con.execute(sql)
        if cur.description is None:
            return [], []
        return [d[0] for d in cur.description], cur.fetchall()
    except duckdb.PermissionException as exc:
        raise PostmortemError("Refused: postmortem sql reaches only the history's tables, not files, URLs or "
                              f"extensions ({str(exc).splitlines()[0]}).") from exc
    except duckdb.Error as exc:
        raise PostmortemError(f"SQL error: {str(exc).splitlines()[0]}") from exc
    finally:
        con.close()  # DuckDB shares one instance per file in a process: a locked one must not outlive the query


def scenario_dirs(paths: list[str | Path]) -> list[Path]:
    """The scenario folders (holding expected.json) among ``paths`` and their children."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / "expected.json").is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(c for c in p.iterdir() if (c / "expected.json").is_file())
        else:
            raise PostmortemError(f"No such directory: {p}")
    if not found:
        raise PostmortemError("No scenario folders (with expected.json) in " + ", ".join(map(str, paths)))
    return found


def _same_line(expected: str, got: str | None) -> bool:
    """Whether the verdict's user line is the expected one: the same file:line, the path of
    either side possibly longer ("train.py:185" and "/job/src/train.py:185")."""
    if not got:
        return False
    return got == expected or got.endswith("/" + expected) or expected.endswith("/" + got)


def evaluate(paths: list[str | Path]) -> list[dict]:
    """Analyze each scenario folder and compare the verdict with its expected.json, strictly:

    - the verdict's signature is the expected root cause; a benign scenario (root cause null)
      has no finding at warning or above;
    - where the scenario names culprits (a non-empty ``culprit_ranks``), the verdict's set is
      that set; a scenario that names none is not counted for culprits (``culprit_ok`` None);
    - where it names a ``user_line``, it is the verdict's own user line (``line_ok`` None if none).
    """
    rows = []
    for scenario in scenario_dirs(paths):
        try:
            expected = json.loads((scenario / "expected.json").read_text())
        except (OSError, ValueError) as exc:
            raise PostmortemError(f"{scenario}/expected.json is not readable JSON: {exc}") from exc
        report = analyze(scenario, keep=False)
        got = report["verdict"]
        want_ranks = expected.get("culprit_ranks") or []
        want_line = expected.get("user_line")
        benign = expected.get("root_cause") is None
        quiet_ok = not benign or not any(
            f["severity"] in ("warning", "error", "critical") for f in report["findings"])
        guess_ok = got["signature"] == expected.get("root_cause") and quiet_ok
        root_ok = guess_ok and not got.get("cannot_tell")  # "cannot tell: perhaps X" is not a verdict of X
        culprit_ok = sorted(got["culprit_ranks"] or []) == sorted(want_ranks) if want_ranks else None
        line_ok = _same_line(want_line, got.get("user_line")) if want_line else None
        rows.append({
            "scenario": scenario.name, "expected": expected.get("root_cause"), "found": got["signature"],
            "benign": benign, "expected_ranks": want_ranks, "found_ranks": got["culprit_ranks"],
            "user_line": want_line, "found_line": got.get("user_line"),
            "guess_ok": guess_ok, "root_ok": root_ok, "culprit_ok": culprit_ok, "line_ok": line_ok,
            "ok": root_ok and culprit_ok is not False and line_ok is not False,
            "confidence": got["confidence"], "evidence_kind": got.get("evidence_kind"),
            "cannot_tell": got.get("cannot_tell", False),
        })
    return rows


def fit_confidence(rows: list[dict], out: str | Path, corpus: list[str]) -> list[dict]:
    """Write the calibration table fitted on ``evaluate``'s rows to ``out``; returns the
    reliability table of the fit judged leave-one-out (each scenario by a fit without it).

    A verdict is right when its signature is the expected one and, where the scenario names
    culprits, so is its culprit set (a "cannot tell: perhaps X" is judged as X: the fit is of
    how often X from such evidence is right); scenarios with no verdict teach nothing here."""
    outcomes = [calibration.Outcome(r["scenario"], r["found"], r["evidence_kind"] or "text_log",
                                    bool(r["guess_ok"] and r["culprit_ok"] is not False))
                for r in rows if r["found"]]
    Path(out).write_text(calibration.to_toml(calibration.tally(outcomes), corpus), encoding="utf-8")
    own = {s.id: s.confidence for s in catalog.load_all()[0]}
    return calibration.reliability(calibration.leave_one_out(outcomes, own))


def eval_counts(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """(right, counted) for each figure ``postmortem eval`` prints: the top-1 verdict of the failure
    scenarios, the culprit set where one is named, the user line where one is named, the benign
    scenarios left clean, and every scenario right on all it names."""
    failures = [r for r in rows if not r["benign"]]
    benign = [r for r in rows if r["benign"]]
    named = [r for r in rows if r["culprit_ok"] is not None]
    lines = [r for r in rows if r["line_ok"] is not None]
    return {
        "top-1": (sum(r["root_ok"] for r in failures), len(failures)),
        "culprit": (sum(r["culprit_ok"] for r in named), len(named)),
        "user line": (sum(r["line_ok"] for r in lines), len(lines)),
        "benign clean": (sum(r["root_ok"] for r in benign), len(benign)),
        "all correct": (sum(r["ok"] for r in rows), len(rows)),
    }


def history(question: str, db: str | Path | None = None, since: str | None = None,
            run: str | None = None, other: str | None = None):
    """Cross-run questions over the history: 'hosts', 'signatures' or 'compare' (run vs other)."""
    from . import history as hist

    con = store.open_history(Path(db) if db else store.default_db_path())
    if question == "hosts":
        return hist.hosts(con, hist.parse_since(since))
    if question == "signatures":
        return hist.signatures(con, hist.parse_since(since))
    return hist.compare(con, _resolve_run(con, run), _resolve_run(con, other))


def _resolve_run(con: duckdb.DuckDBPyConnection, run_id: str | None) -> str:
    matches = [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE starts_with(run_id, ?) ORDER BY run_id", [run_id or ""]).fetchall()]
    if not matches:
        raise PostmortemError(f"No run {run_id!r} in the history; `postmortem runs` lists them.")
    if len(matches) > 1:
        raise PostmortemError(f"{run_id!r} matches {len(matches)} runs ({', '.join(matches[:5])}); give more of the id.")
    return matches[0]


def export(out: str | Path, db: str | Path | None = None) -> dict[str, int]:
    """Every run in the history as hive-partitioned Parquet under ``out``."""
    con = store.open_history(Path(db) if db else store.default_db_path())
    return store.export_parquet(con, Path(out))


def ingest_node(path: str | Path, parquet: str | Path, job: str | None = None, node: str | None = None,
                **options) -> tuple[str, str, str, dict[str, int]]:
    """One node's logs of a multi-node job into the shared Parquet tree, as that node's partition
    (job.ingest_node; ``options`` are db, keep, labels, limits, progress): (run id, job, node, rows)."""
    from . import job as jobs

    return jobs.ingest_node(path, parquet, job, node, **options)


def analyze_job(parquet: str | Path, job_id: str, db: str | Path | None = None, keep: bool = True,
                signatures: str | Path | None = None, fail_on: str = "error", nodes: list[str] | None = None,
                with_series: bool = False) -> dict:
    """Analyze a multi-node job from every node's partition of the Parquet tree (job.py): the same
    report as ``analyze`` of one directory, with the job's nodes and clocks."""
    from . import job as jobs

    run_id = pipeline.new_run_id()
    con, assembled = jobs.analyze(parquet, job_id, run_id, signatures, fail_on, nodes)
    if keep:
        store.persist(con, Path(db) if db else store.default_db_path(), run_id)
    report = jobs.report(con, run_id, assembled)
    if with_series:
        report["series"] = summary.series(con, run_id)
    return report

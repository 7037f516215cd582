"""A multi-node job: each node's rows in a shared Parquet tree, joined back into one run.

Each node's epilog parses only its own logs (`postmortem ingest DIR --parquet ROOT --job ID`)
and writes them under ``ROOT/<table>/date=…/job=ID/node=NAME/`` (store.export_node). Analyzing
the job (`postmortem analyze --parquet ROOT --job ID`) reads every node's partition in place
(store.job_tables), makes one run of them in a staging database, corrects each node's clock,
and then matches the signatures exactly as `analyze DIR` does.

Clocks: hosts disagree by seconds. A node's offset against the reference node (the one holding
the lowest rank) is read from moments that are one moment on every rank, each printed by its
own host's clock, for example the same step's line on two nodes

    gpu-00: 2026-11-29 15:55:08,881 [rank0] step 1 loss 0.9865 step_time 0.085s mem_alloc_mb 401.3
    gpu-01: 2026-11-29 15:55:38,884 [rank1] step 1 loss 1.0311 step_time 0.057s mem_alloc_mb 401.7

(gpu-01 is 30.0 s ahead), the end of a collective that completed on every rank (flight
recorder), and the watchdog timeouts of one sequence number. The offset is the median of the
differences; its uncertainty is what the kind of moment allows (a synchronous step ends on every
rank within about one step) or the spread of the differences, whichever is larger.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import duckdb

from . import catalog, engine, store, summary
from .errors import PostmortemError
from .pipeline import calibrator, exit_status, load
from .ranges import rank_ranges
from .schema import TABLES

# A finding of its own says how the job was put together: its nodes, their clocks, who is missing.
JOB_SIGNATURE = "multi-node-job"

# Each kind of moment, and the least uncertainty it has whatever its spread says (seconds):
# ProcessGroupNCCL's watchdog notices a completion on its next poll (every 100 ms); a watchdog
# timeout fires a timeout after each rank *entered* the collective, which ranks do up to a step apart.
ANCHOR_FLOOR_S = {"completed collectives": 0.1, "step lines": 0.0, "watchdog timeouts": 1.0}

# One row per (kind of moment, key, rank): the moment as the rank's host printed it. The node of
# a row is the first part of its file's path (assemble() prefixes every path with its node).
ANCHORS_SQL = """
    SELECT 'step lines' AS basis, 'step ' || step AS key, rank, split_part(file, '/', 1) AS node, ts
    FROM memory WHERE source = 'log' AND step IS NOT NULL AND ts IS NOT NULL AND rank IS NOT NULL
    UNION ALL
    SELECT 'completed collectives', 'pg ' || pg || ' seq ' || seq_id, rank, split_part(file, '/', 1), t_completed
    FROM collectives WHERE source = 'flight_recorder' AND state = 'completed' AND t_completed IS NOT NULL
      AND seq_id IS NOT NULL AND rank IS NOT NULL
    UNION ALL
    SELECT 'watchdog timeouts', 'pg ' || coalesce(pg, '?') || ' seq ' || seq_id, rank, split_part(file, '/', 1),
           t_created
    FROM collectives WHERE source = 'watchdog' AND state = 'timed_out' AND t_created IS NOT NULL
      AND seq_id IS NOT NULL AND rank IS NOT NULL
"""

# Per node and kind of moment: the differences against the reference node, key by key (the
# median over each node's ranks), and how long a step takes there (consecutive step lines).
OFFSETS_SQL = """
    WITH anchors AS (SELECT * FROM ({anchors}) WHERE node IN (SELECT node FROM _rank_node)),
    per_node AS (
        SELECT basis, key, node, median(epoch_us(ts)) AS t_us FROM anchors GROUP BY ALL
    ),
    diffs AS (
        SELECT n.node, n.basis, n.key, (n.t_us - r.t_us) / 1e6 AS d_s
        FROM per_node n JOIN per_node r ON r.basis = n.basis AND r.key = n.key AND r.node = $ref
        WHERE n.node <> $ref
    ),
    steps AS (
        SELECT node, median(gap_s) AS step_s FROM (
            SELECT split_part(file, '/', 1) AS node,
                   (epoch_us(ts) - lag(epoch_us(ts)) OVER w) / 1e6 / (step - lag(step) OVER w) AS gap_s
            FROM memory WHERE source = 'log' AND step IS NOT NULL AND ts IS NOT NULL AND rank IS NOT NULL
            WINDOW w AS (PARTITION BY rank, file ORDER BY step, ts))
        WHERE gap_s > 0 GROUP BY node
    )
    SELECT d.node, d.basis, count(*) AS moments, median(d.d_s) AS offset_s,
           max(abs(d.d_s - (SELECT median(x.d_s) FROM diffs x WHERE x.node = d.node AND x.basis = d.basis)))
               AS spread_s,
           greatest(any_value(s.step_s), any_value(r.step_s)) AS step_s
    FROM diffs d LEFT JOIN steps s ON s.node = d.node LEFT JOIN steps r ON r.node = $ref
    GROUP BY d.node, d.basis
"""


@dataclass
class Clock:
    """A node's clock against the reference node's: the offset (seconds it is ahead), its uncertainty
    and what it was read from; offset None when nothing was seen at one moment on both."""
    node: str
    offset_s: float | None = None
    uncertainty_s: float | None = None
    basis: str | None = None
    moments: int = 0

    @property
    def corrected(self) -> bool:
        """Whether times are shifted: only by an offset larger than its own uncertainty."""
        return self.offset_s is not None and abs(self.offset_s) > self.uncertainty_s


@dataclass
class Job:
    """What assemble() learned putting the job together."""
    job_id: str
    reference: str | None
    ranks_by_node: dict[str, list[int]]
    clocks: dict[str, Clock]
    missing_ranks: list[int] = field(default_factory=list)
    missing_nodes: list[str] = field(default_factory=list)


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list into names: 'gpu-[00-02,07],login1' -> gpu-00, gpu-01, gpu-02, gpu-07, login1."""
    names = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", nodelist):
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if high and low.isdigit() and high.isdigit():
                names += [f"{prefix}{n:0{len(low)}d}{suffix}" for n in range(int(low), int(high) + 1)]
            else:
                names.append(prefix + low + suffix)
    return [n.strip() for n in names if n.strip()]


def job_id_of(given: str | None, labels: dict[str, str], from_logs: str | None) -> str:
    """The job id: --job, else the scheduler's (SLURM_JOB_ID; a Kubeflow PyTorchJob's namespace/name;
    TORCHELASTIC_RUN_ID), else torchrun's rendezvous id from its --log-dir layout."""
    kubeflow = "/".join(p for p in (labels.get("namespace"), labels.get("job_name")) if p) if labels.get(
        "pod") else None
    job = given or labels.get("job_id") or kubeflow or labels.get("torchelastic_run_id") or from_logs
    if not job:
        raise PostmortemError("No job id: pass --job ID, or --scheduler-env inside a Slurm or Kubeflow job, "
                              "or logs in torchrun's --log-dir layout (its rendezvous id names the job).")
    return job


def ingest_node(path: str | Path, root: str | Path, job: str | None = None, node: str | None = None,
                labels: dict[str, str] | None = None, db: str | Path | None = None, keep: bool = False,
                **load_options) -> tuple[str, str, str, dict[str, int]]:
    """Parse one node's logs and write them as that node's partition of the job under ``root``
    (replacing an earlier ingest of the same node); with ``keep`` the node's run lands in the
    history too. No signature runs here: the verdict is the whole job's.
    Returns (run id, job id, node, rows per table)."""
    labels = dict(labels or {})
    con, run_id, _ = load(path, labels=labels, **load_options)
    from_logs = con.execute("SELECT job_id FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    job = job_id_of(job, labels, from_logs)
    node = node or labels.get("node") or labels.get("pod") or socket.gethostname()
    labels.update(job_id=job, node=node)
    con.execute("UPDATE runs SET job_id = ?, labels = ? WHERE run_id = ?",
                [job, json.dumps(labels, sort_keys=True), run_id])
    written = store.export_node(con, Path(root), run_id, job, node)
    if keep:
        store.persist(con, Path(db) if db else store.default_db_path(), run_id)
    return run_id, job, node, written


def _columns(table: str) -> list[str]:
    return [c for c, _, _ in TABLES[table]]


def _is_log_path(table: str, column: str) -> bool:
    """Whether a column names the log file a row came from (stacks.file is a frame's source file,
    stacks.origin the log it was dumped in)."""
    return (table, column) in (("files", "path"), ("stacks", "origin")) or (column == "file" and table != "stacks")


# The launcher's own records about a worker, which stay wherever the launcher printed them.
LAUNCHER_ROWS = {"events": "kind NOT IN ('agent_signal', 'agent_failure', 'torchrun_failure')",
                 "failures": "source <> 'torchrun'"}


def _drop_relayed_lines(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """A rank's lines in a file of many ranks on another node (a scheduler's merged job output,
    srun's or torchrun's console on the first node) are copies of its own files on its node: read
    from those only, as discovery does within one directory. The launcher's records stay; so do
    the lines of a rank whose node kept no log of it (only its flight-recorder dump, say)."""
    con.execute("""CREATE OR REPLACE TEMP TABLE _own_files AS
                   SELECT DISTINCT rank, split_part(path, '/', 1) AS node FROM files
                   WHERE run_id = $1 AND rank IS NOT NULL AND kind = 'text_log'""",
                [run_id])
    for table in ("events", "failures", "compiles", "collectives", "rank_status", "memory"):
        keep_launcher = f"AND {LAUNCHER_ROWS[table]}" if table in LAUNCHER_ROWS else ""
        con.execute(f"""
            DELETE FROM {table} WHERE run_id = $1 {keep_launcher}
              AND file IN (SELECT path FROM files WHERE run_id = $1 AND rank IS NULL)
              AND rank IN (SELECT rank FROM _own_files)
              AND NOT EXISTS (SELECT 1 FROM _own_files o WHERE o.rank = {table}.rank
                              AND o.node = split_part({table}.file, '/', 1))""", [run_id])


def _copy_rows(reader: duckdb.DuckDBPyConnection, con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Every node's rows into the staging tables as one run: paths prefixed with the node (two
    nodes both have a console.log), the run id the job's."""
    for table in TABLES:
        if table in ("runs", "findings"):
            continue  # the job's run row and findings are its own, made below
        cols = _columns(table)[1:]
        picked = ", ".join(f"node || '/' || {c}" if _is_log_path(table, c) else c for c in cols)
        con.register("_incoming", reader.sql(f"SELECT {picked} FROM {table}").to_arrow_reader())
        con.execute(f"INSERT INTO {table} SELECT ? AS run_id, * FROM _incoming", [run_id])
        con.unregister("_incoming")


def _rank_nodes(con: duckdb.DuckDBPyConnection) -> None:
    """_rank_node(rank, node): the node whose files speak for the rank (its own files first;
    else where most of its rows are: a scheduler's merged stdout on one node names every rank)."""
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _rank_node AS
        SELECT rank, arg_max(node, weight) AS node FROM (
            SELECT rank, split_part(path, '/', 1) AS node, 1000000 AS weight FROM files WHERE rank IS NOT NULL
            UNION ALL
            SELECT rank, split_part(file, '/', 1), count(*) FROM events WHERE rank IS NOT NULL GROUP BY ALL
        ) GROUP BY rank""")


def _estimate_clocks(con: duckdb.DuckDBPyConnection, nodes: list[str], reference: str | None) -> dict[str, Clock]:
    clocks = {n: Clock(n) for n in nodes}
    if reference is None:
        return clocks
    clocks[reference] = Clock(reference, 0.0, 0.0, "the reference clock")
    rows = con.execute(OFFSETS_SQL.format(anchors=ANCHORS_SQL), {"ref": reference}).fetchall()
    for node, basis, moments, offset_s, spread_s, step_s in rows:
        floor = ANCHOR_FLOOR_S[basis]
        if basis == "step lines":
            if step_s is None:
                continue  # one step line a rank: how far apart ranks print it is unknown
            floor = step_s  # a synchronous step ends on every rank within about a step
        uncertainty = max(floor, spread_s or 0.0)
        best = clocks[node]
        if best.uncertainty_s is None or uncertainty < best.uncertainty_s:
            clocks[node] = Clock(node, offset_s, uncertainty, basis, moments)
    return clocks


def _shift(con: duckdb.DuckDBPyConnection, clocks: dict[str, Clock]) -> None:
    """Every time of a node's rows moved onto the reference clock."""
    for clock in clocks.values():
        if not clock.corrected:
            continue
        us = round(clock.offset_s * 1e6)
        prefix = clock.node + "/"
        for table in TABLES:
            stamps = [c for c, kind, _ in TABLES[table] if kind == "TIMESTAMP"]
            if table in ("runs", "findings") or not stamps:
                continue
            where = ("rank IN (SELECT rank FROM _rank_node WHERE node = $node)" if "file" not in _columns(table)
                     else "starts_with(file, $prefix)")
            sets = ", ".join(f"{c} = {c} - to_microseconds($us)" for c in stamps)
            con.execute(f"UPDATE {table} SET {sets} WHERE {where}",
                        {"us": us, **({"node": clock.node} if "file" not in _columns(table) else {"prefix": prefix})})
        # an untimed error's upper bound (runtime parser's attrs.ts_before) is a time of that node too
        con.execute("""UPDATE events SET attrs = json_merge_patch(attrs, json_object('ts_before',
                           strftime(CAST(attrs->>'ts_before' AS TIMESTAMP) - to_microseconds($us), '%Y-%m-%d %H:%M:%S.%f')))
                       WHERE starts_with(file, $prefix) AND attrs->>'ts_before' IS NOT NULL""",
                    {"us": us, "prefix": prefix})


def _ranks_with_own_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> list[int]:
    """The ranks that left something of their own: a file, or lines, dumps, stacks they printed. A rank
    only named by another's lines (the launcher's failure table, a peer's timeout) is not among them."""
    return [r for (r,) in con.execute("""
        SELECT DISTINCT rank FROM (
            SELECT rank FROM files WHERE run_id = $1
            UNION ALL SELECT rank FROM events WHERE run_id = $1
                AND kind NOT IN ('agent_signal', 'agent_failure', 'torchrun_failure')
            UNION ALL SELECT rank FROM stacks WHERE run_id = $1
            UNION ALL SELECT rank FROM memory WHERE run_id = $1
            UNION ALL SELECT rank FROM collectives WHERE run_id = $1
        ) WHERE rank IS NOT NULL ORDER BY rank""", [run_id]).fetchall()]


def _missing(world_size: int | None, seen: list[int], ingested: list[str], expected: list[str]) -> tuple[
        list[int], list[str]]:
    ranks = sorted(set(range(world_size or 0)) - set(seen))
    return ranks, [n for n in expected if store.partition_value(n) not in ingested]


def missing_sentence(job: Job) -> str | None:
    """'ranks 24-31 left no rows: node gpu-07 did not ingest', or None when nothing is missing."""
    nodes = job.missing_nodes
    who = (f"node {nodes[0]} did not ingest" if len(nodes) == 1 else
           f"nodes {', '.join(nodes)} did not ingest" if nodes else "no node that ingested ran them")
    if job.missing_ranks:
        ranks = "rank" if len(job.missing_ranks) == 1 else "ranks"
        return f"{ranks} {rank_ranges(job.missing_ranks)} left no rows: {who}"
    if nodes:
        return f"{who.replace(' did not', ' expected by the scheduler did not')}"
    return None


def clock_sentences(job: Job) -> list[str]:
    """One sentence per node whose clock was corrected or cannot be estimated; one for all the
    nodes whose clocks agree with the reference's (a 64-node job stays readable)."""
    said, agreeing = [], []
    for node, clock in sorted(job.clocks.items()):
        if node == job.reference:
            continue
        if clock.offset_s is None:
            said.append(f"{node}'s clock against {job.reference} cannot be estimated (no moment seen on the "
                        f"ranks of both: a step line, a collective completed everywhere, one sequence's "
                        f"watchdog timeouts): its times are as it printed them")
        elif clock.corrected:
            said.append(f"{node}'s clock is {clock.offset_s:+.1f} s against {job.reference} (± "
                        f"{clock.uncertainty_s:.2f} s, from {clock.moments} {clock.basis}); times below are corrected")
        else:
            agreeing.append(clock)
    if len(agreeing) == 1:
        clock = agreeing[0]
        said.append(f"{clock.node}'s clock agrees with {job.reference}'s within ± {clock.uncertainty_s:.2f} s "
                    f"(from {clock.moments} {clock.basis}): its times are as printed")
    elif agreeing:
        worst = max(c.uncertainty_s for c in agreeing)
        said.append(f"the clocks of {len(agreeing)} nodes ({', '.join(c.node for c in agreeing[:4])}"
                    f"{', ...' if len(agreeing) > 4 else ''}) agree with {job.reference}'s within ± {worst:.2f} s: "
                    f"their times are as printed")
    return said


def _fingerprint(root: Path, job: str) -> str:
    """The job's Parquet files (names, sizes, mtimes): equal fingerprints, equal input."""
    files = sorted(f for f in root.glob(f"*/date=*/job={store.partition_value(job)}/node=*/*.parquet")
                   if f.parent.name != f"node={store.JOB_ANALYSIS}")
    digest = hashlib.sha256()
    for f in files:
        st = f.stat()
        digest.update(f"{f.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def assemble(root: str | Path, job_id: str, run_id: str,
             expected_nodes: list[str] | None = None) -> tuple[duckdb.DuckDBPyConnection, Job]:
    """One staging run of every node's rows of the job, each node's times on the reference clock."""
    root = Path(root)
    if not root.is_dir():
        raise PostmortemError(f"No such directory: {root}")
    nodes = store.job_nodes(root, job_id)
    if not nodes:
        raise PostmortemError(f"No node has ingested job {job_id!r} under {root} "
                              f"(each node runs: postmortem ingest DIR --parquet {root} --job {job_id}).")
    reader = store.job_tables(root, job_id)
    con = store.staging()
    try:
        _copy_rows(reader, con, run_id)
        node_labels = [json.loads(r[0]) for r in reader.execute(
            "SELECT labels FROM runs WHERE labels IS NOT NULL").fetchall()]
    finally:
        reader.close()
    store.compact(con)  # every node's rows are in: what queries them from here reads them compressed
    _drop_relayed_lines(con, run_id)
    _rank_nodes(con)
    ranks_by_node = {n: [r for (r,) in con.execute(
        "SELECT rank FROM _rank_node WHERE node = ? ORDER BY rank", [n]).fetchall()] for n in nodes}
    holding = [n for n in nodes if ranks_by_node[n]]
    reference = min(holding, key=lambda n: ranks_by_node[n][0]) if holding else None
    clocks = _estimate_clocks(con, [n for n in nodes if ranks_by_node[n]], reference)
    _shift(con, clocks)
    # what pipeline.load does after parsing, now over all nodes (the agent's lines on one node name
    # workers by the pids their own files give on another). Local ranks are left alone: across
    # nodes a local rank is not the rank (each node's ingest made its own of them already).
    summary.attribute_ranks_by_pid(con, run_id)
    summary.refine_untimed(con, run_id)
    labels = {k: v for d in node_labels for k, v in d.items() if k not in ("node", "pod")}  # a node's own name is not the job's
    labels["job_id"] = job_id
    found = SimpleNamespace(root=f"{root.resolve()} (job {job_id})", fingerprint=_fingerprint(root, job_id))
    facts = summary.run_facts(con, run_id, found, labels)
    facts["hosts"] = sorted(set(facts["hosts"]) | set(nodes)) if len(facts["hosts"]) < len(nodes) else facts["hosts"]
    store.append(con, "runs", run_id, summary.runs_frame(facts))
    expected = expected_nodes or [n for d in node_labels if d.get("nodelist") for n in expand_nodelist(d["nodelist"])]
    missing_ranks, missing_nodes = _missing(facts["world_size"], _ranks_with_own_rows(con, run_id), nodes,
                                            list(dict.fromkeys(expected)))
    return con, Job(job_id, reference, ranks_by_node, clocks, missing_ranks, missing_nodes)


def job_finding(job: Job, order_notes: list[str]) -> engine.Finding:
    """The context finding that states how the job was assembled: nodes, clocks, what is missing."""
    gap = missing_sentence(job)
    parts = [gap] if gap else []  # first: the report's table shows a finding's first 400 characters
    parts += clock_sentences(job) + order_notes
    parts.append(f"job {job.job_id} from {len(job.ranks_by_node)} node(s): " + "; ".join(
        f"{n} ranks {rank_ranges(r) or 'none'}" for n, r in sorted(job.ranks_by_node.items())))
    unknown = any(c.offset_s is None for n, c in job.clocks.items() if n != job.reference)
    return engine.Finding(
        signature=JOB_SIGNATURE, role="context", severity="warning" if gap or unknown else "info", confidence=1.0,
        ranks=job.missing_ranks, summary="; ".join(parts),
        evidence=[{"rank": None, "file": None, "line": None, "ts": None, "text": s} for s in parts],
        remediation=("Run `postmortem ingest DIR --parquet ROOT --job ID` in every node's epilog, then analyze "
                     "again." if gap else ""))


def order_warnings(endings: list[dict], job: Job) -> list[str]:
    """Two ranks of different nodes that ended first, closer together than their clocks are known:
    their order is not told by the times (summary.rank_endings gives the endings, first first)."""
    node_of = {r: n for n, ranks in job.ranks_by_node.items() for r in ranks}
    ended = [e for e in endings if e["ts"] and e["ended"] != "no failure recorded"][:2]
    if len(ended) < 2 or node_of.get(ended[0]["rank"]) == node_of.get(ended[1]["rank"]):
        return []
    a, b = (job.clocks.get(node_of.get(e["rank"])) for e in ended)
    if a is None or b is None or a.uncertainty_s is None or b.uncertainty_s is None:
        return []
    gap = abs((datetime.fromisoformat(ended[1]["ts"]) - datetime.fromisoformat(ended[0]["ts"])).total_seconds())
    bound = a.uncertainty_s + b.uncertainty_s
    if gap > bound:
        return []
    return [(f"rank {ended[0]['rank']} and rank {ended[1]['rank']} ended {gap:.2f} s apart on different nodes, "
            f"within their clocks' uncertainty (± {bound:.2f} s): which ended first is not told by the times")]


# Verdicts that rest on which rank ended first: across nodes, only as sure as the clocks.
FIRST_TO_END = {"rank-crash"}


def analyze(root: str | Path, job_id: str, run_id: str, signatures: str | Path | None = None,
            fail_on: str = "error", expected_nodes: list[str] | None = None) -> tuple[duckdb.DuckDBPyConnection, Job]:
    """Assemble the job, match every signature, and store the findings (the job's own one
    included) in the staging database: the run's report is then summary.report's."""
    con, job = assemble(root, job_id, run_id, expected_nodes)
    sigs, broken = catalog.load_all(Path(signatures) if signatures else None)
    store.sandbox(con)  # signature SQL (the user's too) sees the run's tables and nothing else
    findings = engine.match(con, run_id, sigs, broken, calibrate=calibrator(con, run_id, sigs))
    top = engine.verdict(findings)
    gap = missing_sentence(job)
    if top is not None and gap:
        top.summary = f"{top.summary} ({gap})"  # the verdict may be wrong for lack of those ranks: say so there
    unordered = order_warnings(summary.rank_endings(con.cursor(), run_id), job)
    if top is not None and unordered and top.signature in FIRST_TO_END:
        top.summary = f"{top.summary} (but {unordered[0]})"
    findings.append(job_finding(job, unordered))
    store.append(con, "findings", run_id, summary.findings_frame([f.row() for f in findings]))
    con.execute("UPDATE runs SET verdict = ?, exit_status = ? WHERE run_id = ?",
                [top.signature if top else None, exit_status([f.severity for f in findings], fail_on), run_id])
    store.export_job_verdict(con, Path(root), run_id, job_id)
    return con, job


def report(con: duckdb.DuckDBPyConnection, run_id: str, job: Job) -> dict:
    """summary.report's dict, with the job's nodes and clocks, and a verdict that names what is missing."""
    rep = summary.report(con, run_id)
    gap = missing_sentence(job)
    if gap and gap not in (rep["verdict"]["summary"] or ""):
        rep["verdict"]["summary"] = f"{rep['verdict']['summary']} ({gap})"
    unordered = order_warnings(rep["ranks"], job)
    if unordered and rep["verdict"]["signature"] is None and " ended first" in (rep["verdict"]["summary"] or ""):
        rep["verdict"]["summary"] = f"{rep['verdict']['summary']} (but {unordered[0]})"
    rep["nodes"] = [{"node": n, "ranks": ranks, "clock_offset_s": job.clocks.get(n, Clock(n)).offset_s,
                     "clock_uncertainty_s": job.clocks.get(n, Clock(n)).uncertainty_s,
                     "clock_basis": job.clocks.get(n, Clock(n)).basis,
                     "corrected": job.clocks.get(n, Clock(n)).corrected}
                    for n, ranks in sorted(job.ranks_by_node.items())]
    rep["clock"] = {"reference": job.reference, "notes": clock_sentences(job) + order_warnings(rep["ranks"], job)}
    rep["missing"] = {"ranks": job.missing_ranks, "nodes": job.missing_nodes, "summary": gap}
    return rep

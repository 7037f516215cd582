"""Live replay: turn a finding from the logs into an observation on real processes.

    postmortem replay RUN_ID [--finding SIG] [--backend auto|gloo|nccl] [--timeout S] [--fix]

The collective replay rebuilds each rank's recorded sequence (``sequence``), runs it
(``collective``) and says whether the recorded hang or mismatch reproduced, at which
sequence number and on which ranks; ``--fix`` replays the corrected sequence and shows it
completes. The outcome is stored in the history as a finding with role ``confirmation``.
torch is needed only here (`pip install 'postmortem[replay]'`).
"""

from __future__ import annotations

import json
from pathlib import Path

from postmortem import store
from postmortem.errors import PostmortemError
from postmortem.ranges import rank_ranges
from postmortem.schema import frame

from . import sequence

MAX_GLOO_RANKS = 16
COMPILE_SIGNATURES = ("recompile-storm", "recompile-limit", "rank-divergent-compile")


def _torch():
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except ImportError as exc:
        raise PostmortemError(
            "replay needs PyTorch: pip install 'postmortem[replay]' (analysis itself does not)."
        ) from exc
    import torch

    return torch


def choose_backend(requested: str, world_size: int) -> str:
    torch = _torch()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if requested == "nccl" and gpus < world_size:
        raise PostmortemError(f"--backend nccl needs {world_size} GPUs for {world_size} ranks; this machine has {gpus}.")
    if requested not in ("gloo", "nccl"):
        raise PostmortemError("--backend must be auto, gloo or nccl.")
    return requested


def describe(p: sequence.Plan, outcome, fix: bool) -> tuple[bool, str]:
    """(reproduced, one sentence) from what the replay saw."""
    div = p.divergence
    hung = {r: s for r, s in outcome.hung.items()}
    failed = {r: e for r, e in outcome.errors.items()}
    clean = not hung and not failed and len(outcome.finished) == p.world_size
    if fix:
        if clean:
            return False, f"the corrected sequence completes on all {p.world_size} ranks in {outcome.seconds} s"
        return True, (f"the corrected sequence still fails: hung {rank_ranges(list(hung))} "
                      f"errors {'; '.join(f'rank {r}: {e}' for r, e in failed.items())}")
    if p.kind == "none":
        if clean:
            return False, (f"nothing to reproduce: the run has no finding, and every rank's recorded collectives "
                           f"(seq {p.first_seq}..{div}) complete when replayed, in {outcome.seconds} s")
        return True, (f"the recorded collectives (seq {p.first_seq}..{div}) do not complete when replayed, though "
                      f"the run has no finding: hung {rank_ranges(list(hung))}; "
                      f"{'; '.join(f'rank {r}: {e}' for r, e in failed.items())}")
    if clean:
        return False, (f"not reproduced: every rank's recorded collectives (seq {p.first_seq}..{div}) complete "
                       f"when replayed; the hang was outside the collective sequence (a stalled GPU stream, the "
                       f"network, the host)")
    stuck = sorted(set(hung) | set(failed))
    if p.kind == "cycle":
        def group(r):
            pg = outcome.groups_at.get(r, "?")
            return f"group {pg}" + (f" ({p.group_names[pg]})" if pg in p.group_names else "")
        where = "; ".join(f"rank {r} in {group(r)} seq {s}"
                          for r, s in sorted({**outcome.failed_at, **outcome.hung}.items()))
        groups = {outcome.groups_at.get(r) for r in stuck}
        if len(groups) > 1:
            return True, (f"reproduced the cycle: the ranks wait in collectives of different groups ({where}), "
                          f"rank(s) {rank_ranges(p.culprits)} having taken the groups in another order")
        return True, f"reproduced a hang, not a cycle: {where}"
    if p.kind == "p2p":
        waits = sorted(r for r, s in {**outcome.failed_at, **outcome.hung}.items() if s == 1)
        return True, (f"reproduced: rank(s) {rank_ranges(waits)} hang in their recorded send/recv, rank(s) "
                      f"{rank_ranges(p.culprits)} never sending what their peers wait for")
    if p.kind == "missing":
        silent = [r for r in p.culprits if not p.sequences.get(r)]
        if silent:
            return True, (f"reproduced the wait: rank(s) {rank_ranges(stuck)} hung at seq {div}; rank(s) "
                          f"{rank_ranges(silent)} left no collective record (no flight-recorder dump), so they were "
                          f"replayed as silent: what they issued instead is not known")
        return True, (f"reproduced: rank(s) {rank_ranges(stuck)} hung at seq {div} waiting for rank(s) "
                      f"{rank_ranges(p.culprits)}, which never issued it")
    if p.kind == "mismatch":
        detail = next((f"rank {r} {failed[r]}" for r in p.culprits if r in failed),
                      next((f"rank {r} {e}" for r, e in failed.items()), "hung"))
        return True, (f"reproduced: seq {div} fails when rank(s) {rank_ranges(p.culprits)} issue a different "
                      f"collective from the others: {detail}")
    return True, f"reproduced: rank(s) {rank_ranges(stuck)} hung at seq {div}"


def replay_collectives(run_id: str, db: Path, finding: str | None = None, backend: str = "auto",
                       world_size: int | None = None, timeout_s: float = 30.0, fix: bool = False,
                       record: bool = True) -> dict:
    from . import collective

    con = store.open_history(db)
    rows = con.execute("SELECT run_id, world_size FROM runs WHERE starts_with(run_id, ?)", [run_id]).fetchall()
    if len(rows) != 1:
        raise PostmortemError(f"{run_id!r} matches {len(rows)} runs; `postmortem runs` lists them.")
    run_id, recorded_world = rows[0]
    target = finding or (con.execute(
        "SELECT signature FROM findings WHERE run_id = ? AND role = 'root_cause' ORDER BY confidence DESC LIMIT 1",
        [run_id]).fetchall() or [[None]])[0][0]
    p = sequence.plan(con, run_id, world_size or recorded_world)
    if p.kind in ("stuck", "none") and (apart := sequence.plan_groups(con, run_id, world_size or recorded_world)):
        p = apart  # the default group agrees; the cycle is across the other groups
    elif p.kind in ("stuck", "none") and (p2p := sequence.plan_p2p(con, run_id, world_size or recorded_world)):
        p = p2p  # the collectives agree; the ranks wait in send/recv
    named = con.execute("SELECT ranks FROM findings WHERE run_id = ? AND signature = ? AND role = 'root_cause' "
                        "LIMIT 1", [run_id, target]).fetchall()
    con.close()
    # Two ranks that disagree have no majority: which one is "wrong" is the log analysis' call
    # (the rank whose code path differs), so the replay names the same one.
    if p.kind in ("mismatch", "cycle") and named and named[0][0] and set(named[0][0]) <= set(p.sequences):
        p.culprits = list(named[0][0])
    if not p.sequences:
        raise PostmortemError(f"run {run_id} has no collective records (flight recorder, NCCL COLL lines, "
                              "watchdog, profiler) to replay.")
    if target is None and p.kind == "stuck":
        p.kind, p.culprits = "none", []  # a run with no finding: replay what it recorded, expect it to complete
    chosen = choose_backend(backend, min(p.world_size, MAX_GLOO_RANKS))
    try:
        p = sequence.fold(p, MAX_GLOO_RANKS if chosen == "gloo" else _torch().cuda.device_count())
    except ValueError as exc:
        raise PostmortemError(f"cannot fold the job onto this machine: {exc}") from exc
    if fix:
        p = {"cycle": sequence.fixed_order, "p2p": sequence.fixed_p2p}.get(p.kind, sequence.fixed)(p)
    outcome = collective.run(p, chosen, timeout_s)
    reproduced, summary = describe(p, outcome, fix)
    result = {
        "run_id": run_id, "finding": target, "backend": chosen, "world_size": p.world_size, "fix": fix,
        "window": [p.first_seq, max((o.seq for ops in p.sequences.values() for o in ops), default=None)],
        "divergence": p.divergence, "kind": p.kind, "culprit_ranks": p.culprits, "folded": p.folded,
        "reproduced": reproduced, "summary": summary, "seconds": outcome.seconds, "notes": p.notes,
        "ranks": {r: {"last_completed": outcome.completed.get(r), "hung_in": outcome.hung.get(r, None),
                      "error": outcome.errors.get(r), "finished": r in outcome.finished}
                  for r in range(p.world_size)},
    }
    if record:
        _record(db, result)
    return result


def _record(db: Path, result: dict) -> None:
    """Store the outcome as a `confirmation` finding of the replayed run."""
    evidence = [{"rank": r, "file": "replay", "line": None, "ts": None,
                 "text": json.dumps(v)} for r, v in result["ranks"].items()]
    row = {"signature": result["finding"] or "replay", "role": "confirmation", "severity": "info",
           "confidence": 1.0 if result["reproduced"] != result["fix"] else 0.0,
           "ranks": result["culprit_ranks"], "summary": ("fix replay: " if result["fix"] else "replay: ")
           + result["summary"], "evidence": json.dumps(evidence), "remediation": ""}
    con = store.open_history(db, write=True)
    try:
        store.append(con, "findings", result["run_id"], frame("findings", [row]))
    finally:
        con.close()


def replay(run_id: str, db: Path, finding: str | None = None, backend: str = "auto", world_size: int | None = None,
           timeout_s: float = 30.0, fix: bool = False, device: str = "cpu", record: bool = True) -> dict:
    """Replay the finding (default: the run's verdict): compile findings by driving a compiled
    stand-in, everything else by replaying the collective sequence."""
    con = store.open_history(db)
    rows = con.execute("SELECT run_id, verdict FROM runs WHERE starts_with(run_id, ?)", [run_id]).fetchall()
    con.close()
    if len(rows) != 1:
        raise PostmortemError(f"{run_id!r} matches {len(rows)} runs; `postmortem runs` lists them.")
    target = finding or rows[0][1]
    if target in COMPILE_SIGNATURES:
        return replay_compile(rows[0][0], db, target, fix=fix, device=device, record=record)
    return replay_collectives(rows[0][0], db, finding=finding, backend=backend, world_size=world_size,
                              timeout_s=timeout_s, fix=fix, record=record)


def replay_compile(run_id: str, db: Path, finding: str, fix: bool = False, device: str = "cpu",
                   record: bool = True) -> dict:
    from . import compile as compiles

    _torch()
    con = store.open_history(db)
    p = compiles.plan(con, run_id)
    con.close()
    if p is None:
        raise PostmortemError(f"run {run_id} records no recompiles whose guards say what changed (a Python "
                              "scalar's value or a tensor's size): nothing to replay.")
    outcome = compiles.run(p, fix, device=device, backend="inductor" if device == "cuda" else "eager")
    within = abs(outcome["recompiles"] - p.recorded_recompiles) <= 1
    remedy = "passing `" + p.arg + "` as a tensor" if p.kind == "python_scalar" else \
        f"torch._dynamo.mark_dynamic({p.arg}, {p.dim})"
    if fix:
        reproduced = outcome["recompiles"] > 0
        summary = (f"with {remedy}: {outcome['recompiles']} recompiles over {outcome['calls']} calls "
                   f"(recorded {p.recorded_recompiles})")
    else:
        reproduced = within
        summary = (f"{'reproduced' if within else 'not reproduced'}: {outcome['recompiles']} recompiles of "
                   f"{p.function} ({p.kind} guard on `{p.arg}`) over {outcome['calls']} calls, recorded "
                   f"{p.recorded_recompiles}" + (f"; recompile_limit ({outcome['limit']}) hit" if
                                                   outcome["limit_hit"] else ""))
    result = {"run_id": run_id, "finding": finding, "backend": "compile", "world_size": 1, "fix": fix,
              "window": [None, None], "divergence": None, "kind": p.kind, "culprit_ranks": [p.rank], "folded": {},
              "reproduced": reproduced, "summary": summary, "seconds": None, "notes": [f"frame {p.function} at "
                                                                                     f"{p.where}"],
              "ranks": {p.rank: {**outcome, "recorded_recompiles": p.recorded_recompiles,
                                 "values": p.values[:20]}}}
    if record:
        _record(db, result)
    return result

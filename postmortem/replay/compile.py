"""Compile replay: drive a torch.compile'd stand-in with the call signatures that made a
frame recompile, count the recompiles, and show the remedy removes them.

The recorded guard failures say what changed between calls: a Python scalar
(``scale == 1.01``: the cached value the next call no longer matched) or a tensor size
(``tensor 'x' size mismatch at index 0. expected 80, actual 88``). The stand-in takes the
same arguments and is compiled the way the job was (static shapes); the fix passes the
scalar as a tensor, or marks the varying dimension dynamic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb

_SCALAR = re.compile(r"^(?:L\[')?(?P<name>\w+)(?:'\])? == (?P<value>-?[\d.eE+-]+)$")
_SHAPE = re.compile(r"tensor '(?:L\[')?(?P<name>[\w.]+?)(?:'\])?' size mismatch at index (?P<dim>\d+)\. "
                    r"expected (?P<expected>\d+), actual (?P<actual>\d+)")


@dataclass
class CompilePlan:
    function: str
    where: str
    rank: int
    recorded_recompiles: int
    limit_hit: bool
    kind: str  # python_scalar or shape
    arg: str
    values: list  # one per call, in order: scalars, or sizes of the varying dimension
    dim: int = 0


def plan(con: duckdb.DuckDBPyConnection, run_id: str) -> CompilePlan | None:
    """The most-recompiled frame of the user's code (torch's own wrappers, such as DDP's
    ``inner``, recompile alongside it), and the calls that made it recompile."""
    frames = con.execute(
        """
        SELECT * FROM (
            SELECT rank, function, code_file, code_line, count(DISTINCT regexp_replace(attempt, '_[0-9]+$', '')) AS n
            FROM compiles WHERE run_id = ? AND event = 'recompile' AND rank IS NOT NULL
            GROUP BY ALL)
        ORDER BY coalesce(code_file LIKE '%/torch/%' OR code_file LIKE '%-packages/%', true), n DESC, rank, function
        """, [run_id]).fetchall()
    return next((p for frame in frames if (p := _frame_plan(con, run_id, *frame)) is not None), None)


def _frame_plan(con, run_id, rank, function, code_file, code_line, n) -> CompilePlan | None:
    reasons = con.execute(
        """
        SELECT attempt, any_value(reason) FROM compiles
        WHERE run_id = ? AND rank = ? AND function IS NOT DISTINCT FROM ? AND event IN ('recompile', 'limit_hit')
        GROUP BY attempt ORDER BY min(line_no)
        """, [run_id, rank, function]).fetchall()
    hit = bool(con.execute(
        "SELECT count(*) FROM compiles WHERE run_id = ? AND rank = ? AND event = 'limit_hit' "
        "AND function IS NOT DISTINCT FROM ?", [run_id, rank, function]).fetchall()[0][0])
    where = f"{code_file}:{code_line}"
    scalars = [m for _, r in reasons if r and (m := _SCALAR.match(r.strip()))]
    if scalars:
        values = [float(m["value"]) for m in scalars]
        # each guard names the value cached by an earlier call; one more call tripped the last one
        step = values[-1] - values[-2] if len(values) > 1 else 1.0
        return CompilePlan(function, where, rank, n, hit, "python_scalar", scalars[0]["name"],
                           values + [values[-1] + step])
    shapes = [m for _, r in reasons if r and (m := _SHAPE.search(r))]
    if shapes:
        values = [int(shapes[0]["expected"])] + [int(m["actual"]) for m in shapes]
        return CompilePlan(function, where, rank, n, hit, "shape", shapes[0]["name"], values, int(shapes[0]["dim"]))
    return None


def run(p: CompilePlan, fix: bool, device: str = "cpu", backend: str = "eager") -> dict:
    """Call the stand-in once per recorded call; count compilations (the first is not a recompile)."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    compiled = []

    def counting(gm, example_inputs):
        compiled.append(len(example_inputs))
        return gm.forward if backend == "eager" else torch._inductor.compile(gm, example_inputs)

    if p.kind == "python_scalar":
        def stand_in(x, scale):
            return (x * scale).relu().sum()

        fn = torch.compile(stand_in, backend=counting, dynamic=False)
        x = torch.ones(64, device=device)
        for v in p.values:
            fn(x, torch.tensor(v, device=device) if fix else v)
    else:
        def stand_in(x):
            return (x * 2).relu().sum()

        fn = torch.compile(stand_in, backend=counting, dynamic=False)
        for size in p.values:
            shape = [4] * (p.dim + 1)
            shape[p.dim] = size
            x = torch.ones(shape, device=device)
            if fix:
                torch._dynamo.mark_dynamic(x, p.dim)
            fn(x)
    limit = getattr(torch._dynamo.config, "recompile_limit", getattr(torch._dynamo.config, "cache_size_limit", 8))
    recompiles = max(0, len(compiled) - 1)
    # Past the limit Dynamo stops compiling the frame and runs it eagerly: compilations stall.
    hit = len(p.values) > limit and len(compiled) >= limit
    return {"calls": len(p.values), "compilations": len(compiled), "recompiles": recompiles,
            "limit": limit, "limit_hit": hit}

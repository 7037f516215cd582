"""Replay a plan's collective sequences: one process per rank, real tensors, a deadline.

Each worker creates the process group (gloo on CPU, NCCL on GPUs), issues its recorded
ops with tensors of the recorded sizes and dtypes, and reports each completed sequence
number to the parent. The parent waits up to the timeout, then kills and reaps every
worker still running: a replay never outlives its deadline, however the collective hangs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

from postmortem.checks.collective_alignment import op_family

from .sequence import Op, Plan

MAX_NUMEL = 16 << 20  # a replayed tensor is capped: the sizes are what must disagree, not the bytes
DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
          "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


class UnsupportedOp(Exception):
    """An op the replay does not know how to issue; it is skipped and said so."""


@dataclass
class Outcome:
    backend: str
    world_size: int
    seconds: float
    completed: dict[int, int | None] = field(default_factory=dict)  # rank -> last seq completed
    errors: dict[int, str] = field(default_factory=dict)  # rank -> (seq, error)
    hung: dict[int, int | None] = field(default_factory=dict)  # rank -> seq it was in when killed
    failed_at: dict[int, int | None] = field(default_factory=dict)  # rank -> seq it was in when it raised
    finished: list[int] = field(default_factory=list)
    groups_at: dict[int, str] = field(default_factory=dict)  # rank -> the group of the op it was stuck in

    @property
    def stuck(self) -> dict[int, int | None]:
        """Ranks that did not get through, and the seq each was in: hung, or a collective raised."""
        return {**self.failed_at, **self.hung}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shape(n: int) -> int:
    return max(1, min(n, MAX_NUMEL))


def _issue(dist, torch, op: Op, world: int, device, group=None):
    dtype = getattr(torch, DTYPES.get(op.dtype, "float32"))
    ones = lambda n: torch.ones(_shape(n), dtype=dtype, device=device)  # noqa: E731
    family = op_family(op.op)  # every source's spelling: _ALLGATHER_BASE, gloo:all_gather, ...
    on = {} if group is None else {"group": group}
    if op.op == "send" and op.peer is not None:
        return dist.send(ones(op.in_numel), dst=op.peer, **on)
    if op.op == "recv" and op.peer is not None:
        return dist.recv(torch.empty(_shape(op.in_numel), dtype=dtype, device=device), src=op.peer, **on)
    if family == "all_gather":
        out = torch.empty(_shape(op.out_numel), dtype=dtype, device=device)
        return dist.all_gather_into_tensor(out, ones(op.in_numel), **on)
    if family == "reduce_scatter":
        out = torch.empty(_shape(op.out_numel), dtype=dtype, device=device)
        return dist.reduce_scatter_tensor(out, ones(op.in_numel), **on)
    if family == "all_reduce" or op.op.lower().endswith("all_reduce_barrier"):
        return dist.all_reduce(ones(op.in_numel), **on)
    if family == "barrier":
        return dist.barrier(**on)
    if family == "broadcast":
        return dist.broadcast(ones(op.in_numel), src=0, **on)
    if family == "reduce":
        return dist.reduce(ones(op.in_numel), dst=0, **on)
    if family == "all_to_all":
        t = ones(max(world, op.in_numel // world * world))
        return dist.all_to_all_single(torch.empty_like(t), t, **on)
    raise UnsupportedOp(f"op {op.op} is not replayed")


def _worker(rank: int, world: int, port: int, backend: str, ops: list[Op], timeout_s: float, events,
            release, issuing, completed, groups: dict[str, list[int]]) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      TORCH_FR_BUFFER_SIZE="2000")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        # every rank makes every group, in one order (new_group is collective over the default group)
        made = {pg: dist.new_group(ranks=members) for pg, members in groups.items()}
        events.put(("ready", rank, None))
        for op in ops:
            issuing[rank] = op.seq
            events.put(("start", rank, op.seq, op.pg))
            try:
                _issue(dist, torch, op, world, device, made.get(op.pg))
                if backend == "nccl":
                    torch.cuda.synchronize(device)
            except UnsupportedOp as exc:
                issuing[rank] = _NOT_ISSUING
                events.put(("skip", rank, op.seq, str(exc)))
                continue
            # (not cleared where the collective raised: the error event may never arrive, its queue
            # stuck behind a peer that died holding the lock, and the rank, alive at the deadline,
            # is then reported in the collective it was in, not in the last one whose start came)
            issuing[rank] = _NOT_ISSUING
            completed[rank] = op.seq
            events.put(("done", rank, op.seq))
        events.put(("finished", rank, None))
        # A rank whose recorded sequence ends early stays connected and silent, as the real
        # one did, until every rank is through (or the deadline): tearing down would turn
        # its peers' hang into a "connection closed" error.
        release.wait(timeout_s * 2)
        dist.destroy_process_group()
    except Exception as exc:  # the replayed failure itself: report it, don't print a traceback
        events.put(("error", rank, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))


STARTUP_S = 120.0  # spawning the workers and importing torch; not counted in the replay's timeout
_NOT_ISSUING = -1


def run(p: Plan, backend: str, timeout_s: float, startup_s: float = STARTUP_S) -> Outcome:
    """Replay ``p`` and report where each rank got to.

    The timeout counts from when every worker has joined the process group (starting
    Python and torch can take long on a loaded machine); at most ``startup_s`` is allowed
    for that. Past the deadline every worker still running is killed and reaped.
    """
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    release = ctx.Event()
    # The collective each rank is in, written to shared memory before it is issued: a rank that
    # dies in it (gloo's size check aborts the process) may take its queued "start" event with
    # it, unsent by the queue's feeder thread, but not this.
    issuing = ctx.Array("q", [_NOT_ISSUING] * p.world_size, lock=False)
    # The same for the last collective each rank completed: a peer killed while its queue feeder
    # held the queue's lock (gloo's abort, mid-put) leaves the other ranks' events stuck behind it.
    completed = ctx.Array("q", [_NOT_ISSUING] * p.world_size, lock=False)
    port = free_port()
    started = time.monotonic()
    # The collective timeout is shorter than the replay's deadline, so a hung collective
    # surfaces as the backend's own timeout error when it can.
    collective_timeout = max(2.0, timeout_s * 0.6)
    procs = {r: ctx.Process(target=_worker, args=(r, p.world_size, port, backend, p.sequences.get(r, []),
                                                  collective_timeout, events, release, issuing, completed, p.groups),
                            daemon=True)
             for r in range(p.world_size)}
    for proc in procs.values():
        proc.start()
    outcome = Outcome(backend=backend, world_size=p.world_size, seconds=0.0)
    current: dict[int, int | None] = {r: None for r in procs}
    deadline = started + startup_s + timeout_s
    ready: set[int] = set()
    done = set()
    while len(done) < len(procs) and time.monotonic() < deadline:
        try:
            kind, rank, seq, *rest = events.get(timeout=0.2)
        except queue.Empty:
            if all(not proc.is_alive() for r, proc in procs.items() if r not in done):
                break
            continue
        if kind == "ready":
            ready.add(rank)
            if len(ready) == len(procs):
                deadline = time.monotonic() + timeout_s
        elif kind == "start":
            current[rank] = seq
            outcome.groups_at[rank] = rest[0] if rest else p.pg
        elif kind == "done":
            outcome.completed[rank] = seq
            outcome.groups_at.pop(rank, None)
            current[rank] = None
        elif kind == "finished":
            outcome.finished.append(rank)
            done.add(rank)
            if len(outcome.finished) == len(procs):
                release.set()
        elif kind == "error":
            outcome.failed_at[rank] = current[rank]
            outcome.errors[rank] = f"at seq {current[rank]}: {rest[0]}" if current[rank] is not None else rest[0]
            done.add(rank)
    release.set()
    for rank in procs:
        if completed[rank] != _NOT_ISSUING and rank not in outcome.finished:
            outcome.completed[rank] = completed[rank]
        if issuing[rank] != _NOT_ISSUING and rank not in done:
            current[rank] = issuing[rank]
            op = next((o for o in p.sequences.get(rank, []) if o.seq == issuing[rank]), None)
            outcome.groups_at[rank] = (op.pg or p.pg) if op else p.pg
    for rank, proc in procs.items():
        if rank in done:
            continue
        if proc.exitcode is not None:  # it died on its own (gloo's size check aborts the process)
            how = (f"signal {signal.Signals(-proc.exitcode).name}" if proc.exitcode < 0
                   else f"exit code {proc.exitcode}")
            seq = issuing[rank] if issuing[rank] != _NOT_ISSUING else current[rank]
            outcome.failed_at[rank] = seq
            outcome.errors[rank] = f"at seq {seq}: the process died ({how})"
        else:
            outcome.hung[rank] = current[rank]
    for proc in procs.values():
        proc.join(timeout=2)
        if proc.is_alive():
            proc.terminate()
    for proc in procs.values():
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    events.close()
    outcome.seconds = round(time.monotonic() - started, 2)
    return outcome

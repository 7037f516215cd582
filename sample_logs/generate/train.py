"""A small, ordinary DDP + torch.compile training loop used to produce the sample corpus.

Run under torchrun:

    torchrun --nproc-per-node 2 sample_logs/generate/train.py --scenario healthy --backend gloo

Each scenario plants ONE failure in otherwise ordinary code. Every planted failure lives in
its own small function, and the line that is the culprit follows a ``# PLANTED(<scenario>)``
marker comment; ``generate.py`` finds the line number from that marker (never typed in).

The same file runs unchanged with ``--backend nccl`` on GPUs (device ``cuda:LOCAL_RANK``).
"""

import argparse
import ctypes
import logging
import os
import queue
import signal
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger("train")

FAIL_STEP = 4  # the step at which every planted failure fires


# --------------------------------------------------------------------------- model / data


class MLP(nn.Module):
    """~0.3 M parameters: 256 -> 512 -> 256 -> 16."""

    def __init__(self, d_in=256, d_hidden=512, d_out=16, unused_head=False):
        super().__init__()
        self.blocks = nn.Sequential(
            nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, 256), nn.ReLU()
        )
        self.head = nn.Linear(256, d_out)
        if unused_head:
            # PLANTED(ddp_unused_parameters): registered but never used in forward
            self.aux_head = nn.Linear(256, d_out)

    def forward(self, x, scale=1.0):
        # EVIDENCE(recompile_limit): dynamo guards on the value of the python float `scale` here
        return self.head(self.blocks(x)) * scale


class NoisyMLP(MLP):
    """forward with a .item(), a print and a data-dependent branch (graph_breaks)."""

    def forward(self, x, scale=1.0):
        h = self.blocks(x)
        # PLANTED(graph_breaks): the culprit line is the next line
        norm = h.norm().item()
        print(f"activation norm {norm:.3f}")
        if h.mean() > 0:
            h = h * 2.0
        return self.head(h) * scale


class SyntheticDataset(Dataset):
    """Deterministic random regression data: x ~ N(0, 1), y = x @ W (a fixed W) + noise."""

    def __init__(self, n=4096, d_in=256, d_out=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d_in, generator=g)
        w = torch.randn(d_in, d_out, generator=g) / d_in**0.5
        self.y = self.x @ w + 0.1 * torch.randn(n, d_out, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_loader(rank, world, seed, batch_size=64):
    ds = SyntheticDataset(seed=seed)
    sampler = torch.utils.data.distributed.DistributedSampler(
        ds, num_replicas=world, rank=rank, shuffle=True, seed=seed
    )
    return DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=0, drop_last=True)


# --------------------------------------------------------------------------- helpers


def mem_fields(device):
    if device.type == "cuda":
        return "mem_alloc_mb %.1f mem_reserved_mb %.1f" % (
            torch.cuda.memory_allocated(device) / 2**20,
            torch.cuda.memory_reserved(device) / 2**20,
        )
    # CPU: there is no allocator to ask; report the process resident set size instead.
    rss_kb = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return "mem_alloc_mb %.1f" % (rss_kb / 1024)


def setup_logging(rank):
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s [rank" + str(rank) + "] %(message)s",
        stream=sys.stdout,
    )


# --------------------------------------------------------------------------- planted failures
# Each function below is ordinary-looking training code with one planted fault.


def fetch_batch(it, step, rank):
    """Get the next batch; in hang_dataloader rank 1 waits on a prefetch queue nobody fills."""
    if SCENARIO == "hang_dataloader" and rank == 1 and step == FAIL_STEP:
        prefetch_queue = queue.Queue()
        # PLANTED(hang_dataloader): the culprit line is the next line
        return prefetch_queue.get()
    return next(it)


def check_batch(x, y, step, rank):
    """Validate a batch; in rank_exception rank 1 rejects its batch."""
    if SCENARIO == "rank_exception" and rank == 1 and step == FAIL_STEP:
        # PLANTED(rank_exception): the culprit line is the next line
        raise ValueError(f"bad batch at step {step}: labels shape {tuple(y.shape)} has NaN rows")
    return x, y


def maybe_sync_before_step(step, rank):
    """A rank-conditional barrier: only rank 0 enters it."""
    if SCENARIO == "hang_conditional_barrier" and step == FAIL_STEP:
        if rank == 0:
            # PLANTED(hang_conditional_barrier): the culprit line is the next line
            dist.barrier()


def gather_flat_params(step, rank, world, device):
    """FSDP-style all-gather of a flat parameter shard (every step)."""
    numel = 4096
    if SCENARIO in ("allgather_shard_mismatch", "collective_mismatch_detail") and rank == 1 and step == FAIL_STEP:
        # PLANTED(allgather_shard_mismatch): the culprit line is the next line
        numel = 4000
    shard = torch.full((numel,), float(rank), device=device)
    out = torch.empty(world * numel, device=device)
    # EVIDENCE(allgather_shard_mismatch): the collective in which the mismatch shows up
    dist.all_gather_into_tensor(out, shard)
    return out


def sync_metric(value, step, rank, device):
    """All-reduce a scalar metric (every step); in dtype_mismatch rank 1 uses bf16."""
    dtype = torch.float32
    if SCENARIO == "dtype_mismatch" and rank == 1 and step == FAIL_STEP:
        # PLANTED(dtype_mismatch): the culprit line is the next line
        dtype = torch.bfloat16
    t = torch.full((1024,), value, dtype=dtype, device=device)
    # EVIDENCE(dtype_mismatch): the collective in which the mismatch shows up
    dist.all_reduce(t)
    return t[0].item() / dist.get_world_size()


def loss_scale_for(step):
    """A python float that changes every call (recompile_limit)."""
    if SCENARIO == "recompile_limit":
        # PLANTED(recompile_limit): the culprit line is the next line (a new float every call)
        return 1.0 + 0.01 * step
    return 1.0


def train_step(cmodel, opt, x, y, step, rank):
    out = cmodel(x, loss_scale_for(step))
    loss = F.mse_loss(out, y)
    if SCENARIO == "rank_sigkill" and rank == 1 and step == FAIL_STEP:
        # PLANTED(rank_sigkill): the culprit line is the next line
        os.kill(os.getpid(), signal.SIGKILL)
    if SCENARIO == "rank_frozen" and rank == 1 and step == FAIL_STEP:
        # PLANTED(rank_frozen): the culprit line is the next line
        os.kill(os.getpid(), signal.SIGSTOP)
    if SCENARIO == "native_crash" and rank == 1 and step == FAIL_STEP:
        # PLANTED(native_crash): the culprit line is the next line
        ctypes.string_at(0)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


# --------------------------------------------------------------------------- main


SCENARIO = "healthy"


def main():
    global SCENARIO
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", default="healthy")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    SCENARIO = args.scenario

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    setup_logging(rank)

    if args.backend == "nccl":
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, timeout=timedelta(seconds=30))
    log.info(
        "host=%s pid=%d world=%d scenario=%s torch=%s",
        socket.gethostname(), os.getpid(), world, SCENARIO, torch.__version__,
    )

    torch.manual_seed(args.seed)
    model = (NoisyMLP() if SCENARIO == "graph_breaks"
             else MLP(unused_head=SCENARIO == "ddp_unused_parameters")).to(device)
    # EVIDENCE(collective_mismatch_detail): on gloo + TORCH_DISTRIBUTED_DEBUG=DETAIL this segfaults
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    # Static shapes (fixed batch, drop_last): compile without dynamic-shape kernels.
    cmodel = torch.compile(ddp, dynamic=False)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    loader = make_loader(rank, world, args.seed)
    it = iter(loader)
    for step in range(args.steps):
        t0 = time.perf_counter()
        try:
            x, y = fetch_batch(it, step, rank)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        x, y = check_batch(x.to(device), y.to(device), step, rank)
        maybe_sync_before_step(step, rank)
        loss = train_step(cmodel, opt, x, y, step, rank)
        if SCENARIO in ("allgather_shard_mismatch", "collective_mismatch_detail"):
            gather_flat_params(step, rank, world, device)
        if SCENARIO == "dtype_mismatch":
            sync_metric(loss.item(), step, rank, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        log.info("step %d loss %.4f step_time %.3fs %s", step, loss.item(), dt, mem_fields(device))

    dist.barrier()
    log.info("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

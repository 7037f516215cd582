"""A small, ordinary DDP + torch.compile training loop used to produce the sample corpus.

Run under torchrun:

    torchrun --nproc-per-node 2 sample_logs/generate/train.py --scenario healthy --backend gloo

Each scenario plants ONE failure in otherwise ordinary code. Every planted failure lives in
its own small function, and the line that is the culprit follows a ``# PLANTED(<scenario>)``
marker comment; ``generate.py`` finds the line number from that marker (never typed in).

The same file runs unchanged with ``--backend nccl`` on GPUs (device ``cuda:LOCAL_RANK``).
``--device cuda`` with gloo puts every rank on cuda:0, so two ranks can share one GPU.
A scenario name ending in ``_cuda`` plants the same failure as the name without it.
"""

import argparse
import ctypes
import io
import logging
import os
import queue
import signal
import socket
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
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

    def forward(self, x, scale=1.0):  # EVIDENCE(recompile_shapes): the frame recompiled per shape
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


class ClampedMLP(MLP):
    """forward with a guard against exploding activations, compiled with fullgraph=True."""

    def forward(self, x, scale=1.0):
        h = self.blocks(x)
        # PLANTED(compile_failure): a data-dependent branch, which fullgraph=True cannot trace
        if h.abs().max() > 1e4:
            h = h.clamp(-1e4, 1e4)
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


def pick_device(arg, backend, local_rank):
    """cpu; cuda (nccl: cuda:LOCAL_RANK; gloo: cuda:0 for every rank); or an explicit cuda:N."""
    if arg is None:
        arg = "cuda" if backend == "nccl" else "cpu"
    if arg == "cpu":
        return torch.device("cpu")
    if arg == "cuda":
        return torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cuda:0")
    # PLANTED(nccl_duplicate_gpu): an explicit device for every rank: with nccl, ranks share a GPU
    return torch.device(arg)


def make_profiler(device, out_dir):
    """A short profiler window: steps 3-5 (wait 2, warmup 1, active 3); gzipped on CUDA."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=2, warmup=1, active=3, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(
            os.path.join(out_dir, "profiler"), use_gzip=device.type == "cuda"),
        record_shapes=True,
        profile_memory=True,
    )


def gpu_cycles_per_s():
    """Calibrate torch.cuda._sleep: how many cycles the GPU spins per second."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 200_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000.0)


# --------------------------------------------------------------------------- planted failures
# Each function below is ordinary-looking training code with one planted fault.


def fetch_batch(it, step, rank):
    """Get the next batch; in hang_dataloader rank 1 waits on a prefetch queue nobody fills."""
    if SCENARIO == "hang_dataloader" and rank == 1 and step == FAIL_STEP:
        prefetch_queue = queue.Queue()
        # PLANTED(hang_dataloader): the culprit line is the next line
        return prefetch_queue.get()
    if SCENARIO == "straggler" and rank == 1:
        # PLANTED(straggler): rank 1's data path is slow: 0.3 s per batch, every step
        time.sleep(0.3)
    return next(it)


def check_batch(x, y, step, rank):
    """Validate a batch; in rank_exception rank 1 rejects its batch."""
    if SCENARIO == "rank_exception" and rank == 1 and step == FAIL_STEP:
        # PLANTED(rank_exception): the culprit line is the next line
        raise ValueError(f"bad batch at step {step}: labels shape {tuple(y.shape)} has NaN rows")
    if SCENARIO == "non_finite_loss" and rank == 1 and step == FAIL_STEP:
        # PLANTED(non_finite_loss): a corrupt record: one NaN feature slips into rank 1's batch
        x[0, 0] = float("nan")
    return x, y


RAGGED_SIZES = (64, 56, 48, 40, 32, 24)


def ragged_batch(x, y, step, rank):
    """recompile_shapes: batches of varying size (e.g. after filtering), different per rank."""
    if SCENARIO == "recompile_shapes":
        # PLANTED(recompile_shapes): the batch size changes every step, and differs across ranks
        n = RAGGED_SIZES[(step + 3 * rank) % len(RAGGED_SIZES)]
        return x[:n], y[:n]
    return x, y


def add_id_features(x, id_emb, step, rank):
    """device_assert: add a learned per-sample id feature (an embedding lookup)."""
    ids = (torch.arange(x.shape[0], device=x.device) * 7 + step) % id_emb.num_embeddings
    if SCENARIO == "device_assert" and rank == 1 and step == FAIL_STEP:
        # PLANTED(device_assert): an id one past the end of the embedding table
        ids[0] = id_emb.num_embeddings
    with torch.no_grad():
        # EVIDENCE(device_assert): the embedding lookup whose kernel asserts
        feats = id_emb(ids)
    return x + feats


def build_pair_mask(x, step, rank):
    """cuda_oom_spike: a pairwise (batch x batch) mask, used as a per-step statistic."""
    n = x.shape[0]
    if SCENARIO == "cuda_oom_spike" and rank == 1 and step == FAIL_STEP:
        # PLANTED(cuda_oom_spike): the token count instead of the batch size: a ~256 GiB mask
        n = n * 4096
    mask = torch.ones(n, n, device=x.device)  # EVIDENCE(cuda_oom_spike): where it OOMs
    return mask.sum().item()


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
    if SCENARIO == "nccl_watchdog_timeout" and step == FAIL_STEP:
        # PLANTED(nccl_watchdog_timeout): a ~60 s kernel on the current stream, ahead of the all-reduce
        torch.cuda._sleep(int(60 * CYCLES_PER_S))
    # EVIDENCE(dtype_mismatch): the collective in which the mismatch shows up
    # EVIDENCE(nccl_watchdog_timeout): the all-reduce that cannot complete in 30 s
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


VAL_OUTPUTS = []


def validate(model, step, device):
    """memory_leak: a validation pass every step, without torch.no_grad()."""
    g = torch.Generator(device=device).manual_seed(step)
    x_val = torch.randn(8192, 256, device=device, generator=g)
    out = model(x_val)  # EVIDENCE(memory_leak): the allocation site the OOM and the snapshot name
    # PLANTED(memory_leak): keeps every validation output, and with it its autograd graph
    VAL_OUTPUTS.append(out)
    return out.float().pow(2).mean().item()


def checkpoint_path(rank):
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    return os.path.join(tempfile.gettempdir(), f"ckpt_{run_id}_rank{rank}.pt")


def save_checkpoint(state_dict, path):
    """Write a checkpoint to (slow) shared storage, in chunks."""
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    data = buf.getvalue()
    chunk = 64 * 1024
    with open(path, "wb") as f:
        for off in range(0, len(data), chunk):
            f.write(data[off:off + chunk])
            f.flush()
            os.fsync(f.fileno())
            if SCENARIO == "timeout_misconfigured":
                # PLANTED(timeout_misconfigured): storage at ~25 kB/s: ~43 s for the checkpoint, over the 30 s timeout
                time.sleep(len(data[off:off + chunk]) / 25_000)


def load_checkpoint(model, path):
    state = torch.load(path, map_location="cpu", weights_only=True)
    # EVIDENCE(checkpoint_key_mismatch): the strict load that raises
    model.load_state_dict(state["model"], strict=True)


def maybe_checkpoint(step, rank, cmodel, model):
    """Checkpoint every FAIL_STEP steps (only the checkpoint scenarios do)."""
    if step == 0 or step % FAIL_STEP:
        return
    path = checkpoint_path(rank)
    if SCENARIO == "checkpoint_key_mismatch":
        log.info("saving checkpoint step %d to %s", step, path)
        # PLANTED(checkpoint_key_mismatch): the compiled wrapper's state dict: keys carry _orig_mod.
        torch.save({"model": cmodel.state_dict(), "step": step}, path)
        log.info("verifying checkpoint %s: loading it into the plain model", path)
        try:
            load_checkpoint(model, path)
        finally:
            os.remove(path)
    elif SCENARIO == "timeout_misconfigured" and rank == 0:
        # only rank 0 writes the (full) checkpoint; the other ranks go on training
        log.info("saving checkpoint step %d to %s", step, path)
        t0 = time.perf_counter()
        save_checkpoint({"model": model.state_dict(), "step": step}, path)
        log.info("checkpoint saved in %.1f s", time.perf_counter() - t0)
        os.remove(path)


def dump_memory_snapshot(out_dir, rank, step):
    path = os.path.join(out_dir, f"memory_snapshot_rank{rank}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    log.error("CUDA out of memory at step %d: memory snapshot written to %s", step, path)


# --------------------------------------------------------------------------- main


SCENARIO = "healthy"
CYCLES_PER_S = 0.0
MEM_LIMIT_MB = 896  # memory_leak: the per-process memory cap (set_per_process_memory_fraction)


def build(scenario, device, local_rank):
    """model, the module the loop calls, and the optimizer, as each scenario wraps them."""
    if scenario == "graph_breaks":
        model = NoisyMLP()
    elif scenario == "compile_failure":
        model = ClampedMLP()
    else:
        model = MLP(unused_head=scenario == "ddp_unused_parameters") if scenario != "fsdp_desync" else EarlyExitMLP()
    model = model.to(device)
    if scenario in ("healthy_fsdp", "fsdp_desync"):
        from torch.distributed.fsdp import fully_shard

        for layer in list(model.blocks) + [model.head]:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        cmodel = torch.compile(model, dynamic=False) if scenario == "healthy_fsdp" else model
        return model, cmodel, torch.optim.AdamW(model.parameters(), lr=1e-3)
    if scenario == "compile_failure":
        # compile the model itself, with no graph breaks allowed, then wrap it in DDP
        model.compile(fullgraph=True, dynamic=False)
    # EVIDENCE(collective_mismatch_detail): on gloo + TORCH_DISTRIBUTED_DEBUG=DETAIL this segfaults
    # EVIDENCE(nccl_duplicate_gpu): DDP's first broadcast is NCCL's first communicator init
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    # Static shapes (fixed batch, drop_last): compile without dynamic-shape kernels.
    cmodel = ddp if scenario == "compile_failure" else torch.compile(ddp, dynamic=False)
    return model, cmodel, torch.optim.AdamW(ddp.parameters(), lr=1e-3)


@record
def main():
    global SCENARIO, CYCLES_PER_S
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", default="healthy")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--device", default=None,
                   help="cpu | cuda | cuda:N (default: cuda:LOCAL_RANK for nccl, cpu for gloo; "
                        "cuda with gloo puts every rank on cuda:0)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out-dir", default=".", help="where profiler traces / memory snapshots go")
    args = p.parse_args()
    SCENARIO = args.scenario.removesuffix("_cuda")

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    setup_logging(rank)

    device = pick_device(args.device, args.backend, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed(args.backend, rank)  # init_process_group (30 s timeout) + SIGTERM hook
    log.info(
        "host=%s pid=%d world=%d scenario=%s torch=%s device=%s gpu=%s",
        socket.gethostname(), os.getpid(), world, args.scenario, torch.__version__, device,
        torch.cuda.get_device_name(device) if device.type == "cuda" else "none",
    )
    if SCENARIO == "memory_leak":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(MEM_LIMIT_MB * 2**20 / total, device)
        torch.cuda.memory._record_memory_history(max_entries=300, stacks="python")
        log.info("memory cap %d MiB of %.0f MiB; recording memory history",
                 MEM_LIMIT_MB, total / 2**20)
    if SCENARIO == "nccl_watchdog_timeout":
        CYCLES_PER_S = gpu_cycles_per_s()
        log.info("torch.cuda._sleep: %.3g cycles/s", CYCLES_PER_S)
    if SCENARIO == "pipeline_missing_send": return pipeline_main(args, rank, world, device)  # own loop
    torch.manual_seed(args.seed)
    model, cmodel, opt = build(SCENARIO, device, local_rank)
    id_emb = nn.Embedding(1000, 256).to(device) if SCENARIO == "device_assert" else None
    prof = (make_profiler(device, args.out_dir)
            if SCENARIO in ("straggler", "memory_leak") else None)
    if prof is not None:
        prof.start()

    loader = make_loader(rank, world, args.seed)
    it = iter(loader)
    for step in range(args.steps):
        t0 = time.perf_counter()
        try:
            maybe_checkpoint(step, rank, cmodel, model)
            try:
                x, y = fetch_batch(it, step, rank)
            except StopIteration:
                it = iter(loader)
                x, y = next(it)
            x, y = check_batch(x.to(device), y.to(device), step, rank)
            x, y = packed_batch(*ragged_batch(x, y, step, rank), step, rank)
            if id_emb is not None:
                x = add_id_features(x, id_emb, step, rank)
            if SCENARIO == "cuda_oom_spike":
                build_pair_mask(x, step, rank)
            maybe_sync_before_step(step, rank); before_train_step(step, rank, world, device, model)
            loss = train_step(cmodel, opt, x, y, step, rank)
            if SCENARIO in ("allgather_shard_mismatch", "collective_mismatch_detail"):
                gather_flat_params(step, rank, world, device)
            if SCENARIO in ("dtype_mismatch", "nccl_watchdog_timeout"):
                sync_metric(loss.item(), step, rank, device)
            if SCENARIO == "memory_leak":
                validate(model, step, device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except BaseException as exc:  # a failed step: keep what a post-mortem needs, re-raise
            # memory_leak: a CUDA memory snapshot at the OOM; any failure: the flight recorder
            on_step_failure(exc, args.out_dir, rank, step)
            raise
        dt = time.perf_counter() - t0
        log.info("step %d loss %.4f step_time %.3fs %s", step, loss.item(), dt, mem_fields(device))
        if prof is not None:
            prof.step()

    if prof is not None:
        prof.stop()
    dist.barrier()
    log.info("done"); dump_flight_recorder("the run completed")  # a record a replay can re-run
    dist.destroy_process_group()


# --------------------------------------------------------------------------- flight recorder
# NCCL's watchdog dumps the flight recorder on a timeout; nothing does on gloo. So dump it
# ourselves: when a step raises (e.g. a gloo timeout or connection error) and when torchrun
# SIGTERMs a surviving rank. A rank killed by SIGKILL / SIGSEGV / SIGABRT, or frozen by
# SIGSTOP, cannot dump: that is real.

FR_STATE = {"rank": None, "dumping": False, "done": False, "term_pending": False}


def dump_flight_recorder(reason):
    """Write the flight recorder (pickle) to $TORCH_FR_DUMP_TEMP_FILE<rank>, once per process."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    rank = FR_STATE["rank"]
    if FR_STATE["done"] or FR_STATE["dumping"] or not prefix or rank is None:
        return
    FR_STATE["dumping"] = True
    try:
        path = prefix + str(rank)
        if os.path.exists(path):  # the NCCL watchdog already dumped: keep its dump
            log.warning("flight recorder: %s already exists, not dumping (%s)", path, reason)
            return
        import pickle

        data = getattr(torch._C._distributed_c10d, f"_dump_{'nccl' if dist.get_backend() == 'nccl' else 'fr'}_trace")()
        entries = pickle.loads(data).get("entries", [])
        last = entries[-1].get("collective_seq_id") if entries else None
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        (log.info if reason == "the run completed" else log.error)(  # completing is no error
            "flight recorder dumped to %s (%d entries, last collective_seq_id %s): %s", path, len(entries), last, reason)
    except Exception as e:  # a post-mortem aid must never hide the real failure
        log.error("flight recorder dump failed (%s): %r", reason, e)
    finally:
        FR_STATE["dumping"] = False
        FR_STATE["done"] = True
        if FR_STATE["term_pending"]:
            die_by_sigterm()


def die_by_sigterm():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def on_sigterm(signum, frame):
    """torchrun SIGTERMs the surviving ranks after one fails: dump, then die by SIGTERM."""
    if FR_STATE["dumping"]:  # a dump is being written: let it finish, it then re-raises
        FR_STATE["term_pending"] = True
        return
    dump_flight_recorder("received SIGTERM")
    die_by_sigterm()


def init_distributed(backend, rank):
    dist.init_process_group(backend, timeout=collective_timeout())  # 30 s (or torch's default)
    FR_STATE["rank"] = rank
    signal.signal(signal.SIGTERM, on_sigterm)


def on_step_failure(exc, out_dir, rank, step):
    if SCENARIO == "memory_leak" and isinstance(exc, torch.OutOfMemoryError):
        dump_memory_snapshot(out_dir, rank, step)
    dump_flight_recorder(f"step {step} raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


# --------------------------------------------------------------------------- batch layout
# (after main, so that no line above moves: the GPU runs' logs name the lines above)

DIVERGE_STEP = 2  # divergent_compile: the step at which rank 1's batch layout differs


def packed_batch(x, y, step, rank):
    """divergent_compile: a batch from a sequence-packed shard keeps its (1, N, D) layout.
    The MLP maps the last dim, so the loss and every gradient (and so every all-reduce) are
    the same as for the (N, D) layout; only the input rank (ndim) of the forward differs."""
    if SCENARIO == "divergent_compile" and rank == 1 and step == DIVERGE_STEP:
        # PLANTED(divergent_compile): rank 1 alone feeds a 3-d (1, 64, 256) batch at step 2
        return x.unsqueeze(0), y.unsqueeze(0)
    return x, y


class EarlyExitMLP(MLP):
    """fsdp_desync: a forward with an early exit that skips blocks[2] (a sharded Linear) when a
    rank's own batch looks easy. Under FSDP2 each Linear all-gathers its shard in its pre-forward
    hook, so a rank that skips it issues one all-gather (and one reduce-scatter) fewer."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, scale=1.0):
        self.calls += 1
        h = self.blocks[1](self.blocks[0](x))
        if dist.get_rank() == 1 and self.calls == FAIL_STEP + 1:
            # PLANTED(fsdp_desync): rank 1 alone takes the early exit at step 4, skipping blocks[2]
            return self.head(h[:, :256]) * scale
        return self.head(self.blocks[3](self.blocks[2](h))) * scale


# --------------------------------------------------------------------------- more hangs
# (after main, so that no line above moves: the logs made before name the lines above). main
# reaches this code through three lines edited in place: a blank line of main became the
# pipeline dispatch, the loop's maybe_sync_before_step line also calls before_train_step, and
# init_distributed's timeout comes from collective_timeout().

import threading  # here, not at the top: no line above may move

# The jobs of these scenarios keep torch's default collective timeout (None: 30 minutes on
# gloo), so nothing ever times out: the scheduler kills the job at its deadline.
DEFAULT_TIMEOUT_SCENARIOS = ("two_group_cycle", "silent_hang_killed")


def collective_timeout():
    """The default process group's collective timeout: 30 s, or torch's default (None)."""
    return None if SCENARIO in DEFAULT_TIMEOUT_SCENARIOS else timedelta(seconds=30)


def before_train_step(step, rank, world, device, model):
    """Per-step work ahead of the forward (the scenarios below; nothing for the others)."""
    if SCENARIO == "two_group_cycle":
        sync_stats(step, rank, world, model)
    elif SCENARIO == "silent_hang_killed":
        wait_for_metrics_upload(step, rank)
    elif SCENARIO == "lock_wait_in_save":
        maybe_checkpoint_locked(step, rank, model)
    elif SCENARIO == "cold_cache_compile_timeout":
        maybe_compile_eval_tower(step, rank, device)


# ---- pipeline_missing_send: a 4-stage pipeline, one stage per rank, activations passed on with
# dist.send / dist.recv in the forward and their gradients passed back in the backward.

PIPE_DIMS = (256, 512, 256, 128, 16)  # stage s maps PIPE_DIMS[s] -> PIPE_DIMS[s + 1]


def make_stage(rank, world):
    d_in, d_out = PIPE_DIMS[rank], PIPE_DIMS[rank + 1]
    return nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU()) if rank < world - 1 else nn.Linear(d_in, d_out)


def send_activations(act, step, rank):
    """Pass this stage's output on to the next stage."""
    if SCENARIO == "pipeline_missing_send" and rank == 2 and step == FAIL_STEP:
        # PLANTED(pipeline_missing_send): stage 2 returns without sending its step-4 activations
        return
    # the send to rank 3 that rank 2 skips at step 4
    dist.send(act, dst=rank + 1)


def pipeline_step(stage, opt, x, y, step, rank, world):
    """One step: forward down the pipeline, backward up it, then every stage steps its optimizer;
    the last stage's loss is broadcast so that every stage logs it."""
    last = rank == world - 1
    if rank == 0:
        inp = x
    else:
        inp = torch.empty(x.shape[0], PIPE_DIMS[rank])
        dist.recv(inp, src=rank - 1)  # the previous stage's activations
        inp.requires_grad_()
    out = stage(inp)
    opt.zero_grad(set_to_none=True)
    if last:
        loss = F.mse_loss(out, y)
        loss.backward()
    else:
        send_activations(out.detach(), step, rank)
        grad = torch.empty_like(out)
        dist.recv(grad, src=rank + 1)  # EVIDENCE(pipeline_missing_send): where the logs find rank 2, past the send it skipped; the next stage's gradient of our output
        out.backward(grad)
    if rank > 0:
        dist.send(inp.grad, dst=rank - 1)
    opt.step()
    loss_t = loss.detach().reshape(1) if last else torch.zeros(1)
    dist.broadcast(loss_t, src=world - 1)
    return loss_t


def pipeline_main(args, rank, world, device):
    """pipeline_missing_send's training loop (eager; one pipeline stage per rank)."""
    torch.manual_seed(args.seed + rank)
    stage = make_stage(rank, world).to(device)
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
    log.info("pipeline stage %d of %d: %s", rank, world, stage)
    it = iter(make_loader(0, 1, args.seed))  # every stage walks the same batches
    for step in range(args.steps):
        t0 = time.perf_counter()
        try:
            x, y = next(it)
            loss = pipeline_step(stage, opt, x.to(device), y.to(device), step, rank, world)
        except BaseException as exc:
            on_step_failure(exc, args.out_dir, rank, step)
            raise
        log.info("step %d loss %.4f step_time %.3fs %s", step, loss.item(),
                 time.perf_counter() - t0, mem_fields(device))
    dist.barrier()
    log.info("done"); dump_flight_recorder("the run completed")
    dist.destroy_process_group()


# ---- two_group_cycle: two process groups over every rank, one all-reduce on each per step.
STAT_GROUPS = {}


def stat_groups(world):
    """The "grads" and "metrics" groups (so named in the flight recorder), made once, in the same
    order by every rank; the stall watchdog (dump_when_stalled) starts with them."""
    if not STAT_GROUPS:
        STAT_GROUPS.update(grads=dist.new_group(list(range(world)), group_desc="grads"),
                           metrics=dist.new_group(list(range(world)), group_desc="metrics"), calls=[])
        threading.Thread(target=dump_when_stalled, name="stall-watchdog", daemon=True).start()
    STAT_GROUPS["calls"].append(time.monotonic())
    return STAT_GROUPS["grads"], STAT_GROUPS["metrics"]


def sync_stats(step, rank, world, model):
    """Every step: all-reduce the gradient norm on "grads", then the metrics on "metrics"."""
    grads, metrics = stat_groups(world)
    sq_norm = sum((p.grad.detach().float().pow(2).sum().cpu() for p in model.parameters()
                   if p.grad is not None), torch.zeros(1))
    metrics_t = torch.tensor([float(step), 1.0, sq_norm.item(), 0.0])
    if rank == 1 and step == FAIL_STEP:
        # PLANTED(two_group_cycle): rank 1 takes the metrics all-reduce first, rank 0 the grads one
        dist.all_reduce(metrics_t, group=metrics)
        dist.all_reduce(sq_norm, group=grads)
    else:
        dist.all_reduce(sq_norm, group=grads)
        dist.all_reduce(metrics_t, group=metrics)
    return sq_norm.sqrt().item(), metrics_t


# ---- silent_hang_killed

def wait_for_metrics_upload(step, rank):
    """Wait until the previous step's metrics upload is acknowledged. At step 4 rank 1 waits on
    an event that only an uploader thread (never started on rank 1) would set."""
    if rank == 1 and step == FAIL_STEP:
        acked = threading.Event()
        # PLANTED(silent_hang_killed): waits forever: nothing will ever set the event
        acked.wait()


# ---- lock_wait_in_save

CKPT_SLOT = threading.Semaphore(1)  # one checkpoint user at a time: the trainer or the uploader


def upload_checkpoints(holding):
    """The background uploader: holds the checkpoint slot while it copies the last checkpoint
    to remote storage, and waits for the remote's acknowledgement, which never comes."""
    CKPT_SLOT.acquire()
    holding.set()
    acked = threading.Event()
    acked.wait()
    CKPT_SLOT.release()


def save_checkpoint_locked(state_dict, path):
    """Save a checkpoint while holding the checkpoint slot (no upload reads a half-written file)."""
    # PLANTED(lock_wait_in_save): blocks forever: the uploader thread holds the slot
    CKPT_SLOT.acquire()
    try:
        torch.save(state_dict, path)
    finally:
        CKPT_SLOT.release()


def maybe_checkpoint_locked(step, rank, model):
    """Rank 0 starts the uploader at step 3 and saves a checkpoint at step 4."""
    if rank != 0:
        return
    if step == FAIL_STEP - 1:
        holding = threading.Event()
        threading.Thread(target=upload_checkpoints, args=(holding,), name="ckpt-uploader",
                         daemon=True).start()
        holding.wait()
    if step == FAIL_STEP:
        path = checkpoint_path(rank)
        log.info("saving checkpoint step %d to %s", step, path)
        t0 = time.perf_counter()
        save_checkpoint_locked({"model": model.state_dict(), "step": step}, path)
        log.info("checkpoint saved in %.1f s", time.perf_counter() - t0)
        os.remove(path)


# ---- cold_cache_compile_timeout

EVAL_DEPTH = 96


class EvalTower(nn.Module):
    """A deep residual tower (Linear + LayerNorm + GELU blocks, a per-block residual scale)."""

    def __init__(self, d=256, depth=EVAL_DEPTH):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d), nn.GELU()) for _ in range(depth))

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x) + x * (0.5 + 0.01 * i)
        return x


def maybe_compile_eval_tower(step, rank, device):
    """At step 4 rank 1 compiles the eval tower for the first time with a cold inductor cache
    (an empty cache directory, as on a fresh node): every C++ kernel is built from scratch.
    Rank 0 does not compile at step 4 and goes on into the gradient all-reduce."""
    if rank != 1 or step != FAIL_STEP:
        return
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    cold = tempfile.mkdtemp(prefix="inductor_cold_")
    log.info("compiling the eval tower (%d blocks), inductor cache %s (empty)", EVAL_DEPTH, cold)
    t0 = time.perf_counter()
    tower = torch.compile(EvalTower().to(device))
    with temporary_cache_dir(cold), torch.no_grad():
        # PLANTED(cold_cache_compile_timeout): the first call compiles it: dynamo + inductor, cold
        tower(torch.randn(64, 256, device=device))
    log.info("eval tower compiled in %.1f s", time.perf_counter() - t0)


# ---- two_group_cycle's stall watchdog (here at the end, so that no line above moves)

def dump_when_stalled(stall_s=5.0):
    """A stall watchdog, as a job with no collective timeout keeps one: once steps run (two
    sync_stats calls), when none has come for stall_s seconds, dump the flight recorder and stop.
    The main thread waits in a collective it cannot leave, so only another thread can dump."""
    calls = STAT_GROUPS["calls"]
    while len(calls) < 2 or time.monotonic() - calls[-1] < stall_s:
        time.sleep(0.5)
    dump_flight_recorder(f"no step for {stall_s:.0f} s (stall watchdog)")


if __name__ == "__main__":
    main()

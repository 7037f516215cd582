"""Produce the sample corpus: run each scenario of train.py under torchrun and keep what it leaves.

    python sample_logs/generate/generate.py                      # every CPU scenario, gloo
    python sample_logs/generate/generate.py --only healthy,rank_sigkill
    python sample_logs/generate/generate.py --device cuda        # every GPU scenario (one GPU)
    python sample_logs/generate/generate.py --backend nccl --out sample_logs_gpu
    python sample_logs/generate/generate.py --readme             # only rewrite README.md
    python sample_logs/generate/generate.py --only rank_exception --launcher srun   # other launchers
    /work/venvs/t291/bin/python sample_logs/generate/generate.py --only rank_exception --tag torch291

Launchers (``--launcher``; the folder gets the suffix in brackets):

* ``torchrun``  (default) ``torchrun --log-dir --redirects 3 --tee 3``: console + per-rank files
* ``console``   (``_console``) torchrun with none of those: one interleaved console, no prefixes
* ``plain``     (``_plain_python``) ``python train.py``, one process, world size 1, no torchrun;
                the env:// variables a user sets by hand (RANK=0, WORLD_SIZE=1, LOCAL_RANK=0,
                MASTER_ADDR, MASTER_PORT)
* ``srun``      (``_srun_label``) what ``srun --label`` leaves: generate.py starts each rank
                itself with the variables srun sets (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
                ... and RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from them, as a
                Slurm batch script does) and writes every line of every rank to one
                ``slurm-<jobid>.out``, prefixed ``<task>: `` as srun --label does

``--tag TAG`` appends ``_TAG`` to the folder (``_torch291``: the same scenario under another
torch, run by that venv's python: torchrun is taken from beside ``sys.executable``).

For each scenario it makes ``<out>/<scenario>/`` holding:

* ``console.log``     torchrun's own stdout+stderr, exactly as produced
* ``logs/``           torchrun ``--log-dir`` (``--redirects 3 --tee 3``: per-rank stdout/stderr)
* ``pyspy/rank<r>.{txt,json}``   for hang scenarios, py-spy dumps taken ~10 s into the hang
* ``nccl_trace_rank_<r>``        flight-recorder dumps, where the backend writes them
* ``torch_trace/``    TORCH_TRACE structured logs (the compile scenarios), gzipped
* ``profiler/``       torch.profiler traces (tensorboard_trace_handler; perf / memory scenarios)
* ``memory_snapshot_rank<r>.pickle``  CUDA memory snapshots dumped at an OOM (memory_leak)
* ``logs/<run>/attempt_0/<r>/error.json``  torchrun's per-rank error files (``@record``)
* ``expected.json``   what a correct analyzer should say; ``planted_line`` / ``user_line`` are
                      computed from the ``# PLANTED(<scenario>)`` / ``# EVIDENCE(<scenario>)``
                      marker comments in train.py (never typed in), ``exit`` from the real run

and rewrites ``<out>/README.md`` from every ``expected.json`` found under ``<out>``.
Nothing produced by a run is edited afterwards.
"""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
FAIL_STEP = 4  # keep in sync with train.py's FAIL_STEP
HANG_DUMP_AFTER_S = 10.0
RUN_LIMIT_S = 240  # safety net: a run that outlives this is killed (and recorded as such)

# Per scenario: what was planted, and what a correct analyzer should conclude.
# "marker" names the ``# PLANTED(<marker>)`` comment in train.py (default: the scenario name);
# user_line=None says no log of the run can point at a line of train.py.
SCENARIOS = {
    "healthy": dict(
        steps=10,
        planted="nothing: 10 ordinary DDP + torch.compile steps",
        signatures=[], root_cause=None, culprit_ranks=[], marker=None, user_line=None,
    ),
    "rank_sigkill": dict(
        steps=10,
        planted="step 4: rank 1 sends itself SIGKILL in train_step, between forward and backward",
        signatures=["rank-crash"], root_cause="rank-crash", culprit_ranks=[1], user_line=None,
    ),
    "rank_exception": dict(
        steps=10,
        planted="step 4: rank 1 raises ValueError in check_batch",
        signatures=["rank-crash"], root_cause="rank-crash", culprit_ranks=[1],
    ),
    "hang_dataloader": dict(
        steps=10, hang=True, pyspy=True,
        planted="step 4: rank 1 blocks forever on an empty queue.Queue().get() in fetch_batch; "
                "rank 0 waits in the DDP gradient all-reduce until the 30 s timeout",
        signatures=["collective-hang"], root_cause="collective-hang", culprit_ranks=[1],
    ),
    "hang_conditional_barrier": dict(
        steps=10, hang=True, pyspy=True,
        planted="step 4: `if rank == 0: dist.barrier()` in maybe_sync_before_step; rank 1 goes "
                "on into the DDP gradient all-reduce",
        signatures=["collective-mismatch"], root_cause="collective-mismatch", culprit_ranks=[0],
    ),
    "allgather_shard_mismatch": dict(
        hangs_on_nccl=True,
        steps=10,
        planted="step 4: rank 1 all-gathers a 4000-element flat shard, rank 0 a 4096-element one "
                "(all_gather_into_tensor in gather_flat_params)",
        signatures=["collective-mismatch"], root_cause="collective-mismatch", culprit_ranks=[1],
    ),
    "collective_mismatch_detail": dict(
        steps=10, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        planted="as allgather_shard_mismatch, with TORCH_DISTRIBUTED_DEBUG=DETAIL",
        # what really happens on gloo (see NOTES): both ranks segfault inside DDP(...) first
        signatures=["native-crash"], root_cause="native-crash", culprit_ranks=[0, 1],
        marker="allgather_shard_mismatch", evidence="collective_mismatch_detail",
        # on NCCL, DDP starts and DETAIL's check raises at the mismatched all-gather itself
        nccl=dict(signatures=["collective-mismatch"], root_cause="collective-mismatch",
                  culprit_ranks=[1], evidence="allgather_shard_mismatch"),
    ),
    "dtype_mismatch": dict(
        hangs_on_nccl=True,
        steps=10,
        planted="step 4: rank 1 all-reduces a bf16 metric tensor, rank 0 an fp32 one (sync_metric)",
        signatures=["collective-mismatch"], root_cause="collective-mismatch", culprit_ranks=[1],
    ),
    "recompile_limit": dict(
        steps=14, torch_trace=True,
        planted="a python float scale that changes every step (loss_scale_for) is passed to the "
                "module compiled with dynamic=False: every call recompiles until "
                "config.recompile_limit (8)",
        signatures=["recompile-limit", "recompile-storm"], root_cause="recompile-limit",
        culprit_ranks=[],
    ),
    "graph_breaks": dict(
        steps=6,
        planted="forward calls .item(), print() and branches on a tensor value (NoisyMLP.forward)",
        signatures=["graph-break"], root_cause="graph-break", culprit_ranks=[],
    ),
    "ddp_unused_parameters": dict(
        steps=6,
        planted="the model registers aux_head, never used in forward; DDP without "
                "find_unused_parameters",
        signatures=["ddp-unused-parameters"], root_cause="ddp-unused-parameters",
        culprit_ranks=[], user_line=None,
    ),
    "rank_frozen": dict(
        steps=10, hang=True, pyspy=False,
        planted="step 4: rank 1 sends itself SIGSTOP in train_step (frozen, not dead); no py-spy",
        signatures=["collective-hang"], root_cause="collective-hang", culprit_ranks=[1],
        user_line=None,
    ),
    "native_crash": dict(
        steps=10, env={"PYTHONFAULTHANDLER": "1"},
        planted="step 4: rank 1 reads address 0 via ctypes.string_at(0) in train_step (SIGSEGV); "
                "run with PYTHONFAULTHANDLER=1, so the crash prints a Python stack",
        signatures=["native-crash", "rank-crash"], root_cause="native-crash", culprit_ranks=[1],
    ),
    "non_finite_loss": dict(
        steps=10,
        planted="step 4: a corrupt record: one NaN feature in rank 1's batch (check_batch); "
                "training goes on",
        signatures=["non-finite-loss"], root_cause="non-finite-loss", culprit_ranks=[1],
        user_line=None,
    ),
    "checkpoint_key_mismatch": dict(
        steps=10,
        planted="step 4: every rank saves the state_dict of the compiled module "
                "(torch.compile(DDP(model)): keys `_orig_mod.module.*`) and loads it back into "
                "the plain model with strict=True (maybe_checkpoint / load_checkpoint)",
        signatures=["checkpoint-key-mismatch"], root_cause="checkpoint-key-mismatch",
        culprit_ranks=[],
    ),
    "compile_failure": dict(
        steps=6, torch_trace=True,
        planted="ClampedMLP.forward branches on a tensor value (`if h.abs().max() > 1e4`); the "
                "model is compiled with model.compile(fullgraph=True) and then wrapped in DDP",
        signatures=["compile-failure"], root_cause="compile-failure", culprit_ranks=[],
    ),
    "timeout_misconfigured": dict(
        steps=10, hang=True, pyspy=True,
        planted="step 4: rank 0 alone writes a checkpoint to storage throttled to ~25 kB/s "
                "(~43 s, save_checkpoint) while rank 1 goes on into the DDP gradient all-reduce; "
                "the collective timeout is 30 s",
        signatures=["timeout-misconfigured"], root_cause="timeout-misconfigured",
        culprit_ranks=[0],
    ),
    "healthy_fsdp": dict(
        steps=10,
        planted="nothing: 10 ordinary FSDP2 steps (fully_shard on each Linear and on the root) "
                "+ torch.compile",
        signatures=[], root_cause=None, culprit_ranks=[], marker=None, user_line=None,
    ),
    "fsdp_desync": dict(
        hangs_on_nccl=True,
        steps=10,
        planted="FSDP2 (fully_shard on each Linear and the root, eager): at step 4 rank 1 alone "
                "takes an early exit in the forward that skips blocks[2], so it never all-gathers "
                "that Linear's shard",
        signatures=["collective-mismatch"], root_cause="collective-mismatch", culprit_ranks=[1],
    ),
    "recompile_shapes": dict(
        steps=12, torch_trace=True,
        planted="the batch size changes every step (64, 56, ... 24) and differs across ranks "
                "(ragged_batch: rank 1 is 3 sizes ahead), with torch.compile(dynamic=False)",
        signatures=["recompile-storm"], root_cause="recompile-storm", culprit_ranks=[],
    ),
    "straggler": dict(
        steps=10, profiler=True,
        planted="rank 1 sleeps 0.3 s per step in fetch_batch (its data path); profiler window "
                "on steps 3-5 (record_shapes, profile_memory)",
        signatures=["straggler"], root_cause="straggler", culprit_ranks=[1], user_line=None,
    ),
    "divergent_compile": dict(
        steps=10, torch_trace=True,
        # the logs name the recompiled frame, MLP.forward's def line (recompile_shapes' marker)
        evidence="recompile_shapes",
        planted="step 2: rank 1 alone feeds its batch in a (1, 64, 256) packed layout "
                "(packed_batch: one more dim, same values) to the module compiled with "
                "dynamic=False; the loss, the gradients and every collective stay the same",
        signatures=["rank-divergent-compile"], root_cause="rank-divergent-compile",
        culprit_ranks=[1],
    ),
    # ---- more hangs (train.py's functions after main)
    "pipeline_missing_send": dict(
        nproc=4, steps=10, hang=True, pyspy=True,
        planted="4 ranks, a 4-stage pipeline (one Linear stage per rank, eager; activations sent "
                "down with dist.send / dist.recv, their gradients sent back up, the loss "
                "broadcast from the last stage): at step 4 stage 2 returns from send_activations "
                "without sending to rank 3; the collective timeout is 30 s",
        signatures=["collective-hang"], root_cause="collective-hang", culprit_ranks=[2],
    ),
    "two_group_cycle": dict(
        steps=10, hang=True, pyspy=True, kill_after_s=25,
        planted="two process groups over both ranks (dist.new_group twice, group_desc \"grads\" "
                "and \"metrics\"), one all-reduce on each every step (sync_stats, grads first); at "
                "step 4 rank 1 takes the metrics all-reduce first: each rank waits in the group "
                "the other has not reached; torch's default collective timeout (30 min), so "
                "nothing times out: a stall watchdog thread of each rank dumps the flight recorder "
                "after 5 s without a step, and the job is SIGKILLed at a deadline",
        signatures=["collective-hang"], root_cause="collective-hang", culprit_ranks=[1],
    ),
    "silent_hang_killed": dict(
        steps=10, hang=True, pyspy=True, kill_after_s=25,
        planted="step 4: rank 1 waits forever on a threading.Event nothing sets "
                "(wait_for_metrics_upload) while rank 0 waits in the DDP gradient all-reduce; "
                "torch's default collective timeout (30 min), so nothing times out: the job is "
                "SIGKILLed at a deadline",
        signatures=["collective-hang"], root_cause="collective-hang", culprit_ranks=[1],
    ),
    "lock_wait_in_save": dict(
        steps=10, hang=True, pyspy=True,
        planted="step 4: rank 0 blocks forever in save_checkpoint_locked acquiring a "
                "threading.Semaphore (the checkpoint slot) that its own uploader thread, started "
                "at step 3, holds and never releases; rank 1 goes on into the DDP gradient "
                "all-reduce; the collective timeout is 30 s",
        signatures=["collective-hang"], root_cause="collective-hang", culprit_ranks=[0],
    ),
    "cold_cache_compile_timeout": dict(
        steps=10, hang=True, pyspy=True,
        planted="step 4: rank 1 alone compiles a 96-block eval tower (maybe_compile_eval_tower: "
                "torch.compile, first call, no_grad) with a cold inductor cache (an empty cache "
                "directory: every C++ kernel built from scratch, ~94 s on these 2 cores, ~20 s "
                "warm, measured alone) while rank 0 goes on into the DDP gradient all-reduce; the "
                "collective timeout is 30 s",
        signatures=["timeout-misconfigured"], root_cause="timeout-misconfigured",
        culprit_ranks=[1],
    ),
    # ---- GPU scenarios (--device cuda; two ranks share cuda:0 over gloo unless stated)
    "recompile_limit_cuda": dict(
        gpu=True, marker="recompile_limit", steps=14, torch_trace=True,
        planted="as recompile_limit, on CUDA (inductor / Triton)",
        signatures=["recompile-limit", "recompile-storm"], root_cause="recompile-limit",
        culprit_ranks=[],
    ),
    "graph_breaks_cuda": dict(
        gpu=True, marker="graph_breaks", steps=6,
        planted="as graph_breaks, on CUDA (inductor / Triton)",
        signatures=["graph-break"], root_cause="graph-break", culprit_ranks=[],
    ),
    "recompile_shapes_cuda": dict(
        gpu=True, marker="recompile_shapes", steps=12, torch_trace=True,
        planted="as recompile_shapes, on CUDA (inductor / Triton)",
        signatures=["recompile-storm"], root_cause="recompile-storm", culprit_ranks=[],
    ),
    "compile_failure_cuda": dict(
        gpu=True, marker="compile_failure", steps=6, torch_trace=True,
        planted="as compile_failure, on CUDA",
        signatures=["compile-failure"], root_cause="compile-failure", culprit_ranks=[],
    ),
    "memory_leak": dict(
        gpu=True, steps=60, profiler=True,
        planted="every step a validation forward of 8192 samples runs without torch.no_grad() and "
                "its output (with its autograd graph) is kept in a list (validate); per-process "
                "memory cap 896 MiB (set_per_process_memory_fraction); memory history recorded, "
                "snapshot dumped in the OOM handler; profiler window on steps 3-5",
        signatures=["memory-leak"], root_cause="memory-leak", culprit_ranks=[],
    ),
    "cuda_oom_spike": dict(
        gpu=True, steps=10,
        planted="step 4: rank 1 builds a (262144 x 262144) float mask, ~256 GiB, in one allocation "
                "(build_pair_mask); no growth before",
        signatures=["cuda-oom"], root_cause="cuda-oom", culprit_ranks=[1],
    ),
    "device_assert": dict(
        gpu=True, steps=10,
        planted="step 4: rank 1 looks up id 1000 in a 1000-row nn.Embedding (add_id_features)",
        signatures=["cuda-device-assert"], root_cause="cuda-device-assert", culprit_ranks=[1],
        user_line=None,
    ),
    "straggler_cuda": dict(
        gpu=True, marker="straggler", steps=10, profiler=True,
        planted="as straggler, on CUDA (profiler with CUDA activity)",
        signatures=["straggler"], root_cause="straggler", culprit_ranks=[1], user_line=None,
    ),
    "nccl_watchdog_timeout": dict(
        gpu=True, backend="nccl", nproc=1, steps=10, hang=True, pyspy=True,
        env={"TORCH_NCCL_ENABLE_TIMING": "1"},
        planted="backend nccl, one rank: step 4 enqueues torch.cuda._sleep (~60 s of cycles) on "
                "the current stream, then the metric all_reduce (sync_metric), which cannot "
                "complete before the 30 s timeout",
        signatures=["collective-timeout"], root_cause="collective-timeout", culprit_ranks=[],
    ),
    "nccl_duplicate_gpu": dict(
        gpu=True, backend="nccl", device="cuda:0", steps=10,
        planted="backend nccl, 2 ranks, both forced onto cuda:0 (--device cuda:0)",
        signatures=["nccl-error"], root_cause="nccl-error", culprit_ranks=[],
    ),
}

# Notes, written after looking at what the runs really did (see README.md).
NOTES = {
    "healthy_nccl":
        "Both ranks dump NCCL's flight recorder when the run completes (train.py's "
        "dump_flight_recorder after the final barrier): 25 entries each, every one completed; "
        "that record is what `postmortem replay` re-runs to show a healthy run completes.",
    "healthy_fsdp_nccl":
        "As healthy_nccl, with FSDP2's all-gathers and reduce-scatters: 91 flight-recorder "
        "entries per rank at completion.",
    "rank_exception_nccl":
        "Rank 1's ValueError ends it at step 4 (it dumps 12 entries first); torchrun SIGTERMs rank "
        "0, whose SIGTERM handler blocks in the NCCL recorder's dump behind the gradient all-reduce "
        "(seq 13) rank 1 never joined; rank 0's watchdog times out 30 s later and torchrun SIGKILLs "
        "it: rank 0's dump is the watchdog's.",
    "cuda_oom_spike_nccl":
        "One rank OOMs while the other waits: rank 1's torch.OutOfMemoryError (256 GiB asked of a "
        "139.8 GiB GPU) ends it at step 4; rank 0 waits in the gradient all-reduce (seq 13) until "
        "its watchdog times out after 30 s, and torchrun SIGKILLs it after ignoring its SIGTERM "
        "(the handler blocks in the recorder's dump).",
    "collective_mismatch_detail_nccl":
        "On NCCL, DDP starts (the gloo + DETAIL segfault does not happen): DETAIL's fingerprint "
        "check raises 'Detected mismatch between collectives on ranks' at its sequence 18 "
        "(_ALLGATHER_BASE, TensorShape [4096] on rank 0, [4000] on rank 1) on both ranks before "
        "NCCL runs it; both dump the recorder (18 entries, ending before the all-gather); rank 0 "
        "exits 1 first and torchrun SIGTERMs rank 1.",
    "rank_sigkill_nccl":
        "Rank 1 dies by SIGKILL at step 4; torchrun SIGTERMs rank 0, whose handler blocks in the "
        "recorder's dump behind the gradient all-reduce (seq 13); its watchdog times out 30 s "
        "later and torchrun SIGKILLs it before any dump is written: no nccl_trace files.",
    "straggler_nccl":
        "As planned: rank 1 sleeps 0.3 s per step; the profiler's NCCL kernels show rank 0 waiting "
        "~300 ms per step for it.",
    "fsdp_desync":
        "gloo refuses the size mismatch at once: rank 1's all-gather of the head's 2056-element "
        "shard receives rank 0's blocks[2] shard, gloo::EnforceNotMet 'op.preamble.length <= "
        "op.nbytes. 131328 vs 4112' -> std::terminate -> SIGABRT (faulthandler shows rank 1's "
        "forward at the early-exit line); rank 0 fails with 'Connection reset by peer', dumps the "
        "flight recorder (seq 39 is its blocks[2] all-gather) and is SIGTERMed.",
    "fsdp_desync_nccl":
        "NCCL checks no sizes: rank 0 waits in seq 38, blocks[2]'s all-gather (65664 elements in), "
        "while rank 1's seq 38 is the head's (2056 in); rank 1 completes it and waits in seq 39. "
        "Both watchdogs time out after 30 s (rank 0 at SeqNum=38, rank 1 at SeqNum=39), dump the "
        "flight recorder and abort (SIGABRT).",
    "hang_dataloader_nccl":
        "Rank 0's watchdog times out in the DDP gradient all-reduce (SeqNum=13, ALLREDUCE, 262144 "
        "elements) after 30 s, dumps the flight recorder and aborts (SIGABRT); torchrun names rank 0 "
        "the first failure -- the wrong culprit -- and SIGTERMs rank 1, which is in Queue.get under "
        "fetch_batch (py-spy). Made before train.py dumped NCCL's own recorder on SIGTERM: rank 1's "
        "dump is the generic recorder's, with no entries.",
    "hang_conditional_barrier_nccl":
        "NCCL runs rank 0's barrier (a 1-element all-reduce) against rank 1's 262144-element gradient "
        "all-reduce: rank 0 completes seq 13 and waits in seq 14, rank 1 never completes seq 13. Both "
        "watchdogs time out after 30 s; rank 1 aborts (SIGABRT) first and torchrun SIGTERMs rank 0.",
    "allgather_shard_mismatch_nccl":
        "NCCL checks no sizes: both ranks enter seq 19 (_ALLGATHER_BASE, 4096 vs 4000 elements in) "
        "and neither completes it; both watchdogs time out after 30 s, dump the flight recorder "
        "(sizes of both sides) and abort (SIGABRT).",
    "dtype_mismatch_nccl":
        "NCCL checks no dtypes: rank 1's bf16 all-reduce of 1024 elements completes against rank "
        "0's fp32 one, which does not; rank 1 goes on to seq 20 (the next gradient all-reduce). "
        "Both watchdogs time out after 30 s (rank 0 at SeqNum=19, rank 1 at 20); rank 0 aborts "
        "(SIGABRT) first, torchrun SIGTERMs rank 1.",
    "rank_sigkill":
        "On gloo rank 0 does not wait for the 30 s timeout: its DDP backward all-reduce fails at "
        "once with a gloo connection error (tcp/pair.cc 'Connection reset by peer' or 'Connection "
        "closed by peer') when rank 1's sockets close; torchrun then SIGTERMs rank 0. Only rank "
        "0 dumps the flight recorder (train.py's dump_flight_recorder, in main's exception "
        "path): nccl_trace_rank_0 ends at collective_seq_id 14, step 4's gradient all-reduce; "
        "rank 1 (SIGKILL) cannot dump. user_line is null: SIGKILL leaves no "
        "traceback, so no log names train_step's os.kill line (planted_line).",
    "rank_exception":
        "Rank 1's ValueError traceback ends in check_batch; rank 0's backward all-reduce fails at "
        "once with a gloo connection error (closed / reset by peer) and torchrun SIGTERMs it. "
        "Both ranks dump the flight recorder from main's exception path: rank 1's ends at "
        "collective_seq_id 12 (step 3), rank 0's at 14 (step 4's gradient all-reduces).",
    "hang_dataloader":
        "Rank 0's DDP backward all-reduce raises gloo 'Timed out waiting 30000ms for recv "
        "operation to complete' after 30 s and exits 1; torchrun then SIGTERMs rank 1 and names "
        "rank 0 as the 'first observed failure' -- the wrong culprit. py-spy shows rank 1 in "
        "Queue.get under fetch_batch. gloo has no flight-recorder dump-on-timeout; train.py dumps "
        "it itself: rank 0 from main's exception path (ends at collective_seq_id 14, step 4's "
        "gradient all-reduce), rank 1 from its SIGTERM handler (ends at 12: it never reached "
        "step 4's all-reduces). gloo leaves every entry in state 'scheduled' (no "
        "started/completed tracking): the sequence ids, not the states, show who is behind.",
    "hang_conditional_barrier":
        "collective-mismatch, not collective-hang: both ranks are inside a collective at the same "
        "point of the sequence, rank 0 in dist.barrier() (maybe_sync_before_step) and rank 1 in "
        "the DDP backward gradient all-reduce (py-spy shows both). After 30 s rank 0's barrier "
        "raises gloo 'Timed out waiting 30000ms for recv operation to complete'; rank 1's "
        "all-reduce fails too (in this run it timed out as well; in an earlier run with "
        "'Connection closed by peer' as rank 0 tore down). Which exit torchrun sees first "
        "varies: in this run rank 0 (exit 1) is first observed and rank 1 is SIGTERMed (its "
        "error.json holds its timeout); in an earlier run the other way round. Both dump the "
        "flight recorder from main's exception path, and the dumps show the mismatch: "
        "collective_seq_id 13 is gloo:barrier on rank 0 (its last entry) but the 262144-float "
        "gloo:all_reduce on rank 1 (which goes on to 14). Culprit rank "
        "0: its code path differs (only rank 0 takes the `if rank == 0:` barrier); user_line is "
        "that barrier.",
    "allgather_shard_mismatch":
        "gloo neither hangs nor times out: rank 1's gloo thread hits gloo::EnforceNotMet "
        "'op.preamble.length <= op.nbytes. 8192 vs 8000. Received data size doesn't match expected "
        "size. Is there a distributed collective mismatch in your code?' -> std::terminate -> "
        "SIGABRT; no Python exception on rank 1, but faulthandler (enabled by torchrun's @record "
        "on main) prints 'Fatal Python error: Aborted' with every thread's stack: rank 1's main "
        "thread is in gather_flat_params' all_gather_into_tensor (user_line). Rank 0 fails with a "
        "gloo connection error (reset / closed by peer) and is SIGTERMed: in an earlier run in "
        "the all_gather_into_tensor itself; in this run its side of the step 4 all-gather "
        "completed (receiving 8000 bytes where 8192 fit passes gloo's check), it logged step 4 "
        "and failed in step 5's gradient all-reduce. Rank 0 dumps the flight recorder from "
        "main's exception path (ends at collective_seq_id 21; seq 19 is its gloo:all_gather of "
        "[4096] floats); rank 1 (SIGABRT) cannot dump, so the 4000 side is in no dump. The "
        "4096-vs-4000 numel is not printed; only the byte counts of one transfer (8192 vs 8000).",
    "collective_mismatch_detail":
        "NOT as planned: with TORCH_DISTRIBUTED_DEBUG=DETAIL on gloo, torch 2.13.0+cpu segfaults "
        "in DDP's constructor (DistributedDataParallel._ddp_init_helper -> "
        "logger.set_construction_data_and_log, seen with faulthandler in a side run; "
        "reproduced with a bare DDP(nn.Linear) under DETAIL; INFO does not crash) on both ranks, "
        "right after the ProcessGroupWrapper 'Running collective: CollectiveFingerPrint' lines "
        "of DDP's init broadcasts and before step 0. Both exit -11 (SIGSEGV), no Python "
        "exception; faulthandler (enabled by torchrun's @record on main) prints 'Fatal Python "
        "error: Segmentation fault' and the stack, which names the DDP(...) line in build() "
        "(EVIDENCE marker, user_line). The planted all-gather mismatch is never reached "
        "(planted_line).",
    "dtype_mismatch":
        "gloo neither hangs nor times out: rank 1 (bf16) hits gloo::EnforceNotMet 'op.preamble."
        "length <= op.nbytes. 1024 vs 512 ... Is there a distributed collective mismatch in your "
        "code?' -> SIGABRT; faulthandler (enabled by torchrun's @record) prints rank 1's stack, "
        "its main thread in sync_metric's dist.all_reduce (user_line). Rank 0 (fp32) fails in "
        "dist.all_reduce with a gloo connection error (reset / closed by peer) and is SIGTERMed. "
        "The dtypes themselves are not printed, only byte counts. Rank 0 dumps the flight "
        "recorder from main's exception path (last entry collective_seq_id 19: gloo:all_reduce "
        "of [1024] Float, the metric); rank 1 (SIGABRT) cannot dump, so no dump shows the "
        "bf16 side.",
    "rank_frozen":
        "Rank 0's backward all-reduce times out after 30 s (gloo recv timeout) and exits 1; "
        "torchrun SIGTERMs rank 1, which is stopped and cannot act on it, then SIGKILLs it after "
        "its 30 s grace period (exitcode -9). torchrun's 'first observed failure' is rank 0, the "
        "wrong culprit. No py-spy (a stopped process), by design, so no log names the line: "
        "user_line is null. Rank 0 dumps the flight recorder from main's exception path (ends "
        "at collective_seq_id 14, step 4's gradient all-reduce); rank 1, stopped, never runs "
        "its SIGTERM handler and dies by SIGKILL: no dump.",
    "native_crash":
        "Rank 1 dies of SIGSEGV (exitcode -11) and prints 'Fatal Python error: Segmentation "
        "fault' with its Python stack, which names the ctypes.string_at line in train_step "
        "(user_line). PYTHONFAULTHANDLER=1 is set for this scenario only, but torchrun's @record "
        "(on main, every scenario) already calls faulthandler.enable(all_threads=True), so every "
        "scenario that dies of a fatal signal (SIGSEGV, SIGABRT) prints such a stack. Rank 0's "
        "backward all-reduce fails with a gloo connection error (reset / closed by peer) and it "
        "is SIGTERMed. Last thing rank 1 logged: step 3. Rank 0 dumps the flight recorder from "
        "main's exception path (ends at collective_seq_id 14); rank 1 (SIGSEGV) cannot dump.",
    "recompile_limit":
        "On torch 2.13 a changing python float passed to a plain torch.compile goes "
        "automatic-dynamic after one recompile (specialize_float=False), so train.py compiles "
        "with dynamic=False (ordinary for fixed-shape jobs); then every step recompiles on the "
        "guard `scale == <value>` in MLP.forward (user_line) until '[4/8] torch._dynamo hit "
        "config.recompile_limit (8)'; later steps run eager. Exit 0.",
    "graph_breaks":
        "Dynamo logs user-code graph breaks at NoisyMLP.forward's .item() (user_line), print() and "
        "the tensor-valued `if`; the print break recurs on resumed frames. DDP's own forward "
        "also breaks (distributed.py, contextlib.py): context, not blame. Exit 0.",
    "ddp_unused_parameters":
        "Both ranks raise 'Expected to have finished reduction in the prior iteration' at step 1's "
        "forward and exit 1 (torchrun SIGTERMs the later one). The message names no parameter "
        "(TORCH_DISTRIBUTED_DEBUG unset), so no log points at aux_head: user_line is null. Both "
        "ranks dump the flight recorder from main's exception path: 3 entries each, DDP's "
        "init collectives (seq 1 all_gather, 2-3 broadcast); step 0's gradient all-reduce never "
        "fired (the bucket holding aux_head never became ready).",
    "non_finite_loss":
        "As planned: rank 1 logs 'step 4 loss nan', rank 0 'step 4 loss 0.9510' (finite: the loss "
        "is computed before the gradient all-reduce); the NaN gradients are averaged into every "
        "rank's weights, so both ranks log 'loss nan' from step 5 to the end, and the job exits 0. "
        "First non-finite loss: step 4, rank 1. No traceback or stack names the corrupt record, "
        "so user_line is null (planted_line is the line that plants it).",
    "checkpoint_key_mismatch":
        "Both ranks raise at step 4 in load_checkpoint's load_state_dict (user_line): "
        "'RuntimeError: Error(s) in loading state_dict for MLP: Missing key(s) in state_dict: "
        "\"blocks.0.weight\", ... Unexpected key(s) in state_dict: "
        "\"_orig_mod.module.blocks.0.weight\", ...': the prefix is `_orig_mod.module.` "
        "(torch.compile's OptimizedModule around DDP), not `_orig_mod.` alone. torchrun names "
        "the rank it saw exit first as first observed and SIGTERMs the other, whose error.json "
        "holds the same error. Not rank-specific: culprit_ranks is empty.",
    "compile_failure":
        "Fails at step 0, not step 4: dynamo compiles at the first forward. Both ranks raise "
        "'torch._dynamo.exc.Unsupported: Data-dependent branching' with 'from user code: ... "
        "train.py, line <user_line>, in forward: if h.abs().max() > 1e4:' (each writes "
        "error.json); torchrun may SIGTERM the one it sees second. Nothing was compiled, so "
        "torch_trace is tiny. Not rank-specific: culprit_ranks is empty.",
    "timeout_misconfigured":
        "As planned. Rank 0 logs 'saving checkpoint step 4 to ...' and never 'checkpoint saved'; "
        "py-spy (10 s in) shows rank 0 in save_checkpoint's throttled write loop (user_line) "
        "under maybe_checkpoint -- checkpoint I/O, making progress -- and rank 1 in "
        "loss.backward() (the DDP gradient all-reduce). Rank 1's all-reduce raises gloo 'Timed "
        "out waiting 30000ms for recv operation to complete' and exits 1; torchrun SIGTERMs rank "
        "0 mid-write and names rank 1 as the first observed failure -- the wrong culprit. What "
        "tells it apart from collective-hang: the absent rank is inside checkpoint I/O (a "
        "save_checkpoint / write frame, a 'saving checkpoint' line) that needs longer than the "
        "30 s timeout, not blocked forever; the fix is a longer timeout (or an async / "
        "all-rank checkpoint), not a code path. Flight-recorder dumps (train.py's own, on gloo): "
        "rank 1 from main's exception path (ends at collective_seq_id 14, step 4's gradient "
        "all-reduce), rank 0 from its SIGTERM handler mid-write (ends at 12, step 3).",
    "healthy_fsdp":
        "FSDP2 fully_shard runs on CPU with gloo on torch 2.13 (parameters are DTensors on cpu), "
        "so this is a CPU run, not a GPU one. Dynamo logs graph breaks inside FSDP's own code "
        "(torch/distributed/fsdp/_fully_shard/_fsdp_common.py): context, not blame. Exit 0.",
    "recompile_shapes":
        "Decided recompile-storm, not rank-divergent-compile. Each rank recompiles the same two "
        "frames at the same steps 1-5 -- [0/1..5] dynamo's wrapper `inner` "
        "(torch/_dynamo/external_utils.py) and [4/1..5] MLP.forward (train.py, user_line) -- on "
        "the same guard, \"tensor 'x' size mismatch at index 0\"; only the sizes differ (rank "
        "0: 'expected 64, actual 56', rank 1: 'expected 40, actual 32' at the same step). Both "
        "end with the same six static graphs (one per batch size, under recompile_limit 8), and "
        "the gradient all-reduce is unaffected, so the cross-rank difference is context, not "
        "the root. Steps 0-5 each take seconds (compiles), steps 6-11 milliseconds. Exit 0. The "
        "logs name the recompiled frame, not ragged_batch (planted_line).",
    "straggler":
        "As planned, but the per-step logs do not show who is slow: both ranks log the same "
        "step_time (~0.33 s) because rank 0 waits for rank 1 in every gradient all-reduce. The "
        "profiler traces of steps 3-5 (one per rank, 'distributedInfo' names the rank) do: rank "
        "0's gloo:all_reduce / c10d::allreduce_ ops last ~300 ms each, rank 1's a few ms. gloo "
        "runs collectives on the CPU, so there are no collective kernels. No stack names the "
        "sleep: user_line is null. Exit 0.",
    "divergent_compile":
        "As planned; what differs between the ranks is only the input rank (ndim) of one forward. "
        "At step 2 rank 1 alone calls the compiled model on a 3-d (1, 64, 256) batch (y made "
        "(1, 64, 16) alike), rank 0 on the usual (64, 256). Only rank 1 logs recompiles, two, "
        "both on the guard 'rank mismatch. expected 2, actual 3': [0/1] dynamo's wrapper "
        "`inner` (torch/_dynamo/external_utils.py, \"tensor 'args[0]'\") and [4/1] MLP.forward "
        "(train.py:58, the def line the log names: user_line, recompile_shapes' EVIDENCE marker; "
        "\"tensor 'x'\"). Rank 0's TORCH_TRACE has frames 0-4 compiled once each, rank 1's "
        "also 0/1 and 4/1. The values are the same, so the losses match the healthy run (rank 1 "
        "step 2: 0.9645 in both), the DDP gradient all-reduces are the same on both ranks, "
        "nothing hangs, and from step 3 on rank 1's 2-d batches hit the first cache entry "
        "again (no further recompiles). The only cost shows in step 2's step_time, ~15.3 s on "
        "both ranks: rank 1 compiling, rank 0 waiting for it in the gradient all-reduce. Exit 0, "
        "no flight-recorder dump. No log names packed_batch (planted_line); train.py's call "
        "`x, y = packed_batch(*ragged_batch(...))` replaced the loop's ragged_batch line in "
        "place and packed_batch sits after main, so no marked line moved.",
    "pipeline_missing_send":
        "As planned, 4 ranks, no torch.compile. At step 4 rank 3 waits in its forward's "
        "dist.recv(src=2) (pipeline_step, train.py:654) for activations rank 2 never sends; rank "
        "2, having skipped the send (send_activations returns at planted_line), goes on to its "
        "backward and waits in dist.recv(src=3) for the gradient (train.py:664), and ranks 1 and "
        "0 wait in the same backward recv from their next stage: py-spy (10 s in) shows all four "
        "in recv, three at line 664 and rank 3 at 654. No log names the skipped send or the return "
        "before it (planted_line); user_line is where the logs find rank 2, its backward recv past the "
        "send it skipped (train.py:664, the EVIDENCE marker). "
        "About 30 s after step 3 all four recvs raise gloo 'Timed out waiting 30000ms for recv "
        "operation to complete' within 20 ms of each other and each rank dumps the flight "
        "recorder from main's exception path; torchrun names rank 0 (exit 1) first observed "
        "-- the wrong culprit -- rank 1 exits 1 too and ranks 2 and 3 are SIGTERMed after "
        "raising (their error.json holds the same timeout). gloo's flight recorder records no "
        "point-to-point op: each dump holds only the four per-step loss broadcasts (seq 1-4, "
        "steps 0-3), the same on every rank, so the dumps cannot show who is behind; the "
        "tracebacks and py-spy (who waits in a forward recv, and from whom) can.",
    "two_group_cycle":
        "As planned. py-spy (10 s in) shows rank 0 in sync_stats' dist.all_reduce on the "
        "\"grads\" group (train.py:722, the else branch) and rank 1 in its all-reduce on the "
        "\"metrics\" group (train.py:719, user_line), both under before_train_step at step 4: "
        "a cycle, each waits in the group the other has not reached. Nothing times out "
        "(torch's default 30-minute timeout): no traceback, no failure table, no error.json. "
        "5 s into the stall each rank's watchdog thread (dump_when_stalled) dumps the flight "
        "recorder (nccl_trace_rank_<r>, the console's last line per rank): its entries name "
        "each group (process_group ('1', 'grads'), ('2', 'metrics')), and rank 0's last entry "
        "is grads sequence 5, rank 1's metrics sequence 5. culprit_ranks is [1] because the "
        "records single it out: in every earlier step both ranks issued grads right after the "
        "DDP all-reduces, and rank 0 does so again; rank 1 issued metrics there, against its "
        "own history (with two ranks no majority could tell). generate.py SIGKILLs torchrun "
        "and both workers 25 s after step 3 was logged (the job's deadline).",
    "silent_hang_killed":
        "As planned. py-spy (10 s in) shows rank 1 in Event.wait under wait_for_metrics_upload "
        "(user_line) and rank 0 in loss.backward() (train_step, the DDP gradient all-reduce). "
        "torch's default 30-minute timeout: no error line is ever printed, no traceback, no "
        "failure table, no error.json; both ranks' last line is 'step 3 loss'. generate.py "
        "SIGKILLs torchrun and both workers 25 s after step 3 was logged (the deadline): no "
        "flight-recorder dump. Only py-spy tells the ranks apart.",
    "lock_wait_in_save":
        "As planned. Rank 0 logs 'saving checkpoint step 4 to ...' and never 'checkpoint saved'; "
        "py-spy (10 s in) shows its main thread in Semaphore.acquire -> Condition.wait under "
        "save_checkpoint_locked (user_line) and a second thread, 'ckpt-uploader', in Event.wait "
        "under upload_checkpoints: the holder of the slot, idle, not doing I/O. Rank 1 is in "
        "loss.backward() (the DDP gradient all-reduce), which raises after 30 s -- in this run "
        "gloo's 'Application timeout caused pair closure' (other runs: 'Timed out waiting "
        "30000ms for recv operation to complete') -- and exits 1; torchrun names rank 1 first "
        "observed (the wrong culprit) and SIGTERMs rank 0 (the signal interrupts the acquire, "
        "the handler dumps). Flight recorder: rank 1 from main's exception path (ends at seq 14, "
        "step 4's gradient all-reduces), rank 0 from its SIGTERM handler (ends at 12, step 3). "
        "What tells it apart from timeout_misconfigured, whose log lines are the same: the "
        "absent rank is blocked on a lock (acquire / wait frames, no write loop), so a longer "
        "timeout would not help.",
    "cold_cache_compile_timeout":
        "As planned. Rank 1 logs 'compiling the eval tower (96 blocks), inductor cache "
        "/tmp/inductor_cold_... (empty)' right after step 3 and never 'eval tower compiled'; "
        "py-spy (10 s in) shows its main thread busy ('active+gil') in inductor's C++ codegen "
        "(torch/_inductor/loop_body.py, scheduler.py, codegen/cpp.py) under compile_fx, dynamo's "
        "convert_frame and OptimizedModule.__call__ at maybe_compile_eval_tower's call "
        "(user_line); rank 0 is in loss.backward() (the DDP gradient all-reduce), which raises "
        "gloo 'Timed out waiting 30000ms for recv operation to complete' after 30 s: rank 0 "
        "exits 1 and is named first observed (the wrong culprit), rank 1 is SIGTERMed mid-"
        "compile. The same compile measured alone on this machine: 93.5 s with the empty cache, "
        "20.1 s with a warm one (the C++ kernels cached; TORCHINDUCTOR_FX_GRAPH_CACHE=0 keeps "
        "the rest), so the 30 s timeout is too short for a cold node, not a hang. Flight "
        "recorder: rank 0 from main's exception path (seq 14), rank 1 from its SIGTERM handler "
        "(seq 12, step 3).",
    "recompile_limit_cuda":
        "As recompile_limit: '[4/8] torch._dynamo hit config.recompile_limit (8)' on both ranks "
        "after eight recompiles on the guard `scale == <value>`; inductor compiled Triton "
        "kernels each time. Exit 0.",
    "graph_breaks_cuda":
        "As graph_breaks: user-code graph breaks at NoisyMLP.forward's .item() (user_line), "
        "print() (recurring on resumed frames) and the tensor-valued `if`; DDP's own breaks "
        "(distributed.py, contextlib.py) are context. Exit 0.",
    "recompile_shapes_cuda":
        "As recompile_shapes (the same recompiles on the same guard at the same steps, ranks "
        "differing only in the sizes): recompile-storm. Exit 0.",
    "compile_failure_cuda":
        "As compile_failure: both ranks raise torch._dynamo.exc.Unsupported 'Data-dependent "
        "branching' at step 0's first forward, before any Triton kernel is compiled, and exit "
        "1.",
    "memory_leak":
        "As planned: both ranks leak the same 32.5 MiB per step (mem_alloc_mb 102.7 at step 0 "
        "-> 850.2 at step 23; mem_reserved_mb 124 -> 872 under the 896 MiB cap) and both raise "
        "torch.OutOfMemoryError at step 24 ('Tried to allocate 16.00 MiB ... 896.00 MiB "
        "allowed; Of the allocated memory 874.17 MiB is allocated by PyTorch, and 13.83 MiB is "
        "reserved by PyTorch but unallocated') in validate's `out = model(x_val)`, after logging "
        "'CUDA out of memory at step 24: memory snapshot written to ...'. The snapshots' live "
        "blocks put ~605 MiB at validate -> model(x_val) and ~200 MiB at validate's "
        "torch.randn(x_val): the kept activations and inputs. torchrun names rank 0 (exit 1) "
        "first observed and SIGTERMs rank 1 (its error.json holds the same OOM). user_line is "
        "validate's `out = model(x_val)`, the line the OOM traceback and the snapshot's top "
        "allocation site name; the line that keeps the outputs (VAL_OUTPUTS.append, two lines "
        "below) is planted_line: no log names it (it allocates nothing). Not rank-specific: "
        "culprit_ranks is empty. Profiler traces (steps 3-5) are gzipped.",
    "cuda_oom_spike":
        "As planned: rank 1 raises 'torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 256.00 GiB. GPU 0 has a total capacity of 139.80 GiB ...' at step 4 in "
        "build_pair_mask's torch.ones (user_line: the traceback's line, the one after the "
        "planted one) with mem_alloc_mb flat at 69.2 before; rank 0's backward all-reduce gets "
        "a gloo 'Connection closed by peer' and is SIGTERMed.",
    "device_assert":
        "The kernel prints '/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: "
        "vectorized_gather_kernel: block: [0,0,0], thread: [..] Assertion `ind >=0 && ind < "
        "ind_dim_size && \"vectorized gather kernel index out of bounds\"` failed.' (64 "
        "threads). The error surfaces asynchronously: rank 1's main thread raises "
        "torch.AcceleratorError 'CUDA error: device-side assert triggered' in train_step's "
        "loss.backward() (in error.json only: the console has no Python traceback for rank 1), "
        "while its gloo worker thread hits the same error freeing a tensor, 'terminate called "
        "after throwing an instance of c10::AcceleratorError' -> SIGABRT (exitcode -6, with a "
        "faulthandler dump). Rank 0's backward all-reduce gets a gloo 'Connection closed by "
        "peer' and is SIGTERMed. No log names the embedding lookup (add_id_features); the line "
        "named, loss.backward(), is not where the fault is: user_line is null.",
    "straggler_cuda":
        "As straggler: both ranks log ~0.31 s per step; the profiler traces (gzipped, CUDA "
        "activity on, 'NVIDIA H200' in deviceProperties) show rank 0's gloo:all_reduce ~300 ms "
        "each, rank 1's ~1 ms. gloo all-reduces on the CPU, so there are no NCCL kernels. No "
        "stack names the sleep: user_line is null. Exit 0.",
    "nccl_watchdog_timeout":
        "As planned, one rank: 30 s after the all_reduce was enqueued ProcessGroupNCCL logs "
        "'Watchdog caught collective operation timeout: WorkNCCL(SeqNum=19, OpType=ALLREDUCE, "
        "NumelIn=1024, NumelOut=1024, Timeout(ms)=30000) ran for 30030 milliseconds', 'last "
        "enqueued work: 19, last completed work: 18', the Python stack of the failed collective "
        "(sync_metric's all_reduce, user_line), and dumps the flight recorder to "
        "nccl_trace_rank_0 (entry 19: nccl:all_reduce, state 'scheduled'). py-spy (10 s in) "
        "shows the main thread spinning in sync_metric's .item() behind the sleep kernel. When "
        "the ~60 s kernel ends, step 4 completes and is logged (step_time 60 s); the watchdog "
        "then aborts the communicator, 'To avoid data inconsistency, we are taking the entire "
        "process down', and the rank dies of SIGABRT (-6) ~60 s after the timeout. Nothing in "
        "the logs localizes the cause beyond 'the collective never completed on the GPU': "
        "collective-timeout, no culprit rank.",
    # ---- other launchers and torch versions (see README: --launcher, --tag)
    "rank_exception_srun_label":
        "As rank_exception, every line of both ranks in one slurm-<jobid>.out, each prefixed "
        "'0: ' or '1: ' (rank 1's ValueError traceback lines read '1: [rank1]: ...'). No torchrun: "
        "no failure table, no error.json, nobody SIGTERMs rank 0: its backward all-reduce fails "
        "with gloo 'Connection closed by peer' ~2 s after rank 1 raised and it exits 1 itself "
        "(both ranks exit 1). Both dump the flight recorder from main's exception path (rank 1 "
        "ends at collective_seq_id 12, rank 0 at 14).",
    "native_crash_srun_label":
        "As native_crash, in one slurm-<jobid>.out: rank 1's faulthandler dump ('1: Fatal Python "
        "error: Segmentation fault', its stack naming train_step's ctypes.string_at line, "
        "user_line) and exit -11 (SIGSEGV); rank 0's backward all-reduce fails with gloo 'Read "
        "error ...: Connection reset by peer', it dumps the flight recorder (seq 14) and exits 1 "
        "itself: no torchrun, so nobody SIGTERMs it and there is no failure table.",
    "non_finite_loss_srun_label":
        "As non_finite_loss, in one slurm-<jobid>.out: '1: ... [rank1] step 4 loss nan' while rank "
        "0 logs 'step 4 loss 0.9510'; from step 5 both log 'loss nan'; both exit 0 and dump the "
        "flight recorder at completion (25 entries each).",
    "hang_dataloader_srun_label":
        "As hang_dataloader, in one slurm-<jobid>.out: 30 s into the hang rank 0's backward "
        "all-reduce raises gloo 'Application timeout caused pair closure' (its other wording of "
        "the timeout), it dumps the flight recorder (seq 14) and exits 1. No torchrun tears rank 1 "
        "down and srun's default lets it run on, blocked in Queue.get under fetch_batch (py-spy, "
        "10 s in), until generate.py's 240 s safety net SIGKILLs it, as a job's time limit ends "
        "it (Slurm's own SIGTERM first and its messages are not imitated): rank 1 leaves no dump "
        "and no error.",
    "rank_exception_console":
        "As rank_exception, in one console with no prefixes but train.py's own '[rank<r>]' and "
        "torch's '[rank<r>]:': rank 1's ValueError, rank 0's gloo 'Connection closed by peer', "
        "then torchrun's failure table (rank 1 first observed, rank 0 SIGTERMed). The error.json "
        "the table names lies in torchrun's temporary directory, not kept.",
    "hang_dataloader_console":
        "As hang_dataloader, in one console with no torchrun prefixes: rank 0's backward "
        "all-reduce raises gloo 'Timed out waiting 30000ms for recv operation to complete' 30 s "
        "into the hang, torchrun names rank 0 first observed (the wrong culprit) and SIGTERMs rank "
        "1, which py-spy (10 s in) shows in Queue.get under fetch_batch. Flight recorder: rank 0 "
        "from main's exception path (seq 14), rank 1 from its SIGTERM handler (seq 12).",
    "recompile_limit_plain_python":
        "As recompile_limit, one process (world size 1, python train.py): '[4/8] torch._dynamo "
        "hit config.recompile_limit (8)' after eight recompiles on the guard `scale == <value>` in "
        "MLP.forward (user_line); later steps run eager. The rank's completion dump of the flight "
        "recorder holds 33 entries. Exit 0.",
    "compile_failure_plain_python":
        "As compile_failure, one process (world size 1, python train.py): step 0's first forward "
        "raises torch._dynamo.exc.Unsupported 'Data-dependent branching' at ClampedMLP.forward's "
        "`if` (user_line); the traceback is printed by @record's handler with no torchrun around "
        "it, no failure table, no error.json. Exit 1.",
    "hang_dataloader_torch2141":
        "As hang_dataloader, under torch 2.14.1, but in this run gloo words the timeout its other "
        "way: 30 s into the hang rank 0's backward all-reduce raises 'RuntimeError: Application "
        "timeout caused pair closure' (hang_dataloader's 2.13 run: 'Timed out waiting 30000ms for "
        "recv operation to complete'; 2.13 gives both too: lock_wait_in_save, "
        "hang_dataloader_srun_label); "
        "torchrun names rank 0 first observed (the wrong culprit) and SIGTERMs rank 1, in Queue.get "
        "under fetch_batch (py-spy, 10 s in). Flight recorder: rank 0 seq 14, rank 1 seq 12.",
    "rank_exception_torch291":
        "As rank_exception, under torch 2.9.1: rank 1's ValueError traceback ends in check_batch; "
        "rank 0's backward all-reduce fails with gloo 'Connection closed by peer' (2.9.1's wording "
        "stops there, without 2.13's 'This is typically caused by a remote worker crashing...') "
        "and torchrun SIGTERMs it ('Sending process N closing signal SIGTERM'), but 2.9.1's "
        "failure table lists rank 1 alone ('Failures: <NO_OTHER_FAILURES>'). Flight recorder: "
        "rank 1 ends at collective_seq_id 12, rank 0 at 14.",
    "hang_dataloader_torch291":
        "As hang_dataloader, under torch 2.9.1: rank 0's backward all-reduce raises gloo 'Timed "
        "out waiting 30000ms for recv operation to complete' 30 s into the hang; torchrun names "
        "rank 0 first observed (the wrong culprit) and SIGTERMs rank 1, in Queue.get under "
        "fetch_batch (py-spy, 10 s in), but 2.9.1's failure table lists rank 0 alone. Flight "
        "recorder: rank 0 from main's exception path (seq 14), rank 1 from its SIGTERM handler "
        "(seq 12).",
    "recompile_limit_torch291":
        "As recompile_limit, under torch 2.9.1, but the frame that fills its cache first is not "
        "the user's: every step recompiles both dynamo's wrapper `inner` (frame 0, "
        "torch/_dynamo/external_utils.py:66, guard `args[1] == <value>`) and MLP.forward (frame "
        "4, guard `scale == <value>` at train.py:60, user_line), and '[0/8] torch._dynamo hit "
        "config.recompile_limit (8)' comes for frame 0 after forward's seventh recompile ([4/7]; "
        "2.13 logs '[4/8]'). From then on the wrapper runs eager. Exit 0.",
    "graph_breaks_torch291":
        "As graph_breaks, under torch 2.9.1 (2.9's reason wording: 'Unsupported Tensor.item() "
        "call with capture_scalar_outputs=False', 'Failed to trace builtin operator' for print, "
        "'Data-dependent branching'). Both ranks log 'done' after the final barrier and dump the "
        "flight recorder (17 entries each), but rank 0's dump, taken 1 ms after its barrier "
        "returned, counts last_completed_collective 15 (rank 1's: 17): gloo had not yet marked "
        "its last two collectives complete. Exit 0.",
    "native_crash_torch291":
        "As native_crash, under torch 2.9.1: rank 1 dies of SIGSEGV (exitcode -11) with "
        "'Fatal Python error: Segmentation fault' and its Python stack (train_step's "
        "ctypes.string_at line, user_line); rank 0's backward all-reduce fails with a gloo "
        "connection error, it dumps the flight recorder (seq 14) and torchrun SIGTERMs it, but "
        "2.9.1's failure table lists rank 1 alone.",
    "nccl_duplicate_gpu":
        "As planned: at DDP's first collective (_verify_param_shape_across_processes, from the "
        "DDP(...) line in build(): user_line) both ranks log 'NCCL WARN Duplicate GPU detected "
        ": rank 1 and rank 0 both on CUDA device 60' and raise "
        "'torch.distributed.DistBackendError: NCCL error in: .../NCCLUtils.cpp:93, invalid usage "
        "... NCCL version 2.28.9 ... Last error: Duplicate GPU detected'; both exit 1. The fault "
        "is the launch (every rank given cuda:0: planted_line is pick_device's explicit-device "
        "return); no rank is more to blame than the other.",
}


# --------------------------------------------------------------------------- helpers


def marker_line(kind, name, required=True):
    """train.py:<n> of the first code line after a ``# KIND(name)`` comment line, or of a code
    line that ends in a ``# KIND(name)`` comment."""
    lines = TRAIN.read_text().splitlines()
    tag = f"# {kind}({name})"
    for i, line in enumerate(lines):
        if tag in line and not line.strip().startswith("#"):
            return f"{TRAIN.name}:{i + 1}"
        if line.strip().startswith(tag):
            for j in range(i + 1, len(lines)):
                if lines[j].strip() and not lines[j].strip().startswith("#"):
                    return f"{TRAIN.name}:{j + 1}"
    if required:
        raise SystemExit(f"marker {tag!r} not found in {TRAIN}")
    return None


def lines_for(name, spec):
    """(planted_line, user_line). The user line is where the logs point: an EVIDENCE(name)
    marker when train.py has one (e.g. the collective call a mismatch shows up in), else the
    planted line; a spec may say user_line=None when no log can name a line."""
    marker = spec.get("marker", name)
    planted = marker_line("PLANTED", marker) if marker else None
    if "user_line" in spec and spec["user_line"] is None:
        return planted, None
    evidence = spec.get("evidence", marker or name)
    return planted, marker_line("EVIDENCE", evidence, required=False) or planted


def torchrun_cmd():
    """The torchrun of the Python running this script (a venv of another torch version need
    not be on PATH), else ``python -m torch.distributed.run``."""
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


# --launcher NAME -> the suffix its folders get (torchrun with --log-dir/--tee has none)
LAUNCHERS = {"torchrun": "", "console": "_console", "plain": "_plain_python", "srun": "_srun_label"}
LAUNCHER_WORDS = {
    "torchrun": "torchrun --log-dir --redirects 3 --tee 3",
    "console": "torchrun, no --log-dir/--redirects/--tee (one console)",
    "plain": "python train.py (one process, no torchrun)",
    "srun": "srun --label style (one stdout, `<task>: ` prefixes; ranks started by generate.py)",
}
# a folder's name is <scenario>[_nccl][<launcher suffix>][_<tag>]
FOLDER_SUFFIX = re.compile(r"(_nccl)?(_console|_plain_python|_srun_label)?(_torch\d+)?$")


def free_port():
    """A free TCP port for torchrun's store (so several generate.py can run side by side)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rel(p, start):
    try:
        return os.path.relpath(p, start)
    except ValueError:
        return str(p)


def pyspy_dump(pid, rank, outdir):
    """py-spy dump (text and --json) of one pid; returns a short status string."""
    outdir.mkdir(exist_ok=True)
    # on PATH, or beside this Python (a venv's bin/ that is not on PATH)
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if exe is None:
        return "py-spy not installed"
    status = []
    for suffix, extra in (("txt", []), ("json", ["--json"])):
        r = subprocess.run([exe, "dump", "--pid", str(pid), *extra],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            (outdir / f"rank{rank}.{suffix}").write_text(r.stdout)
            status.append(f"{suffix} ok")
        else:
            status.append(f"{suffix} failed rc={r.returncode}: {(r.stderr or r.stdout).strip()[:200]}")
    return "; ".join(status)


def kill_job(procs, pids):
    """SIGKILL the launcher(s) (torchrun, or each rank started here: their process groups) and
    every worker seen (each its own session under torchrun, with any compile workers it
    started), as a scheduler ends a job."""
    targets = [p.pid for p in procs] + [pid for _, pid in sorted(pids.items())]
    for pid in targets:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue


SIGNAMES = {s.value: s.name for s in signal.Signals}


def parse_failures(console):
    """torchrun's failure table -> [{rank, first_observed, exitcode, pid, signal, error_file,
    traceback (its first line), exception (the exception line of a traceback from the rank's
    error.json, where torchrun printed one)}]."""
    out = []
    root = False
    cur = None
    in_tb = False
    for line in console.splitlines():
        if in_tb and cur is not None:
            if line.startswith("  ") and not line.startswith("   ") and line.strip():
                cur.setdefault("exception", line.strip())
            if not line.startswith("  ") or line.startswith("  ") and not line.strip():
                in_tb = False
        if line.startswith("Root Cause (first observed failure)"):
            root = True
        m = re.match(r"\s+rank\s+: (\d+) \(local_rank", line)
        if m:
            cur = {"rank": int(m.group(1)), "first_observed": root}
            out.append(cur)
            continue
        m = re.match(r"\s+exitcode\s+: (-?\d+) \(pid: (\d+)\)", line)
        if m and cur is not None:
            code = int(m.group(1))
            cur["exitcode"] = code
            cur["pid"] = int(m.group(2))
            if code < 0:
                cur["signal"] = SIGNAMES.get(-code, str(-code))
        m = re.match(r"\s+error_file\s*: (.*)", line)
        if m and cur is not None and m.group(1).strip() != "<N/A>":
            cur["error_file"] = m.group(1).strip()
        m = re.match(r"\s+traceback\s+: (.*)", line)
        if m and cur is not None:
            cur["traceback"] = m.group(1).strip()
            in_tb = cur["traceback"].startswith("Traceback (most recent call last)")
    return out


def describe_exit(rc, killed, failures, rank_exits=None):
    """``killed``: False; True (the RUN_LIMIT_S safety net); or the sentence saying how the job
    was killed at a scenario's deadline (``kill_after_s``), which then heads the description.
    ``rank_exits`` ({rank: returncode}) is how each rank ended where no torchrun reported it
    (plain python, srun)."""
    if isinstance(killed, str):
        head = killed
    elif killed:
        head = f"killed by generate.py after {RUN_LIMIT_S} s"
    elif rank_exits is not None:
        head = "no torchrun; " + ", ".join(
            f"rank {r} exit {c}" + (f" ({SIGNAMES.get(-c, -c)})" if c < 0 else "")
            for r, c in sorted((int(r), c) for r, c in rank_exits.items()))
    else:
        head = f"torchrun exit {rc}"
    parts = []
    for f in sorted(failures, key=lambda f: f["rank"]):
        s = f"rank {f['rank']} exitcode {f.get('exitcode')}"
        if "signal" in f:
            s += f" ({f['signal']})"
        if f["first_observed"]:
            s += " [torchrun: first observed]"
        parts.append(s)
    return head + ("; " + ", ".join(parts) if parts else "")


# --------------------------------------------------------------------------- one scenario


def folder_name(name, backend, launcher="torchrun", tag=None):
    """A scenario run on NCCL that is planned for gloo lands beside its gloo twin as <name>_nccl;
    another launcher adds its suffix (``_srun_label``), a --tag its own (``_torch291``)."""
    folder = name
    if backend == "nccl" and SCENARIOS[name].get("backend") != "nccl":
        folder += "_nccl"
    folder += LAUNCHERS[launcher]
    return folder + (f"_{tag}" if tag else "")


def scenario_of(folder):
    """The scenario a sample folder holds (its name, less a variant's suffixes)."""
    return folder if folder in SCENARIOS else FOLDER_SUFFIX.sub("", folder, count=1)


def spec_fields(name, spec, folder=None):
    """The parts of expected.json that come from the scenario's spec (not from the run); a
    variant folder's note is its own (what NCCL did is not what gloo did), and a spec's
    ``nccl`` entry says where NCCL's outcome differs from gloo's."""
    if folder and FOLDER_SUFFIX.search(folder).group(1) and "nccl" in spec:
        spec = {**spec, **spec["nccl"]}
    planted_line, user_line = lines_for(name, spec)
    return {
        "signatures": spec["signatures"],
        "root_cause": spec["root_cause"],
        "culprit_ranks": spec["culprit_ranks"],
        "user_line": user_line,
        "planted_line": planted_line,
        "planted": spec["planted"],
        "note": note_of(name, folder),
    }


def note_of(name, folder=None):
    """The folder's own note; a torch-version variant run by the same launcher (``_torch291``)
    shares its scenario's where it has none of its own (checked against its logs)."""
    folder = folder or name
    if folder in NOTES:
        return NOTES[folder]
    suffix = FOLDER_SUFFIX.search(folder)
    if suffix.group(3) and not suffix.group(1) and not suffix.group(2):
        return NOTES.get(name)
    return None


def make_expected(name, fields, run):
    """expected.json, in a fixed key order: spec fields + what the run did."""
    keys = ["scenario", "signatures", "root_cause", "culprit_ranks", "user_line", "planted_line",
            "backend", "device", "world_size", "launcher", "exit", "planted", "torchrun_rc",
            "rank_exits", "failures", "torch", "hardware", "wall_s", "regenerate", "pyspy", "note"]
    merged = {"scenario": name, **run, **fields}
    # torchrun_rc is torchrun's, rank_exits each rank's where no torchrun ran: a row has one
    return {k: merged.get(k) for k in keys if k in merged and (
        merged[k] is not None or k not in ("pyspy", "note", "torchrun_rc", "rank_exits"))}


def rank_env(rank, nproc, port, job_id):
    """The variables one rank gets where no torchrun sets them: those srun sets for a task of a
    one-node job step, and the env:// ones a batch script derives from them."""
    return {
        "SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_NNODES": "1",
        "SLURM_NODEID": "0", "SLURM_NTASKS": str(nproc), "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank), "SLURM_STEP_NODELIST": socket_hostname(),
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }


def socket_hostname():
    import socket

    return socket.gethostname()


def relay_labelled(stream, rank, width, out, lock):
    """Copy one rank's output to the shared file line by line, prefixed ``<rank>: `` (right-
    aligned to the widest task id) as ``srun --label`` does."""
    label = f"{rank:>{width}}: ".encode()
    for line in iter(stream.readline, b""):
        with lock:
            out.write(label + line)
            out.flush()
    stream.close()


def start_job(launcher, train_args, nproc, env, sdir, cwd, console):
    """Start the job the way ``launcher`` does; returns (the processes to wait for, the relay
    threads that must finish before the console file is complete)."""
    port = free_port()
    if launcher in ("torchrun", "console"):
        files = (["--log-dir", rel(sdir / "logs", cwd), "--redirects", "3", "--tee", "3"]
                 if launcher == "torchrun" else [])
        cmd = torchrun_cmd() + ["--nproc-per-node", str(nproc), "--master-port", str(port),
                                *files, rel(TRAIN, cwd), *train_args]
        print(f"[generate] {sdir.name}: {' '.join(cmd)}", flush=True)
        return [subprocess.Popen(cmd, cwd=cwd, env=env, stdout=console, stderr=subprocess.STDOUT,
                                 start_new_session=True)], []
    cmd = [sys.executable, rel(TRAIN, cwd), *train_args]
    print(f"[generate] {sdir.name}: {nproc} x {' '.join(cmd)}", flush=True)
    if launcher == "plain":  # the variables a user exports by hand for env:// init
        rank0 = {k: v for k, v in rank_env(0, 1, port, os.getpid()).items()
                 if not k.startswith("SLURM_")}
        return [subprocess.Popen(cmd, cwd=cwd, env={**env, **rank0}, stdout=console,
                                 stderr=subprocess.STDOUT, start_new_session=True)], []
    import threading

    lock = threading.Lock()
    procs, relays = [], []
    for r in range(nproc):
        proc = subprocess.Popen(cmd, cwd=cwd, env={**env, **rank_env(r, nproc, port, os.getpid())},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        t = threading.Thread(target=relay_labelled,
                             args=(proc.stdout, r, len(str(nproc - 1)), console, lock), daemon=True)
        t.start()
        procs.append(proc)
        relays.append(t)
    return procs, relays


def console_name(launcher):
    """Where the job's stdout lands: torchrun's console, or the Slurm job's output file."""
    return f"slurm-{os.getpid()}.out" if launcher == "srun" else "console.log"


def run_scenario(name, backend, device_arg, out_root, cwd, launcher="torchrun", tag=None):
    spec = SCENARIOS[name]
    backend = spec.get("backend", backend)
    device_arg = spec.get("device", device_arg)
    nproc = 1 if launcher == "plain" else spec.get("nproc", 2)
    folder = folder_name(name, backend, launcher, tag)
    # NCCL checks no sizes or dtypes: a mismatch that gloo refuses at once hangs there
    hangs = spec.get("hang") or (backend == "nccl" and spec.get("hangs_on_nccl"))
    pyspy = spec.get("pyspy") or (backend == "nccl" and spec.get("hangs_on_nccl"))
    sdir = (out_root / folder).resolve()
    if sdir.exists():
        shutil.rmtree(sdir)
    sdir.mkdir(parents=True)
    console_path = sdir / console_name(launcher)

    env = dict(os.environ)
    env.update({
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_LOGS": "recompiles,graph_breaks",
        "TORCH_CPP_LOG_LEVEL": "INFO",
        # every run compiles for real, whatever ran before on this machine (and TORCH_TRACE
        # stays small: no fx-graph / autograd cache artifacts)
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(sdir / "nccl_trace_rank_"),
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(sdir / "nccl_trace_rank_"),
    })
    if backend == "nccl":
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = "INIT,COLL"
    if device_arg != "cpu":
        # NVLink multicast stays off on shared GPU hosts
        env.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"})
    if spec.get("torch_trace"):
        env["TORCH_TRACE"] = str(sdir / "torch_trace")
    env.update(spec.get("env", {}))

    train_args = ["--scenario", name, "--backend", backend, "--device", device_arg,
                  "--steps", str(spec["steps"]), "--out-dir", rel(sdir, cwd)]
    t0 = time.time()
    pyspy_status = None
    killed = False
    kill_after = spec.get("kill_after_s")  # a deadline, counted from when the hang began
    with open(console_path, "wb") as console:
        procs, relays = start_job(launcher, train_args, nproc, env, sdir, cwd, console)
        pids = {}
        hang_seen_at = None
        while any(p.poll() is None for p in procs):
            time.sleep(0.5)
            if time.time() - t0 > RUN_LIMIT_S:
                kill_job(procs, pids)
                killed = True
                for p in procs:
                    p.wait()
                break
            if not hangs:
                continue
            text = console_path.read_text(errors="replace")
            for m in re.finditer(r"\[rank(\d+)\] host=\S+ pid=(\d+)", text):
                pids[int(m.group(1))] = int(m.group(2))
            if (kill_after is not None and hang_seen_at is not None
                    and time.time() - hang_seen_at >= kill_after):
                # the job's deadline: SIGKILL torchrun and every worker at once, as a scheduler
                # does (no SIGTERM first, so no rank runs a handler or dumps anything)
                kill_job(procs, pids)
                for p in procs:
                    p.wait()
                killed = (f"killed at its deadline: generate.py SIGKILLed the launcher and all "
                          f"{len(pids)} workers {time.time() - hang_seen_at:.0f} s after step "
                          f"{FAIL_STEP - 1} was logged, rc {procs[0].returncode}")
                break
            if hang_seen_at is None:
                done = set(int(r) for r in re.findall(
                    rf"\[rank(\d+)\] step {FAIL_STEP - 1} loss", text))
                if len(done) >= nproc:
                    hang_seen_at = time.time()
            elif (pyspy and pyspy_status is None
                  and time.time() - hang_seen_at >= HANG_DUMP_AFTER_S):
                stat = []
                for r, pid in sorted(pids.items()):
                    stat.append(f"rank{r} pid {pid}: {pyspy_dump(pid, r, sdir / 'pyspy')}"
                                .replace("; ", ", "))
                pyspy_status = (f"py-spy dumps taken {time.time() - hang_seen_at:.0f} s after "
                                f"step {FAIL_STEP - 1} was logged: " + "; ".join(stat))
                print(f"[generate] {folder}: {pyspy_status}", flush=True)
        for t in relays:
            t.join(timeout=10)
    by_torchrun = launcher in ("torchrun", "console")
    rc = procs[0].returncode if by_torchrun else None
    rank_exits = None if by_torchrun else {str(r): p.returncode for r, p in enumerate(procs)}
    wall = time.time() - t0

    # TORCH_TRACE logs are large (every recompile's graphs and code): gzip them, unchanged.
    for f in sorted((sdir / "torch_trace").glob("*")) if (sdir / "torch_trace").is_dir() else []:
        if f.is_file() and f.suffix != ".gz":
            subprocess.run(["gzip", "-9", "-n", str(f)], check=True)
    console_text = console_path.read_text(errors="replace")
    failures = parse_failures(console_text)
    m = re.search(r"torch=(\S+)", console_text)
    torch_version = m.group(1) if m else None
    m = re.search(r" device=(\S+) gpu=(.+)", console_text)
    gpu = m.group(2).strip() if m and m.group(2).strip() != "none" else None
    if pyspy and pyspy_status is None:
        pyspy_status = "no py-spy dump: the run ended before the hang reached 10 s"

    run = {
        "backend": backend,
        "device": device_arg,
        "world_size": nproc,
        "launcher": launcher,
        "exit": describe_exit(rc, killed, failures, rank_exits),
        "torchrun_rc": rc,
        "rank_exits": rank_exits,
        "failures": failures,
        "torch": torch_version,
        "hardware": hardware(device_arg, gpu, backend, nproc),
        "wall_s": round(wall, 1),
        "regenerate": regenerate_command(name, spec, backend, device_arg, launcher, tag),
        "pyspy": pyspy_status,
    }
    expected = make_expected(name, spec_fields(name, spec, folder), run)
    (sdir / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(f"[generate] {folder}: {expected['exit']} in {wall:.0f} s", flush=True)
    return expected


def regenerate_command(name, spec, backend, device_arg, launcher="torchrun", tag=None):
    cmd = f"python sample_logs/generate/generate.py --only {name}"
    if backend == "nccl" and "backend" not in spec:
        cmd += " --backend nccl"
    cmd += f" --device {device_arg}" if device_arg != "cpu" else f" --backend {backend}"
    if launcher != "torchrun":
        cmd += f" --launcher {launcher}"
    return cmd + (f" --tag {tag}" if tag else "")


def hardware(device_arg, gpu, backend, nproc):
    if device_arg != "cpu":
        if nproc == 1:
            where = "one rank"
        elif backend == "gloo" or device_arg.startswith("cuda:"):
            where = f"all {nproc} ranks on cuda:0"
        else:
            where = "one GPU per rank"
        return f"GPU {gpu or '?'} ({where}), {os.cpu_count()} CPU cores"
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU only, {os.cpu_count()} cores ({cpu})"


# --------------------------------------------------------------------------- README


README_HEAD = """# sample_logs: real logs of real runs

Every folder here is what one real run of `generate/train.py` left behind, produced by
`generate/generate.py` (nothing edited by hand). A run is `torchrun --nproc-per-node 2
--log-dir <scenario>/logs --redirects 3 --tee 3 generate/train.py --scenario NAME` with
`TORCH_LOGS=recompiles,graph_breaks`, `TORCH_CPP_LOG_LEVEL=INFO`, the flight recorder asked
for (`TORCH_FR_BUFFER_SIZE=2000`, `TORCH_NCCL_TRACE_BUFFER_SIZE=2000`,
`TORCH_NCCL_DUMP_ON_TIMEOUT=1`, dumps to `<scenario>/nccl_trace_rank_<r>`: the NCCL watchdog
writes them on a timeout; on gloo, where nothing dumps automatically, `train.py` does it itself
the way a careful user would, `torch._C._distributed_c10d._dump_fr_trace()` pickle bytes written
once per process to `$TORCH_FR_DUMP_TEMP_FILE<rank>` when a step raises (in main's exception
path) and from a SIGTERM handler (torchrun SIGTERMs the survivors; the handler dumps, then the
rank still dies by SIGTERM), logging one `flight recorder dumped to ...` line; a rank killed by
SIGKILL / SIGSEGV / SIGABRT or frozen by SIGSTOP leaves none, and runs that exit 0 leave none;
gloo entries (`gloo:all_reduce` etc.) stay in state `scheduled`), a 30 s collective
timeout, `OMP_NUM_THREADS=1`, the inductor FX-graph and autograd caches off
(`TORCHINDUCTOR_FX_GRAPH_CACHE=0`, `TORCHINDUCTOR_AUTOGRAD_CACHE=0`: every run compiles).
`torch_trace/*.log.gz` are TORCH_TRACE logs (compile scenarios) gzipped by generate.py
(content unchanged). `train.py`'s `main` is decorated with torchrun's `@record`, so a rank
that raises leaves `logs/<run>/attempt_0/<r>/error.json`. `train.py` is a ~0.3 M-parameter
MLP wrapped as `torch.compile(DDP(model))` (FSDP2 `fully_shard` in `healthy_fsdp`) on seeded
synthetic data; each scenario plants one failure, mostly at step 4, in its own small
function, the line after a `# PLANTED(<scenario>)` comment (`planted_line`); `user_line` is
where the logs point (an `# EVIDENCE(<scenario>)` comment where that differs, e.g. the
collective call a size mismatch shows up in).

GPU scenarios (`ran on` names a GPU) ran with `--device cuda`: two ranks share cuda:0 over
gloo unless the row says nccl; torch.compile uses inductor (Triton kernels) there; every rank
logs `torch.cuda.get_device_name()` at start; nccl runs add `NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=INIT,COLL`; NVLink multicast is kept off (`NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1`). A `_cuda` scenario plants the
same failure as the CPU scenario of the same name. The GPU rows ran in two `run` calls of
the project's single-H200 machine (`python3 sample_logs/generate/generate.py --device cuda
--only A,B,...`, two such commands side by side; torchrun gets a free `--master-port`), their
folders packed as one tarball and unpacked here. train.py has since gained three trailing
`# EVIDENCE(...)` comments (lines 58, 233, 307) that mark where those logs point, and the gloo
flight-recorder dump (SIGTERM hook installed by `init_distributed` at line 429, the step's
`except` at 480-483, the dump code after `main`): no marked line moved, but `main()` itself
moved from line 497 to 563, so the GPU logs' `<module>` frames name line 497; the GPU runs
predate the dump, so their gloo rows have no `nccl_trace_rank_*`. `divergent_compile` then
added `packed_batch` after `main` (its call replaced the loop's ragged_batch line 465 in
place): again no marked line moved, but `main()` moved from 563 to 579, so the `<module>`
frames of the CPU logs made before it name line 563. The five later hang scenarios
(`pipeline_missing_send`, `two_group_cycle`, `silent_hang_killed`, `lock_wait_in_save`,
`cold_cache_compile_timeout`) added their functions after `main` and `EarlyExitMLP`, and three
lines changed in place: a blank line of `main` (444) became the pipeline's dispatch to its own
loop, the loop's `maybe_sync_before_step` line (470) also calls `before_train_step`, and
`init_distributed` (551) takes its timeout from `collective_timeout()` (30 s, or torch's
30-minute default for `two_group_cycle` and `silent_hang_killed`): no marked line moved, but
`main()` moved from 597 to 819, so the `<module>` frames of the logs made before them name line
597; `two_group_cycle`'s stall watchdog (`dump_when_stalled`, after everything) then moved it to
831, so the logs made before that name line 819. `pipeline_missing_send` runs 4 ranks (`--nproc-per-node 4`), eager. A scenario with
`kill_after_s` is killed at a deadline that many seconds after every rank logged step 3:
generate.py SIGKILLs torchrun and every worker at once, as a scheduler would, so there is no
failure table, no error.json and no flight-recorder dump; its `exit` says so. A folder the
analyzer does not get right yet waits in `_pending/` (its README says why), out of `postmortem
eval sample_logs/`: none does now (`two_group_cycle` waited there until its group-cycle check).

Per folder: `console.log` (torchrun's console, ranks prefixed `[default<r>]:`),
`logs/<run>/attempt_0/<r>/{stdout,stderr}.log` (and `error.json`), `expected.json` (the
verdict a correct analyzer should reach, how the run really ended, torchrun's failure table
parsed, notes), and where produced `pyspy/rank<r>.{txt,json}` (py-spy dumps ~10 s into a
hang), `nccl_trace_rank_<r>` (flight recorder), `torch_trace/` (TORCH_TRACE), `profiler/`
(torch.profiler `tensorboard_trace_handler` traces of steps 3-5, `record_shapes`,
`profile_memory`; plain `.pt.trace.json` on CPU, `.pt.trace.json.gz` on CUDA),
`memory_snapshot_rank<r>.pickle` (`torch.cuda.memory._dump_snapshot` in the OOM handler, memory
history recorded with `max_entries=300, stacks="python"`).

A folder named `<scenario>_nccl` is that scenario run with `--backend nccl --device cuda` on two
H200s, one GPU per rank (`--jobs` ran several side by side); a `replay/` folder holds what
`postmortem replay` printed when it re-ran the sample there (`replay.txt`, `replay.json`, and
the `--fix` run's `replay_fix.*`). Every rank dumps the flight recorder when a run completes
(NCCL's own recorder on NCCL), so a healthy run has a sequence to replay.

**Other torch versions.** A folder named `<scenario>_torch291` / `<scenario>_torch2141` is that
scenario run unchanged under torch 2.9.1 / 2.14.1 on CPU and gloo on this 2-core VM:
`generate.py --only NAME --tag torch291` run by the python of a venv holding that torch
(`python3 -m venv /work/venvs/t291 && /work/venvs/t291/bin/pip install torch==2.9.1
numpy==2.4.6 -e .`; pip took the builds on this machine's disk, 2.9.1+cu128 and 2.14.1+cu130,
which run on the CPU here; generate.py takes the torchrun beside that python). The
`_torch211` folders ran under 2.11 on the H200 machine's CPUs. The scenarios chosen are those
whose messages differ most across versions: dynamo's recompile and graph-break logs
(`recompile_limit`, `graph_breaks`, `compile_failure`), gloo's timeout and c10d's lines
(`hang_dataloader`), tracebacks, torchrun's failure table and error.json (`rank_exception`,
`native_crash`, `non_finite_loss`). Each of them ran on both versions (no API train.py uses is
missing from 2.9.1); where a run went otherwise than the 2.13 run, its note says how.

**Other launchers** (`--launcher`). `_console`: torchrun without `--log-dir`, `--redirects`,
`--tee`: the workers inherit torchrun's stdout, so `console.log` holds every rank's lines
interleaved with no `[default<r>]:` prefix, then torchrun's failure table; the error.json files
stay in torchrun's temporary directory and are not kept. `_plain_python`: `python train.py`
alone, one process, world size 1, with `RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1
MASTER_PORT=<free>` exported as a user does for env:// init; no torchrun, so no failure table
and no error.json (`@record` writes one only under torchrun), and a scenario planted on rank 1
cannot fire: only scenarios of every rank run this way (`recompile_limit`, `compile_failure`).
`_srun_label`: there is no Slurm here, so generate.py does to the output what `srun --ntasks 2
--label python train.py` does: it starts each rank itself with the variables srun sets for a
task (`SLURM_JOB_ID` (generate.py's pid), `SLURM_STEP_ID`, `SLURM_NNODES`, `SLURM_NODEID`,
`SLURM_NTASKS`, `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_STEP_NODELIST`) and the env:// ones a
batch script derives from them (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
`MASTER_PORT`), and copies each rank's stdout and stderr, line by line as they come, into one
`slurm-<jobid>.out`, each line prefixed with its task id and `: ` (right-aligned to the widest
id, as `--label` does). srun's own messages (`srun: error: ...`) are not imitated, and every
rank runs until it exits (srun's default: no `--kill-on-bad-exit`). Where no torchrun ran, `exit`
and `rank_exits` give each rank's own exit status.

**Framework samples** (`lightning_*`, `hf_trainer_*`) come from the frameworks' own launchers,
not `train.py`: `generate/frameworks/make_samples.py` runs `generate/frameworks/lightning_train.py`
(a tiny regression `LightningModule`, `Trainer(accelerator="cpu", devices=2, strategy="ddp")`:
Lightning's own launcher re-runs the script for rank 1, both write one console, `CSVLogger`
writes `out/lightning_logs/version_0/metrics.csv`), `generate/frameworks/hf_trainer_train.py` (a
tiny MLP trained by `transformers.Trainer` with `logging_steps=1`, two CPU processes under
`torchrun --nproc-per-node 2` with no `--log-dir`; `trainer.save_state()` writes
`out/trainer_state.json`) and, on one H200,
`generate/frameworks/lightning_leak_cuda.py` (Lightning's `DeviceStatsMonitor` logging
`torch.cuda.memory_stats()` into metrics.csv, `nvidia-smi --query-gpu --format=csv` beside it).
They ran in their own venv (torch 2.13.0, lightning, transformers, accelerate); each run's
stdout and stderr are `console.log` as a terminal shows them, nothing edited; the planted line
follows a `# PLANTED(<scenario>)` comment; make_samples.py writes `expected.json`.

A folder named `hf_trainer_<scenario>_accelerate` is an HF Trainer plant run by `accelerate
launch` itself (`launch_command` in its expected.json: `accelerate launch --multi_gpu
--num_processes 2 --main_process_port 0 hf_trainer_train.py ...`, no accelerate config file, so
the console opens with accelerate's list of the defaults it took). On this CPU-only machine
`--cpu` (or a config file's `distributed_type: MULTI_CPU`) starts one process whatever
`--num_processes` says (accelerate's multi-CPU mode goes through mpirun, `--mpirun_hostfile`);
`--multi_gpu` hands the two processes to `torch.distributed.run` without `--log-dir`/`--tee`
(one console, ranks' lines unprefixed but for torch's own `[rank<r>]:`), and the Trainer's
`use_cpu=True` runs them on the CPU over gloo. A failed run's console ends with accelerate
launch's own traceback (`multi_gpu_launcher` -> `ChildFailedError`) and torch elastic's failure
table. (The Trainer's `ddp_timeout` is not passed to the process group when `use_cpu=True` in
transformers 5.24, so a hang there waits torch's 30-minute default: no hang sample yet.)

| scenario | planted | ran on | how it ended | root cause (culprit) | regenerate |
| --- | --- | --- | --- | --- | --- |
"""


def _git(*args):
    done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def provenance(folder):
    """(the commit that committed the folder's logs, its date, the generator's last commit at or
    before it): which version of generate.py and train.py made the folder. Empty strings outside
    a git checkout or for a folder not yet committed."""
    logs = _git("log", "-1", "--format=%h %cs", "--", str(folder), f":!{folder}/expected.json", f":!{folder}/replay")
    if not logs:
        return "", "", ""
    commit, date = logs.split()
    return commit, date, _git("log", "-1", "--format=%h", commit, "--", str(HERE))


PROVENANCE_HEAD = """
## Provenance: which generator made each folder, and whether its command reproduces it today

`logs committed` is the commit that committed the folder's logs (expected.json and replay/
are re-derived later and not counted); `generator` is the last commit of `sample_logs/generate/`
at or before it: that version of generate.py and train.py ran the scenario. Later generator
commits added scenarios and trailing comment lines (see above) but kept every scenario's
planted failure, so the `regenerate` command in the table above reproduces the scenario with
today's generator; `reproduces today` says where that was checked (`python
sample_logs/generate/generate.py --out /tmp/regen --only NAME ...` as in the table above, then
`postmortem eval /tmp/regen`): the CPU scenarios on gloo, the one-GPU scenarios on one H200;
the `_nccl` rows need a GPU per rank and were not re-run since they were made.

`torch` is the version the run printed (`torch=` in its start line); `launcher` how its ranks
were started (`torchrun --log-dir` unless the row says otherwise; see above).

| folder | torch | launcher | logs committed | generator | reproduces today |
| --- | --- | --- | --- | --- | --- |
"""

# The last re-run of each scenario with today's generator (see PROVENANCE_HEAD), and how it
# was checked: `generate.py --out DIR` on the machine named, then `postmortem eval DIR`.
_H200_CPU = "yes, 2026-12-01: torch 2.11 gloo on the H200 machine's CPUs (--jobs 8), eval right"
_H200_GPU = "yes, 2026-12-01: torch 2.11 on one H200 (--device cuda --jobs 3), eval right"
_HERE = "yes, 2026-12-01: torch 2.13 gloo on this 2-core VM, eval right"
_NEW = "made 2026-12-01 by this generator"
REPRODUCED_TODAY = {
    **dict.fromkeys(["healthy", "divergent_compile", "graph_breaks", "non_finite_loss", "recompile_limit",
                     "recompile_shapes", "straggler", "collective_mismatch_detail", "dtype_mismatch",
                     "hang_dataloader", "rank_frozen", "rank_exception", "native_crash", "timeout_misconfigured",
                     "checkpoint_key_mismatch", "compile_failure", "ddp_unused_parameters"], _H200_CPU),
    # run there too, but 8 jobs on 16 cores made step 0's compile outlast the 30 s timeout, and FSDP2's
    # default mesh asked for cuda:1 on the one-GPU host; re-run here alone:
    **dict.fromkeys(["rank_sigkill", "allgather_shard_mismatch", "hang_conditional_barrier", "healthy_fsdp",
                     "fsdp_desync"], _HERE),
    **dict.fromkeys(["compile_failure_cuda", "cuda_oom_spike", "device_assert", "graph_breaks_cuda", "memory_leak",
                     "nccl_watchdog_timeout", "recompile_limit_cuda", "recompile_shapes_cuda", "straggler_cuda",
                     "nccl_duplicate_gpu"], _H200_GPU),
    **dict.fromkeys(["native_crash_torch211", "hang_dataloader_torch211", "recompile_limit_torch211"],
                    "yes: this folder is that re-run (torch 2.11, Python 3.12, the H200 machine's CPUs)"),
    **dict.fromkeys(["pipeline_missing_send", "silent_hang_killed", "lock_wait_in_save",
                     "cold_cache_compile_timeout"], _NEW),
}


def reproduced_today(folder):
    """REPRODUCED_TODAY's entry; a launcher or version variant made today says so."""
    if folder in REPRODUCED_TODAY:
        return REPRODUCED_TODAY[folder]
    if folder != scenario_of(folder) and not folder.endswith(("_nccl", "_torch211")):
        return "made 2026-12-01 by this generator"
    return None


def write_readme(out_root):
    rows = []
    order = list(SCENARIOS)
    def place(path):
        scenario = scenario_of(path.parent.name)
        return (order.index(scenario) if scenario in order else len(order), path.parent.name)

    found = sorted(out_root.glob("*/expected.json"), key=place)
    notes = []
    for p in found:
        e = json.loads(p.read_text())
        ran_on = f"{e['backend']}, {e.get('hardware')}, torch {e.get('torch')}"
        rc = e["root_cause"] or "none"
        if e["culprit_ranks"]:
            rc += f" (rank {', '.join(map(str, e['culprit_ranks']))})"
        ended = e["exit"]
        if "pyspy" in e:
            ended += f". {e['pyspy']}"
        cells = [f"`{p.parent.name}`", e["planted"], ran_on, ended, rc, f"`{e['regenerate']}`"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        if e.get("note"):
            notes.append(f"- `{p.parent.name}`: {e['note']}")
    text = README_HEAD + "\n".join(rows) + "\n"
    text += PROVENANCE_HEAD
    for p in found:
        e = json.loads(p.read_text())
        commit, date, generator = provenance(p.parent)
        checked = reproduced_today(p.parent.name) or (
            "not re-run: needs 2 GPUs (one per rank; the 2-GPU kind is not lent)" if p.parent.name.endswith("_nccl")
            else "not re-run yet")
        made = f"{commit} ({date})" if commit else "not committed yet"
        # frameworks/make_samples.py's folders name their own launcher
        launcher = e.get("framework_launcher") or LAUNCHER_WORDS[e.get("launcher", "torchrun")]
        text += (f"| `{p.parent.name}` | {e.get('torch')} | {launcher} | {made} | {generator} "
                 f"| {checked} |\n")
    if notes:
        text += "\n## Notes (what really happened where it differs from the plan)\n\n"
        text += "\n".join(notes) + "\n"
    (out_root / "README.md").write_text(text)


def refresh_expected(out_root, names):
    """Rewrite the spec-derived fields of existing expected.json files (signatures, root cause,
    culprits, marker lines, planted text, note) and torchrun's failure table parsed again from
    console.log, keeping what the run did (rc, wall time, py-spy, hardware) as recorded."""
    folders = sorted(p.parent.name for p in out_root.glob("*/expected.json")
                     if scenario_of(p.parent.name) in names)
    for folder in folders:
        n = scenario_of(folder)
        path = out_root / folder / "expected.json"
        old = json.loads(path.read_text())
        run = {k: v for k, v in old.items() if k not in spec_fields(n, SCENARIOS[n], folder)}
        run.setdefault("device", "cpu")
        tag = FOLDER_SUFFIX.search(folder).group(3)
        run["regenerate"] = regenerate_command(n, SCENARIOS[n], run["backend"], run["device"],
                                               run.get("launcher", "torchrun"),
                                               tag and tag.removeprefix("_"))
        console = out_root / folder / "console.log"
        if console.is_file():  # torchrun's failure table, parsed again from the run's console
            run["failures"] = parse_failures(console.read_text(errors="replace"))
            killed = run["exit"].startswith("killed")
            if killed and run["exit"].startswith("killed at"):  # a deadline kill: keep its sentence
                killed = run["exit"].split("; ")[0]
            run["exit"] = describe_exit(run.get("torchrun_rc"), killed, run["failures"],
                                        run.get("rank_exits"))
        path.write_text(json.dumps(make_expected(n, spec_fields(n, SCENARIOS[n], folder), run),
                                   indent=2) + "\n")
        print(f"[generate] {folder}: expected.json refreshed", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated scenario names (default: every scenario of "
                                   "the chosen device: CPU ones for cpu, GPU ones for cuda)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"],
                    help="default backend (a scenario may force its own, e.g. nccl_*)")
    ap.add_argument("--device", default="cpu",
                    help="cpu | cuda (gloo: every rank on cuda:0; nccl: cuda:LOCAL_RANK)")
    ap.add_argument("--out", default="sample_logs", help="output directory (default: sample_logs)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="scenarios run side by side (each its own torchrun and port; GPU runs "
                         "share the GPUs, so keep timing scenarios such as straggler alone)")
    ap.add_argument("--launcher", default="torchrun", choices=list(LAUNCHERS),
                    help="how the ranks are started (see the module docstring); a launcher "
                         "other than torchrun adds its suffix to the folder name")
    ap.add_argument("--tag", help="a suffix for the folder name, e.g. torch291 for a run under "
                                  "torch 2.9.1 (run this script with that venv's python)")
    ap.add_argument("--readme", action="store_true", help="only rewrite <out>/README.md")
    ap.add_argument("--refresh-expected", action="store_true",
                    help="only rewrite the spec-derived fields of existing expected.json files")
    args = ap.parse_args()

    gpu = args.device != "cpu"
    names = (args.only.split(",") if args.only
             else [n for n, sp in SCENARIOS.items() if bool(sp.get("gpu")) == gpu])
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n!r}; known: {', '.join(SCENARIOS)}")
        if SCENARIOS[n].get("gpu") and not gpu and not (args.readme or args.refresh_expected):
            ap.error(f"{n} needs a GPU: add --device cuda")
    out_root = Path(args.out).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    if args.refresh_expected:
        refresh_expected(out_root, names)
    if args.readme or args.refresh_expected:
        write_readme(out_root)
        return
    cwd = Path.cwd()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for _ in pool.map(lambda n: run_scenario(n, args.backend, args.device, out_root, cwd,
                                                 args.launcher, args.tag), names):
            pass
    write_readme(out_root)


if __name__ == "__main__":
    main()

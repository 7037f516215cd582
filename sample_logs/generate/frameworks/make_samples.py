"""Run the framework samples for real and write each one's folder under sample_logs/.

    /work/venvs/fw/bin/python sample_logs/generate/frameworks/make_samples.py [--only NAME,...]

Run it with a Python that has torch, lightning and transformers (its own venv:
``python3 -m venv fw && fw/bin/pip install torch==2.13.0 lightning transformers accelerate``).
Each scenario's launcher runs from the repository root with ``OMP_NUM_THREADS=1``; its stdout and
stderr go to ``<scenario>/console.log`` as one terminal would show them, and the framework writes
its own files under ``<scenario>/out/``. Nothing is edited afterwards. ``expected.json`` holds the
verdict a correct analyzer should reach, the planted line (found from its ``# PLANTED(<scenario>)``
comment, never typed in), how the run ended and what really happened (``note``). A launcher
variant (``plants``: the scenario whose plant it runs, e.g. ``hf_trainer_rank_exception`` for
``hf_trainer_rank_exception_accelerate``) runs that plant under another launcher (``accelerate
launch``) and records the command it ran (``launch_command``).
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LIGHTNING = HERE / "lightning_train.py"
HF = HERE / "hf_trainer_train.py"
LEAK_CUDA = HERE / "lightning_leak_cuda.py"
# ``accelerate launch`` as a user types it for two processes on one machine. ``--cpu`` (or a config
# file's ``distributed_type: MULTI_CPU``) would start one process whatever --num_processes says (its
# multi-CPU mode goes through mpirun, --mpirun_hostfile); --multi_gpu hands the two processes to
# torch.distributed.run, and the Trainer's use_cpu=True runs them on the CPU over gloo. No config
# file: accelerate prints the defaults it took. --main_process_port 0: a free port.
ACCELERATE = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
ACCELERATE_LAUNCH = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "0"]
ACCELERATE_WORDS = ("accelerate launch --multi_gpu --num_processes 2 --main_process_port 0 (no config file; "
                    "accelerate hands the two processes to torch.distributed.run, no --log-dir: one console), "
                    "HF Trainer with use_cpu=True (gloo)")
# nvidia-smi's own CSV log of the GPU beside a CUDA run (as a job's monitor keeps one)
NVIDIA_SMI = ["nvidia-smi", "--query-gpu=timestamp,index,memory.used,memory.total", "--format=csv", "-lms", "100"]

SCENARIOS = {
    "lightning_non_finite_loss": {
        "script": LIGHTNING,
        "cmd": [sys.executable, str(LIGHTNING)],
        "launcher": "Lightning's own DDP launcher (Trainer(strategy='ddp', devices=2) re-runs the script for rank 1)",
        "planted": "step 4: a corrupt record: one NaN feature in rank 1's batch (corrupt); training goes on",
        "root_cause": "non-finite-loss", "culprit_ranks": [], "user_line_is_planted": False,
        "note": ("As planned: metrics.csv (written by rank 0; train_loss logged with sync_dist=True, the mean over the "
                 "ranks) has a finite train_loss at steps 0-3 and nan from step 4 to the end, and the console's progress "
                 "bar ends 'train_loss: nan'; exit 0. Nothing in the logs says which rank's batch was bad (Lightning's "
                 "loggers and progress bar are rank 0's), so no culprit is expected."),
    },
    "lightning_rank_exception": {
        "script": LIGHTNING,
        "cmd": [sys.executable, str(LIGHTNING)],
        "launcher": "Lightning's own DDP launcher (Trainer(strategy='ddp', devices=2) re-runs the script for rank 1)",
        "planted": "step 4: rank 1 raises ValueError in check_batch",
        "root_cause": "rank-crash", "culprit_ranks": [1], "user_line_is_planted": True,
        "note": ("As planned: rank 1's ValueError traceback (torch prefixes it [rank1]:) ends in check_batch; rank 0, "
                 "in the barrier of its self.log(sync_dist=True) reduction, fails with gloo's 'Connection closed by "
                 "peer' after it in the same console; Lightning's launcher exits 1. No line carries a timestamp: "
                 "the console's order is the only clock."),
    },
    "hf_trainer_non_finite_loss": {
        "script": HF,
        "cmd": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(HF)],
        "launcher": "torchrun --nproc-per-node 2 (no --log-dir: one console), HF Trainer on accelerate",
        "planted": "step 4: a corrupt record: one NaN feature in rank 1's batch (Collator.corrupt); training goes on",
        "root_cause": "non-finite-loss", "culprit_ranks": [], "user_line_is_planted": False,
        "note": ("The Trainer's logging_nan_inf_filter (on by default) hides the NaN loss: the logged loss stays "
                 "finite at step 4 and is 0 from step 5 on, while grad_norm is nan from step 4 to the end, in the "
                 "console's log dicts (printed as strings by transformers 5) and in trainer_state.json's log_history. Both are rank "
                 "0's view of all-reduced figures, so no culprit is expected; exit 0."),
    },
    "hf_trainer_rank_exception_accelerate": {
        "script": HF, "plants": "hf_trainer_rank_exception",
        "cmd": [*ACCELERATE_LAUNCH, str(HF)],
        "launcher": ACCELERATE_WORDS,
        "planted": "step 4: rank 1 raises ValueError in CheckedRegressor.check_batch (its training forward)",
        "root_cause": "rank-crash", "culprit_ranks": [1], "user_line_is_planted": True,
        "note": ("As planned: accelerate prints the defaults it took (no config file), then both ranks' lines share one "
                 "console: rank 1's ValueError traceback (torch prefixes it [rank1]:) ends in check_batch, under the "
                 "DDP forward of the Trainer's compute_loss; rank 0's accelerator.backward (the gradient all-reduce) "
                 "fails with gloo's 'Connection closed by peer' after it; torch.distributed.elastic SIGTERMs rank 0 "
                 "(exitcode -15) and names rank 1 (exitcode 1) first observed in its failure table, printed after "
                 "accelerate launch's own traceback (multi_gpu_launcher -> distrib_run.run -> ChildFailedError, no "
                 "rank prefix: the launcher's, not a rank's); error_file <N/A> (no @record); launcher exit 1. Only the "
                 "c10d warnings and the elastic agent's lines carry timestamps."),
    },
    "hf_trainer_non_finite_loss_accelerate": {
        "script": HF, "plants": "hf_trainer_non_finite_loss",
        "cmd": [*ACCELERATE_LAUNCH, str(HF)],
        "launcher": ACCELERATE_WORDS,
        "planted": "step 4: a corrupt record: one NaN feature in rank 1's batch (Collator.corrupt); training goes on",
        "root_cause": "non-finite-loss", "culprit_ranks": [], "user_line_is_planted": False,
        "note": ("As hf_trainer_non_finite_loss, under accelerate launch: the logged loss stays finite at step 4 "
                 "(logging_nan_inf_filter) and is 0 from step 5 on, while grad_norm is nan from step 4 to the end, in "
                 "the console's log dicts and in trainer_state.json's log_history; accelerate's defaults warning heads "
                 "the console. Rank 0's view of all-reduced figures: no culprit expected; exit 0."),
    },
    "lightning_memory_leak_cuda": {
        "script": LEAK_CUDA,
        "cmd": [sys.executable, str(LEAK_CUDA)],
        "launcher": "python (one process, Trainer(accelerator='gpu', devices=1)), DeviceStatsMonitor on",
        "planted": "every step: a metric forward's output is kept with its graph (keep_for_smoothing)",
        "root_cause": "memory-leak", "culprit_ranks": [], "user_line_is_planted": False,
        "device": "cuda", "monitor_gpu": True, "world_size": 1, "backend": "none (one process)",
        "note": ("As planned: metrics.csv's DeviceStatsMonitor columns (torch.cuda.memory_stats() at each batch's "
                 "start and end) show allocated_bytes.all.current rising every step; nvidia-smi's CSV (out/gpu.csv, "
                 "every 100 ms) shows the device's used memory rising with it. No OOM in 150 steps on a 140 GiB H200; "
                 "exit 0. No memory snapshot, so the leak's site is named by no log (user_line null)."),
    },
}


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        return None


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def installed(package: str) -> bool:
    try:
        version(package)
    except PackageNotFoundError:
        return False
    return True


def planted_line(script: Path, name: str) -> str:
    lines = script.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if f"# PLANTED({name})" in line)
    return f"{script.name}:{at + 2}"  # the line after the marker (1-based)


def rel_repo(path: str) -> str:
    return os.path.relpath(path, REPO)


def planned(name: str, spec: dict) -> dict:
    """The expected.json fields that come from the plan (the verdict, the planted line, the note),
    not from the run."""
    planted = planted_line(spec["script"], spec.get("plants", name))
    return {
        "scenario": name,
        "signatures": [spec["root_cause"]],
        "root_cause": spec["root_cause"],
        "culprit_ranks": spec["culprit_ranks"],  # [] where the logs name no culprit
        "user_line": planted if spec["user_line_is_planted"] else None,
        "planted_line": planted,
        "backend": spec.get("backend", "gloo"),
        "device": spec.get("device", "cpu"),
        "world_size": spec.get("world_size", 2),
        "planted": spec["planted"],
        "framework_launcher": spec["launcher"],
        **({"launch_command": " ".join([Path(spec["cmd"][0]).name, *spec["cmd"][1:-1],
                                         rel_repo(spec["cmd"][-1]), "--scenario", spec.get("plants", name),
                                         "--out", f"sample_logs/{name}/out"])}
           if spec.get("plants") else {}),
        "regenerate": f"python sample_logs/generate/frameworks/make_samples.py --only {name}",
        "note": spec["note"],
    }


def refresh_expected(name: str, spec: dict, out_root: Path) -> None:
    """Rewrite a folder's planned fields, keeping what its run recorded (exit, versions, wall time)."""
    path = out_root / name / "expected.json"
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({**recorded, **planned(name, spec)}, indent=2) + "\n")


def run(name: str, spec: dict, out_root: Path) -> None:
    folder = out_root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    # a launcher variant (``plants``) runs its scenario's plant under another launcher
    args = [*spec["cmd"], "--scenario", spec.get("plants", name), "--out", str(folder / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    monitor = None
    if spec.get("monitor_gpu"):
        (folder / "out").mkdir()
        monitor = subprocess.Popen([*NVIDIA_SMI, "-f", str(folder / "out" / "gpu.csv")])
    start = time.monotonic()
    with open(folder / "console.log", "wb") as console:
        proc = subprocess.run(args, check=False, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT, timeout=600)
    wall = time.monotonic() - start
    if monitor:
        monitor.terminate()
        monitor.wait(timeout=30)
    expected = {
        **planned(name, spec),
        "exit": f"launcher exit {proc.returncode}",
        "torch": version("torch"),
        "frameworks": {p: version(p) for p in ("lightning", "transformers", "accelerate") if installed(p)},
        "hardware": (f"GPU {gpu_name()}, {os.cpu_count()} CPU cores" if spec.get("device") == "cuda"
                     else f"CPU only, {os.cpu_count()} cores ({cpu_name()})"),
        "wall_s": round(wall, 1),
    }
    (folder / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(f"{name}: exit {proc.returncode} in {wall:.1f} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated scenario names (default: all)")
    ap.add_argument("--out", default=str(REPO / "sample_logs"))
    ap.add_argument("--refresh-expected", action="store_true",
                    help="only rewrite each folder's expected.json from the plan (no run)")
    a = ap.parse_args()
    # the CUDA scenarios need a GPU: without --only, the CPU ones
    names = a.only.split(",") if a.only else [n for n, s in SCENARIOS.items() if s.get("device") != "cuda"]
    if a.refresh_expected and not a.only:
        names = list(SCENARIOS)
    for name in names:
        (refresh_expected if a.refresh_expected else run)(name, SCENARIOS[name], Path(a.out))


if __name__ == "__main__":
    main()

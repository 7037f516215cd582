"""What `postmortem watch` costs a healthy job: its wall time with and without watch, alternated.

    python benchmarks/watch_overhead.py --runs 3 --nproc 8 --steps 200

Each run starts tests/fixtures/watch_job.py under torchrun (gloo, CPU, OMP_NUM_THREADS=1),
bare or under ``postmortem watch --stall 60 --interval 1``, alternately so that a change in the
machine's load hits both sides alike, and prints one line per run and the median of each side.
With watch, the job's time is the job's own (torchrun's start to its exit, from watch's final
document), not watch's start-up. Nothing is analyzed: a healthy job never stalls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from postmortem.replay import rerun

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "watch_job.py"


def torchrun(nproc: int, steps: int, launcher: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
            *launcher, str(FIXTURE), "--steps", str(steps)]


def bare(nproc: int, steps: int, env: dict, tmp: Path) -> float:
    """Wall seconds of the job alone, with the instruments watch turns on (rerun's: INFO logs,
    the flight recorder, per-rank log files), so that the difference is watch's looking."""
    instrumented, _ = rerun.instrument_env(tmp, env)
    with open(tmp / "console.log", "wb") as console:
        t0 = time.monotonic()
        subprocess.run(torchrun(nproc, steps, []), env=instrumented, check=True, stdout=console,
                       stderr=subprocess.STDOUT)
    return time.monotonic() - t0


def watched(nproc: int, steps: int, env: dict, tmp: Path) -> tuple[float, float, int]:
    """(the job's wall seconds as watch measured them, watch's own CPU seconds, its looks)."""
    proc = subprocess.run([sys.executable, "-m", "postmortem", "watch", "--stall", "60", "--interval", "1",
                           "-f", "json", "-q", "--no-history", "--out", str(tmp / "w"), "--",
                           *torchrun(nproc, steps, [])], env=env, check=True, capture_output=True, text=True)
    final = json.loads(proc.stdout.splitlines()[-1])
    if final["stalls"] or final["exit_code"] != 0:
        raise SystemExit(f"a healthy run was called stalled or failed: {final}")
    return final["seconds"], final["watch_cpu_s"], final["looks"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    times: dict[str, list[float]] = {"bare": [], "watch": []}
    cpu_per_look = []
    for i in range(args.runs):
        for side in ("bare", "watch"):
            with tempfile.TemporaryDirectory() as tmp:
                extra = ""
                if side == "bare":
                    seconds = bare(args.nproc, args.steps, env, Path(tmp))
                else:
                    seconds, cpu_s, looks = watched(args.nproc, args.steps, env, Path(tmp))
                    cpu_per_look.append(cpu_s / max(looks, 1))
                    extra = f"  (watch: {cpu_s:.2f} s CPU over {looks} looks)"
            times[side].append(seconds)
            print(f"run {i + 1} {side:5s} {seconds:6.1f} s{extra}", flush=True)
    b, w = statistics.median(times["bare"]), statistics.median(times["watch"])
    spread = max(times["bare"]) - min(times["bare"])
    print(f"median: bare {b:.1f} s, under watch {w:.1f} s ({(w - b) / b:+.1%}); bare runs spread {spread:.1f} s; "
          f"watch's CPU per look <= {max(cpu_per_look) * 1000:.0f} ms")


if __name__ == "__main__":
    main()

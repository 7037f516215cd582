"""Benchmark: a synthesized big job to a verdict, side by side with the tools that read the same inputs.

    python benchmarks/run.py sample_logs/hang_dataloader --ranks 64,256,512 --pad-mb 16 --json bench.json

For each rank count it fans the scenario out (benchmarks/synth.py), then times, each in its
own process (wall, CPU, peak RSS from wait4):

- `cat` of every file to /dev/null: the floor;
- `postmortem analyze DIR --no-history` (discovery, parsing, loading, signatures, report);
- tlparse on the TORCH_TRACE files, HTA's TraceAnalysis on the Kineto traces, and
  PyTorch's flight-recorder analyzer on the dumps — each only where the job has its input,
  and only where the tool is installed (--tlparse, --hta-python, --torch-python name them).

Not a test: run by hand; the README's performance section records the figures and the
machine. The verdict on each synthesized job is printed next to its timing, so a fast
wrong answer shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402


def timed(cmd: list[str], cwd: Path | None = None, stdout=subprocess.DEVNULL) -> dict:
    """Run cmd; wall seconds, CPU seconds and peak RSS (MiB) of the process and its children."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    err = proc.stderr.read() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "rc": proc.returncode, "stderr": err[-500:]}


def input_bytes(job: Path) -> dict[str, int]:
    from postmortem.discover import discover

    found = discover(job)
    sizes: dict[str, int] = {}
    for s in found.sources:
        sizes[s.kind] = sizes.get(s.kind, 0) + s.bytes
    return sizes


def bench_one(job: Path, args) -> dict:
    files = [str(p) for p in job.rglob("*") if p.is_file()]
    kinds = input_bytes(job)
    total = sum(p.stat().st_size for p in map(Path, files))
    row = {"ranks": None, "bytes": total, "bytes_by_kind": kinds, "files": len(files), "tools": {}}
    with tempfile.NamedTemporaryFile("w", suffix=".lst") as lst:
        lst.write("\0".join(files))
        lst.flush()
        row["tools"]["cat"] = timed(["bash", "-c", f"xargs -0 cat < {lst.name} > /dev/null"])
    verdict_file = job.parent / f"{job.name}.verdict.json"
    with open(verdict_file, "w") as out:
        row["tools"]["postmortem"] = timed([sys.executable, "-m", "postmortem", "analyze", str(job), "--no-history",
                                            "-q", "-f", "json"], stdout=out)
    try:
        report = json.loads(verdict_file.read_text())
        row["verdict"] = {"signature": report["verdict"]["signature"], "culprit_ranks": report["verdict"]["culprit_ranks"]}
    except ValueError:
        row["verdict"] = None
    traces = [p for p in job.rglob("*torch_trace*") if p.is_file()] + list(job.rglob("dedicated_log_torch_trace*"))
    if args.tlparse and traces:
        out_dir = Path(tempfile.mkdtemp())
        trace_dir = traces[0].parent
        row["tools"]["tlparse"] = timed([args.tlparse, str(trace_dir), "--all-ranks-html", "-o", str(out_dir),
                                         "--overwrite", "--no-browser"])
        row["tools"]["tlparse"]["bytes"] = sum(p.stat().st_size for p in trace_dir.iterdir() if p.is_file())
        shutil.rmtree(out_dir, ignore_errors=True)
    kineto = sorted(job.rglob("*.pt.trace.json*"))
    if args.hta_python and kineto:
        trace_dir = Path(tempfile.mkdtemp())
        for i, p in enumerate(kineto):
            os.symlink(p, trace_dir / f"rank{i}.{p.name}")
        code = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])"
        row["tools"]["hta_load"] = timed([args.hta_python, "-c", code, str(trace_dir)])
        row["tools"]["hta_load"]["bytes"] = sum(p.stat().st_size for p in kineto)
    dumps = sorted(job.rglob("nccl_trace_rank_*"))
    if args.torch_python and dumps:
        dump_dir = Path(tempfile.mkdtemp())
        for p in dumps:
            os.symlink(p, dump_dir / p.name)
        row["tools"]["torchfrtrace"] = timed([args.torch_python, "-m", "torch.distributed.flight_recorder.fr_trace",
                                              str(dump_dir), "-p", "nccl_trace_rank_"])
        row["tools"]["torchfrtrace"]["bytes"] = sum(p.stat().st_size for p in dumps)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--ranks", default="64", help="comma-separated rank counts")
    parser.add_argument("--pad-mb", type=float, default=16.0)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "postmortem-bench")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tlparse", default=shutil.which("tlparse"))
    parser.add_argument("--hta-python", default=None, help="a python that has HolisticTraceAnalysis")
    parser.add_argument("--torch-python", default=None, help="a python that has torch (for torchfrtrace)")
    parser.add_argument("--keep", action="store_true", help="keep the synthesized jobs")
    args = parser.parse_args()
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        job = args.work / f"{args.scenario.name}-{n}"
        synth.synthesize(args.scenario, job, ranks=n, pad_mb=args.pad_mb, seed=n)
        row = bench_one(job, args)
        row["ranks"] = n
        rows.append(row)
        pm, floor = row["tools"]["postmortem"], row["tools"]["cat"]
        mb = row["bytes"] / 2**20
        print(f"{n:>4} ranks {mb:8.0f} MiB {row['files']:>6} files | cat {floor['wall_s']:6.2f} s | postmortem "
              f"{pm['wall_s']:6.2f} s wall {pm['cpu_s']:6.2f} s cpu {pm['peak_rss_mib']:7.0f} MiB rss "
              f"{mb / max(pm['wall_s'], 1e-9):7.1f} MiB/s ({pm['wall_s'] / max(floor['wall_s'], 1e-9):.1f}x cat) | "
              f"verdict {row['verdict']}")
        for tool in ("tlparse", "hta_load", "torchfrtrace"):
            if tool in row["tools"]:
                t = row["tools"][tool]
                print(f"      {tool:12} {t['wall_s']:6.2f} s wall {t['peak_rss_mib']:7.0f} MiB rss on "
                      f"{t['bytes'] / 2**20:.0f} MiB (rc {t['rc']})")
        if not args.keep:
            shutil.rmtree(job, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": {"cpus": os.cpu_count()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

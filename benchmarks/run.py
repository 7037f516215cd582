"""Benchmark: a synthesized big job to a verdict, side by side with the tools that read the same inputs.

    python benchmarks/run.py sample_logs/hang_dataloader --ranks 64,256,512 --pad-mb 16 --json bench.json
    python benchmarks/run.py sample_logs/straggler_nccl --ranks 512 --pad-mb 16 --job-kineto-mb 50 --job-kineto-ranks 64

For each rank count it fans the scenario out (benchmarks/synth.py), then times, each in its
own process (wall, CPU, peak RSS from wait4, its orphaned descendants included):

- `cat` of every file to /dev/null: the floor of reading;
- the scan floor: postmortem's block scan for its parsers' triggers (benchmarks/scan_floor.py,
  Hyperscan) over every file alone: reading and scanning every byte once, below which no
  parse can go;
- `postmortem analyze DIR --no-history` (discovery, parsing, loading, signatures, report);
- tlparse on the TORCH_TRACE files, HTA's TraceAnalysis on the Kineto traces, and
  PyTorch's flight-recorder analyzer on the dumps — each only where the job has its input,
  and only where the tool is installed (--tlparse, --hta-python, --torch-python name them).

postmortem's own modules are compiled to bytecode first, as pip's install does: an editable
install under PYTHONDONTWRITEBYTECODE (this machine sets it) would compile every one of them at
each start, in the command and in its workers' server (~0.2 s of CPU, ~0.1 s of wall for 64 ranks).

Not a test: run by hand; the README's performance section records the figures and the
machine. The verdict on each synthesized job is printed next to its timing, so a fast
wrong answer shows.
"""

from __future__ import annotations

import argparse
import gzip
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
import kineto_bench  # noqa: E402
import synth  # noqa: E402


def timed(cmd: list[str], cwd: Path | None = None, stdout=subprocess.DEVNULL) -> dict:
    """Run cmd; wall seconds, CPU seconds and peak RSS (MiB) of the process and its children.
    Its stderr goes to a file (a pipe nobody reads while it runs would block a chatty tool).

    Every descendant counts: this process is made their subreaper (Linux), so that one orphaned
    when its parent exits (postmortem's parsing workers are children of multiprocessing's
    forkserver, which outlives the command by a moment) is reaped here, its CPU summed, not lost."""
    _become_subreaper()
    with tempfile.TemporaryFile() as errors:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=stdout, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        cpu, peak = usage.ru_utime + usage.ru_stime, usage.ru_maxrss
        while True:  # the orphans, until none is left
            try:
                _, _, orphan = os.wait4(-1, 0)
            except ChildProcessError:
                break
            cpu, peak = cpu + orphan.ru_utime + orphan.ru_stime, max(peak, orphan.ru_maxrss)
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "peak_rss_mib": round(peak / 1024, 1), "rc": os.waitstatus_to_exitcode(status),
            "stderr": err[-500:]}


def _become_subreaper() -> None:
    """Orphaned descendants become this process's children (prctl PR_SET_CHILD_SUBREAPER), where
    Linux has it; elsewhere they are not counted."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def input_bytes(job: Path) -> dict[str, int]:
    from postmortem.discover import discover

    found = discover(job)
    sizes: dict[str, int] = {}
    for s in found.sources:
        sizes[s.kind] = sizes.get(s.kind, 0) + s.bytes
    return sizes


def side_by_side(row: dict, tool: str, inputs: list[Path], command, decompress: bool = False,
                 grow_mb: int = 0) -> None:
    """Time ``tool`` and ``postmortem analyze`` on the same files: ``inputs`` gathered into one
    folder (symlinks, decompressed copies for a tool that reads plain files only, or Kineto
    traces grown to ``grow_mb`` MB each by repeating their events)."""
    folder, out = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    for i, p in enumerate(inputs):
        name = f"{i}.{p.name}" if tool == "hta_load" else p.name  # HTA wants one file per rank, any name
        if grow_mb:
            kineto_bench.build(p, folder / name.removesuffix(".gz"), grow_mb)
        elif decompress and p.suffix == ".gz":
            with gzip.open(p, "rb") as src, open(folder / name.removesuffix(".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            os.symlink(p.resolve(), folder / name)
    size = sum(f.stat().st_size for f in folder.iterdir())
    row["tools"][tool] = {**timed(command(folder, out)), "bytes": size}
    row["tools"][f"postmortem on {tool}'s input"] = {
        **timed([sys.executable, "-m", "postmortem", "analyze", str(folder), "--no-history", "-q", "-f", "json"]),
        "bytes": size}
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


def profile_subset(job: Path, ranks: int, size_mb: int) -> None:
    """Make the job look like one that profiled ``ranks`` of its ranks: their Kineto traces are
    grown to ``size_mb`` MB each (repeated events), the other ranks' traces removed."""
    traces = sorted(job.rglob("*.pt.trace.json*"))
    for i, trace in enumerate(traces):
        if i < ranks:
            kineto_bench.build(trace, trace.with_name(trace.name.removesuffix(".gz")), size_mb)
            if trace.suffix == ".gz":
                trace.unlink()
        else:
            trace.unlink()


def bench_one(job: Path, args) -> dict:
    files = [str(p) for p in job.rglob("*") if p.is_file()]
    kinds = input_bytes(job)
    total = sum(p.stat().st_size for p in map(Path, files))
    row = {"ranks": None, "bytes": total, "bytes_by_kind": kinds, "files": len(files), "tools": {}}
    with tempfile.NamedTemporaryFile("w", suffix=".lst") as lst:
        lst.write("\0".join(files))
        lst.flush()
        row["tools"]["cat"] = timed(["bash", "-c", f"xargs -0 cat < {lst.name} > /dev/null"])
        row["tools"]["scan"] = timed([sys.executable, str(HERE / "scan_floor.py"), lst.name])
    verdict_file = job.parent / f"{job.name}.verdict.json"
    with open(verdict_file, "w") as out:
        row["tools"]["postmortem"] = timed([sys.executable, "-m", "postmortem", "analyze", str(job), "--no-history",
                                            "-q", "-f", "json"], stdout=out)
    try:
        report = json.loads(verdict_file.read_text())
        row["verdict"] = {"signature": report["verdict"]["signature"], "culprit_ranks": report["verdict"]["culprit_ranks"]}
    except ValueError:
        row["verdict"] = None
    traces = sorted({p for p in job.rglob("*torch_trace*") if p.is_file()} | set(job.rglob("dedicated_log_torch_trace*")))
    if args.tlparse and traces:
        # tlparse reads plain files: both tools get the same decompressed copies
        side_by_side(row, "tlparse", traces, lambda d, out: [args.tlparse, str(d), "--all-ranks-html", "-o", str(out),
                                                              "--overwrite", "--no-browser"], decompress=True)
    kineto = sorted(job.rglob("*.pt.trace.json*"))
    if args.hta_python and kineto:
        code = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])"
        side_by_side(row, "hta_load", kineto[:args.kineto_ranks or None], lambda d, out: [args.hta_python, "-c", code,
                                                                                           str(d)],
                     grow_mb=args.kineto_mb)
    dumps = sorted(job.rglob("nccl_trace_rank_*"))
    if args.torch_python and dumps:
        side_by_side(row, "torchfrtrace", dumps, lambda d, out: [
            args.torch_python, "-m", "torch.distributed.flight_recorder.fr_trace", str(d), "-p", "nccl_trace_rank_"])
    return row


def compile_bytecode() -> None:
    """postmortem's modules compiled to bytecode beside them (__pycache__), as pip installs them."""
    import compileall
    import importlib

    for name in ("postmortem", "postmortem.parsers", "postmortem.signatures"):
        compileall.compile_dir(Path(importlib.import_module(name).__file__).parent, quiet=1)


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
    parser.add_argument("--kineto-mb", type=int, default=0,
                        help="HTA side by side: grow each rank's Kineto trace to this many MB (repeated events)")
    parser.add_argument("--kineto-ranks", type=int, default=0,
                        help="HTA side by side: only this many ranks' traces (HTA holds them all in memory)")
    parser.add_argument("--job-kineto-mb", type=int, default=0,
                        help="whole job: grow the Kineto traces of --job-kineto-ranks ranks to this many MB, drop the rest")
    parser.add_argument("--job-kineto-ranks", type=int, default=64)
    args = parser.parse_args()
    compile_bytecode()
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        job = args.work / f"{args.scenario.name}-{n}"
        synth.synthesize(args.scenario, job, ranks=n, pad_mb=args.pad_mb, seed=n)
        if args.job_kineto_mb:
            profile_subset(job, args.job_kineto_ranks, args.job_kineto_mb)
        os.sync()  # (a crashed job's logs were written long before: not while they are read, by the kernel's writeback)
        row = bench_one(job, args)
        row["ranks"] = n
        row["load"] = os.getloadavg()  # other jobs on the machine: wall time is a floor, CPU time what it cost
        rows.append(row)
        pm, floor, scan = row["tools"]["postmortem"], row["tools"]["cat"], row["tools"]["scan"]
        mb = row["bytes"] / 2**20
        print(f"{n:>4} ranks {mb:8.0f} MiB {row['files']:>6} files | cat {floor['wall_s']:6.2f} s | scan "
              f"{scan['wall_s']:6.2f} s wall {scan['cpu_s']:6.2f} s cpu | postmortem "
              f"{pm['wall_s']:6.2f} s wall {pm['cpu_s']:6.2f} s cpu {pm['peak_rss_mib']:7.0f} MiB rss "
              f"{mb / max(pm['wall_s'], 1e-9):7.1f} MiB/s ({pm['wall_s'] / max(floor['wall_s'], 1e-9):.1f}x cat, "
              f"{pm['wall_s'] / max(scan['wall_s'], 1e-9):.1f}x scan; CPU {pm['cpu_s'] / max(scan['cpu_s'], 1e-9):.1f}x "
              f"scan's) | load {row['load'][0]:.1f} | "
              f"verdict {row['verdict']}")
        for tool in ("tlparse", "hta_load", "torchfrtrace"):
            if tool in row["tools"]:
                t, ours = row["tools"][tool], row["tools"][f"postmortem on {tool}'s input"]
                print(f"      {tool:12} {t['wall_s']:6.2f} s wall {t['peak_rss_mib']:7.0f} MiB rss (rc {t['rc']}) | "
                      f"postmortem {ours['wall_s']:6.2f} s wall {ours['peak_rss_mib']:7.0f} MiB rss | same "
                      f"{t['bytes'] / 2**20:.1f} MiB | {t['wall_s'] / max(ours['wall_s'], 1e-9):.1f}x faster, "
                      f"{t['peak_rss_mib'] / max(ours['peak_rss_mib'], 1e-9):.1f}x less memory")
        if not args.keep:
            shutil.rmtree(job, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "load": os.getloadavg()}, "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    main()

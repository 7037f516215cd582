"""Parse throughput and peak memory of the Kineto parser on a ~1 GB trace (a benchmark, not a test).

The trace is built by repeating a real trace's events (default: the largest
``sample_logs/*/**/*.pt.trace.json``), shifting each copy's timestamps and step numbers
so it reads as one long profiling window of the same job. Parsing runs in a fresh
process so its peak RSS is the parser's own.

    python benchmarks/kineto_bench.py                   # build /tmp/kineto_bench.pt.trace.json, parse it
    python benchmarks/kineto_bench.py --size-mb 1024 --trace PATH --out PATH --keep
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_trace() -> Path:
    found = sorted(ROOT.glob("sample_logs/**/*.pt.trace.json*"), key=lambda p: p.stat().st_size)
    if not found:
        sys.exit("no *.pt.trace.json under sample_logs/: give one with --trace")
    return found[-1]


def build(src: Path, out: Path, size_mb: int) -> int:
    """Write a trace of about ``size_mb`` MB: the source's header, its events repeated, its tail.

    Each copy's timestamps are shifted past the previous copy and its ``ProfilerStep#N``
    renumbered, so the result reads as one long window. The events are rendered once, with
    placeholders where the timestamps and step numbers go, and the copies filled in from that.
    """
    raw = src.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - t0 + 1000.0
    steps = sorted({int(m[1]) for e in events if (m := re.match(r"ProfilerStep#(\d+)$", str(e.get("name"))))})
    n_steps = (steps[-1] - steps[0] + 1) if steps else 0
    values: list[tuple[str, float]] = []  # ("ts", value) or ("step", number), in text order
    rendered = []
    for e in events:
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            values.append(("ts", e["ts"]))
            e["ts"] = _TS
        m = re.match(r"ProfilerStep#(\d+)$", str(e.get("name")))
        if m:
            text = json.dumps(e, indent=2).replace(f'"{_TS}"', "\x00", 1)
            text = text.replace(f"ProfilerStep#{m[1]}", "ProfilerStep#\x01", 1)
            # keep the placeholders in text order
            if text.index("\x00") < text.index("\x01"):
                values[-1:] = [values[-1], ("step", int(m[1]))]
            else:
                values[-1:] = [("step", int(m[1])), values[-1]]
            rendered.append(text)
        else:
            rendered.append(json.dumps(e, indent=2).replace(f'"{_TS}"', "\x00", 1))
    template = ",\n".join(rendered)
    parts = re.split("[\x00\x01]", template)
    copy_bytes = len(template) + 2
    copies = max(1, size_mb * 10**6 // copy_bytes)
    header = {k: v for k, v in doc.items() if k != "traceName"}
    with open(out, "w") as fh:
        fh.write(json.dumps(header, indent=2)[:-2] + ',\n  "traceEvents": [\n')
        for c in range(copies):
            shift = c * span
            pieces = [parts[0]]
            for (kind, value), part in zip(values, parts[1:]):
                pieces.append(f"{value + shift:.3f}" if kind == "ts" else str(int(value) + c * n_steps))
                pieces.append(part)
            fh.write(("" if c == 0 else ",\n") + "".join(pieces))
        fh.write('\n  ],\n  "traceName": "' + str(out) + '"\n}\n')
    return out.stat().st_size


_TS = "__kineto_bench_ts__"


def parse_child(path: str) -> None:
    sys.path.insert(0, str(ROOT))
    from postmortem.parsers import profiler
    from postmortem.parsers.source import Source

    source = Source(path=Path(path), name=Path(path).name, kind=profiler.KIND, bytes=os.path.getsize(path))
    rows: dict[str, int] = {}
    start, cpu0 = time.perf_counter(), time.process_time()
    for table, frame in profiler.parse(source):
        rows[table] = rows.get(table, 0) + frame.height
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2), "peak_rss_mb": round(peak_mb),
                      "rows": rows}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="a real trace to repeat (default: the largest in sample_logs/)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/kineto_bench.pt.trace.json"))
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--keep", action="store_true", help="keep the built trace")
    ap.add_argument("--reuse", action="store_true", help="parse --out as it is, without rebuilding it")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        parse_child(args.child)
        return
    src = args.trace or default_trace()
    if not (args.reuse and args.out.exists()):
        t = time.perf_counter()
        size = build(src, args.out, args.size_mb)
        print(f"built {args.out} ({size / 1e6:.0f} MB) from {src} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    size = args.out.stat().st_size
    try:
        out = subprocess.run([sys.executable, __file__, "--child", str(args.out)], check=True,
                             capture_output=True, text=True).stdout
    finally:
        if not args.keep and not args.reuse:
            args.out.unlink(missing_ok=True)
    result = json.loads(out.strip().splitlines()[-1])
    mbps = size / 1e6 / result["seconds"]
    load = os.getloadavg()[0]
    print(f"{size / 1e6:.0f} MB in {result['seconds']:.1f} s = {mbps:.0f} MB/s ({result['cpu_seconds']:.1f} s of CPU), "
          f"peak RSS {result['peak_rss_mb']} MB ({os.cpu_count()} cores, load {load:.1f}, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()})")
    print(f"rows: {result['rows']}")


if __name__ == "__main__":
    main()

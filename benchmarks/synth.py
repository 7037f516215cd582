"""Fan a real sample_logs/ scenario out to a big job: N ranks on N/8 nodes, padded logs.

    python benchmarks/synth.py sample_logs/hang_dataloader /tmp/job512 --ranks 512 --pad-mb 16

Every line written is a line of the real run, with its ids rewritten: rank prefixes,
"Rank N" in c10d prefixes, NCCL communicator ranks and sizes, pids, hosts. The source job's
ranks keep their own logs (the planted failure stays on its rank, and a pipeline's stages keep
their roles); every further rank gets a copy of a healthy-path rank's logs. Each node gets torchrun's layout
(`node007/logs/<run>/attempt_0/<local_rank>/{stdout,stderr}.log`) and a console whose
failure table lists that node's ranks. Padding repeats each rank's own benign lines
(NCCL INFO, compile traces) before the failure, up to --pad-mb per rank. py-spy dumps,
flight-recorder dumps (through the restricted unpickler) and Kineto traces are fanned out
too. Deterministic from --seed.

Used by the benchmark (benchmarks/run.py) and, small, by the tests: a synthesized job must
get the verdict of the scenario it came from.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

_BENIGN = re.compile(r"NCCL INFO|\[__graph_breaks\]|\[__recompiles\]|\]:V\d{4}|^V\d{4}|\]:\[I\d{4}|^\[I\d{4}")
_BAD = re.compile(r"(?i)error|fail|timeout|timed out|abort|signal|traceback|exception|nan\b|killed|warn")
_TABLE_START = re.compile(r"^(?:Failures:|Root Cause \(first observed failure\):)")


@dataclass
class Plan:
    ranks: int
    per_node: int
    culprits: set[int]
    template: int  # the source rank whose logs the healthy-path ranks copy
    source_world: int
    pid_base: int
    host_prefix: str
    faulty_host: str | None

    def source_of(self, rank: int) -> int:
        return rank if rank in self.culprits or rank < self.source_world else self.template

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def host_of(self, rank: int) -> str:
        node = self.node_of(rank)
        if self.faulty_host and any(self.node_of(c) == node for c in self.culprits):
            return self.faulty_host
        return f"{self.host_prefix}{node:03d}"

    def pid_of(self, rank: int) -> int:
        return self.pid_base + 13 * rank


def _source_pids(scenario: Path, world: int) -> dict[int, int]:
    """Each source rank's pid, from the `pid=` or failure-table lines of the real run."""
    pids: dict[int, int] = {}
    console = scenario / "console.log"
    text = console.read_text(errors="replace") if console.exists() else ""
    for m in re.finditer(r"\[rank(\d+)\] host=\S+ pid=(\d+)", text):
        pids.setdefault(int(m[1]), int(m[2]))
    for m in re.finditer(r"rank\s+:\s+(\d+) \(local_rank: \d+\)\n\s+exitcode\s+:\s+-?\d+ \(pid: (\d+)\)", text):
        pids.setdefault(int(m[1]), int(m[2]))
    for path in scenario.glob("logs/*/attempt_*/*/stderr.log"):
        rank = int(path.parent.name)
        m = re.search(r"^\[rank\d+\]:[VIWE]\d{4} [\d:.]+ (\d+) ", path.read_text(errors="replace"), re.M)
        if m:
            pids.setdefault(rank, int(m[1]))
    return pids


class Rewriter:
    """Rewrites one source rank's text into one target rank's."""

    def __init__(self, plan: Plan, src: int, dst: int, src_pid: int | None):
        self.dst = dst
        n, w = plan.ranks, plan.source_world
        host = plan.host_of(dst)
        subs = [
            (rf"\[(rank|default)({src})\]:", rf"[\g<1>{dst}]:"),
            (rf"\[rank{src}\] ", f"[rank{dst}] "),
            (rf"\bRank {src}\b", f"Rank {dst}"),
            (rf"global rank: {src}\b", f"global rank: {dst}"),
            (rf"^(\s+rank\s+:\s+){src}\b", rf"\g<1>{dst}"),
            (rf"\brank {src} nranks {w}\b", f"rank {dst} nranks {n}"),
            (rf"\brank {src} nRanks {w}\b", f"rank {dst} nRanks {n}"),
            (rf"\[nranks={w}\]", f"[nranks={n}]"),
            (rf"\bsize: {w},", f"size: {n},"),
            (rf"\bworld={w}\b", f"world={n}"),
            (r"\bhost=\S+", f"host={host}"),
            (r"^(\[\w+\]:)?[\w.-]+:(\d+):(\d+) \[", rf"\g<1>{host}:\g<2>:\g<3> ["),
        ]
        if src_pid:
            subs.append((rf"\b{src_pid}\b", str(plan.pid_of(dst))))
        self.subs = [(re.compile(p, re.M), r) for p, r in subs]

    def __call__(self, text: str) -> str:
        for pattern, repl in self.subs:
            text = pattern.sub(repl, text)
        return text


def _padded(text: str, pad_bytes: int) -> str:
    """The text with its own benign lines repeated before the failure, to about pad_bytes more."""
    lines = text.splitlines(keepends=True)
    benign = [ln for ln in lines if _BENIGN.search(ln) and not _BAD.search(ln)]
    if pad_bytes <= 0 or not benign:
        return text
    block = "".join(benign)
    copies = max(1, pad_bytes // max(1, len(block)))
    cut = next((i for i, ln in enumerate(lines) if _BAD.search(ln)), len(lines) // 2)
    return "".join(lines[:cut]) + block * copies + "".join(lines[cut:])


def _table_entries(console: str) -> tuple[list[str], dict[int, list[str]], int, list[str]]:
    """(lines before the table, {source rank: entry lines}, root-cause source rank, lines after)."""
    lines = console.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if _TABLE_START.match(ln)), None)
    if start is None:
        return lines, {}, -1, []
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("=====")), len(lines))
    entries: dict[int, list[str]] = {}
    root = -1
    current: list[str] | None = None
    in_root = False
    for ln in lines[start:end]:
        if ln.startswith("Root Cause"):
            in_root = True
        m = re.match(r"\s+rank\s+:\s+(\d+)", ln)
        if re.match(r"^\[\d+\]:", ln):
            current = [ln]
        elif current is not None and ln.startswith("  "):
            current.append(ln)
            if m:
                entries[int(m[1])] = current
                if in_root:
                    root = int(m[1])
    return lines[:start], entries, root, lines[end:]


def _failure_table(plan: Plan, node_ranks: list[int], entries: dict[int, list[str]], root: int,
                   rewriters: dict[int, Rewriter]) -> str:
    out = ["Failures:\n"]
    failed = [r for r in node_ranks if plan.source_of(r) in entries]
    root_rank = next((r for r in failed if plan.source_of(r) == root and r in plan.culprits), None)
    if root_rank is None and failed:
        root_rank = failed[0]
    others = [r for r in failed if r != root_rank]
    for i, r in enumerate(others, start=1):
        entry = [re.sub(r"local_rank: \d+", f"local_rank: {r % plan.per_node}", rewriters[r](ln))
                 for ln in entries[plan.source_of(r)]]
        out += [f"[{i}]:\n"] + [ln for ln in entry[1:]]
        out.append("-" * 54 + "\n")
    if not others:
        out.append("  <NO_OTHER_FAILURES>\n" + "-" * 54 + "\n")
    if root_rank is not None:
        entry = [re.sub(r"local_rank: \d+", f"local_rank: {root_rank % plan.per_node}", rewriters[root_rank](ln))
                 for ln in entries[plan.source_of(root_rank)]]
        out += ["Root Cause (first observed failure):\n", "[0]:\n"] + entry[1:]
    out = [re.sub(r"host\s+:\s+\S+", lambda m: m[0].split(":")[0] + f": {plan.host_of(root_rank or 0)}", ln)
           for ln in out]
    return "".join(out)


def _fan_pickle(path: Path, out: Path, plan: Plan, src: int, dst: int) -> None:
    from postmortem.parsers import pickles  # the restricted unpickler: dumps are untrusted input

    doc = pickles.loads(path.read_bytes())
    if isinstance(doc, dict):
        for cfg in (doc.get("pg_config") or {}).values():
            if isinstance(cfg, dict) and "ranks" in cfg:
                cfg["ranks"] = json.dumps(list(range(plan.ranks)))
        doc["rank"] = dst
    out.write_bytes(pickle.dumps(doc, protocol=4))


def _trace_ranks(scenario: Path) -> dict[int, Path]:
    """The scenario's Kineto traces by the rank their distributedInfo names."""
    found = {}
    for path in sorted(scenario.glob("profiler/*.pt.trace.json*")):
        raw = path.read_bytes()
        head = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)[:1 << 16]
        m = re.search(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)', head)
        if m:
            found.setdefault(int(m[1]), path)
    return found


def _fan_trace(path: Path, out: Path, plan: Plan, dst: int) -> None:
    """A copy of a Kineto trace that names ``dst`` as its rank (and the new world size)."""
    raw = path.read_bytes()
    zipped = raw[:2] == b"\x1f\x8b"
    text = gzip.decompress(raw) if zipped else raw
    cut = text.find(b'"traceEvents"')
    cut = len(text) if cut < 0 else cut
    head = re.sub(rb'("distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*)\d+', rb"\g<1>" + str(dst).encode(), text[:cut])
    head = re.sub(rb'("world_size"\s*:\s*)\d+', rb"\g<1>" + str(plan.ranks).encode(), head)
    body = head + text[cut:]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(body) if zipped else body)


def _fan_torch_trace(path: Path, out: Path, dst: int) -> None:
    """A copy of a TORCH_TRACE log whose records name ``dst`` as their rank."""
    raw = path.read_bytes()
    zipped = raw[:2] == b"\x1f\x8b"
    text = re.sub(rb'"rank": \d+', b'"rank": ' + str(dst).encode(), gzip.decompress(raw) if zipped else raw)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(text, compresslevel=1) if zipped else text)


def synthesize(scenario: Path, out: Path, ranks: int, per_node: int = 8, pad_mb: float = 0.0, seed: int = 0,
               host_prefix: str = "node", faulty_host: str | None = None) -> Path:
    expected = json.loads((scenario / "expected.json").read_text())
    world = expected.get("world_size") or 2
    culprits = set(expected.get("culprit_ranks") or [])
    template = min(set(range(world)) - culprits) if set(range(world)) - culprits else 0
    rng = random.Random(seed)
    plan = Plan(ranks=ranks, per_node=per_node, culprits={c for c in culprits if c < ranks}, template=template,
                source_world=world, pid_base=rng.randrange(20_000, 60_000), host_prefix=host_prefix,
                faulty_host=faulty_host)
    pids = _source_pids(scenario, world)
    rewriters = {r: Rewriter(plan, plan.source_of(r), r, pids.get(plan.source_of(r))) for r in range(ranks)}
    if out.exists():
        shutil.rmtree(out)
    run_dirs = sorted(p for p in (scenario / "logs").iterdir() if p.is_dir()) if (scenario / "logs").is_dir() else []
    source_files = {}
    for attempt in (run_dirs[0].glob("attempt_*/*") if run_dirs else []):
        for f in attempt.iterdir():
            source_files.setdefault(int(attempt.name), {})[f.name] = f.read_text(errors="replace")
    console = (scenario / "console.log").read_text(errors="replace") if (scenario / "console.log").exists() else ""
    head, entries, root, tail = _table_entries(console)
    pad = int(pad_mb * (1 << 20))
    traces = _trace_ranks(scenario)
    for node in range(0, (ranks + per_node - 1) // per_node):
        node_dir = out / f"{host_prefix}{node:03d}"
        node_ranks = [r for r in range(node * per_node, min(ranks, (node + 1) * per_node))]
        run_name = run_dirs[0].name if run_dirs else "none_synth000"
        prefixed: list[str] = []
        for r in node_ranks:
            src = plan.source_of(r)
            rank_dir = node_dir / "logs" / run_name / "attempt_0" / str(r % per_node)
            rank_dir.mkdir(parents=True, exist_ok=True)
            for name, text in source_files.get(src, {}).items():
                body = rewriters[r](text)
                (rank_dir / name).write_text(_padded(body, pad) if name == "stderr.log" else body)
            prefixed += [rewriters[r](ln) for ln in head if re.match(rf"^\[\w+?{src}\]:", ln)]
        agent = [ln for ln in head if not re.match(r"^\[\w+?\d+\]:", ln)]
        table = _failure_table(plan, node_ranks, entries, root, rewriters) if entries else ""
        (node_dir / "console.log").write_text("".join(prefixed) + "".join(
            _agent_lines(agent, node_ranks, plan, pids)) + table + "".join(tail))
        for r in node_ranks:
            src = plan.source_of(r)
            for dump in (scenario / "pyspy").glob(f"rank{src}.*") if (scenario / "pyspy").is_dir() else []:
                target = node_dir / "pyspy" / f"rank{r}{dump.suffix}"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(rewriters[r](dump.read_text(errors="replace")))
            for dump in scenario.glob(f"nccl_trace_rank_{src}"):
                _fan_pickle(dump, node_dir / f"nccl_trace_rank_{r}", plan, src, r)
            if src in traces:
                suffix = ".pt.trace.json.gz" if traces[src].name.endswith(".gz") else ".pt.trace.json"
                _fan_trace(traces[src], node_dir / "profiler" / f"{plan.host_of(r)}_rank{r}{suffix}", plan, r)
            for log in scenario.glob(f"torch_trace/dedicated_log_torch_trace_rank_{src}_*"):
                _fan_torch_trace(log, node_dir / "torch_trace" / log.name.replace(f"_rank_{src}_", f"_rank_{r}_"), r)
            for snap in scenario.glob(f"memory_snapshot_rank{src}.pickle"):
                shutil.copyfile(snap, node_dir / f"memory_snapshot_rank{r}.pickle")  # copied as bytes, never loaded
    (out / "expected.json").write_text(json.dumps({**expected, "world_size": ranks, "synthesized_from": scenario.name,
                                                   "seed": seed}, indent=2))
    return out


def _agent_lines(agent: list[str], node_ranks: list[int], plan: Plan, pids: dict[int, int]) -> list[str]:
    """torchrun's own lines for one node: the ones about a worker are repeated for each of its ranks."""
    by_pid = {pid: rank for rank, pid in pids.items()}
    out = []
    for ln in agent:
        m = re.search(r"(?:process |pid: )(\d+)", ln)
        if m and int(m[1]) in by_pid:
            src = by_pid[int(m[1])]
            for r in node_ranks:
                if plan.source_of(r) == src:
                    out.append(re.sub(rf"\b{m[1]}\b", str(plan.pid_of(r)),
                                      re.sub(r"local_rank: \d+", f"local_rank: {r % plan.per_node}", ln)))
        else:
            out.append(ln)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--pad-mb", type=float, default=0.0, help="padding per rank's stderr, MB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host-prefix", default="node")
    parser.add_argument("--faulty-host", default=None, help="name the culprit's node this")
    args = parser.parse_args()
    out = synthesize(args.scenario, args.out, args.ranks, args.per_node, args.pad_mb, args.seed, args.host_prefix,
                     args.faulty_host)
    print(out)


if __name__ == "__main__":
    main()

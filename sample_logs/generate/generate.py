"""Produce the sample corpus: run each scenario of train.py under torchrun and keep what it leaves.

    python sample_logs/generate/generate.py                      # every scenario, gloo / CPU
    python sample_logs/generate/generate.py --only healthy,rank_sigkill
    python sample_logs/generate/generate.py --backend nccl --out sample_logs_gpu

For each scenario it makes ``<out>/<scenario>/`` holding:

* ``console.log``     torchrun's own stdout+stderr, exactly as produced
* ``logs/``           torchrun ``--log-dir`` (``--redirects 3 --tee 3``: per-rank stdout/stderr)
* ``pyspy/rank<r>.{txt,json}``   for hang scenarios, py-spy dumps taken ~10 s into the hang
* ``nccl_trace_rank_<r>``        flight-recorder dumps, where the backend writes them
* ``torch_trace/``    TORCH_TRACE structured logs (recompile_limit only)
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
        marker="allgather_shard_mismatch", user_line=None,
    ),
    "dtype_mismatch": dict(
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
        steps=10,
        planted="step 4: rank 1 reads address 0 via ctypes.string_at(0) in train_step (SIGSEGV)",
        signatures=["native-crash", "rank-crash"], root_cause="native-crash", culprit_ranks=[1],
        user_line=None,
    ),
}

# Notes, written after looking at what the runs really did (see README.md).
NOTES = {
    "rank_sigkill":
        "On gloo rank 0 does not wait for the 30 s timeout: its DDP backward all-reduce fails at "
        "once with a gloo connection error (tcp/pair.cc 'Connection reset by peer' or 'Connection "
        "closed by peer') when rank 1's sockets close; torchrun then SIGTERMs rank 0. No "
        "flight-recorder dump (gloo writes none). user_line is null: SIGKILL leaves no "
        "traceback, so no log names train_step's os.kill line (planted_line).",
    "rank_exception":
        "Rank 1's ValueError traceback ends in check_batch; rank 0's backward all-reduce fails at "
        "once with a gloo connection error (closed / reset by peer) and torchrun SIGTERMs it.",
    "hang_dataloader":
        "Rank 0's DDP backward all-reduce raises gloo 'Timed out waiting 30000ms for recv "
        "operation to complete' after 30 s and exits 1; torchrun then SIGTERMs rank 1 and names "
        "rank 0 as the 'first observed failure' -- the wrong culprit. py-spy shows rank 1 in "
        "Queue.get under fetch_batch. gloo has no flight-recorder dump-on-timeout, so there are "
        "no nccl_trace_rank_* files.",
    "hang_conditional_barrier":
        "collective-mismatch, not collective-hang: both ranks are inside a collective at the same "
        "point of the sequence, rank 0 in dist.barrier() (maybe_sync_before_step) and rank 1 in "
        "the DDP backward gradient all-reduce (py-spy shows both). Both raise gloo 'Timed out "
        "waiting 30000ms for recv operation' after 30 s and exit 1. Culprit rank 0: its code path "
        "differs (only rank 0 takes the `if rank == 0:` barrier); user_line is that barrier.",
    "allgather_shard_mismatch":
        "gloo neither hangs nor times out: rank 1's gloo thread hits gloo::EnforceNotMet "
        "'op.preamble.length <= op.nbytes. 8192 vs 8000. Received data size doesn't match expected "
        "size. Is there a distributed collective mismatch in your code?' -> std::terminate -> "
        "SIGABRT (no Python traceback on rank 1); rank 0 fails in the all_gather_into_tensor with "
        "a gloo connection error (reset / closed by peer) and is SIGTERMed. The 4096-vs-4000 numel is not printed; only "
        "the byte counts of one transfer (8192 vs 8000).",
    "collective_mismatch_detail":
        "NOT as planned: with TORCH_DISTRIBUTED_DEBUG=DETAIL on gloo, torch 2.13.0+cpu segfaults "
        "in DDP's constructor (DistributedDataParallel._ddp_init_helper -> "
        "logger.set_construction_data_and_log, seen with faulthandler in a side run; "
        "reproduced with a bare DDP(nn.Linear) under DETAIL; INFO does not crash) on both ranks, "
        "right after the ProcessGroupWrapper 'Running collective: CollectiveFingerPrint' lines "
        "of DDP's init broadcasts and before step 0. Both exit -11 (SIGSEGV), no Python "
        "traceback. The planted all-gather mismatch is never reached; the DDP(...) line in "
        "main() (EVIDENCE marker) is where it dies, which no log names.",
    "dtype_mismatch":
        "gloo neither hangs nor times out: rank 1 (bf16) hits gloo::EnforceNotMet 'op.preamble."
        "length <= op.nbytes. 1024 vs 512 ... Is there a distributed collective mismatch in your "
        "code?' -> SIGABRT; rank 0 (fp32) fails in dist.all_reduce with a gloo "
        "connection error (reset / closed by peer) and is SIGTERMed. The dtypes themselves are not printed, only byte counts.",
    "rank_frozen":
        "Rank 0's backward all-reduce times out after 30 s (gloo recv timeout) and exits 1; "
        "torchrun SIGTERMs rank 1, which is stopped and cannot act on it, then SIGKILLs it after "
        "its 30 s grace period (exitcode -9). torchrun's 'first observed failure' is rank 0, the "
        "wrong culprit. No py-spy (a stopped process), by design, so no log names the line: "
        "user_line is null.",
    "native_crash":
        "Rank 1 dies of SIGSEGV (exitcode -11) with no Python traceback (faulthandler is off, as "
        "in most jobs), so no log names the ctypes.string_at line: user_line is null; rank 0's "
        "backward all-reduce fails with a gloo connection error (reset / closed by peer) and it "
        "is SIGTERMed. Last thing rank 1 logged: step 3.",
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
        "(TORCH_DISTRIBUTED_DEBUG unset), so no log points at aux_head: user_line is null.",
}


# --------------------------------------------------------------------------- helpers


def marker_line(kind, name, required=True):
    """train.py:<n> of the first code line after a ``# KIND(name)`` comment line."""
    lines = TRAIN.read_text().splitlines()
    tag = f"# {kind}({name})"
    for i, line in enumerate(lines):
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
    return planted, marker_line("EVIDENCE", name, required=False) or planted


def torchrun_cmd():
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def rel(p, start):
    try:
        return os.path.relpath(p, start)
    except ValueError:
        return str(p)


def pyspy_dump(pid, rank, outdir):
    """py-spy dump (text and --json) of one pid; returns a short status string."""
    outdir.mkdir(exist_ok=True)
    exe = shutil.which("py-spy")
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


SIGNAMES = {s.value: s.name for s in signal.Signals}


def parse_failures(console):
    """torchrun's failure table -> [{rank, exitcode, signal, traceback, root_cause}]."""
    out = []
    root = False
    cur = None
    for line in console.splitlines():
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
        m = re.match(r"\s+traceback\s+: (.*)", line)
        if m and cur is not None:
            cur["traceback"] = m.group(1).strip()
    return out


def describe_exit(rc, killed, failures):
    if killed:
        head = f"killed by generate.py after {RUN_LIMIT_S} s"
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


def run_scenario(name, backend, out_root, cwd):
    spec = SCENARIOS[name]
    sdir = (out_root / name).resolve()
    if sdir.exists():
        shutil.rmtree(sdir)
    sdir.mkdir(parents=True)
    console_path = sdir / "console.log"

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
    if spec.get("torch_trace"):
        env["TORCH_TRACE"] = str(sdir / "torch_trace")
    env.update(spec.get("env", {}))

    cmd = torchrun_cmd() + [
        "--nproc-per-node", "2",
        "--log-dir", rel(sdir / "logs", cwd),
        "--redirects", "3", "--tee", "3",
        rel(TRAIN, cwd),
        "--scenario", name, "--backend", backend, "--steps", str(spec["steps"]),
    ]
    print(f"[generate] {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    pyspy_status = None
    killed = False
    with open(console_path, "wb") as console:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=console, stderr=subprocess.STDOUT,
                                start_new_session=True)
        pids = {}
        hang_seen_at = None
        while proc.poll() is None:
            time.sleep(0.5)
            if time.time() - t0 > RUN_LIMIT_S:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                proc.wait()
                break
            if not spec.get("hang"):
                continue
            text = console_path.read_text(errors="replace")
            for m in re.finditer(r"\[rank(\d+)\] host=\S+ pid=(\d+)", text):
                pids[int(m.group(1))] = int(m.group(2))
            if hang_seen_at is None:
                done = set(int(r) for r in re.findall(
                    rf"\[rank(\d+)\] step {FAIL_STEP - 1} loss", text))
                if len(done) >= 2:
                    hang_seen_at = time.time()
            elif (spec.get("pyspy") and pyspy_status is None
                  and time.time() - hang_seen_at >= HANG_DUMP_AFTER_S):
                stat = []
                for r, pid in sorted(pids.items()):
                    stat.append(f"rank{r} pid {pid}: {pyspy_dump(pid, r, sdir / 'pyspy')}"
                                .replace("; ", ", "))
                pyspy_status = (f"py-spy dumps taken {time.time() - hang_seen_at:.0f} s after "
                                f"step {FAIL_STEP - 1} was logged: " + "; ".join(stat))
                print(f"[generate] {name}: {pyspy_status}", flush=True)
        rc = proc.returncode
    wall = time.time() - t0

    # TORCH_TRACE logs are large (every recompile's graphs and code): gzip them, unchanged.
    for f in sorted((sdir / "torch_trace").glob("*")) if (sdir / "torch_trace").is_dir() else []:
        if f.is_file() and f.suffix != ".gz":
            subprocess.run(["gzip", "-9", "-n", str(f)], check=True)
    planted_line, user_line = lines_for(name, spec)
    console_text = console_path.read_text(errors="replace")
    failures = parse_failures(console_text)
    m = re.search(r"torch=(\S+)", console_text)
    torch_version = m.group(1) if m else None
    if spec.get("pyspy") and pyspy_status is None:
        pyspy_status = "no py-spy dump: the run ended before the hang reached 10 s"

    expected = {
        "scenario": name,
        "signatures": spec["signatures"],
        "root_cause": spec["root_cause"],
        "culprit_ranks": spec["culprit_ranks"],
        "user_line": user_line,
        "planted_line": planted_line,
        "backend": backend,
        "world_size": 2,
        "exit": describe_exit(rc, killed, failures),
        "planted": spec["planted"],
        "torchrun_rc": rc,
        "failures": failures,
        "torch": torch_version,
        "hardware": hardware(backend),
        "wall_s": round(wall, 1),
        "regenerate": f"python sample_logs/generate/generate.py --only {name} --backend {backend}",
    }
    if pyspy_status is not None:
        expected["pyspy"] = pyspy_status
    if name in NOTES:
        expected["note"] = NOTES[name]
    (sdir / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(f"[generate] {name}: {expected['exit']} in {wall:.0f} s", flush=True)
    return expected


def hardware(backend):
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if backend == "nccl":
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True).stdout.strip().splitlines()
            return f"{len(gpus)}x {gpus[0]}" if gpus else "GPU"
        except OSError:
            return "GPU"
    return f"CPU only, {os.cpu_count()} cores ({cpu})"


# --------------------------------------------------------------------------- README


README_HEAD = """# sample_logs: real logs of real runs

Every folder here is what one real run of `generate/train.py` left behind, produced by
`generate/generate.py` (nothing edited by hand). A run is `torchrun --nproc-per-node 2
--log-dir <scenario>/logs --redirects 3 --tee 3 generate/train.py --scenario NAME` with
`TORCH_LOGS=recompiles,graph_breaks`, `TORCH_CPP_LOG_LEVEL=INFO`, the flight recorder asked
for (`TORCH_FR_BUFFER_SIZE=2000`, `TORCH_NCCL_TRACE_BUFFER_SIZE=2000`,
`TORCH_NCCL_DUMP_ON_TIMEOUT=1`, dumps to `<scenario>/nccl_trace_rank_<r>`), a 30 s collective
timeout, `OMP_NUM_THREADS=1`, the inductor FX-graph and autograd caches off
(`TORCHINDUCTOR_FX_GRAPH_CACHE=0`, `TORCHINDUCTOR_AUTOGRAD_CACHE=0`: every run compiles).
`torch_trace/*.log.gz` are TORCH_TRACE logs gzipped by generate.py (content unchanged).
 `train.py` is a ~0.3 M-parameter MLP wrapped as
`torch.compile(DDP(model))` on seeded synthetic data; each scenario plants one failure at
step 4 in its own small function, the line after a `# PLANTED(<scenario>)` comment
(`planted_line`); `user_line` is where the logs point (an `# EVIDENCE(<scenario>)` comment
where that differs, e.g. the collective call a size mismatch shows up in).

Per folder: `console.log` (torchrun's console, ranks prefixed `[default<r>]:`),
`logs/<run>/attempt_0/<r>/{stdout,stderr}.log`, `expected.json` (the verdict a correct
analyzer should reach, how the run really ended, torchrun's failure table parsed, notes),
and where produced `pyspy/rank<r>.{txt,json}` (py-spy dumps ~10 s into a hang),
`nccl_trace_rank_<r>` (flight recorder), `torch_trace/` (TORCH_TRACE).

| scenario | planted | ran on | how it ended | root cause (culprit) | regenerate |
| --- | --- | --- | --- | --- | --- |
"""


def write_readme(out_root):
    rows = []
    order = list(SCENARIOS)
    found = sorted(out_root.glob("*/expected.json"),
                   key=lambda p: order.index(p.parent.name) if p.parent.name in order else 99)
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
        cells = [f"`{e['scenario']}`", e["planted"], ran_on, ended, rc, f"`{e['regenerate']}`"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        if e.get("note"):
            notes.append(f"- `{e['scenario']}`: {e['note']}")
    text = README_HEAD + "\n".join(rows) + "\n"
    if notes:
        text += "\n## Notes (what really happened where it differs from the plan)\n\n"
        text += "\n".join(notes) + "\n"
    (out_root / "README.md").write_text(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated scenario names (default: all)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--out", default="sample_logs", help="output directory (default: sample_logs)")
    args = ap.parse_args()

    names = args.only.split(",") if args.only else list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n!r}; known: {', '.join(SCENARIOS)}")
    out_root = Path(args.out).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    cwd = Path.cwd()
    for n in names:
        run_scenario(n, args.backend, out_root, cwd)
        write_readme(out_root)


if __name__ == "__main__":
    main()

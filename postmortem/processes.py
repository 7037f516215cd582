"""A job's processes, from /proc: who they are, whether they live, and ending them all.

``rerun`` and ``watch`` start jobs (or attach to one) and must find every process of it — torchrun
puts each worker in a session of its own, DataLoader and compile workers fork below them — to
dump, signal and reap them. A process is known by its pid *and* its start time, so a pid the
kernel reuses for someone else's process is never taken for ours. Nothing read here is run.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping

# Every process of a job postmortem started carries this variable with the job's own token.
TOKEN_VARIABLE = "POSTMORTEM_RERUN"


def stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time in clock ticks) from /proc, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def alive(pid: int, start: int) -> bool:
    st = stat(pid)
    return st is not None and st[2] == start and st[1] not in ("Z", "X")


def all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def prctl(option: int, *args) -> int | None:
    """Linux's ``prctl(option, *args)`` (the arguments not given 0): what it returned, or None where
    there is no C library to load or none with prctl."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, *args, *[0] * (4 - len(args)))
    except (OSError, AttributeError):
        return None


def subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants (Linux): orphaned workers come back to
    us to be reaped, rather than to init. Returns the previous setting."""
    previous = ctypes.c_int(0)
    if prctl(37, ctypes.byref(previous)) is None:  # PR_GET_CHILD_SUBREAPER
        return False
    prctl(36, int(on))  # PR_SET_CHILD_SUBREAPER
    return bool(previous.value)


class JobProcesses:
    """The processes of a job: its roots, their descendants (and those of every process seen
    before, while it lives), and, for a job postmortem started, every process carrying its token."""

    def __init__(self, roots: Iterable[int], token: str | None = None):
        self.roots, self.token = list(roots), token
        self.seen: dict[int, int] = {}  # pid -> start time: a reused pid is not ours

    def scan(self) -> dict[int, int]:
        """The job's live processes now (and remember them)."""
        stats = {}
        children: dict[int, list[int]] = {}
        for pid in all_pids():
            st = stat(pid)
            if st is None or st[1] in ("Z", "X"):
                continue
            stats[pid] = st
            children.setdefault(st[0], []).append(pid)
        found: set[int] = set()
        stack = [p for p in self.roots if p in stats] + [p for p in self.seen if p in stats]
        while stack:
            pid = stack.pop()
            if pid not in found and (pid not in self.seen or self.seen[pid] == stats[pid][2]):
                found.add(pid)
                stack += children.get(pid, [])
        if self.token:
            marker = f"{TOKEN_VARIABLE}={self.token}".encode()
            for pid in stats.keys() - found - {os.getpid()}:
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if marker in f.read():
                            found.add(pid)
                except OSError:
                    pass
        now = {pid: stats[pid][2] for pid in found}
        self.seen.update(now)
        return now

    def alive(self) -> dict[int, int]:
        return {pid: start for pid, start in {**self.seen, **self.scan()}.items() if alive(pid, start)}

    def signal(self, sig: int, pids: Mapping[int, int] | None = None) -> None:
        """Send ``sig`` to ``pids`` (pid -> start time; default: every live process of the job)."""
        for pid, start in (self.alive() if pids is None else pids).items():
            if alive(pid, start):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass

    def reap(self) -> None:
        """Collect the exit status of every job process that became our child (we are its subreaper)."""
        for pid in list(self.seen):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

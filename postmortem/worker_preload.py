"""What the parsing workers' server (``workers.worker_context``) imports and builds once, before it
forks a worker: what a worker runs (``parsing``, which imports no DuckDB, no engine), and what each
worker would otherwise build again in its first task: the Hyperscan databases of every trigger the
parsers declare (``scan.block_scanner``, 10 ms). Not ``pyarrow.compute`` (47 ms, at the start, where
the first task waits for the server), which Polars' pyarrow path imports and the parsers avoid
(``parsers.columns.series_of``).

A worker is a fork of the server: what the server built, it has, read-only, at no cost.
"""

from __future__ import annotations

import sys


def small_pages_only() -> bool:
    """This process, and the workers forked from it, fault their memory in 4 KiB pages, never in
    transparent huge pages (Linux's ``prctl(PR_SET_THP_DISABLE)``; elsewhere nothing). pyarrow's
    allocator (mimalloc) asks for huge pages on every arena it maps, so each first touch of a 2 MiB
    stretch zeroes all of it, however little of it a worker's buffers then use; a worker's memory is
    touched once (its freed memory stays with it: ``workers.WORKER_ENVIRONMENT``), and a huge page
    saves it nothing after (the 64-rank job warm: 2.79 vs 2.75 s), while fresh memory is what a job
    analyzed just after it was written costs most (on a VM whose host reclaims freed guest memory,
    after 25 s idle: 3.33 -> 2.91 s, 184 -> 2 huge-page faults, peak RSS 450 -> 427 MiB). True where set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) == 0  # (41: PR_SET_THP_DISABLE)
    except (OSError, AttributeError):  # (no C library to load, or one without prctl)
        return False


small_pages_only()

from . import parsing  # noqa: E402,F401  (what a worker runs: ``parsing.parse_in_worker``)
from .parsers import scan  # noqa: E402

scan.block_scanner()

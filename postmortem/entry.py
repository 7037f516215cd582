"""The ``postmortem`` command's entry point: for a big job, the parsing workers' server is started
first (``workers.start_early``), then the CLI (``cli``) is imported and run. Imports nothing heavy
itself: what the server imports, it imports while this process imports the same."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's OpenBLAS, loaded by what is imported here (pyarrow imports numpy), starts no threads
    of its own: this process does no linear algebra, and each such thread spins ~0.1 s of a core
    waiting for work once started (the 64-rank benchmark: 0.07-0.2 s of CPU the parsing workers
    lose). The variable is read once, as the library loads; it is then taken out again, so that what
    this process starts (a job under ``watch``, a replay) gets the user's environment. A value the
    user set stands."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


def main() -> None:
    from . import workers

    workers.start_early(sys.argv[1:])
    with one_blas_thread():
        from .cli import main as run_cli

    run_cli()

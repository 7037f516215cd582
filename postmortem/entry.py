"""The ``postmortem`` command's entry point: for a big job, the parsing workers' server is started
first (``workers.start_early``), then the CLI (``cli``) is imported and run. Imports nothing heavy
itself: what the server imports, it imports while this process imports the same."""

from __future__ import annotations

import gc
import sys


ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1"}


def main() -> None:
    # No cyclic garbage collection while the CLI imports: what an import makes (modules, classes,
    # functions) lives as long as the process, and the ~100 collections that traverse it find nothing
    # to free. Then it is frozen (kept out of every later collection), so that a full collection in
    # the analysis does not walk it again (the 64-rank job's command: one of 45-70 ms, and 20-25 ms
    # while importing).
    gc.disable()
    from . import workers

    workers.start_early(sys.argv[1:])
    if sys.argv[1:2] == ["analyze"]:
        workers.without_numpy()
    # numpy's OpenBLAS, loaded by what the CLI imports (pyarrow imports numpy), starts no threads of
    # its own: this process does no linear algebra, and each such thread spins ~0.1 s of a core
    # waiting for work once started (the 64-rank benchmark: 0.07-0.2 s of CPU the parsing workers
    # lose). The variable is read once, as the library loads; it is then taken out again, so that what
    # this process starts (a job under ``watch``, a replay) gets the user's environment.
    with workers.environment(ONE_BLAS_THREAD):
        from .cli import main as run_cli
    gc.freeze()
    gc.enable()

    run_cli()

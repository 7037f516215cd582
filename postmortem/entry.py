"""The ``postmortem`` command's entry point: for a big job, the parsing workers' server is started
first (``workers.start_early``), then the CLI (``cli``) is imported and run. Imports nothing heavy
itself: what the server imports, it imports while this process imports the same."""

from __future__ import annotations

import sys


def main() -> None:
    from . import workers

    workers.start_early(sys.argv[1:])
    from .cli import main as run_cli

    run_cli()

"""What the parsing workers' server (``workers.worker_context``) imports and builds once, before it
forks a worker: what a worker runs (``parsing``, which imports no DuckDB, no engine), and what each
worker would otherwise build again in its first task (~65 ms of a core each, against ~155 ms for the
task's three 16 MB logs after it):

- ``pyarrow.compute``, which Polars imports at a process's first conversion from Arrow (47 ms:
  it builds a Python function, with its docstring, for every Arrow kernel);
- the Hyperscan databases of every trigger the parsers declare (``scan.block_scanner``, 10 ms).

A worker is a fork of the server: what the server built, it has, read-only, at no cost.
"""

from __future__ import annotations

import pyarrow.compute  # noqa: F401

from . import parsing  # noqa: F401  (what a worker runs: ``parsing.parse_in_worker``)
from .parsers import scan

scan.block_scanner()

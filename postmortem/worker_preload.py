"""What the parsing workers' server (``workers.worker_context``) imports and builds once, before it
forks a worker: the parse pipeline and what a worker would otherwise build in its first task, each
worker again (~65 ms of a core each, against ~155 ms for the task's three 16 MB logs after it):

- ``pyarrow.compute``, which Polars imports at a process's first conversion from Arrow (47 ms:
  it builds a Python function, with its docstring, for every Arrow kernel);
- the Hyperscan databases of every trigger the parsers declare (``scan.block_scanner``, 10 ms).

A worker is a fork of the server: what the server built, it has, read-only, at no cost.
"""

from __future__ import annotations

import pyarrow.compute  # noqa: F401

from . import pipeline  # noqa: F401  (what a worker runs: ``pipeline._parse_in_worker``)
from .parsers import scan

scan.block_scanner()

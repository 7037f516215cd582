"""What the parsing workers' server (``workers.worker_context``) imports and builds once, before it
forks a worker: what a worker runs (``parsing``, which imports no DuckDB, no engine), and what each
worker would otherwise build again in its first task: the Hyperscan databases of every trigger the
parsers declare (``scan.block_scanner``, 10 ms). Not ``pyarrow.compute`` (47 ms, at the start, where
the first task waits for the server), which Polars' pyarrow path imports and the parsers avoid
(``parsers.columns.series_of``).

A worker is a fork of the server: what the server built, it has, read-only, at no cost.
"""

from __future__ import annotations

from . import parsing  # noqa: F401  (what a worker runs: ``parsing.parse_in_worker``)
from .parsers import scan

scan.block_scanner()

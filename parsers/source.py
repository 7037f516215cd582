"""What a parser is told about the file it reads (filled in by discovery)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Source:
    path: Path  # absolute path to open
    name: str  # path relative to the analyzed directory; what the tables store
    kind: str  # the sniffed kind (a parser module's KIND)
    rank: int | None = None  # rank the whole file speaks for, when discovery could tell
    bytes: int = 0
    compressed: bool = False  # a gzip stream (discovery opens every file: it knows)
    lines: int | None = None  # set by text parsers: lines read
    year: int = 1970  # glog lines carry no year: the run's year
    # Console lines (torchrun --tee) of these ranks are copies of their own per-rank files,
    # which are read too: skip them so no event is counted twice.
    tee_ranks_elsewhere: frozenset[int] = field(default_factory=frozenset)
    notes: list[str] = field(default_factory=list)  # problems met while parsing (-> files.error)

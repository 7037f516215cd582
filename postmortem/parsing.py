"""What a process does with its share of a job's files: parse each into its parser's frames.

``parse_files`` reads files one by one (big ones chunk by chunk), except those whose parser reads
a file on its own and builds frames of many (``batched``); the frames go to ``out`` (``Frames``:
the main process's ``store.Batcher``, or a worker's ``Collected``). ``parse_in_worker`` is what a
parsing worker runs (``pipeline`` hands it tasks): it imports neither DuckDB nor the engine, so
the workers' server, which imports it before forking them (``worker_preload``), is ready sooner.
A file's row (``files`` table) says how far its parse went; nothing in a file raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import polars as pl

from .parsers import BY_KIND
from .parsers.source import Source

log = logging.getLogger(__name__)


class Frames(Protocol):
    """Where parsed frames go, by table."""

    def add(self, table: str, df: pl.DataFrame) -> None: ...


def _file_row(source: Source) -> dict:
    return {"path": source.name, "kind": source.kind, "rank": source.rank, "bytes": source.bytes,
            "parser": BY_KIND[source.kind].__name__.rsplit(".", 1)[-1], "status": "parsed", "error": None}


def _guarded(row: dict, source: Source, work: Callable[[], object]) -> object:
    """``work()``, or None with the file marked partial: what is in a file never raises."""
    try:
        return work()
    except (OSError, EOFError, ValueError, UnicodeError) as exc:
        row["status"] = "partial"
        source.notes.append(f"stopped reading: {type(exc).__name__}: {exc}"[:500])
    except Exception as exc:  # a parser bug must cost one file, not the run
        log.exception("parser %s failed on %s", row["parser"], source.name)
        row["status"] = "partial"
        source.notes.append(f"parser error: {type(exc).__name__}: {exc}"[:500])
    return None


def _finish_row(row: dict, source: Source) -> dict:
    row["lines"] = source.lines
    if source.notes:
        row["error"] = "; ".join(source.notes)
    return row


def _parse_file(out: Frames, source: Source) -> dict:
    """Parse one file into ``out``; never raises for what is in the file."""
    row = _file_row(source)

    def work() -> None:
        for table, frame in BY_KIND[source.kind].parse(source):
            out.add(table, frame)

    _guarded(row, source, work)
    return _finish_row(row, source)


def batched(source: Source) -> bool:
    """Whether the file's parser reads it on its own (``read``) and builds frames of many files
    at once (``build``): all its files, or those it calls ``batchable``."""
    parser = BY_KIND[source.kind]
    return hasattr(parser, "build") and getattr(parser, "batchable", lambda _: True)(source)


def parse_files(out: Frames, sources: list[Source],
                before: Callable[[Source], None] | None = None) -> list[dict]:
    """Parse files one by one, except those whose parser reads a file on its own (``read``) and
    makes frames of many at once (``build``): a flight-recorder dump costs microseconds that way,
    and a small text log a fraction of the ~40 ms that frames of its own cost. ``before(source)``
    is called as each file is taken up."""
    rows: list[dict] = []
    batches: dict[str, list[tuple[dict, Source, object]]] = {}
    for source in sources:
        if before:
            before(source)
        parser = BY_KIND[source.kind]
        if not batched(source):
            rows.append(_parse_file(out, source))
            continue
        row = _file_row(source)
        got = _guarded(row, source, lambda: parser.read(source))  # noqa: B023 - called right here
        if got is None:
            rows.append(_finish_row(row, source))
            continue
        batch = batches.setdefault(source.kind, [])
        batch.append((row, source, got))
        # what was read waits in memory: a batch is bounded
        if len(batch) >= BUILD_FILES or sum(s.bytes for _, s, _ in batch) >= BUILD_BYTES:
            rows += _build(out, batches.pop(source.kind))
    for batch in batches.values():
        rows += _build(out, batch)
    return rows


def _build(out: Frames, batch: list[tuple[dict, Source, object]]) -> list[dict]:
    """The frames of a batch of files of one kind, read by its parser; the files' rows."""
    try:
        for table, frame in BY_KIND[batch[0][1].kind].build([got for _, _, got in batch]):
            out.add(table, frame)
    except Exception as exc:  # a parser bug: every file of the batch is short of its rows
        log.exception("parser %s failed building %d files", batch[0][0]["parser"], len(batch))
        for row, source, _ in batch:
            row["status"] = "partial"
            source.notes.append(f"parser error: {type(exc).__name__}: {exc}"[:500])
    return [_finish_row(row, source) for row, source, _ in batch]


BUILD_FILES = 256  # files read and waiting to be built together, at most, per kind
# ... and bytes: big files a parser builds with others (text logs under a chunk) are built several
# to a frame, whose fixed cost they share (~600 Polars calls, planned again for each frame): six 16 MB
# rank logs, not three (the 64-rank job's workers 3.52 -> 3.12 s of CPU, medians of eight runs
# interleaved; ~150 MiB more at a worker's peak); eight save no more, and the end waits on bigger tasks
BUILD_BYTES = 104 << 20


class Collected:
    """What one file's parse yields, kept to send back from a worker process."""

    def __init__(self):
        self.frames: dict[str, list[pl.DataFrame]] = {}

    def add(self, table: str, df: pl.DataFrame) -> None:
        if df.height:
            self.frames.setdefault(table, []).append(df)


def parse_in_worker(sources: list[Source]) -> tuple[list[dict], dict[str, pl.DataFrame]]:
    collected = Collected()
    rows = parse_files(collected, sources)
    return rows, {t: _as_dictionaries(pl.concat(fs, how="vertical_relaxed")) for t, fs in collected.frames.items()}


# The one set of categories every process's dictionaries name: frames of two workers then concatenate
# as they are (each value's code is remapped as a frame is unpickled), where two sets would not.
_CATEGORIES = "postmortem"
_DICTIONARY_MIN_ROWS = 256


def _as_dictionaries(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with each text column that holds few distinct values (a 16th of its rows at most) as a
    dictionary (Categorical), to travel to the main process: a compile record's attrs and reason repeat
    at every step of every rank (205k records holding 140 MB of text in 7 values for 64 ranks), and
    the text would be pickled, unpickled and copied into DuckDB a row at a time, where the codes are
    a few bytes each. DuckDB reads a dictionary into its text columns as the text."""
    if df.height < _DICTIONARY_MIN_ROWS:
        return df
    few = [name for name, dtype in df.schema.items()
           if dtype == pl.String and df[name].n_unique() * 16 <= df.height]
    return df.with_columns(pl.col(few).cast(pl.Categorical(pl.Categories(_CATEGORIES)))) if few else df

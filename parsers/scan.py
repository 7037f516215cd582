"""One scan of a block of log bytes for the triggers of every line parser, before any line is parsed.

A trigger is a set of literal strings that every line a parser (or one step of a parser) reads
must hold: a superset of its exact test, which stays the parser's own Polars regex. The scan
says which triggers occur anywhere in a block (Hyperscan, every pattern in one pass over the
bytes, each reported once: about 8 ms for a 16 MB rank log, against a few to 40 ms for each
Polars regex over its 100,000 lines); a parser or step whose trigger is absent is skipped
before any per-line work. ``Scanner.scan`` also reports where the literals of each per-line
trigger (one few lines hold) match, and ``holding`` turns that into the rows that hold one, so
a present trigger's exact regex runs on those rows alone; a trigger whose literals sit in most
lines of its format is only looked for, and ``matching`` narrows its regex with one literal
pass over the lines instead.

Why the superset holds, block bytes against a parsed line's ``text``: text is a line of the
block with its launcher prefix, a trailing CR and anything past ``MAX_LINE_CHARS`` removed,
invalid UTF-8 replaced by U+FFFD (which creates no other character); so a literal in text is
in the bytes. A caseless literal is matched as Polars' regex ``(?i)`` matches it, with Unicode
simple case folding: "s" also as "ſ" (U+017F) and "k" as the Kelvin sign (U+212A), the only
non-ASCII characters that fold to ASCII letters.

Where the ``hyperscan`` wheel cannot be imported every trigger counts as present: the parsers
then do what they did before the scan, only slower.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from .columns import contains_per_value

try:
    import hyperscan
except ImportError:  # no wheel for this platform: every trigger is taken as present
    hyperscan = None


@dataclass(frozen=True)
class Trigger:
    """Literals, any of which a line must hold to be read by the trigger's owner."""

    name: str
    literals: tuple[str, ...]
    caseless: bool = False
    # Whether the scan also says which lines hold a literal (``Scanner.scan``): worth it for a
    # trigger few lines hold; one whose literals sit in most lines of a format (every TORCH_LOGS
    # header names ``_dynamo/``) is only looked for, once per block.
    per_line: bool = True

    def regex(self) -> str:
        """The literals as a Polars (Rust) regex, with the same case folding as the parsers' own."""
        return ("(?i)" if self.caseless else "") + "|".join(re.escape(s) for s in self.literals)


# The non-ASCII characters whose simple case folding is an ASCII letter (Rust regex's (?i)).
_FOLDS_TO_ASCII = {"k": "\u212a", "s": "\u017f"}


def _byte_pattern(literal: str, caseless: bool) -> bytes:
    """A Hyperscan pattern over UTF-8 bytes matching ``literal`` as Polars' regex would."""
    out = []
    for ch in literal:
        if caseless and ch.lower() in _FOLDS_TO_ASCII:
            alt = re.escape(_FOLDS_TO_ASCII[ch.lower()].encode()).decode("latin-1")
            out.append(f"(?:[{ch.lower()}{ch.upper()}]|{alt})")
        elif ch.isascii():
            out.append(re.escape(ch))
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode()))
    return "".join(out).encode("latin-1")


@dataclass(frozen=True)
class Found:
    """What the scan of a block found: the triggers it holds, and for the per-line triggers the
    end offsets of their literals' matches (None: not recorded, the block held too many)."""

    present: frozenset[str]
    ends: dict[str, list[int]] | None


class Scanner:
    """Which of a fixed set of triggers occur in a block of bytes, and where the per-line ones do."""

    # (``scan``: the presence-only triggers found in a block's first 64 KiB are not looked for past it)
    HEAD_BYTES = 64 << 10

    def __init__(self, triggers: Iterable[Trigger]):
        triggers = tuple(triggers)
        self._db = self._lines_db = None
        # a database has one scratch space: two threads of one process (an API caller's) scan in turn
        self._lock = threading.Lock()
        self._patterns = [(t, lit) for t in triggers for lit in t.literals]
        self._owner = [t.name for t, _ in self._patterns]
        self._per_line = [t.per_line for t, _ in self._patterns]
        # (a literal's match spans at most 4 bytes a character: UTF-8's longest)
        self._overlap = 4 * max((len(lit) for _, lit in self._patterns), default=0)
        self._rest_dbs: dict[frozenset[str], object] = {}
        if hyperscan is not None and self._patterns:
            self._db = self._compile(range(len(self._patterns)), every_match=False)
            self._lines_db = self._rest_db(frozenset())

    def _compile(self, ids: Iterable[int], every_match: bool):
        """One database of the literals numbered ``ids`` (each keeps its number: ``_owner``'s index);
        ``every_match``: the per-line triggers' literals report each match (the others still once)."""
        ids = list(ids)
        patterns = [self._patterns[i] for i in ids]
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        flags = [(0 if every_match and t.per_line else hyperscan.HS_FLAG_SINGLEMATCH)
                 | (hyperscan.HS_FLAG_CASELESS if t.caseless else 0) for t, _ in patterns]
        db.compile(expressions=[_byte_pattern(lit, t.caseless) for t, lit in patterns],
                   ids=ids, elements=len(patterns), flags=flags)
        return db

    def _rest_db(self, skipped: frozenset[str]):
        """The per-line database less the literals of the triggers ``skipped`` (presence-only ones
        already found), compiled at its first use (~2 ms)."""
        db = self._rest_dbs.get(skipped)
        if db is None:
            kept = [i for i, (t, _) in enumerate(self._patterns) if t.name not in skipped]
            db = self._rest_dbs[skipped] = self._compile(kept, every_match=True)
        return db

    def present(self, data: bytes) -> frozenset[str] | None:
        """The names of the triggers ``data`` holds; None where there is no scanner (take all as present)."""
        if self._db is None:
            return None
        with self._lock:
            return self._present(data)

    def _present(self, data: bytes) -> frozenset[str]:
        found: set[str] = set()

        def seen(pattern: int, start: int, end: int, flags: int, context) -> None:
            found.add(self._owner[pattern])  # once per pattern: HS_FLAG_SINGLEMATCH

        self._db.scan(data, match_event_handler=seen)
        return frozenset(found)

    def scan(self, data: bytes) -> Found | None:
        """The triggers ``data`` holds and where the per-line ones match; None where there is no
        scanner. Matches are recorded up to about one per 400 bytes (a line of a typical log holds
        one at most): a block holding more is scanned again for presence alone, so that no block
        costs more than that many calls back.

        A presence-only trigger found in the block's head is not looked for in the rest: its
        literals often sit in most lines (every dynamo record's header names ``_dynamo/``), and
        Hyperscan confirms each of their matches even where it reports none (a 16 MB log of
        TORCH_LOGS records: 7.0-8.1 -> 5.4-5.8 ms)."""
        if self._lines_db is None:
            return None
        found: set[str] = set()
        ends: list[list[int]] = [[] for _ in self._owner]
        counted = itertools.count()
        cap = max(4096, len(data) // 400)
        owner, per_line = self._owner, self._per_line
        after = 0  # (the rest is scanned from a little before the head's end: a match ending in the head is the head's)

        def seen(pattern: int, start: int, end: int, flags: int, context) -> bool:
            if per_line[pattern]:
                if end > after:
                    ends[pattern].append(end + context)
                return next(counted) > cap  # True stops the scan
            found.add(owner[pattern])  # once a scan: HS_FLAG_SINGLEMATCH
            return False

        head = self.HEAD_BYTES if len(data) > 4 * self.HEAD_BYTES else len(data)
        view = memoryview(data)
        with self._lock:
            try:
                self._lines_db.scan(view[:head], match_event_handler=seen, context=0)
                if head < len(data):
                    rest = frozenset(found)
                    start = head - self._overlap
                    after = head - start
                    self._rest_db(rest).scan(view[start:], match_event_handler=seen, context=start)
            except hyperscan.ScanTerminated:
                return Found(self._present(data), None)
        by_trigger: dict[str, list[int]] = {}
        for pattern, pattern_ends in enumerate(ends):
            if pattern_ends:
                by_trigger.setdefault(owner[pattern], []).extend(pattern_ends)
        return Found(frozenset(found | by_trigger.keys()), by_trigger)


@functools.cache
def scanner(triggers: tuple[Trigger, ...]) -> Scanner:
    """The scanner of ``triggers``, compiled once per process (a few milliseconds)."""
    return Scanner(triggers)


# Every trigger some module reads by (``declare``): the one scan of a block looks for them all.
_DECLARED: dict[str, Trigger] = {}


def declare(*triggers: Trigger) -> None:
    """Add triggers to the block scan (at import: each module declares what it reads)."""
    for t in triggers:
        _DECLARED[t.name] = t


def block_scanner() -> Scanner:
    """The scanner of every declared trigger."""
    return scanner(tuple(_DECLARED.values()))


def is_present(present: frozenset[str] | None, name: str) -> bool:
    """Whether trigger ``name`` occurs in the block (always, where the block was not scanned)."""
    return present is None or name in present


def holding(df: pl.DataFrame, hits: dict[str, pl.Series] | None, trigger: Trigger) -> pl.Series | None:
    """Whether each row of ``df`` (rows of a frame of lines, by their ``pos`` in it) holds one of
    the trigger's literals, as the scan found: ``hits`` are the positions of such rows for each
    per-line trigger the scan found (``textlog``); None where it is not known."""
    if hits is None or not trigger.per_line:
        return None
    rows = hits.get(trigger.name)
    pos = df["pos"]
    if rows is not None and not (df.height and pos[0] == 0 and pos[-1] == df.height - 1):
        return pos.is_in(rows.implode())
    # A frame, or a head of one, holds the positions 0..height-1 in order (pos only rises): the hit
    # rows are set where they are, not looked up a row at a time (a hash probe of every row).
    none = pl.repeat(False, df.height, eager=True, dtype=pl.Boolean)
    return none if rows is None else none.scatter(rows.filter(rows < df.height), True)


def matching(text: pl.Series, trigger: Trigger, exact: str, candidates: pl.Series | None = None) -> pl.Series:
    """``text.str.contains(exact)``, with the exact regex run only on the rows that hold one of
    the trigger's literals (the others cannot match it): ``candidates`` where the scan says which
    they are, else one literal pass, then the few candidates."""
    if candidates is None:
        candidates = contains_per_value(text, trigger.regex())
    return contains_among(text, exact, candidates)


def contains_among(text: pl.Series, exact: str, candidates: pl.Series) -> pl.Series:
    """``text.str.contains(exact)`` where ``candidates`` (a Boolean mask), False elsewhere: the
    regex runs on the candidate rows alone, once a distinct value of them."""
    rows = candidates.arg_true()
    if rows.len() == 0:
        return candidates
    # (the candidates' text taken by the mask: a filter of string views, where a gather by their
    # positions costs ~15x: 28,000 lines of 200,000, 0.05 against 0.8 ms)
    return candidates.scatter(rows, contains_per_value(text.filter(candidates), exact))

"""One scan of a block of log bytes for the triggers of every line parser, before any line is parsed.

A trigger is a set of literal strings that every line a parser (or one step of a parser) reads
must hold: a superset of its exact test, which stays the parser's own Polars regex. The scan
says which triggers occur anywhere in a block (Hyperscan, every pattern in one pass over the
bytes, each reported once: about 8 ms for a 16 MB rank log, against a few to 40 ms for each
Polars regex over its 100,000 lines); a parser or step whose trigger is absent is skipped
before any per-line work, and ``candidates`` narrows a present one's exact regex to the lines
that hold a literal (one SIMD literal pass) instead of all of them.

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
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

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


class Scanner:
    """Which of a fixed set of triggers occur in a block of bytes."""

    def __init__(self, triggers: Iterable[Trigger]):
        self.names = tuple(dict.fromkeys(t.name for t in triggers))
        self._db = None
        # a database has one scratch space: two threads of one process (an API caller's) scan in turn
        self._lock = threading.Lock()
        patterns = [(t.name, lit, t.caseless) for t in triggers for lit in t.literals]
        if hyperscan is not None and patterns:
            self._owner = [name for name, _, _ in patterns]
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            flags = [hyperscan.HS_FLAG_SINGLEMATCH | (hyperscan.HS_FLAG_CASELESS if caseless else 0)
                     for _, _, caseless in patterns]
            db.compile(expressions=[_byte_pattern(lit, caseless) for _, lit, caseless in patterns],
                       ids=list(range(len(patterns))), elements=len(patterns), flags=flags)
            self._db = db

    def present(self, data: bytes) -> frozenset[str] | None:
        """The names of the triggers ``data`` holds; None where there is no scanner (take all as present)."""
        if self._db is None:
            return None
        found: set[str] = set()

        def seen(pattern: int, start: int, end: int, flags: int, context) -> None:
            found.add(self._owner[pattern])  # once per pattern: HS_FLAG_SINGLEMATCH

        with self._lock:
            self._db.scan(data, match_event_handler=seen)
        return frozenset(found)


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


def matching(text: pl.Series, trigger: Trigger, exact: str) -> pl.Series:
    """``text.str.contains(exact)``, with the exact regex run only on the rows that hold one of
    the trigger's literals (the others cannot match it): one literal pass, then the few candidates."""
    candidates = text.str.contains(trigger.regex())
    rows = candidates.arg_true()
    if rows.len() == 0:
        return candidates
    return candidates.scatter(rows, text.gather(rows).str.contains(exact))

"""Named Python checks for what a signature's SQL can't say.

A check is ``check(con, run_id) -> list[dict]``: evidence rows (rank, ts, file, line, text,
plus columns the signature's templates use). Checks read tables; they don't render.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from threading import Lock
from typing import TypeVar

T = TypeVar("T")
_SHARED: ContextVar[dict | None] = ContextVar("shared_results", default=None)
_DEFER: ContextVar[bool] = ContextVar("defer_when_busy", default=False)


class Busy(Exception):
    """A shared value (``once``) that another thread is computing, asked for where the caller
    said it would rather do other work meanwhile than wait (``defer_when_busy``)."""


def defer_when_busy() -> None:
    """From here on in this context, ``once`` raises Busy where another thread is computing the
    value asked for: the caller (``engine.match``) runs another signature meanwhile and this one
    again later, rather than leave its core idle while it waits (the 64-rank job: three checks ask
    for the collective alignment at once, ~40 ms of one of two threads)."""
    _DEFER.set(True)


@contextmanager
def shared_results() -> Iterator[None]:
    """Within this block (one matching of one run), what several checks derive alike from the
    run (the collective alignment: three checks, seconds on 512 ranks) is computed once, also by
    checks run on threads beside one another (each in a copy of this context: ``engine.match``)."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


class _Once:
    """A value computed by the first to ask; the others asking meanwhile wait for it (or, deferring
    their work: ``defer_when_busy``, are told it is Busy)."""

    def __init__(self) -> None:
        self.lock, self.done, self.value = Lock(), False, None

    def get(self, compute: Callable[[], T]) -> T:
        if self.done:  # (set once the value is: read without the lock, which only its computing holds long)
            return self.value
        if not self.lock.acquire(blocking=not _DEFER.get()):
            raise Busy
        try:
            if not self.done:
                self.value, self.done = compute(), True
            return self.value
        finally:
            self.lock.release()


_MEMO_LOCK = Lock()


def once(key: tuple, compute: Callable[[], T]) -> T:
    """``compute()``, or what it returned for ``key`` earlier in the same ``shared_results`` block
    (computed once however many threads ask at once; one that raised is computed again by the
    next to ask). Callers must not change what they get."""
    memo = _SHARED.get()
    if memo is None:
        return compute()
    with _MEMO_LOCK:
        entry = memo.setdefault(key, _Once())
    return entry.get(compute)

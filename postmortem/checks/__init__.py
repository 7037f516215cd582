"""Named Python checks for what a signature's SQL can't say.

A check is ``check(con, run_id) -> list[dict]``: evidence rows (rank, ts, file, line, text,
plus columns the signature's templates use). Checks read tables; they don't render.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")
_SHARED: ContextVar[dict | None] = ContextVar("shared_results", default=None)


@contextmanager
def shared_results() -> Iterator[None]:
    """Within this block (one matching of one run), what several checks derive alike from the
    run (the collective alignment: three checks, seconds on 512 ranks) is computed once."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def once(key: tuple, compute: Callable[[], T]) -> T:
    """``compute()``, or what it returned for ``key`` earlier in the same ``shared_results`` block.
    Callers must not change what they get."""
    memo = _SHARED.get()
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]

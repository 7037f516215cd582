"""Every thread parsing a frame of text lines keeps the regexes it uses compiled from frame to frame.

Polars compiles a regex pattern once per thread and keeps the last 32 a thread used
(polars-utils' ``RegexCache``: an LRU of capacity 32). Used in turn every frame, more than 32
on one thread are each compiled again every frame (~0.5 ms each): the line parsers together use
more, so each runs on a thread of its own (``textlog._on_its_thread``). This counts, per frame
and thread, the distinct patterns handed to Polars while every real-world log is parsed.
"""

from __future__ import annotations

import collections
import functools
import threading
from pathlib import Path

import polars as pl
from polars.expr.string import ExprStringNameSpace
from polars.series.string import StringNameSpace
from postmortem.parsers import textlog

from postmortem import discover

POLARS_REGEXES_KEPT_PER_THREAD = 32
_REGEX_METHODS = ("contains", "extract", "extract_groups", "replace", "replace_all", "extract_all", "count_matches",
                  "find")
TESTS = Path(__file__).resolve().parent


def _counting(method, used: dict[str, set[str]]):
    @functools.wraps(method)
    def counted(self, pattern, *args, **kwargs):
        if isinstance(pattern, str) and not kwargs.get("literal", False):
            used[threading.current_thread().name].add(pattern)
        return method(self, pattern, *args, **kwargs)
    return counted


def _clear_built_expressions() -> None:
    """Expressions the parsers build once per process (``functools.cache``): built again, so that
    their patterns are counted in every frame."""
    for module in (*textlog.LINE_PARSERS, textlog, textlog.scan):
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()
    from postmortem.parsers import lines
    lines.extract_groups.cache_clear()


def test_no_thread_parsing_a_frame_uses_more_regexes_than_polars_keeps_compiled(monkeypatch):
    used: dict[str, set[str]] = collections.defaultdict(set)
    for namespace in (ExprStringNameSpace, StringNameSpace):
        for name in _REGEX_METHODS:
            monkeypatch.setattr(namespace, name, _counting(getattr(namespace, name), used))
    worst: dict[str, tuple[int, str]] = {}
    frames = 0
    for source in discover.discover(TESTS / "realworld").sources:
        if source.kind != "text_log":
            continue
        _clear_built_expressions()
        used.clear()
        assert all(isinstance(table, str) and isinstance(df, pl.DataFrame)
                   for table, df in textlog.build([textlog.read(source)]))
        frames += 1
        for thread, patterns in used.items():
            worst[thread] = max(worst.get(thread, (0, "")), (len(patterns), source.name))
    assert frames > 100
    # (the patterns were counted: together the parsers use more than one thread keeps)
    assert sum(n for n, _ in worst.values()) > POLARS_REGEXES_KEPT_PER_THREAD, worst
    crowded = {thread: w for thread, w in worst.items() if w[0] > POLARS_REGEXES_KEPT_PER_THREAD}
    assert not crowded, crowded

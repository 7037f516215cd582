"""How a big job's files are cut into tasks for the parsing workers, and handed to them: every
file in exactly one task, the smallest tasks last (the main process parses those while the
workers' server starts), and a task the pool refuses is an error, never a file silently left out."""

from __future__ import annotations

import collections
from concurrent.futures import Future

import pytest

from postmortem import parsing, pipeline
from postmortem.discover import discover

from .conftest import sample_dir


def _sources(monkeypatch, sample: str = "hang_dataloader_console"):
    """A real job's sources, with the thresholds lowered so that it has big files, built ones and small ones."""
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 4 << 10)
    monkeypatch.setattr(parsing, "BUILD_BYTES", 16 << 10)
    monkeypatch.setattr(pipeline, "BATCH_FILES", 3)
    return discover(sample_dir(sample)).sources


def test_every_file_is_in_one_task_and_the_last_tasks_are_the_smallest(monkeypatch):
    sources = _sources(monkeypatch)
    tasks = pipeline._tasks(sources)
    assert sorted(s.name for task in tasks for s in task) == sorted(s.name for s in sources)
    sizes = [sum(s.bytes for s in task) for task in tasks]
    assert len(tasks) >= 4 and sizes == sorted(sizes, reverse=True)


def test_small_files_travel_in_batches_of_one_kind_as_few_as_the_limits_allow(monkeypatch):
    # (a parser builds a task's files of its kind as one frame: each frame has a fixed cost)
    sources = _sources(monkeypatch, "hang_dataloader_torch2141")  # (its small files' kinds alternate by size)
    small = [t for t in pipeline._tasks(sources) if all(s.bytes < pipeline.BATCH_BYTES for s in t)]
    kinds = collections.Counter(s.kind for s in sources if s.bytes < pipeline.BATCH_BYTES)
    assert len(kinds) >= 2 and all(len({s.kind for s in task}) == 1 for task in small)
    for kind, n in kinds.items():
        batches = [t for t in small if t[0].kind == kind]
        assert len(batches) == -(-n // pipeline.BATCH_FILES)  # (these files are far under BATCH_BYTES)


class _Pool:
    """A pool's submit as the submitter sees it: a future per task, or a refusal from the nth on."""

    def __init__(self, refuse_from: int | None = None):
        self.submitted, self.refuse_from = [], refuse_from

    def submit(self, fn, task):
        if self.refuse_from is not None and len(self.submitted) >= self.refuse_from:
            raise RuntimeError("cannot schedule new futures after shutdown")
        self.submitted.append(task)
        return Future()


def test_tasks_taken_back_and_tasks_handed_over_are_each_task_once(monkeypatch):
    tasks = pipeline._tasks(_sources(monkeypatch))
    queue, futures = collections.deque(tasks), {}
    pool = _Pool()
    submitter = pipeline._Submitter(pool, queue, futures)
    taken = []
    while (task := submitter.take_last()) is not None:
        taken.append(task)
    submitter.join()
    assert sorted(map(id, pool.submitted + taken)) == sorted(map(id, tasks))
    assert list(futures.values()) == pool.submitted and not queue


def test_a_task_the_pool_refuses_is_raised_where_the_submitter_is_joined(monkeypatch):
    tasks = pipeline._tasks(_sources(monkeypatch))
    submitter = pipeline._Submitter(_Pool(refuse_from=2), collections.deque(tasks), {})
    with pytest.raises(RuntimeError, match="cannot schedule"):
        submitter.join()

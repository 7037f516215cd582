"""Runs inside the user's job, not in postmortem: a torch.profiler window for `postmortem rerun --profile`.

The rerun puts a ``sitecustomize.py`` first on the job's PYTHONPATH that loads this file by
path (the job's Python need not have postmortem installed) and calls ``install``. Once the job
imports ``torch.optim.optimizer``, a global optimizer step hook counts steps: after
``POSTMORTEM_PROFILE_WINDOW``'s first number of steps the profiler starts, after its second it
stops and writes ``$POSTMORTEM_PROFILE_DIR/rank<RANK>.<pid>.pt.trace.json`` (Kineto JSON, one
``ProfilerStep#N`` per step). Nothing here may break the job: every failure is a warning on stderr.
Imports only the standard library until torch is already being imported by the job.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys

_TARGET = "torch.optim.optimizer"


def _warn(what: str) -> None:
    sys.stderr.write(f"postmortem rerun --profile: {what}\n")


def _chain(own_file: str) -> None:
    """Run the sitecustomize ours shadows, if there is one further down sys.path."""
    own_dir = os.path.dirname(os.path.abspath(own_file))
    for entry in sys.path:
        directory = os.path.abspath(entry or ".")
        candidate = os.path.join(directory, "sitecustomize.py")
        if directory != own_dir and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001 - the user's own sitecustomize failed, as it would have
                _warn(f"{candidate} raised {exc!r}")
            return


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once the module ``name`` has been executed."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_then(module):
            run(module)
            self.then()

        spec.loader.exec_module = exec_then
        return spec


class _Window:
    def __init__(self, out_dir: str, wait: int, active: int):
        self.out_dir, self.wait, self.active = out_dir, wait, active
        self.steps = 0
        self.prof = None
        self.done = False

    def hook(self, optimizer, args, kwargs) -> None:
        if self.done:
            return
        try:
            self.steps += 1
            if self.prof is None and self.steps == self.wait:
                self._start()
            elif self.prof is not None:
                if self.steps >= self.wait + self.active:
                    self.finish()
                else:
                    self.prof.step()
        except Exception as exc:  # noqa: BLE001 - never break the user's step
            self.done = True
            _warn(f"profiler window abandoned: {exc!r}")

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(activities=activities, record_shapes=True, profile_memory=True)
        self.prof.start()
        self.prof.step()

    def finish(self) -> None:
        if self.prof is None or self.done:
            return
        self.done = True
        prof, self.prof = self.prof, None
        prof.stop()
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"rank{os.environ.get('RANK', '0')}.{os.getpid()}.pt.trace.json")
        prof.export_chrome_trace(path)


def _arm(window: _Window) -> None:
    try:
        optimizer = sys.modules[_TARGET]
        optimizer.register_optimizer_step_post_hook(window.hook)
        atexit.register(window.finish)  # a job shorter than the window still leaves what it recorded
    except Exception as exc:  # noqa: BLE001
        _warn(f"cannot hook optimizer steps: {exc!r}")


def install(own_file: str) -> None:
    _chain(own_file)
    out_dir = os.environ.get("POSTMORTEM_PROFILE_DIR")
    if not out_dir:
        return
    try:
        wait, active = (max(int(n), 1) for n in os.environ.get("POSTMORTEM_PROFILE_WINDOW", "2,3").split(","))
    except ValueError:
        wait, active = 2, 3
    window = _Window(out_dir, wait, active)
    if _TARGET in sys.modules:
        _arm(window)
    else:
        sys.meta_path.insert(0, _AfterImport(_TARGET, lambda: _arm(window)))

"""Run DIR-LAB's simulator (from the RL backfilling paper) on a trace: FCFS + EASY, timed.

Its scheduling loop lives in `rlbackfill.py` of https://github.com/DIR-LAB/RLBackfilling,
next to the RL training code, which imports PyTorch, Gym, mpi4py and SciPy at module
level. The FCFS + EASY loop uses none of them, so those that are not installed are
stood in for by empty modules while the file loads; nothing of theirs is copied here.

The run is what their test script does with `--dryrun`: `reset_for_test` with the
whole trace as one batch, then `easyback_schedule_curr_sequence(fcfs_score)`.
Their loader reads an uncompressed SWF file and keeps the jobs with a positive
runtime after turning runtime -1 into 10 s, so its job count differs from ours.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.abc
import importlib.machinery
import importlib.util
import io
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

STOOD_IN = ("torch", "gym", "mpi4py", "scipy", "joblib")
"""Packages their module imports for RL training only."""


class _Inert(type):
    """Classes that take any arguments, do nothing, and have any attribute (another such class):
    they serve as a base class, a callable and a namespace alike."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(name)


def _inert(name: str) -> type:
    return _Inert(name, (), {"__init__": lambda self, *args, **kwargs: None})


class _Anything(types.ModuleType):
    """A module whose every attribute is an `_Inert` class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        inert = _inert(name)
        setattr(self, name, inert)
        return inert


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the packages in `STOOD_IN` that are not installed give `_Anything` modules."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top not in STOOD_IN or any(f.find_spec(top, None) for f in sys.meta_path if f is not self):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Anything(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def load(peer: Path) -> types.ModuleType:
    """Their `rlbackfill.py` from a checkout of DIR-LAB/RLBackfilling, as a module."""
    source = peer / "rlbackfill.py"
    if not source.is_file():
        raise SystemExit(f"--peer {peer}: no rlbackfill.py there (a checkout of DIR-LAB/RLBackfilling is expected)")
    finder = _StandIns()
    sys.meta_path.insert(0, finder)
    try:
        spec = importlib.util.spec_from_file_location("dirlab_rlbackfill", source)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.meta_path.remove(finder)
    return module


def prepare(peer: Path, trace: Path) -> Any:
    """Their simulator with `trace` loaded (their `HPCEnv`, as their test script makes it)."""
    module = load(peer)
    with tempfile.TemporaryDirectory() as folder:
        plain = Path(folder) / trace.name.removesuffix(".gz")
        with gzip.open(trace, "rb") if trace.suffix == ".gz" else open(trace, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        with contextlib.redirect_stdout(io.StringIO()):  # their loader prints as it goes
            env = module.HPCEnv(dryrun=True)
            env.my_init(workload_file=str(plain))
    return env


def schedule(env: Any, repeat: int) -> float:
    """Seconds of their FCFS + EASY loop over the whole trace, the best of `repeat` runs."""
    best = float("inf")
    for _ in range(repeat):
        env.reset_for_test(0)  # with dryrun: the whole trace, from its first job
        started = time.perf_counter()
        env.easyback_schedule_curr_sequence(env.fcfs_score)
        best = min(best, time.perf_counter() - started)
    return best

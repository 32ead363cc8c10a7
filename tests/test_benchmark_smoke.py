"""The benchmarks that need no engine run, on a small scale: none is run by the tests otherwise, and
`benchmarks/daemon.py`'s pass row had stopped running (a changed `plan.record`) with no test to say so.
Nothing here is timed: the speed goals are the benchmarks' own, on their full scale."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_daemon_pass_benchmark_runs() -> None:
    row = _load("daemon").bench_pass(queued=40, nodes=8, cores=4, passes=5)
    assert row["goal"].startswith("pass:") and "median" in row["measured"]
    assert "queued, 8 nodes x 4 cores, EASY + ASAx, 5 passes" in row["setting"]

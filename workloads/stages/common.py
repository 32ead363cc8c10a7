"""What every stage needs: parameters, progress reporting, a worker pool, clear failures.

Why these helpers: a stage is judged by the daemon through three channels only,
its exit status, its log tail and its progress file, so failures must be one
readable line on stderr and progress must be written atomically (the daemon
reads the file through /proc at any moment and must never see half a number).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
Params = dict[str, float]


class StageError(Exception):
    """A stage cannot do its work (missing input, a tool failed): one line, exit status 1."""


class Progress:
    """Tasks done / total, written to $COSCHED_PROGRESS (the daemon's happiness input)."""

    def __init__(self, total: int, path: str | None = None) -> None:
        self.total = max(1, int(total))
        self.done = 0
        self.path = path if path is not None else os.environ.get("COSCHED_PROGRESS")
        self._write()

    def advance(self, count: int = 1) -> None:
        self.done = min(self.total, self.done + count)
        self._write()

    def _write(self) -> None:
        if not self.path:
            return
        temporary = f"{self.path}.tmp"
        with open(temporary, "w") as handle:
            handle.write(f"{self.done}/{self.total}\n")
        os.replace(temporary, self.path)


def workers() -> int:
    """Cores this stage may use: the daemon's allocation (COSCHED_CORES), else the CPU set."""
    try:
        return max(1, int(os.environ["COSCHED_CORES"]))
    except (KeyError, ValueError):
        return max(1, len(os.sched_getaffinity(0)))


def require(*paths: Path) -> None:
    """Fail with one line naming the first input that is not there."""
    for path in paths:
        if not path.exists():
            raise StageError(f"missing input {path} (did the previous stage run?)")


def run_tool(args: Sequence[str | Path | int], cwd: Path | None = None) -> str:
    """Run one external tool (Montage, BLAST); a failure is a StageError with its message."""
    command = [str(a) for a in args]
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise StageError(f"{command[0]}: not installed in this image") from None
    output = (done.stdout + done.stderr).strip()
    # Montage reports failures as [struct stat="ERROR", msg="..."] with exit status 0 or 1.
    if done.returncode != 0 or 'stat="ERROR"' in output:
        last = output.splitlines()[-1] if output else f"exit status {done.returncode}"
        raise StageError(f"{command[0]} failed: {last}")
    return output


def parallel_map(
    function: Callable[..., T],
    items: Iterable[Any],
    progress: Progress,
    *,
    processes: bool = False,
) -> list[T]:
    """Apply `function` to every item on `workers()` workers, advancing progress per task.

    Threads suit tasks that run an external tool (the GIL is released while it
    runs); `processes=True` suits NumPy work in Python. Results keep the items' order.
    """
    items = list(items)
    pool: Executor = ProcessPoolExecutor(workers()) if processes else ThreadPoolExecutor(workers())
    results: dict[int, T] = {}
    with pool:
        futures = {pool.submit(function, item): index for index, item in enumerate(items)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            progress.advance()
    return [results[i] for i in range(len(items))]


def fail(message: str, status: int = 1) -> None:
    print(f"stage error: {message}", file=sys.stderr)
    raise SystemExit(status)

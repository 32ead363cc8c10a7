"""The engine calls of one step, made side by side on a bounded pool.

Why: Docker takes a few hundred milliseconds to create and start a container
and does much of it in parallel. Made one after another, a pass that started
16 jobs took seconds, while the core already counted them running (issue 15).
Why bounded: an engine asked for hundreds of containers at once answers every
one of them late, and the client's connection pool holds 10 connections.
Every call's outcome comes back, failures included, so that a step records what
did succeed before `raise_failures` raises what failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cosched.daemon.docker_backend import EngineUnavailable


class EngineCalls:
    """`each(call, arguments)`: every call's result or exception, in order, once all have finished."""

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cosched-engine")

    def each(self, call: Callable[..., Any], arguments: Sequence[tuple[Any, ...]]) -> list[Any]:
        """A one-call step runs in the caller's thread: no hop where there is nothing to overlap."""
        if len(arguments) <= 1:
            return [_outcome(call, args) for args in arguments]
        futures = [self._pool.submit(_outcome, call, args) for args in arguments]
        return [future.result() for future in futures]

    def submit(self, call: Callable[..., Any], arguments: Sequence[tuple[Any, ...]]) -> list[Future[Any]]:
        """Every call started on the pool; each future's result is the call's result or exception.
        For calls the caller may stop waiting for (a launch waiting for Mesos offers)."""
        return [self._pool.submit(_outcome, call, args) for args in arguments]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _outcome(call: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        return call(*args)
    except Exception as exc:  # handed back: the caller decides per call what a failure means
        return exc


def raise_failures(outcomes: list[Any], tolerated: tuple[type[Exception], ...] = ()) -> None:
    """A step's first engine loss, else its first failure not `tolerated`, raised once every call
    has been looked at (so what did succeed is recorded first)."""
    for outcome in outcomes:
        if isinstance(outcome, EngineUnavailable):
            raise outcome
    for outcome in outcomes:
        if isinstance(outcome, Exception) and not isinstance(outcome, tolerated):
            raise outcome

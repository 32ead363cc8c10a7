"""Runtime estimators: what backfilling believes a job will take."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from cosched.model import Job
from cosched.policies.base import Estimator


class Requested(Estimator):
    """The user's requested walltime: what production EASY uses ("EASY")."""

    name = "requested"

    def estimate(self, job: Job) -> float:
        return job.walltime


class Actual(Estimator):
    """The actual runtime, a perfect predictor ("EASY-AR"); replay only.

    A job carries no runtime while it waits, so this oracle reads the truth replay
    binds to it (`bind_truth`); live jobs have none and fall back to the walltime.
    """

    name = "actual"

    def __init__(self) -> None:
        self._truth: Mapping[int, float | None] = MappingProxyType({})

    def bind_truth(self, truth: Mapping[int, float | None]) -> None:
        self._truth = truth

    def estimate(self, job: Job) -> float:
        runtime = self._truth.get(job.id, job.runtime)
        return runtime if runtime is not None else job.walltime

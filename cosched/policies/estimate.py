"""Runtime estimators: what backfilling believes a job will take."""

from __future__ import annotations

from cosched.model import Job
from cosched.policies.base import Estimator


class Requested(Estimator):
    """The user's requested walltime: what production EASY uses ("EASY")."""

    name = "requested"

    def estimate(self, job: Job) -> float:
        return job.walltime


class Actual(Estimator):
    """The actual runtime, a perfect predictor ("EASY-AR"); replay only.

    Live jobs have no runtime yet, so they fall back to the walltime.
    """

    name = "actual"

    def estimate(self, job: Job) -> float:
        return job.runtime if job.runtime is not None else job.walltime

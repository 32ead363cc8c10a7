"""The replay's rate model for workflow stages: `cosched.workflows.interference` behind `RateModel`.

A job whose `stage` has a profile progresses as the interference model says
for its quota and its neighbour on the same cores; any other job is treated as
CPU-bound, which is the cautious assumption for a job nothing is known about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cosched.model import Job
from cosched.replay.backend import CpuBound
from cosched.workflows.interference import (
    InterferenceParams,
    StageProfile,
    shipped_params,
    shipped_profiles,
    speed,
    usage,
)

MIN_SPEED = 1e-6
"""A floor so that a starved job still ends in finite (if absurd) time."""


class StageRates:
    """Rates and usage of workflow stages from their profiles."""

    def __init__(
        self,
        profiles: Mapping[str, StageProfile] | None = None,
        params: InterferenceParams | None = None,
    ) -> None:
        self.profiles = dict(profiles) if profiles is not None else shipped_profiles()
        self.params = params or shipped_params()
        self._fallback = CpuBound()

    def speed(self, job: Job, quota: float, neighbours: Sequence[tuple[Job, float]]) -> float:
        profile = self.profiles.get(job.stage or "")
        if profile is None:
            return self._fallback.speed(job, quota, neighbours)
        # With more than one neighbour (sharing > 2), the busiest one stands for them all.
        other, other_quota = max(neighbours, key=lambda n: n[1], default=(None, 0.0))
        other_profile = self.profiles.get(other.stage or "") if other is not None else None
        rate = speed(profile, job.cores, quota, other_profile, other_quota, params=self.params)
        return max(MIN_SPEED, rate)

    def usage(self, job: Job, quota: float, speed_now: float) -> tuple[float, float]:
        profile = self.profiles.get(job.stage or "")
        if profile is None:
            return self._fallback.usage(job, quota, speed_now)
        return usage(profile, job.cores, quota, min(1.0, speed_now))

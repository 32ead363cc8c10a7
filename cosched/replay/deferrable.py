"""Deferrable jobs in replay: giving a workload start windows, and what OSDEC measures of them.

Why its own module: SWF has no field for a start window, so a study decides which jobs are
deferrable and how wide their windows are (`Windows`, seeded), and the paper's measures are
about those jobs alone (`measure`): how much of the capacity they fill (its r_i = c_i d_i),
how long each waited past its earliest start (p_i = t_i - e_i), which expired unstarted,
and its reward (eq. 6) over the jobs started.

The violation term of eq. 6 (w2 v_t, capacity used beyond what is available) is dropped:
the core never oversubscribes, so v_t is 0 for every policy. What a policy that cannot fit
a job pays instead is that job's expiry, reported beside the reward, not folded into it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from cosched.errors import ConfigError
from cosched.model import Job, JobState
from cosched.replay.driver import ReplayResult

HOUR = 3600.0
W1 = 2.0
"""OSDEC's time delay penalty coefficient w1 (its Table 3)."""


@dataclass(frozen=True, slots=True)
class Windows:
    """Which jobs of a workload are deferrable, and their windows.

    A `fraction` of the jobs, drawn with `seed`, gets a begin `lead` seconds after its
    submission (drawn from U[lead]: OSDEC's requests are collected before they are valid,
    g_i <= e_i) and a latest start `width` seconds after its begin (U[width]). The others
    stay ordinary (on-demand) jobs, eligible at once and never expiring.
    """

    fraction: float
    width: tuple[float, float] = (3600.0, 4 * 3600.0)
    lead: tuple[float, float] = (0.0, 0.0)
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ConfigError(f"deferrable fraction must be in [0, 1], got {self.fraction}")
        for name, (low, high) in (("width", self.width), ("lead", self.lead)):
            if not 0.0 <= low <= high < math.inf:
                raise ConfigError(f"window {name} must be 0 <= low <= high, got [{low}, {high}]")

    def apply(self, jobs: Sequence[Job]) -> list[Job]:
        """Fresh copies of `jobs`, a drawn fraction of them with start windows."""
        rng = np.random.default_rng(self.seed)
        chosen = rng.random(len(jobs)) < self.fraction
        leads = rng.uniform(*self.lead, size=len(jobs))
        widths = rng.uniform(*self.width, size=len(jobs))
        out = []
        for job, deferrable, lead, width in zip(jobs, chosen, leads, widths, strict=True):
            if deferrable:
                begin = job.submit + float(lead)
                out.append(replace(job, begin=begin, latest_start=begin + float(width)))
            else:
                out.append(replace(job))
        return out


@dataclass(frozen=True, slots=True)
class DeferrableSummary:
    """OSDEC's measures of one replay, over its deferrable jobs (hours, core-hours)."""

    jobs: int
    """Deferrable jobs submitted."""
    started: int
    expired: int
    utilization: float
    """Core-hours the started deferrable jobs ran (sum of r_i = c_i d_i)."""
    delay_sum: float
    """Sum of p_i = t_i - e_i over the started ones, in hours."""
    delay_mean: float
    delay_p95: float
    reward: float
    """Eq. 6 summed over the replay: utilization - w1 * delay_sum (no violation term)."""
    cluster_utilization: float
    """Busy core-seconds of every job over capacity x the span from first submission to last end."""
    ordinary_wait: float
    """Mean wait of the ordinary (on-demand) jobs, in hours: what the deferrable ones cost them."""

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


def measure(result: ReplayResult, w1: float = W1) -> DeferrableSummary:
    """OSDEC's measures of `result`: its started and expired deferrable jobs, and the cluster."""
    ran = [job for job in result.jobs if job.state is not JobState.CANCELLED]
    started = [job for job in ran if job.deferrable]
    expired = [job for job in result.rejected if job.deferrable and job.state is JobState.FAILED]
    ordinary = [job for job in ran if not job.deferrable]
    revenue = sum(job.cores * (job.end - job.start) for job in started) / HOUR
    delays = np.array([job.start - job.eligible for job in started]) / HOUR
    delay_sum = float(delays.sum()) if delays.size else 0.0
    busy = sum(job.cores * (job.end - job.start) for job in ran)
    everyone = ran + list(result.rejected)
    span = max((job.end for job in ran), default=0.0) - min((job.submit for job in everyone), default=0.0)
    capacity = result.cluster.cores * span
    return DeferrableSummary(
        jobs=len(started) + len(expired),
        started=len(started),
        expired=len(expired),
        utilization=revenue,
        delay_sum=delay_sum,
        delay_mean=float(delays.mean()) if delays.size else 0.0,
        delay_p95=float(np.percentile(delays, 95)) if delays.size else 0.0,
        reward=revenue - w1 * delay_sum,
        cluster_utilization=busy / capacity if capacity > 0 else 0.0,
        ordinary_wait=float(np.mean([job.wait for job in ordinary])) / HOUR if ordinary else 0.0,
    )

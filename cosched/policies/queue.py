"""Queue policies: the priority functions HPC scheduling research compares against.

Scores follow Table 3 of the RL backfilling paper (lower runs first):
r = requested walltime, n = requested cores, w = time waited, s = submit time.
"""

from __future__ import annotations

import math
from typing import Any

from cosched.model import Job
from cosched.policies.base import AgingPolicy, QueuePolicy


class FCFS(QueuePolicy):
    """First come, first served: score s."""

    name = "fcfs"

    def score(self, job: Job, now: float) -> float:
        return job.submit


class LCFS(QueuePolicy):
    """Last come, first served: score -s (jobs submitted together keep arrival order)."""

    name = "lcfs"

    def score(self, job: Job, now: float) -> float:
        return -job.submit


class SJF(QueuePolicy):
    """Shortest (requested) job first: score r."""

    name = "sjf"

    def score(self, job: Job, now: float) -> float:
        return job.walltime


class SmallestFirst(QueuePolicy):
    """Fewest cores first: score n."""

    name = "smallest"

    def score(self, job: Job, now: float) -> float:
        return job.cores


class LargestFirst(QueuePolicy):
    """Most cores first: score -n."""

    name = "largest"

    def score(self, job: Job, now: float) -> float:
        return -job.cores


class WFP3(AgingPolicy):
    """Tang et al. (2009): score -(w/r)^3 * n, favouring long waits, short and small jobs."""

    name = "wfp3"

    def weight(self, job: Job) -> float:
        return -job.cores / job.walltime**3

    def growth(self, waited: Any) -> Any:
        return waited * waited * waited


class UNICEF(AgingPolicy):
    """Largest w / (log2(n) * r) first.

    log2(1) = 0 would make every serial job infinitely urgent, so single-core
    jobs count as two cores here.
    """

    name = "unicef"

    def weight(self, job: Job) -> float:
        return -1.0 / (math.log2(max(job.cores, 2)) * job.walltime)

    def growth(self, waited: Any) -> Any:
        return waited


class F1(QueuePolicy):
    """Carastan-Santos and de Camargo (2017): score log10(r) * n + 870 * log10(s).

    It reads absolute submit times, so replays keep the trace's own clock
    (samples are not rebased to zero); s < 1 counts as 1.
    """

    name = "f1"

    def score(self, job: Job, now: float) -> float:
        return math.log10(job.walltime) * job.cores + 870.0 * math.log10(max(job.submit, 1.0))

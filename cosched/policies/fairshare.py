"""Fair-share: Slurm's multifactor priority with its classic fair-share factor.

A shared cluster's first complaint is not the mean wait but one user's: whoever submits
most takes the machine. Slurm's answer, which most sites run, orders the queue by

    priority = age_weight * A + fairshare_weight * F + size_weight * S

- A: the time a job has been eligible over `max_age`, at most 1 (PriorityMaxAge).
- F = 2^(-U / N): U is the user's share of the cluster's usage, N the number of users, so
  each user's fair share is 1/N (equal shares). A user who used nothing has F = 1; one who
  used exactly their share, 1/2.
- S: the job's cores over the cluster's (PriorityFavorSmall=NO).
- Usage is CPU-seconds of quota decayed with `half_life` (PriorityDecayHalfLife): a run a week
  ago weighs half of one now. A running job counts what it had so far. Without co-scheduling a
  job's quota is its cores, as Slurm's core-seconds; with it, a lent core is charged to the
  guest it was lent to for as long as it was, not to both jobs.

As Slurm's `PriorityCalcPeriod`, the factors are recomputed every `period` seconds of the
scheduler's clock, not at every pass; ages are exact at each pass. Defaults are Slurm's
(7-day half-life and maximum age), with the weights sites commonly set (age 1000,
fair-share 10000, size 0). Options: `fairshare:half_life=86400,period=60`.

Usage is told by the core at the end of each run and at each lending that changes a quota
(`QueuePolicy.ran`), requeued runs included; a daemon restart replays the ended jobs and quota
changes of its state file (`history`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import ClassVar

from cosched.core.view import SchedulerView
from cosched.errors import ConfigError
from cosched.model import Job, JobState
from cosched.policies.base import QueuePolicy
from cosched.policies.options import parse_options

WEEK = 7 * 86400.0
FORGOTTEN_HALF_LIVES = 10
"""After this many half-lives a run weighs under 1/1000 of one now: a restart replays no older."""
_REBASE = 60.0
"""Half-lives past the reference time at which the ledger's scaled sums are brought back to it."""


class DecayedUsage:
    """Each user's core-seconds, decayed by half every `half_life` seconds.

    Why scaled sums: decaying every user's usage at every step costs a pass per user. A
    core-second at time s is stored as 2^((s - ref) / half_life), so a run adds one integral
    and reading at `now` is one multiplication; `ref` moves forward before the exponent
    overflows.
    """

    def __init__(self, half_life: float) -> None:
        if not 0 < half_life < math.inf:
            raise ConfigError(f"fair-share half_life must be a positive number of seconds, got {half_life}")
        self.half_life = half_life
        self.ref: float | None = None
        self.scaled: dict[int, float] = defaultdict(float)

    def _integral(self, cores: float, start: float, end: float, ref: float) -> float:
        """cores * integral of 2^((s - ref) / half_life) ds over [start, end]: a run's core-seconds
        as worth at `ref`."""
        h = self.half_life
        return cores * h / math.log(2) * (2.0 ** ((end - ref) / h) - 2.0 ** ((start - ref) / h))

    def add(self, user: int, cores: float, start: float, end: float) -> None:
        """A run of `cores` from `start` to `end` (any order of runs: a restart replays old ones)."""
        if end <= start or cores <= 0:
            return
        if self.ref is None:
            self.ref = end
        elif (end - self.ref) / self.half_life > _REBASE:
            self._rebase(end)
        self.scaled[user] += self._integral(cores, start, end, self.ref)

    def _rebase(self, ref: float) -> None:
        assert self.ref is not None
        factor = 2.0 ** ((self.ref - ref) / self.half_life)
        for user in self.scaled:
            self.scaled[user] *= factor
        self.ref = ref

    def at(self, now: float) -> dict[int, float]:
        """Every user's decayed usage at `now`, in core-seconds."""
        if self.ref is None:
            return {}
        factor = 2.0 ** ((self.ref - now) / self.half_life)
        scaled = dict(self.scaled)  # one step under the GIL: the daemon's queue view reads it beside a pass
        return {user: value * factor for user, value in scaled.items()}

    def running(self, cores: float, start: float, now: float) -> float:
        """What a run still going since `start` used by `now`, decayed to `now`, in core-seconds."""
        if now <= start or cores <= 0:
            return 0.0
        return self._integral(cores, start, now, now)


def fairshare_factors(usage: dict[int, float]) -> dict[int, float]:
    """F = 2^(-U/N) for each user of `usage` (decayed core-seconds, zero for users with none)."""
    total = sum(usage.values())
    count = len(usage)
    if total <= 0:
        return dict.fromkeys(usage, 1.0)
    return {user: 2.0 ** (-count * used / total) for user, used in usage.items()}


class FairShare(QueuePolicy):
    """Highest multifactor priority first: age, the user's fair-share factor, size."""

    name = "fairshare"
    static = False
    OPTIONS: ClassVar[dict[str, type]] = {
        "half_life": float,
        "max_age": float,
        "age": float,
        "fairshare": float,
        "size": float,
        "period": float,
    }

    def __init__(
        self,
        argument: str | None = None,
        *,
        half_life: float = WEEK,
        max_age: float = WEEK,
        age: float = 1000.0,
        fairshare: float = 10000.0,
        size: float = 0.0,
        period: float = 300.0,
    ) -> None:
        given = parse_options(argument, self.OPTIONS, "half_life")
        values: dict[str, float] = {
            "half_life": half_life,
            "max_age": max_age,
            "age": age,
            "fairshare": fairshare,
            "size": size,
            "period": period,
        }
        values.update(given)  # type: ignore[arg-type]
        for key, value in values.items():
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{self.name}: option {key} must be a finite number >= 0, got {value}")
        if values["max_age"] <= 0:
            raise ConfigError(f"{self.name}: option max_age must be > 0, got {values['max_age']}")
        self.usage = DecayedUsage(values["half_life"])
        self.max_age = values["max_age"]
        self.age_weight, self.fairshare_weight, self.size_weight = values["age"], values["fairshare"], values["size"]
        self.period = values["period"]
        self.history = FORGOTTEN_HALF_LIVES * values["half_life"]
        self.factors: dict[int, float] = {}
        """Each user's fair-share factor at the last recomputation (a user absent has used nothing)."""
        self._next_calc = -math.inf
        self._capacity = 1

    def ran(self, job: Job, start: float, end: float, cpus: float) -> None:
        self.usage.add(job.user, cpus, start, end)

    def used(self, view: SchedulerView) -> dict[int, float]:
        """Each user's decayed core-seconds at `view.now`: ended runs, and running jobs' use so
        far. Every user with a job in the scheduler or usage left is there (N counts them)."""
        now = view.now
        used = {user: value for user, value in self.usage.at(now).items() if value > 0}
        for job in view.jobs.values():
            if job.state is JobState.RUNNING:
                used[job.user] = used.get(job.user, 0.0) + self.usage.running(job.quota, job.quota_since, now)
            else:
                used.setdefault(job.user, 0.0)
        return used

    def recompute(self, view: SchedulerView) -> None:
        """The factors at `view.now` (Slurm's PriorityCalcPeriod tick)."""
        self.factors = fairshare_factors(self.used(view))
        self._next_calc = view.now + self.period
        self._capacity = max(view.capacity_units, 1)

    def priority(self, job: Job, now: float) -> float:
        """Slurm's weighted sum (higher runs first)."""
        age = min(max(now - job.eligible, 0.0) / self.max_age, 1.0)
        size = job.need / self._capacity
        return self.age_weight * age + self.fairshare_weight * self.factors.get(job.user, 1.0) + self.size_weight * size

    def score(self, job: Job, now: float) -> float:
        return -self.priority(job, now)

    def order(self, queue: Sequence[Job], view: SchedulerView) -> Sequence[Job]:
        if view.now >= self._next_calc:
            self.recompute(view)
        return super().order(queue, view)

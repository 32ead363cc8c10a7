"""Conservative backfilling: a reservation for every queued job.

Every pending job holds a reservation in a free-capacity profile built from
the running jobs' expected ends. A job starts now only when its reservation
is now, so no start can land on anyone's reserved capacity.

Reservations persist between passes. When capacity differs from what the last
plan expected (a job ended early, resources came or went, a job was cancelled),
they are recomputed ("compressed") in the order of their current start times,
then new jobs in queue order; otherwise only new jobs are placed. While
estimates are upper bounds on runtimes (requested walltimes enforced as kill
limits, or exact runtimes), this never moves a reservation later: capacity only
frees earlier than planned, and a job moved earlier only claims time *before*
its old start, which is no later than the start of any job processed after it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

from cosched.core.view import SchedulerView
from cosched.model import Job, JobState
from cosched.policies.base import BackfillPlan, BackfillPolicy


class Profile:
    """Free capacity over time as a step function: free[i] holds on [times[i], times[i+1])."""

    __slots__ = ("free", "times")

    def __init__(self, view: SchedulerView) -> None:
        now = view.now
        times, free = [now], [view.free_units]
        for end, units in view.releases():  # in time order
            if end == times[-1]:
                free[-1] += units
            else:
                times.append(end)
                free.append(free[-1] + units)
        self.times, self.free = times, free

    def earliest(self, need: int, duration: float) -> int:
        """Index of the first breakpoint from which `need` units stay free for `duration`."""
        times, free = self.times, self.free
        n = len(times)
        i = 0
        while i < n:
            if free[i] < need:
                i += 1
                continue
            end = times[i] + duration
            j = i + 1
            while j < n and times[j] < end and free[j] >= need:
                j += 1
            if j == n or times[j] >= end:
                return i
            i = j + 1
        raise AssertionError("the profile's last step is the whole free capacity")  # pragma: no cover

    def advance(self, now: float) -> None:
        """Drop the past: the profile then starts at `now`."""
        times = self.times
        i = bisect_right(times, now) - 1
        if i > 0:
            del times[:i]
            del self.free[:i]
        times[0] = now

    def reserve(self, i: int, need: int, duration: float) -> None:
        """Take `need` units from breakpoint i for `duration` seconds."""
        times, free = self.times, self.free
        end = times[i] + duration
        j = bisect_left(times, end, lo=i + 1)
        if j == len(times) or times[j] != end:
            times.insert(j, end)
            free.insert(j, free[j - 1])
        for k in range(i, j):
            free[k] -= need


class Conservative(BackfillPolicy):
    """Mu'alem and Feitelson's conservative backfilling, with compression."""

    name = "conservative"
    serves_head = True

    def __init__(self) -> None:
        self._reserved: dict[int, float] = {}
        self._profile: Profile | None = None
        """The last plan's profile: running jobs' expected ends plus every reservation."""
        self._cancelled = False

    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        reserved = self._reserved
        pending = view.queue[head:]
        now = view.now
        profile = self._profile
        if profile is not None and not self._cancelled:
            profile.advance(now)
            # Reservations due now are not running yet: the pool still holds their capacity.
            due = sum(j.need for j in pending if reserved.get(j.id, math.inf) <= now)
            if profile.free[0] + due != view.free_units:
                profile = None
        if profile is not None and not self._cancelled:
            # Capacity now is what the last plan expected: nothing ended early or overran, no
            # resources came or went, nobody left the queue. Every reservation already sits
            # where a full re-plan would put it; only jobs new to the queue need a place.
            jobs = [j for j in pending if j.id not in reserved]
        else:
            profile = Profile(view)
            known = sorted((j for j in pending if j.id in reserved), key=lambda j: reserved[j.id])
            jobs = known + [j for j in pending if j.id not in reserved]
        for job in jobs:
            i = profile.earliest(job.need, job.estimate)
            profile.reserve(i, job.need, job.estimate)
            reserved[job.id] = profile.times[i]
        self._profile, self._cancelled = profile, False
        start = [j for j in pending if reserved[j.id] <= now]
        return BackfillPlan(start, {j.id: reserved[j.id] for j in pending})

    def forget(self, job: Job) -> None:
        reserved = self._reserved.pop(job.id, None) is not None
        if (reserved and job.state is not JobState.RUNNING) or job.host >= 0:
            # A reservation vanished (the rest may move earlier), or a job started as a guest on
            # another's cores, off the plan, where it may outlive its host: the profile is stale.
            self._cancelled = True

    @property
    def reservations(self) -> dict[int, float]:
        """Current reservations by job id (read-only copy)."""
        return dict(self._reserved)

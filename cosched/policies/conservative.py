"""Conservative backfilling: a reservation for every queued job.

Every pending job holds a reservation in a free-capacity profile built from
the running jobs' expected ends. A job starts now only when its reservation
is now, so no start can land on anyone's reserved capacity.

Reservations persist between passes and are recomputed ("compressed") in the
order of their current start times, then new jobs in queue order. While
estimates are upper bounds on runtimes (requested walltimes enforced as kill
limits, or exact runtimes), this never moves a reservation later: capacity only
frees earlier than planned, and a job moved earlier only claims time *before*
its old start, which is no later than the start of any job processed after it.
"""

from __future__ import annotations

from bisect import bisect_left

from cosched.core.view import SchedulerView
from cosched.model import Job
from cosched.policies.base import BackfillPlan, BackfillPolicy


class Profile:
    """Free capacity over time as a step function: free[i] holds on [times[i], times[i+1])."""

    __slots__ = ("free", "times")

    def __init__(self, view: SchedulerView) -> None:
        now = view.now
        times, free = [now], [view.free_units]
        for job in view.running:  # sorted by expected end
            end = max(job.expected_end, now)
            if end == times[-1]:
                free[-1] += job.need
            else:
                times.append(end)
                free.append(free[-1] + job.need)
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

    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        reserved = self._reserved
        profile = Profile(view)
        pending = view.queue[head:]
        known = sorted((j for j in pending if j.id in reserved), key=lambda j: reserved[j.id])
        fresh = [j for j in pending if j.id not in reserved]
        now = view.now
        start: list[Job] = []
        for job in known + fresh:
            i = profile.earliest(job.need, job.estimate)
            profile.reserve(i, job.need, job.estimate)
            at = profile.times[i]
            reserved[job.id] = at
            if at <= now:
                start.append(job)
        return BackfillPlan(start, {j.id: reserved[j.id] for j in pending})

    def forget(self, job: Job) -> None:
        self._reserved.pop(job.id, None)

    @property
    def reservations(self) -> dict[int, float]:
        """Current reservations by job id (read-only copy)."""
        return dict(self._reserved)

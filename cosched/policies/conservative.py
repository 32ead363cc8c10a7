"""Conservative backfilling: a reservation for every waiting job, kept.

Every waiting job holds a reservation in a free-capacity profile built from the
running jobs' expected ends. A job gets its reservation when it arrives, even
while the cluster is full, at the earliest start that leaves every other
reservation where it is; it starts when its reservation is now, so no start can
land on anyone's reserved capacity.

When capacity comes free before the plan expected it (a job ended early, a
waiting job left the queue), the plan is compressed in priority (queue policy)
order, as Slurm's backfill re-plans: the first waiting job in that order that can
start earlier than its reservation is moved to its earliest start given the
running jobs and everyone else's reservations, and so on until none can. So the
capacity that came free goes to the first in priority order; by reservation start
instead, small jobs reserved in holes before a big one would take the cores it was
waiting for.

The guarantee: while estimates are upper bounds on runtimes (requested walltimes
enforced as kill limits, or exact runtimes), no reservation ever moves later, so no
job starts later than the first start it was promised. A job only moves to a start
where it fits with everyone else where they are, and its own place is free in that
profile, so its earliest start is never later than its reservation; capacity only
comes free earlier than planned, never later.

When the plan cannot hold as it is (a job ran past its estimate, resources came or
went, a co-scheduled guest started off the plan or ended), the profile is rebuilt
from the running jobs. If every reservation still fits where it is, all stay and are
compressed; if one does not, the waiting jobs are planned afresh in priority order.
Only then (capacity below what was promised) can a reservation move later.

Compression checks only the jobs that what came free can help (`_candidates`):
with long queues it is most of the cost of a replay.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Sequence

from cosched.core.view import SchedulerView
from cosched.model import Job, JobState
from cosched.policies.base import BackfillPlan, BackfillPolicy
from cosched.policies.profile import Profile

Gain = tuple[float, float, int]
"""Capacity that came free: `units` more on [start, end)."""


class _Size:
    """The reservations of the jobs of one size, by start and by length."""

    __slots__ = ("by_length", "by_start")

    def __init__(self) -> None:
        self.by_start: list[tuple[float, int]] = []
        self.by_length: list[tuple[float, int]] = []


class _Worklist:
    """The jobs to check, in priority order, and where by their size a new window may begin.

    A job is kept by its queue position (rank), as a flag: a compression on a long queue
    queues millions of jobs, most of them queued already, and the next to check is the
    first flag set from the lowest rank queued since (one C scan of a bytearray).

    Where a job's windows may begin is kept by size, not by job: the earliest start of
    any stretch that came free for its size (`Profile.stretches`). A start that is too
    early costs only a longer scan; one a job slides back to, or one in a stretch that
    reached its reservation once and was cut since, is never later (a job can only
    move into a window that a gain made).
    """

    __slots__ = ("_first", "_flags", "_pending", "_rank", "longest", "since")

    def __init__(self, pending: Sequence[Job]) -> None:
        self._pending = pending
        self._rank: dict[int, int] | None = None
        """Queue positions by job id, built on the first push: most passes push none."""
        self._flags = bytearray(len(pending))
        """1 at the rank of each queued job."""
        self._first = len(pending)
        """No job is queued below this rank."""
        self.since: dict[int, float] = {}
        """By size: the earliest start of a stretch that came free for it."""
        self.longest: dict[int, float] = {}
        """By size: the longest stretch that came free for it."""

    def lower(self, need: int, since: float, until: float) -> None:
        """A stretch with `need` units free came on [since, until)."""
        if since < self.since.get(need, math.inf):
            self.since[need] = since
        if until - since > self.longest.get(need, 0.0):
            self.longest[need] = until - since

    def push(self, job_ids: Iterable[int]) -> None:
        """Queue jobs to check."""
        if self._rank is None:
            self._rank = {job.id: i for i, job in enumerate(self._pending)}
        rank, flags, first = self._rank, self._flags, self._first
        for job_id in job_ids:
            r = rank[job_id]
            flags[r] = 1
            if r < first:
                first = r
        self._first = first

    def pop(self) -> Job | None:
        """The first queued job in priority order; None once none is."""
        r = self._flags.find(1, self._first)
        if r < 0:
            return None
        self._flags[r] = 0
        self._first = r + 1
        return self._pending[r]


class Conservative(BackfillPolicy):
    """Mu'alem and Feitelson's conservative backfilling, compressed in priority order."""

    name = "conservative"
    serves_head = True

    def __init__(self) -> None:
        self._reserved: dict[int, float] = {}
        self._jobs: dict[int, Job] = {}
        """The jobs holding a reservation."""
        self._sizes: dict[int, _Size] = {}
        """The reservations by the jobs' size (`Job.need`)."""
        self._needs: list[int] = []
        """The sizes in `_sizes`, sorted."""
        self._profile: Profile | None = None
        """The plan: running jobs' expected ends plus every reservation."""
        self._freed: list[Gain] = []
        """What came free since the last pass: early ends, jobs that left the queue."""
        self._stale = False
        """The profile no longer describes the running jobs (a guest started or ended)."""

    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        reserved = self._reserved
        pending = view.queue[head:] if head else view.queue
        now = view.now
        profile = self._profile
        freed, self._freed = self._freed, []
        if profile is not None and not self._stale:
            profile.advance(now)
            gains = [(max(start, now), end, units) for start, end, units in freed if end > now]
            # Reservations due now are not running yet: the pool still holds their capacity.
            free_now = profile.free[0] + sum(units for start, _, units in gains if start == now)
            if free_now + self._due_units(now) != view.free_units:
                profile = None  # a job overran its estimate, or resources came or went
            elif gains:
                self._compress(profile, pending, now, gains)
        if profile is None or self._stale:
            profile = self._rebuild(view, pending)
        if len(reserved) < len(pending):
            for job in pending:
                if job.id not in reserved:
                    self._reserve(profile, job, profile.earliest(job.need, job.estimate))
        self._profile, self._stale = profile, False
        start = [j for j in pending if reserved[j.id] <= now] if self._due_units(now) else []
        return BackfillPlan(start, dict(reserved))

    def forget(self, job: Job) -> None:
        at = self._reserved.get(job.id)
        if at is not None:
            self._unreserve(job)
        if job.host >= 0:
            # A guest started on another's cores, off the plan, where it may outlive its host.
            self._stale = True
        elif at is not None and job.state is not JobState.RUNNING:
            self._freed.append((at, at + job.estimate, job.need))  # its reservation came free

    def ended(self, job: Job, shared: bool) -> None:
        if shared:
            self._stale = True  # what its end frees is the guests' business (`cosched.core.frees`)
        else:
            self._freed.append((job.end, job.expected_end, job.need))

    def reestimated(self, job: Job) -> None:
        self._stale = True  # a running job's end moved, or a queued one's reservation: plan anew

    @property
    def reservations(self) -> dict[int, float]:
        """Current reservations by job id (read-only copy)."""
        return dict(self._reserved)

    # -- bookkeeping ------------------------------------------------------------
    def _reserve(self, profile: Profile, job: Job, start: float) -> None:
        profile.add(start, start + job.estimate, -job.need)
        self._reserved[job.id] = start
        self._jobs[job.id] = job
        size = self._sizes.get(job.need)
        if size is None:
            size = self._sizes[job.need] = _Size()
            insort(self._needs, job.need)
        insort(size.by_start, (start, job.id))
        insort(size.by_length, (job.estimate, job.id))

    def _unreserve(self, job: Job) -> None:
        """Drop a job's reservation from the books (not from the profile)."""
        at = self._reserved.pop(job.id)
        del self._jobs[job.id]
        size = self._sizes[job.need]
        del size.by_start[bisect_left(size.by_start, (at, job.id))]
        del size.by_length[bisect_left(size.by_length, (job.estimate, job.id))]
        if not size.by_start:
            del self._sizes[job.need]
            del self._needs[bisect_left(self._needs, job.need)]

    def _move(self, profile: Profile, job: Job, start: float) -> None:
        """Move a job's reservation to an earlier `start`."""
        at, need, duration = self._reserved[job.id], job.need, job.estimate
        profile.add(start, min(at, start + duration), -need)
        profile.add(max(at, start + duration), at + duration, need)
        self._reserved[job.id] = start
        by_start = self._sizes[need].by_start
        del by_start[bisect_left(by_start, (at, job.id))]
        insort(by_start, (start, job.id))

    def _due_units(self, now: float) -> int:
        """Units of the reservations due by `now` (not started yet: a job starts after its pass)."""
        return sum(
            need * bisect_right(size.by_start, (now, math.inf))
            for need, size in self._sizes.items()
            if size.by_start[0][0] <= now
        )

    # -- compression ------------------------------------------------------------
    def _compress(self, profile: Profile, pending: Sequence[Job], now: float, gains: list[Gain] | None) -> None:
        """While some waiting job can start earlier than its reservation, move the first in
        priority order to its earliest start given everyone else's.

        Before, no job could move; `gains` are what came free since, not yet in the
        profile (None: it may have come free anywhere). A job can then only move into a
        window holding a gain, so only jobs near one are checked, and a job that moves is
        a gain for the others.
        """
        reserved = self._reserved
        work = _Worklist(pending)
        if gains is None:
            for need in self._needs:
                work.lower(need, now, math.inf)
            work.push([job_id for job_id, at in reserved.items() if at > now])
        else:
            for gain in gains:  # one at a time: `_candidates` compares with what was free before
                profile.add(*gain)
                self._candidates(profile, gain, work)
        times, free, since, longest = profile.times, profile.free, work.since, work.longest
        while (job := work.pop()) is not None:
            at, duration, need = reserved[job.id], job.estimate, job.need
            if free[bisect_left(times, at) - 1] < need and (at - since[need] < duration or duration > longest[need]):
                continue  # it cannot slide, and no whole window of its length fits before it
            start = profile.earliest(need, duration, before=at, since=since[need])
            if start < at:
                self._move(profile, job, start)
                self._candidates(profile, (max(at, start + duration), at + duration, need), work)

    def _candidates(self, profile: Profile, gain: Gain, work: _Worklist) -> None:
        """Queue the jobs a gain may let start earlier, with where their windows may begin.

        None could before: a window of a job's length with its units free throughout
        had none, up to its reservation. A new one lies in a stretch with the job's units
        free that the gain made (`Profile.stretches`). If the stretch reaches past the
        job's reservation, the job can slide back to the stretch's start: such a job was
        queued already, by the gain that let it, unless its reservation starts in this
        one. Else the stretch must be as long as the job.
        """
        start, end, units = gain
        times, free = profile.times, profile.free
        first, last = bisect_right(times, start) - 1, bisect_left(times, end)
        # Only sizes that were not free somewhere in the gain before, and are now, can use it.
        fewest, most = min(free[first:last]) - units, max(free[first:last])
        needs, sizes, reserved = self._needs, self._sizes, self._reserved
        for need in needs[bisect_right(needs, fewest) : bisect_right(needs, most)]:
            size = sizes[need]
            by_start = size.by_start
            for since, until in profile.stretches(start, end, need, units, by_start[-1][0]):
                work.lower(need, since, until)
                # Reserved in the stretch and the gain: they can slide now, and could not before.
                after = bisect_right(by_start, (max(start, since), math.inf))
                slides = by_start[after : bisect_right(by_start, (min(end, until), math.inf), lo=after)]
                work.push([job_id for _, job_id in slides])
                if until == math.inf:
                    continue
                # Past the stretch: the jobs it is long enough for.
                slide = bisect_right(by_start, (until, math.inf))
                by_length = size.by_length
                short = bisect_right(by_length, (until - since, math.inf))
                if short <= len(by_start) - slide:
                    work.push([job_id for _, job_id in by_length[:short] if reserved[job_id] > until])
                else:
                    jobs, longest = self._jobs, until - since
                    work.push([job_id for _, job_id in by_start[slide:] if jobs[job_id].estimate <= longest])

    def _rebuild(self, view: SchedulerView, pending: Sequence[Job]) -> Profile:
        """A profile from the running jobs; the reservations kept and compressed if they all fit."""
        profile = Profile(view)
        now = view.now
        reserved = self._reserved
        known = [j for j in pending if j.id in reserved]
        for job in known:
            at = max(reserved[job.id], now)
            profile.add(at, at + job.estimate, -job.need)
        if all(units >= 0 for units in profile.free):
            self._compress(profile, pending, now, None)
            return profile
        profile = Profile(view)
        for job in known:
            self._unreserve(job)
            self._reserve(profile, job, profile.earliest(job.need, job.estimate))
        return profile

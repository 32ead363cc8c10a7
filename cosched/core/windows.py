"""Start windows: jobs held until their begin, and jobs that must start by a latest start.

Why its own module: deferrable jobs (OSDEC's [e_i, l_i], Slurm's `--begin` and a deadline
on the start) add two timers to a core that otherwise only reacts to events. Both are
min-heaps with lazy deletion, so a replay of ordinary jobs pays one empty-list check per
pass, and the core learns the next time it must wake from `next_time`.

A held job is pending in the core's books but not in its queue: no policy sees it before
its begin (OSDEC's B_cur holds only the jobs whose window includes now). A watched job is
pending with a finite latest start; the core ends it as failed once that passes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from cosched.core.frees import shadow as shadow_of
from cosched.core.view import SchedulerView
from cosched.model import Job, JobState


class StartWindows:
    """The held jobs by begin and the pending jobs by latest start."""

    __slots__ = ("_held", "_seq", "deadlines", "held")

    def __init__(self) -> None:
        self._held: list[tuple[float, int, Job]] = []
        self.deadlines: list[tuple[float, int, Job]] = []
        """Pending jobs with a latest start, a heap by it (stale entries dropped lazily)."""
        self._seq = 0
        self.held: dict[int, Job] = {}
        """Jobs waiting for their begin, by id (pending, not queued)."""

    @property
    def watching(self) -> bool:
        """Whether some job may still have a latest start to keep (stale entries included); the
        core's hot path reads `deadlines` itself, a property call per pass being measurable."""
        return bool(self.deadlines)

    def hold(self, job: Job) -> None:
        """Keep `job` out of the queue until its begin."""
        self.held[job.id] = job
        self._seq += 1
        heapq.heappush(self._held, (job.begin, self._seq, job))

    def watch(self, job: Job) -> None:
        """Remember `job`'s latest start (a no-op for a job without one)."""
        if job.latest_start < math.inf:
            self._seq += 1
            heapq.heappush(self.deadlines, (job.latest_start, self._seq, job))

    def drop(self, job: Job) -> bool:
        """Forget a held job (cancelled or expired); whether it was held."""
        return self.held.pop(job.id, None) is not None

    def due(self, now: float) -> list[Job]:
        """The held jobs whose begin has come, in begin order; they are no longer held."""
        heap, held, out = self._held, self.held, []
        while heap and heap[0][0] <= now:
            begin, _, job = heapq.heappop(heap)
            if held.get(job.id) is job and begin == job.begin:  # else stale: held again since, with another begin
                del held[job.id]
                out.append(job)
        return out

    def expired(self, now: float, *, at_now: bool) -> list[Job]:
        """Pending jobs past their latest start (or at it, with `at_now`: the pass that could
        start them is over)."""
        heap, out = self.deadlines, []
        while heap and (heap[0][0] <= now if at_now else heap[0][0] < now):
            job = heapq.heappop(heap)[2]
            if job.state is JobState.PENDING:
                out.append(job)
        return out

    def next_time(self, now: float) -> float:
        """The next begin or latest start after `now` that still matters (inf: none)."""
        held, deadlines = self._held, self.deadlines
        while held and (self.held.get(held[0][2].id) is not held[0][2] or held[0][0] != held[0][2].begin):
            heapq.heappop(held)
        while deadlines and deadlines[0][2].state is not JobState.PENDING:
            heapq.heappop(deadlines)
        first = held[0][0] if held else math.inf
        if deadlines and deadlines[0][0] < first:
            first = deadlines[0][0]
        return first if first > now else math.inf


def doomed(view: SchedulerView, jobs: Iterable[Job]) -> set[int]:
    """Ids of the `jobs` that do not fit now and, by the running jobs' estimates alone, would
    not fit before their latest start either: any reservation for them would land after it.

    Estimates are upper bounds where walltimes are kill limits, so such a job may still start
    in time if jobs end early; it just gets no reservation that holds others back meanwhile.
    """
    free = view.free_units
    shadows: dict[int, float] = {}
    out: set[int] = set()
    for job in jobs:
        if job.latest_start == math.inf or job.need <= free or job.state is not JobState.PENDING:
            continue
        shadow = shadows.get(job.need)
        if shadow is None:
            shadow = shadows[job.need] = shadow_of(view.free_units, view.releases(), job.need)[0]
        if shadow > job.latest_start:
            out.add(job.id)
    return out

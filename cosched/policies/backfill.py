"""Backfill policies that keep at most one reservation: none, and EASY."""

from __future__ import annotations

import math

from cosched.core.frees import shadow
from cosched.core.view import SchedulerView
from cosched.model import Job
from cosched.policies.base import NO_BACKFILL, BackfillPlan, BackfillPolicy


def shadow_time(view: SchedulerView, need: int) -> tuple[float, int]:
    """When a blocked job of `need` units fits by the running jobs' estimates (inf: never),
    and the units it will leave unused then (EASY's extra capacity)."""
    return shadow(view.free_units, view.releases(), need)


class NoBackfill(BackfillPolicy):
    """Strict priority order: nothing overtakes a blocked head."""

    name = "none"
    reads_queue = False

    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        return NO_BACKFILL


class EASY(BackfillPolicy):
    """EASY backfilling (Lifka 1995; Mu'alem and Feitelson 2001).

    The blocked head gets a reservation at the *shadow time*, the earliest
    moment enough running jobs will have ended (by their estimates) for it to
    fit. A later job may start now if it fits now and either ends by the shadow
    time or uses only the *extra* capacity the head will leave unused then, so
    it can never push the head's reservation back.

    Which estimate is used (requested walltime, actual runtime = EASY-AR, a
    predictor) is the core's estimator's business, not this policy's.
    """

    name = "easy"

    def __init__(self) -> None:
        # Work from the last pass, valid while the view's epoch and head are unchanged:
        # jobs before `_scanned` were already found unable to backfill.
        self._epoch = -1
        self._head: Job | None = None
        self._scanned = 0

    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        free = view.free_units
        queue = view.queue
        n = len(queue)
        if free == 0 or head + 1 >= n:
            return NO_BACKFILL
        blocked = queue[head]
        # Unchanged epoch and head: only jobs appended since are new. Time passing
        # only makes "ends before the shadow time" harder, so old refusals stand.
        first = head + 1
        if view.epoch == self._epoch and blocked is self._head:
            first = max(first, self._scanned)
        self._epoch, self._head, self._scanned = view.epoch, blocked, n
        # The shadow time is only worth computing if some job could start now.
        for i in range(first, n):
            if queue[i].need <= free:
                first = i
                break
        else:
            return NO_BACKFILL

        now = view.now
        shadow, extra = shadow_time(view, blocked.need)

        started = []
        for i in range(first, n):
            job = queue[i]
            need = job.need
            if need > free:
                continue
            if now + job.estimate <= shadow:
                free -= need
            elif need <= extra:
                free -= need
                extra -= need
            else:
                continue
            started.append(job)
            if free == 0:
                break
        return BackfillPlan(started, {blocked.id: shadow})

    def reserved_start(self, view: SchedulerView, job: Job) -> float | None:
        return shadow_time(view, job.need)[0]


class DirlabEASY(BackfillPolicy):
    """EASY as DIR-LAB's simulator runs it (RLScheduler, RLBackfilling: the paper's Table 4).

    Two departures from the textbook `EASY`: a job may be backfilled only if it ends
    strictly before the shadow time (no extra-capacity rule), and the shadow time is
    computed once, the first time it plans for a blocked head (when some capacity is
    free), and kept until that job starts, however early running jobs end. Under FCFS it is their EASY; under other
    queue policies theirs also keeps the head and backfills in submission order.
    """

    name = "easy-dirlab"

    def __init__(self) -> None:
        self._head = -1
        self._shadow = math.inf

    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        queue = view.queue
        blocked = queue[head]
        if blocked.id != self._head:
            self._head, self._shadow = blocked.id, shadow_time(view, blocked.need)[0]
        free, now, shadow = view.free_units, view.now, self._shadow
        started = []
        for job in queue[head + 1 :]:
            if job.need <= free and now + job.estimate < shadow:
                started.append(job)
                free -= job.need
                if free == 0:
                    break
        return BackfillPlan(started, {blocked.id: shadow})

    def reserved_start(self, view: SchedulerView, job: Job) -> float | None:
        return self._shadow if job.id == self._head else shadow_time(view, job.need)[0]

    def forget(self, job: Job) -> None:
        if job.id == self._head:
            self._head = -1

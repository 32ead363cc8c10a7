"""Backfill policies that keep at most one reservation: none, and EASY."""

from __future__ import annotations

import math

from cosched.core.view import SchedulerView
from cosched.model import Job
from cosched.policies.base import NO_BACKFILL, BackfillPlan, BackfillPolicy


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
        shadow, extra = math.inf, 0
        available = free
        for end, units in view.releases():
            available += units
            if available >= blocked.need:
                shadow = end
                extra = available - blocked.need
                break

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

"""The OSDEC paper's heuristics for deferrable jobs, as queue policies: FIFO, SJF, Tetris.

Why queue policies: the core already keeps a deferrable job out of the queue until its
begin (`cosched.core.windows`), so the queue a policy orders is OSDEC's B_cur, the jobs
whose window includes now. Ordinary (on-demand) jobs come first in every one of them, in
submission order: deferrable jobs fill the capacity on-demand ones leave, as in the paper,
where the available capacity is what on-demand jobs do not take.
"""

from __future__ import annotations

from collections.abc import Sequence

from cosched.core.view import SchedulerView
from cosched.model import Job
from cosched.policies.base import QueuePolicy

_DEFERRED = 1e15
"""Added to a deferrable job's score: after every on-demand one (scores are times, seconds)."""


class DeferrableFIFO(QueuePolicy):
    """On-demand jobs, then deferrable ones in the order they became eligible (e_i)."""

    name = "osdec-fifo"

    def score(self, job: Job, now: float) -> float:
        return _DEFERRED + job.eligible if job.deferrable else job.submit


class DeferrableSJF(QueuePolicy):
    """On-demand jobs, then deferrable ones shortest (requested) first."""

    name = "osdec-sjf"

    def score(self, job: Job, now: float) -> float:
        return _DEFERRED + job.walltime if job.deferrable else job.submit


class Tetris(QueuePolicy):
    """Tetris (Grandl et al. 2014) on one resource: the deferrable job that fits and whose
    demand aligns best with the free capacity (c_i x C_t: the largest that fits) goes next,
    then the largest that fits in what is left, and so on; ties go to the job whose window
    closes first. The packing is worked out in `order`, so the core's in-order serving starts
    exactly those jobs, and any backfill policy (conservative too) can follow it.

    On-demand jobs come first, in submission order; the jobs that do not fit follow by
    eligibility, so the first of them is the one a backfill policy would reserve for.
    """

    name = "osdec-tetris"
    static = False

    def score(self, job: Job, now: float) -> float:
        return _DEFERRED + job.eligible if job.deferrable else job.submit

    def order(self, queue: Sequence[Job], view: SchedulerView) -> Sequence[Job]:
        free = view.free_units
        ordinary = sorted((j for j in queue if not j.deferrable), key=lambda j: (j.submit, j.id))
        deferrable = [j for j in queue if j.deferrable]
        for job in ordinary:
            if job.need > free:  # a blocked on-demand head: nothing is packed ahead of it
                return ordinary + sorted(deferrable, key=lambda j: (j.eligible, j.id))
            free -= job.need
        packed, left = [], []
        for job in sorted(deferrable, key=lambda j: (-j.need, j.latest_start, j.id)):
            if job.need <= free:
                packed.append(job)
                free -= job.need
            else:
                left.append(job)
        return ordinary + packed + sorted(left, key=lambda j: (j.eligible, j.id))

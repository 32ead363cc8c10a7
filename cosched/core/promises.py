"""The starts co-scheduling must keep: a guest may not hold cores a backfill promise counts on.

A guest runs on a share of its host's cores and keeps that share after its host
ends (`cosched.core.frees`). A guest that would outlive its host therefore takes
cores from the future, as a backfilled job does, and is held to EASY's rule: it
must be gone by the waiting head's start, or fit in the head's "extra" units (those
the head will not need then), and gone before any other reservation (conservative
backfilling promises every waiting job a start).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

from cosched.core.view import SchedulerView
from cosched.model import Job


class Promises:
    """Built once per pass from the backfill's reservations and the first waiting jobs."""

    def __init__(self, view: SchedulerView, waiting: Iterable[Job], reservations: Mapping[int, float]) -> None:
        self.now = view.now
        # Two heads: a guest never has to keep its own promise, and the head may be the guest.
        self._heads = [(job.id, *_start_and_extra(view, job.need)) for job in waiting]
        self._reserved = heapq.nsmallest(3, ((at, job_id) for job_id, at in reservations.items()))
        # The head's extra units are free for a guest only when no other job was promised a
        # start (EASY): conservative backfilling may have reserved them for a later job.
        self._extra_free = len(reservations) <= 1
        self._extra_taken = 0

    def allow(self, guest: Job, host: Job) -> bool:
        """Whether `guest` on `host` keeps every promise; `took` must follow if it is placed."""
        end = self.now + guest.estimate
        head_id, start, extra = self._head(guest)
        others = next((at for at, job_id in self._reserved if job_id not in (guest.id, head_id)), math.inf)
        if end <= max(host.expected_end, min(start, others)):
            return True  # gone before anyone counts on its cores
        return self._extra_free and end <= max(host.expected_end, others) and guest.need <= extra - self._extra_taken

    def took(self, guest: Job, host: Job) -> None:
        """Record a placed guest: one outliving the head's start uses up some of the head's extra."""
        start = self._head(guest)[1]
        if self.now + guest.estimate > max(host.expected_end, start):
            self._extra_taken += guest.need

    def _head(self, guest: Job) -> tuple[int, float, int]:
        """The first waiting job other than the guest: (id, start, extra units then)."""
        return next((h for h in self._heads if h[0] != guest.id), (-1, math.inf, 0))


def _start_and_extra(view: SchedulerView, need: int) -> tuple[float, int]:
    """When `need` units are free by the running jobs' expected ends, and how many more are free then."""
    available = view.free_units
    if need <= available:
        return view.now, available - need
    for end, units in view.releases():
        available += units
        if available >= need:
            return end, available - need
    return math.inf, 0

"""The scheduling core: `step(now, events) -> Decision`, and nothing else.

It knows no clock, no Docker, no Mesos. Replay calls it at virtual times with
events from a simulated backend; the daemon calls it at wall-clock times with
events from a real one. Both get exactly this logic.

A pass serves the queue in the queue policy's order, launching jobs while
their whole gang fits in the held offers; at the first job that does not fit
(the blocked head) it asks the backfill policy which later jobs may start now.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from cosched.core.events import (
    Action,
    Decision,
    Event,
    JobCancelled,
    JobEnded,
    JobSubmitted,
    Kill,
    Launch,
    Offer,
    Reject,
    Rescind,
)
from cosched.core.pool import ResourcePool, slot_memory
from cosched.core.view import SchedulerView
from cosched.errors import SchedulingError
from cosched.model import Cluster, Job, JobState
from cosched.policies.base import BackfillPolicy, Estimator, PlacementPolicy, QueuePolicy

_expected_end = attrgetter("expected_end")
_priority = attrgetter("priority")
_NONE: Mapping[int, float] = MappingProxyType({})


class Scheduler:
    """Queue, running set and held offers, advanced one step at a time."""

    def __init__(
        self,
        cluster: Cluster,
        queue_policy: QueuePolicy,
        backfill: BackfillPolicy,
        estimator: Estimator,
        placement: PlacementPolicy,
    ) -> None:
        self.cluster = cluster
        self.queue_policy = queue_policy
        self.backfill = backfill
        self.estimator = estimator
        self.placement = placement
        self.pool = ResourcePool(cluster)
        self.queue: list[Job] = []
        """Pending jobs: sorted by score for a static queue policy, else in arrival order."""
        self.running: list[Job] = []
        """Running jobs sorted by expected end."""
        self.jobs: dict[int, Job] = {}
        """Pending and running jobs by id."""
        self._killing: set[int] = set()
        """Running jobs the core asked the backend to kill."""
        self._handlers: dict[type, Callable[[Any, float, list[Action]], None]] = {
            JobSubmitted: self._on_submitted,
            JobEnded: self._on_ended,
            JobCancelled: self._on_cancelled,
            Offer: self._on_offer,
            Rescind: self._on_rescind,
        }
        self._view = SchedulerView(0.0, cluster, self.queue, self.running, self.pool)
        self._capacity = cluster.capacity_units
        self._memory_tracked = cluster.memory_per_node > 0
        self._place = placement.place

    # -- the contract -------------------------------------------------------
    def step(self, now: float, events: list[Event]) -> Decision:
        """Apply what happened, then decide what to do at `now`."""
        actions: list[Action] = []
        for event in events:
            # The three events of every replayed job skip the handler table.
            if isinstance(event, JobSubmitted):
                self._on_submitted(event, now, actions)
            elif isinstance(event, Offer):
                self.pool.add(event.slots, event.memory)
                self._view.epoch += 1
            elif isinstance(event, JobEnded):
                self._on_ended(event, now, actions)
            else:
                self._handlers[type(event)](event, now, actions)
        reservations = self._schedule(now, actions) if self.queue and self.pool.free_units else _NONE
        return Decision(actions, reservations)

    def view(self, now: float) -> SchedulerView:
        """The policies' view of the state at `now` (queue in policy order).

        One view object is reused across passes; it is only valid until the next.
        """
        view = self._view
        view.now = now
        view.queue = self.queue
        if not self.queue_policy.static:
            view.epoch += 1  # the order may change with time alone
        view.queue = self.queue_policy.order(self.queue, view)
        return view

    # -- events -------------------------------------------------------------
    def _on_submitted(self, event: JobSubmitted, now: float, actions: list[Action]) -> None:
        job = event.job
        if job.id in self.jobs:
            raise SchedulingError(f"job {job.id} submitted twice")
        job.need = need = self.cluster.units_for(job)
        if not (0 < need <= self._capacity and job.walltime > 0) or (job.memory and self._memory_tracked):
            reason = self._never_fits(job)
            if reason:
                job.state = JobState.FAILED
                actions.append(Reject(job, reason))
                return
        job.estimate = self.estimator.estimate(job)
        job.state = JobState.PENDING
        self.jobs[job.id] = job
        queue = self.queue
        if not self.queue_policy.static:
            queue.append(job)
            return
        job.priority = priority = self.queue_policy.score(job, now)
        if not queue or queue[-1].priority <= priority:
            queue.append(job)
        else:
            insort(queue, job, key=_priority)
            self._view.epoch += 1

    def _on_ended(self, event: JobEnded, now: float, actions: list[Action]) -> None:
        job = self.jobs.pop(event.job_id, None)
        if job is None or job.state is not JobState.RUNNING:
            raise SchedulingError(f"job {event.job_id} ended but was not running")
        job.end = now if event.at is None else event.at
        if self._killing and job.id in self._killing:
            self._killing.discard(job.id)
            job.state = JobState.CANCELLED
        else:
            job.state = JobState.FAILED if event.failed else JobState.DONE
        self._remove_running(job)
        self._view.epoch += 1

    def _on_cancelled(self, event: JobCancelled, now: float, actions: list[Action]) -> None:
        job = self.jobs.get(event.job_id)
        if job is None:
            return  # already finished: cancelling is idempotent
        if job.state is JobState.RUNNING:
            if job.id not in self._killing:
                self._killing.add(job.id)
                actions.append(Kill(job.id))  # it leaves `running` when the backend reports the end
            return
        del self.jobs[job.id]
        self.queue.remove(job)
        self._view.epoch += 1
        self.backfill.forget(job)
        job.state = JobState.CANCELLED
        job.end = now

    def _on_offer(self, event: Offer, now: float, actions: list[Action]) -> None:
        self.pool.add(event.slots, event.memory)
        self._view.epoch += 1

    def _on_rescind(self, event: Rescind, now: float, actions: list[Action]) -> None:
        self.pool.remove(event.slots, event.memory)
        self._view.epoch += 1

    # -- the pass -----------------------------------------------------------
    def _schedule(self, now: float, actions: list[Action]) -> Mapping[int, float]:
        view = self.view(now)
        order = view.queue
        pool, place = self.pool, self._place
        head = 0
        n = len(order)
        while head < n and not self.backfill.serves_head:
            job = order[head]
            if job.need > pool.free_units:
                break
            slots = place(job, pool)
            if slots is None:
                break
            self._launch(job, slots, now, actions)
            head += 1
        plan = self.backfill.plan(view, head) if head < n and pool.free_units else None
        self._dequeue_prefix(order, head)
        if plan is None:
            return _NONE
        for job in plan.start:
            slots = place(job, pool) if job.need <= pool.free_units else None
            if slots is not None:
                self._launch(job, slots, now, actions)
                self._dequeue(job)
        return plan.reservations

    def _dequeue_prefix(self, order: Sequence[Job], count: int) -> None:
        """Remove the first `count` jobs of `order`, which were just started."""
        if not count:
            return
        self._view.epoch += 1  # positions shift
        forget = self.backfill.forget
        for job in order[:count]:
            forget(job)
        if order is self.queue:
            del self.queue[:count]
        else:
            remove = self.queue.remove
            for job in order[:count]:
                remove(job)

    def _dequeue(self, job: Job) -> None:
        self.queue.remove(job)
        self.backfill.forget(job)

    def _launch(self, job: Job, slots: tuple[tuple[int, int], ...], now: float, actions: list[Action]) -> None:
        self.pool.remove(slots, slot_memory(self.cluster, job, slots) if self._memory_tracked else None)
        job.state = JobState.RUNNING
        job.start = now
        job.slots = slots
        job.expected_end = now + job.estimate
        insort(self.running, job, key=_expected_end)
        actions.append(Launch(job, slots))
        self._view.epoch += 1

    def _remove_running(self, job: Job) -> None:
        running = self.running
        i = bisect_left(running, job.expected_end, key=_expected_end)
        while running[i] is not job:
            i += 1
        del running[i]

    def _never_fits(self, job: Job) -> str:
        cluster = self.cluster
        if job.cores <= 0:
            return f"job {job.id} asks for {job.cores} cores"
        if job.walltime <= 0:
            return f"job {job.id} asks for walltime {job.walltime}"
        if job.need > cluster.capacity_units:
            return f"job {job.id} needs {job.need} {cluster.allocation.value}s, cluster has {cluster.capacity_units}"
        if job.memory and cluster.memory_per_node:
            per_node = min(job.cores, cluster.cores_per_node) * job.memory
            if per_node > cluster.memory_per_node:
                return f"job {job.id} needs {per_node} MiB on a node, nodes have {cluster.memory_per_node}"
        return ""

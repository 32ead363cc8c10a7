"""A validating wrapper around the core, for tests and checked replays.

It keeps its own, independent ledger of the cluster, so a bug in the core's
bookkeeping (the pool, the queue) cannot hide itself: every launch is checked
against what the validator believes is free, and every rule a scheduler must
keep is asserted at the moment it could be broken.
"""

from __future__ import annotations

from cosched.core.events import Decision, Event, JobEnded, JobSubmitted, Launch, Reject
from cosched.core.scheduler import Scheduler
from cosched.errors import SchedulingError
from cosched.model import Allocation


class ValidatingScheduler:
    """Checks each step of a `Scheduler`: no double allocation, no start before
    submission, each job started once, every gang whole; records decisions."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        cluster = scheduler.cluster
        self.used = [0] * cluster.nodes
        self.started: dict[int, float] = {}
        self.submitted: dict[int, float] = {}
        self.ended: set[int] = set()
        self.slots: dict[int, tuple[tuple[int, int], ...]] = {}
        self.reservation_log: list[tuple[float, dict[int, float]]] = []
        self.head_log: list[tuple[float, int | None]] = []
        """(time, id of the job first in queue order as each pass began)."""
        self.launch_log: list[tuple[float, int]] = []

    def step(self, now: float, events: list[Event]) -> Decision:
        self.head_log.append((now, self._ordered_head(now, events)))
        for event in events:
            if isinstance(event, JobSubmitted):
                self._check(event.job.id not in self.submitted, f"job {event.job.id} submitted twice")
                self._check(event.job.submit <= now, f"job {event.job.id} submitted in the future")
                self.submitted[event.job.id] = event.job.submit
            elif isinstance(event, JobEnded):
                self._release(event.job_id)
        decision = self.scheduler.step(now, events)
        for action in decision.actions:
            if isinstance(action, Launch):
                self._launch(now, action)
            elif isinstance(action, Reject):
                self._check(
                    action.job.need > self.scheduler.cluster.capacity_units or bool(action.reason),
                    f"job {action.job.id} rejected without a reason",
                )
        if decision.reservations:
            self.reservation_log.append((now, dict(decision.reservations)))
        return decision

    def _ordered_head(self, now: float, events: list[Event]) -> int | None:
        """The job the queue policy will serve first in this pass (before anything starts)."""
        core = self.scheduler
        pending = core.queue + [e.job for e in events if isinstance(e, JobSubmitted)]
        if not pending:
            return None
        return min(pending, key=lambda job: core.queue_policy.score(job, now)).id

    def _launch(self, now: float, action: Launch) -> None:
        job, cluster = action.job, self.scheduler.cluster
        jid = job.id
        self._check(jid in self.submitted, f"job {jid} launched but never submitted")
        self._check(jid not in self.started, f"job {jid} started twice")
        self._check(now >= job.submit, f"job {jid} started at {now} before its submission at {job.submit}")
        per_node = cluster.cores_per_node
        nodes = [node for node, _ in action.slots]
        self._check(len(set(nodes)) == len(nodes), f"job {jid} got one node twice")
        if cluster.allocation is Allocation.NODE:
            self._check(len(nodes) == job.need, f"job {jid} needs {job.need} nodes, got {len(nodes)}")
            for node, cores in action.slots:
                self._check(cores == per_node and self.used[node] == 0, f"job {jid}: node {node} is not whole")
        else:
            got = sum(cores for _, cores in action.slots)
            self._check(got == job.cores, f"job {jid} needs {job.cores} cores, got {got}")
        for node, cores in action.slots:
            self._check(self.used[node] + cores <= per_node, f"job {jid} oversubscribes node {node}")
            self.used[node] += cores
        self.started[jid] = now
        self.slots[jid] = action.slots
        self.launch_log.append((now, jid))

    def _release(self, jid: int) -> None:
        self._check(jid in self.started and jid not in self.ended, f"job {jid} ended but was not running")
        self.ended.add(jid)
        for node, cores in self.slots.pop(jid):
            self.used[node] -= cores

    @staticmethod
    def _check(ok: bool, message: str) -> None:
        if not ok:
            raise SchedulingError(f"validation: {message}")

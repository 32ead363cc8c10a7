"""The simulated backend: runs launched jobs for their recorded runtime.

It plays the part Docker or Mesos play in the daemon: it offers the cluster's
resources, takes `Launch` and `Kill` actions, and reports when jobs end and
their resources are offered again. A job runs for its actual runtime, cut at
its walltime, as a real resource manager would kill it.
"""

from __future__ import annotations

import heapq
import math

from cosched.core.events import Action, Event, JobEnded, Kill, Launch, Offer, Reject
from cosched.core.pool import slot_memory
from cosched.model import Cluster, Job


class SimulatedBackend:
    """Virtual-time execution of launched jobs."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.rejected: list[Job] = []
        self._ends: list[tuple[float, int, Job]] = []
        self._seq = 0
        self._memory_tracked = cluster.memory_per_node > 0

    def start(self) -> list[Event]:
        """Offer every node of the cluster."""
        c = self.cluster
        memory = (c.memory_per_node,) * c.nodes if c.memory_per_node else None
        return [Offer(tuple((n, c.cores_per_node) for n in range(c.nodes)), memory)]

    def apply(self, now: float, actions: list[Action]) -> None:
        ends = self._ends
        for action in actions:
            if isinstance(action, Launch):
                job = action.job
                runtime = job.runtime if job.runtime is not None else job.walltime
                self._seq += 1
                heapq.heappush(ends, (now + min(runtime, job.walltime), self._seq, job))
            elif isinstance(action, Kill):
                self._kill(now, action.job_id)
            elif isinstance(action, Reject):
                self.rejected.append(action.job)

    def next_time(self) -> float:
        ends = self._ends
        return ends[0][0] if ends else math.inf

    def pop(self, now: float) -> list[Event]:
        """Events for every job ending at or before `now`, with the offers they free."""
        ends = self._ends
        events: list[Event] = []
        cluster, memory_tracked = self.cluster, self._memory_tracked
        while ends and ends[0][0] <= now:
            job = heapq.heappop(ends)[2]
            events.append(JobEnded(job.id))
            events.append(Offer(job.slots, slot_memory(cluster, job, job.slots) if memory_tracked else None))
        return events

    def _kill(self, now: float, job_id: int) -> None:
        """Move a running job's end to now (kills are rare: a linear search is fine)."""
        ends = self._ends
        for i, (_, seq, job) in enumerate(ends):
            if job.id == job_id:
                ends[i] = (now, seq, job)
                heapq.heapify(ends)
                return

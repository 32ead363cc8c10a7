"""The read-only window through which policies see the scheduler's state.

Policies get everything the learned policies of later work will need (the
ordered queue, running jobs with start and expected end, free resources per
node, the time) but never the means to change it: they answer with jobs or
actions, and the core acts.

The view reads the core's live structures instead of copying them: replay runs
a pass per event at hundreds of thousands of jobs per second, and a snapshot
per pass would cost more than the decision itself. A policy must therefore
treat what it reads as borrowed for the duration of its call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from cosched.core.frees import releases
from cosched.model import Cluster, Job

if TYPE_CHECKING:
    from cosched.core.pool import ResourcePool


class SchedulerView:
    """State at `now`: queue (policy order), running jobs, free resources."""

    __slots__ = ("_jobs", "_pool", "cluster", "epoch", "guests", "now", "queue", "running", "withheld")

    def __init__(
        self,
        now: float,
        cluster: Cluster,
        queue: Sequence[Job],
        running: Sequence[Job],
        pool: ResourcePool,
        guests: Mapping[int, Sequence[Job]] = MappingProxyType({}),
        jobs: Mapping[int, Job] = MappingProxyType({}),
        withheld: Mapping[int, int] = MappingProxyType({}),
    ) -> None:
        self.now = now
        self.cluster = cluster
        self.queue = queue
        """Pending jobs in the queue policy's order (the head first)."""
        self.running = running
        """Running jobs sorted by `expected_end` (start + estimate)."""
        self.guests = guests
        """Co-scheduled guests by their host's id (guests are not in `running`)."""
        self._jobs = jobs
        self._pool = pool
        self.withheld = withheld
        """Running jobs' units their ends will not give back, by job id (`Scheduler.withhold`)."""
        self.epoch = 0
        """Bumped whenever anything but a job appended at the queue's tail changed
        (resources, running jobs, queue order), so a policy may reuse work done
        at the same epoch: only the new tail jobs are new to it."""

    @property
    def free_units(self) -> int:
        """Free capacity in the cluster's allocation unit (cores, or idle nodes)."""
        return self._pool.free_units

    def releases(self) -> Iterator[tuple[float, int]]:
        """(time, units) the running jobs give back by their expected ends, in time order,
        counting what guests keep after their hosts end and not what `withheld` says never
        comes back (`cosched.core.frees`)."""
        return releases(self.running, self.guests, self._jobs, self.now, self.withheld)

    @property
    def jobs(self) -> Mapping[int, Job]:
        """Every pending (queued or held) and running job by id, guests included."""
        return self._jobs

    @property
    def capacity_units(self) -> int:
        return self.cluster.capacity_units

    def free_cores(self, node: int) -> int:
        return self._pool.free_cores(node)

    def free_memory(self, node: int) -> int:
        return self._pool.free_mem[node]

    def usable_nodes(self) -> tuple[int, ...]:
        """Nodes with a free core (core allocation) or wholly idle (node allocation)."""
        return tuple(self._pool.avail)

    def expected_end(self, job: Job) -> float:
        """When a running job should end by its estimate, never before now."""
        return max(job.expected_end, self.now)

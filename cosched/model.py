"""The data every part of cosched shares: jobs and the shape of a cluster.

`Job` is deliberately one mutable, slotted object holding both what was asked
for and what happened to it (start, end). Replay pushes hundreds of thousands
of them through the scheduling core per second, and a separate state object
per job would double the attribute traffic on the hottest path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from cosched.core.topology import FatTree
from cosched.errors import ConfigError


class JobState(StrEnum):
    """Where a job is in its life; only the core moves a job forward."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(slots=True, eq=False)
class Job:
    """A rigid parallel job: the SWF fields cosched uses plus workflow identity.

    Times are seconds. `walltime` is the user's requested time (the kill limit);
    `runtime` is the actual runtime when known (traces, finished jobs) and None
    for a live job. `memory` is MiB per core, as SWF records memory per processor,
    so a gang split across nodes needs `cores_on_node * memory` on each node.
    `stage` names the job's application class (a workflow stage type such as
    `blast.search`), what co-scheduling learns about; `tasks` is how many tasks
    it runs, for the happiness metric; `parallel` whether it keeps all its
    cores busy or runs one sequential process.

    `estimate`, `need` and `priority` are filled in by the core at submission:
    the runtime estimate its estimator gave, the job's size in the cluster's
    allocation unit (cores, or whole nodes), and its score under a static queue
    policy. While it runs, `quota` is the CPUs its cgroup may use (its cores
    unless it lends some), `host` the job whose allocation it runs in as a
    co-scheduled guest (-1 if none), and `usage` the latest measurement.
    """

    id: int
    submit: float
    cores: int
    walltime: float
    runtime: float | None = None
    memory: int = 0
    nodes: int = 0
    user: int = -1
    group: int = -1
    app: int = -1
    queue: int = -1
    partition: int = -1
    status: int = 1
    workflow: str | None = None
    stage: str | None = None
    tasks: int = 0
    parallel: bool = True
    span: bool = True
    """Its cores may come from several nodes (core allocation); else one node holds them all."""
    depends: int = -1
    think_time: float = -1.0
    begin: float = -math.inf
    """Earliest start (Slurm's `--begin`, OSDEC's e_i), on the clock of `submit`: the job is held,
    out of the queue policies' sight, until then."""
    latest_start: float = math.inf
    """Latest start (OSDEC's l_i): still pending then, the job fails; it never starts later in
    replay, and in the daemon only in its pass just after l_i (`Scheduler.late_grace`)."""
    throttle: int = 0
    """At most this many jobs of its workflow run at once (sbatch's `--array 0-99%N`; 0: no cap)."""
    coschedule: bool = True
    """False: its cores are never lent to a guest, nor does it run as one (a job timed alone)."""
    quota_since: float = -1.0
    """When a running job's current CPU quota began (its start, or the last lending that changed it)."""
    # Filled in by the scheduling core.
    estimate: float = 0.0
    need: int = 0
    priority: float = 0.0
    state: JobState = JobState.PENDING
    start: float = -1.0
    end: float = -1.0
    expected_end: float = math.inf
    slots: tuple[tuple[int, int], ...] = ()
    quota: float = 0.0
    host: int = -1
    usage: Usage | None = None

    @property
    def wait(self) -> float:
        """Seconds between submission and start (meaningful once started)."""
        return self.start - self.submit

    @property
    def eligible(self) -> float:
        """When it may first start: its submission, or its begin if later (OSDEC's e_i)."""
        return self.begin if self.begin > self.submit else self.submit

    @property
    def deferrable(self) -> bool:
        """Whether it carries a start window (a begin after its submission, or a latest start)."""
        return self.begin > self.submit or self.latest_start < math.inf


@dataclass(frozen=True, slots=True)
class Usage:
    """What a backend measured of a running job: the co-scheduler's view of it.

    `cpu` is the CPU it used over the CPU it was granted (its quota), so a job
    throttled by a small quota reads as busy, not idle: what matters for lending
    is whether it has granted CPU to spare. `mem` is the fraction of its memory
    in use; `tasks_done` counts finished tasks. `quota` is the CPU quota `cpu`
    is a share of (0 when the backend did not say), so `cpu * quota` are the
    CPUs it kept busy even after its quota changed.
    """

    cpu: float
    mem: float
    tasks_done: int
    at: float
    quota: float = 0.0


MAX_REPLAY_PROCS = 10**7
"""The largest cluster cosched replays, in processors (Frontier has 8.7 million cores). A trace's
processors are often one-core nodes, each with its free-core bookkeeping in memory: 10^7 takes about
2 GB, 10^8 about 20 GB and minutes before the first job starts, and beyond that lists overflow."""


class Allocation(StrEnum):
    """How jobs take resources: any free cores, or whole nodes exclusively."""

    CORE = "core"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class Cluster:
    """A homogeneous cluster: `nodes` nodes of `cores_per_node` cores.

    `memory_per_node` is MiB; 0 means memory is not tracked (most traces).
    Under `Allocation.NODE` a job gets whole nodes (SDSC-BLUE: 144 nodes x 8
    processors, jobs take ceil(procs / 8) nodes); under `Allocation.CORE` its
    cores may come from any nodes (a gang spanning nodes).
    """

    nodes: int
    cores_per_node: int = 1
    memory_per_node: int = 0
    allocation: Allocation = Allocation.CORE
    name: str = field(default="cluster", compare=False)
    nodes_per_switch: int = 0
    """The network: nodes under each leaf switch of a fat-tree, numbered left to right (0: no
    topology known, every placement costs the same)."""
    switches_per_pod: int = 0
    """Leaf switches per pod of that fat-tree (a k-ary one has k/2 of each)."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.cores_per_node < 1:
            raise ConfigError(
                f"cluster needs at least one node and one core per node, "
                f"got {self.nodes} nodes x {self.cores_per_node} cores"
            )
        if self.memory_per_node < 0:
            raise ConfigError(f"memory_per_node must be >= 0, got {self.memory_per_node}")
        if (self.nodes_per_switch > 0) != (self.switches_per_pod > 0) or min(
            self.nodes_per_switch, self.switches_per_pod
        ) < 0:
            raise ConfigError(
                f"a fat-tree needs both nodes_per_switch and switches_per_pod >= 1 (or both 0 for none), "
                f"got {self.nodes_per_switch} and {self.switches_per_pod}"
            )

    @property
    def topology(self) -> FatTree | None:
        """The fat-tree its nodes sit in, when known."""
        if not self.nodes_per_switch:
            return None
        return FatTree(self.nodes, self.nodes_per_switch, self.switches_per_pod)

    @property
    def cores(self) -> int:
        return self.nodes * self.cores_per_node

    @property
    def capacity_units(self) -> int:
        """Total capacity in the allocation unit (cores or nodes)."""
        return self.nodes if self.allocation is Allocation.NODE else self.cores

    def memory_on_one_node(self, cores: int, memory_per_core: int) -> int:
        """The most MiB of a job one node must hold: memory is per core, and a gang's fullest node
        has at most a node's cores of it. The daemon's submission check and the core's refusal both
        compare it with `memory_per_node`, so a job the API accepts is never refused a pass later."""
        return min(cores, self.cores_per_node) * memory_per_core

    def units_for(self, job: Job) -> int:
        """A job's size in this cluster's allocation unit."""
        if self.allocation is Allocation.NODE:
            if job.nodes > 0:
                return job.nodes
            return -(-job.cores // self.cores_per_node)
        return job.cores

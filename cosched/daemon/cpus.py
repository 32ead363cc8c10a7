"""Which cores, and so which host CPUs, each job's container is pinned to.

The core allocates counts, `(node, cores)` slots; a container needs CPU numbers
for its cpuset. The host's CPUs are cut into `nodes` equal, disjoint ranges
(virtual nodes, as the ASAx paper's 288-core NumaScale host was one machine
with many NUMA nodes), and a job gets the lowest free CPUs of each node in its
slots. A guest runs on the first CPUs of its host's allocation, the same share
the core gives it (`_share`), so slots and cpusets always agree.
"""

from __future__ import annotations

from cosched.core.events import Slots
from cosched.errors import ConfigError, SchedulingError


class CpuMap:
    """Free CPUs per virtual node."""

    def __init__(self, cpus: list[int], nodes: int) -> None:
        self.host_cpus = cpus
        """Core k (the numbers this map hands out) runs on host CPU `host_cpus[k]`."""
        self.cores_per_node = len(cpus) // nodes
        self.node_cpus = [list(range(n * self.cores_per_node, (n + 1) * self.cores_per_node)) for n in range(nodes)]
        self._free = [set(group) for group in self.node_cpus]
        self._node_of = {cpu: n for n, group in enumerate(self.node_cpus) for cpu in group}

    def take(self, slots: Slots) -> list[int]:
        """The lowest free CPUs on each slot's node; SchedulingError if a node lacks them."""
        chosen: list[int] = []
        for node, cores in slots:
            free = sorted(self._free[node])
            if len(free) < cores:
                raise SchedulingError(f"node {node} has {len(free)} free CPUs, {cores} asked")
            chosen.extend(free[:cores])
        self.claim(chosen)
        return chosen

    def claim(self, cpus: list[int]) -> None:
        """Mark exactly these CPUs used (a job adopted after a restart). Cores this map has not
        (`cluster.cores` or `nodes` made smaller while the job ran) stop the start with one line,
        not a KeyError's traceback."""
        missing = sorted(set(cpus) - self._node_of.keys())
        if missing:
            raise ConfigError(
                f"a running job holds cores {ranges(cpus)}, and this cluster has cores {ranges(list(self._node_of))} "
                "only: start with the cluster.cores and cluster.nodes it was started under, and let it end first"
            )
        for cpu in cpus:
            self._free[self._node_of[cpu]].discard(cpu)

    def give(self, cpus: list[int]) -> None:
        for cpu in cpus:
            self._free[self._node_of[cpu]].add(cpu)

    def cpuset(self, cores: list[int]) -> list[int]:
        """The host CPUs a container on these cores is pinned to."""
        return sorted({self.host_cpus[core] for core in cores})

    def free_count(self, node: int) -> int:
        return len(self._free[node])

    def node_of(self, cpu: int) -> int:
        return self._node_of[cpu]


def share_of(host_cpus: list[int], share: Slots, cpu_map: CpuMap) -> list[int]:
    """A guest's CPUs: on each node of `share`, the first `cores` of its host's CPUs there."""
    chosen: list[int] = []
    for node, cores in share:
        chosen.extend([cpu for cpu in host_cpus if cpu_map.node_of(cpu) == node][:cores])
    return chosen


def ranges(cores: list[int]) -> str:
    """Core numbers as an operator reads them, as Slurm writes a cpuset: `0-3,6` ('-' for none)."""
    if not cores:
        return "-"
    spans: list[list[int]] = []
    for core in sorted(set(cores)):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)

"""Held offers: the free resources the core may place jobs on.

The pool answers two questions on the hottest path of every scheduling pass,
"does a gang of this size fit?" and "which slots would first-fit give it?",
so it keeps counters and the usable nodes in order (`SortedNodes`) instead of
scanning all nodes; no operation on it costs more on a larger machine. A node
is *usable* when it has a free core (core allocation) or is entirely idle
(node allocation).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import countOf, itemgetter

from cosched.core.events import Slots
from cosched.core.sorted_nodes import SortedNodes
from cosched.errors import SchedulingError
from cosched.model import Allocation, Cluster, Job

_node_of = itemgetter(0)
_cores_of = itemgetter(1)


class ResourcePool:
    """Free cores and memory per node, from the offers the core holds."""

    __slots__ = (
        "avail",
        "cluster",
        "free",
        "free_mem",
        "free_units",
        "idle",
        "node_mode",
        "partial",
        "per_node",
    )

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.per_node = cluster.cores_per_node
        # With one core per node, "any free cores" and "whole idle nodes" coincide,
        # and the cheaper whole-node bookkeeping serves both.
        self.node_mode = cluster.allocation is Allocation.NODE or self.per_node == 1
        self.free = [0] * cluster.nodes
        """Free cores per node (core allocation only; node allocation uses idle/partial)."""
        self.idle: set[int] = set()
        """Node allocation: wholly free nodes."""
        self.partial: dict[int, int] = {}
        """Node allocation: free cores of nodes offered only in part (not usable yet)."""
        self.free_mem = [0] * cluster.nodes
        self.avail = SortedNodes()
        self.free_units = 0

    def free_cores(self, node: int) -> int:
        if self.node_mode:
            return self.per_node if node in self.idle else self.partial.get(node, 0)
        return self.free[node]

    # -- offers -----------------------------------------------------------
    def add(self, slots: Slots, memory: Sequence[int] | None = None) -> None:
        """Hold offered resources."""
        if memory is not None:
            free_mem = self.free_mem
            for (node, _), mem in zip(slots, memory, strict=True):
                free_mem[node] += mem
        if self.node_mode:
            self._add_nodes(slots)
            return
        free, per_node, added = self.free, self.per_node, []
        for node, cores in slots:
            before = free[node]
            if cores < 0 or before + cores > per_node:
                raise SchedulingError(f"offer of {cores} cores on node {node} exceeds its {per_node} cores")
            free[node] = before + cores
            self.free_units += cores
            if before == 0 and cores:
                added.append(node)
        self.avail.add(added)

    def remove(self, slots: Slots, memory: Sequence[int] | None = None) -> None:
        """Give up resources: taken by a launch, or rescinded by the backend."""
        if memory is not None:
            free_mem = self.free_mem
            for (node, _), mem in zip(slots, memory, strict=True):
                free_mem[node] -= mem
        if self.node_mode:
            self._remove_nodes(slots)
            return
        free, gone = self.free, []
        for node, cores in slots:
            before = free[node]
            if cores > before:
                raise SchedulingError(f"node {node} has {before} free cores, cannot take {cores}")
            free[node] = before - cores
            self.free_units -= cores
            if before == cores and cores:
                gone.append(node)
        self.avail.remove(gone)

    def _add_nodes(self, slots: Slots) -> None:
        # Whole nodes are the common case: set and list operations run in C.
        nodes = list(map(_node_of, slots))
        if not _whole(slots, self.per_node):
            nodes = [node for node, cores in slots if self._add_part(node, cores)]
        idle = self.idle
        before = len(idle)
        idle.update(nodes)
        if len(idle) != before + len(nodes):
            raise SchedulingError(f"offer of nodes already held: {sorted(set(nodes) & idle)[:5]}")
        self.free_units += len(nodes)
        self.avail.add(nodes)

    def _add_part(self, node: int, cores: int) -> bool:
        """Add part of a node; True when that makes it whole."""
        have = self.per_node if node in self.idle else self.partial.get(node, 0)
        if cores == 0:
            return False  # memory only
        if cores < 0 or have + cores > self.per_node:
            raise SchedulingError(f"offer of {cores} cores on node {node} exceeds its {self.per_node} cores")
        if have + cores == self.per_node:
            self.partial.pop(node, None)
            return True
        self.partial[node] = have + cores
        return False

    def _remove_nodes(self, slots: Slots) -> None:
        nodes = list(map(_node_of, slots))
        if not _whole(slots, self.per_node):
            nodes = [node for node, cores in slots if self._remove_part(node, cores)]
        idle = self.idle
        before = len(idle)
        idle.difference_update(nodes)
        k = len(nodes)
        if len(idle) != before - k:
            raise SchedulingError(f"nodes taken that are not idle: {sorted(set(nodes) - idle)[:5]}")
        self.free_units -= k
        self.avail.remove(nodes)

    def _remove_part(self, node: int, cores: int) -> bool:
        """Take part of a node; True when it was whole (it leaves the idle set)."""
        if cores == 0:
            return False  # memory only
        if node in self.idle:
            if cores < self.per_node:
                self.partial[node] = self.per_node - cores
            return True
        have = self.partial.get(node, 0)
        if cores > have:
            raise SchedulingError(f"node {node} has {have} free cores, cannot take {cores}")
        if have == cores:
            del self.partial[node]
        else:
            self.partial[node] = have - cores
        return False

    def take_memory(self, nodes: Sequence[int], memory: Sequence[int]) -> bool:
        """Reserve memory (MiB) on nodes for a guest sharing another job's cores.

        All or nothing: False, and nothing taken, if any node lacks it. Memory is
        never oversubscribed, whatever happens to CPU.
        """
        free_mem = self.free_mem
        if any(free_mem[node] < mib for node, mib in zip(nodes, memory, strict=True)):
            return False
        for node, mib in zip(nodes, memory, strict=True):
            free_mem[node] -= mib
        return True

    def give_memory(self, nodes: Sequence[int], memory: Sequence[int]) -> None:
        for node, mib in zip(nodes, memory, strict=True):
            self.free_mem[node] += mib

    # -- placement ----------------------------------------------------------
    def first_fit(self, job: Job) -> Slots | None:
        """The lowest-numbered nodes that hold the job's whole gang, or None.

        Pure: the pool is not changed; the core commits the slots with `remove`.
        """
        need = job.need
        if need > self.free_units:
            return None
        if not job.span and not self.node_mode:
            return self._first_node(job)
        if job.memory and self.cluster.memory_per_node:
            return self._first_fit_with_memory(job)
        if self.node_mode:
            per_node = self.per_node
            return tuple([(node, per_node) for node in self.avail.first(need)])
        free, slots = self.free, []
        for node in self.avail:
            f = free[node]
            if f >= need:
                slots.append((node, need))
                return tuple(slots)
            slots.append((node, f))
            need -= f
        return None  # unreachable while free_units is consistent

    def _first_node(self, job: Job) -> Slots | None:
        """The lowest-numbered node that holds the whole job (a job that may not span nodes)."""
        need, free, free_mem = job.need, self.free, self.free_mem
        memory = need * job.memory if job.memory and self.cluster.memory_per_node else 0
        for node in self.avail:
            if free[node] >= need and free_mem[node] >= memory:
                return ((node, need),)
        return None

    def _first_fit_with_memory(self, job: Job) -> Slots | None:
        per_core = job.memory
        need, slots = job.need, []
        if self.node_mode:
            cores = min(job.cores, self.per_node) if self.cluster.allocation is Allocation.NODE else 1
            for node in self.avail:
                if self.free_mem[node] >= cores * per_core:
                    slots.append((node, self.per_node))
                    if len(slots) == need:
                        return tuple(slots)
            return None
        for node in self.avail:
            take = min(self.free[node], self.free_mem[node] // per_core, need)
            if take > 0:
                slots.append((node, take))
                need -= take
                if need == 0:
                    return tuple(slots)
        return None


def _whole(slots: Slots, per_node: int) -> bool:
    """Whether every slot is a whole node: the common case, told apart in C without building a set."""
    return countOf(map(_cores_of, slots), per_node) == len(slots)


def slot_memory(cluster: Cluster, job: Job, slots: Slots) -> tuple[int, ...] | None:
    """MiB a job holds on each of its slots, or None when memory is not tracked.

    Memory is per core; under node allocation a job holds what its share of
    cores on each node needs.
    """
    if not (job.memory and cluster.memory_per_node):
        return None
    if cluster.allocation is Allocation.NODE:
        per_node = min(job.cores, cluster.cores_per_node) * job.memory
        return tuple(per_node for _ in slots)
    return tuple(cores * job.memory for _, cores in slots)

"""A fat-tree network and what a job's placement on it costs in communication hops.

The NSA paper (`nsa-topology-aware-allocation.txt`, Section III-A) measures inter-job
network interference by the *communication-hop* (CH) cost of a job's nodes: two nodes under
the same leaf switch are 2 hops apart, two in the same pod 4, two in different pods 6, and

    C(N_j) = (1 / n_j) * sum over ordered pairs i != k of N_j of c * h(i, k)       (eq. 1)

A k-ary fat-tree has k/2 nodes per leaf switch and k/2 leaf switches per pod; a real machine
is a pruned one (fewer pods than k), so the tree is given by those two numbers and the
cluster's node count. Nodes are numbered left to right, so a leaf's nodes, and a pod's, are
consecutive ids: the order the paper's continuity strategies walk.

Under core allocation a job's ranks may share nodes: the free sequence then holds a node once
per free core, and two ranks on one node are 0 hops apart (shared memory), so with one rank
per node the cost is eq. (1) exactly.

The cost is computed by counting, not over pairs: with m_s a job's nodes under leaf s and
m_p under pod p, the same-leaf ordered pairs are sum m_s(m_s - 1), the same-pod ones
sum m_p(m_p - 1) less those, and the rest cross pods. `Window` keeps those sums for a run of
nodes that slides along the free-node sequence, so the cheapest run for a job is found in one
pass over the free nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cosched.errors import ConfigError

HOPS_SWITCH, HOPS_POD, HOPS_CROSS = 2, 4, 6
"""Hops between two nodes under one leaf switch, in one pod, and in different pods."""


@dataclass(frozen=True, slots=True)
class FatTree:
    """`nodes` nodes, `per_switch` under each leaf switch, `switches` leaf switches per pod."""

    nodes: int
    per_switch: int
    switches: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.per_switch < 1 or self.switches < 1:
            raise ConfigError(
                f"a fat-tree needs nodes, nodes per switch and switches per pod >= 1, "
                f"got {self.nodes}, {self.per_switch}, {self.switches}"
            )

    @classmethod
    def k_ary(cls, nodes: int, radix: int) -> FatTree:
        """The k-ary fat-tree of switches with `radix` ports, pruned to `nodes` nodes."""
        if radix < 2 or radix % 2:
            raise ConfigError(f"a k-ary fat-tree needs an even radix >= 2, got {radix}")
        return cls(nodes, radix // 2, radix // 2)

    @property
    def per_pod(self) -> int:
        return self.per_switch * self.switches

    def switch_of(self, node: int) -> int:
        return node // self.per_switch

    def pod_of(self, node: int) -> int:
        return node // self.per_pod

    def hops(self, a: int, b: int) -> int:
        """Hops between two distinct nodes."""
        if a // self.per_switch == b // self.per_switch:
            return HOPS_SWITCH
        return HOPS_POD if a // self.per_pod == b // self.per_pod else HOPS_CROSS

    def cost(self, nodes: Iterable[int], hop_cost: float = 1.0) -> float:
        """Eq. (1): the job's CH cost with one rank on each of these nodes (a node named k
        times holds k ranks); 0 on one node."""
        window = Window(self)
        for node in nodes:
            window.add(node)
        return window.cost(hop_cost)

    def slots_cost(self, slots: Sequence[tuple[int, int]], ranks_per_core: bool, hop_cost: float = 1.0) -> float:
        """The CH cost of a job's slots: one rank per node it holds (whole-node allocation), or
        one per core (`ranks_per_core`: core allocation, where a job's cores are its ranks)."""
        if ranks_per_core:
            return self.cost((node for node, cores in slots for _ in range(cores)), hop_cost)
        return self.cost((node for node, _ in slots), hop_cost)


class Window:
    """The nodes of one job (or of a run of free nodes), with the pair sums eq. (1) needs.

    Adding a node under a leaf that already holds m of them adds 2m ordered same-leaf pairs;
    removing one takes them away again. Both are O(1), so a run sliding along the free nodes
    is re-costed in constant time per step.
    """

    __slots__ = ("by_node", "by_pod", "by_switch", "n", "same_node", "same_pod", "same_switch", "tree")

    def __init__(self, tree: FatTree) -> None:
        self.tree = tree
        self.by_node: dict[int, int] = {}
        self.by_switch: dict[int, int] = {}
        self.by_pod: dict[int, int] = {}
        self.n = 0
        self.same_node = 0
        """Ordered pairs of ranks on one node (0 hops; none when each node holds one rank)."""
        self.same_switch = 0
        """Ordered pairs of ranks under one leaf switch (same-node pairs included)."""
        self.same_pod = 0
        """Ordered pairs of ranks in one pod (same-switch pairs included)."""

    def add(self, node: int) -> None:
        tree = self.tree
        s, p = node // tree.per_switch, node // tree.per_pod
        m = self.by_node.get(node, 0)
        self.by_node[node] = m + 1
        self.same_node += 2 * m
        m = self.by_switch.get(s, 0)
        self.by_switch[s] = m + 1
        self.same_switch += 2 * m
        m = self.by_pod.get(p, 0)
        self.by_pod[p] = m + 1
        self.same_pod += 2 * m
        self.n += 1

    def remove(self, node: int) -> None:
        tree = self.tree
        s, p = node // tree.per_switch, node // tree.per_pod
        m = self.by_node[node] - 1
        self.by_node[node] = m
        self.same_node -= 2 * m
        m = self.by_switch[s] - 1
        self.by_switch[s] = m
        self.same_switch -= 2 * m
        m = self.by_pod[p] - 1
        self.by_pod[p] = m
        self.same_pod -= 2 * m
        self.n -= 1

    def cost(self, hop_cost: float = 1.0) -> float:
        n = self.n
        if n < 2:
            return 0.0
        cross = n * (n - 1) - self.same_pod
        pod_only = self.same_pod - self.same_switch
        switch_only = self.same_switch - self.same_node
        hops = HOPS_SWITCH * switch_only + HOPS_POD * pod_only + HOPS_CROSS * cross
        return hop_cost * hops / n


def contiguous(free: Sequence[int], start: int, n: int) -> list[int]:
    """The paper's continuity rule: `n` nodes of the free-node sequence from position `start`,
    taking the rest from the sequence's head when it runs out."""
    size = len(free)
    if not 0 <= start < size or n > size:
        raise ValueError(f"{n} nodes from position {start} of {size} free nodes")
    end = start + n
    if end <= size:
        return list(free[start:end])
    return list(free[start:]) + list(free[: end - size])


def run_costs(tree: FatTree, free: Sequence[int], n: int, hop_cost: float = 1.0) -> list[float]:
    """The CH cost of `contiguous(free, p, n)` for every start position p, in one pass."""
    size = len(free)
    if n > size or n < 1:
        return []
    window = Window(tree)
    for node in free[:n]:
        window.add(node)
    costs = [window.cost(hop_cost)]
    for p in range(1, size):
        window.remove(free[p - 1])
        window.add(free[(p + n - 1) % size])
        costs.append(window.cost(hop_cost))
    return costs

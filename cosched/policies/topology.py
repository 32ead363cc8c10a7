"""Topology-aware placement on a fat-tree (the NSA paper, `nsa-topology-aware-allocation.txt`).

Inter-job network interference is cut by keeping each job's nodes close: under one leaf
switch, else in one pod. The paper's *continuity* rule keeps the search small: the free
nodes, in id order (so switch by switch), form a sequence Q, and a job is given the n nodes
of Q from a chosen start position on (wrapping to Q's head). Under the dynamic strategy
(DCAS) the nodes a job takes leave Q before the next job is placed.

- `contiguous` places each job alone at the start position with the lowest communication-hop
  (CH) cost: the greedy repair of the paper, and what a per-job scheduler can do.
- `sa` is the paper's window-based allocation: starts are collected for `period` seconds
  (the core serves the queue only at window boundaries), then the jobs started together are
  re-placed jointly by simulated annealing (Algorithm 1): remove 1..`remove` jobs, re-insert
  them largest first at random start positions, keep the result by the Metropolis rule.
- `nsa` (`cosched.policies.nsa`) is the same search with a learned repair: a policy network
  picks each start position.

Which jobs start, and when, stays the queue and backfill policies' decision: under whole-node
allocation a job fits wherever enough nodes are free, so placing the window's jobs jointly
after the pass changes where they run, never whether. Where that does not hold (cores of
shared nodes, per-node memory, a cluster without a topology) these policies place first-fit.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import ClassVar

from cosched.core.events import Slots
from cosched.core.pool import ResourcePool, slot_memory
from cosched.core.topology import FatTree, contiguous, run_costs
from cosched.errors import ConfigError
from cosched.model import Job
from cosched.policies.base import PlacementPolicy
from cosched.policies.options import parse_options


def free_sequence(pool: ResourcePool) -> list[int]:
    """The free sequence Q in id order: each idle node once (whole-node allocation), or each
    node once per free core (core allocation, where a job's cores are its ranks)."""
    if pool.node_mode:
        return list(pool.avail)
    free = pool.free
    return [node for node in pool.avail for _ in range(free[node])]


def topology_applies(pool: ResourcePool, job: Job) -> FatTree | None:
    """The cluster's fat-tree, when the job's ranks may be spread as the continuity rule says
    (a job kept on one node has no network traffic to place)."""
    tree = pool.cluster.topology
    if tree is None or (not job.span and not pool.node_mode):
        return None
    return tree


def as_slots(nodes: Sequence[int], pool: ResourcePool) -> Slots:
    """A run of the free sequence as slots: whole nodes, or cores counted per node."""
    if pool.node_mode:
        per_node = pool.per_node
        return tuple((node, per_node) for node in sorted(nodes))
    return tuple(sorted(Counter(nodes).items()))


def memory_fits(pool: ResourcePool, placed: Sequence[tuple[Job, Slots]]) -> bool:
    """Whether the nodes have the memory these jobs' slots need, all together."""
    cluster = pool.cluster
    need: dict[int, int] = {}
    for job, slots in placed:
        memory = slot_memory(cluster, job, slots)
        if memory is not None:
            for (node, _), mib in zip(slots, memory, strict=True):
                need[node] = need.get(node, 0) + mib
    return all(pool.free_mem[node] >= mib for node, mib in need.items())


def place_contiguous(job: Job, pool: ResourcePool) -> Slots | None:
    """The job alone, at the contiguous run of the free sequence with the lowest CH cost that
    has the memory it needs (first-fit where the topology says nothing)."""
    tree = topology_applies(pool, job)
    if tree is None or job.need < 2:
        return pool.first_fit(job)
    if job.need > pool.free_units:
        return None
    free = free_sequence(pool)
    n = job.need
    costs = run_costs(tree, free, n)
    for start in sorted(range(len(costs)), key=costs.__getitem__):
        slots = as_slots(contiguous(free, start, n), pool)
        if memory_fits(pool, [(job, slots)]):
            return slots
    return pool.first_fit(job)


class Contiguous(PlacementPolicy):
    """Each job at the contiguous run of free nodes with the lowest CH cost."""

    name = "contiguous"

    def place(self, job: Job, pool: ResourcePool) -> Slots | None:
        return place_contiguous(job, pool)


MAX_ITERATIONS = 10**6
"""SA moves per window at most: the paper's 500 run in milliseconds, 10^6 in minutes per window."""
MAX_PERIOD = 86400.0
"""The longest window, in seconds (a day): one longer only holds every start back that long, and
an infinite one would never serve the queue."""


class Annealing(PlacementPolicy):
    """The window's starts re-placed jointly by simulated annealing (the paper's SA)."""

    name = "sa"
    joint = True
    OPTIONS: ClassVar[dict[str, type]] = {"iterations": int, "period": float, "remove": int, "seed": int}

    def __init__(
        self,
        argument: str | None = None,
        *,
        iterations: int = 500,
        period: float = 60.0,
        remove: int = 2,
        t_max: float = 2500.0,
        t_min: float = 2.5,
        hop_cost: float = 1000.0,
        seed: int = 0,
    ) -> None:
        given = parse_options(argument, self.OPTIONS, "iterations")
        self.iterations = int(given.get("iterations", iterations))  # type: ignore[call-overload]
        self.period = float(given.get("period", period))  # type: ignore[arg-type]
        self.remove = int(given.get("remove", remove))  # type: ignore[call-overload]
        seed = int(given.get("seed", seed))  # type: ignore[call-overload]
        # `not 0 <= x`, not `x < 0`: NaN compares false both ways and must be refused too.
        if not 0 <= self.iterations <= MAX_ITERATIONS or not 0 <= self.period <= MAX_PERIOD or self.remove < 1:
            raise ConfigError(
                f"{self.name}: need iterations in [0, {MAX_ITERATIONS:,}], period in [0, {MAX_PERIOD:g}] s and "
                f"remove >= 1, got {self.iterations}, {self.period}, {self.remove}"
            )
        if not 0 < t_min <= t_max:
            raise ConfigError(f"{self.name}: need 0 < t_min <= t_max, got {t_min} and {t_max}")
        self.t_max, self.t_min, self.hop_cost = t_max, t_min, hop_cost
        self.seed = seed
        self.rng = random.Random(seed)  # drawn from anew for each window (`arrange`), or from here by `search` alone
        self.searched = 0
        """Windows re-placed by the search (more than one multi-node job started together)."""
        self.improved = 0
        """Of those, windows where the search beat the placement it started from."""

    def place(self, job: Job, pool: ResourcePool) -> Slots | None:
        """The initial solution: each job as `contiguous` places it, in the order they start."""
        return place_contiguous(job, pool)

    def arrange(self, jobs: Sequence[Job], pool: ResourcePool) -> list[Slots] | None:
        """New slots for `jobs` (all started in this window; their slots are back in `pool`),
        or None to keep the ones they have."""
        tree = pool.cluster.topology
        movable = [j for j in jobs if j.need >= 2 and topology_applies(pool, j) is not None]
        if tree is None or len(movable) < 2:
            return None
        moving = {job.id for job in movable}
        # Each window draws from its own generator, made from the seed and the window's jobs: the
        # same draws in replay, in the daemon and after a restart, which makes the policy anew (one
        # generator drawn from window after window began again from the seed at each restart).
        self.rng.seed(f"{self.seed}:" + ",".join(str(job.id) for job in jobs))
        # The search works on the free sequence less what the jobs it leaves alone hold.
        free = _without(
            free_sequence(pool), [n for job in jobs if job.id not in moving for n in _ranks(job.slots, pool)]
        )
        start = [_ranks(job.slots, pool) for job in movable]
        best = self.search(tree, free, [job.need for job in movable], start)
        self.searched += 1
        if best is None:
            return None
        new = {job.id: as_slots(nodes, pool) for job, nodes in zip(movable, best, strict=True)}
        arranged = [new.get(job.id, job.slots) for job in jobs]
        if not memory_fits(pool, list(zip(jobs, arranged, strict=True))):
            return None
        self.improved += 1
        return arranged

    # -- Algorithm 1 ----------------------------------------------------------
    def search(
        self, tree: FatTree, free: Sequence[int], sizes: Sequence[int], initial: list[list[int]]
    ) -> list[list[int]] | None:
        """The best assignment found from `initial` (each job's nodes, all within `free`), or
        None when nothing beat it."""
        cost_of = tree.cost
        hop_cost = self.hop_cost
        distinct = len(set(free)) == len(free)  # each node once: whole-node allocation
        current = [list(nodes) for nodes in initial]
        costs = [cost_of(nodes, hop_cost) for nodes in current]
        total = best_total = start_total = sum(costs)
        best: list[list[int]] | None = None
        k = len(sizes)
        rate = -math.log(self.t_max / self.t_min)
        t_max, iterations, rng = self.t_max, max(self.iterations, 1), self.rng
        for t in range(self.iterations):
            temperature = t_max * math.exp(rate * t / iterations)
            removed = rng.sample(range(k), rng.randint(1, min(self.remove, k)))
            queue = _without(free, [node for j in range(k) if j not in removed for node in current[j]], distinct)
            removed.sort(key=lambda j: -sizes[j])  # the paper's repair order: largest first
            repaired = self.repair(tree, queue, [sizes[j] for j in removed], distinct)
            new_costs = [cost_of(nodes, hop_cost) for nodes in repaired]
            delta = sum(new_costs) - sum(costs[j] for j in removed)
            if delta < 0 or rng.random() < math.exp(-delta / temperature):
                for j, nodes, c in zip(removed, repaired, new_costs, strict=True):
                    current[j], costs[j] = nodes, c
                total += delta
                if total < best_total - 1e-9:
                    best_total, best = total, [list(nodes) for nodes in current]
        return best if best is not None and best_total < start_total - 1e-9 else None

    def repair(self, tree: FatTree, queue: list[int], sizes: Sequence[int], distinct: bool) -> list[list[int]]:
        """Re-insert jobs of these sizes, in this order, into the free sequence `queue` (DCAS:
        each one's nodes leave it before the next; `distinct`: no node repeats in it); SA picks
        each start at random."""
        placed = []
        for i, n in enumerate(sizes):
            start = self.choose_start(tree, queue, n, sizes[i + 1 :])
            nodes = contiguous(queue, start, n)
            queue = _without(queue, nodes, distinct)
            placed.append(nodes)
        return placed

    def choose_start(self, tree: FatTree, queue: Sequence[int], n: int, later: Sequence[int]) -> int:
        """The start position for a job of `n` nodes in `queue`, before jobs of sizes `later`
        are re-inserted (SA: uniform at random)."""
        return self.rng.randrange(len(queue))


def _ranks(slots: Slots, pool: ResourcePool) -> list[int]:
    """Slots as entries of the free sequence: a node once, or once per core."""
    if pool.node_mode:
        return [node for node, _ in slots]
    return [node for node, cores in slots for _ in range(cores)]


def _without(sequence: Sequence[int], taken: Sequence[int], distinct: bool = False) -> list[int]:
    """`sequence` less one entry for each of `taken` (a multiset difference, order kept). The
    search calls it at every move: a set does when no node repeats (`distinct`), as under
    whole-node allocation."""
    if not taken:
        return list(sequence)
    if distinct:
        gone = set(taken)
        return [node for node in sequence if node not in gone]
    left = Counter(taken)
    kept = []
    for node in sequence:
        if left[node] > 0:
            left[node] -= 1
        else:
            kept.append(node)
    return kept

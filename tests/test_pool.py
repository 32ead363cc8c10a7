"""The resource pool: held offers, gang first-fit, and its refusals."""

from __future__ import annotations

import random

import pytest

from cosched.core import sorted_nodes
from cosched.core.pool import ResourcePool, slot_memory
from cosched.core.sorted_nodes import SortedNodes
from cosched.errors import SchedulingError
from cosched.model import Allocation, Cluster, Job
from cosched.replay.driver import replay
from workloads.lublin import generate


def job(cores: int, *, need: int | None = None, memory: int = 0, nodes: int = 0) -> Job:
    j = Job(id=1, submit=0.0, cores=cores, walltime=10.0, memory=memory, nodes=nodes)
    j.need = need if need is not None else cores
    return j


def full_pool(cluster: Cluster) -> ResourcePool:
    pool = ResourcePool(cluster)
    memory = [cluster.memory_per_node] * cluster.nodes if cluster.memory_per_node else None
    pool.add(tuple((n, cluster.cores_per_node) for n in range(cluster.nodes)), memory)
    return pool


def test_core_allocation_gang_spans_nodes_lowest_first() -> None:
    pool = full_pool(Cluster(nodes=3, cores_per_node=4))
    assert pool.free_units == 12
    slots = pool.first_fit(job(6))
    assert slots == ((0, 4), (1, 2))
    pool.remove(slots)
    assert pool.free_units == 6
    assert list(pool.avail) == [1, 2]  # node 0 is full, node 1 keeps 2 cores
    assert pool.first_fit(job(3)) == ((1, 2), (2, 1))
    assert pool.first_fit(job(7)) is None  # only 6 free: the gang never launches in part


def test_first_fit_is_pure() -> None:
    pool = full_pool(Cluster(nodes=2, cores_per_node=2))
    pool.first_fit(job(3))
    assert pool.free_units == 4 and pool.free == [2, 2]


def test_node_allocation_takes_whole_nodes() -> None:
    cluster = Cluster(nodes=4, cores_per_node=8, allocation=Allocation.NODE)
    pool = full_pool(cluster)
    big = job(9, need=cluster.units_for(job(9)))
    assert big.need == 2  # ceil(9 / 8)
    slots = pool.first_fit(big)
    assert slots == ((0, 8), (1, 8))
    pool.remove(slots)
    assert pool.free_units == 2 and list(pool.avail) == [2, 3]
    pool.add(((1, 8),))
    assert list(pool.avail) == [1, 2, 3] and pool.free_cores(1) == 8 and pool.free_cores(0) == 0


def test_partial_offer_in_node_mode_is_not_usable_until_whole() -> None:
    pool = ResourcePool(Cluster(nodes=2, cores_per_node=4, allocation=Allocation.NODE))
    pool.add(((0, 2),))
    assert pool.free_units == 0 and pool.free_cores(0) == 2
    pool.add(((0, 2), (1, 4)))
    assert pool.free_units == 2 and list(pool.avail) == [0, 1]


def test_double_offer_and_overdraw_are_errors() -> None:
    pool = full_pool(Cluster(nodes=2, cores_per_node=1))
    with pytest.raises(SchedulingError, match="already held"):
        pool.add(((1, 1),))
    pool.remove(((0, 1),))
    with pytest.raises(SchedulingError, match="not idle"):
        pool.remove(((0, 1),))
    core = full_pool(Cluster(nodes=1, cores_per_node=4))
    with pytest.raises(SchedulingError, match="exceeds"):
        core.add(((0, 1),))
    with pytest.raises(SchedulingError, match="cannot take 5"):
        core.remove(((0, 5),))


def test_memory_limits_first_fit_per_node() -> None:
    cluster = Cluster(nodes=2, cores_per_node=4, memory_per_node=1000)
    pool = full_pool(cluster)
    hungry = job(4, memory=400)  # 400 MiB per core: at most 2 cores on a 1000 MiB node
    slots = pool.first_fit(hungry)
    assert slots == ((0, 2), (1, 2))
    assert slot_memory(cluster, hungry, slots) == (800, 800)
    pool.remove(slots, slot_memory(cluster, hungry, slots))
    assert pool.free_mem == [200, 200]
    assert pool.first_fit(job(1, memory=300)) is None  # cores are free, memory is not
    assert pool.first_fit(job(2, memory=100)) == ((0, 2),)


# --------------------------------------------------------------------------- cost per job, flat in machine size


def test_sorted_nodes_agrees_with_a_sorted_list() -> None:
    rng = random.Random(7)
    nodes, model = SortedNodes(range(0, 5000, 2)), set(range(0, 5000, 2))
    for _ in range(400):
        if rng.random() < 0.5 and model:
            gone = rng.sample(sorted(model), min(len(model), rng.randint(1, 300)))
            if rng.random() < 0.3:
                gone = sorted(model)[: len(gone)]  # first fit's prefix
            nodes.remove(gone)
            model -= set(gone)
        else:
            new = rng.sample(sorted(set(range(6000)) - model), rng.randint(1, 300))
            nodes.add(new)
            model |= set(new)
        assert list(nodes) == sorted(model) and len(nodes) == len(model)
        k = rng.randint(0, 700)
        assert nodes.first(k) == sorted(model)[:k]


def test_a_job_end_touches_only_the_buckets_of_its_nodes() -> None:
    """The old pool re-sorted every free node at each end: 80x slower per job on 256,000 cores than on 256.

    Here ending a job on a million-node machine rebuilds at most the buckets its nodes fall in;
    every other bucket is the very same list, untouched.
    """
    nodes = SortedNodes(range(1_000_000))
    assert nodes.buckets >= 1_000_000 // sorted_nodes._SPLIT
    nodes.remove(nodes.first(300))  # first fit takes a prefix
    before = [id(b) for b in nodes._buckets]
    job = [999_998, *range(600_000, 600_040)]  # nodes come back in any order
    homes = {i for i, bucket in enumerate(nodes._buckets) if set(bucket) & set(job)}
    nodes.remove(job)
    nodes.add(job)
    after = [id(b) for b in nodes._buckets]
    assert len(after) == len(before)
    assert {i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b} <= homes
    assert max(len(b) for b in nodes._buckets) <= sorted_nodes._SPLIT


@pytest.mark.parametrize("procs", [64, 640_000])
def test_a_finished_job_holds_no_memory_per_node_it_used(procs: int) -> None:
    """Finished jobs kept one slot entry per core (1.8 GB for CEA-Curie's 296k jobs); studies clear them."""
    trace = generate(300, 64, seed=3)
    run = replay(trace.jobs(), trace.cluster(procs=procs), keep_slots=False)
    assert len(run.jobs) == 300 and all(j.slots == () for j in run.jobs)
    assert max(len(b) for b in run.core.pool.avail._buckets) <= sorted_nodes._SPLIT  # type: ignore[union-attr]
    kept = replay(trace.jobs(), trace.cluster(procs=procs))
    assert sum(len(j.slots) for j in kept.jobs) == sum(j.cores for j in kept.jobs)  # one-core nodes


def test_a_job_that_may_not_span_nodes_takes_one_node_or_waits() -> None:
    pool = full_pool(Cluster(nodes=3, cores_per_node=4, memory_per_node=1000))
    pool.remove(((0, 3), (1, 1)), (0, 0))
    whole = job(3, memory=300)
    whole.span = False
    assert pool.first_fit(whole) == ((1, 3),)  # not (0, 1) + (1, 2), which first fit takes when it may span
    whole.span = True
    assert pool.first_fit(whole) == ((0, 1), (1, 2))
    whole.span = False
    pool.remove(((1, 3), (2, 2)), (0, 800))
    assert pool.first_fit(whole) is None  # node 2 has 2 cores free; 3 free cores in all are not enough

"""The NSA paper's setting in replay: a 1,000-node pruned fat-tree and jobs of 1 to 40 nodes.

Section VI-A: a pruned fat-tree of radix k = 20 (10 nodes per leaf switch, 10 leaf switches
per pod, so 10 pods), jobs asking U[1, 40] nodes for U[10, 1800] s, one hop costing
c = 1000, decisions every tau = 60 s. The paper gives no arrival rate; here jobs arrive as a
Poisson process offering `load` times the machine's node-seconds, so the queue neither
empties nor grows without end. The user's estimate is the runtime (the paper models none).

`record_windows` replays such a workload under a joint placement and keeps every window it
re-placed (the free nodes, the jobs' sizes and the placement the search started from): the
instances of Table III, taken from the replay core rather than from a generator of its own,
so the search is compared, and the learned repair trained, on what the scheduler meets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cosched.core.pool import ResourcePool
from cosched.core.topology import FatTree
from cosched.model import Allocation, Cluster, Job
from cosched.policies.topology import Annealing
from cosched.replay.driver import PolicySet, replay

NODES = 1000
RADIX = 20
MAX_NODES = 40
RUNTIME = (10.0, 1800.0)
HOP_COST = 1000.0
PERIOD = 60.0
LOAD = 0.9


def paper_cluster(nodes: int = NODES, radix: int = RADIX) -> Cluster:
    """Whole nodes on a k-ary fat-tree pruned to `nodes` nodes."""
    return Cluster(
        nodes,
        1,
        allocation=Allocation.NODE,
        name=f"fat-tree k={radix}",
        nodes_per_switch=radix // 2,
        switches_per_pod=radix // 2,
    )


def paper_jobs(count: int, seed: int, *, nodes: int = NODES, load: float = LOAD, smallest: int = 1) -> list[Job]:
    """`count` jobs of U[smallest, 40] nodes and U[10, 1800] s, Poisson arrivals at `load`."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(smallest, MAX_NODES + 1, size=count)
    runtimes = rng.uniform(*RUNTIME, size=count)
    mean_work = (smallest + MAX_NODES) / 2 * sum(RUNTIME) / 2
    gaps = rng.exponential(mean_work / (nodes * load), size=count)
    submits = np.cumsum(gaps)
    return [
        Job(
            i,
            float(submits[i]),
            int(sizes[i]),
            walltime=float(runtimes[i]),
            runtime=float(runtimes[i]),
            nodes=int(sizes[i]),
        )
        for i in range(count)
    ]


@dataclass(frozen=True, slots=True)
class Window:
    """One re-placement the search faced: the free-node sequence Q, the sizes of the window's
    multi-node jobs, and the nodes each was given before the search (their own placement)."""

    free: tuple[int, ...]
    sizes: tuple[int, ...]
    initial: tuple[tuple[int, ...], ...]


class _Recorder(Annealing):
    """`sa` with no search: it keeps every window it is handed, and places as `contiguous`."""

    def __init__(self, period: float) -> None:
        super().__init__(iterations=0, period=period)
        self.windows: list[Window] = []

    def arrange(self, jobs: Sequence[Job], pool: ResourcePool) -> None:
        movable = [job for job in jobs if job.need >= 2]
        if len(movable) >= 2:
            self.windows.append(
                Window(
                    tuple(pool.avail),
                    tuple(job.need for job in movable),
                    tuple(tuple(node for node, _ in job.slots) for job in movable),
                )
            )


def record_windows(
    count: int, seed: int, *, period: float = PERIOD, queue: str = "fcfs", backfill: str = "easy"
) -> tuple[FatTree, list[Window]]:
    """Replay `count` of the paper's jobs and return the windows a joint placement would search."""
    cluster = paper_cluster()
    recorder = _Recorder(period)
    replay(paper_jobs(count, seed), cluster, PolicySet(queue, backfill, placement=recorder))
    tree = cluster.topology
    assert tree is not None
    return tree, recorder.windows


@dataclass(frozen=True, slots=True)
class PlacementRow:
    """One placement's replay of the paper's workload: Fig. 6's two axes, and its cost to run."""

    placement: str
    period: float
    mean_ch: float
    """Mean CH cost per job, c = 1000 (the paper's scale)."""
    mean_wait: float
    seconds: float


def compare_placements(
    count: int = 3000,
    seed: int = 11,
    *,
    periods: Sequence[float] = (10, 20, 30, 40, 50, 60),
    iterations: int = 500,
    learned: bool = True,
) -> list[PlacementRow]:
    """The NSA paper's Fig. 6 in replay: per-job placement (first-fit, the continuity rule's
    cheapest run) against window-based joint placement (`sa` for each window length, and `nsa`
    with the shipped model at the paper's 60 s when `learned`), all on the same jobs under
    FCFS + EASY."""
    cluster = paper_cluster()
    tree = cluster.topology
    assert tree is not None
    setups: list[tuple[str, float]] = [("first-fit", 0.0), ("contiguous", 0.0)]
    setups += [("sa", float(period)) for period in (0, *periods)]  # 0: each pass's starts, no wait added
    if learned:  # one window length: NSA's network makes a search several times SA's time
        setups.append(("nsa", PERIOD))
    rows = []
    for name, period in setups:
        spec = name if name in ("first-fit", "contiguous") else f"{name}:iterations={iterations},period={period:g}"
        result = replay(paper_jobs(count, seed), cluster, PolicySet("fcfs", "easy", placement=spec))
        jobs = result.jobs
        rows.append(
            PlacementRow(
                name,
                period,
                sum(tree.slots_cost(job.slots, False, HOP_COST) for job in jobs) / len(jobs),
                sum(job.wait for job in jobs) / len(jobs),
                result.seconds,
            )
        )
    return rows


def format_placements(rows: Sequence[PlacementRow]) -> str:
    from cosched.reporting.report import format_table

    table = [
        {
            "placement": row.placement,
            "window": f"{row.period:g} s"
            if row.period
            else "per pass"
            if row.placement in ("sa", "nsa")
            else "per job",
            "mean CH (c=1000)": round(row.mean_ch),
            "mean wait (s)": round(row.mean_wait, 1),
            "replay (s)": round(row.seconds, 1),
        }
        for row in rows
    ]
    return format_table(table)

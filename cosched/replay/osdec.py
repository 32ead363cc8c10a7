"""The OSDEC study in replay (`cosched experiment deferrable`): its heuristics compared on a
workload given start windows.

SWF traces carry no windows, so the study draws them (`Windows`), replays each queue/backfill
pair on the very same jobs through the validating core, and reports the paper's measures
(`measure`) with the cluster's.
"""

from __future__ import annotations

from collections.abc import Sequence

from cosched.replay.deferrable import W1, DeferrableSummary, Windows, measure
from cosched.replay.driver import PolicySet, replay
from cosched.replay.study import cluster_for, load_workload, split_pair
from cosched.reporting.report import format_table

DEFAULT_POLICIES = (
    "fcfs:easy",
    "osdec-fifo:none",
    "osdec-sjf:none",
    "osdec-tetris:none",
    "osdec-fifo:easy",
    "osdec-sjf:easy",
    "osdec-tetris:easy",
    "osdec:easy",
)
"""The heuristics, and the learned policy with its shipped model (`cosched.policies.osdec_learned`)."""


def run(
    workload: str,
    windows: Windows,
    policies: Sequence[str] = DEFAULT_POLICIES,
    *,
    seed: int = 1,
    w1: float = W1,
) -> list[tuple[str, DeferrableSummary]]:
    """Each `queue:backfill` pair on the same windowed jobs: [(label, summary)]."""
    trace = load_workload(workload, seed=seed)
    cluster = cluster_for(trace)
    base = windows.apply(trace.jobs())
    out = []
    for pair in policies:
        queue, backfill = split_pair(pair)
        result = replay(windows.apply(base), cluster, PolicySet(queue=queue, backfill=backfill), validate=True)
        out.append((pair, measure(result, w1)))
    return out


def table(rows: list[tuple[str, DeferrableSummary]]) -> str:
    """The paper's Table 1 columns (utilization, delay penalty, reward) with expiries and the cluster's."""
    return format_table(
        [
            {
                "policy": label,
                "deferrable": s.jobs,
                "expired": s.expired,
                "util(core-h)": f"{s.utilization:.1f}",
                "delay mean(h)": f"{s.delay_mean:.2f}",
                "delay p95(h)": f"{s.delay_p95:.2f}",
                "-w1*delay": f"{-W1 * s.delay_sum:.1f}",
                "reward": f"{s.reward:.1f}",
                "cluster util": f"{s.cluster_utilization:.3f}",
                "on-demand wait(h)": f"{s.ordinary_wait:.2f}",
            }
            for label, s in rows
        ]
    )

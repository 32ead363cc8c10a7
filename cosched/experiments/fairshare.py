"""Fair-share on a real trace (`cosched experiment fairshare`): who waits, by how much they used.

A trace's jobs carry their users' ids. The heaviest users (the tenth of users with the most
core-seconds in the whole workload) are the same set under every policy, so the table shows
what each policy takes from them and gives to everyone else, beside the means over jobs and
over users (`cosched.reporting.metrics.per_user_mean_wait`) that `cosched replay` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cosched.model import Job
from cosched.replay.driver import PolicySet, replay
from cosched.replay.study import cluster_for, load_workload, split_pair
from cosched.reporting.metrics import job_metrics, per_user_mean_wait
from cosched.reporting.report import format_table

DEFAULT_POLICIES = ("fcfs:easy", "fairshare:easy", "sjf:easy", "fcfs:conservative", "fairshare:conservative")
HEAVY = 0.1
"""The share of users, the heaviest by core-seconds, whose jobs are reported apart."""


@dataclass(frozen=True)
class UserWaits:
    """One policy pair's waits, in hours, over jobs and over users."""

    jobs: int
    users: int
    mean_wait: float
    user_mean_wait: float
    heavy_wait: float
    """Mean wait of the heaviest users' jobs."""
    others_wait: float
    """Mean wait of every other user's jobs."""
    mean_bsld: float


def heavy_users(jobs: Sequence[Job], share: float = HEAVY) -> set[int]:
    """The `share` of users (at least one) with the most core-seconds."""
    work: dict[int, float] = {}
    for job in jobs:
        work[job.user] = work.get(job.user, 0.0) + job.cores * (job.runtime or 0.0)
    ranked = sorted(work, key=lambda user: (-work[user], user))
    return set(ranked[: max(1, round(len(ranked) * share))])


def measure(jobs: Sequence[Job], heavy: set[int]) -> UserWaits:
    metrics = job_metrics(jobs)
    users, user_mean_wait = per_user_mean_wait(metrics)
    is_heavy = np.isin(metrics.user, sorted(heavy))
    hours = 3600.0
    return UserWaits(
        jobs=len(metrics),
        users=users,
        mean_wait=float(metrics.wait.mean()) / hours,
        user_mean_wait=user_mean_wait / hours,
        heavy_wait=float(metrics.wait[is_heavy].mean()) / hours if is_heavy.any() else 0.0,
        others_wait=float(metrics.wait[~is_heavy].mean()) / hours if (~is_heavy).any() else 0.0,
        mean_bsld=float(metrics.bsld.mean()),
    )


def describe(jobs: Sequence[Job], heavy: set[int]) -> str:
    """What sets the heaviest users' jobs apart: their share of the jobs and their runtimes."""
    theirs = [job.runtime or 0.0 for job in jobs if job.user in heavy]
    others = [job.runtime or 0.0 for job in jobs if job.user not in heavy]
    share = len(theirs) / len(jobs)
    mean = (sum(theirs) / len(theirs)) if theirs else 0.0
    rest = (sum(others) / len(others)) if others else 0.0
    return (
        f"the heaviest {len(heavy)} users: {share:.0%} of the jobs, mean runtime {mean:,.0f} s "
        f"(other users' jobs {rest:,.0f} s)"
    )


def run(workload: str, policies: Sequence[str] = DEFAULT_POLICIES) -> tuple[int, str, list[tuple[str, UserWaits]]]:
    """Each `queue:backfill` pair on the workload's jobs, through the validating core:
    (how many users count as heavy, what sets their jobs apart, [(pair, waits)])."""
    trace = load_workload(workload)
    cluster = cluster_for(trace)
    jobs = trace.jobs()
    heavy = heavy_users(jobs)
    out = []
    for pair in policies:
        queue, backfill = split_pair(pair)
        result = replay(trace.jobs(), cluster, PolicySet(queue=queue, backfill=backfill), validate=True)
        out.append((pair, measure(result.jobs, heavy)))
    return len(heavy), describe(jobs, heavy), out


def table(heavy: int, about: str, rows: Sequence[tuple[str, UserWaits]]) -> str:
    return (
        about
        + "\n"
        + format_table(
            [
                {
                    "policies": pair,
                    "jobs": w.jobs,
                    "users": w.users,
                    "mean wait h": round(w.mean_wait, 2),
                    "users' mean wait h": round(w.user_mean_wait, 2),
                    f"heaviest {heavy} users' jobs h": round(w.heavy_wait, 2),
                    "other users' jobs h": round(w.others_wait, 2),
                    "mean bsld": round(w.mean_bsld, 2),
                }
                for pair, w in rows
            ]
        )
    )

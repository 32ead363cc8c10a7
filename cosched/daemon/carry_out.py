"""Doing on the engine what a pass wrote: removals, quota changes, kills, launches.

Why its own module: the engine is slow (a container takes a few hundred
milliseconds to start) and can go away at any call. Each step's calls run side
by side on the bounded pool (`engine_calls`), outside `lock`; `lock` is taken
only to note the containers that started, and what did start is recorded even
when the engine is lost in the middle of a step. A lost engine is raised
(`EngineUnavailable`) for the caller to mark (`engine_faults.lost`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cosched.daemon.accounts import account_of
from cosched.daemon.backend import RunLost
from cosched.daemon.docker_backend import EngineUnavailable, QuotaMismatch
from cosched.daemon.engine_calls import raise_failures
from cosched.model import Job

if TYPE_CHECKING:
    from cosched.daemon.ends import End
    from cosched.daemon.plan import Plan
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")


def carry_out(daemon: Daemon, ends: list[End], plan: Plan) -> None:
    """Do what `plan.record` wrote, one step after another, each step's engine calls side by side:
    remove ended containers, change quotas (a host shrinks before its guest starts), kill, launch."""
    removals = [(end.container,) for end in ends if end.container is not None]
    raise_failures(daemon.engine.each(daemon.backend.remove, removals))
    apply_quotas(daemon, plan.quotas)
    kills = [(daemon.containers[job_id],) for job_id in plan.kills if job_id in daemon.containers]
    raise_failures(daemon.engine.each(daemon.backend.kill, kills))
    launch_all(daemon, plan.launches)


def launch_all(daemon: Daemon, launches: Sequence[tuple[Job, list[int], float, int | None]]) -> None:
    """Start the containers side by side, then mark those that started running, in one transaction.

    A launch the engine refused (bad command, image gone) ends its job at the
    next pass; the others are recorded even when the engine was lost meanwhile.
    """
    outcomes = daemon.engine.each(_start, [(daemon, job, cpus, quota) for job, cpus, quota, _ in launches])
    started = []
    for (job, _, _, quota_seq), outcome in zip(launches, outcomes, strict=True):
        if isinstance(outcome, EngineUnavailable):
            continue
        if isinstance(outcome, RunLost):
            log.warning("job %d could not start on its machines: %s", job.id, outcome)
            daemon.lost_launches[job.id] = str(outcome).splitlines()[0][:300]
            continue
        if isinstance(outcome, Exception):
            log.warning("job %d could not start: %s", job.id, outcome)
            daemon.failed_launches[job.id] = f"could not start: {str(outcome).splitlines()[0][:300]}"
            continue
        container, at = outcome
        if at > 0:  # the walltime and the runtime count from the container's start, not the decision's
            job.start = at
        started.append((job, container, quota_seq))
    with daemon.lock:
        for job, container, _ in started:
            daemon.containers[job.id] = container
    if started:
        with daemon.store.transaction() as db:
            for job, container, _ in started:
                daemon.store.update_job(db, job.id, state="running", container=container, start=job.start)
                db.execute("UPDATE jobs SET launches = launches + 1 WHERE id = ?", (job.id,))
            daemon.store.quotas_applied(db, [(seq, job.start) for job, _, seq in started if seq is not None])
        daemon.metrics.launched.inc(len(started))
    raise_failures(outcomes, tolerated=(Exception,))


def _start(daemon: Daemon, job: Job, cpus: list[int], quota: float) -> tuple[str, float]:
    spec, memory = _as_submitter(daemon, job.id, daemon.specs[job.id]), job.memory * job.cores
    asked = time.perf_counter()
    started = daemon.backend.launch(
        job.id, spec, daemon.cpu_map.cpuset(cpus), quota, memory, slots=job.slots, guest=job.host >= 0
    )
    daemon.metrics.launch_seconds.observe(time.perf_counter() - asked)
    return started


def _as_submitter(daemon: Daemon, job_id: int, spec: dict[str, Any]) -> dict[str, Any]:
    """The spec to launch: with `docker.run_as = "submitter"`, the submitter's account added, looked
    up now (NoAccount fails the job if it went away since submission); else as submitted."""
    if daemon.config.docker.run_as != "submitter":
        return spec
    record = daemon.store.job(job_id)
    user = record["user"] if record is not None else ""
    return {**spec, "run_as": account_of(user).as_spec()} if user else spec


def apply_quotas(daemon: Daemon, quotas: Sequence[tuple[int, float, int | None]]) -> None:
    """Change the quotas side by side; a cgroup showing another quota is logged and counted."""
    targets = [(job_id, cpus, seq) for job_id, cpus, seq in quotas if job_id in daemon.containers]
    outcomes = daemon.engine.each(_timed_quota, [(daemon, daemon.containers[j], cpus) for j, cpus, _ in targets])
    applied = []
    for (_, _, seq), outcome in zip(targets, outcomes, strict=True):
        if isinstance(outcome, QuotaMismatch):
            daemon.metrics.quota_mismatches.inc()
            log.error("%s", outcome)
        elif isinstance(outcome, float):
            daemon.metrics.quota_latency.observe(outcome)
            if seq is not None:
                applied.append((seq, daemon.clock()))
    if applied:
        with daemon.store.transaction() as db:
            daemon.store.quotas_applied(db, applied)
    raise_failures(outcomes, tolerated=(QuotaMismatch,))


def _timed_quota(daemon: Daemon, container: str, cpus: float) -> float:
    decided = time.perf_counter()
    daemon.backend.set_quota(container, cpus)
    return time.perf_counter() - decided

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
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cosched.daemon import journal
from cosched.daemon.accounts import account_of
from cosched.daemon.docker_backend import EngineUnavailable, NotKilled, QuotaMismatch, RunLost
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
    kill(daemon, [(job_id, daemon.containers[job_id]) for job_id in plan.kills if job_id in daemon.containers])
    with daemon.lock:
        launching = [job_id for job_id in plan.kills if job_id in daemon.launching]
    for job_id in launching:  # cancelled before it ran: its launch is given up where it can be
        daemon.backend.withdraw(job_id)
    launch_all(daemon, plan.launches)


def kill(daemon: Daemon, targets: Sequence[tuple[int, str]]) -> None:
    """Kill these jobs' containers, side by side. A job the engine could not kill in time (it
    answered: `NotKilled`) is killed again at each review until its end is collected
    (`daemon.not_killed`): its kill was asked once, and a job that outlived it ran on for good,
    past its walltime, holding its cores (a helper's audit: a job closing a million files took
    hours to die). An engine lost is raised, once every call was looked at."""
    outcomes = daemon.engine.each(daemon.backend.kill, [(container,) for _, container in targets])
    for (job_id, _), outcome in zip(targets, outcomes, strict=True):
        if isinstance(outcome, NotKilled):
            if job_id not in daemon.not_killed:
                log.error("job %d: %s; killed again at each review until it ends", job_id, outcome)
            daemon.not_killed.add(job_id)
        elif not isinstance(outcome, Exception):
            daemon.not_killed.discard(job_id)
    raise_failures(outcomes, tolerated=(NotKilled,))


@dataclass
class Parked:
    """A launch a pass stopped waiting for: it finishes in the background (`collect_launched`)."""

    future: Future[Any]
    job: Job
    quota: float
    """The quota it was launched with (the core may have changed the job's since)."""
    quota_seq: int | None


def launch_all(daemon: Daemon, launches: Sequence[tuple[Job, list[int], float, int | None]]) -> None:
    """Start the launches side by side and record those that finish within `intervals.launch_wait`.

    Why not wait for all: a launch on Mesos waits for its agents' offers (half a second, or up to
    `launch_timeout` when an agent has no room), and a pass waiting for it collects no ends and
    starts nothing else. The others finish in the background on their own pool and are recorded
    by a later pass (`collect_launched`); their jobs stay `launching` meanwhile.
    """
    futures = daemon.launcher.submit(_start, [(daemon, job, cpus, quota) for job, cpus, quota, _ in launches])
    parked = [Parked(f, job, quota, seq) for f, (job, _, quota, seq) in zip(futures, launches, strict=True)]
    wait(futures, timeout=daemon.config.intervals.launch_wait)
    _record(daemon, parked)


def collect_launched(daemon: Daemon) -> None:
    """Record the launches that finished since a pass stopped waiting for them."""
    with daemon.lock:
        parked = list(daemon.launching.values())
    if parked:
        _record(daemon, parked)


def _record(daemon: Daemon, parked: Sequence[Parked]) -> None:
    """Mark the finished launches' jobs running, in one transaction, and keep the others parked.

    A launch the engine refused (bad command, image gone) ends its job at the next pass; the
    others are recorded even when the engine was lost meanwhile. A job cancelled while its launch
    was under way is killed as soon as it runs (the core's kill found no container then), and one
    whose quota the core changed meanwhile gets it now.
    """
    done = [p for p in parked if p.future.done()]  # once: one finishing now is recorded at the next pass
    with daemon.lock:
        for p in parked:
            daemon.launching[p.job.id] = p
        for p in done:
            del daemon.launching[p.job.id]
    outcomes = [p.future.result() for p in done]
    started = []
    for p, outcome in zip(done, outcomes, strict=True):
        job = p.job
        if isinstance(outcome, EngineUnavailable):
            continue
        if isinstance(outcome, RunLost):
            log.warning("job %d could not start on its machines: %s", job.id, outcome)
            daemon.lost_launches[job.id] = outcome
            continue
        if isinstance(outcome, Exception):
            log.warning("job %d could not start: %s", job.id, outcome)
            daemon.failed_launches[job.id] = f"could not start: {str(outcome).splitlines()[0][:500]}"
            continue
        container, at = outcome
        started.append((p, container, at))
    with daemon.lock:
        for p, container, at in started:
            daemon.containers[p.job.id] = container
            if at > 0:  # the walltime, the runtime and the CPU charged count from the container's start
                daemon.core.started(p.job.id, at)
    if started:
        with daemon.store.transaction() as db:
            for p, container, _ in started:
                daemon.store.update_job(db, p.job.id, state="running", container=container, start=p.job.start)
            applied = [(p.quota_seq, p.job.start) for p, _, _ in started if p.quota_seq is not None]
            daemon.store.quotas_applied(db, applied)
        for p, container, _ in started:
            journal.running(p.job.id, container)
        daemon.metrics.launched.inc(len(started))
    kills = [(container,) for p, container, _ in started if p.job.id in daemon.kill_reason]
    changed = [
        (p.job.id, p.job.quota, None)
        for p, _, _ in started
        if p.job.id not in daemon.kill_reason and abs(p.job.quota - p.quota) > 1e-9
    ]
    killed = daemon.engine.each(daemon.backend.kill, kills)
    apply_quotas(daemon, changed)
    raise_failures(outcomes + killed, tolerated=(Exception,))


def _start(daemon: Daemon, job: Job, cpus: list[int], quota: float) -> tuple[str, float]:
    spec, memory = _as_submitter(daemon, job.id, daemon.specs[job.id]), job.memory * job.cores
    run = daemon.store.run_of(job.id)
    asked = time.perf_counter()  # the engine's time alone (`launch_seconds`)
    started = daemon.backend.launch(
        job.id, spec, daemon.cpu_map.cpuset(cpus), quota, memory, slots=job.slots, guest=job.host >= 0, run=run
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
    """Change the quotas side by side, each job's to the last one decided; a cgroup showing another
    quota is logged and counted. A step can decide two for one host (its guest ended: back to its
    cores; the next guest placed on it: lent again); applied side by side, either could land last,
    and on Mesos the host ran on at its whole quota beside its new guest (a helper's walkthrough)."""
    last = {job_id: index for index, (job_id, _, _) in enumerate(quotas)}
    targets = [
        (job_id, cpus, seq)
        for index, (job_id, cpus, seq) in enumerate(quotas)
        if last[job_id] == index and job_id in daemon.containers
    ]
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

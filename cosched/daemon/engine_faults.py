"""The engine lost and back, and the launches it lost: the daemon's view and the engine's brought together.

Why its own module: the engine may stop answering, freeze or restart under the
daemon. That is said once; meanwhile submissions go on and every pass pings it.
When it answers again, the containers the daemon knows are adopted and the jobs
recorded `launching` without a container are settled (`reconcile_launching`):
what the engine did start is adopted, the rest launched again. The periodic
reconciliation does the same while the engine is up, under `pass_lock`.
What each fault looks like: docs/daemon-faults.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cosched.daemon import carry_out, state_faults
from cosched.daemon.docker_backend import ContainerInfo, EngineUnavailable
from cosched.daemon.store import FINAL, StateError

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")


def reconcile(daemon: Daemon) -> None:
    """Compare with what Docker reports: launches the engine lost are retried, and what ended jobs
    left is removed."""
    with daemon.pass_lock:
        if daemon.state_problem or daemon.rebuild_due or not ready(daemon):  # rebuilt first (`scheduling`)
            return
        try:
            reconcile_launching(daemon)
        except EngineUnavailable as exc:
            lost(daemon, exc)
        except StateError as exc:
            with daemon.lock:
                state_faults.failed(daemon, exc)


def reconcile_launching(daemon: Daemon) -> None:
    """Jobs recorded as launching with no container known: adopt what the engine started, launch the rest."""
    listed = daemon.backend.containers()
    remove_leftovers(daemon, listed)
    relaunch = []
    for record in daemon.store.jobs(("launching",)):
        job = daemon.core.jobs.get(record["id"])
        if (
            job is None
            or job.id in daemon.containers
            or job.id in daemon.launching
            or job.id in daemon.failed_launches
            or job.id in daemon.lost_launches
        ):
            continue
        info = listed.get(job.id)
        if info is not None and not info.is_run(record["launches"]):  # a requeued run's, its removal cut short
            daemon.backend.remove(info.id)
            info = None
        if info is None and job.id in daemon.kill_reason:
            daemon.failed_launches[job.id] = daemon.kill_reason[job.id]
            continue
        if info is not None and info.state != "created":
            daemon.backend.adopt(info.id)
            with daemon.lock:
                daemon.containers[job.id] = info.id
            with daemon.store.transaction() as db:
                daemon.store.update_job(db, job.id, state="running", container=info.id)
        else:
            if info is not None:
                daemon.backend.remove(info.id)
            relaunch.append((job, daemon.cpus_of[job.id], job.quota, None))
    carry_out.launch_all(daemon, relaunch)


def remove_leftovers(daemon: Daemon, listed: dict[int, ContainerInfo]) -> None:
    """Remove the containers of jobs whose end the store holds: a pass recorded the end, then its
    removal was cut short (the engine failing, the daemon killed). Done at every reconciliation,
    not only at the next start: a job purged from the store (`keep_ended_days`) with its container
    left would stop that start."""
    with daemon.store.transaction() as db:
        states = daemon.store.states(db, listed)
    for job_id, state in states.items():
        if state in FINAL:
            log.info("removing leftover container %s of job %d", listed[job_id].shown, job_id)
            daemon.backend.remove(listed[job_id].id)


def lost(daemon: Daemon, exc: Exception) -> None:
    if daemon.engine_up:
        log.warning("Docker engine unreachable (%s); waiting for it", exc)
    daemon.engine_up = False
    daemon.metrics.engine_up.set(0)


def ready(daemon: Daemon) -> bool:
    if daemon.engine_up:
        return True
    if not daemon.backend.ping():
        return False
    log.warning("Docker engine is back; reconciling")
    daemon.engine_up = True
    daemon.metrics.engine_up.set(1)
    try:
        for container in list(daemon.containers.values()):
            daemon.backend.adopt(container)
        reconcile_launching(daemon)
    except EngineUnavailable as exc:
        lost(daemon, exc)
        return False
    return True

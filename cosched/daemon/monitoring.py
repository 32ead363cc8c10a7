"""Watching the running jobs between passes: usage sampled, walltimes and quotas reviewed.

Why its own module: these run on their own intervals, beside the pass, and must
never hold it up. Sampling reads cgroup and progress files outside `lock` (a
job's progress file may be slow; a pass never waits on it) and leaves what it
measured in the inbox for the next pass. The review kills jobs past their
walltime and reads every quota back from its cgroup; it touches the engine, so
it runs under `pass_lock`, and takes `lock` only to pick its targets.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cosched.core.events import UsageReported
from cosched.daemon import carry_out, engine_faults
from cosched.daemon.docker_backend import EngineUnavailable, QuotaMismatch
from cosched.model import Usage

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")


def sample(daemon: Daemon) -> None:
    """Measure every running job; the next pass hands the usage to the core.

    The reads (cgroup files, the job's progress file) happen outside the
    lock: whatever a job puts in its progress file, a pass never waits on it.
    """
    with daemon.lock:
        if not daemon.engine_up:
            return
        now = daemon.clock()
        running = [
            (job_id, container, job.quota)
            for job_id, container in daemon.containers.items()
            if (job := daemon.core.jobs.get(job_id)) is not None
        ]
    measured = [(job_id, quota, daemon.backend.sample(container, quota, now)) for job_id, container, quota in running]
    with daemon.lock:
        for job_id, quota, sample in measured:
            job = daemon.core.jobs.get(job_id)
            if sample is None or job is None or job_id not in daemon.containers:
                continue
            done, total = sample.done, sample.total
            if not 0 <= done <= (total or job.tasks):  # an older executor's, unchecked (`read_progress`)
                done, total = 0, 0
            if total > 0:
                job.tasks = total
            daemon.inbox.append(UsageReported(job_id, Usage(sample.cpu, sample.mem, done, now, quota)))
            daemon.metrics.cpu_used[job_id] = sample.cpu * quota


def review(daemon: Daemon) -> None:
    """Kill jobs past their walltime; check every running job's quota against its cgroup."""
    with daemon.pass_lock:
        with daemon.lock:
            if not daemon.engine_up or daemon.rebuild_due:  # a core a failed pass left: not acted on
                return
            now = daemon.clock()
            running = [
                (job_id, container, job)
                for job_id, container in daemon.containers.items()
                if (job := daemon.core.jobs.get(job_id)) is not None
            ]
            late = [
                (job_id, container, job)
                for job_id, container, job in running
                if now > job.start + job.walltime and job_id not in daemon.kill_reason
            ]
            for job_id, _, job in late:
                log.info("job %d passed its walltime of %.0f s; killing it", job_id, job.walltime)
                daemon.kill_reason[job_id] = "walltime exceeded"
            asked = [item for item in running if item[0] in daemon.requeue_asked and item[0] not in daemon.kill_reason]
            for job_id, _, _ in asked:  # killed, then queued again by `ends`
                daemon.kill_reason[job_id] = daemon.requeue_asked[job_id]
            late += asked
            late += [item for item in running if item[0] in daemon.not_killed and item not in late]
        try:
            carry_out.kill(daemon, [(job_id, container) for job_id, container, _ in late])
            wrong = []
            for job_id, container, job in running:
                if job_id in daemon.kill_reason:
                    continue
                try:
                    daemon.backend.verify_quota(container, job.quota)
                except QuotaMismatch as exc:
                    daemon.metrics.quota_mismatches.inc()
                    log.error("%s; applying it again", exc)
                    wrong.append((job_id, job.quota, None))
            carry_out.apply_quotas(daemon, wrong)
        except EngineUnavailable as exc:
            engine_faults.lost(daemon, exc)

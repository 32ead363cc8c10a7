"""Runs that ended since the last pass, and what each gives back, as the core's events.

Why its own module: an end comes from several places (a container that exited
or vanished, a launch the engine refused, a run lost with its machine), and each
must reach the core exactly once, with the right reason, before the pass steps
it. A run lost to its machine is not the job's end: the job is requeued, up to
MAX_LOST_RUNS times. Collecting reads the engine, so it runs outside `lock`;
`event` and `freed` change the daemon's maps and run under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cosched.core.events import Event, JobEnded, JobRequeued, Offer
from cosched.core.frees import freed_slots
from cosched.core.pool import slot_memory
from cosched.daemon.engine_calls import raise_failures
from cosched.model import Job, JobState

if TYPE_CHECKING:
    from cosched.daemon.docker_backend import Exit
    from cosched.daemon.service import Daemon

MAX_LOST_RUNS = 3
"""Runs of one job lost to its machines (an agent gone, an executor killed) before the job fails."""


@dataclass(slots=True)
class End:
    job: Job
    failed: bool
    at: float
    exit_code: int | None
    reason: str
    log_tail: str
    container: str | None
    lost: bool = False
    """The run was lost, not ended by the job: the job goes back to the queue."""
    cpu_seconds: float | None = None
    """What its processes used (`Exit.cpu_seconds`), where the machine measured it."""
    faulty_nodes: tuple[int, ...] = ()
    """Nodes whose machine could not start it at all (`RunLost.faulty_nodes`)."""
    cancel_asked: bool = False
    """A cancel of it waits in the inbox: the pass steps it before the end, whose it is."""

    @property
    def requeued(self) -> bool:
        """After the core's step: the job is queued again (it may even have started again in it)."""
        return self.lost and self.job.state is not JobState.CANCELLED


def final_state(daemon: Daemon, end: End) -> JobState:
    """The state the pass's step will leave an ended job in, known before the step: the core's rule
    (`Scheduler.end_state`), a cancel asked before the end included; PENDING for a run lost (it is
    queued again) unless a cancel was killing it."""
    state = daemon.core.end_state(end.job.id, end.failed or end.lost, cancel_asked=end.cancel_asked)
    return JobState.PENDING if end.lost and state is not JobState.CANCELLED else state


def collect(daemon: Daemon, now: float) -> list[End]:
    """Jobs whose containers stopped (or never could start) since the last pass, in the order they
    ended, as replay's clock gives them: whether a guest or its host ended first decides what
    each is charged and what the lending cost (after a restart or an engine outage, one pass
    collects every end since)."""
    ends: list[End] = []
    for job_id, reason in list(daemon.failed_launches.items()):
        job = daemon.core.jobs.get(job_id)
        if job is not None:
            ends.append(End(job, True, now, None, reason, "", daemon.containers.get(job_id)))
        del daemon.failed_launches[job_id]
    for job_id, lost in list(daemon.lost_launches.items()):
        job = daemon.core.jobs.get(job_id)
        if job is not None:
            reason = f"could not start: {str(lost).splitlines()[0][:500]}"
            ends.append(End(job, False, now, None, reason, "", None, lost=True, faulty_nodes=lost.faulty_nodes))
        del daemon.lost_launches[job_id]
    if not daemon.containers:
        return ends
    listed = daemon.backend.containers()
    stopped: list[tuple[Job, str]] = []
    for job_id, container in list(daemon.containers.items()):
        job = daemon.core.jobs.get(job_id)
        if job is None or any(e.job.id == job_id for e in ends):
            continue
        info = listed.get(job_id)
        if info is None:
            ends.append(End(job, True, now, None, "container disappeared", "", None))
        elif info.state in ("lost", "created"):  # created: never started (a Mesos gang that never was whole)
            ends.append(
                End(job, False, now, None, info.note or "its container never started", "", container, lost=True)
            )
        elif info.state in ("exited", "dead"):
            stopped.append((job, container))
    outcomes = daemon.engine.each(_exit_and_logs, [(daemon, container) for _, container in stopped])
    raise_failures(outcomes)
    for (job, container), (exit, logs) in zip(stopped, outcomes, strict=True):
        if exit.code != 0 and job.id in daemon.requeue_asked:  # killed to run again (`cosched requeue`)
            ends.append(End(job, False, now, exit.code, daemon.requeue_asked[job.id], logs, container, lost=True))
            continue
        # a code 0 finished before any kill took effect
        reason = "" if exit.code == 0 else daemon.kill_reason.get(job.id) or _own_failure(job, exit)
        # never before its start: Docker stamps a container's start once runc's start returned,
        # and its end from the exit event, so a job that exits at once 'ends before it starts'
        at = max(exit.finished, job.start) if exit.finished > 0 else now
        ends.append(End(job, exit.code != 0, at, exit.code, reason, logs, container, cpu_seconds=exit.cpu_seconds))
    return sorted(ends, key=lambda end: end.at)


def _own_failure(job: Job, exit: Exit) -> str:
    """Why a run failed when no kill of ours is remembered. A kill's reason lives in memory, so a
    walltime kill a crash left uncollected comes back as a plain SIGKILL: a run that lasted its
    walltime is taken for that kill (one that failed on its own past it would have been killed)."""
    if exit.oom:
        return "out of memory"
    if exit.finished > 0 and exit.finished >= job.start + job.walltime:
        return "walltime exceeded"
    return f"exit code {exit.code}"


def _exit_and_logs(daemon: Daemon, container: str) -> tuple[Any, str]:
    return daemon.backend.exit_of(container), daemon.backend.logs(container)


def event(daemon: Daemon, end: End) -> Event:
    """A job's end, or its requeue when its machine lost the run (until that happened too often)."""
    if not end.lost:
        return JobEnded(end.job.id, end.failed, end.at)
    if daemon.requeue_asked.pop(end.job.id, None) is not None:  # asked for, not lost: counts no lost run
        return JobRequeued(end.job.id)
    lost = daemon.lost_runs[end.job.id] = daemon.lost_runs.get(end.job.id, 0) + 1
    if lost < MAX_LOST_RUNS:
        return JobRequeued(end.job.id)
    end.lost, end.failed = False, True
    end.reason = f"{end.reason} ({lost} runs lost to their machines)"
    return JobEnded(end.job.id, True, end.at)


def freed(daemon: Daemon, job: Job, ended_now: set[int]) -> Offer | None:
    """What a job's end gives back (`cosched.core.frees`), with the host CPUs of its cores."""
    core = daemon.core
    host_running = job.host >= 0 and job.host in core.jobs and job.host not in ended_now
    surviving = [g for g in core.guests.get(job.id, ()) if g.id not in ended_now]
    slots = freed_slots(job, host_running, surviving)
    cpus = daemon.cpus_of.pop(job.id, [])
    if slots is None:
        return None
    kept = {cpu for guest in surviving for cpu in daemon.cpus_of.get(guest.id, ())}
    daemon.cpu_map.give([cpu for cpu in cpus if cpu not in kept])
    return Offer(slots, slot_memory(daemon.cluster, job, job.slots))

"""The scheduling pass: collect ends, step the core, write the plan, carry it out.

Why its own module: this is where the daemon meets the core replay drives, so it
stays a short sequence: what changed (`ends`, `nodes`) and what was submitted
become events, one `Scheduler.step`, its actions written in one transaction
(`plan`), then done on the engine (`carry_out`). Locking: the pass runs under
`pass_lock`; `lock` is taken only to step the core and write the plan, never
across an engine call.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import wait
from typing import TYPE_CHECKING, Any

from cosched.core.events import Event, JobCancelled, JobSubmitted
from cosched.daemon import (
    carry_out,
    dependencies,
    drain,
    ends,
    engine_faults,
    journal,
    monitoring,
    nodes,
    plan,
    state_faults,
    submissions,
    workflow_stages,
)
from cosched.daemon.docker_backend import EngineUnavailable
from cosched.daemon.store import DECISIONS_KEPT, StateError
from cosched.model import Job

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")

PASSES_AT_ONCE = 4
"""Passes one `schedule` runs while each leaves work for the next (dependencies settled), so a
chain of them moves on at once rather than one interval a link."""


def schedule(daemon: Daemon) -> None:
    """One pass: collect ends, step the core, write the plan, carry it out.

    Workflow stages that ends release, and jobs whose dependencies they meet, enter the core in the
    pass that sees those ends. When the pass's step settled dependencies (a cancel, a rejection, a
    failed workflow), another pass follows at once, so such a job is cancelled (or starts) right
    after rather than one interval later (replay has no dependencies). A kill asked before the pass (a requeue, a
    walltime lowered) has the review run after it, once the core has the new walltime.
    """
    with daemon.pass_lock:
        with daemon.lock:
            if not state_faults.usable(daemon):
                return
        if not _rebuilt(daemon):
            return
        with daemon.lock:
            review, daemon.review_due = daemon.review_due, False
        try:
            for _ in range(PASSES_AT_ONCE):
                if not _pass(daemon):
                    break
        except StateError as exc:
            with daemon.lock:
                state_faults.failed(daemon, exc)
        except Exception:
            # A pass that failed midway (a bug, a job's input no check foresaw) may have stepped the
            # core without writing its decisions: a job the core calls running that never launched
            # would hold its cores for good. The store holds only what was done: start again from it.
            log.exception("a scheduling pass failed; the daemon is rebuilt from the state file, as a restart would")
            _failed(daemon)
            daemon.review_due = daemon.review_due or review  # on the rebuilt core, after the next pass
            return
        daemon.failed_passes = 0
    if review:  # after `pass_lock` is let go, which the review takes
        monitoring.review(daemon)


def retry_wait(failures: int) -> float:
    """Seconds before the next try after `failures` passes or rebuilds failed in a row: 1, doubling
    to a minute. A failure that comes back every time (a bug a job's input keeps hitting) costs a
    rebuild a minute, not one a second with the daemon's lock held."""
    return float(min(2 ** max(failures - 1, 0), 60))


def _failed(daemon: Daemon) -> None:
    daemon.rebuild_due = True
    daemon.failed_passes += 1
    daemon.retry_at = time.monotonic() + retry_wait(daemon.failed_passes)


def _rebuilt(daemon: Daemon) -> bool:
    """Whether a pass may run: not before memory is rebuilt from the store after a failure, which
    waits `retry_wait`; a rebuild cut short (the engine or the state file failing in it) left the
    core half made, and is tried again, never passed over."""
    if not daemon.rebuild_due:
        return True
    if time.monotonic() < daemon.retry_at:
        return False
    wait([parked.future for parked in list(daemon.launching.values())])  # not under `lock`: the API's
    with daemon.lock:
        try:
            daemon.rebuild()
            return True
        except EngineUnavailable as exc:
            engine_faults.lost(daemon, exc)
        except StateError as exc:
            state_faults.failed(daemon, exc)
        except Exception:
            log.exception("rebuilding from the state file failed")
    _failed(daemon)
    return False


def _pass(daemon: Daemon) -> bool:
    """The pass itself; True when it left the next one work: dependencies its step settled (releases
    and cancels in the inbox). Workflow stages its ends release, and jobs whose dependencies they
    meet, enter the core in its own step.

    Runs under `pass_lock`; `lock` is taken only to step the core and write
    the plan, so the engine calls that carry the plan out hold no one up.
    """
    if not engine_faults.ready(daemon):
        return False
    started = time.perf_counter()
    now = daemon.clock()
    try:
        carry_out.collect_launched(daemon)
        changes = daemon.backend.nodes_changed()
        ended = ends.collect(daemon, now)
    except EngineUnavailable as exc:
        engine_faults.lost(daemon, exc)
        return False
    with daemon.lock:
        if changes:  # a node's machine may be another now: its drain follows the machine
            drain.follow(daemon)
        drain.faulty(daemon, ended)  # before the nodes' events: no job goes back to such a node now
        events: list[Event] = nodes.events(daemon, changes)
        events += _cancels_first(daemon, ended)
        ended_now: set[int] = set()
        for end in ended:
            events.append(ends.event(daemon, end))
            offer = ends.freed(daemon, end.job, ended_now)
            ended_now.add(end.job.id)
            if offer is not None and (offer := nodes.live_part(daemon, offer)) is not None:
                events.append(offer)
        with daemon.store.transaction() as db:  # the stages its ends release, and all it decides
            released = workflow_stages.released_by(daemon, db, ended, now)
            for job_id, document in released:
                _queue_stage(daemon, job_id, document, now)
            plan.record_ends(daemon, db, ended)  # so what they meet is released into this step
            dependencies.settle(daemon, db, bool(ended))
            while daemon.inbox:
                event = daemon.inbox.popleft()
                if isinstance(event, JobSubmitted) and event.job.submit > now:
                    # Accepted after this pass read its clock (while it collected ends): the pass is
                    # that late, so no job enters the core before its submission.
                    now = event.job.submit
                events.append(event)
            cancels = _cancel_targets(daemon, events)
            decision = daemon.core.step(now, events)
            daemon.reservations, daemon.wake_at = decision.reservations, decision.wake_at
            planned = plan.record(daemon, db, now, ended, cancels, decision.actions)
        for end in ended:
            daemon.containers.pop(end.job.id, None)
            daemon.kill_reason.pop(end.job.id, None)
            daemon.not_killed.discard(end.job.id)
            daemon.requeue_asked.pop(end.job.id, None)  # it ended before the kill: done, not queued again
            if end.requeued:
                journal.requeued(end.job.id, end.reason)
                daemon.metrics.requeued.inc()
                continue
            journal.ended(end.job, end.exit_code, end.reason)
            daemon.specs.pop(end.job.id, None)
            daemon.lost_runs.pop(end.job.id, None)
        for job_id, document in released:  # accepted before what the pass starts of them
            record = daemon.store.job(job_id) or {}
            journal.accepted(job_id, document, record.get("workflow"), user=record.get("user", ""))
        daemon.metrics.submitted.inc(len(released))
        dropped = [(job_id, plan.cancel_reason(daemon, job_id)) for job_id in planned.dropped]
        pinned = {} if daemon.backend.node_status() else daemon.cpus_of  # Mesos pins no CPU: none to name
        journal.decided(decision.actions, pinned, daemon.kill_reason, dropped)
        for job_id, _ in dropped:
            daemon.kill_reason.pop(job_id, None)
    try:
        carry_out.carry_out(daemon, ended, planned)
    except EngineUnavailable as exc:
        engine_faults.lost(daemon, exc)
    with daemon.lock:
        daemon.metrics.observe_pass(daemon, time.perf_counter() - started)
        if daemon.asax is not None:  # saved and counted: memory holds only recent decisions
            daemon.asax.forget(DECISIONS_KEPT)
        queued = len(daemon.core.queue)
    daemon.backend.queued(queued)
    return bool(planned.settled)


def _queue_stage(daemon: Daemon, job_id: int, document: dict[str, Any], now: float) -> None:
    """A released stage, into the inbox this very pass drains (its row is in the pass's transaction)."""
    record = daemon.store.job(job_id)
    user, workflow = (record["user"], record["workflow"]) if record else ("", None)
    submissions.queue(daemon, job_id, document, now, user, workflow)


def _cancels_first(daemon: Daemon, ended: list[ends.End]) -> list[Event]:
    """The cancels waiting in the inbox of jobs whose end this pass collected, taken out to go before
    those ends in the step: the end is the cancel's (its kill's, or the job's own first), as when the
    cancel's pass comes first. Stepped after it, a cancelled job ended `failed` (exit 137, reason
    "cancelled by user"), and so did its workflow (a helper's crash audit: a cancel while its job
    launched, or a restart between the kill and the end)."""
    asked = {event.job_id for event in daemon.inbox if isinstance(event, JobCancelled)}
    first = [end.job.id for end in ended if end.job.id in asked]
    if not first:
        return []
    for end in ended:
        end.cancel_asked = end.job.id in asked
    kept = [e for e in daemon.inbox if not (isinstance(e, JobCancelled) and e.job_id in first)]
    daemon.inbox.clear()
    daemon.inbox.extend(kept)
    return [JobCancelled(job_id) for job_id in first]


def _cancel_targets(daemon: Daemon, events: list[Event]) -> list[Job]:
    """The jobs this pass's cancellations name, found before the core forgets them."""
    arriving = {e.job.id: e.job for e in events if isinstance(e, JobSubmitted)}
    targets = []
    for event in events:
        if isinstance(event, JobCancelled):
            job = daemon.core.jobs.get(event.job_id) or arriving.get(event.job_id)
            if job is not None:
                targets.append(job)
    return targets

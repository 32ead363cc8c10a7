"""What one pass decided, written to the store in one transaction before any of it is done.

Why its own module: this is the daemon's durability rule: a job is recorded
`launching` before its container exists. Ends, cancellations, launches with their
CPUs, quota changes, workflow stages released and what ASAx learnt are committed
together; only then does `carry_out` touch the engine, so a kill at any instant
leaves a store `recovery` can finish, and nothing runs twice. Runs under `lock`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cosched.core.events import Colocate, Kill, Launch, Reject, SetQuota
from cosched.daemon import dependencies, workflow_stages
from cosched.daemon.cpus import share_of
from cosched.daemon.ends import final_state
from cosched.model import Job, JobState

if TYPE_CHECKING:
    from cosched.daemon.ends import End
    from cosched.daemon.service import Daemon


@dataclass(slots=True)
class Plan:
    """What one pass decided, written to the store before it is carried out."""

    launches: list[tuple[Job, list[int], float, int | None]] = field(default_factory=list)
    quotas: list[tuple[int, float, int]] = field(default_factory=list)
    kills: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    """Pending jobs it cancelled (a cancelled end is written as the end it is)."""
    settled: int = 0
    """Jobs whose dependencies it settled: released or cancelled by the next pass."""


def record(daemon: Daemon, db: Any, now: float, ends: list[End], cancels: list[Job], actions: list[Any]) -> Plan:
    """Write everything this pass decided, in its transaction (`db`: the caller's, which holds its
    ends, `record_ends`, and the stages they released, `workflow_stages.released_by`), before doing
    any of it."""
    plan = Plan()
    store = daemon.store
    ended = {end.job.id for end in ends}
    for job in cancels:
        if job.state is JobState.CANCELLED and job.id not in ended:  # (an end is written as it came)
            plan.dropped.append(job.id)
            store.update_job(db, job.id, state="cancelled", end=now, reason=cancel_reason(daemon, job.id))
            daemon.specs.pop(job.id, None)
            if job.workflow is not None:
                workflow_stages.fail(
                    store, db, int(job.workflow), workflow_stages.stage_of(daemon, job.id), "cancelled"
                )
    for action in actions:
        if isinstance(action, Launch):
            cpus = daemon.cpu_map.take(action.slots)
            _mark_launching(daemon, db, action.job, cpus, now)
            plan.launches.append((action.job, cpus, float(action.job.cores), None))
        elif isinstance(action, Colocate):
            cpus = share_of(daemon.cpus_of[action.host_id], action.slots, daemon.cpu_map)
            _mark_launching(daemon, db, action.guest, cpus, now)
            # A guest starts on a lent quota: logged, so its quota history is complete.
            seq = store.log_quota(db, action.guest.id, action.quota, now)
            plan.launches.append((action.guest, cpus, action.quota, seq))
        elif isinstance(action, SetQuota):
            seq = store.log_quota(db, action.job_id, action.cpus, action.at)
            # With its host: a guest whose host ended or was requeued is a job of its own (`host` -1).
            # Left naming it, a restart gave the guest to the host's next run (its quota then 0) and
            # every pass failed after; or made the host its own former guest's (a helper's crash audit).
            running = daemon.core.jobs.get(action.job_id)
            host = running.host if running is not None else -1
            store.update_job(db, action.job_id, quota=action.cpus, host=host)
            plan.quotas.append((action.job_id, action.cpus, seq))
        elif isinstance(action, Kill):
            plan.kills.append(action.job_id)
        elif isinstance(action, Reject):  # refused, or its latest start passed: durable with the reason
            store.update_job(db, action.job.id, state="failed", end=now, reason=action.reason)
            daemon.specs.pop(action.job.id, None)
            if action.job.workflow is not None:  # a stage that can never start fails its workflow
                workflow_stages.fail(
                    store, db, int(action.job.workflow), workflow_stages.stage_of(daemon, action.job.id)
                )
    rejected = any(isinstance(action, Reject) for action in actions)
    plan.settled = dependencies.settle(daemon, db, bool(cancels or rejected))  # the ends' were settled before the step
    _save_learning(daemon, db, ends)
    store.charge(db, daemon.core.charged)
    return plan


def record_ends(daemon: Daemon, db: Any, ends: list[End]) -> None:
    """The ends a pass collected, written in its transaction before its step, in the state the
    core's rule will leave each job (`ends.final_state`): a run lost goes back to the queue, unless
    a cancel was killing it. So what the step releases (workflow stages, jobs whose dependencies on a
    job, a workflow or a singleton's twin those ends meet) reads every end from the state file, and
    competes for the cores the ends free; a dependency on a workflow was released a pass later."""
    store = daemon.store
    for end in ends:
        job = end.job
        state = final_state(daemon, end).value
        if state == "pending":  # its run was lost: it starts again, from the queue (perhaps in this very pass)
            store.update_job(
                db,
                job.id,
                state="pending",
                start=None,
                slots=None,
                cpus=None,
                quota=None,
                host=-1,
                container=None,
                reason=f"requeued: {end.reason}",
                requeue=None,
                lost_runs=daemon.lost_runs.get(job.id, 0),
            )
            continue
        store.update_job(
            db,
            job.id,
            state=state,
            end=end.at,
            exit_code=end.exit_code,
            cpu_seconds=end.cpu_seconds,
            reason=end.reason,
            log_tail=end.log_tail,
        )
        if job.workflow is not None and state != "done":  # a success released its next stages (`released_by`)
            workflow_stages.fail(store, db, int(job.workflow), workflow_stages.stage_of(daemon, job.id), state)


def cancel_reason(daemon: Daemon, job_id: int) -> str:
    """Why a pending job was cancelled: its user asked, or a dependency can never be met."""
    return daemon.kill_reason.get(job_id, "cancelled by user")


def _mark_launching(daemon: Daemon, db: Any, job: Job, cpus: list[int], now: float) -> None:
    daemon.cpus_of[job.id] = cpus
    daemon.store.update_job(
        db,
        job.id,
        state="launching",
        start=now,
        slots=[list(s) for s in job.slots],
        cpus=cpus,
        quota=job.quota,
        host=job.host,
    )
    daemon.store.begin_run(db, job.id)


def _save_learning(daemon: Daemon, db: Any, ends: list[End]) -> None:
    """Weights and lending decisions, in the pass's transaction: a restart keeps what was learnt."""
    if daemon.asax is None:
        return
    if ends:  # every end may teach a kind's runtime alone
        daemon.store.set_meta(db, "baselines", daemon.asax.baselines.to_state())
    new = daemon.asax.since(daemon.saved_decisions)
    resolved, daemon.asax.resolved = [*daemon.asax.resolved, *daemon.asax.lending_paces()], []
    if not new and not resolved:
        return
    for decision in [*resolved, *new]:
        daemon.store.save_decision(db, decision.seq + 1, decision.as_dict())
    if new:  # where its draws are: a restart goes on from there, not from the seed's first ones again
        daemon.store.set_meta(
            db, "draws", {"seed": daemon.config.policies.seed, "state": daemon.asax.rng.bit_generator.state}
        )
    daemon.saved_decisions = daemon.asax.decided
    daemon.store.set_meta(db, "weights", daemon.asax.book.to_state())
    daemon.store.set_meta(db, "learner", daemon.config.policies.learner)  # what the weights' keys are
    daemon.store.set_meta(db, "experts", daemon.asax.experts.digest())  # what the weights weigh

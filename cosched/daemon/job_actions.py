"""What the API does to accepted jobs: cancel, hold and release, requeue, a new walltime.

Why its own module: each is asked by a job's owner or an operator (`_check_owner`, as Slurm
allows), is written to the state file before it is answered, and reaches the core through the
daemon's inbox at the next pass, so a restart finds every ask that was answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cosched.core.events import JobCancelled, JobHeld, JobReleased, JobUpdated
from cosched.daemon import journal
from cosched.daemon.identity import ANONYMOUS, Caller
from cosched.daemon.submissions import Forbidden
from cosched.errors import CoschedError

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon


def cancel(daemon: Daemon, job_id: int, caller: Caller = ANONYMOUS) -> str:
    """Ask for a job's end; returns its state then ('' if there is no such job).

    Forbidden unless `caller` owns the job or is an operator, as `scancel` allows:
    a user's token must not end another user's work.
    """
    record = daemon.store.job(job_id)
    if record is None:
        return ""
    _check_owner(daemon, record, caller, "cancel")
    if record["state"] in ("pending", "launching", "running"):
        with daemon.store.transaction() as db:
            daemon.store.update_job(db, job_id, cancel=1, requeue=None)
        with daemon.lock:  # beside `monitoring.review`, which reads both maps
            if daemon.requeue_asked.pop(job_id, None) is not None:  # a cancel outranks a requeue asked before
                daemon.kill_reason.pop(job_id, None)
            daemon.kill_reason.setdefault(job_id, "cancelled by user")
        daemon.inbox.append(JobCancelled(job_id))
        journal.cancel_asked(job_id, str(record["state"]), caller.user)
    return str(record["state"])


class NotPending(CoschedError):
    """Hold or release of a job that is not pending (running, ended) or not held; an update of one
    that ended; a requeue of one that is not running."""


USER_HOLD, OPERATOR_HOLD = 1, 2
"""The `held` column: a hold its owner may lift, or an operator's (Slurm's JobHeldUser, JobHeldAdmin)."""


def hold(daemon: Daemon, job_id: int, caller: Caller, held: bool) -> str:
    """Hold (`held`) or release a pending job, as `scontrol hold/release`; its state ('' if there is
    no such job). Its owner or an operator only; an operator's hold on another user's job only an
    operator lifts (an operator holding jobs before maintenance saw their owner release them). The hold is
    in the state file: a restarted daemon keeps the job held."""
    record = daemon.store.job(job_id)
    if record is None:
        return ""
    _check_owner(daemon, record, caller, "hold" if held else "release")
    if record["state"] != "pending" or record["cancel"]:
        raise NotPending(f"job {job_id} is {record['state']}: only a pending job can be held or released")
    if not held and not record["held"]:
        raise NotPending(f"job {job_id} is not held")
    if not held and record["held"] == OPERATOR_HOLD and not caller.operator:
        raise Forbidden(f"job {job_id} is held by an operator: only an operator may release it")
    by_operator = caller.operator and record["user"] != caller.user  # on their own jobs, operators are users
    kind = (OPERATOR_HOLD if by_operator else max(USER_HOLD, record["held"])) if held else 0
    if kind != record["held"]:
        with daemon.lock:  # beside `dependencies.settle`, which releases only jobs the user does not hold
            with daemon.store.transaction() as db:
                daemon.store.update_job(db, job_id, held=kind)
            if bool(kind) != bool(record["held"]) and (held or job_id not in daemon.waiting):
                daemon.inbox.append(JobHeld(job_id) if held else JobReleased(job_id))
        journal.hold_asked(job_id, held, caller.user)
    return str(record["state"])


def requeue(daemon: Daemon, job_id: int, caller: Caller) -> str:
    """Kill a running job and queue it again, as `scontrol requeue` (an operator's before a
    reboot, or a user's whose job went wrong); its state ('' if there is no such job). Its owner
    or an operator only. The wish is in the state file, so a daemon killed before the job's end
    was collected still queues it again; the kill is the review's (`monitoring.review`), run after the next pass.
    A job that ends with exit code 0 before the kill took effect is done."""
    record = daemon.store.job(job_id)
    if record is None:
        return ""
    _check_owner(daemon, record, caller, "requeue")
    if record["state"] not in ("launching", "running") or record["cancel"]:
        raise NotPending(f"job {job_id} is {record['state']}: only a running job can be requeued")
    reason = f"requeued by {caller.user or 'an operator'}"
    with daemon.lock:
        with daemon.store.transaction() as db:
            daemon.store.update_job(db, job_id, requeue=reason)
        daemon.requeue_asked[job_id] = reason
        daemon.review_due = True
    journal.requeue_asked(job_id, caller.user)
    return str(record["state"])


def update_walltime(daemon: Daemon, job_id: int, walltime: float, caller: Caller) -> str:
    """Change a queued or running job's walltime, as `scontrol update TimeLimit`; its state ('' if
    there is no such job). Its owner may lower it, only an operator raise it (Slurm's rule: a
    walltime is what backfilling planned others around). Lowered below what it has run, the job
    is killed by the review after the next pass, `walltime exceeded`. In the state file, so a restart keeps it."""
    record = daemon.store.job(job_id)
    if record is None:
        return ""
    _check_owner(daemon, record, caller, "update")
    if record["state"] not in ("pending", "launching", "running") or record["cancel"]:
        raise NotPending(f"job {job_id} is {record['state']}: only a queued or running job's walltime can change")
    before = float(record["spec"]["walltime"])
    if walltime > before and not caller.operator:
        raise Forbidden(f"job {job_id}: only an operator may raise a walltime ({before:g} s to {walltime:g} s)")
    with daemon.lock:  # the spec the daemon holds and the core's job change together
        with daemon.store.transaction() as db:
            daemon.store.set_walltime(db, job_id, walltime)
        if job_id in daemon.specs:
            daemon.specs[job_id]["walltime"] = walltime
        daemon.inbox.append(JobUpdated(job_id, walltime))
        daemon.review_due = True  # after the pass that gives the core the new walltime
    journal.updated(job_id, walltime, caller.user)
    return str(record["state"])


def _check_owner(daemon: Daemon, record: dict[str, Any], caller: Caller, verb: str) -> None:
    """Forbidden unless `caller` owns the job or is an operator, as Slurm allows: a user's token
    must not act on another user's jobs. Under `api.private_data` the refusal names no owner."""
    if not (caller.operator or record["user"] == caller.user):
        owner = record["user"] or "no user (submitted without a user token)"
        if daemon.config.api.private_data:
            owner = "another user"
        raise Forbidden(f"job {record['id']}: belongs to {owner}; {caller.user} may {verb} only their own jobs")

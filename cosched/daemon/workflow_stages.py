"""Workflows in the daemon: a stage is submitted when its predecessors succeed.

The same model as replay's `WorkflowRuns`, kept in the store instead of memory
so that a restart loses no progress: which stages exist is which job rows
exist, and a stage's end and the submission of the stages it unblocks are
written in one transaction, the pass's, and enter the core in one step.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from cosched.daemon.ends import final_state
from cosched.daemon.specs import WorkflowSpec
from cosched.daemon.store import Store
from cosched.model import JobState

if TYPE_CHECKING:
    from cosched.daemon.ends import End
    from cosched.daemon.service import Daemon


Released = list[tuple[int, dict[str, Any]]]
"""Stages submitted, as (job id, spec)."""

log = logging.getLogger("cosched.daemon")


def release(
    store: Store, db: sqlite3.Connection, workflow_id: int, now: float, done_now: Iterable[str] = ()
) -> Released:
    """Submit every stage of a workflow that is ready and not yet submitted: [(job id, spec)].
    `done_now`: stages whose success this pass is writing, in this transaction."""
    record = store.workflow(workflow_id)
    if record is None or record["state"] == "done":
        return []
    try:
        spec = WorkflowSpec.model_validate(record["spec"])
    except ValidationError as exc:  # accepted under older checks: it fails, not every pass after this one
        refused, why = _refused(record["spec"], exc)
        log.error("workflow %d fails: its stage %s no longer passes today's checks (%s)", workflow_id, refused, why)
        fail(store, db, workflow_id, refused)
        return []
    rows = {row["stage"]: row for row in _stage_rows(db, workflow_id)}
    done = {stage for stage, row in rows.items() if row["state"] == "done"} | set(done_now)
    if len(done) == len(spec.stages):
        store.update_workflow(db, workflow_id, "done")
        return []
    submitted = []
    for stage in spec.dag().to_release(done, rows, failed=record["state"] in STOPPED):
        job_spec = spec.job_spec(stage.name).model_dump()
        if spec.max_running:  # the workflow's throttle rides with each stage (`submissions.job_from`)
            job_spec["max_running"] = spec.max_running
        job_id = store.add_job(db, job_spec, now, workflow_id, stage.name, user=record["user"])
        submitted.append((job_id, job_spec))
    return submitted


def _refused(stored: dict[str, Any], exc: ValidationError) -> tuple[str, str]:
    """The stage a stored spec's first error is in ('' for the workflow's own fields), and the error."""
    error = exc.errors()[0]
    where = error["loc"]
    stages = stored.get("stages") or []
    stage = ""
    if len(where) > 1 and where[0] == "stages" and isinstance(where[1], int) and where[1] < len(stages):
        stage = str(stages[where[1]].get("name", ""))
    return stage, f"{'.'.join(map(str, where))}: {error['msg']}"


def released_by(
    daemon: Daemon, db: sqlite3.Connection, ended: list[End], now: float
) -> list[tuple[int, dict[str, Any]]]:
    """The stages this pass's ends release, submitted in the pass's transaction before the core's
    step, so that they compete for the cores those ends free, as replay's `WorkflowRuns.react`
    submits them into the same step. Which ends succeed is the core's rule (`ends.final_state`); one
    released a pass later lost its predecessor's cores to any job queued behind it (an audit)."""
    succeeded: dict[int, list[str]] = {}
    for end in ended:
        job = end.job
        if job.workflow is None or final_state(daemon, end) is not JobState.DONE:
            continue
        succeeded.setdefault(int(job.workflow), []).append(stage_of(daemon, job.id))
    released: Released = []
    for workflow_id, stages in succeeded.items():
        released += release(daemon.store, db, workflow_id, now, done_now=stages)
    return released


def stage_of(daemon: Daemon, job_id: int) -> str:
    """A stage job's stage name, from its row (read in the caller's transaction, on its thread)."""
    record = daemon.store.job(job_id)
    return str(record["stage"]) if record else ""


STOPPED = ("failed", "cancelled")
"""A workflow's states once a stage failed, or was cancelled: no later stage is ever submitted."""


def fail(store: Store, db: sqlite3.Connection, workflow_id: int, stage: str, state: str = "failed") -> None:
    """A stage failed (`state` 'failed') or was cancelled ('cancelled', as `cosched cancel
    --workflow` cancels them: a user's cancel read as a crash): the workflow ends so, the first
    such stage named; its dependants are never submitted."""
    store.stop_workflow(db, workflow_id, state, stage)


def stage_states(store: Store, workflow_id: int) -> dict[str, str]:
    """Every stage's state; stages never submitted are 'waiting', or 'cancelled' once the workflow failed."""
    record = store.workflow(workflow_id)
    if record is None:
        return {}
    rows = {row["stage"]: row["state"] for row in store.jobs(workflow=workflow_id)}
    unsubmitted = "cancelled" if record["state"] in STOPPED else "waiting"
    names = [str(stage.get("name", "")) for stage in record["spec"].get("stages") or ()]  # as stored, unchecked
    return {name: rows.get(name, unsubmitted) for name in names}


def _stage_rows(db: sqlite3.Connection, workflow_id: int) -> list[sqlite3.Row]:
    return list(db.execute("SELECT stage, state FROM jobs WHERE workflow = ?", (workflow_id,)))

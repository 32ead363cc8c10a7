"""Jobs that wait for other jobs' ends (sbatch's --dependency): the rule, and the passes that settle it.

Why in the daemon and not the core: a dependency names jobs of the state file, ended ones
included, which the core forgot long ago; the core sees such a job as held (`JobSubmitted`
then `JobHeld`, put in the inbox together under `lock`, so no pass steps one without the
other) until `settle` releases it. Why judged afresh from the state file rather than kept up
to date at each end: a restart has nothing to rebuild, and no end is missed by a job accepted
while that end was being written. Judged in a pass that takes an end (before its step, so that
the job starts on the cores that end frees; and after it, for what the step decided), and at the
pass after a job started waiting (`Daemon.settle_due`): passes with neither cost nothing, however
many wait.

A dependency that can never be met (afterok on a job that failed) cancels the job, as a
failed workflow stage cancels the stages after it (Slurm's `kill_invalid_depend`): a job
pending forever for a reason nobody reads holds its user's queue slots.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from cosched.core.events import JobCancelled, JobReleased
from cosched.daemon.store import FINAL, Store

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon

Verdict = Literal["met", "waiting", "never"]
NEVER = "DependencyNeverSatisfied"
"""Slurm's word for a dependency that cannot be met, first in the cancelled job's reason."""

_ENDED_AS = {"done": "succeeded", "failed": "failed", "cancelled": "was cancelled"}


def verdict(kind: str, state: str | None) -> Verdict:
    """The one rule: is a dependency of `kind` met by its target's `state` (None: no such target)?"""
    if state is None:
        return "never"
    if state not in FINAL:
        return "waiting"
    if kind in ("afterany", "singleton") or (state == "done") == (kind == "afterok"):
        return "met"
    return "never"


def judge(after: Sequence[dict[str, Any]], states: dict[tuple[str, int], str], job_id: int = 0) -> tuple[Verdict, str]:
    """Job `job_id`'s dependencies together: met when all are, never (and why, one line) when one
    is. A singleton's target is the job itself: 'running' while an earlier twin is live (unknown
    at submission: it waits)."""
    outcome: Verdict = "met"
    for dependency in after:
        target = _target(dependency, job_id)
        state = states.get(target, "running" if target[0] == "singleton" else None)
        one = verdict(dependency["kind"], state)
        if one == "never":
            ended = _ENDED_AS.get(state or "", "is not in the state file (never submitted, or purged)")
            return "never", f"{dependency['kind']} on {target[0]} {target[1]}, which {ended}"
        if one == "waiting":
            outcome = "waiting"
    return outcome, ""


def target_states(store: Store, db: sqlite3.Connection, after: Iterable[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """The states of the jobs and workflows these dependencies name, read in the caller's transaction."""
    targets = [_target(dependency) for dependency in after if dependency["kind"] != "singleton"]
    jobs = store.states(db, (number for kind, number in targets if kind == "job"))
    workflows = store.workflow_states(db, (number for kind, number in targets if kind == "workflow"))
    return {**{("job", k): v for k, v in jobs.items()}, **{("workflow", k): v for k, v in workflows.items()}}


def singleton_states(store: Store, db: sqlite3.Connection, job_ids: Iterable[int]) -> dict[tuple[str, int], str]:
    """Each of these singleton jobs' own state as its dependency's target: 'running' while an
    earlier job of its user with its name is queued or running, else 'done'."""
    ids = list(job_ids)
    twins = store.earlier_twins_live(db, ids)
    return {("singleton", job_id): "running" if job_id in twins else "done" for job_id in ids}


def problem(store: Store, db: sqlite3.Connection, after: Sequence[dict[str, Any]]) -> str:
    """Why a submission's dependencies can never be met ('' if they can): refused at once."""
    return judge(after, target_states(store, db, after))[1] if after else ""


def settle(daemon: Daemon, db: sqlite3.Connection, changed: bool) -> int:
    """Release the waiting jobs whose dependencies are all met (unless their user holds them) and
    cancel those with one that never can be; how many left the wait. Runs in a pass's transaction,
    under `lock`: before its step, once its ends are written (`plan.record_ends`), so that a job an
    end releases competes for the cores that end frees, as a workflow's next stage does; and after
    the step, for its cancels and rejections (`changed`: the pass wrote some)."""
    if not (changed or daemon.settle_due) or not daemon.waiting:
        return 0
    daemon.settle_due = False
    waiting = list(daemon.waiting.items())
    own = daemon.store.states(db, (job_id for job_id, _ in waiting))
    states = target_states(daemon.store, db, (d for _, after in waiting for d in after))
    alone = (job_id for job_id, after in waiting if any(d["kind"] == "singleton" for d in after))
    states.update(singleton_states(daemon.store, db, alone))
    settled = 0
    for job_id, after in waiting:
        if own.get(job_id) != "pending":  # cancelled, or failed at its latest start, meanwhile
            del daemon.waiting[job_id]
            continue
        outcome, why = judge(after, states, job_id)
        if outcome == "waiting":
            continue
        del daemon.waiting[job_id]
        settled += 1
        if outcome == "never":
            daemon.kill_reason.setdefault(job_id, f"{NEVER}: {why}")
            daemon.inbox.append(JobCancelled(job_id))
        elif not (daemon.store.job(job_id) or {}).get("held"):  # a user's hold outlasts the dependency
            daemon.inbox.append(JobReleased(job_id))
    return settled


def parse(text: str) -> list[dict[str, Any]]:
    """sbatch's --dependency, all of them needed: `afterok:12:13,afterany:w7` (w: a workflow),
    `singleton`."""
    after: list[dict[str, Any]] = []
    for part in text.split(","):
        if part == "singleton":
            after.append({"kind": "singleton"})
            continue
        kind, _, targets = part.partition(":")
        if kind not in ("afterok", "afternotok", "afterany") or not targets:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected afterok, afternotok or afterany, then :JOB or :wWORKFLOW ids, or singleton"
            )
        for target in targets.split(":"):
            match = re.fullmatch(r"(w?)([1-9][0-9]{0,17})", target)
            if match is None:
                raise argparse.ArgumentTypeError(f"{part!r}: {target!r} is not a job id or w and a workflow id")
            after.append({"kind": kind, ("workflow" if match[1] else "job"): int(match[2])})
    return after


def describe(after: Iterable[dict[str, Any]]) -> str:
    """Dependencies as `parse` reads them."""
    return ",".join(
        d["kind"]
        if d["kind"] == "singleton"
        else f"{d['kind']}:{'w' if d.get('workflow') else ''}{d.get('workflow') or d['job']}"
        for d in after
    )


def _target(dependency: dict[str, Any], job_id: int = 0) -> tuple[str, int]:
    """What a dependency waits on: a job, a workflow, or (singleton) the job's own twins."""
    if dependency["kind"] == "singleton":
        return ("singleton", job_id)
    return ("job", int(dependency["job"])) if dependency.get("job") else ("workflow", int(dependency["workflow"]))

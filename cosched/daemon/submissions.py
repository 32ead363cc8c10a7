"""What comes in through the API: jobs and workflows checked, stored, then queued.

Why its own module: accepting is a promise. A submission is checked against what
this cluster can ever run (`Rejected` names the field), stored before the call
returns, and only then handed to the next pass through the daemon's inbox; while
the state file is unusable nothing is accepted, since it could be lost. Recovery
queues what an earlier run accepted through the same `queue` and `job_from`.
"""

from __future__ import annotations

import hashlib
import math
import sqlite3
from typing import TYPE_CHECKING, Any

from cosched.core.events import JobHeld, JobSubmitted
from cosched.daemon import dependencies, journal, start_window, state_faults, workflow_stages
from cosched.daemon.accounts import Account, NoAccount, account_of
from cosched.daemon.docker_backend import data_dirs_allowed
from cosched.daemon.specs import JobSpec, WorkflowSpec
from cosched.daemon.store import StateError
from cosched.errors import CoschedError
from cosched.model import Job

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon


class Rejected(CoschedError):
    """A submission the daemon cannot accept; `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.problem = message


class Forbidden(CoschedError):
    """A caller asking for what only someone else may do (cancel another user's job)."""


def check_job(daemon: Daemon, spec: JobSpec, account: Account | None = None) -> None:
    """Rejected naming the field if this cluster can never run `spec` (as `account`, if jobs run as
    their submitters)."""
    cores = daemon.cluster.cores
    if spec.cores > cores:
        raise Rejected("cores", f"{spec.cores} cores asked, the cluster has {cores}")
    cap = daemon.config.policies.max_cores_per_user
    if cap and spec.cores > cap:
        raise Rejected(
            "cores", f"{spec.cores} cores asked, a user may hold at most {cap} (policies.max_cores_per_user)"
        )
    per_node = daemon.cluster.cores_per_node
    if spec.cores > per_node and not _spans(daemon, spec.model_dump()):
        where = "a Mesos agent" if daemon.config.backend.kind == "mesos" else "a node"
        raise Rejected("cores", f"{spec.cores} cores asked, {where} has {per_node} (span = true spreads it)")
    memory = memory_mib(daemon, spec.model_dump())
    on_a_node = daemon.cluster.memory_on_one_node(spec.cores, _per_core(memory, spec.cores))
    if on_a_node > daemon.cluster.memory_per_node:
        of_it = f", {on_a_node} MiB of it on one node" if on_a_node != memory else " on one node"
        raise Rejected("memory_mib", f"{memory} MiB asked{of_it}, and a node has {daemon.cluster.memory_per_node} MiB")
    docker = daemon.config.docker
    problem = data_dirs_allowed(spec.data_dirs, docker.data_roots, account, docker.job_user)
    if problem:
        raise Rejected("data_dirs", problem)
    if not daemon.backend.has_image(spec.image):
        raise Rejected("image", f"image {spec.image!r} is not in the local Docker engine")


class Full(CoschedError):
    """The daemon holds as many jobs as it may take, in all or of this user: submit again later."""


def check_room(daemon: Daemon, db: sqlite3.Connection, user: str, count: int) -> None:
    """Full unless `count` more jobs fit under `api.max_jobs` and the user's `max_jobs_per_user`.

    Why: every live job is a row each pass reads and a place in the core's queue; one
    client submitting in a loop would otherwise slow the daemon for everyone. Counted
    inside the submission's transaction, so two submissions at once cannot both take the
    last place; a workflow needs room for all its stages at once, and keeps it until they
    end (`Store.count_live` counts the stages it has yet to submit).
    """
    api = daemon.config.api
    live = daemon.store.count_live(db)
    if live + count > api.max_jobs:
        raise Full(
            f"the daemon holds {live} jobs queued, running or to come in workflows, at most {api.max_jobs}"
            " (api.max_jobs)"
        )
    if user and api.max_jobs_per_user:
        mine = daemon.store.count_live(db, user)
        if mine + count > api.max_jobs_per_user:
            raise Full(
                f"{user} has {mine} jobs queued, running or to come in workflows, at most {api.max_jobs_per_user}"
                " (api.max_jobs_per_user)"
            )


def check_dependencies(daemon: Daemon, db: sqlite3.Connection, after: list[dict[str, Any]]) -> None:
    """Rejected when a dependency can never be met (a job that failed, or none of that id): a
    submission the daemon would only cancel is refused with the reason instead."""
    problem = dependencies.problem(daemon.store, db, after)
    if problem:
        raise Rejected("after", f"{problem}: it can never be met")


def check_account(daemon: Daemon, user: str) -> Account | None:
    """The account `user`'s jobs run as if they run as their submitter (else None); Rejected if
    `user` cannot run any here (no account, root)."""
    if user and daemon.config.docker.run_as == "submitter":
        try:
            return account_of(user)
        except NoAccount as exc:
            raise Rejected("user", str(exc)) from None
    return None


def _accepting(daemon: Daemon) -> None:
    """StateError (a 503) while the state file is unusable: a job accepted now could be lost."""
    if not daemon.state_problem:
        try:
            daemon.store.check()
        except StateError as exc:
            with daemon.lock:
                state_faults.failed(daemon, exc)
    if daemon.state_problem:
        raise StateError(f"not accepting submissions: {daemon.state_problem}")


def submit_job(daemon: Daemon, spec: JobSpec, user: str = "", key: str = "") -> int:
    """Accept one job, owned by `user`: stored before this returns, queued at the next pass. Sent
    again with the same `key` (`Idempotency-Key`), it answers the job accepted the first time."""
    _accepting(daemon)
    digest = _digest("job", spec)
    if key and (earlier := _answered_before(daemon, user, key, digest)) is not None:
        return int(earlier)
    account = check_account(daemon, user)
    check_job(daemon, spec, account)
    now = daemon.clock()
    document = spec.model_dump()
    document["begin"], document["latest_start"] = _window(spec.begin, spec.latest_start, now)
    with daemon.store.transaction() as db:
        if key and (earlier := answered(daemon, db, user, key, digest, now)) is not None:
            return int(earlier)
        check_room(daemon, db, user, 1)
        check_dependencies(daemon, db, document["after"])
        job_id = daemon.store.add_job(db, document, now, user=user)
        if key:
            daemon.store.remember_answer(db, user, key, digest, job_id, now)
    queue(daemon, job_id, document, now, user)
    journal.accepted(job_id, document, user=user)
    daemon.metrics.submitted.inc()
    return job_id


def submit_workflow(daemon: Daemon, spec: WorkflowSpec, user: str = "", key: str = "") -> tuple[int, list[int]]:
    """Accept a workflow owned by `user`; its first ready stages are submitted now, the rest as they
    become ready. Sent again with the same `key`, it answers what was accepted the first time."""
    _accepting(daemon)
    digest = _digest("workflow", spec)
    if key and (earlier := _answered_before(daemon, user, key, digest)) is not None:
        return _workflow_answer(earlier)
    account = check_account(daemon, user)
    for stage in spec.stages:
        try:
            check_job(daemon, spec.job_spec(stage.name), account)
        except Rejected as exc:
            raise Rejected(spec.path_of(stage.name, exc.field), exc.problem) from None
    now = daemon.clock()
    spec.begin = _window(spec.begin, None, now)[0]
    with daemon.store.transaction() as db:
        if key and (earlier := answered(daemon, db, user, key, digest, now)) is not None:
            return _workflow_answer(earlier)
        check_room(daemon, db, user, len(spec.stages))
        check_dependencies(daemon, db, [dependency.model_dump() for dependency in spec.after])
        workflow_id = daemon.store.add_workflow(db, spec.name, spec.model_dump(), now, user=user)
        released = workflow_stages.release(daemon.store, db, workflow_id, now)
        if key:
            answer = [workflow_id, [job_id for job_id, _ in released]]
            daemon.store.remember_answer(db, user, key, digest, answer, now)
    for job_id, document in released:
        queue(daemon, job_id, document, now, user, workflow_id)
        journal.accepted(job_id, document, workflow_id, user=user)
    daemon.metrics.submitted.inc(len(released))
    return workflow_id, [job_id for job_id, _ in released]


def answered(daemon: Daemon, db: sqlite3.Connection | None, user: str, key: str, digest: str, now: float) -> Any:
    """What `user`'s submission sent with the `Idempotency-Key` `key` was answered (None: none was).

    Why: a client that lost the answer (a timeout, a connection reset, the daemon killed after
    the commit) cannot tell whether its job was accepted; sending it again made a second job that
    ran too. With the same key, the retry gets the first answer instead. The same key with another
    body is a client's mistake, refused rather than answered with a job it did not describe.
    """
    earlier = daemon.store.answered(user, key, now, db)
    if earlier is None:
        return None
    if earlier[0] != digest:
        raise Rejected("Idempotency-Key", f"{key!r} was sent with another submission; a new one needs a new key")
    return earlier[1]


def _workflow_answer(earlier: Any) -> tuple[int, list[int]]:
    """A workflow's first answer as `remember_answer` kept it: [workflow id, its first jobs]."""
    return int(earlier[0]), [int(job_id) for job_id in earlier[1]]


def _answered_before(daemon: Daemon, user: str, key: str, digest: str) -> Any:
    """`answered`, before the submission's checks: a retry gets its first answer even where they
    would now refuse it (its image removed since, its latest start past, the caps reached by it).
    Asked again in the transaction that stores, for two copies sent at once."""
    return answered(daemon, None, user, key, digest, daemon.clock())


def _digest(kind: str, spec: JobSpec | WorkflowSpec) -> str:
    """The submission as sent (before its start window is resolved on the daemon's clock)."""
    return hashlib.sha256(f"{kind}\n{spec.model_dump_json()}".encode()).hexdigest()


def _window(begin: float | str | None, latest: float | str | None, now: float) -> tuple[float | None, float | None]:
    """A submission's start window on the daemon's clock; Rejected naming the field it breaks."""
    window = start_window.absolute(begin, now), start_window.absolute(latest, now)
    problem = start_window.problem(*window, now)
    if problem is not None:
        raise Rejected(*problem)
    return window


def queue(
    daemon: Daemon, job_id: int, document: dict[str, Any], submit: float, user: str, workflow: int | None = None
) -> None:
    """Hand an accepted job (stored already) to the next pass; one with dependencies enters the
    core held, in the same pass (`cosched.daemon.dependencies`). Once: a rebuild between the
    submission's commit and this call has queued it from the store already."""
    job = job_from(daemon, job_id, document, submit, user, workflow)
    with daemon.lock:
        if job_id in daemon.specs:
            return
        daemon.specs[job_id] = document
        daemon.inbox.append(JobSubmitted(job))
        if document.get("after"):
            daemon.inbox.append(JobHeld(job_id))
            daemon.waiting[job_id] = document["after"]
            daemon.settle_due = True


def user_number(daemon: Daemon, user: str) -> int:
    """The core's number for a user name (-1: no user). Jobs carry user ids as SWF's do, so a
    policy that counts per user (fair-share) reads live jobs as it reads a trace's."""
    if not user:
        return -1
    return daemon.user_numbers.setdefault(user, len(daemon.user_numbers))


def user_names(daemon: Daemon) -> dict[int, str]:
    """The core's user ids back to names ('' for none); read beside submissions that add some."""
    return {number: name for name, number in list(daemon.user_numbers.items())}


def job_from(
    daemon: Daemon, job_id: int, spec: dict[str, Any], submit: float, user: str, workflow: int | None = None
) -> Job:
    cores = int(spec["cores"])
    memory = memory_mib(daemon, spec)
    begin, latest_start = start_window.stored(spec)
    return Job(
        id=job_id,
        submit=submit,
        cores=cores,
        walltime=float(spec["walltime"]),
        memory=_per_core(memory, cores),
        user=user_number(daemon, user),
        workflow=None if workflow is None else str(workflow),
        stage=spec.get("app_class") or "unknown",
        tasks=int(spec.get("tasks") or 1),
        parallel=bool(spec.get("parallel", True)),
        span=_spans(daemon, spec),
        begin=begin,
        latest_start=latest_start,
        throttle=int(spec.get("max_running") or 0),
        coschedule=bool(spec.get("coschedule", True)),
    )


def _spans(daemon: Daemon, spec: dict[str, Any]) -> bool:
    """Whether a job's cores may come from several nodes: its spec's word, else yes on one host
    (the nodes are parts of it) and no on Mesos (each node is an agent: a job there is a gang)."""
    span = spec.get("span")
    return bool(span) if span is not None else daemon.config.backend.kind != "mesos"


def _per_core(memory: int, cores: int) -> int:
    """The core's memory of a job is per core (as SWF's), rounded up: never less than asked."""
    return math.ceil(memory / cores)


def memory_mib(daemon: Daemon, spec: dict[str, Any]) -> int:
    """A job's memory in all: as asked, or `default_memory_per_core` per core (Slurm's DefMemPerCPU)."""
    return int(spec.get("memory_mib") or int(spec["cores"]) * daemon.config.cluster.default_memory_per_core)

"""What operators ask the daemon: the queue, one job, the nodes, a job's lending decisions.

Plain dictionaries, so the API returns them as JSON and the CLI prints them as
tables; the wording follows Slurm's (`squeue --start` reasons, `scontrol show`).
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from cosched.core.events import JobHeld, JobReleased
from cosched.core.view import SchedulerView
from cosched.daemon import drain, submissions, workflow_stages
from cosched.daemon import nodes as machines
from cosched.daemon.job_actions import OPERATOR_HOLD
from cosched.model import Job, JobState
from cosched.policies.fairshare import FairShare, fairshare_factors

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cosched.daemon.service import Daemon

T = TypeVar("T")


def queue(daemon: Daemon) -> list[dict[str, Any]]:
    """Pending and running jobs: pending ones in the order the queue policy serves them,
    with Slurm's reason (Resources for the head, Priority behind it) and the start the
    backfill policy reserved at the last pass, where it reserved one (conservative for every
    job, on arrival; EASY for the head, also between the passes that ask it for no plan:
    `_promised_to_head`).

    No second scheduler estimates starts here: what is shown is what the core planned."""
    now = daemon.clock()
    queued, jobs = _snapshot(daemon)
    core = daemon.core
    running = [job for job in jobs if job.state is JobState.RUNNING]
    # A copy: a policy may refresh what it caches when asked for an order (fair-share's factors),
    # and when it does is the pass's to decide, not a query's.
    policy = copy.copy(core.queue_policy)
    # A one-by-one policy (DBF) picks one job at each start of a pass: no order beyond arrival to show.
    order: Sequence[Job] = queued if policy.one_by_one else policy.order(queued, _view_over(daemon, now, queued, jobs))
    # A job the machines still up can never hold (a Mesos agent gone) has no start to promise: inf.
    reservations = {job_id: at for job_id, at in daemon.reservations.items() if math.isfinite(at)}
    inbox = list(daemon.inbox)
    arriving = [e.job for e in inbox if hasattr(e, "job")]
    # holds and releases the next pass takes: shown now, as `status` shows them (from the state file)
    asked = {e.job_id: isinstance(e, JobHeld) for e in inbox if isinstance(e, JobHeld | JobReleased)}
    waiting = daemon.backend.waiting()
    rows = []
    out_of_service = _out_of_service(daemon)
    priority = policy.priority if isinstance(policy, FairShare) else None  # Slurm's sprio: why this order
    limit, head = core.limit, True
    for job in order:
        if asked.get(job.id):
            continue
        reason = _not_available(daemon, job, out_of_service)
        capped = "" if reason or limit is None else limit.blocking(job)  # out of the pass: not the head
        reason = reason or capped or ("Resources" if head else "Priority")
        head = head and bool(capped)
        start = reservations.get(job.id)
        if reason == "Resources" and job.id not in daemon.reservations:  # (one at inf: never, shown none)
            start = _promised_to_head(daemon, now, job, jobs)
        why = core.not_lent.get(job.id) if reason in ("Resources", "Priority") else None  # (not beside a drain)
        if why:  # offered for co-scheduling at the last pass, and not lent to
            lender = core.cosched.name if core.cosched is not None else ""
            why = why.format(cores=job.cores, policy=lender, job=job.id, sharing=core.sharing)
            reason = f"{reason}; not co-scheduled: {why}"
        rows.append(_row(daemon, job, "pending", reason, start))
        if priority is not None:
            rows[-1]["priority"] = round(priority(job, now))
    rows += [_row(daemon, job, "pending", "Submitted", None) for job in arriving if not asked.get(job.id)]
    in_queue = {job.id for job in queued}
    held = [job for job in jobs if job.state is JobState.PENDING and (job.id not in in_queue or asked.get(job.id))]
    held += [job for job in arriving if asked.get(job.id)]
    rows += [
        _row(daemon, job, "pending", _held_reason(daemon, job, asked.get(job.id), now), None)
        for job in sorted(held, key=lambda j: j.begin)
    ]
    owners = daemon.store.owners()
    for job in sorted(running, key=lambda j: j.start):
        if job.id in waiting:  # the core started it; its machines have not given what it needs yet,
            state = "running" if job.id in daemon.containers else "launching"  # or its run was lost
            rows.append(_row(daemon, job, state, waiting[job.id], None))
            continue
        rows.append(
            _row(
                daemon,
                job,
                "running",
                f"on {_nodelist(job.slots)}" + (f" (guest of {job.host})" if job.host >= 0 else ""),
                None,
            )
        )
    for row in rows:
        row["user"] = owners.get(row["id"], "")
    return rows


def _promised_to_head(daemon: Daemon, now: float, head: Job, jobs: list[Job]) -> float | None:
    """The blocked head's start by the backfill policy's own rule (`reserved_start`), when the
    last pass asked it for no plan: the cluster full, or nothing to backfill. EASY reserves only
    when something could backfill, so `cosched queue` showed N/A for the head almost always."""
    at = daemon.core.backfill.reserved_start(_view_over(daemon, now, [head], jobs), head)
    return at if at is not None and math.isfinite(at) else None


def _view_over(daemon: Daemon, now: float, queued: list[Any], jobs: list[Any]) -> SchedulerView:
    """A policies' view of our own over a snapshot (the core's view belongs to the pass), laid out
    as the core's is: hosts by expected end, guests by their host, what ends will not give back."""
    hosts = sorted((j for j in jobs if j.state is JobState.RUNNING and j.host < 0), key=lambda j: j.expected_end)
    guests: dict[int, list[Job]] = {}
    for job in jobs:
        if job.state is JobState.RUNNING and job.host >= 0:
            guests.setdefault(job.host, []).append(job)
    core = daemon.core
    withheld = _copied(lambda: dict(core.withheld))
    by_id = {job.id: job for job in jobs}
    return SchedulerView(now, daemon.cluster, queued, hosts, core.pool, guests, by_id, withheld)


def _snapshot(daemon: Daemon) -> tuple[list[Any], list[Any]]:
    """The queue (in the order it is kept) and the core's jobs, copied without the scheduling
    lock: a pass holds it while it steps the core, and a query must not wait for that."""
    core = daemon.core
    return _copied(lambda: (list(core.queue), list(core.jobs.values())))


def _copied(take: Callable[[], T]) -> T:
    """`take()`, a copy of the core's state, taken without the scheduling lock: a copy that races a pass's
    change (the dict changed size while being copied) is simply taken again."""
    while True:
        try:
            return take()
        except RuntimeError:
            continue


def _row(daemon: Daemon, job: Any, state: str, reason: str, start: float | None) -> dict[str, Any]:
    spec = daemon.specs.get(job.id, {})
    return {
        "id": job.id,
        "name": spec.get("name", ""),
        "state": state,
        "cores": job.cores,
        "walltime": job.walltime,
        "submit": job.submit,
        "start": job.start if state == "running" else start,
        "quota": job.quota if state == "running" else None,
        "reason": reason,
        "app_class": job.stage,
        "workflow": job.workflow,
        "begin": job.begin if math.isfinite(job.begin) else None,
        "latest_start": job.latest_start if math.isfinite(job.latest_start) else None,
    }


def _out_of_service(daemon: Daemon) -> dict[int, str]:
    """Nodes no job can start on now, and why: drained by an operator, or down (a Mesos agent gone)."""
    return {**{node: "down" for node in daemon.down}, **{node: "drained" for node in daemon.drained}}


def _not_available(daemon: Daemon, job: Any, out: dict[int, str]) -> str:
    """Slurm's ReqNodeNotAvail for a job the nodes in service cannot hold, whatever ends (it waits
    for a node to come back), naming those nodes; '' for any other."""
    if not out:
        return ""
    cluster = daemon.cluster
    in_service = cluster.nodes - len(out)
    if (job.cores <= in_service * cluster.cores_per_node) if job.span else (in_service > 0):
        return ""
    nodes = ", ".join(f"node{node} {why}" for node, why in sorted(out.items()))
    return f"ReqNodeNotAvail: {nodes}"


def _held_reason(daemon: Daemon, job: Job, hold_asked: bool | None, now: float) -> str:
    """Why a pending job is out of the queue, in Slurm's words: its dependencies, its user's
    hold, or its begin. A job its dependencies have just released stays held in the core until
    the next pass takes the release, which may wait on this pass's launches: not the user's hold.
    `hold_asked`: a hold (True) or release (False) the next pass takes, None if none."""
    if job.id in daemon.waiting:
        return "Dependency"
    if hold_asked is False:  # released (its user, or its dependencies): in the queue from the next pass
        begin = daemon.core.begin_once_released(job)
        return begins_at(begin) if begin > now else "Submitted"
    if hold_asked is None and not daemon.core.is_held(job.id):
        return begins_at(job.begin)
    held = int((daemon.store.job(job.id) or {}).get("held") or 0)
    if daemon.specs.get(job.id, {}).get("after") and not held:
        return "Dependency"
    return hold_reason(held)


def hold_reason(held: int) -> str:
    """Slurm's word for a hold: its owner's, or an operator's (which only an operator lifts)."""
    return "JobHeldAdmin" if held == OPERATOR_HOLD else "JobHeldUser"


def begins_at(stamp: float) -> str:
    """A held job's pending reason (Slurm says BeginTime): when it enters the queue."""
    return "begins at " + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))


def _nodelist(slots: Any) -> str:
    return ",".join(f"node{node}:{cores}" for node, cores in slots if cores)


def job_status(daemon: Daemon, job_id: int) -> dict[str, Any] | None:
    record = daemon.store.job(job_id)
    if record is None:
        return None
    spec = record["spec"]
    machines = bool(daemon.backend.node_status())
    status = {
        "id": record["id"],
        "name": spec.get("name", ""),
        "user": record["user"],
        "state": record["state"],
        "image": spec["image"],
        "command": spec["command"],
        "cores": spec["cores"],
        "memory_mib": submissions.memory_mib(daemon, spec),  # the default too: what its cgroup is given
        "walltime": spec["walltime"],
        "app_class": spec.get("app_class"),
        "coschedule": spec.get("coschedule", True),
        "submit": record["submit"],
        "start": record["start"],
        "end": record["end"],
        "runtime": (record["end"] - record["start"]) if record["end"] and record["start"] else None,
        "cpu_seconds": record["cpu_seconds"],
        # On Mesos the node is an agent, and its jobs are pinned to no CPU (docs/mesos.md).
        "cpus": daemon.cpu_map.cpuset(record["cpus"]) if record["cpus"] is not None and not machines else None,
        "quota": record["quota"],
        "host": record["host"] if record["host"] >= 0 else None,
        "exit_code": record["exit_code"],
        "reason": record["reason"],
        "log_tail": record["log_tail"],
        "workflow": record["workflow"],
        "stage": record["stage"],
        "quota_changes": daemon.store.quota_changes(job_id),
        "begin": spec.get("begin"),
        "latest_start": spec.get("latest_start"),
        "after": spec.get("after") or [],
    }
    if record["state"] == "pending" and job_id in daemon.waiting:
        status["reason"] = "Dependency"
    elif record["state"] == "pending" and record["held"]:
        status["reason"] = hold_reason(record["held"])
    elif record["state"] == "pending" and spec.get("begin") is not None and spec["begin"] > daemon.clock():
        status["reason"] = begins_at(spec["begin"])
    elif record["state"] == "pending":  # in the queue: why it waits and when it may start, as `cosched queue` says
        row = next((row for row in queue(daemon) if row["id"] == job_id), None)
        if row is not None and row["reason"] != "Submitted":  # `reason` stays the record's (a requeue's)
            status["pending_reason"], status["expected_start"] = row["reason"], row["start"]
    job = daemon.core.jobs.get(job_id)
    if job is not None and job.usage is not None:
        status["usage"] = {
            "cpu": job.usage.cpu,
            "mem": job.usage.mem,
            "tasks_done": job.usage.tasks_done,
            "tasks": job.tasks,
        }
    return status


def job_log(daemon: Daemon, record: dict[str, Any], lines: int) -> dict[str, Any]:
    """The last `lines` of a job's output (`record`, its row): read from its machine while it runs
    (`live`), else the tail kept at its end (`docker.log_tail` lines)."""
    job_id = record["id"]
    answer = {"id": job_id, "user": record["user"], "state": record["state"], "live": False, "note": None}
    container = daemon.containers.get(job_id) if record["state"] == "running" else None
    text = daemon.backend.live_log(container, lines) if container is not None else None
    if text is not None:
        return {**answer, "live": True, "log": text}
    if record["state"] == "running":
        answer["note"] = "its machine cannot read its output while it runs"
    kept = (record["log_tail"] or "").splitlines(keepends=True)
    return {**answer, "log": "".join(kept[-lines:])}


def workflow_status(daemon: Daemon, workflow_id: int) -> dict[str, Any] | None:
    record = daemon.store.workflow(workflow_id)
    if record is None:
        return None
    rows = {row["stage"]: row for row in daemon.store.jobs(workflow=workflow_id)}
    jobs = {stage: row["id"] for stage, row in rows.items()}
    failed = rows.get(record["failed_stage"]) if record["failed_stage"] else None
    return {
        "id": workflow_id,
        "name": record["name"],
        "user": record["user"],
        "state": record["state"],
        "failed_stage": record["failed_stage"],
        # Why it failed, where the operator looks first: the stage's exit status and last lines.
        "failure": None
        if failed is None
        else {"job": failed["id"], "exit_code": failed["exit_code"], "log_tail": failed["log_tail"]},
        "submitted": record["submitted"],
        "stages": {
            stage: {"state": state, "job": jobs.get(stage)}
            for stage, state in workflow_stages.stage_states(daemon.store, workflow_id).items()
        },
    }


def nodes(daemon: Daemon) -> list[dict[str, Any]]:
    """Per node: CPUs (one host) or the Mesos agent behind it, allocated cores, quota lent to
    guests, CPU used, jobs, and its drain if an operator took it out of service."""
    running = [job for job in _snapshot(daemon)[1] if job.state is JobState.RUNNING]
    used = dict(daemon.metrics.cpu_used)
    cpus_of = dict(daemon.cpus_of)
    agents = daemon.backend.node_status()
    with daemon.lock:
        held_by_others = machines.others(daemon)
    rows = []
    for node, cpus in enumerate(daemon.cpu_map.node_cpus):
        here = [job for job in running if any(n == node and c for n, c in job.slots)]
        allocated = sum(c for job in here if job.host < 0 for n, c in job.slots if n == node)
        lent = sum(job.quota for job in here if job.host >= 0)
        rows.append(
            {
                "node": node,
                "cpus": daemon.cpu_map.cpuset(cpus) if not agents else None,
                "cores": len(cpus),
                "allocated": allocated,
                "lent": round(lent, 3),
                "used": round(sum(used.get(job.id, 0.0) for job in here), 3),
                "memory_mib": daemon.cluster.memory_per_node,
                "hostname": agents[node].name if agents else None,
                "agent": agents[node].id if agents else None,
                "attributes": dict(agents[node].attributes) if agents else None,
                "up": agents[node].up if agents else True,
                "others": held_by_others.get(node, "") if agents else None,
                "drain": drain.row(daemon, node, busy=bool(here)),
                "jobs": [
                    {
                        "id": job.id,
                        "quota": job.quota,
                        "host": job.host if job.host >= 0 else None,
                        "cpus": daemon.cpu_map.cpuset(cpus_of.get(job.id, [])) if not agents else None,
                    }
                    for job in here
                ],
            }
        )
    return rows


LENDERS = (
    "host", "host_cores", "app_class", "features", "experts", "distributions", "weights", "action", "learner",
    "loss", "host_runtime", "baseline", "busy_then", "lent_until", "shared_busy", "shared_quota", "lender_alone",
    "note",
)  # fmt: skip
"""What a decision tells of its lender: its job, its kind and measured state, how the lending cost it,
and how it ended (a note: cancelled, killed at its walltime)."""


def explain(daemon: Daemon, job_id: int, viewer: str | None = None) -> list[dict[str, Any]]:
    """Every lending decision in which the job was the guest or the lender. For a `viewer` who sees
    their own jobs only (`api.private_data`), what a decision tells of the other party's job, when it
    is another user's, is left out: a guest's owner read the lender's kind, CPU, memory, progress
    and runtime (a helper's audit)."""
    decisions = daemon.store.decisions(job_id)
    for decision in decisions:
        if decision["host"] != job_id and others(daemon, decision["host"], viewer):
            decision.update(dict.fromkeys(LENDERS))
        if decision["guest"] != job_id and others(daemon, decision["guest"], viewer):
            decision["guest"] = None
    return decisions


def others(daemon: Daemon, job_id: int, viewer: str | None) -> bool:
    """Whether job `job_id` is another user's than `viewer`, who sees their own only (None: all)."""
    return viewer is not None and (daemon.store.job(job_id) or {}).get("user", "") != viewer


def shares(daemon: Daemon) -> list[dict[str, Any]] | None:
    """Each user's decayed usage and fair-share factor now, as Slurm's `sshare` shows them,
    most used first; None when the queue policy counts no usage."""
    policy = daemon.core.queue_policy
    if not isinstance(policy, FairShare):
        return None
    queued, jobs = _snapshot(daemon)
    used = policy.used(_view_over(daemon, daemon.clock(), queued, jobs))
    factors = fairshare_factors(used)
    total = sum(used.values())
    names = submissions.user_names(daemon)
    counts = Counter((job.user, job.state) for job in jobs)
    return [
        {
            "user": names.get(user, ""),
            "usage": usage,
            "effective_usage": usage / total if total > 0 else 0.0,
            "fairshare": factors[user],
            "pending": counts[user, JobState.PENDING],
            "running": counts[user, JobState.RUNNING],
        }
        for user, usage in sorted(used.items(), key=lambda item: (-item[1], item[0]))
    ]


def history(
    daemon: Daemon, since: float, until: float, user: str | None, state: str | None, limit: int
) -> list[dict[str, Any]]:
    """Ended jobs, as Slurm's `sacct` lists them: when each waited and ran, its cores and
    core-seconds (cores x elapsed, Slurm's CPUTime: what it held, whether it used it or lent
    it), the CPU seconds it used by its last sample and their share of those core-seconds (Slurm's
    seff: what lending could have given away), how it ended. A job cancelled before it started
    has no start and 0 core-seconds; one never sampled (shorter than a sampling interval) no CPU
    seconds."""
    rows = []
    for record in daemon.store.ended(since, until, user, state, limit):
        spec, start, end = record["spec"], record["start"], record["end"]
        elapsed = end - start if start is not None else 0.0
        rows.append(
            {
                "id": record["id"],
                "name": spec.get("name", ""),
                "user": record["user"],
                "state": record["state"],
                "nodes": _nodelist(record["slots"]) if record["slots"] and start is not None else "",
                "workflow": record["workflow"],
                "stage": record["stage"],
                "app_class": spec.get("app_class"),
                "cores": spec["cores"],
                "submit": record["submit"],
                "start": start,
                "end": end,
                "wait": (start if start is not None else end) - record["submit"],
                "elapsed": elapsed,
                "core_seconds": spec["cores"] * elapsed,
                "cpu_seconds": record["cpu_seconds"],
                "cpu_efficiency": record["cpu_seconds"] / (spec["cores"] * elapsed)
                if record["cpu_seconds"] is not None and elapsed > 0
                else None,
                "exit_code": record["exit_code"],
                "reason": record["reason"],
            }
        )
    return rows

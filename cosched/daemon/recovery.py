"""Start-up: rebuild the core from the store and what Docker reports.

The rules, each safe whatever instant the previous run died at:
- `launching` with no container: the container was never made, so the job
  goes back to the queue (it never ran; nothing runs twice). Where the machines
  may not have told of it yet (Mesos, an agent not back after a master
  failover), it is asked for first (`Backend.expect_launch`), as a running one is.
- `launching` or `running` with a container that was created but never
  started: removed, and the job goes back to the queue.
- a started container (running or exited): adopted; an exited one is then
  collected by the first pass like any other end.
- `running` with no container at all: it was removed behind our back; the job
  failed ("container lost").
- a container of a job the store has no record of, or of a run it never
  began: the store is older than the containers (a backup put back), so the
  start is refused before anything is touched.
- containers of ours for jobs the store calls finished, or of a run before
  the one it began last (a requeued run's): leftovers of a pass that recorded
  the end but died before removing them; removed now.
Adopted jobs get the quota the store last decided, applied and read back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from cosched.core.events import Event, JobAdopted, JobCancelled, JobHeld, Offer
from cosched.core.pool import slot_memory
from cosched.core.scheduler import host_quota
from cosched.daemon import carry_out, engine_faults, submissions, workflow_stages
from cosched.daemon.store import DECISIONS_KEPT
from cosched.errors import ConfigError
from cosched.model import Job
from cosched.policies.asax import LendingDecision

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")


def recover(daemon: Daemon) -> None:
    store, backend = daemon.store, daemon.backend
    live = store.jobs(("pending", "launching", "running"))
    for record in live:
        slots = tuple((int(node), int(cores)) for node, cores in record["slots"] or ())
        if record["state"] == "running" and record["container"]:
            backend.expect(record["container"], record["id"], slots)
        elif record["state"] == "launching":
            backend.expect_launch(record["id"], record["launches"], slots)
    listed = backend.containers()
    _refuse_another_file(daemon, live, listed)
    adopted, queued, lost = [], [], []
    for record in live:
        if record["lost_runs"]:
            daemon.lost_runs[record["id"]] = record["lost_runs"]
        info = listed.pop(record["id"], None)
        if info is not None and (record["state"] == "pending" or not info.is_run(record["launches"])):
            log.info("removing container %s that an earlier run of job %d left", info.shown, record["id"])
            backend.remove(info.id)  # its end is recorded (requeued), its removal was cut short
            info = None
        if record["state"] == "pending":
            queued.append(record)
        elif info is not None and info.state != "created":
            adopted.append((record, info.id))
        elif info is not None or record["state"] == "launching":
            if info is not None:
                backend.remove(info.id)
            queued.append(record)
        else:
            lost.append(record)
    engine_faults.remove_leftovers(daemon, listed)

    now = daemon.clock()
    # Read while lost lenders still count as live (`_NEEDED`): failed below, a lending of theirs whose
    # guest ended and that 256 newer ones pushed back would be reloaded no more, nor resolved.
    needed = store.decisions_needed(DECISIONS_KEPT) if daemon.asax is not None else []
    with store.transaction() as db:
        for record in queued:
            store.update_job(
                db, record["id"], state="pending", start=None, slots=None, cpus=None, quota=None, host=-1, requeue=None
            )
        for record in lost:
            store.update_job(
                db, record["id"], state="failed", end=now, reason="container lost while the daemon was down"
            )
            if record["workflow"] is not None:
                workflow_stages.fail(store, db, record["workflow"], record["stage"] or "")

    jobs = {}
    for record, container in adopted:
        job = submissions.job_from(
            daemon, record["id"], record["spec"], record["submit"], record["user"], record["workflow"]
        )
        job.start = record["start"]
        job.slots = tuple((int(n), int(c)) for n, c in record["slots"])
        if beyond := [node for node, _ in job.slots if node >= daemon.cluster.nodes]:  # a traceback before
            raise ConfigError(
                f"job {job.id} runs on node {beyond[0]}, and this cluster has nodes 0 to {daemon.cluster.nodes - 1}"
                " only: start with the cluster.nodes it was started under, and let it end first"
            )
        job.host = record["host"]
        job.quota = float(record["quota"] if record["quota"] is not None else job.cores)
        jobs[job.id] = job
        daemon.specs[job.id] = record["spec"]
        daemon.containers[job.id] = container
        if record["requeue"]:  # asked before the daemon stopped: the first review kills it
            daemon.requeue_asked[job.id] = record["requeue"]
        daemon.cpus_of[job.id] = list(record["cpus"])
        daemon.cpu_map.claim(daemon.cpus_of[job.id])
        backend.adopt(container)
    for job in jobs.values():  # a guest whose host is gone keeps its share as its own job
        host = jobs.get(job.host) if job.host >= 0 else None
        # (and one whose host's run began after it: the host was requeued since, which a daemon
        # before it recorded the guest's detachment left in the state file)
        if job.host >= 0 and (host is None or host.start > job.start):
            job.host = -1
            job.quota = float(job.cores)
    for job in jobs.values():  # a host's quota is its cores less what its guests hold now
        if job.host < 0:
            job.quota = host_quota(job, (guest for guest in jobs.values() if guest.host == job.id))

    before: dict[int, float] = {}
    with store.transaction() as db:  # what recovery settled is the store's truth from now on
        for record, _ in adopted:
            job = jobs[record["id"]]
            quota = float(record["quota"] if record["quota"] is not None else job.cores)
            if job.quota != quota:  # a lending that ended while the daemon was down
                before[job.id] = quota
                store.log_quota(db, job.id, job.quota, now)
        for job in jobs.values():
            store.update_job(
                db, job.id, state="running", container=daemon.containers[job.id], quota=job.quota, host=job.host
            )
    events: list[Event] = [_free_offer(daemon, jobs)]
    events += [JobAdopted(job) for job in sorted(jobs.values(), key=lambda j: (j.host >= 0, j.id))]
    for record in queued:
        submissions.queue(daemon, record["id"], record["spec"], record["submit"], record["user"], record["workflow"])
        if record["cancel"]:
            daemon.inbox.append(JobCancelled(record["id"]))
        elif record["held"]:
            daemon.inbox.append(JobHeld(record["id"]))
    for job in jobs.values():
        if (store.job(job.id) or {}).get("cancel"):
            daemon.kill_reason[job.id] = "cancelled by user"
            daemon.inbox.append(JobCancelled(job.id))
    _restore_learning(daemon, jobs, needed)
    _restore_usage(daemon, now, jobs, before)
    daemon.core.step(now, events)
    carry_out.apply_quotas(daemon, [(job.id, job.quota, None) for job in jobs.values()])
    _resume_workflows(daemon, now)
    log.info(  # adopted: running, or ended while the daemon was down (the first pass collects those)
        "recovered: %d adopted, %d queued, %d lost, instance %s",
        len(jobs),
        len(queued),
        len(lost),
        daemon.instance,
    )


def _refuse_another_file(daemon: Daemon, live: list[dict[str, Any]], listed: dict[int, Any]) -> None:
    """Refuse, before any container is touched, a state file older than the containers: one with no
    record of a container's job, or that never began its run (a copy put back after the job started:
    its running container was removed as an earlier run's, and the job ran again). A container is made
    only after its job's row and run are committed, so this is not the file they were launched from."""
    store = daemon.store
    began = {record["id"]: record["launches"] for record in live}
    unknown = sorted(job_id for job_id in listed if job_id not in began and store.job(job_id) is None)
    if unknown:
        raise ConfigError(
            f"state file {store.path} has no record of job(s) {', '.join(map(str, unknown[:10]))} whose containers "
            f"exist under instance {daemon.instance}: it is not the file they were accepted in; put that one back, "
            f"or remove those containers (label cosched.instance={daemon.instance})"
        )
    newer = sorted(
        (job_id, info.run) for job_id, info in listed.items() if job_id in began and (info.run or 0) > began[job_id]
    )
    if newer:
        runs = ", ".join(f"job {job_id} run {run}" for job_id, run in newer[:10])
        raise ConfigError(
            f"state file {store.path} is older than the containers of {runs} under instance {daemon.instance}: it "
            f"never began those runs, so it is not the file they were launched from; put that one back, or remove "
            f"those containers (label cosched.instance={daemon.instance}) and their jobs run again"
        )


def _free_offer(daemon: Daemon, jobs: dict) -> Offer:
    """Every node's cores and memory less what adopted hosts hold (guests share their host's);
    nothing of a node whose machine is gone (it is offered when it comes back)."""
    cluster = daemon.cluster
    cores = [0 if node in daemon.down else cluster.cores_per_node for node in range(cluster.nodes)]
    memory = [0 if node in daemon.down else cluster.memory_per_node for node in range(cluster.nodes)]
    for job in jobs.values():
        if job.host >= 0:
            continue
        held = slot_memory(cluster, job, job.slots) or (0,) * len(job.slots)
        for (node, count), mib in zip(job.slots, held, strict=True):
            if node in daemon.down:
                continue
            cores[node] -= count
            memory[node] -= mib
    return Offer(tuple(enumerate(cores)), tuple(memory))


def _restore_learning(daemon: Daemon, adopted: dict[int, Job], needed: list[dict[str, Any]]) -> None:
    """Decisions come back. A lending whose guest never started is marked not carried out (a
    requeued guest's ran: it waits for its lender's end), in the state file too, at the next pass:
    by the next restart the guest may run, and the lending would pass for one carried out."""
    if daemon.asax is None:
        return
    decisions, voided = [], []
    for body in needed:
        decision = LendingDecision.from_stored(body)
        if decision.loss is None and decision.executed and decision.fraction > 0 and decision.lent_until is None:
            guest = daemon.store.job(decision.guest)
            if guest is None or guest["state"] == "pending":  # it never ran on the lending
                decision.executed = False
                decision.note = "none: not carried out (the daemon restarted before the guest started)"
                voided.append(decision)
        decisions.append(decision)
    daemon.asax.restore(decisions, running=adopted)
    daemon.asax.resolved.extend(voided)
    daemon.saved_decisions = daemon.asax.decided


def _restore_usage(daemon: Daemon, now: float, adopted: dict[int, Job], before: dict[int, float]) -> None:
    """A queue policy that counts what users ran (fair-share) is told again what the core told it
    (`Scheduler.charged`, saved by each pass): its counts are never saved, only what they count.
    An adopted job's quota counts on from its last charge of this run (or its start), whatever the
    policy, since the charges are kept for any; one whose quota recovery changed (`before`: a
    lending gone while the daemon was down) is charged its old quota until now, as a live daemon
    is at a change, and that charge is saved too."""
    policy = daemon.core.queue_policy
    if policy.history > 0:
        for job_id, user, cpus, since, until in daemon.store.charges_since(now - policy.history):
            owner = submissions.user_number(daemon, user)
            policy.ran(Job(id=job_id, submit=since, cores=1, walltime=until - since, user=owner), since, until, cpus)
    last = daemon.store.last_charged(adopted)
    charged = []
    for job in adopted.values():
        job.quota_since = max(job.start, last.get(job.id, job.start))
        if job.id in before:
            policy.ran(job, job.quota_since, now, before[job.id])
            charged.append((job.id, before[job.id], job.quota_since, now))
            job.quota_since = now
    if charged:
        with daemon.store.transaction() as db:
            daemon.store.charge(db, charged)


def _resume_workflows(daemon: Daemon, now: float) -> None:
    """Stages that became ready just before a crash (their predecessor's end was recorded)."""
    store = daemon.store
    for workflow_id in store.workflow_ids("running"):
        with store.transaction() as db:
            released = workflow_stages.release(store, db, workflow_id, now)
        user = (store.workflow(workflow_id) or {}).get("user", "")
        for job_id, document in released:
            submissions.queue(daemon, job_id, document, now, user, workflow_id)

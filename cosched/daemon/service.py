"""The daemon: the scheduling core driven by a real clock and a Docker engine.

It is the live twin of `cosched.replay.driver.replay`: events in (submissions
from the API, container ends from Docker, usage from the cgroups), one
`Scheduler.step`, actions out. Each pass writes what it is about to do to the
store in one transaction, then does it, so a kill at any instant leaves a state
`recovery.recover` can finish (see `store.py`).

Every public method takes the one lock: the API's threads and the periodic
jobs never see the core half-stepped.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cosched.core.events import (
    Colocate,
    Event,
    JobCancelled,
    JobEnded,
    JobSubmitted,
    Kill,
    Launch,
    Offer,
    Reject,
    SetQuota,
    Slots,
    UsageReported,
)
from cosched.core.pool import slot_memory
from cosched.core.scheduler import Scheduler
from cosched.daemon import journal, workflow_stages
from cosched.daemon.config import DaemonConfig
from cosched.daemon.cpus import CpuMap, share_of
from cosched.daemon.docker_backend import DockerBackend, EngineUnavailable, QuotaMismatch, data_dirs_allowed
from cosched.daemon.metrics import DaemonMetrics
from cosched.daemon.sandbox import StagingMounts
from cosched.daemon.specs import JobSpec, WorkflowSpec
from cosched.daemon.store import Store
from cosched.errors import ConfigError, CoschedError
from cosched.model import Cluster, Job, JobState, Usage
from cosched.policies.asax import ASAx
from cosched.policies.registry import create
from experts.weights import WeightBook

log = logging.getLogger("cosched.daemon")


class Rejected(CoschedError):
    """A submission the daemon cannot accept; `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.problem = message


@dataclass(slots=True)
class _End:
    job: Job
    failed: bool
    at: float
    exit_code: int | None
    reason: str
    log_tail: str
    container: str | None


@dataclass(slots=True)
class _Plan:
    """What one pass decided, written to the store before it is carried out."""

    launches: list[tuple[Job, list[int], float, int | None]] = field(default_factory=list)
    quotas: list[tuple[int, float, int]] = field(default_factory=list)
    kills: list[int] = field(default_factory=list)
    submitted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


class Daemon:
    """State, core and backend of one `cosched daemon`."""

    def __init__(
        self, config: DaemonConfig, backend: DockerBackend | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = Store(config.state_dir / "state.sqlite")
        self.instance = config.daemon.instance or self._instance_id()
        self.backend = backend or DockerBackend(self.instance, config.docker, self._staging(config))
        nodes = config.cluster.nodes
        self.cpu_map = CpuMap(config.cpus(), nodes)
        self.cluster = Cluster(
            nodes,
            self.cpu_map.cores_per_node,
            config.memory_mib() // nodes,
            name="local",
        )
        self.asax = self._policy()
        self.core = self._new_core()
        self.lock = threading.RLock()
        self.inbox: deque[Event] = deque()
        self.specs: dict[int, dict[str, Any]] = {}
        self.containers: dict[int, str] = {}
        self.cpus_of: dict[int, list[int]] = {}
        self.reservations: Mapping[int, float] = {}
        self.kill_reason: dict[int, str] = {}
        self.failed_launches: dict[int, str] = {}
        self.engine_up = True
        self.metrics = DaemonMetrics()
        self._saved_decisions = 0

    # -- set-up -------------------------------------------------------------
    def _instance_id(self) -> str:
        instance = self.store.get_meta("instance")
        if instance is None:
            instance = uuid.uuid4().hex[:12]
            with self.store.transaction() as db:
                self.store.set_meta(db, "instance", instance)
        return str(instance)

    def _policy(self) -> ASAx | None:
        p = self.config.policies
        if p.cosched != "asax":
            return None
        state = self.store.get_meta("weights")
        asax = ASAx(p.experts or None, seed=p.seed, loss=p.loss, min_guest_share=p.min_guest_share)
        if state is not None:
            asax.book = WeightBook.from_state(state)
        return asax

    def _new_core(self) -> Scheduler:
        p = self.config.policies
        return Scheduler(
            self.cluster,
            create("queue", p.queue),
            create("backfill", p.backfill),
            create("estimate", p.estimate),
            create("placement", p.placement),
            self.asax if self.asax is not None else create("cosched", p.cosched),
            sharing=p.sharing,
            window=p.window,
        )

    def start(self) -> None:
        """Reach the engine and take over whatever an earlier run left (see `recovery`)."""
        from cosched.daemon.recovery import recover

        self.backend.connect()
        with self.lock:
            recover(self)

    # -- submissions --------------------------------------------------------
    @staticmethod
    def _staging(config: DaemonConfig) -> StagingMounts | None:
        """Where data dirs are pinned at launch; mounting needs root, so data roots need a root daemon."""
        if not config.docker.data_roots:
            return None
        if os.geteuid() != 0:
            raise ConfigError(
                "config key docker.data_roots: jobs' data dirs are bind-mounted nosuid,nodev at launch, "
                "which needs the daemon to run as root (or leave data_roots empty)"
            )
        staging = StagingMounts(config.state_dir / "mounts")
        staging.release_all()  # a daemon killed mid-launch may have left some
        return staging

    def check_job(self, spec: JobSpec) -> None:
        """Rejected naming the field if this cluster can never run `spec`."""
        cores = self.cluster.cores
        if spec.cores > cores:
            raise Rejected("cores", f"{spec.cores} cores asked, the cluster has {cores}")
        memory = self._memory_mib(spec)
        if memory > self.cluster.memory_per_node * self.cluster.nodes:
            raise Rejected(
                "memory_mib",
                f"{memory} MiB asked, the cluster has {self.cluster.memory_per_node * self.cluster.nodes}",
            )
        problem = data_dirs_allowed(spec.data_dirs, self.config.docker.data_roots)
        if problem:
            raise Rejected("data_dirs", problem)
        if not self.backend.has_image(spec.image):
            raise Rejected("image", f"image {spec.image!r} is not in the local Docker engine")

    def submit_job(self, spec: JobSpec) -> int:
        """Accept one job: stored before this returns, queued at the next pass."""
        self.check_job(spec)
        now = self.clock()
        document = spec.model_dump()
        with self.store.transaction() as db:
            job_id = self.store.add_job(db, document, now)
        self._queue(job_id, document, now)
        journal.accepted(job_id, document)
        self.metrics.submitted.inc()
        return job_id

    def submit_workflow(self, spec: WorkflowSpec) -> tuple[int, list[int]]:
        """Accept a workflow; its first ready stages are submitted now, the rest as they become ready."""
        for stage in spec.stages:
            try:
                self.check_job(spec.job_spec(stage.name))
            except Rejected as exc:
                raise Rejected(spec.path_of(stage.name, exc.field), exc.problem) from None
        now = self.clock()
        with self.store.transaction() as db:
            workflow_id = self.store.add_workflow(db, spec.name, spec.model_dump(), now)
            released = workflow_stages.release(self.store, db, workflow_id, now)
        for job_id, document in released:
            self._queue(job_id, document, now, workflow_id)
            journal.accepted(job_id, document, workflow_id)
        self.metrics.submitted.inc(len(released))
        return workflow_id, [job_id for job_id, _ in released]

    def cancel(self, job_id: int) -> str:
        """Ask for a job's end; returns its state then ('' if there is no such job)."""
        record = self.store.job(job_id)
        if record is None:
            return ""
        if record["state"] in ("pending", "launching", "running"):
            with self.store.transaction() as db:
                self.store.update_job(db, job_id, cancel=1)
            self.kill_reason.setdefault(job_id, "cancelled by user")
            self.inbox.append(JobCancelled(job_id))
        return str(record["state"])

    def _queue(self, job_id: int, document: dict[str, Any], submit: float, workflow: int | None = None) -> None:
        self.specs[job_id] = document
        self.inbox.append(JobSubmitted(self.job_from(job_id, document, submit, workflow)))

    def job_from(self, job_id: int, spec: dict[str, Any], submit: float, workflow: int | None = None) -> Job:
        cores = int(spec["cores"])
        memory = spec.get("memory_mib") or cores * self.config.cluster.default_memory_per_core
        return Job(
            id=job_id,
            submit=submit,
            cores=cores,
            walltime=float(spec["walltime"]),
            memory=math.ceil(memory / cores),
            workflow=None if workflow is None else str(workflow),
            stage=spec.get("app_class") or "unknown",
            tasks=int(spec.get("tasks") or 1),
            parallel=bool(spec.get("parallel", True)),
        )

    def _memory_mib(self, spec: JobSpec) -> int:
        """A job's memory in all: as asked, or `default_memory_per_core` per core (Slurm's DefMemPerCPU)."""
        if spec.memory_mib is not None:
            return spec.memory_mib
        return spec.cores * self.config.cluster.default_memory_per_core

    # -- the scheduling pass ------------------------------------------------
    def schedule(self) -> None:
        """One pass: collect ends, step the core, write the plan, carry it out.

        When stage ends released workflow stages, a second pass follows at once, so a
        stage starts in the pass that saw its predecessor end rather than one interval later.
        """
        with self.lock:
            if self._pass():
                self._pass()

    def _pass(self) -> bool:
        """The pass itself; True when it submitted workflow stages that the core has not seen."""
        with self.lock:
            if not self._engine_ready():
                return False
            started = time.perf_counter()
            now = self.clock()
            try:
                ends = self._collect_ends(now)
            except EngineUnavailable as exc:
                self._engine_lost(exc)
                return False
            events: list[Event] = []
            ended_now: set[int] = set()
            for end in ends:
                events.append(JobEnded(end.job.id, end.failed, end.at))
                offer = self._freed(end.job, ended_now)
                ended_now.add(end.job.id)
                if offer is not None:
                    events.append(offer)
            while self.inbox:
                events.append(self.inbox.popleft())
            cancels = self._cancel_targets(events)
            decision = self.core.step(now, events)
            self.reservations = decision.reservations
            plan = self._record(now, ends, cancels, decision.actions)
            for end in ends:
                journal.ended(end.job, end.exit_code, end.reason)
            journal.decided(decision.actions, self.cpus_of, self.kill_reason, cancels)
            self._carry_out(now, ends, decision.actions, plan)
            for job_id, document in plan.submitted:
                record = self.store.job(job_id)
                self._queue(job_id, document, now, record["workflow"] if record else None)
                journal.accepted(job_id, document, record["workflow"] if record else None)
            self.metrics.submitted.inc(len(plan.submitted))
            self.metrics.observe_pass(self, time.perf_counter() - started)
            return bool(plan.submitted)

    def _collect_ends(self, now: float) -> list[_End]:
        """Jobs whose containers stopped (or never could start) since the last pass."""
        ends: list[_End] = []
        for job_id, reason in list(self.failed_launches.items()):
            job = self.core.jobs.get(job_id)
            if job is not None:
                ends.append(_End(job, True, now, None, reason, "", self.containers.get(job_id)))
            del self.failed_launches[job_id]
        if not self.containers:
            return ends
        listed = self.backend.containers()
        for job_id, container in list(self.containers.items()):
            job = self.core.jobs.get(job_id)
            if job is None or any(e.job.id == job_id for e in ends):
                continue
            info = listed.get(job_id)
            if info is None:
                ends.append(_End(job, True, now, None, "container disappeared", "", None))
            elif info.state in ("exited", "dead"):
                exit = self.backend.exit_of(container)
                if exit.code == 0:
                    reason = ""  # it finished before a kill took effect
                else:
                    reason = self.kill_reason.get(job_id) or ("out of memory" if exit.oom else f"exit code {exit.code}")
                at = exit.finished if exit.finished > 0 else now
                ends.append(_End(job, exit.code != 0, at, exit.code, reason, self.backend.logs(container), container))
        return ends

    def _freed(self, job: Job, ended_now: set[int]) -> Offer | None:
        """What a job's end gives back: nothing while its cores are a running host's;
        a host's cores minus those its surviving guests keep."""
        core = self.core
        if job.host >= 0 and job.host in core.jobs and job.host not in ended_now:
            self.cpus_of.pop(job.id, None)
            return None
        slots: Slots = job.slots
        cpus = self.cpus_of.pop(job.id, [])
        for guest in core.guests.get(job.id, ()):
            if guest.id in ended_now:
                continue
            held = dict(guest.slots)
            slots = tuple((node, cores - held.get(node, 0)) for node, cores in slots)
            kept = set(self.cpus_of.get(guest.id, ()))
            cpus = [cpu for cpu in cpus if cpu not in kept]
        self.cpu_map.give(cpus)
        memory = slot_memory(self.cluster, job, job.slots)
        return Offer(slots, memory)

    def _cancel_targets(self, events: list[Event]) -> list[Job]:
        """The jobs this pass's cancellations name, found before the core forgets them."""
        arriving = {e.job.id: e.job for e in events if isinstance(e, JobSubmitted)}
        targets = []
        for event in events:
            if isinstance(event, JobCancelled):
                job = self.core.jobs.get(event.job_id) or arriving.get(event.job_id)
                if job is not None:
                    targets.append(job)
        return targets

    def _record(self, now: float, ends: list[_End], cancels: list[Job], actions: list[Any]) -> _Plan:
        """Write everything this pass decided, in one transaction, before doing any of it."""
        plan = _Plan()
        store = self.store
        with store.transaction() as db:
            for end in ends:
                job = end.job
                state = job.state.value if job.state is not JobState.RUNNING else "failed"
                store.update_job(
                    db,
                    job.id,
                    state=state,
                    end=end.at,
                    exit_code=end.exit_code,
                    reason=end.reason,
                    log_tail=end.log_tail,
                )
                if job.workflow is not None:
                    workflow_id = int(job.workflow)
                    if state == "done":
                        plan.submitted += workflow_stages.release(store, db, workflow_id, now)
                    else:
                        workflow_stages.fail(store, db, workflow_id, self._stage_of(job.id))
            for job in cancels:
                if job.state is JobState.CANCELLED:
                    store.update_job(db, job.id, state="cancelled", end=now, reason="cancelled by user")
                    self.specs.pop(job.id, None)
                    if job.workflow is not None:
                        workflow_stages.fail(store, db, int(job.workflow), self._stage_of(job.id))
            for action in actions:
                if isinstance(action, Launch):
                    cpus = self.cpu_map.take(action.slots)
                    self._mark_launching(db, action.job, cpus, now)
                    plan.launches.append((action.job, cpus, float(action.job.cores), None))
                elif isinstance(action, Colocate):
                    cpus = share_of(self.cpus_of[action.host_id], action.slots, self.cpu_map)
                    self._mark_launching(db, action.guest, cpus, now)
                    # A guest starts on a lent quota: logged, so its quota history is complete.
                    seq = store.log_quota(db, action.guest.id, action.quota, now)
                    plan.launches.append((action.guest, cpus, action.quota, seq))
                elif isinstance(action, SetQuota):
                    seq = store.log_quota(db, action.job_id, action.cpus, now)
                    store.update_job(db, action.job_id, quota=action.cpus)
                    plan.quotas.append((action.job_id, action.cpus, seq))
                elif isinstance(action, Kill):
                    plan.kills.append(action.job_id)
                elif isinstance(action, Reject):
                    store.update_job(db, action.job.id, state="failed", end=now, reason=action.reason)
            self._save_learning(db, ends)
        return plan

    def _mark_launching(self, db: Any, job: Job, cpus: list[int], now: float) -> None:
        self.cpus_of[job.id] = cpus
        self.store.update_job(
            db,
            job.id,
            state="launching",
            start=now,
            slots=[list(s) for s in job.slots],
            cpus=cpus,
            quota=job.quota,
            host=job.host,
        )

    def _carry_out(self, now: float, ends: list[_End], actions: list[Any], plan: _Plan) -> None:
        """Do what `_record` wrote: remove ended containers, re-quota, launch, kill."""
        try:
            for end in ends:
                self.containers.pop(end.job.id, None)
                self.specs.pop(end.job.id, None)
                self.kill_reason.pop(end.job.id, None)
                if end.container is not None:
                    self.backend.remove(end.container)
            launches = {launch[0].id: launch for launch in plan.launches}
            quotas = {job_id: (cpus, seq) for job_id, cpus, seq in plan.quotas}
            for action in actions:  # in the core's order: a host shrinks before its guest starts
                if isinstance(action, SetQuota) and action.job_id in self.containers:
                    cpus, seq = quotas[action.job_id]
                    self.apply_quota(action.job_id, cpus, seq)
                elif isinstance(action, Launch | Colocate):
                    job = action.job if isinstance(action, Launch) else action.guest
                    self._launch(*launches[job.id])
                elif isinstance(action, Kill) and action.job_id in self.containers:
                    self.backend.kill(self.containers[action.job_id])
        except EngineUnavailable as exc:
            self._engine_lost(exc)

    def _launch(self, job: Job, cpus: list[int], quota: float, quota_seq: int | None) -> None:
        spec = self.specs[job.id]
        memory = job.memory * job.cores
        try:
            container, started = self.backend.launch(job.id, spec, self.cpu_map.cpuset(cpus), quota, memory)
        except EngineUnavailable:
            raise
        except Exception as exc:  # the engine refused this container (bad command, image gone)
            log.warning("job %d could not start: %s", job.id, exc)
            self.failed_launches[job.id] = f"could not start: {str(exc).splitlines()[0][:300]}"
            return
        self.containers[job.id] = container
        if started > 0:  # the walltime and the runtime count from the container's start, not the decision's
            job.start = started
        with self.store.transaction() as db:
            self.store.update_job(db, job.id, state="running", container=container, start=job.start)
            db.execute("UPDATE jobs SET launches = launches + 1 WHERE id = ?", (job.id,))
        if quota_seq is not None:
            self.store.quota_applied(quota_seq, job.start)
        self.metrics.launched.inc()

    def apply_quota(self, job_id: int, cpus: float, seq: int | None = None) -> None:
        """Set a running job's quota and check the cgroup shows it."""
        container = self.containers.get(job_id)
        if container is None:
            return
        decided = time.perf_counter()
        try:
            self.backend.set_quota(container, cpus)
        except QuotaMismatch as exc:
            self.metrics.quota_mismatches.inc()
            log.error("%s", exc)
            return
        self.metrics.quota_latency.observe(time.perf_counter() - decided)
        if seq is not None:
            self.store.quota_applied(seq, self.clock())

    def _save_learning(self, db: Any, ends: list[_End]) -> None:
        """Weights and lending decisions, in the pass's transaction: a restart keeps what was learnt."""
        if self.asax is None:
            return
        new = self.asax.decisions[self._saved_decisions :]
        resolved, self.asax.resolved = self.asax.resolved, []
        if not new and not resolved:
            return
        for decision in [*resolved, *new]:
            self.store.save_decision(db, decision.seq + 1, decision.as_dict())
        self._saved_decisions = len(self.asax.decisions)
        self.store.set_meta(db, "weights", self.asax.book.to_state())

    def _stage_of(self, job_id: int) -> str:
        record = self.store.job(job_id)
        return str(record["stage"]) if record else ""

    # -- periodic work ------------------------------------------------------
    def sample(self) -> None:
        """Measure every running job; the next pass hands the usage to the core.

        The reads (cgroup files, the job's progress file) happen outside the
        lock: whatever a job puts in its progress file, a pass never waits on it.
        """
        with self.lock:
            if not self.engine_up:
                return
            now = self.clock()
            running = [
                (job_id, container, job.quota)
                for job_id, container in self.containers.items()
                if (job := self.core.jobs.get(job_id)) is not None
            ]
        measured = [(job_id, quota, self.backend.sample(container, quota, now)) for job_id, container, quota in running]
        with self.lock:
            for job_id, quota, sample in measured:
                job = self.core.jobs.get(job_id)
                if sample is None or job is None or job_id not in self.containers:
                    continue
                if sample.total > 0:
                    job.tasks = sample.total
                self.inbox.append(UsageReported(job_id, Usage(sample.cpu, sample.mem, sample.done, now)))
                self.metrics.cpu_used[job_id] = sample.cpu * quota

    def review(self) -> None:
        """Kill jobs past their walltime; check every running job's quota against its cgroup."""
        with self.lock:
            if not self.engine_up:
                return
            now = self.clock()
            try:
                for job_id, container in list(self.containers.items()):
                    job = self.core.jobs.get(job_id)
                    if job is None:
                        continue
                    if now > job.start + job.walltime and job_id not in self.kill_reason:
                        log.info("job %d passed its walltime of %.0f s; killing it", job_id, job.walltime)
                        self.kill_reason[job_id] = "walltime exceeded"
                        self.backend.kill(container)
                        continue
                    try:
                        self.backend.verify_quota(container, job.quota)
                    except QuotaMismatch as exc:
                        self.metrics.quota_mismatches.inc()
                        log.error("%s; applying it again", exc)
                        self.backend.set_quota(container, job.quota)
            except EngineUnavailable as exc:
                self._engine_lost(exc)

    def reconcile(self) -> None:
        """Compare with what Docker reports: launches the engine lost are retried."""
        with self.lock:
            if not self._engine_ready():
                return
            try:
                self._reconcile_launching()
            except EngineUnavailable as exc:
                self._engine_lost(exc)

    def _reconcile_launching(self) -> None:
        listed = self.backend.containers()
        for record in self.store.jobs(("launching",)):
            job = self.core.jobs.get(record["id"])
            if job is None or job.id in self.containers:
                continue
            info = listed.get(job.id)
            if info is None and job.id in self.kill_reason:
                self.failed_launches[job.id] = self.kill_reason[job.id]
                continue
            if info is not None and info.state != "created":
                self.backend.adopt(info.id)
                self.containers[job.id] = info.id
                with self.store.transaction() as db:
                    self.store.update_job(db, job.id, state="running", container=info.id)
            else:
                if info is not None:
                    self.backend.remove(info.id)
                self._launch(job, self.cpus_of[job.id], job.quota, None)

    # -- the engine ---------------------------------------------------------
    def _engine_lost(self, exc: Exception) -> None:
        if self.engine_up:
            log.warning("Docker engine unreachable (%s); waiting for it", exc)
        self.engine_up = False
        self.metrics.engine_up.set(0)

    def _engine_ready(self) -> bool:
        if self.engine_up:
            return True
        if not self.backend.ping():
            return False
        log.warning("Docker engine is back; reconciling")
        self.engine_up = True
        self.metrics.engine_up.set(1)
        try:
            for container in list(self.containers.values()):
                self.backend.adopt(container)
            self._reconcile_launching()
        except EngineUnavailable as exc:
            self._engine_lost(exc)
            return False
        return True

"""The daemon: the scheduling core driven by a real clock and a Docker engine.

It is the live twin of `cosched.replay.driver.replay`: events in (submissions
from the API, container ends from Docker, usage from the cgroups), one
`Scheduler.step`, actions out. Each pass writes what it is about to do to the
store in one transaction, then does it, so a kill at any instant leaves a state
`recovery.recover` can finish (see `store.py`).

Two locks. `pass_lock` lets one engine-touching job run at a time (the pass,
the review, the reconciliation): each sees the containers the previous one left.
`lock` guards the core and the daemon's maps and is held only while they
change, never across an engine call: the engine calls of a step run side by
side on a bounded pool (`engine_calls`), and sampling goes on meanwhile.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosched.core.events import (
    Colocate,
    Event,
    JobCancelled,
    JobEnded,
    JobRequeued,
    JobSubmitted,
    Kill,
    Launch,
    Offer,
    Reject,
    Rescind,
    SetQuota,
    UsageReported,
)
from cosched.core.frees import freed_slots
from cosched.core.pool import slot_memory
from cosched.core.scheduler import Scheduler
from cosched.daemon import journal, workflow_stages
from cosched.daemon.backend import Backend, RunLost
from cosched.daemon.config import DaemonConfig
from cosched.daemon.cpus import CpuMap, share_of
from cosched.daemon.docker_backend import DockerBackend, EngineUnavailable, QuotaMismatch, data_dirs_allowed
from cosched.daemon.engine_calls import EngineCalls
from cosched.daemon.metrics import DaemonMetrics
from cosched.daemon.sandbox import StagingMounts
from cosched.daemon.specs import JobSpec, WorkflowSpec
from cosched.daemon.store import DECISIONS_KEPT, StateError, Store
from cosched.errors import ConfigError, CoschedError
from cosched.model import Cluster, Job, JobState, Usage
from cosched.policies.asax import ASAx
from cosched.policies.registry import create
from experts.baselines import RuntimeBaselines
from experts.weights import Schedule, WeightBook

log = logging.getLogger("cosched.daemon")

MAX_LOST_RUNS = 3
"""Runs of one job lost to its machines (an agent gone, an executor killed) before the job fails."""


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
    lost: bool = False
    """The run was lost, not ended by the job: the job goes back to the queue."""

    @property
    def requeued(self) -> bool:
        """After the core's step: the job is queued again (it may even have started again in it)."""
        return self.lost and self.job.state is not JobState.CANCELLED


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
        self, config: DaemonConfig, backend: Backend | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = Store(config.state_dir / "state.sqlite")
        self.instance = config.daemon.instance or self._instance_id()
        self.metrics = DaemonMetrics()
        self.backend: Backend = backend or self._backend(config)
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
        self.pass_lock = threading.Lock()
        self.engine = EngineCalls(config.docker.engine_calls)
        self.inbox: deque[Event] = deque()
        self.specs: dict[int, dict[str, Any]] = {}
        self.containers: dict[int, str] = {}
        self.cpus_of: dict[int, list[int]] = {}
        self.reservations: Mapping[int, float] = {}
        self.kill_reason: dict[int, str] = {}
        self.failed_launches: dict[int, str] = {}
        self.lost_launches: dict[int, str] = {}
        self.lost_runs: dict[int, int] = {}
        """Runs lost to their machines, per job, since this start (MAX_LOST_RUNS)."""
        self.down: set[int] = set()
        """Nodes whose machine is gone (a Mesos agent): out of the core's pool until it is back."""
        self.engine_up = True
        self.state_problem = ""
        """Why the state file cannot be used ('' when it can): submissions are refused meanwhile."""
        self.saved_decisions = 0
        """How many of ASAx's decisions are in the store (the next pass saves the ones after)."""

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
        schedule = Schedule(horizon=p.horizon, threshold=p.round_threshold)
        asax = ASAx(
            p.experts or None,
            seed=p.seed,
            loss=p.loss,
            min_guest_share=p.min_guest_share,
            schedule=schedule,
            learner=p.learner,
        )
        if state is not None:
            asax.book = WeightBook.from_state(state).rescheduled(schedule)
        baselines = self.store.get_meta("baselines")
        if baselines is not None:
            asax.baselines = RuntimeBaselines.from_state(baselines)
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
            keep_promises=p.keep_promises,
        )

    def start(self) -> None:
        """Reach the engine and take over whatever an earlier run left (see `recovery`)."""
        from cosched.daemon.recovery import recover

        self.backend.connect()
        with self.lock:
            recover(self)

    def _backend(self, config: DaemonConfig) -> Backend:
        if config.backend.kind == "docker":
            return DockerBackend(self.instance, config.docker, self._staging(config))
        from cosched.mesos.backend import MesosBackend, MesosSettings

        m = config.mesos
        settings = MesosSettings(
            masters=m.masters,
            name=m.name,
            user=m.user,
            executor_command=m.executor_command,
            launch_timeout=m.launch_timeout,
            hold_timeout=m.hold_timeout,
            refuse_seconds=m.refuse_seconds,
            revive_interval=m.revive_interval,
            data_roots=config.docker.data_roots,
        )
        return MesosBackend(
            settings,
            config.cluster.nodes,
            framework_id=self.store.get_meta("framework_id"),
            on_framework_id=self._keep_framework_id,
            metrics=self.metrics,
        )

    def _keep_framework_id(self, framework_id: str) -> None:
        """A restarted daemon subscribes as the same framework, so its running tasks are still its own."""
        with self.store.transaction() as db:
            self.store.set_meta(db, "framework_id", framework_id)

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
        per_node = self.cluster.cores_per_node
        if spec.cores > per_node and not self._spans(spec.model_dump()):
            where = "a Mesos agent" if self.config.backend.kind == "mesos" else "a node"
            raise Rejected("cores", f"{spec.cores} cores asked, {where} has {per_node} (span = true spreads it)")
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

    def _accepting(self) -> None:
        """StateError (a 503) while the state file is unusable: a job accepted now could be lost."""
        if not self.state_problem:
            try:
                self.store.check()
            except StateError as exc:
                with self.lock:
                    self._state_failed(exc)
        if self.state_problem:
            raise StateError(f"not accepting submissions: {self.state_problem}")

    def submit_job(self, spec: JobSpec) -> int:
        """Accept one job: stored before this returns, queued at the next pass."""
        self._accepting()
        self.check_job(spec)
        now = self.clock()
        document = spec.model_dump()
        with self.store.transaction() as db:
            job_id = self.store.add_job(db, document, now)
        self.queue(job_id, document, now)
        journal.accepted(job_id, document)
        self.metrics.submitted.inc()
        return job_id

    def submit_workflow(self, spec: WorkflowSpec) -> tuple[int, list[int]]:
        """Accept a workflow; its first ready stages are submitted now, the rest as they become ready."""
        self._accepting()
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
            self.queue(job_id, document, now, workflow_id)
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

    def queue(self, job_id: int, document: dict[str, Any], submit: float, workflow: int | None = None) -> None:
        """Hand an accepted job (stored already) to the next pass."""
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
            span=self._spans(spec),
        )

    def _spans(self, spec: dict[str, Any]) -> bool:
        """Whether a job's cores may come from several nodes: its spec's word, else yes on one host
        (the nodes are parts of it) and no on Mesos (each node is an agent: a job there is a gang)."""
        span = spec.get("span")
        return bool(span) if span is not None else self.config.backend.kind != "mesos"

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
        with self.pass_lock:
            with self.lock:
                if not self._state_usable():
                    return
            try:
                if self._pass():
                    self._pass()
            except StateError as exc:
                with self.lock:
                    self._state_failed(exc)

    # -- the state file failing -----------------------------------------------
    def _state_usable(self) -> bool:
        """False while the state file is lost or cannot be written.

        A pass that could not write its decisions has stepped the core all the
        same; once a write succeeds again, core and daemon are rebuilt from the
        store, which holds nothing that was not done.
        """
        try:
            self.store.check()
            if self.state_problem:
                self.store.probe()
                log.warning("state file %s is writable again; rebuilding from it", self.store.path)
                self._rebuild()
                self.state_problem = ""
        except StateError as exc:
            self._state_failed(exc)
            return False
        return True

    def _state_failed(self, exc: StateError) -> None:
        problem = str(exc)
        if self.state_problem.startswith(problem):
            return
        if "deleted" in problem or "replaced" in problem:
            try:
                problem += f"; what it held is copied to {self.store.rescue()}: put that back and restart"
            except Exception as rescue_failed:  # reported, never raised: the cause matters more
                problem += f"; no copy could be made ({rescue_failed})"
        self.state_problem = problem
        log.error("%s; scheduling and submissions stop until it is fixed", problem)

    def _rebuild(self) -> None:
        """Forget what memory holds and take everything back from the store, as a restart would."""
        from cosched.daemon.recovery import recover

        self.asax = self._policy()
        self.core = self._new_core()
        self.cpu_map = CpuMap(self.config.cpus(), self.config.cluster.nodes)
        held_maps = (self.inbox, self.specs, self.containers, self.cpus_of, self.kill_reason, self.failed_launches)
        for held in (*held_maps, self.lost_launches):
            held.clear()
        self.reservations = {}
        self.saved_decisions = 0
        recover(self)

    def health(self) -> dict[str, Any]:
        """From memory only: answers whatever the engine or the state file do."""
        return {"engine_up": self.engine_up, "instance": self.instance, "state": self.state_problem or "ok"}

    def _pass(self) -> bool:
        """The pass itself; True when it submitted workflow stages that the core has not seen.

        Runs under `pass_lock`; `lock` is taken only to step the core and write
        the plan, so the engine calls that carry the plan out hold no one up.
        """
        if not self._engine_ready():
            return False
        started = time.perf_counter()
        now = self.clock()
        try:
            changes = self.backend.nodes_changed()
            ends = self._collect_ends(now)
        except EngineUnavailable as exc:
            self._engine_lost(exc)
            return False
        with self.lock:
            events: list[Event] = self._node_events(changes)
            ended_now: set[int] = set()
            for end in ends:
                events.append(self._end_event(end))
                offer = self._freed(end.job, ended_now)
                ended_now.add(end.job.id)
                if offer is not None and (offer := self._on_live_nodes(offer)) is not None:
                    events.append(offer)
            while self.inbox:
                events.append(self.inbox.popleft())
            cancels = self._cancel_targets(events)
            decision = self.core.step(now, events)
            self.reservations = decision.reservations
            plan = self._record(now, ends, cancels, decision.actions)
            for end in ends:
                self.containers.pop(end.job.id, None)
                self.kill_reason.pop(end.job.id, None)
                if end.requeued:
                    journal.requeued(end.job.id, end.reason)
                    continue
                journal.ended(end.job, end.exit_code, end.reason)
                self.specs.pop(end.job.id, None)
            journal.decided(decision.actions, self.cpus_of, self.kill_reason, cancels)
        self._carry_out(ends, plan)
        with self.lock:
            for job_id, document in plan.submitted:
                record = self.store.job(job_id)
                self.queue(job_id, document, now, record["workflow"] if record else None)
                journal.accepted(job_id, document, record["workflow"] if record else None)
            self.metrics.submitted.inc(len(plan.submitted))
            self.metrics.observe_pass(self, time.perf_counter() - started)
            if self.asax is not None:  # saved and counted: memory holds only recent decisions
                self.asax.forget(DECISIONS_KEPT)
            queued = len(self.core.queue)
        self.backend.queued(queued)
        return bool(plan.submitted)

    def _end_event(self, end: _End) -> Event:
        """A job's end, or its requeue when its machine lost the run (until that happened too often)."""
        if not end.lost:
            return JobEnded(end.job.id, end.failed, end.at)
        lost = self.lost_runs[end.job.id] = self.lost_runs.get(end.job.id, 0) + 1
        if lost < MAX_LOST_RUNS:
            return JobRequeued(end.job.id)
        end.lost, end.failed = False, True
        end.reason = f"{end.reason} ({lost} runs lost to their machines)"
        return JobEnded(end.job.id, True, end.at)

    def _node_events(self, changes: list[tuple[int, bool]]) -> list[Event]:
        """A node gone leaves the core's pool (what it had free is rescinded; what its jobs held
        never comes back); a node back is offered whole, less what the core still counts on it."""
        pool, cluster, events = self.core.pool, self.cluster, []
        final = dict(changes)  # gone and back within one pass: its jobs' ends say what was lost
        for node, up in final.items():
            if not up and node not in self.down:
                self.down.add(node)
                cores, memory = pool.free_cores(node), pool.free_mem[node]
                if cores or memory:
                    events.append(Rescind(((node, cores),), (memory,)))
            elif up and node in self.down:
                self.down.discard(node)
                cores, memory = cluster.cores_per_node - pool.free_cores(node), cluster.memory_per_node
                memory -= pool.free_mem[node]
                for job in self.core.jobs.values():
                    if job.state is not JobState.RUNNING:
                        continue
                    held = slot_memory(cluster, job, job.slots) or (0,) * len(job.slots)
                    for (n, count), mib in zip(job.slots, held, strict=True):
                        if n == node:
                            cores -= count if job.host < 0 else 0
                            memory -= mib
                if cores > 0 or memory > 0:
                    events.append(Offer(((node, max(cores, 0)),), (max(memory, 0),)))
        return events

    def _on_live_nodes(self, offer: Offer) -> Offer | None:
        """What an end gives back, less what was on nodes that are gone."""
        if not self.down:
            return offer
        memory = offer.memory or (0,) * len(offer.slots)
        kept = [(slot, mib) for slot, mib in zip(offer.slots, memory, strict=True) if slot[0] not in self.down]
        if not kept:
            return None
        return Offer(tuple(slot for slot, _ in kept), tuple(mib for _, mib in kept) if offer.memory else None)

    def _collect_ends(self, now: float) -> list[_End]:
        """Jobs whose containers stopped (or never could start) since the last pass."""
        ends: list[_End] = []
        for job_id, reason in list(self.failed_launches.items()):
            job = self.core.jobs.get(job_id)
            if job is not None:
                ends.append(_End(job, True, now, None, reason, "", self.containers.get(job_id)))
            del self.failed_launches[job_id]
        for job_id, reason in list(self.lost_launches.items()):
            job = self.core.jobs.get(job_id)
            if job is not None:
                ends.append(_End(job, False, now, None, f"could not start: {reason}", "", None, lost=True))
            del self.lost_launches[job_id]
        if not self.containers:
            return ends
        listed = self.backend.containers()
        stopped: list[tuple[Job, str]] = []
        for job_id, container in list(self.containers.items()):
            job = self.core.jobs.get(job_id)
            if job is None or any(e.job.id == job_id for e in ends):
                continue
            info = listed.get(job_id)
            if info is None:
                ends.append(_End(job, True, now, None, "container disappeared", "", None))
            elif info.state == "lost":
                ends.append(_End(job, False, now, None, info.note, "", container, lost=True))
            elif info.state in ("exited", "dead"):
                stopped.append((job, container))
        outcomes = self.engine.each(self._exit_and_logs, [(container,) for _, container in stopped])
        _raise_failures(outcomes)
        for (job, container), (exit, logs) in zip(stopped, outcomes, strict=True):
            if exit.code == 0:
                reason = ""  # it finished before a kill took effect
            else:
                reason = self.kill_reason.get(job.id) or ("out of memory" if exit.oom else f"exit code {exit.code}")
            at = exit.finished if exit.finished > 0 else now
            ends.append(_End(job, exit.code != 0, at, exit.code, reason, logs, container))
        return ends

    def _exit_and_logs(self, container: str) -> tuple[Any, str]:
        return self.backend.exit_of(container), self.backend.logs(container)

    def _freed(self, job: Job, ended_now: set[int]) -> Offer | None:
        """What a job's end gives back (`cosched.core.frees`), with the host CPUs of its cores."""
        core = self.core
        host_running = job.host >= 0 and job.host in core.jobs and job.host not in ended_now
        surviving = [g for g in core.guests.get(job.id, ()) if g.id not in ended_now]
        slots = freed_slots(job, host_running, surviving)
        cpus = self.cpus_of.pop(job.id, [])
        if slots is None:
            return None
        kept = {cpu for guest in surviving for cpu in self.cpus_of.get(guest.id, ())}
        self.cpu_map.give([cpu for cpu in cpus if cpu not in kept])
        return Offer(slots, slot_memory(self.cluster, job, job.slots))

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
                if end.requeued:  # it starts again, from the queue (perhaps in this very pass)
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
                    )
                    continue
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

    def _carry_out(self, ends: list[_End], plan: _Plan) -> None:
        """Do what `_record` wrote, one step after another, each step's engine calls side by side:
        remove ended containers, change quotas (a host shrinks before its guest starts), kill, launch."""
        try:
            removals = [(end.container,) for end in ends if end.container is not None]
            _raise_failures(self.engine.each(self.backend.remove, removals))
            self.apply_quotas(plan.quotas)
            kills = [(self.containers[job_id],) for job_id in plan.kills if job_id in self.containers]
            _raise_failures(self.engine.each(self.backend.kill, kills))
            self._launch_all(plan.launches)
        except EngineUnavailable as exc:
            self._engine_lost(exc)

    def _launch_all(self, launches: Sequence[tuple[Job, list[int], float, int | None]]) -> None:
        """Start the containers side by side, then mark those that started running, in one transaction.

        A launch the engine refused (bad command, image gone) ends its job at the
        next pass; the others are recorded even when the engine was lost meanwhile.
        """
        outcomes = self.engine.each(self._start, [(job, cpus, quota) for job, cpus, quota, _ in launches])
        started = []
        for (job, _, _, quota_seq), outcome in zip(launches, outcomes, strict=True):
            if isinstance(outcome, EngineUnavailable):
                continue
            if isinstance(outcome, RunLost):
                log.warning("job %d could not start on its machines: %s", job.id, outcome)
                self.lost_launches[job.id] = str(outcome).splitlines()[0][:300]
                continue
            if isinstance(outcome, Exception):
                log.warning("job %d could not start: %s", job.id, outcome)
                self.failed_launches[job.id] = f"could not start: {str(outcome).splitlines()[0][:300]}"
                continue
            container, at = outcome
            if at > 0:  # the walltime and the runtime count from the container's start, not the decision's
                job.start = at
            started.append((job, container, quota_seq))
        with self.lock:
            for job, container, _ in started:
                self.containers[job.id] = container
        if started:
            with self.store.transaction() as db:
                for job, container, _ in started:
                    self.store.update_job(db, job.id, state="running", container=container, start=job.start)
                    db.execute("UPDATE jobs SET launches = launches + 1 WHERE id = ?", (job.id,))
                self.store.quotas_applied(db, [(seq, job.start) for job, _, seq in started if seq is not None])
            self.metrics.launched.inc(len(started))
        _raise_failures(outcomes, tolerated=(Exception,))

    def _start(self, job: Job, cpus: list[int], quota: float) -> tuple[str, float]:
        spec, memory = self.specs[job.id], job.memory * job.cores
        asked = time.perf_counter()
        started = self.backend.launch(
            job.id, spec, self.cpu_map.cpuset(cpus), quota, memory, slots=job.slots, guest=job.host >= 0
        )
        self.metrics.launch_seconds.observe(time.perf_counter() - asked)
        return started

    def apply_quotas(self, quotas: Sequence[tuple[int, float, int | None]]) -> None:
        """Change the quotas side by side; a cgroup showing another quota is logged and counted."""
        targets = [(job_id, cpus, seq) for job_id, cpus, seq in quotas if job_id in self.containers]
        outcomes = self.engine.each(self._timed_quota, [(self.containers[j], cpus) for j, cpus, _ in targets])
        applied = []
        for (_, _, seq), outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, QuotaMismatch):
                self.metrics.quota_mismatches.inc()
                log.error("%s", outcome)
            elif isinstance(outcome, float):
                self.metrics.quota_latency.observe(outcome)
                if seq is not None:
                    applied.append((seq, self.clock()))
        if applied:
            with self.store.transaction() as db:
                self.store.quotas_applied(db, applied)
        _raise_failures(outcomes, tolerated=(QuotaMismatch,))

    def _timed_quota(self, container: str, cpus: float) -> float:
        decided = time.perf_counter()
        self.backend.set_quota(container, cpus)
        return time.perf_counter() - decided

    def _save_learning(self, db: Any, ends: list[_End]) -> None:
        """Weights and lending decisions, in the pass's transaction: a restart keeps what was learnt."""
        if self.asax is None:
            return
        if ends:  # every end may teach a kind's runtime alone
            self.store.set_meta(db, "baselines", self.asax.baselines.to_state())
        new = self.asax.since(self.saved_decisions)
        resolved, self.asax.resolved = self.asax.resolved, []
        if not new and not resolved:
            return
        for decision in [*resolved, *new]:
            self.store.save_decision(db, decision.seq + 1, decision.as_dict())
        self.saved_decisions = self.asax.decided
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
                self.inbox.append(UsageReported(job_id, Usage(sample.cpu, sample.mem, sample.done, now, quota)))
                self.metrics.cpu_used[job_id] = sample.cpu * quota

    def review(self) -> None:
        """Kill jobs past their walltime; check every running job's quota against its cgroup."""
        with self.pass_lock:
            with self.lock:
                if not self.engine_up:
                    return
                now = self.clock()
                running = [
                    (job_id, container, job)
                    for job_id, container in self.containers.items()
                    if (job := self.core.jobs.get(job_id)) is not None
                ]
                late = [
                    (job_id, container, job)
                    for job_id, container, job in running
                    if now > job.start + job.walltime and job_id not in self.kill_reason
                ]
                for job_id, _, job in late:
                    log.info("job %d passed its walltime of %.0f s; killing it", job_id, job.walltime)
                    self.kill_reason[job_id] = "walltime exceeded"
            try:
                _raise_failures(self.engine.each(self.backend.kill, [(container,) for _, container, _ in late]))
                wrong = []
                for job_id, container, job in running:
                    if job_id in self.kill_reason:
                        continue
                    try:
                        self.backend.verify_quota(container, job.quota)
                    except QuotaMismatch as exc:
                        self.metrics.quota_mismatches.inc()
                        log.error("%s; applying it again", exc)
                        wrong.append((job_id, job.quota, None))
                self.apply_quotas(wrong)
            except EngineUnavailable as exc:
                self._engine_lost(exc)

    def reconcile(self) -> None:
        """Compare with what Docker reports: launches the engine lost are retried."""
        with self.pass_lock:
            if self.state_problem or not self._engine_ready():
                return
            try:
                self._reconcile_launching()
            except EngineUnavailable as exc:
                self._engine_lost(exc)
            except StateError as exc:
                with self.lock:
                    self._state_failed(exc)

    def _reconcile_launching(self) -> None:
        """Jobs recorded as launching with no container known: adopt what the engine started, launch the rest."""
        listed = self.backend.containers()
        relaunch = []
        for record in self.store.jobs(("launching",)):
            job = self.core.jobs.get(record["id"])
            if (
                job is None
                or job.id in self.containers
                or job.id in self.failed_launches
                or job.id in self.lost_launches
            ):
                continue
            info = listed.get(job.id)
            if info is None and job.id in self.kill_reason:
                self.failed_launches[job.id] = self.kill_reason[job.id]
                continue
            if info is not None and info.state != "created":
                self.backend.adopt(info.id)
                with self.lock:
                    self.containers[job.id] = info.id
                with self.store.transaction() as db:
                    self.store.update_job(db, job.id, state="running", container=info.id)
            else:
                if info is not None:
                    self.backend.remove(info.id)
                relaunch.append((job, self.cpus_of[job.id], job.quota, None))
        self._launch_all(relaunch)

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

    def close(self) -> None:
        """Wait for engine calls under way, then close the state file."""
        self.engine.close()
        self.backend.close()
        self.store.close()


def _raise_failures(outcomes: list[Any], tolerated: tuple[type[Exception], ...] = ()) -> None:
    """A step's first engine loss, else its first failure not `tolerated`, raised once every call
    has been looked at (so what did succeed is recorded first)."""
    for outcome in outcomes:
        if isinstance(outcome, EngineUnavailable):
            raise outcome
    for outcome in outcomes:
        if isinstance(outcome, Exception) and not isinstance(outcome, tolerated):
            raise outcome

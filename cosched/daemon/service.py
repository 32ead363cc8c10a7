"""The daemon: the scheduling core driven by a real clock and a Docker engine.

It is the live twin of `cosched.replay.driver.replay`: events in (submissions
from the API, container ends from Docker, usage from the cgroups), one
`Scheduler.step`, actions out. Each pass writes what it is about to do to the
store in one transaction, then does it, so a kill at any instant leaves a state
`recovery.recover` can finish (see `store.py`).

`Daemon` owns the state (core, store, backend, the maps from jobs to containers
and CPUs, the locks) and the entry points the API and the periodic jobs call;
the work itself lives in one module per job:
- `submissions`: jobs and workflows checked, stored, then queued; cancels.
- `scheduling`: the pass: ends + submissions -> step -> write the plan -> carry it out.
- `ends`, `nodes`: what the backend says changed (runs ended or lost, machines
  gone or back), as the core's events.
- `plan`: what a pass decided, written in one transaction before any of it is done.
- `carry_out`: the plan done on the engine, each step's calls side by side.
- `monitoring`: between passes: usage sampled, walltimes and quotas reviewed.
- `engine_faults`: the engine lost and back; the launches it lost, retried (reconciliation).
- `state_faults`: the state file failing, and the way back.
- `recovery`: start-up.

Two locks. `pass_lock` lets one engine-touching job run at a time (the pass,
the review, the reconciliation): each sees the containers the previous one left.
`lock` guards the core and the daemon's maps and is held only while they
change, never across an engine call: the engine calls of a step run side by
side on a bounded pool (`engine_calls`), and sampling goes on meanwhile.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import wait
from typing import Any

from cosched.core.events import Event
from cosched.core.scheduler import Scheduler
from cosched.daemon import carry_out, drain, engine_faults, job_actions, monitoring, scheduling, submissions
from cosched.daemon.backend import Backend
from cosched.daemon.config import DaemonConfig
from cosched.daemon.cpus import CpuMap
from cosched.daemon.docker_backend import DockerBackend, RunLost
from cosched.daemon.engine_calls import EngineCalls
from cosched.daemon.identity import ANONYMOUS, Caller
from cosched.daemon.metrics import DaemonMetrics
from cosched.daemon.sandbox import StagingMounts, check_data_roots
from cosched.daemon.specs import JobSpec, WorkflowSpec
from cosched.daemon.store import DECISIONS_KEPT, StateError, Store
from cosched.errors import ConfigError
from cosched.model import Cluster
from cosched.policies.asax import ASAx
from cosched.policies.registry import create
from experts.baselines import RuntimeBaselines
from experts.tree import ExpertSet
from experts.weights import Schedule, WeightBook

log = logging.getLogger("cosched.daemon")


class Daemon:
    """State, core and backend of one `cosched daemon`."""

    def __init__(
        self, config: DaemonConfig, backend: Backend | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.clock = clock
        # The policies' files (trained models, an expert set) are read once, first (a bad one stops the
        # start before anything is opened or said): a rebuild after a failed pass copies what was
        # loaded then. Read again, a model overwritten since changed the running daemon's decisions
        # without a word, and one deleted failed every rebuild (a helper's audit).
        self._experts = self._expert_set()
        self._plugins = self._made_plugins()
        self.store = Store(config.state_dir / "state.sqlite", durable_power=config.daemon.durable_power)
        self.instance = self._instance_id(config.daemon.instance)
        self.metrics = DaemonMetrics()
        self.backend: Backend = backend or self._backend(config)
        nodes = config.cluster.nodes
        self.cpu_map = CpuMap(config.cpus(), nodes)
        self.cluster = Cluster(
            nodes,
            self.cpu_map.cores_per_node,
            config.memory_mib() // nodes,
            name="local",
            nodes_per_switch=config.cluster.nodes_per_switch,
            switches_per_pod=config.cluster.switches_per_pod,
        )
        self.asax = self._policy()
        self.core = self._new_core()
        self.lock = threading.RLock()
        self.pass_lock = threading.Lock()
        self.engine = EngineCalls(config.docker.engine_calls)
        self.launcher = EngineCalls(config.docker.engine_calls)
        """Launches have a pool of their own: one waiting for Mesos offers must not hold up kills and quotas."""
        self.launching: dict[int, carry_out.Parked] = {}
        """Launches a pass stopped waiting for, by job id (`carry_out.launch_all`)."""
        self.inbox: deque[Event] = deque()
        self.specs: dict[int, dict[str, Any]] = {}
        self.waiting: dict[int, list[dict[str, Any]]] = {}
        """Pending jobs held until their dependencies are met, with them (`cosched.daemon.dependencies`)."""
        self.settle_due = False
        """A job started waiting since dependencies were last judged: the next pass judges them."""
        self.user_numbers: dict[str, int] = {}
        """User names as the core's user ids (`submissions.user_number`)."""
        self.containers: dict[int, str] = {}
        self.cpus_of: dict[int, list[int]] = {}
        self.reservations: Mapping[int, float] = {}
        self.wake_at = math.inf
        """When the core asked for its next pass at the last (a begin, a latest start, a window's end)."""
        self.kill_reason: dict[int, str] = {}
        self.not_killed: set[int] = set()
        """Jobs whose kill the engine answered and that had not ended (`carry_out.kill`): killed again."""
        self.requeue_asked: dict[int, str] = {}
        """Running jobs to kill and queue again (`cosched requeue`), with why; from the state file."""
        self.review_due = False
        """A kill was asked through the API (a requeue, a walltime lowered below what the job ran):
        the review, whose kills those are, runs after the next pass rather than at its interval."""
        self.failed_launches: dict[int, str] = {}
        self.lost_launches: dict[int, RunLost] = {}
        self.lost_runs: dict[int, int] = {}
        """Runs lost to their machines, per live job (`ends.MAX_LOST_RUNS`); from the state file, so a
        job whose runs its machines keep losing fails however often the daemon restarts."""
        self.down: set[int] = set()
        """Nodes whose machine is gone (a Mesos agent): out of the core's pool until it is back."""
        self.drained: dict[int, drain.Drain] = drain.load(self.store, config.cluster.nodes)
        """Nodes an operator took out of service (`cosched.daemon.drain`), from the state file."""
        self.engine_up = True
        self.state_problem = ""
        """Why the state file cannot be used ('' when it can): submissions are refused meanwhile."""
        self.rebuild_due = False
        """A pass, or a rebuild, failed midway: memory is rebuilt from the store before the next pass."""
        self.failed_passes = 0
        """Passes and rebuilds failed in a row: the next try waits `scheduling.retry_wait` of them."""
        self.retry_at = 0.0
        """When (monotonic) the next try after a failure is due."""
        self.saved_decisions = 0
        """How many of ASAx's decisions are in the store (the next pass saves the ones after)."""

    # -- set-up -------------------------------------------------------------
    def _instance_id(self, configured: str) -> str:
        """The label of this daemon's containers: `daemon.instance`, else the one its state file was
        first started under (made up then). The file keeps it. Started under another name while
        jobs ran, a daemon found none of their containers, failed them as lost and left them
        running unmanaged on cores it gave away (an operator's walkthrough): refused until they end."""
        saved = self.store.get_meta("instance")
        instance = configured or saved or uuid.uuid4().hex[:12]
        if saved not in (None, instance) and self.config.backend.kind == "docker":  # Mesos labels by framework
            running = self.store.jobs(states=("launching", "running"))
            if running:
                raise ConfigError(
                    f"daemon.instance = {instance!r}, and state file {self.store.path} holds {len(running)} running "
                    f"job(s) of instance {saved!r}, whose containers are labelled so: set daemon.instance = "
                    f"{saved!r} (or leave it empty) until they end"
                )
        if saved != instance:
            with self.store.transaction() as db:
                self.store.set_meta(db, "instance", instance)
        return str(instance)

    def _expert_set(self) -> ExpertSet | None:
        """ASAx's experts from `policies.experts`, if it names a file (None: the default experts)."""
        p = self.config.policies
        return ExpertSet.load(p.experts) if p.cosched == "asax" and p.experts else None

    def _policy(self) -> ASAx | None:
        p = self.config.policies
        if p.cosched != "asax":
            return None
        state = self.store.get_meta("weights")
        schedule = Schedule(horizon=p.horizon, threshold=p.round_threshold)
        asax = ASAx(
            self._experts,
            seed=p.seed,
            loss=p.loss,
            min_guest_share=p.min_guest_share,
            schedule=schedule,
            learner=p.learner,
        )
        saved_set = self.store.get_meta("experts")
        if state is not None and saved_set not in (None, asax.experts.digest()):
            log.warning(
                "ASAx: the saved weights were learned for another expert set (policies.experts changed): "
                "they are dropped, and every learner starts from uniform weights over the new experts"
            )
            state = None
        if state is not None:
            asax.book = WeightBook.from_state(state).rescheduled(schedule)
            saved = self.store.get_meta("learner")
            if saved is not None and saved != p.learner:  # an operator would otherwise see learning start over
                log.warning(
                    "ASAx: the saved weights were learned with learner = %r; under learner = %r they stay in the "
                    "state file unused, and the new learners start from uniform weights",
                    saved,
                    p.learner,
                )
        baselines = self.store.get_meta("baselines")
        if baselines is not None:
            asax.baselines = RuntimeBaselines.from_state(baselines)
        draws = self.store.get_meta("draws")
        if isinstance(draws, dict) and draws.get("seed") == p.seed:  # a new seed starts its own draws
            try:
                asax.rng.bit_generator.state = draws["state"]
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ASAx: the saved state of its draws is not usable (%s): they start from the seed", exc)
        return asax

    def _made_plugins(self) -> tuple[Any, ...]:
        """The queue, backfill, estimate and placement policies (and the co-scheduling one, unless
        ASAx), as configured, never stepped: each core gets copies (`_new_core`)."""
        p = self.config.policies
        queue = create("queue", p.queue)
        kept = self.config.daemon.keep_ended_days * 86400
        if 0 < kept < queue.history:  # its counts are rebuilt from ended jobs at a restart
            raise ConfigError(
                f"config key daemon.keep_ended_days: {kept / 86400:g} days forgets runs queue policy {p.queue!r} "
                f"still counts ({queue.history / 86400:g} days); keep ended jobs that long, or 0 (never purge)"
            )
        cosched = None if p.cosched == "asax" else create("cosched", p.cosched)
        return (
            queue,
            create("backfill", p.backfill),
            create("estimate", p.estimate),
            create("placement", p.placement),
            cosched,
        )

    def _new_core(self) -> Scheduler:
        p = self.config.policies
        queue, backfill, estimate, placement, cosched = copy.deepcopy(self._plugins)
        return Scheduler(
            self.cluster,
            queue,
            backfill,
            estimate,
            placement,
            self.asax if self.asax is not None else cosched,
            sharing=p.sharing,
            window=p.window,
            keep_promises=p.keep_promises,
            max_cores_per_user=p.max_cores_per_user,
            max_running_jobs_per_user=p.max_running_jobs_per_user,
            late_grace=self.config.intervals.schedule,  # a pass stands for the interval before it
        )

    def start(self) -> None:
        """Reach the engine and take over whatever an earlier run left (see `recovery`)."""
        from cosched.daemon.recovery import recover

        self.backend.connect()
        with self.lock:
            drain.follow(self)  # the machines behind the nodes are known now
            recover(self)
            self._note_models()

    def _note_models(self) -> None:
        """Keep the digest of each trained model the policies run (`model_digest`, of learned
        ones) in the state file, and say when one is not the last start's: the history and the
        decisions recorded before were the old model's, and nothing else would tell."""
        slots = ("queue", "backfill", "estimate", "placement", "cosched")
        models = {
            slot: digest
            for slot, plugin in zip(slots, self._plugins, strict=True)
            if (digest := getattr(plugin, "model_digest", ""))
        }
        saved = self.store.get_meta("models")
        saved = saved if isinstance(saved, dict) else {}
        for slot in sorted(models.keys() & saved.keys()):
            if models[slot] != saved[slot]:
                log.warning(
                    "policies.%s runs another trained model than at the last start (sha256 %s, then %s): what it "
                    "decides from now on is the new model's",
                    slot,
                    models[slot],
                    saved[slot],
                )
        if models != saved:
            with self.store.transaction() as db:
                self.store.set_meta(db, "models", models)

    def _backend(self, config: DaemonConfig) -> Backend:
        if config.backend.kind == "docker":
            return DockerBackend(self.instance, config.docker, self._staging(config))
        from cosched.mesos.backend import MesosBackend, MesosSettings, read_secret

        m = config.mesos
        settings = MesosSettings(
            masters=m.masters,
            name=m.name,
            user=m.user,
            role=m.role,
            order_by=m.order_by,
            executor_command=m.executor_command,
            launch_timeout=m.launch_timeout,
            hold_timeout=m.hold_timeout,
            refuse_seconds=m.refuse_seconds,
            revive_interval=m.revive_interval,
            watchdog_heartbeats=m.watchdog_heartbeats,
            fence=m.fence,
            job_settings=config.docker,
            sample_interval=config.intervals.sample,
            principal=m.principal,
            secret=read_secret(m.secret_file) if m.secret_file else "",
        )
        return MesosBackend(
            settings,
            config.cluster.nodes,
            framework_id=self.store.get_meta("framework_id"),
            on_framework_id=self._keep_framework_id,
            metrics=self.metrics,
            node_hosts=self.store.get_meta("mesos_nodes") or (),
            on_nodes=self._keep_nodes,
            put_last=drain.hosts(self.store),
        )

    def _keep_framework_id(self, framework_id: str) -> None:
        """A restarted daemon subscribes as the same framework, so its running tasks are still its own."""
        with self.store.transaction() as db:
            self.store.set_meta(db, "framework_id", framework_id)

    def _keep_nodes(self, hostnames: list[str]) -> None:
        """The agents the nodes are, by hostname: a restarted daemon need not wait for every one."""
        with self.store.transaction() as db:
            self.store.set_meta(db, "mesos_nodes", hostnames)

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
        for warning in check_data_roots(config.docker.data_roots, "config key docker.data_roots"):
            log.warning("%s", warning)
        staging = StagingMounts(config.state_dir / "mounts")
        staging.release_all()  # a daemon killed mid-launch may have left some
        return staging

    def rebuild(self) -> None:
        """Forget what memory holds and take everything back from the store, as a restart would."""
        from cosched.daemon.recovery import recover

        self.asax = self._policy()
        self.core = self._new_core()
        self.cpu_map = CpuMap(self.config.cpus(), self.config.cluster.nodes)
        wait([parked.future for parked in self.launching.values()])  # what they started, recovery adopts
        self.launching.clear()
        held_maps = (self.inbox, self.specs, self.containers, self.cpus_of, self.kill_reason, self.failed_launches)
        for held in (*held_maps, self.lost_launches, self.lost_runs, self.waiting, self.requeue_asked, self.not_killed):
            held.clear()
        self.reservations = {}
        self.saved_decisions = 0
        self.rebuild_due = True  # until recovery is through: one cut short is tried again
        recover(self)
        self.rebuild_due = False

    # -- entry points: the API's and the periodic jobs' ----------------------
    def submit_job(self, spec: JobSpec, user: str = "", key: str = "") -> int:
        """See `submissions.submit_job`."""
        return submissions.submit_job(self, spec, user, key)

    def submit_workflow(self, spec: WorkflowSpec, user: str = "", key: str = "") -> tuple[int, list[int]]:
        """See `submissions.submit_workflow`."""
        return submissions.submit_workflow(self, spec, user, key)

    def cancel(self, job_id: int, caller: Caller = ANONYMOUS) -> str:
        """See `job_actions.cancel`."""
        return job_actions.cancel(self, job_id, caller)

    def hold(self, job_id: int, caller: Caller, held: bool) -> str:
        """See `job_actions.hold`."""
        return job_actions.hold(self, job_id, caller, held)

    def requeue(self, job_id: int, caller: Caller) -> str:
        """See `job_actions.requeue`."""
        return job_actions.requeue(self, job_id, caller)

    def update_walltime(self, job_id: int, walltime: float, caller: Caller) -> str:
        """See `job_actions.update_walltime`."""
        return job_actions.update_walltime(self, job_id, walltime, caller)

    def schedule(self) -> None:
        """See `scheduling.schedule`."""
        scheduling.schedule(self)

    def sample(self) -> None:
        """See `monitoring.sample`."""
        monitoring.sample(self)

    def review(self) -> None:
        """See `monitoring.review`."""
        monitoring.review(self)

    def reconcile(self) -> None:
        """See `engine_faults.reconcile`."""
        engine_faults.reconcile(self)

    def purge(self) -> None:
        """Delete the jobs that ended more than `daemon.keep_ended_days` ago (`Store.purge_ended`) and
        the lending decisions made more than `daemon.keep_decisions_days` ago (`Store.purge_decisions`)."""
        keep = self.config.daemon
        now = self.clock()
        try:
            ended = self.store.purge_ended(now - keep.keep_ended_days * 86400) if keep.keep_ended_days else 0
            decided = (
                self.store.purge_decisions(now - keep.keep_decisions_days * 86400, DECISIONS_KEPT)
                if keep.keep_decisions_days
                else 0
            )
        except StateError as exc:  # the scheduling pass notices and reports a state file gone bad
            log.error("purging the state file: %s", exc)
            return
        if ended:
            log.info("purged %d job(s) that ended more than %g days ago", ended, keep.keep_ended_days)
        if decided:
            log.info("purged %d lending decision(s) made more than %g days ago", decided, keep.keep_decisions_days)

    def health(self) -> dict[str, Any]:
        """From memory only: answers whatever the engine or the state file do."""
        return {"engine_up": self.engine_up, "instance": self.instance, "state": self.state_problem or "ok"}

    def close(self) -> None:
        """Wait for engine calls under way, then close the state file (a launch finished now is not
        recorded: the next start adopts its container, as after a kill mid-launch)."""
        self.engine.close()
        self.launcher.close()
        self.backend.close()
        self.store.close()

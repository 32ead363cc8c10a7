"""The daemon's hands on a Mesos cluster: jobs as tasks of the cosched executor, one agent per node.

It answers the calls the daemon makes of its Docker backend (`launch`, `containers`,
`exit_of`, `logs`, `kill`, `remove`, `set_quota`, `verify_quota`, `sample`, ...) from
what Mesos tells a framework: a job is a task of the cosched executor on the agent
of the node the core placed it on (`cosched/mesos/executor.py`); its "container" is
its task id; its end comes in a terminal status update with the exit code and log
tail; quota changes go to the executor as MESSAGEs and return as the value the
cgroup shows; usage arrives every few seconds.

Why the agents are the core's nodes, in hostname order, and their offers are held:
cosched is meant to be the framework that owns its agents' resources (as it owns
one host's CPUs with Docker), so the core plans on them as on any cluster, and an
offer is simply where a launch finds its agent's resources. A guest runs on its
host's cores: its task asks Mesos for memory and a token 0.01 CPU, and the executor
gives it the quota the core decided. A job's cores must fit one agent.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cosched.daemon.docker_backend import ContainerInfo, EngineUnavailable, Exit, LaunchRefused, QuotaMismatch, Sample
from cosched.mesos import calls, jobs
from cosched.mesos.errors import MesosError
from cosched.mesos.handler import EventHandler
from cosched.mesos.offers import Offer, parse_offer
from cosched.mesos.scheduler import SchedulerClient, SchedulerConfig

log = logging.getLogger("cosched.mesos")

GUEST_CPUS = 0.01
"""What a guest's task asks Mesos for: the least a task may hold (its CPU is its host's)."""

_RUNNING = {"TASK_STAGING", "TASK_STARTING", "TASK_RUNNING"}
MESSAGE_RESEND = 3.0
"""Seconds before an unanswered quota message is sent again."""


@dataclass
class MesosSettings:
    masters: str | list[str]
    name: str = "cosched"
    user: str = "root"
    executor_command: str = jobs.EXECUTOR_COMMAND
    launch_timeout: float = 60.0
    """Seconds a launch may wait for its agent's offer and then for TASK_RUNNING."""
    quota_timeout: float = 15.0
    failover_timeout: float = calls.WEEK_SECONDS


@dataclass
class _Task:
    job_id: int
    agent_id: str
    state: str = "TASK_STAGING"
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    quota: float | None = None
    usage: dict[str, Any] | None = None


class MesosBackend(EventHandler):
    """Backend of a daemon whose cluster is `nodes` Mesos agents."""

    def __init__(
        self,
        settings: MesosSettings,
        nodes: int,
        *,
        framework_id: str | None = None,
        on_framework_id: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.nodes = nodes
        self.client = SchedulerClient(
            SchedulerConfig(
                masters=settings.masters,
                name=settings.name,
                user=settings.user,
                failover_timeout=settings.failover_timeout,
            ),
            self,
            framework_id=framework_id,
            on_framework_id=on_framework_id,
        )
        self.cond = threading.Condition()
        self.offers: dict[str, list[Offer]] = {}
        self.hostnames: dict[str, str] = {}
        self.agents: list[str] = []
        """Agent ids, by node: the first `nodes` agents offered, in hostname order."""
        self.tasks: dict[str, _Task] = {}
        self._quota_answers: dict[str, tuple[float | None, str]] = {}
        self._updates = 0
        self._started = False

    # -- the connection ----------------------------------------------------------
    def connect(self, timeout: float = 30.0) -> None:
        """Subscribe, learn the agents from their offers and the tasks from reconciliation."""
        if not self._started:
            self.client.start()
            self._started = True
        if not self.client.wait_subscribed(timeout):
            raise EngineUnavailable(
                f"cannot reach a Mesos master at {self.settings.masters}: {self.client.failure or 'no answer'}"
            )
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.hostnames) < self.nodes:
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise EngineUnavailable(
                        f"Mesos offered {len(self.hostnames)} agent(s) in {timeout:.0f} s; the cluster has {self.nodes}"
                    )
            self.agents = sorted(self.hostnames, key=lambda a: (self.hostnames[a], a))[: self.nodes]
        self._settle()

    def _settle(self, quiet: float = 1.0, limit: float = 10.0) -> None:
        """Wait until reconciliation has told the tasks the master knows (no update for `quiet` s)."""
        end = time.monotonic() + limit
        with self.cond:
            while time.monotonic() < end:
                seen = self._updates
                self.cond.wait(quiet)
                if self._updates == seen:
                    return

    @property
    def framework_id(self) -> str | None:
        return self.client.framework_id

    def ping(self) -> bool:
        return self.client.subscribed

    def has_image(self, name: str) -> bool:
        """The agents' engines cannot be asked from here: a missing image fails its task at launch."""
        return True

    def close(self) -> None:
        """Leave without TEARDOWN: the tasks run on, for the next start to find."""
        self.client.stop()

    # -- events (the client's thread) -------------------------------------------
    def on_offers(self, offers: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        surplus = []
        with self.cond:
            for raw in offers:
                offer = parse_offer(raw, now)
                known = offer.agent_id in self.hostnames
                if not known and len(self.hostnames) >= self.nodes:
                    surplus.append(offer.id)  # an agent beyond the cluster's nodes
                    continue
                self.hostnames.setdefault(offer.agent_id, offer.hostname)
                self.offers.setdefault(offer.agent_id, []).append(offer)
            self.cond.notify_all()
        if surplus:
            self.client.decline(surplus, refuse_seconds=3600)

    def on_rescind(self, offer_id: str) -> None:
        with self.cond:
            for held in self.offers.values():
                held[:] = [o for o in held if o.id != offer_id]

    def on_update(self, status: dict[str, Any]) -> None:
        task_id = status["task_id"]["value"]
        job_id = _job_of(task_id)
        if job_id is None:
            return
        with self.cond:
            task = self.tasks.get(task_id)
            if task is None:
                task = self.tasks[task_id] = _Task(job_id, status.get("agent_id", {}).get("value", ""))
            task.state = status["state"]
            task.message = status.get("message", "")
            if status.get("data"):
                try:
                    task.data.update(json.loads(base64.b64decode(status["data"])))
                except ValueError:
                    log.warning("task %s: undecodable status data", task_id)
            self._updates += 1
            self.cond.notify_all()

    def on_message(self, agent_id: str, executor_id: str, data: bytes) -> None:
        try:
            body = jobs.parse_message(data)
        except jobs.BadPayload as exc:
            log.warning("message from executor %s: %s", executor_id, exc)
            return
        with self.cond:
            if body["type"] == "quota_applied":
                self._quota_answers[body["task"]] = (body.get("cpus"), body.get("error", ""))
            elif body["type"] == "usage":
                for task_id, usage in body.get("tasks", {}).items():
                    if task_id in self.tasks:
                        self.tasks[task_id].usage = usage
            self.cond.notify_all()

    # -- jobs ----------------------------------------------------------------------
    def launch(
        self,
        job_id: int,
        spec: dict[str, Any],
        cpus: list[int],
        quota: float,
        memory_mib: int,
        *,
        node: int = 0,
        guest: bool = False,
    ) -> tuple[str, float]:
        """Start the job on its node's agent; returns its task id and start time once it runs."""
        agent = self.agents[node]
        task_id = task_of(job_id)
        task_cpus = GUEST_CPUS if guest else float(spec["cores"])
        executor = jobs.executor_info(agent, self.framework_id or "", self.settings.executor_command)
        with self.cond:  # the client's thread adds tasks as their updates arrive
            fresh = not any(t.agent_id == agent and t.state in _RUNNING for t in self.tasks.values())
        need_cpus = task_cpus + (jobs.EXECUTOR_CPUS if fresh else 0.0)
        need_mem = memory_mib + (jobs.EXECUTOR_MEM if fresh else 0.0)
        offers = self._take_offers(agent, need_cpus, need_mem)
        payload = jobs.JobPayload(job_id, spec, quota, memory_mib)
        task = jobs.job_task(task_id, agent, executor, payload, task_cpus, name=f"cosched job {job_id}")
        with self.cond:
            self.tasks[task_id] = _Task(job_id, agent, quota=quota)
        try:
            self.client.accept([o.id for o in offers], [calls.launch([task])], refuse_seconds=0)
        except MesosError as exc:
            raise EngineUnavailable(f"launching job {job_id} on {self.hostnames[agent]}: {exc}") from None
        return task_id, self._wait_running(task_id)

    def _take_offers(self, agent: str, cpus: float, mem: float) -> list[Offer]:
        """Every held offer of `agent`, once together they have room for the task (Mesos offers an
        agent's resources in pieces: what an ACCEPT left, what an ended task freed); an ACCEPT may
        name several offers of one agent. After 5 s without room, REVIVE (a filter left by an
        earlier decline may hold resources back), then wait on."""
        start = time.monotonic()
        deadline = start + self.settings.launch_timeout
        revived = False
        with self.cond:
            while True:
                held = self.offers.get(agent, [])
                if sum(o.cpus for o in held) + 1e-9 >= cpus and sum(o.mem for o in held) >= mem:
                    self.offers[agent] = []
                    return held
                if not revived and time.monotonic() - start > 5.0:
                    revived = True
                    self.client.revive()
                left = deadline - time.monotonic()
                if left <= 0:
                    pieces = ", ".join(f"{o.cpus:g} CPUs {o.mem:g} MiB" for o in held) or "none"
                    raise EngineUnavailable(
                        f"no room on agent {self.hostnames.get(agent, agent)} for {cpus:g} CPUs and {mem:g} MiB "
                        f"in {self.settings.launch_timeout:.0f} s (offered: {pieces})"
                    )
                self.cond.wait(min(left, 1.0))

    def _wait_running(self, task_id: str) -> float:
        deadline = time.monotonic() + self.settings.launch_timeout
        with self.cond:
            while True:
                task = self.tasks[task_id]
                if task.state == "TASK_RUNNING":
                    return float(task.data.get("started", 0.0))
                if task.state not in _RUNNING:
                    raise LaunchRefused(f"{task.state}: {task.message or 'no message'}")
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise EngineUnavailable(f"task {task_id} not running after {self.settings.launch_timeout:.0f} s")

    def containers(self) -> dict[int, ContainerInfo]:
        with self.cond:
            return {
                t.job_id: ContainerInfo(task_id, t.job_id, "running" if t.state in _RUNNING else "exited")
                for task_id, t in self.tasks.items()
            }

    def adopt(self, task_id: str) -> None:
        """Nothing to learn: reconciliation told this task's state."""

    def exit_of(self, task_id: str) -> Exit:
        with self.cond:
            task = self.tasks[task_id]
            code = task.data.get("exit_code")
            if code is None:
                code = 137 if task.state == "TASK_KILLED" else -1
            finished = float(task.data.get("finished") or 0.0)
            return Exit(int(code), float(task.data.get("started", 0.0)), finished, bool(task.data.get("oom")))

    def logs(self, task_id: str) -> str:
        with self.cond:
            task = self.tasks[task_id]
            return str(task.data.get("log_tail") or task.message)

    def kill(self, task_id: str) -> None:
        with self.cond:
            task = self.tasks.get(task_id)
        if task is None:
            return
        try:
            self.client.kill(task_id, task.agent_id)
        except MesosError as exc:
            raise EngineUnavailable(f"killing task {task_id}: {exc}") from None

    def remove(self, task_id: str) -> None:
        """The executor removed the container when the task ended: forget the task."""
        with self.cond:
            self.tasks.pop(task_id, None)

    # -- quotas and usage ------------------------------------------------------------
    def set_quota(self, task_id: str, cpus: float) -> None:
        """Ask the task's executor for `cpus` and wait for the value its cgroup shows.

        Framework messages are not reliable (the master drops one for an agent it thinks
        disconnected): it is sent again every `MESSAGE_RESEND` s until answered; applying the
        same quota twice changes nothing.
        """
        with self.cond:
            task = self.tasks.get(task_id)
            if task is None or task.state not in _RUNNING:
                return  # ended meanwhile: the next pass collects it
            self._quota_answers.pop(task_id, None)
        deadline = time.monotonic() + self.settings.quota_timeout
        while True:
            try:
                self.client.message(task.agent_id, jobs.executor_id(task.agent_id), jobs.quota_message(task_id, cpus))
            except MesosError as exc:
                raise EngineUnavailable(f"quota for task {task_id}: {exc}") from None
            resend = min(deadline, time.monotonic() + MESSAGE_RESEND)
            with self.cond:
                while task_id not in self._quota_answers and task.state in _RUNNING and time.monotonic() < resend:
                    self.cond.wait(max(0.0, resend - time.monotonic()))
                if task.state not in _RUNNING:
                    return
                if task_id in self._quota_answers:
                    shown, error = self._quota_answers.pop(task_id)
                    task.quota = shown
                    break
            if time.monotonic() >= deadline:
                waited = self.settings.quota_timeout
                raise EngineUnavailable(f"no answer to a quota change of task {task_id} in {waited:.0f} s")
        if shown is None or abs(shown - cpus) > 1e-3 or error:
            raise QuotaMismatch(f"task {task_id}: cgroup shows {shown} CPUs, expected {cpus:g} {error}".rstrip())

    def verify_quota(self, task_id: str, cpus: float) -> bool:
        """Against the last value the executor read from the cgroup (no call: it answers every change)."""
        with self.cond:
            task = self.tasks.get(task_id)
            shown = None if task is None else task.quota
        if shown is None:
            return False
        if abs(shown - cpus) > 1e-3:
            raise QuotaMismatch(f"task {task_id}: cgroup shows {shown} CPUs, expected {cpus:g}")
        return True

    def sample(self, task_id: str, quota: float, now: float) -> Sample | None:
        with self.cond:
            task = self.tasks.get(task_id)
            usage = None if task is None else task.usage
        if usage is None:
            return None
        return Sample(float(usage["cpu"]), float(usage["mem"]), int(usage["done"]), int(usage["total"]))


def task_of(job_id: int) -> str:
    return f"cosched-job-{job_id}"


def _job_of(task_id: str) -> int | None:
    prefix = "cosched-job-"
    if not task_id.startswith(prefix) or not task_id[len(prefix) :].isdigit():
        return None
    return int(task_id[len(prefix) :])

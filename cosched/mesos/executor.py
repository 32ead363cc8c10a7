"""The cosched executor: runs jobs' containers on an agent's host and resizes their CPU quota.

Why an executor of our own: Mesos cannot change a running task's CPU (no offer
operation, no agent call; docs/mesos.md), and co-scheduling is exactly that. The
framework asks this executor, in MESSAGE calls, to change a job's CFS quota; it applies
it through the host's Docker engine, reads the cgroup back and answers with what the
kernel enforces. It also sends each job's usage (cgroup CPU and memory, progress file)
for ASAx, and reports each job's end as a task state: TASK_FINISHED on exit 0,
TASK_FAILED with the exit code and log tail otherwise, TASK_KILLED after a KILL.

A gang's part (a job spread over agents) is held: its container made, not started, and
TASK_STARTING said, until the framework says `go` once every part is held. Mesos launches
on one agent per ACCEPT, so the parts arrive one by one; started at once, a part ran alone
when the daemon died, or an ACCEPT failed, before the next one (a crash audit).

The framework gives each task an executor of its own (`jobs.executor_info`), which
leaves once its task's end is acknowledged. Containers are started by the same
`DockerBackend` as the local daemon's, so a job has the same sandbox on Mesos as on
one host. With checkpointing, an agent restart leaves the executor and its jobs
running: it re-subscribes within MESOS_RECOVERY_TIMEOUT, resending every update not
yet acknowledged. SHUTDOWN (the framework torn down) kills its jobs, then it exits.
A SIGKILLed executor cannot collect its container: a sweep task (`jobs.sweep_task`)
starts another executor on that agent, which removes it.

    python3 -m cosched.mesos.executor    # as the agent starts it (environment below)
"""

from __future__ import annotations

import base64
import fcntl
import http.client
import json
import logging
import math
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cosched.daemon import journal
from cosched.daemon.config import a_duration
from cosched.daemon.docker_backend import (
    DockerBackend,
    EngineUnavailable,
    NotKilled,
    QuotaMismatch,
    RunLost,
    Withheld,
)
from cosched.daemon.sandbox import StagingMounts, check_data_roots
from cosched.errors import ConfigError
from cosched.mesos import jobs
from cosched.mesos.backoff import Backoff
from cosched.mesos.errors import CallError, MesosError
from cosched.mesos.masters import Master, parse_master
from cosched.mesos.recordio import RecordIODecoder
from cosched.mesos.runs import own_end, parse_task
from cosched.mesos.transport import EventStream, Unavailable, open_stream, post_call

log = logging.getLogger("cosched.mesos.executor")

LABEL_EXECUTOR = "cosched.executor"
LABEL_TASK = "cosched.task"

EXECUTOR_PATH = "/api/v1/executor"
IDLE_STREAM = 7 * 86400.0
"""How long a read of the agent's stream may wait for an event (an agent sends none while idle)."""
ANSWER_RETRY = 15.0
"""Seconds a quota answer is retried while the agent refuses it (the framework waits on it)."""
LEFT_WAIT = 600.0
"""Seconds an executor whose tasks all ended stays for the engine to answer, to remove the containers
it stopped without it (`_remove_left`); after that it leaves them to the engine, with an error line."""
RESEND_FIRST, RESEND_MOST = 1.0, 10.0
"""Seconds before an update whose UPDATE call failed is sent again, doubling up to the most."""
HALF_MADE_WAIT = 10.0
"""Seconds a launch the engine cut short waits for it to answer, to remove what it may have made,
before the run is reported lost with its engine at fault (under the framework's launch timeout)."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|secs|mins|hrs|days|weeks)\s*$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "secs": 1.0, "mins": 60.0, "hrs": 3600.0, "days": 86400.0}
_UNITS["weeks"] = 7 * _UNITS["days"]


def mesos_duration(text: str) -> float:
    """Seconds of a Mesos duration as the agent writes it ('15mins', '2secs', '100ms')."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"not a Mesos duration: {text!r} (expected e.g. '15mins')")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class ExecutorSettings:
    """What the agent tells its executor through the environment."""

    agent: Master
    framework_id: str
    executor_id: str
    checkpoint: bool = False
    recovery_timeout: float = 900.0
    backoff_max: float = 2.0
    sample_interval: float = 2.0
    fence: float = 60.0
    """Seconds its jobs run on while the agent answers nothing (`_fence`)."""
    poll_interval: float = 0.5
    auth: str | None = None
    """`Bearer <token>` where the agent authenticates executors (`--authenticate_http_executors`)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ExecutorSettings:
        missing = [k for k in ("MESOS_AGENT_ENDPOINT", "MESOS_FRAMEWORK_ID", "MESOS_EXECUTOR_ID") if not env.get(k)]
        if missing:
            raise ConfigError(f"cosched executor: {', '.join(missing)} not set (it is started by a Mesos agent)")
        return cls(
            agent=parse_master(env["MESOS_AGENT_ENDPOINT"]),
            framework_id=env["MESOS_FRAMEWORK_ID"],
            executor_id=env["MESOS_EXECUTOR_ID"],
            checkpoint=env.get("MESOS_CHECKPOINT") == "1",
            recovery_timeout=mesos_duration(env.get("MESOS_RECOVERY_TIMEOUT", "15mins")),
            backoff_max=mesos_duration(env.get("MESOS_SUBSCRIPTION_BACKOFF_MAX", "2secs")),
            sample_interval=_seconds(env, jobs.SAMPLE_INTERVAL, "2"),
            fence=_seconds(env, jobs.FENCE, "60"),
            # The agent hands its executors a token when it authenticates them; without it every call is refused.
            auth=f"Bearer {token}" if (token := env.get("MESOS_EXECUTOR_AUTHENTICATION_TOKEN")) else None,
        )


def _seconds(env: Mapping[str, str], key: str, default: str) -> float:
    """A duration the framework sets, checked as the daemon's config checks it (`a_duration`): `inf`
    would turn the fence off (a cut-off agent's job running on beside its next run), NaN or 0 fire
    it at the first silent call."""
    text = env.get(key, default)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not a_duration(value):
        raise ConfigError(f"cosched executor: {key} must be seconds in (0, 86400], got {text!r}")
    return value


@dataclass
class _Task:
    info: dict[str, Any]
    job: jobs.JobPayload
    quota: float
    container: str = ""
    killing: bool = False
    ended: bool = False
    left: bool = False
    """Its container stopped while the engine could not be asked (`_stop`), so not removed yet."""
    go: bool = False
    """The framework said a held part may start (`JobPayload.hold`)."""
    wake: threading.Event = field(default_factory=threading.Event)
    """Set by `go` or a KILL: a held part stops waiting."""
    resizing: threading.Lock = field(default_factory=threading.Lock)
    """Held while its quota is applied: messages run on a pool, and a launch carries a quota asked
    before its start, so the last one asked is the one left in the cgroup."""
    asked: int = 0
    """The number of the framework's latest quota change applied (`jobs.quota_message`)."""


@dataclass
class _Updates:
    """Updates sent and not yet acknowledged, resent at every re-subscription (the agent asks for them)."""

    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    unsent: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Those whose UPDATE call failed, by uuid: when to send it again (monotonic), and the wait after that."""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Executor:
    """One executor process: reads the agent's event stream, answers on `post_call`s."""

    def __init__(self, settings: ExecutorSettings, backend: DockerBackend) -> None:
        self.settings = settings
        self.backend = backend
        self.tasks: dict[str, _Task] = {}
        self.lock = threading.RLock()
        self.updates = _Updates()
        self.stopping = threading.Event()
        self.served = False
        """A task came: once every task's end is acknowledged, the executor leaves."""
        self.done = False
        self._launching = 0
        """LAUNCHes received and not handled yet."""
        self._stream: EventStream | None = None
        self._launcher = ThreadPoolExecutor(max_workers=8, thread_name_prefix="cosched-launch")
        self._unanswered: float | None = None
        """Since when every call to the agent failed (None: the last one was answered)."""
        self._left_since = 0.0
        """When `_remove_left` first found a container to remove (0: never)."""

    # -- the stream ------------------------------------------------------------
    def run(self) -> int:
        """Subscribe and handle events until SHUTDOWN (0), ERROR or a lost agent (1).

        However it ends, even by a bug, the executor's containers go with it: no one
        else would ever collect them.
        """
        watcher = threading.Thread(target=self._watch, name="cosched-watch", daemon=True)
        watcher.start()
        try:
            code = self._stay_subscribed()
            return 0 if self.done else code
        finally:
            self.stopping.set()
            # An end being collected (its task already `ended`, its container not yet removed) is
            # finished first: `_kill_all` passes ended tasks over, and nothing would remove it after.
            watcher.join(timeout=30)
            self._kill_all("executor exiting")
            self._launcher.shutdown(wait=True)
            self._settle_left()

    def _stay_subscribed(self) -> int:
        """With checkpointing, a lost agent is waited for up to MESOS_RECOVERY_TIMEOUT (it may be restarting)."""
        backoff = Backoff(base=0.25, cap=self.settings.backoff_max)
        lost_since: float | None = None
        attempt = 0
        while not self.stopping.is_set():
            try:
                stream = open_stream(
                    self.settings.agent, self._subscribe_call(), 10.0, path=EXECUTOR_PATH, auth=self.settings.auth
                )
            except MesosError as exc:
                lost_since = lost_since or time.monotonic()
                self._answered(False)
                if isinstance(exc, CallError) and self.served and not self._live():
                    # an agent that refuses it (restarted under a new id: `Framework cannot be found`),
                    # with every job of its own stopped (ended, or fenced): nothing left to do or tell
                    log.error("agent %s refuses this executor (%s), no job runs: leaving", self.settings.agent, exc)
                    return 1
                if not self.settings.checkpoint or time.monotonic() - lost_since > self.settings.recovery_timeout:
                    log.error("agent %s unreachable (%s); giving up", self.settings.agent, exc)
                    return 1
                time.sleep(backoff.delay(attempt))
                attempt += 1
                continue
            lost_since, attempt = None, 0
            self._answered(True)
            self._stream = stream
            try:
                code = self._read(stream)
            finally:
                self._stream = None
                stream.close()
            if code == 0 or not self.settings.checkpoint or self.stopping.is_set():
                return code
            log.warning("the agent's stream ended; re-subscribing (checkpointing is on)")
            lost_since = time.monotonic()
        return 0

    def _running(self) -> list[tuple[str, _Task]]:
        """Tasks whose container was started and has not ended, copied under the lock."""
        with self.lock:
            return [(task_id, t) for task_id, t in self.tasks.items() if t.container and not t.ended]

    def _live(self) -> bool:
        with self.lock:
            return any(not t.ended for t in self.tasks.values())

    def _subscribe_call(self) -> dict[str, Any]:
        with self.lock:
            unacked_tasks = [t.info for t in self.tasks.values() if not t.ended and self._unacknowledged(t)]
        with self.updates.lock:
            unacked_updates = [dict(update) for update in self.updates.pending.values()]
        body = {"unacknowledged_tasks": unacked_tasks, "unacknowledged_updates": unacked_updates}
        return self._call("SUBSCRIBE", body)

    def _unacknowledged(self, task: _Task) -> bool:
        task_id = task.info["task_id"]["value"]
        with self.updates.lock:
            return any(u["status"]["task_id"]["value"] == task_id for u in self.updates.pending.values())

    def _read(self, stream: EventStream) -> int:
        """Events until the stream ends (1), SHUTDOWN (0) or ERROR (1, and stop)."""
        decoder = RecordIODecoder()
        while not self.stopping.is_set():
            try:
                # An idle agent sends nothing for as long as it likes, and a timed-out read leaves
                # the stream unusable; an agent that dies closes the connection, which ends the read.
                data = stream.read(IDLE_STREAM)
            except (OSError, http.client.HTTPException) as exc:
                log.warning("the agent's stream broke: %s: %s", type(exc).__name__, exc)
                return 1
            if not data:
                return 1
            self._answered(True)
            try:
                events = [json.loads(record) for record in decoder.feed(data)]
            except (MesosError, ValueError) as exc:
                log.error("the agent's stream is not RecordIO JSON (%s); subscribing again", exc)
                return 1
            for event in events:
                outcome = self._handle(event)
                if outcome is not None:
                    return outcome
        return 0

    def _handle(self, event: dict[str, Any]) -> int | None:
        kind = event.get("type")
        if kind == "SUBSCRIBED":
            log.info("subscribed to agent %s", self.settings.agent)
        elif kind == "LAUNCH":
            self._submit_launch(event["launch"]["task"])
        elif kind == "LAUNCH_GROUP":
            for task in event["launch_group"]["task_group"].get("tasks", []):
                self._submit_launch(task)
        elif kind == "KILL":
            self._kill(event["kill"]["task_id"]["value"])
        elif kind == "ACKNOWLEDGED":
            with self.updates.lock:
                self.updates.pending.pop(event["acknowledged"]["uuid"], None)
        elif kind == "MESSAGE":
            # Off the reader: applying a quota calls the engine, and its answer may be retried.
            self._launcher.submit(self._message, base64.b64decode(event["message"]["data"]))
        elif kind == "SHUTDOWN":
            log.info("SHUTDOWN from the agent: killing every job")
            self._kill_all("executor shut down")
            return 0
        elif kind == "ERROR":
            log.error("agent %s sent ERROR: %s", self.settings.agent, event.get("error", {}).get("message", ""))
            self.stopping.set()
            return 1
        return None

    # -- calls -----------------------------------------------------------------
    def _call(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """A v1 executor call: its type, who sends it, and its body under the type's name."""
        return {
            "type": kind,
            "framework_id": {"value": self.settings.framework_id},
            "executor_id": {"value": self.settings.executor_id},
            kind.lower(): body,
        }

    def _post(self, call: dict[str, Any]) -> bool:
        try:
            post_call(self.settings.agent, call, None, 10.0, path=EXECUTOR_PATH, auth=self.settings.auth)
            self._answered(True)
            return True
        except (Unavailable, MesosError) as exc:
            log.warning("%s to agent %s failed: %s", call["type"], self.settings.agent, exc)
            self._answered(False)
            return False

    def _answered(self, answered: bool) -> None:
        if answered:
            self._unanswered = None
        elif self._unanswered is None:
            self._unanswered = time.monotonic()

    def update(self, task_id: str, state: str, message: str = "", data: dict[str, Any] | None = None) -> None:
        """Send a task state; kept until the agent acknowledges it, and resent at re-subscription."""
        status: dict[str, Any] = {
            "task_id": {"value": task_id},
            "state": state,
            "source": "SOURCE_EXECUTOR",
            "uuid": base64.b64encode(uuid.uuid4().bytes).decode(),
            "timestamp": time.time(),
            "executor_id": {"value": self.settings.executor_id},
        }
        if message:
            status["message"] = message[:1000]
        if data is not None:
            status["data"] = base64.b64encode(json.dumps(data).encode()).decode()
        update = {"status": status}
        with self.updates.lock:
            self.updates.pending[status["uuid"]] = update
        log.info("task %s: %s %s", task_id, state, message)
        if not self._post(self._call("UPDATE", update)):
            with self.updates.lock:
                self.updates.unsent[status["uuid"]] = (time.monotonic() + RESEND_FIRST, RESEND_FIRST)

    def _resend_unsent(self) -> None:
        """Send again, until the agent takes them, the updates whose UPDATE call failed. Why: they
        went again only with the next SUBSCRIBE, and an executor that had subscribed again while its
        restarted agent still recovered sent its job's end into that agent's 503 ("has not finished
        recovery"): it was lost, and the job stayed running for good, past its walltime (a crash audit).
        A re-subscription, which may have carried them too, does not clear them: the agent passes over
        an update it already has (same uuid), and one made while the SUBSCRIBE was under way is not in it."""
        now = time.monotonic()
        with self.updates.lock:
            due = [(key, self.updates.pending.get(key)) for key, (at, _) in self.updates.unsent.items() if at <= now]
        for key, update in due:
            sent = update is None or self._post(self._call("UPDATE", update))  # None: acknowledged since
            with self.updates.lock:
                if sent:
                    self.updates.unsent.pop(key, None)
                elif key in self.updates.unsent:
                    wait = min(RESEND_MOST, 2 * self.updates.unsent[key][1])
                    self.updates.unsent[key] = (now + wait, wait)

    def send(self, data: bytes, retry_for: float = 0.0) -> None:
        """A MESSAGE to the framework. Usage goes at most once (the next one supersedes it); an
        answer the framework waits for is retried for `retry_for` s, since a restarting agent
        refuses messages (503) until its recovery ends."""
        call = self._call("MESSAGE", {"data": base64.b64encode(data).decode()})
        deadline = time.monotonic() + retry_for
        while not self._post(call) and time.monotonic() < deadline and not self.stopping.is_set():
            time.sleep(0.5)

    # -- jobs ------------------------------------------------------------------
    def sweep(self, task_id: str, killed: list[str]) -> None:
        """Remove the containers of `killed` executors (SIGKILLed: they could not), then finish the
        sweep task. A container that had ended on its own is reported with its end (`ended`, by
        executor): the job ended, as its exit code says; the framework requeues the jobs of the others.
        Why: a job that finished while its executor was dead was run again (a crash audit)."""
        removed, ended = [], {}
        try:
            for executor in killed:
                for info in self.backend.labelled(**{LABEL_EXECUTOR: executor}):
                    if info.state in ("exited", "dead"):
                        ended[executor] = self._end_of(info.id)
                    log.warning(
                        "removing container %s of job %d left by executor %s (%s)",
                        info.id[:12],
                        info.job_id,
                        executor,
                        f"ended, exit code {ended[executor]['exit_code']}" if executor in ended else "running",
                    )
                    self.backend.remove(info.id)
                    removed.append(info.id)
        except EngineUnavailable as exc:  # the ends read (their containers perhaps removed) go with it
            self.update(task_id, "TASK_FAILED", f"cannot sweep: {exc}", {"removed": removed, "ended": ended})
            return
        data = {"removed": removed, "ended": ended}
        self.update(task_id, "TASK_FINISHED", f"{len(removed)} left container(s) removed", data)

    def _end_of(self, container: str) -> dict[str, Any]:
        """What a task's terminal update carries of its ended container (its start came with TASK_RUNNING)."""
        exit = self.backend.exit_of(container)
        return {
            "exit_code": exit.code,
            "finished": exit.finished,
            "oom": exit.oom,
            "log_tail": self.backend.logs(container),
            "cpu_seconds": exit.cpu_seconds,
        }

    def _submit_launch(self, info: dict[str, Any]) -> None:
        with self.lock:
            self.served = True
            self._launching += 1
        self._launcher.submit(self._launch_counted, info)

    def _launch_counted(self, info: dict[str, Any]) -> None:
        try:
            self._launch(info)
        finally:
            with self.lock:
                self._launching -= 1

    def _launch(self, info: dict[str, Any]) -> None:
        task_id = info["task_id"]["value"]
        killed = jobs.swept_executors(info)
        if killed is not None:
            self.sweep(task_id, killed)
            return
        try:
            job = jobs.job_of(info)
        except jobs.BadPayload as exc:
            self.update(task_id, "TASK_FAILED", str(exc))
            return
        task = _Task(info, job, job.quota)
        with self.lock:
            if task_id in self.tasks:
                return  # resent by the agent after a re-subscription: already ours
            self.tasks[task_id] = task
        name = container_name(self.backend.instance, task_id)
        try:
            container, started = self.backend.launch(
                job.job_id,
                job.spec,
                list(job.cpus),
                job.quota,
                job.memory_mib,
                name=name,
                labels={LABEL_EXECUTOR: self.settings.executor_id, LABEL_TASK: task_id},
                run=_run_of(task_id),
                gate=partial(self._hold, task_id, task, job.hold) if job.hold > 0 else None,
            )
        except Withheld:
            self._withheld(task_id, task, name)
            return
        except Exception as exc:
            # The engine refused this job (a 4xx: its own spec), so it fails; or the engine is gone or
            # failed on its own (a 5xx): the machine's fault, a lost run, which the framework queues
            # again (as TASK_FAILED, one broken engine failed every job placed on its agent).
            state = "TASK_LOST" if isinstance(exc, EngineUnavailable | RunLost) else "TASK_FAILED"
            # A call cut short may have made, even started, the container: gone before the job is
            # queued again. An engine that never answers is the machine's fault: its node is drained.
            unreachable = isinstance(exc, EngineUnavailable) and not self._remove_half_made(name)
            fault = {jobs.ENGINE_FAULT: True} if unreachable else None
            if self._claim_end(task):  # (the executor cannot leave meanwhile: `_launching` counts this launch)
                self.update(task_id, state, f"could not start: {str(exc).splitlines()[0][:500]}", fault)
            return
        with self.lock:
            stopped = task.ended
            task.container = "" if stopped else container
        if stopped:  # its end told while it started (SHUTDOWN): no one else would remove it
            self._remove_half_made(name)
            return
        self.update(task_id, "TASK_RUNNING", data={"container": container, "started": started})
        if task.killing:
            self._kill_container(task_id, container)
            return
        with task.resizing:  # a quota asked while it was held or starting (`_message`)
            if task.quota != job.quota:
                try:
                    self.backend.set_quota(container, task.quota)
                except (QuotaMismatch, EngineUnavailable) as exc:  # its samples then show the quota it runs under
                    log.warning("task %s: the quota asked before its start: %s", task_id, exc)
                    task.quota = job.quota

    def _hold(self, task_id: str, task: _Task, hold: float) -> bool:
        """The gate of a gang's part (`DockerBackend.launch`), its container made: whether the
        framework said `go` within `hold` s, before any KILL. Why `hold`: a framework gone for good
        never says it; the part is then lost, and nothing of it ran."""
        with self.lock:
            if task.ended or task.killing:  # no TASK_STARTING after its end: the agent would drop it
                return False
        self.update(task_id, "TASK_STARTING", "made, not started: waiting for every part of its gang")
        deadline = time.monotonic() + hold
        while not task.wake.is_set() and not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
            task.wake.wait(min(left, self.settings.poll_interval))
        with self.lock:  # decided under the lock `_claim_end` takes: a part told ended never starts
            return task.go and not task.killing and not task.ended and not self.stopping.is_set()

    def _withheld(self, task_id: str, task: _Task, name: str) -> None:
        """A held part that will not start: its end told (unless the executor, leaving, told it) and
        its made container removed. `withheld` says it never started, so a restarted daemon queues
        its job again as never run (`Run.never_started`); `asked`, as for any kill of the framework's."""
        if self._claim_end(task):
            if task.killing:
                self.update(task_id, "TASK_KILLED", "killed before it started", {"asked": True, "withheld": True})
            else:
                why = f"not told to start in {task.job.hold:g} s: its gang was not whole"
                self.update(task_id, "TASK_LOST", why, {"withheld": True})
        self._remove_half_made(name)

    def _claim_end(self, task: _Task) -> bool:
        """Whether telling `task`'s end falls to the caller: the first to ask, of the launch and of
        the executor stopping its tasks (`_stop`), says it, and only once."""
        with self.lock:
            claimed, task.ended = not task.ended, True
        return claimed

    def _remove_half_made(self, name: str) -> bool:
        """Remove the container `name` a launch cut short may have left, once the engine answers
        (within `HALF_MADE_WAIT` s, or the fence if shorter); whether it answered."""
        deadline = time.monotonic() + min(self.settings.fence, HALF_MADE_WAIT)
        while True:
            try:
                self.backend.remove(name)
                return True
            except EngineUnavailable:
                if time.monotonic() >= deadline or self.stopping.is_set():
                    return False
                time.sleep(0.5)

    def _kill(self, task_id: str) -> None:
        with self.lock:
            task = self.tasks.get(task_id)
        if task is None:
            self.update(task_id, "TASK_LOST", "no such task on this executor")
            return
        task.killing = True
        task.wake.set()  # held: never started
        if task.container:
            self._kill_container(task_id, task.container)

    def _kill_container(self, task_id: str, container: str) -> None:
        """The framework asks again for a kill that failed (its daemon's review, `carry_out.kill`)."""
        try:
            self.backend.kill(container)
        except (EngineUnavailable, NotKilled) as exc:
            log.warning("killing task %s: %s", task_id, exc)

    def _kill_all(self, reason: str) -> None:
        with self.lock:
            live = [(task_id, t) for task_id, t in self.tasks.items() if not t.ended]
        self._stop(live, "TASK_KILLED", reason)

    def _stop(self, tasks: list[tuple[str, _Task]], state: str, message: str) -> None:
        """These tasks end now: each one's container removed, `state` reported."""
        for task_id, task in tasks:
            if not self._claim_end(task):  # a launch failing meanwhile told it
                continue
            if task.container:
                try:
                    self.backend.remove(task.container)
                except EngineUnavailable as exc:  # a fence must stop it all the same
                    try:
                        killed = self.backend.kill_without_engine(task.container)
                    except OSError as error:  # EPERM: an executor not root cannot signal the job's uid
                        log.error("removing the container of task %s: %s; killing its process: %s", task_id, exc, error)
                    else:
                        how = "its process killed by pid" if killed else "its process already gone"
                        log.warning("removing the container of task %s: %s; %s", task_id, exc, how)
                    task.left = True
            # a held part never told `go` never starts now (`_hold` decides under the lock): say so
            withheld = task.job.hold > 0 and not task.container and not task.go
            self.update(task_id, state, message, {"withheld": True} if withheld else None)

    def _message(self, data: bytes) -> None:
        try:
            body = jobs.parse_message(data)
        except jobs.BadPayload as exc:
            log.warning("ignoring a message from the framework: %s", exc)
            return
        if body["type"] == "log" and "lines" in body:
            self._send_log(body["task"], int(body["lines"]))
            return
        if body["type"] == "go":  # sent again until TASK_RUNNING: once started, passed over
            with self.lock:
                task = self.tasks.get(body["task"])
                if task is not None:
                    task.go = True
                    task.wake.set()
            return
        if body["type"] != "quota":
            log.warning("ignoring a message of type %r", body["type"])
            return
        task_id, cpus, ask = body["task"], float(body["cpus"]), body.get("ask")
        with self.lock:
            task = self.tasks.get(task_id)
        if task is None or task.ended:
            self.send(jobs.quota_applied(task_id, None, jobs.NO_SUCH_TASK, ask), retry_for=ANSWER_RETRY)
            return
        error = ""
        with task.resizing:
            if ask is not None and ask < task.asked:  # sent again, or late: a newer change was applied since
                applied = self.backend.applied_quota(task.container) if task.container else task.quota
                self.send(jobs.quota_applied(task_id, applied, "superseded", ask), retry_for=ANSWER_RETRY)
                return
            task.asked = ask or task.asked
            if not task.container:  # held, or starting: `_launch` applies it once started
                task.quota = cpus
                self.send(jobs.quota_applied(task_id, cpus, "", ask), retry_for=ANSWER_RETRY)
                return
            try:
                self.backend.set_quota(task.container, cpus)
                task.quota = cpus
            except (QuotaMismatch, EngineUnavailable) as exc:
                error = str(exc)
            applied = self.backend.applied_quota(task.container)
        self.send(jobs.quota_applied(task_id, applied, error, ask), retry_for=ANSWER_RETRY)

    def _send_log(self, task_id: str, lines: int) -> None:
        """The task's last `lines` of output, read from the engine now ('' if it has no container)."""
        with self.lock:
            task = self.tasks.get(task_id)
        text = ""
        if task is not None and task.container:
            try:
                text = self.backend.live_log(task.container, lines) or ""
            except EngineUnavailable as exc:
                text = f"[cannot read its output: {exc}]\n"
        self.send(jobs.log_answer(task_id, text), retry_for=ANSWER_RETRY)

    # -- watching the containers ----------------------------------------------------
    def _watch(self) -> None:
        """Ends of jobs, the fence (every poll interval) and usage (every sample interval), each step
        whatever the one before it met: an engine down (ends unreadable) kept the fence from ever
        running, and the usage report, which is also how a frozen agent's silence is found. Ends
        come first: a job that ended just before the fence is reported ended, not lost."""
        last_sample = 0.0
        while not self.stopping.wait(self.settings.poll_interval):
            # an end first; resending (each call may wait 10 s on a frozen agent) after the fence
            steps = [self._collect_ends, self._fence, self._resend_unsent, self._remove_left, self._leave_when_done]
            if time.monotonic() - last_sample >= self.settings.sample_interval:
                last_sample = time.monotonic()
                steps.append(self._report_usage)
            engine = ""
            for step in steps:
                try:
                    step()
                except EngineUnavailable as exc:
                    engine = engine or str(exc)
                except Exception:  # a bug here must not stop the watching of every job
                    log.exception("watching the jobs failed")
            if engine:
                log.warning("Docker engine: %s", engine)

    def _fence(self) -> None:
        """Stop every job once the agent has answered nothing for `fence` s (frozen, cut off by the
        network, or gone): the master then takes the agent for lost, and the framework runs its jobs
        elsewhere `runs.fence_wait` after that, so this copy must be gone by then (cut off, it ran on
        beside the new one). The updates say TASK_LOST, the run's loss, not the job's end; they wait
        for the agent and go at the next subscription, which the stream's break here starts."""
        since = self._unanswered
        if since is None or time.monotonic() - since < self.settings.fence:
            return
        live = self._running()
        if not live:
            return
        log.error("agent %s answered nothing for %.0f s: stopping every job", self.settings.agent, self.settings.fence)
        silent = f"stopped: no answer from agent {self.settings.agent} for {self.settings.fence:g} s"
        self._stop(live, "TASK_LOST", silent)
        stream = self._stream
        if stream is not None:
            stream.interrupt()

    def _collect_ends(self) -> None:
        live = self._running()
        if not live:
            return
        listed = {info.id: info for info in self.backend.labelled(**{LABEL_EXECUTOR: self.settings.executor_id})}
        for task_id, task in live:
            info = listed.get(task.container)
            if info is not None and info.state not in ("exited", "dead"):
                continue
            if not self._claim_end(task):  # the executor, shut down meanwhile, told it
                continue
            if info is None:
                self.update(task_id, "TASK_FAILED" if not task.killing else "TASK_KILLED", "container disappeared")
                continue
            data = self._end_of(task.container)
            self.backend.remove(task.container)
            if task.killing and data["exit_code"] != 0:  # `asked`: not this executor's own removal on its way out
                self.update(task_id, "TASK_KILLED", "killed by the framework", {**data, "asked": True})
            else:  # exit 0 is the job's own end, a kill on its way or not (the daemon's rule on one host)
                self.update(task_id, *own_end(data), data)

    def _remove_left(self) -> None:
        """Remove the containers `_stop` could only kill (the engine down during a fence): nobody else
        removes them once this executor has left, and the engine would keep them, exited, for ever.
        Tried at each poll, quietly, for `LEFT_WAIT` s from the first try (the fence has said the
        engine is down)."""
        with self.lock:
            left = [(task_id, t) for task_id, t in self.tasks.items() if t.left]
        if not left:
            self._left_since = 0.0
            return
        self._left_since = self._left_since or time.monotonic()
        if time.monotonic() - self._left_since > LEFT_WAIT:
            names = ", ".join(t.container for _, t in left)
            log.error("the Docker engine did not answer for %.0f s: containers %s left to it, exited", LEFT_WAIT, names)
            for _, task in left:
                task.left = False
            return
        for task_id, task in left:
            try:
                self.backend.remove(task.container)
            except EngineUnavailable:
                return
            except Exception as exc:  # the engine answered and refused: asking again would not help
                log.error(
                    "removing container %s of task %s, stopped while the engine was down: %s",
                    task.container,
                    task_id,
                    exc,
                )
            else:
                log.info("removed the container of task %s, stopped while the engine was down", task_id)
            task.left = False

    def _settle_left(self) -> None:
        """However the executor leaves (its agent refusing it after a fence, SHUTDOWN, a bug), the
        containers it could only kill are removed first, while the engine answers within what is
        left of `LEFT_WAIT`: `_leave_when_done` is the usual way out, not the only one."""
        while True:
            self._remove_left()
            with self.lock:
                if not any(t.left for t in self.tasks.values()):
                    return
            time.sleep(self.settings.poll_interval)

    def _leave_when_done(self) -> None:
        """Every task ended and the agent acknowledged each end: this executor has nothing left to do."""
        with self.lock:
            ended = all(t.ended and not t.left for t in self.tasks.values())
        with self.updates.lock:
            pending = bool(self.updates.pending)
        if self.served and ended and not pending and not self._launching:
            log.info("every task ended and was acknowledged; leaving")
            self.done = True
            self.stopping.set()
            stream = self._stream
            if stream is not None:
                stream.interrupt()

    def _report_usage(self) -> None:
        now = time.time()
        live = self._running()
        usage = {}
        for task_id, task in live:
            try:
                sample = self.backend.sample(task.container, task.quota, now)
            except EngineUnavailable:
                sample = None  # its cgroup not found yet: the report goes all the same
            if sample is not None:
                usage[task_id] = {
                    "cpu": sample.cpu,
                    "mem": sample.mem,
                    "done": sample.done,
                    "total": sample.total,
                    "quota": task.quota,
                }
        if live:  # sent even when no sample could be read: the agent's answer is the fence's probe
            self.send(jobs.usage_message(now, usage))


def _run_of(task_id: str) -> int:
    """The job's run a task belongs to, as its id names it (0 for an id from before runs were
    numbered): its container's `cosched.run` label, as on one host (it said 0 beside its name's r1)."""
    name = parse_task(task_id)
    return name.run or 0 if name is not None else 0


def container_name(instance: str, task_id: str) -> str:
    """One container per task: a job spread over agents of one host has one per part."""
    return f"cosched-{instance}-{task_id.removeprefix('cosched-')}"


def instance_of(framework_id: str) -> str:
    """The `cosched.instance` label of a framework's containers (a Docker name has few characters allowed)."""
    return "mesos-" + re.sub(r"[^A-Za-z0-9_.-]", "", framework_id)[:48]


EXECUTOR_MOUNTS = Path("/run/cosched/executor-mounts")
"""Where executors pin jobs' data directories, a folder each (`executor_mounts`), and not in their
Mesos sandbox: the agent's `/files` serves a sandbox, and its garbage collection deletes one
recursively, through a mount an executor killed mid-launch left there, into the job's data."""


LOCK = ".lock"
"""In each executor's folder: the lock it holds while it runs."""
_HELD: list[int] = []
"""This executor's lock, held open."""


def staging_for(roots: tuple[str, ...], place: Path, euid: int) -> StagingMounts | None:
    """Where jobs' data directories are pinned, as the local daemon pins them: a private nosuid,nodev
    mount of the directory opened and checked, never its path bound by name (a symlink swapped in
    after the check would reach the host), in this executor's folder under `place`. Mounting needs
    root, so an executor given data roots that is not root refuses to run, as the daemon does."""
    if not roots:
        return None
    if euid != 0:
        raise ConfigError(
            "docker.data_roots: jobs' data dirs are bind-mounted nosuid,nodev at launch, which needs the "
            "executor to run as root (mesos.user = 'root'), or leave data_roots empty"
        )
    for warning in check_data_roots(roots, "docker.data_roots"):
        log.warning("%s", warning)
    return StagingMounts(executor_mounts(place))


def executor_mounts(place: Path) -> Path:
    """A folder of this executor's under `place`, locked (`flock`) for as long as it runs. The folders
    of executors no longer alive, killed mid-launch (their mounts stayed), are released first, as the
    local daemon releases its own leftovers at its start: a lock anyone can take is a gone
    executor's. A lock, not a pid: under Mesos's pid isolation a pid names no process here."""
    place.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder in place.iterdir():
        try:
            lock = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # not an executor's folder, or one still being made
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            continue  # its executor runs
        try:
            StagingMounts(folder).release_all()
            (folder / LOCK).unlink()
            folder.rmdir()
        except OSError as exc:  # the executor runs on; what is left is named for the operator
            log.warning("could not release the staging mounts of a gone executor in %s: %s", folder, exc)
        finally:
            os.close(lock)
    own = place / uuid.uuid4().hex
    own.mkdir(mode=0o700)
    lock = os.open(own / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    _HELD.append(lock)  # open, and so locked, until the executor exits
    return own


def main() -> int:
    journal.log_to_stderr()
    try:
        env = os.environ
        settings = ExecutorSettings.from_env(env)
        engine = jobs.read_job_settings(env.get(jobs.JOB_SETTINGS, ""), env.get("COSCHED_DOCKER_URL", ""))
        mounts = Path(env.get("COSCHED_EXECUTOR_MOUNTS") or EXECUTOR_MOUNTS)
        staging = staging_for(engine.data_roots, mounts, os.geteuid())
    except ConfigError as exc:
        print(f"cosched executor: {exc}", file=sys.stderr)
        return 2
    backend = DockerBackend(instance_of(settings.framework_id), engine, staging)
    try:
        backend.connect()
    except EngineUnavailable as exc:  # its task is then lost with the fault named, and its node drained
        print(f"cosched executor: {exc}", file=sys.stderr)
    return Executor(settings, backend).run()


if __name__ == "__main__":
    sys.exit(main())

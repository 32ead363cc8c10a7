"""What the framework and the cosched executor say to each other: task payloads and messages.

Both sides import this module and nothing of each other: the framework builds an
`ExecutorInfo` and a job's `TaskInfo` (the job's spec rides in `TaskInfo.data`), the
executor reads them back. Quota changes, and `go` to a gang's held part, go framework ->
executor as MESSAGE calls; the executor answers with the quota the cgroup shows and, every
few seconds, the usage of its jobs. Every payload is a small JSON object with a `type`;
anything else is a `BadPayload` naming what is wrong, never a crash of either side.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from cosched.daemon.config import DockerSection, validate_job_settings
from cosched.errors import ConfigError
from cosched.mesos.errors import MesosError

Json = dict[str, Any]

EXECUTOR_COMMAND = "python3 -m cosched.mesos.executor"
"""How agents start the executor by default: cosched installed on every agent (see docs/mesos.md)."""

JOB_SETTINGS = "COSCHED_JOB_SETTINGS"
"""The executor's environment variable holding the daemon's [docker] job settings, as JSON: the
user jobs run as, their limits, the data roots and the CFS period. A job on an agent gets the
sandbox the operator configured, as on one host, never the executor's defaults."""

SAMPLE_INTERVAL = "COSCHED_SAMPLE_INTERVAL"
"""The executor's environment variable holding the seconds between its usage reports."""

FENCE = "COSCHED_FENCE"
"""The executor's environment variable holding the seconds it keeps jobs running while its agent
answers nothing (`[mesos] fence`)."""

JOB_KEYS = (
    "cpu_period",
    "data_roots",
    "log_tail",
    "job_user",
    "pids_limit",
    "log_max_mib",
    "nofile",
    "seccomp_profile",
    "ptys",
)
"""The [docker] keys that travel: the others (`base_url`, `engine_calls`) are the agent's own."""

ENGINE_FAULT = "engine_unreachable"
"""Set (true) in the data of a TASK_LOST the executor sends when its agent's Docker engine cannot be
reached to start the task: the machine, not the job, is at fault, and the framework drains its node."""

LOG_BYTES = 256 << 10
"""The most of a running job's output one answer carries: it travels through the agent and the master."""

EXECUTOR_CPUS = 0.05
EXECUTOR_MEM = 64.0
"""The executor's own resources (a Python process waiting on one HTTP stream)."""


def read_job_settings(text: str, base_url: str = "") -> DockerSection:
    """The executor's side of `executor_info`: the job settings from `JOB_SETTINGS`, checked as the
    daemon checks its config (a ConfigError names the key). Empty: the defaults."""
    if not text:
        return DockerSection(base_url=base_url)
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{JOB_SETTINGS}: not JSON: {exc}") from None
    if not isinstance(body, dict) or set(body) - set(JOB_KEYS):
        raise ConfigError(f"{JOB_SETTINGS}: expected an object with keys among {', '.join(JOB_KEYS)}")
    defaults = DockerSection()
    for key, value in body.items():
        wanted = type(getattr(defaults, key))
        if wanted is tuple:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif wanted is bool:
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, wanted) and not isinstance(value, bool)
        if not ok:
            raise ConfigError(f"{JOB_SETTINGS}: docker.{key} has the wrong type: {value!r}")
    settings = DockerSection(base_url=base_url, **{**body, "data_roots": tuple(body.get("data_roots", ()))})
    try:
        validate_job_settings(settings)
    except ConfigError as exc:
        raise ConfigError(f"{JOB_SETTINGS}: {exc}") from None
    return settings


class BadPayload(MesosError, ValueError):
    """A task's data or a message that is not what this protocol sends."""


def executor_info(
    executor_id: str,
    framework_id: str,
    command: str = EXECUTOR_COMMAND,
    job_settings: DockerSection | None = None,
    sample_interval: float = 2.0,
    fence: float = 60.0,
) -> Json:
    """An executor of its own per task, named as the task (another namespace in Mesos): one killed
    takes only its task with it, the next task never waits for the agent to forget it, and it
    leaves once its task's end is acknowledged. `job_settings` is the daemon's [docker] table
    (`JOB_KEYS` of it; None: the defaults); its `data_roots` must be storage every agent mounts at
    the same path, and its `seccomp_profile` a file every agent has. `sample_interval`: the
    daemon's, so a job's usage is as fresh on an agent as on one host (`SAMPLE_INTERVAL`).
    `fence`: how long it keeps jobs running while its agent answers nothing (`FENCE`)."""
    body = {key: getattr(job_settings or DockerSection(), key) for key in JOB_KEYS}
    variables = {
        JOB_SETTINGS: json.dumps(body),
        SAMPLE_INTERVAL: repr(float(sample_interval)),
        FENCE: repr(float(fence)),
    }
    environment = {"variables": [{"name": name, "value": value} for name, value in variables.items()]}
    return {
        "executor_id": {"value": executor_id},
        "framework_id": {"value": framework_id},
        "type": "CUSTOM",
        "name": "cosched executor",
        "command": {"value": command, "shell": True, "environment": environment},
        "resources": [_scalar("cpus", EXECUTOR_CPUS), _scalar("mem", EXECUTOR_MEM)],
    }


@dataclass(frozen=True)
class JobPayload:
    """A job as the executor runs it: the API's job spec, its starting quota, memory and cpuset."""

    job_id: int
    spec: Json
    quota: float
    memory_mib: int
    cpus: tuple[int, ...] = ()
    hold: float = 0.0
    """Seconds its executor holds the job's container made and not started, until the framework
    says `go` (a gang's part: no part runs before every part is placed); 0: started at once."""

    def encode(self) -> str:
        body = {
            "type": "job",
            "job": self.job_id,
            "spec": self.spec,
            "quota": self.quota,
            "memory_mib": self.memory_mib,
            "cpus": list(self.cpus),
            "hold": self.hold,
        }
        return _b64(body)


def job_task(task_id: str, agent_id: str, executor: Json, job: JobPayload, cores: float, name: str = "") -> Json:
    """A TaskInfo for one job: its cores and memory as resources, the job itself as data."""
    return {
        "name": name or task_id,
        "task_id": {"value": task_id},
        "agent_id": {"value": agent_id},
        "executor": executor,
        "resources": [_scalar("cpus", cores), _scalar("mem", float(job.memory_mib))],
        "data": job.encode(),
    }


SWEEP_CPUS = 0.01
SWEEP_MEM = 16.0


def sweep_task(task_id: str, agent_id: str, executor: Json, killed: list[str]) -> Json:
    """A TaskInfo for an executor that removes the containers of the `killed` executors on its
    agent (they outlive a SIGKILLed executor: Docker runs them), then finishes the task."""
    return {
        "name": "cosched sweep",
        "task_id": {"value": task_id},
        "agent_id": {"value": agent_id},
        "executor": executor,
        "resources": [_scalar("cpus", SWEEP_CPUS), _scalar("mem", SWEEP_MEM)],
        "data": _b64({"type": "sweep", "executors": list(killed)}),
    }


def swept_executors(task: Json) -> list[str] | None:
    """The executors a sweep task names; None for any other task."""
    try:
        body = _json(task.get("data"), "task data")
    except BadPayload:
        return None
    if body.get("type") != "sweep":
        return None
    return [str(e) for e in body.get("executors") or []]


def swept_ends(status: Json) -> dict[str, Json]:
    """The ends a sweep's TASK_FINISHED reports (`ended`: executor -> what its container's end was,
    as `Executor._end_of` tells it), those well formed; none from an older executor."""
    try:
        ended = _json(status.get("data"), "sweep data").get("ended")
    except BadPayload:
        return {}
    if not isinstance(ended, dict):
        return {}
    return {
        str(executor): end
        for executor, end in ended.items()
        if isinstance(end, dict) and _whole(end.get("exit_code")) and isinstance(end.get("oom"), bool)
    }


def job_of(task: Json) -> JobPayload:
    """The job a TaskInfo carries; BadPayload if it carries none."""
    body = _json(task.get("data"), "task data")
    if body.get("type") != "job":
        raise BadPayload(f"task data: expected type 'job', got {body.get('type')!r}")
    try:
        job_id = int(body["job"])
        spec = body["spec"]
        quota = float(body["quota"])
        memory = int(body["memory_mib"])
        cpus = tuple(int(c) for c in body.get("cpus") or ())
        hold = float(body.get("hold") or 0.0)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadPayload(f"task data: missing or invalid field ({type(exc).__name__}: {exc})") from None
    if not isinstance(spec, dict) or not spec.get("image") or not spec.get("command"):
        raise BadPayload("task data: spec needs an image and a command")
    if not (math.isfinite(quota) and quota > 0) or memory <= 0:
        raise BadPayload(f"task data: quota {quota} and memory_mib {memory} must be > 0")
    if not (math.isfinite(hold) and hold >= 0):
        raise BadPayload(f"task data: hold {hold} must be seconds >= 0")
    return JobPayload(job_id, spec, quota, memory, cpus, hold)


# -- messages ------------------------------------------------------------------
def quota_message(task_id: str, cpus: float, ask: int) -> bytes:
    """Framework -> executor: give this task `cpus` CPUs of CFS quota. `ask` numbers the framework's
    changes of the task's quota: each message is sent again until answered and the executor applies
    them on a pool, so an older one arriving late must not undo a newer one."""
    return json.dumps({"type": "quota", "task": task_id, "cpus": cpus, "ask": ask}).encode()


NO_SUCH_TASK = "no such running task"
"""The error of a quota change's answer for a task whose container has ended (or never was): its end
is on its way, and the change is moot."""


def quota_applied(task_id: str, cpus: float | None, error: str = "", ask: int | None = None) -> bytes:
    """Executor -> framework: the quota the task's cgroup shows now (None when unreadable), in answer
    to the change numbered `ask` (None from an executor that numbers none)."""
    body = {"type": "quota_applied", "task": task_id, "cpus": cpus, "error": error}
    return json.dumps(body if ask is None else {**body, "ask": ask}).encode()


def go_message(task_id: str) -> bytes:
    """Framework -> executor: start this held part (`JobPayload.hold`): every part of its gang is placed."""
    return json.dumps({"type": "go", "task": task_id}).encode()


def log_message(task_id: str, lines: int) -> bytes:
    """Framework -> executor: send the last `lines` of this task's output (`cosched logs`)."""
    return json.dumps({"type": "log", "task": task_id, "lines": lines}).encode()


def log_answer(task_id: str, text: str) -> bytes:
    """Executor -> framework: the task's last lines, at most `LOG_BYTES` of them."""
    data = text.encode()
    if len(data) > LOG_BYTES:
        text = "[...]" + data[-LOG_BYTES:].decode("utf-8", "replace")
    return json.dumps({"type": "log", "task": task_id, "text": text}).encode()


def usage_message(at: float, usage: dict[str, Json]) -> bytes:
    """Executor -> framework: per task, `cpu` (used over `quota`, the CPUs it had), `mem` (over limit),
    `done`/`total` tasks."""
    return json.dumps({"type": "usage", "at": at, "tasks": usage}).encode()


def parse_message(data: bytes) -> Json:
    """A message's JSON object (with its `type`); BadPayload for anything else."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadPayload(f"message: not JSON ({exc})") from None
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        raise BadPayload("message: expected a JSON object with a 'type'")
    if body["type"] in ("quota", "quota_applied") and not (body.get("ask") is None or _whole(body["ask"])):
        raise BadPayload(f"{body['type']} message: 'ask' must be a whole number >= 0")
    if body["type"] == "quota":
        cpus = body.get("cpus")
        if not isinstance(body.get("task"), str) or not (_number(cpus) and cpus > 0):
            raise BadPayload("quota message: needs 'task' (a task id) and 'cpus' > 0")
    if body["type"] == "go" and not isinstance(body.get("task"), str):
        raise BadPayload("go message: needs 'task' (a task id)")
    if body["type"] == "quota_applied":  # NaN read back would pass any check of it against the quota asked
        cpus = body.get("cpus")
        if not isinstance(body.get("task"), str) or not (cpus is None or _number(cpus)):
            raise BadPayload("quota_applied message: needs 'task' (a task id) and 'cpus' (finite, or null)")
    if body["type"] == "usage":
        tasks = body.get("tasks")
        if not isinstance(tasks, dict) or not all(_a_sample(sample) for sample in tasks.values()):
            raise BadPayload(
                "usage message: needs 'tasks', each a sample of finite 'cpu' and 'mem' >= 0 (and 'quota' > 0),"
                " and whole 'done' <= 'total'"
            )
    if body["type"] == "log":
        lines, text = body.get("lines"), body.get("text")
        asked = isinstance(lines, int) and not isinstance(lines, bool) and lines > 0
        if not isinstance(body.get("task"), str) or not (asked or isinstance(text, str)):
            raise BadPayload("log message: needs 'task' (a task id) and 'lines' > 0, or its answer's 'text'")
    return body


def _a_sample(sample: Any) -> bool:
    """One task's usage as `usage_message` writes it. Python's JSON reads `NaN`, which `max(0, x)`
    turns into 0: a lender that looks idle to ASAx; a string stopped the daemon's review."""
    return (
        isinstance(sample, dict)
        and _number(sample.get("cpu"))
        and _number(sample.get("mem"))
        and _whole(sample.get("done"))
        and _whole(sample.get("total"))
        and sample["done"] <= sample["total"]
        and ("quota" not in sample or (_number(sample["quota"]) and sample["quota"] > 0))
    )


def _number(value: Any) -> TypeGuard[float]:
    """A finite number >= 0 (JSON's `true` is not one; Python's JSON reads `NaN` and `Infinity`)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _scalar(name: str, value: float) -> Json:
    return {"name": name, "type": "SCALAR", "scalar": {"value": value}}


def _b64(body: Json) -> str:
    return base64.b64encode(json.dumps(body).encode()).decode()


def _json(data: Any, what: str) -> Json:
    if not isinstance(data, str) or not data:
        raise BadPayload(f"{what}: missing")
    try:
        body = json.loads(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise BadPayload(f"{what}: not base64 JSON ({exc})") from None
    if not isinstance(body, dict):
        raise BadPayload(f"{what}: expected a JSON object")
    return body

"""A gang's part held by the cosched executor on the real Docker engine (its agent faked).

Mesos launches on one agent per ACCEPT, so a gang's parts arrive one by one. A part started at
once ran alone when the daemon died, or an ACCEPT failed, before the next one (a crash audit).
Each part's container is now made and held, unstarted, until the framework says `go`.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import docker.errors
import pytest
from daemon_support import require_engine, wait_until

from cosched.daemon.config import DockerSection
from cosched.daemon.docker_backend import DockerBackend
from cosched.mesos import jobs
from cosched.mesos.executor import Executor, ExecutorSettings, container_name, instance_of
from workloads.images import busybox_image


@pytest.mark.parametrize("end", ["go", "kill", "no go in time", "executor shut down"])
def test_a_gangs_part_is_made_and_starts_only_when_told(end: str) -> None:
    engine = require_engine()
    image = busybox_image(engine)
    instance = instance_of(f"gang-hold-{uuid.uuid4().hex[:8]}")
    backend = DockerBackend(instance, DockerSection())
    backend.connect()
    env = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "F", "MESOS_EXECUTOR_ID": "t1"}
    executor = Executor(replace(ExecutorSettings.from_env(env), poll_interval=0.05), backend)
    sent: list[tuple[str, str, Any]] = []
    executor.update = lambda task_id, state, message="", data=None: sent.append((task_id, state, data))  # type: ignore[method-assign]
    hold = 1.0 if end == "no go in time" else 60.0
    spec = {"image": image, "command": ["sleep", "30"], "cores": 1}
    info = jobs.job_task("t1", "S0", jobs.executor_info("t1", "F"), jobs.JobPayload(7, spec, 1.0, 64, hold=hold), 1.0)
    name = container_name(instance, "t1")
    since = int(time.time()) - 1
    launch = threading.Thread(target=executor._launch, args=(info,))
    launch.start()
    try:
        wait_until(lambda: sent, 30, "the part held")
        assert sent == [("t1", "TASK_STARTING", None)]
        assert engine.containers.get(name).status == "created"  # made: a bad spec is refused before any part runs
        if end == "go":  # and a quota asked while it is held: carried into its start
            answers: list[bytes] = []
            executor.send = lambda data, retry_for=0.0: answers.append(data)  # type: ignore[method-assign]
            executor._message(jobs.quota_message("t1", 0.5, 1))
            assert [jobs.parse_message(a) for a in answers] == [
                jobs.parse_message(jobs.quota_applied("t1", 0.5, "", 1))
            ]
            executor._message(jobs.go_message("t1"))
        elif end == "kill":
            executor._kill("t1")
        elif end == "executor shut down":  # SHUTDOWN: the executor tells every end itself, once
            executor._kill_all("executor shut down")
            executor.stopping.set()
        launch.join(hold + 30)
        assert not launch.is_alive()
        states = [(state, data) for _, state, data in sent[1:]]
        if end == "go":
            assert [state for state, _ in states] == ["TASK_RUNNING"]
            container = engine.containers.get(name)
            assert container.status == "running"
            assert backend.applied_quota(container.id) == 0.5
            answers.clear()  # a newer change, then an older one sent again or late: the newer stays
            executor._message(jobs.quota_message("t1", 0.8, 3))
            executor._message(jobs.quota_message("t1", 0.3, 2))
            assert [jobs.parse_message(a) for a in answers] == [
                jobs.parse_message(jobs.quota_applied("t1", 0.8, "", 3)),
                jobs.parse_message(jobs.quota_applied("t1", 0.8, "superseded", 2)),
            ]
            assert backend.applied_quota(container.id) == 0.8
            return
        assert states == [
            {
                "kill": ("TASK_KILLED", {"asked": True, "withheld": True}),
                "no go in time": ("TASK_LOST", {"withheld": True}),
                "executor shut down": ("TASK_KILLED", {"withheld": True}),  # not `asked`: a lost run, never run
            }[end]
        ]
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(name)
        until = int(time.time()) + 1
        events = engine.events(since=since, until=until, filters={"container": name}, decode=True)
        assert [e["Action"] for e in events if e["Action"] in ("create", "start", "destroy")] == ["create", "destroy"]
    finally:
        launch.join(5)
        for container in engine.containers.list(all=True, filters={"label": f"cosched.instance={instance}"}):
            container.remove(force=True)

"""The cosched executor on a REAL Mesos agent, running jobs through the real Docker engine.

A framework (our scheduler client) launches two jobs on one agent with the cosched
executor; the agent starts the executor (`python -m cosched.mesos.executor`), which runs
the containers, resizes a quota on the framework's MESSAGE and reads it back from the
cgroup, reports usage and exit codes, kills on KILL and cleans up on TEARDOWN.
"""

from __future__ import annotations

import base64
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import require_engine
from mesos_support import Cluster, Recorder, containers_left, start_cluster, stop_cluster, wait_until

from cosched.daemon.cgroups import CgroupFiles
from cosched.mesos import SchedulerClient, calls, jobs
from cosched.mesos.executor import instance_of
from workloads.images import busybox_image

EXECUTOR = f"{shlex.quote(sys.executable)} -m cosched.mesos.executor"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(Path(tmp_path_factory.mktemp("mesos-executor")))
    try:
        yield started
    finally:
        stop_cluster(started)


class MessageRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []

    def on_message(self, agent_id: str, executor_id: str, data: bytes) -> None:
        self._add(self.messages, json.loads(data))

    def message_where(self, kind: str, test: Any) -> Any:
        with self.cond:
            return next((m for m in self.messages if m["type"] == kind and test(m)), None)

    def status(self, task_id: str, state: str) -> dict[str, Any] | None:
        with self.cond:
            return next((u for u in self.updates if u["task_id"]["value"] == task_id and u["state"] == state), None)


def _job(job_id: int, image: str, script: str, quota: float) -> jobs.JobPayload:
    spec = {"image": image, "command": ["sh", "-c", script], "cores": 1}
    return jobs.JobPayload(job_id, spec, quota, 64)


def _data(status: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(status["data"])))


def test_the_executor_runs_resizes_reports_and_kills_jobs_on_a_real_agent(cluster: Cluster) -> None:
    engine = require_engine()
    image = busybox_image(engine)
    recorder = MessageRecorder()
    client: SchedulerClient = cluster.client(recorder, "executor-test").start()
    try:
        assert client.wait_subscribed(15), client.failure
        fid = client.framework_id or ""
        recorder.wait(lambda: recorder.offers_from("agent1") and recorder.offers_from("agent2"), 15, "offers")
        offer = recorder.offers_from("agent1")[0]
        agent = offer["agent_id"]["value"]
        client.decline([recorder.offers_from("agent2")[0]["id"]["value"]], refuse_seconds=60)
        executor = jobs.executor_info("two-jobs", fid, EXECUTOR)  # one for both (the daemon gives each its own)
        sleeper = _job(1, image, 'echo 1/4 > "$COSCHED_PROGRESS"; sleep 120', 0.4)
        failer = _job(2, image, "echo boom; exit 3", 0.4)
        tasks = [
            jobs.job_task("sleeper", agent, executor, sleeper, 0.4),
            jobs.job_task("failer", agent, executor, failer, 0.4),
        ]
        client.accept([offer["id"]["value"]], [calls.launch(tasks)], refuse_seconds=60)

        running = recorder.wait(lambda: recorder.status("sleeper", "TASK_RUNNING"), 60, "the sleeper running")
        failed = recorder.wait(lambda: recorder.status("failer", "TASK_FAILED"), 60, "the failer's end")
        assert failed["message"] == "exit code 3"
        assert _data(failed)["exit_code"] == 3
        assert "boom" in _data(failed)["log_tail"]
        container = _data(running)["container"]
        pid = engine.api.inspect_container(container)["State"]["Pid"]
        files = CgroupFiles.of_pid(pid)
        assert files is not None
        assert files.quota() == (40_000, 100_000)

        # ASAx's lending: the framework asks for 0.3 CPUs, the executor answers with what the cgroup shows.
        client.message(agent, "two-jobs", jobs.quota_message("sleeper", 0.3, 1))
        applied = recorder.wait(
            lambda: recorder.message_where("quota_applied", lambda m: m["task"] == "sleeper"), 30, "quota_applied"
        )
        assert applied == {"type": "quota_applied", "task": "sleeper", "cpus": 0.3, "error": "", "ask": 1}
        assert files.quota() == (30_000, 100_000)
        client.message(agent, "two-jobs", jobs.quota_message("nobody", 0.3, 1))
        refused = recorder.wait(
            lambda: recorder.message_where("quota_applied", lambda m: m["task"] == "nobody"), 30, "a refusal"
        )
        assert refused["cpus"] is None and refused["error"] == "no such running task"

        usage = recorder.wait(
            lambda: recorder.message_where(
                "usage",
                lambda m: m["tasks"].get("sleeper", {}).get("total") == 4 and m["tasks"]["sleeper"]["quota"] == 0.3,
            ),
            30,
            "usage with the sleeper's progress, measured under its new quota",
        )
        assert usage["tasks"]["sleeper"]["done"] == 1
        assert 0 <= usage["tasks"]["sleeper"]["mem"] <= 1

        client.kill("sleeper", agent)
        killed = recorder.wait(lambda: recorder.status("sleeper", "TASK_KILLED"), 30, "the sleeper killed")
        assert killed["source"] == "SOURCE_EXECUTOR"
        assert recorder.states("sleeper") == ["TASK_RUNNING", "TASK_KILLED"]
        sleeper_container = {"label": [f"cosched.instance={instance_of(fid)}", "cosched.job=1"]}
        wait_until(lambda: not containers_left(engine, sleeper_container), 10, "its container removed")
        framework = wait_until(lambda: (f := cluster.framework(fid)) and not f["tasks"] and f, 10, "all acknowledged")
        assert sorted(t["state"] for t in framework["completed_tasks"]) == ["TASK_FAILED", "TASK_KILLED"]
    finally:
        if client.subscribed:
            client.teardown()
        client.stop()
    # TEARDOWN shuts the executor down: it exits, and none of its containers is left behind.
    ours = {"label": f"cosched.instance={instance_of(fid)}"}
    wait_until(lambda: not containers_left(engine, ours), 30, "no container of the framework left")


def test_jobs_outlive_an_agent_crash_and_the_executor_resubscribes(cluster: Cluster) -> None:
    """Checkpointing: agent1 is SIGKILLed and started again; the executor re-subscribes, the job
    keeps running (no TASK_LOST), and quota changes and kills still reach it."""
    engine = require_engine()
    image = busybox_image(engine)
    recorder = MessageRecorder()
    client: SchedulerClient = cluster.client(recorder, "executor-agent-crash").start()
    try:
        assert client.wait_subscribed(15), client.failure
        fid = client.framework_id or ""
        offer = recorder.wait(lambda: recorder.offers_from("agent1"), 15, "an offer from agent1")[0]
        agent = offer["agent_id"]["value"]
        executor = jobs.executor_info("survivor", fid, EXECUTOR)
        task = jobs.job_task("survivor", agent, executor, _job(7, image, "sleep 120", 0.5), 0.5)
        client.accept([offer["id"]["value"]], [calls.launch([task])], refuse_seconds=60)
        running = recorder.wait(lambda: recorder.status("survivor", "TASK_RUNNING"), 60, "the job running")
        container = _data(running)["container"]

        cluster.crash_and_restart_agent(1)
        # Until the master notices the crash it still calls agent1 active: wait for the re-registration
        # (a framework message to an agent the master thinks disconnected is dropped).
        wait_until(
            lambda: any(a["hostname"] == "agent1" and "reregistered_time" in a for a in cluster.state()["slaves"]),
            60,
            "agent1 registered again",
        )
        client.message(agent, "survivor", jobs.quota_message("survivor", 0.2, 1))
        applied = recorder.wait(
            lambda: recorder.message_where("quota_applied", lambda m: m["task"] == "survivor"), 60, "quota_applied"
        )
        assert applied["cpus"] == 0.2, applied
        assert engine.api.inspect_container(container)["State"]["Running"]
        # Updates are at-least-once: TASK_RUNNING, unacknowledged at the crash, may come again; nothing else may.
        assert set(recorder.states("survivor")) == {"TASK_RUNNING"}

        client.kill("survivor", agent)
        recorder.wait(lambda: recorder.status("survivor", "TASK_KILLED"), 30, "the job killed")
    finally:
        if client.subscribed:
            client.teardown()
        client.stop()
    ours = {"label": f"cosched.instance={instance_of(fid)}"}
    wait_until(lambda: not containers_left(engine, ours), 30, "no container of the framework left")

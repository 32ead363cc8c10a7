"""Faults under `cosched daemon` on a REAL Mesos master with two agents, each leaving every accepted
job run exactly once.

What ran is read from the Docker engine's own event log (`containers_of`): a job ran once when one
run of it ended with every part exiting 0 and no two of its runs were ever alive together. The
master is started with a 1 s agent ping timeout (3 missed pings: unreachable) so an agent's death
is noticed in seconds, and a 3 s offer timeout so it rescinds offers held longer.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import require_engine
from mesos_support import (
    Cluster,
    assert_ran_once,
    containers_of,
    executor_pids,
    framework_id_of,
    mesos_daemon,
    start_cluster,
    stop_cluster,
    wait_until,
)

from workloads.images import busybox_image

FAST_LOSS = {"agent_ping_timeout": "1secs", "max_agent_ping_timeouts": "3", "offer_timeout": "3secs"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(Path(tmp_path_factory.mktemp("mesos-faults")), cpus=2, mem=2048, master=FAST_LOSS)
    try:
        yield started
    finally:
        stop_cluster(started)


@pytest.fixture
def image() -> str:
    return busybox_image(require_engine())


def _framework_tasks(cluster: Cluster, framework_id: str) -> list[dict[str, Any]]:
    framework = cluster.framework(framework_id) or {"tasks": [], "completed_tasks": []}
    return list(framework["tasks"]) + list(framework["completed_tasks"])


def _node(daemon: Any, node: int) -> dict[str, Any]:
    return dict(daemon.client.call("GET", "/v1/nodes")[node])


def _kill_node(cluster: Cluster, engine: Any, index: int, framework_id: str) -> list[bytes]:
    """A machine dies: its agent, our executor there and the containers it ran. Returns the agent's command."""
    executors = executor_pids(framework_id, cluster.agent_id(f"agent{index}"))
    argv = cluster.kill_agent(index)
    for pid in executors:
        os.kill(pid, signal.SIGKILL)
    for executor in set(executors.values()):
        for container in engine.containers.list(all=True, filters={"label": f"cosched.executor={executor}"}):
            container.remove(force=True)
    return argv


def _finish(cluster: Cluster, daemon: Any) -> None:
    daemon.stop()
    cluster.teardown_everything()
    wait_until(lambda: cluster.active_agents() == 2, 60, "both agents registered")


def test_a_dead_agents_jobs_run_again_elsewhere_and_its_node_comes_back(
    cluster: Cluster, image: str, tmp_path: Path
) -> None:
    engine = require_engine()
    since = time.time()
    daemon = mesos_daemon(cluster, tmp_path, "cosched-dead-agent", mesos="launch_timeout = 20.0")
    argv: list[bytes] = []
    try:
        fid = framework_id_of(daemon)
        first = daemon.submit(image=image, command=["sleep", "20"], cores=1, memory_mib=64, walltime=120)
        second = daemon.submit(image=image, command=["sleep", "4"], cores=1, memory_mib=64, walltime=120)
        for job_id in (first, second):
            daemon.wait_running(job_id, 60)
        assert (_on_node(daemon, first), _on_node(daemon, second)) == (0, 1)  # first fit
        argv = _kill_node(cluster, engine, 2, fid)
        # The master marks agent2 unreachable: its job waits in the queue (node 0 is busy), its node
        # is out of the cluster.
        wait_until(lambda: not _node(daemon, 1)["up"], 30, "node 1 down")
        status = wait_until(lambda: (j := daemon.job(second))["state"] == "pending" and j, 30, "the job requeued")
        assert status["reason"].startswith("requeued: ") and status["start"] is None
        jobs = daemon.wait_final([first, second], 120)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs

        # The machine is back: its offer (offers are not suppressed while a node is away) gives the
        # core its node again.
        cluster.start_agent(2, argv)
        argv = []
        wait_until(lambda: _node(daemon, 1)["up"], 60, "node 1 back")
        later = [
            daemon.submit(image=image, command=["sleep", "3"], cores=1, memory_mib=64, walltime=60) for _ in range(2)
        ]
        assert {j["state"] for j in daemon.wait_final(later, 90).values()} == {"done"}
        assert {_on_node(daemon, j) for j in later} == {0, 1}
        ran = containers_of(engine, fid, since)
        for job_id in (first, second, *later):
            assert_ran_once(ran[job_id])
        assert len({c.run for c in ran[second]}) == 2  # the run on the dead machine, and the one that finished
    finally:
        if argv:
            cluster.start_agent(2, argv)
        _finish(cluster, daemon)


def _on_node(daemon: Any, job_id: int) -> int:
    """The first node of the job's (last) run."""
    with daemon.db() as db:
        slots = db.execute("SELECT slots FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
    return int(json.loads(slots)[0][0])


def test_a_killed_executors_jobs_are_swept_then_run_again(cluster: Cluster, image: str, tmp_path: Path) -> None:
    """SIGKILL of the executor leaves its container running (Docker runs it, not the executor): the run
    counts as lost only once a new executor on that agent removed it, then the job runs again."""
    engine = require_engine()
    since = time.time()
    daemon = mesos_daemon(cluster, tmp_path, "cosched-executor-kill")
    try:
        fid = framework_id_of(daemon)
        job = daemon.submit(image=image, command=["sleep", "8"], cores=1, memory_mib=64, walltime=120)
        daemon.wait_running(job, 60)
        executors = executor_pids(fid, cluster.agent_id(f"agent{_on_node(daemon, job) + 1}"))
        [executor] = set(executors.values())
        [left] = engine.containers.list(filters={"label": f"cosched.executor={executor}"})
        for pid in executors:
            os.kill(pid, signal.SIGKILL)
        status = wait_until(lambda: (j := daemon.job(job))["reason"] and j, 60, "the job requeued")
        assert status["reason"].startswith("requeued: "), status
        assert engine.containers.list(all=True, filters={"id": left.id}) == []  # swept before the requeue
        assert daemon.wait_final([job], 90)[job]["state"] == "done"
        ran = containers_of(engine, fid, since)[job]
        assert_ran_once(ran)
        assert [c.exit_code for c in ran] == [137, 0]  # the left container removed, then the run that finished
    finally:
        _finish(cluster, daemon)

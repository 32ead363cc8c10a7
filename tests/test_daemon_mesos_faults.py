"""Faults under `cosched daemon` on a REAL Mesos master with two agents, each leaving every accepted
job run exactly once.

What ran is read from the Docker engine's own event log (`containers_of`): a job ran once when one
run of it ended with every part exiting 0 and no two of its runs were ever alive together. The
master is started with a 1 s agent ping timeout (3 missed pings: unreachable) so an agent's death
is noticed in seconds, and a 3 s offer timeout so it rescinds offers held longer.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import require_engine
from mesos_support import (
    Cluster,
    ContainerEvents,
    Recorder,
    assert_ran_once,
    command_task,
    executor_pids,
    finish,
    framework_id_of,
    mesos_daemon,
    nodes_shown,
    start_cluster,
    stop_cluster,
    wait_until,
)

from cosched.mesos import calls
from workloads.images import busybox_image
from workloads.real import make_data_dir

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


class Away:
    """Agent `index`, which a test takes away: `back()` starts it again with the command it had, and
    so does leaving the `with` if the test did not (the module's later tests need both agents)."""

    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster, self.index, self.argv = cluster, index, list[bytes]()

    def __enter__(self) -> Away:
        return self

    def __exit__(self, *exc: object) -> None:
        self.back()

    def back(self) -> None:
        if self.argv:
            self.cluster.start_agent(self.index, self.argv)
            self.argv = []


def _kill_node(cluster: Cluster, engine: Any, index: int, framework_id: str, hostname: str = "") -> list[bytes]:
    """A machine dies: its agent, our executor there and the containers it ran. Returns the agent's command."""
    executors = executor_pids(framework_id, cluster.agent_id(hostname or f"agent{index}"))
    argv = cluster.kill_agent(index)
    for pid in executors:
        with contextlib.suppress(ProcessLookupError):  # one whose tasks had ended may have exited meanwhile
            os.kill(pid, signal.SIGKILL)
    for executor in set(executors.values()):
        for container in engine.containers.list(all=True, filters={"label": f"cosched.executor={executor}"}):
            container.remove(force=True)
    return argv


def test_a_dead_agents_jobs_run_again_elsewhere_and_its_node_comes_back(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    engine = require_engine()
    daemon = mesos_daemon(cluster, tmp_path, "cosched-dead-agent", mesos="launch_timeout = 20.0")
    try:
        with Away(cluster, 2) as agent2:
            fid = framework_id_of(daemon)
            first = daemon.submit(image=image, command=["sleep", "12"], cores=1, memory_mib=64, walltime=120)
            second = daemon.submit(image=image, command=["sleep", "4"], cores=1, memory_mib=64, walltime=120)
            for job_id in (first, second):
                daemon.wait_running(job_id, 60)
            assert (_on_node(daemon, first), _on_node(daemon, second)) == (0, 1)  # first fit
            agent2.argv = _kill_node(cluster, engine, 2, fid)
            # The master marks agent2 unreachable: its job is queued again, its node is out of the cluster.
            wait_until(lambda: not _node(daemon, 1)["up"], 30, "node 1 down")
            # ... once its executor's fence (1 s) and the margin (30 s) have passed: it may be cut off only
            status = wait_until(lambda: (j := daemon.job(second))["reason"] and j, 60, "the job requeued")
            assert status["reason"].startswith("requeued: TASK_LOST on agent2"), status
            jobs = daemon.wait_final([first, second], 120)
            assert {j["state"] for j in jobs.values()} == {"done"}, jobs

            # The machine is back: its offer (offers are not suppressed while a node is away) gives the
            # core its node again.
            agent2.back()
            wait_until(lambda: _node(daemon, 1)["up"], 60, "node 1 back")
            later = _two_jobs_run_on_both_nodes(daemon, image)
            ran = container_events.containers(fid)
            for job_id in (first, second, *later):
                assert_ran_once(ran[job_id])
            assert len({c.run for c in ran[second]}) == 2  # the run on the dead machine, and the one that finished
    finally:
        finish(cluster, daemon)


def test_a_job_on_an_agent_cut_off_from_the_master_never_runs_twice(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """agent2 frozen (SIGSTOP: its executor and container run on, cut off): the master takes it for
    lost within seconds. Its job was queued again at once and ran on agent1 beside the first copy
    (a helper's run: 20 s of two copies). Now the executor stops its job once its agent has answered
    nothing for `fence` (1 s here), and the daemon runs it elsewhere `fence` + 30 s after the
    master's word: the two runs never overlap, and the job ends once, done."""
    daemon = mesos_daemon(cluster, tmp_path, "cosched-cut-off", mesos="launch_timeout = 20.0")
    try:
        fid = framework_id_of(daemon)
        holder, job = _a_long_job_on_node1(daemon, image)
        with cluster.agent_stopped(2):
            wait_until(lambda: not _node(daemon, 1)["up"], 30, "node 1 down")
            status = wait_until(lambda: (j := daemon.job(job))["reason"] and j, 60, "the job requeued")
            assert status["reason"].startswith("requeued: TASK_LOST on agent2"), status
            daemon.wait_running(job, 60)  # on agent1 now
        _ran_once_after_its_fence(daemon, cluster, container_events, fid, holder, job)
    finally:
        finish(cluster, daemon)


def test_an_agent_back_under_a_new_id_leaves_no_second_copy_of_its_job(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """agent2 killed and started again without its checkpointed id (`meta/slaves/latest` gone, as on
    a reinstalled machine): the new agent knows nothing of the old executor, which runs its job on
    while the new agent refuses its calls. Its fence stops the job; the daemon runs it again only
    after that, and the two runs never overlap."""
    daemon = mesos_daemon(cluster, tmp_path, "cosched-new-id", mesos="launch_timeout = 20.0")
    try:
        fid = framework_id_of(daemon)
        holder, job = _a_long_job_on_node1(daemon, image)
        old = cluster.agent_id("agent2")
        argv = cluster.kill_agent(2)
        (cluster.run_dir / "agent2" / "work" / "meta" / "slaves" / "latest").unlink()
        cluster.start_agent(2, argv)
        wait_until(lambda: _active_agent_ids(cluster, "agent2") - {old}, 60, "agent2 under a new id")
        status = wait_until(lambda: (j := daemon.job(job))["reason"] and j, 90, "the job requeued")
        assert status["reason"].startswith("requeued:"), status
        _ran_once_after_its_fence(daemon, cluster, container_events, fid, holder, job)
    finally:
        finish(cluster, daemon)


def _a_long_job_on_node1(daemon: Any, image: str) -> tuple[int, int]:
    """A 3 s job on node 0 and a 45 s one on node 1 (agent2), running: long enough that agent2's fence,
    not its own end, stops its first copy (a copy that ends while cut off is reported when its agent
    is back, or, if it never is, the job runs again: once at a time). Their ids."""
    holder = daemon.submit(image=image, command=["sleep", "3"], cores=1, memory_mib=64, walltime=120)
    job = daemon.submit(image=image, command=["sleep", "45"], cores=1, memory_mib=64, walltime=120)
    daemon.wait_running(job, 60)
    assert _on_node(daemon, job) == 1
    return holder, job


def _ran_once_after_its_fence(
    daemon: Any, cluster: Cluster, events: ContainerEvents, fid: str, holder: int, job: int
) -> None:
    """Both done; `job` ran twice (agent2's copy, stopped by its executor's fence, and the one that
    finished), never at once."""
    jobs = daemon.wait_final([holder, job], 120)
    assert {j["state"] for j in jobs.values()} == {"done"}, jobs
    ran = events.containers(fid)
    assert len({c.run for c in ran[job]}) == 2
    assert_ran_once(ran[job])
    assert "answered nothing for 1 s: stopping every job" in _executor_logs(cluster, 2)


def _active_agent_ids(cluster: Cluster, hostname: str) -> set[str]:
    return {a["id"] for a in cluster.state()["slaves"] if a["hostname"] == hostname and a.get("active")}


@pytest.mark.parametrize(
    ("broken", "words"),
    [
        ({"COSCHED_DOCKER_URL": "unix:///nonexistent/docker.sock"}, "cannot reach the Docker engine"),
        ({"PYTHONHOME": "/nonexistent"}, "the cosched executor does not start on agent"),
    ],
    ids=["engine_cannot_be_reached", "executor_does_not_start"],
)
def test_an_agent_that_cannot_run_a_job_is_drained_naming_why_and_the_job_runs_elsewhere(
    cluster: Cluster,
    image: str,
    tmp_path: Path,
    container_events: ContainerEvents,
    broken: dict[str, str],
    words: str,
) -> None:
    """agent2's executors cannot reach a Docker engine: first fit sent the job back there until it had
    lost 3 runs and failed (a helper's run), and so every later job placed there. Or the cosched
    executor does not start there at all (here its Python cannot; in an operator's walkthrough,
    cosched was not installed for `mesos.executor_command`): the task failed `Executor terminated`,
    each sweep of the agent too, again every second (80 sandboxes in 90 s), and only the agent's
    sandboxes said why. Now the first launch that fails there (the third sweep whose executor died
    unheard) drains node 1, naming why, and the job runs on node 0 once it is free."""
    daemon = None
    argv = cluster.kill_agent(2)
    environment = {"PATH": os.environ["PATH"], **broken}
    cluster.start_agent(2, [*argv, f"--executor_environment_variables={json.dumps(environment)}".encode()])
    try:
        wait_until(lambda: cluster.active_agents() == 2, 60, "agent2 back, broken")
        daemon = mesos_daemon(cluster, tmp_path, "cosched-broken-agent", mesos="launch_timeout = 20.0")
        fid = framework_id_of(daemon)
        holder = daemon.submit(image=image, command=["sleep", "8"], cores=1, memory_mib=64, walltime=120)
        daemon.wait_running(holder, 60)
        job = daemon.submit(image=image, command=["true"], cores=1, memory_mib=64, walltime=120)
        drained = wait_until(lambda: _node(daemon, 1)["drain"], 90, "node 1 drained")
        assert drained["by"] == "cosched" and words in drained["reason"], drained
        jobs = daemon.wait_final([holder, job], 120)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        assert _on_node(daemon, job) == 0
        assert len(container_events.containers(fid)[job]) == 1  # agent2 never made a container
        framework = cluster.framework(fid) or {}
        sweeps = [t for t in framework.get("completed_tasks", []) if t["id"].startswith("cosched-sweep-")]
        assert len(sweeps) <= 4, len(sweeps)
        daemon.client.call("POST", "/v1/nodes/1/resume")
    finally:
        cluster.start_agent(2, cluster.kill_agent(2)[: len(argv)])  # as it was
        wait_until(lambda: cluster.active_agents() == 2, 60, "agent2 back")
        if daemon is not None:
            finish(cluster, daemon)


def _executor_logs(cluster: Cluster, index: int) -> str:
    """What the executors agent `index` started wrote (their sandboxes' stderr)."""
    return "".join(path.read_text(errors="replace") for path in (cluster.run_dir / f"agent{index}").rglob("stderr"))


def test_a_daemon_restarted_while_an_agent_is_away_starts_without_its_node(
    cluster: Cluster, image: str, tmp_path: Path
) -> None:
    """The nodes' agents are saved at the first start: restarted while one machine is down, the
    daemon starts without it (its node down, the other node's jobs run) instead of waiting for it,
    and the machine's return gives the core its node back."""
    engine = require_engine()
    daemon = mesos_daemon(cluster, tmp_path, "cosched-away-agent")
    try:
        with Away(cluster, 2) as agent2:
            fid = framework_id_of(daemon)
            assert [n["up"] for n in daemon.client.call("GET", "/v1/nodes")] == [True, True]
            daemon.stop()
            agent2.argv = _kill_node(cluster, engine, 2, fid)
            wait_until(lambda: cluster.active_agents() == 1, 30, "the master to lose agent2")
            started = time.monotonic()
            daemon.start(timeout=60)
            assert time.monotonic() - started < 30, "it waited for the absent agent"
            assert (_node(daemon, 0)["up"], _node(daemon, 1)["up"]) == (True, False)
            assert "agent agent2 (node 1) made no offer" in daemon.log.read_text()
            _a_job_runs_on_node_0(daemon, image)

            agent2.back()
            wait_until(lambda: _node(daemon, 1)["up"], 60, "node 1 back")
            _two_jobs_run_on_both_nodes(daemon, image)
    finally:
        finish(cluster, daemon)


def test_a_daemon_first_started_while_an_agent_is_away_takes_it_as_a_node_when_it_comes(
    cluster: Cluster, image: str, tmp_path: Path
) -> None:
    """No nodes saved yet and one machine down: after waiting for every agent the daemon starts with
    the node it lacks down; the agent that comes then takes that node, and the mapping is saved."""
    daemon = None
    try:
        with Away(cluster, 2) as agent2:
            agent2.argv = cluster.kill_agent(2)  # no framework of this test yet: nothing of ours ran there
            wait_until(lambda: cluster.active_agents() == 1, 30, "the master to lose agent2")
            daemon = mesos_daemon(cluster, tmp_path, "cosched-first-away")
            assert (_node(daemon, 0)["up"], _node(daemon, 1)["up"]) == (True, False)
            assert "the cluster has 2: node 1 is down until a new agent offers" in daemon.log.read_text()
            shown = nodes_shown(daemon)
            assert re.search(r"node1\s+-\s+-\s+DOWN", shown), shown
            _a_job_runs_on_node_0(daemon, image)

            agent2.back()
            wait_until(lambda: _node(daemon, 1)["up"], 60, "node 1 taken by agent2")
            _two_jobs_run_on_both_nodes(daemon, image)
            assert _saved_nodes(daemon) == ["agent1", "agent2"]
    finally:
        if daemon is not None:
            finish(cluster, daemon)


def test_a_machine_back_under_another_hostname_takes_the_node_its_agent_left(
    cluster: Cluster, image: str, tmp_path: Path
) -> None:
    """A machine replaced, or back under a new hostname: the first new agent that offers takes the node
    whose agent is gone (saved, so a restart knows it), and jobs run there; the old machine, if it
    came back, would be beyond the cluster's nodes."""
    engine = require_engine()
    daemon = mesos_daemon(cluster, tmp_path, "cosched-renamed")
    try:
        with Away(cluster, 2) as agent2:
            fid = framework_id_of(daemon)
            agent2.argv = _kill_node(cluster, engine, 2, fid)
            wait_until(lambda: not _node(daemon, 1)["up"], 30, "node 1 down")
            cluster.start_agent(2, _renamed(agent2.argv, "agent2b", tmp_path / "agent2b"))
            try:
                wait_until(lambda: _node(daemon, 1)["up"], 60, "node 1 taken by agent2b")
                assert _node(daemon, 1)["hostname"] == "agent2b"
                assert "agent agent2b takes node 1 (its agent agent2 is gone)" in daemon.log.read_text()
                _two_jobs_run_on_both_nodes(daemon, image)
                assert _saved_nodes(daemon) == ["agent1", "agent2b"]
            finally:  # the renamed agent is on agent2's port: gone before the original comes back
                _kill_node(cluster, engine, 2, fid, hostname="agent2b")
    finally:
        finish(cluster, daemon)


def test_an_agent_beyond_the_nodes_takes_the_node_of_an_agent_that_dies(tmp_path: Path, image: str) -> None:
    """Three agents, two nodes: the third agent is beyond the cluster's nodes, its offers declined for
    an hour. A job runs on node 0 and a gang of both nodes waits, so offers keep flowing (no SUPPRESS,
    hence no REVIVE after one). When node 1's agent dies, a REVIVE brings the third agent's offers
    back at once and it takes node 1 (without it, the hour); the gang then runs on nodes 0 and 1.
    Node 1 was drained (its machine to be mended): the drain was the dead machine's, not the spare's,
    which was drained in its place and idled (an operator's walkthrough)."""
    engine = require_engine()
    cluster = start_cluster(tmp_path / "mesos3", cpus=2, mem=2048, master=FAST_LOSS, agents=3)
    daemon = None
    try:
        (tmp_path / "daemon").mkdir()
        daemon = mesos_daemon(cluster, tmp_path / "daemon", "cosched-beyond")
        fid = framework_id_of(daemon)
        mapped = [_node(daemon, node)["hostname"] for node in (0, 1)]
        [spare] = {"agent1", "agent2", "agent3"} - set(mapped)
        wait_until(lambda: spare in _declined_hosts(daemon), 30, f"{spare} declined as beyond the nodes")
        busy = daemon.submit(image=image, command=["sleep", "300"], cores=1, memory_mib=64, walltime=600)
        daemon.wait_running(busy, 60)
        gang = daemon.submit(image=image, command=["sleep", "1"], cores=2, span=True, memory_mib=64, walltime=60)
        daemon.client.call("POST", "/v1/nodes/1/drain", {"reason": "DIMM swap"})
        _kill_node(cluster, engine, int(mapped[1].removeprefix("agent")), fid)
        wait_until(lambda: (n := _node(daemon, 1))["hostname"] == spare and n["up"], 60, f"{spare} on node 1")
        assert f"agent {spare} takes node 1 (its agent {mapped[1]} is gone)" in daemon.log.read_text()
        wait_until(lambda: not _node(daemon, 1)["drain"], 30, f"node 1 ({spare}) no longer drained")
        assert f"the drain of agent {mapped[1]} (DIMM swap) is forgotten" in daemon.log.read_text()
        daemon.client.call("DELETE", f"/v1/jobs/{busy}")
        assert daemon.wait_final([gang], 90)[gang]["state"] == "done"
        with daemon.db() as db:
            slots = json.loads(db.execute("SELECT slots FROM jobs WHERE id = ?", (gang,)).fetchone()[0])
        assert sorted(node for node, cores in slots if cores) == [0, 1]
    finally:
        if daemon is not None:
            daemon.stop()
        stop_cluster(cluster)


def _declined_hosts(daemon: Any) -> list[str]:
    """Hostnames the daemon's log says it declined as beyond the cluster's nodes."""
    return re.findall(r"agent (\S+) is beyond the cluster's nodes", daemon.log.read_text())


def _renamed(argv: list[bytes], hostname: str, root: Path) -> list[bytes]:
    """An agent's command line as another machine's: its hostname, and directories of its own (an agent
    refuses to recover another's checkpointed state)."""
    flags = {b"--hostname": hostname, b"--work_dir": str(root / "work"), b"--runtime_dir": str(root / "run")}
    out = []
    for arg in argv:
        name = arg.partition(b"=")[0]
        out.append(b"%s=%s" % (name, flags[name].encode()) if name in flags else arg)
    return out


def _saved_nodes(daemon: Any) -> list[str]:
    """The nodes' hostnames the daemon saved for its next start."""
    with daemon.db() as db:
        return list(json.loads(db.execute("SELECT value FROM meta WHERE key = 'mesos_nodes'").fetchone()[0]))


def _a_job_runs_on_node_0(daemon: Any, image: str) -> None:
    """With node 1 down, a 1-core job starts on node 0 and ends."""
    job = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=64, walltime=60)
    assert daemon.wait_final([job], 60)[job]["state"] == "done" and _on_node(daemon, job) == 0


def _two_jobs_run_on_both_nodes(daemon: Any, image: str) -> list[int]:
    """With both nodes up, two 1-core jobs run side by side, one on each, and end; their ids."""
    jobs = [daemon.submit(image=image, command=["sleep", "3"], cores=1, memory_mib=64, walltime=60) for _ in "ab"]
    assert {j["state"] for j in daemon.wait_final(jobs, 90).values()} == {"done"}
    assert {_on_node(daemon, j) for j in jobs} == {0, 1}
    return jobs


def _on_node(daemon: Any, job_id: int) -> int:
    """The first node of the job's (last) run."""
    with daemon.db() as db:
        slots = db.execute("SELECT slots FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
    return int(json.loads(slots)[0][0])


def test_a_job_that_ends_while_its_restarted_agent_recovers_is_done_once(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """The agent is SIGKILLed and started again a second before its job ends: the executor lives on
    and subscribes again while the agent still recovers, which answers its TASK_FINISHED with 503.
    That end was lost and the job stayed running for good, past its walltime (a crash audit, 3 of 3).
    The executor sends it again until the agent takes it: the job is done, once."""
    daemon = mesos_daemon(cluster, tmp_path, "cosched-agent-recovers")
    try:
        fid = framework_id_of(daemon)
        job = daemon.submit(image=image, command=["sleep", "3"], cores=1, memory_mib=64, walltime=30)
        daemon.wait_running(job, 60)
        time.sleep(2.0)
        cluster.crash_and_restart_agent(_on_node(daemon, job) + 1)
        status = daemon.wait_final([job], 60)[job]
        assert (status["state"], status["exit_code"]) == ("done", 0), status
        assert [c.exit_code for c in container_events.containers(fid)[job]] == [0]
    finally:
        finish(cluster, daemon)


def _executor_of(daemon: Any, cluster: Cluster, engine: Any, fid: str, job: int) -> tuple[dict[int, str], Any]:
    """The processes of a running 1-core job's executor, and its container."""
    executors = executor_pids(fid, cluster.agent_id(f"agent{_on_node(daemon, job) + 1}"))
    [executor] = set(executors.values())
    [container] = engine.containers.list(filters={"label": f"cosched.executor={executor}"})
    return executors, container


def test_a_killed_executors_jobs_are_swept_then_run_again(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """SIGKILL of the executor leaves its container running (Docker runs it, not the executor): the run
    counts as lost only once a new executor on that agent removed it, then the job runs again."""
    engine = require_engine()
    daemon = mesos_daemon(cluster, tmp_path, "cosched-executor-kill")
    try:
        fid = framework_id_of(daemon)
        job = daemon.submit(image=image, command=["sleep", "8"], cores=1, memory_mib=64, walltime=120)
        daemon.wait_running(job, 60)
        executors, left = _executor_of(daemon, cluster, engine, fid, job)
        for pid in executors:
            os.kill(pid, signal.SIGKILL)
        status = wait_until(lambda: (j := daemon.job(job))["reason"] and j, 60, "the job requeued")
        assert status["reason"].startswith("requeued: "), status
        assert engine.containers.list(all=True, filters={"id": left.id}) == []  # swept before the requeue
        assert daemon.wait_final([job], 90)[job]["state"] == "done"
        ran = container_events.containers(fid)[job]
        assert_ran_once(ran)
        assert [c.exit_code for c in ran] == [137, 0]  # the left container removed, then the run that finished
    finally:
        finish(cluster, daemon)


def test_a_job_that_finished_while_its_executor_was_dead_is_done_and_not_run_again(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """The executor is stopped (SIGSTOP) while its job runs, the job finishes (exit 0), and the
    executor is SIGKILLed before it collected the container: the run counted as lost and the job ran
    again (a crash audit). The sweep finds the container ended on its own: the job is done, with its
    output, and ran once."""
    engine = require_engine()
    daemon = mesos_daemon(cluster, tmp_path, "cosched-executor-dead-end")
    try:
        fid = framework_id_of(daemon)
        command = ["sh", "-c", "sleep 2; echo its own end"]
        job = daemon.submit(image=image, command=command, cores=1, memory_mib=64, walltime=120)
        daemon.wait_running(job, 60)
        executors, left = _executor_of(daemon, cluster, engine, fid, job)
        for pid in executors:
            os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: engine.api.inspect_container(left.id)["State"]["Status"] == "exited", 30, "the job's end")
        for pid in executors:
            os.kill(pid, signal.SIGKILL)
        status = daemon.wait_final([job], 90)[job]
        assert (status["state"], status["exit_code"]) == ("done", 0), status
        assert "its own end" in status["log_tail"]
        assert engine.containers.list(all=True, filters={"id": left.id}) == []  # the sweep removed it
        assert [c.exit_code for c in container_events.containers(fid)[job]] == [0]  # one run
    finally:
        finish(cluster, daemon)


def test_a_job_that_fails_while_the_daemon_is_long_gone_keeps_its_exit_code_and_output(
    cluster: Cluster, image: str, tmp_path: Path
) -> None:
    """The agent sends a task's end again until it is acknowledged, on a backoff of its own (10 s,
    doubling): after a long outage its next try may be minutes away. The master's reconciliation
    tells only the end's state, with no exit code or output, and a restarted daemon waits 15 s
    (`RECONCILED_GRACE`) for the agent's update before it records the end by its state alone (exit
    code -1). Here the daemon is gone 40 s, the agent's next try due at about 75 s: the end comes
    at once, with the job's exit code and its output (the agent sends what it holds again when the
    framework subscribes anew)."""
    daemon = mesos_daemon(cluster, tmp_path, "cosched-long-outage")
    try:
        command = ["sh", "-c", "sleep 4; echo its own words; exit 3"]
        job = daemon.submit(image=image, command=command, cores=1, memory_mib=64, walltime=120)
        daemon.wait_running(job, 60)
        daemon.signal(signal.SIGKILL)
        time.sleep(40)  # its end at 4 s, sent again at about 14 and 34 s, then at 74 s
        daemon.start(timeout=60)
        status = daemon.wait_final([job], 60)[job]
        assert (status["state"], status["exit_code"]) == ("failed", 3), status
        assert "its own words" in status["log_tail"]
    finally:
        finish(cluster, daemon)


def _hog(cluster: Cluster, name: str, leave_cpus: float = 0.0, leave_mem: float = 0.0) -> tuple[Any, str]:
    """Another framework takes agent2 with a task of its own: a cluster shared. The task holds all of
    agent2's CPUs but `leave_cpus`, and 64 MiB, or with `leave_mem` all its memory but that (64 MiB at least)."""
    recorder = Recorder()
    client = cluster.client(recorder, name).start()
    assert client.wait_subscribed(15), client.failure
    offer = recorder.wait(lambda: recorder.offers_from("agent2"), 30, "an offer of agent2")[-1]
    offered = {r["name"]: r["scalar"]["value"] for r in offer["resources"] if r["name"] in ("cpus", "mem")}
    cpus = offered["cpus"] - leave_cpus
    mem = max(offered["mem"] - leave_mem, 64) if leave_mem else 64
    task = command_task("hog", offer["agent_id"]["value"], "sleep 600", cpus=cpus, mem=mem)
    client.accept([offer["id"]["value"]], [calls.launch([task])], refuse_seconds=600)
    recorder.wait(lambda: "TASK_RUNNING" in recorder.states("hog"), 30, "the hog running")
    client.suppress()
    return client, offer["agent_id"]["value"]


def _offer_counts(cluster: Cluster, name: str, fid: str) -> dict[str, float]:
    return {k: cluster.metric(name, fid, f"offers/{k}") for k in ("sent", "accepted", "declined", "rescinded")}


def test_unused_offers_are_declined_and_a_gang_starts_whole_or_not_at_all(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """On a cluster shared with another framework: with nothing queued every offer is declined
    within the hold timeout and offers are suppressed (counted by the master); a 2-core gang
    (one task per agent) whose agent2 another framework took while cosched was suppressed (the
    core's view of agent2 is stale: the race the offers cannot prevent) holds agent1's offer only
    until the hold timeout, never starts half, and after its launch timeout waits in the queue
    with node 1 out of the core; once agent2 is free it starts whole and finishes once."""
    name = "cosched-declines"
    daemon = mesos_daemon(cluster, tmp_path, name, mesos="hold_timeout = 1.0\nlaunch_timeout = 8.0")
    hog = None
    try:
        fid = framework_id_of(daemon)
        counts = wait_until(
            lambda: (c := _offer_counts(cluster, name, fid))["sent"] > 0 and c["declined"] == c["sent"] and c,
            30,  # a deadline for a loaded machine; no offer was held past 3 s: none was rescinded
            "every offer declined (none held until the master rescinds it: 3 s)",
        )
        assert counts["accepted"] == counts["rescinded"] == 0
        wait_until(lambda: cluster.metric(name, fid, "calls/suppress") >= 1, 30, "a SUPPRESS")
        hog, agent2 = _hog(cluster, "hog-decline")  # after cosched's last offer of agent2: unseen

        gang = daemon.submit(image=image, command=["sleep", "2"], cores=2, span=True, memory_mib=128, walltime=60)
        row = wait_until(lambda: _row(daemon, gang, "launching"), 20, "the gang waiting for offers")
        assert row["reason"] == "waiting for offers of agent1, agent2"
        # Held past the hold timeout, agent1's offer goes back (a short filter); nothing starts.
        wait_until(
            lambda: _offer_counts(cluster, name, fid)["declined"] > counts["declined"], 10, "a held offer declined"
        )
        assert _framework_tasks(cluster, fid) == []
        row = wait_until(lambda: _row(daemon, gang, "pending"), 30, "the gang back in the queue")
        assert not _node(daemon, 1)["up"] and daemon.job(gang)["reason"].startswith(
            "requeued: could not start: no offer"
        )
        assert _framework_tasks(cluster, fid) == []  # never half-started

        hog.kill("hog", agent2)
        assert daemon.wait_final([gang], 60)[gang]["state"] == "done"
        assert _node(daemon, 1)["up"]
        tasks = _framework_tasks(cluster, fid)
        assert sorted(t["name"] for t in tasks) == [f"cosched job {gang} part 1/2", f"cosched job {gang} part 2/2"]
        assert {t["state"] for t in tasks} == {"TASK_FINISHED"} and len({t["slave_id"] for t in tasks}) == 2
        assert_ran_once(container_events.containers(fid)[gang])
        assert cluster.metric(name, fid, "calls/revive") >= 1
        wait_until(lambda: cluster.metric(name, fid, "calls/suppress") >= 2, 10, "a SUPPRESS once the queue is empty")
    finally:
        if hog is not None:
            hog.teardown()
        finish(cluster, daemon)


def test_an_agent_another_framework_partly_holds_is_never_tried_for_a_job_it_has_no_room_for(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """Another framework leaves agent2 a CPU (a core's task needs 1.05 with its executor) and 100 MiB.
    From agent2's offers the core holds back node 1's core and all but 36 MiB of its memory: a job
    waits in the queue while node 0 is busy and is never tried on agent2 (the old rule tried it,
    waited out the launch timeout and took node 1 out of the core). Node 1 stays up throughout.
    Once the other framework is gone, node 1 has its core back and the job runs there, once."""
    hog, agent2 = _hog(cluster, "hog-partial", leave_cpus=1.0, leave_mem=100.0)
    daemon = mesos_daemon(cluster, tmp_path, "cosched-partial", mesos="hold_timeout = 1.0\nlaunch_timeout = 4.0")
    try:
        fid = framework_id_of(daemon)
        wait_until(lambda: "node 1: other frameworks hold 1 core, 732 MiB" in daemon.log.read_text(), 30, "held back")
        blocker = daemon.submit(image=image, command=["sleep", "600"], cores=1, memory_mib=128, walltime=900)
        daemon.wait_running(blocker, 60)
        assert [j["id"] for j in _node(daemon, 0)["jobs"]] == [blocker]
        job = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=128, walltime=60)
        time.sleep(10)  # more than two launch timeouts
        assert daemon.job(job)["state"] == "pending" and not daemon.job(job)["reason"]
        assert _node(daemon, 1)["up"], nodes_shown(daemon)
        assert f"cosched job {job}" not in {t["name"] for t in _framework_tasks(cluster, fid)}
        _never_down(daemon)

        hog.kill("hog", agent2)
        assert daemon.wait_final([job], 60)[job]["state"] == "done"
        assert _node(daemon, 1)["up"] and "node 1: other frameworks hold nothing" in daemon.log.read_text()
        _ran_on(cluster, fid, job, agent2)
        assert_ran_once(container_events.containers(fid)[job])
        _never_down(daemon)
    finally:
        hog.teardown()
        finish(cluster, daemon)


def test_a_job_that_fits_what_another_framework_leaves_runs_there_at_once(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """Another framework holds agent2 but 1.5 CPUs and 300 MiB: the core holds back 532 of node 1's
    768 MiB (a task's executor takes 64). With node 0 busy, a 512 MiB job waits in the queue, never
    tried on agent2; a 128 MiB job, backfilled, runs on agent2 at once (no launch timeout, node 1
    never out of the core). Once the other framework is gone, node 1 has its memory back and the
    512 MiB job runs there. Each ran once."""
    hog, agent2 = _hog(cluster, "hog-shared", leave_cpus=1.5, leave_mem=300.0)
    daemon = mesos_daemon(cluster, tmp_path, "cosched-shared", mesos="hold_timeout = 1.0\nlaunch_timeout = 10.0")
    try:
        fid = framework_id_of(daemon)
        wait_until(lambda: "node 1: other frameworks hold 532 MiB" in daemon.log.read_text(), 30, "memory held back")
        assert (_node(daemon, 1)["others"], _node(daemon, 0)["others"]) == ("532 MiB", "")  # `cosched nodes` shows it
        blocker = daemon.submit(image=image, command=["sleep", "600"], cores=1, memory_mib=64, walltime=900)
        daemon.wait_running(blocker, 60)
        assert _on_node(daemon, blocker) == 0
        large = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=512, walltime=60)
        wait_until(lambda: _row(daemon, large, "pending"), 10, "the large job queued")
        submitted = time.monotonic()
        small = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=128, walltime=60)
        daemon.wait_running(small, 30)
        assert time.monotonic() - submitted < 10.0, "the small job waited out a launch timeout"
        assert daemon.wait_final([small], 30)[small]["state"] == "done" and _on_node(daemon, small) == 1
        _ran_on(cluster, fid, small, agent2)
        time.sleep(3)  # the large job is still not tried on agent2
        assert daemon.job(large)["state"] == "pending" and not daemon.job(large)["reason"]
        assert f"cosched job {large}" not in {t["name"] for t in _framework_tasks(cluster, fid)}
        _never_down(daemon)

        hog.kill("hog", agent2)
        assert daemon.wait_final([large], 60)[large]["state"] == "done" and _on_node(daemon, large) == 1
        assert "node 1: other frameworks hold nothing" in daemon.log.read_text()
        assert _node(daemon, 1)["others"] == ""
        _ran_on(cluster, fid, large, agent2)
        ran_all = container_events.containers(fid)
        for job_id in (small, large):
            assert_ran_once(ran_all[job_id])
        _never_down(daemon)
        daemon.client.call("DELETE", f"/v1/jobs/{blocker}")
    finally:
        hog.teardown()
        finish(cluster, daemon)


def _never_down(daemon: Any) -> None:
    """No launch waited out its launch timeout for want of room, and no node left the core for it."""
    log = daemon.log.read_text()
    assert " with room in " not in log, log[-3000:]


def _ran_on(cluster: Cluster, fid: str, job_id: int, agent: str) -> None:
    """The job's tasks all went to `agent` and its last one finished. (Normally one task: under load,
    an agent that missed the 1 s pings re-registers, and the master may report a task it was just
    sent as lost, "Reconciliation: task unknown to the agent": the job is then requeued, not failed.)"""
    tasks = [t for t in _framework_tasks(cluster, fid) if t["name"] == f"cosched job {job_id}"]
    assert tasks and {t["slave_id"] for t in tasks} == {agent}, tasks
    assert "TASK_FINISHED" in {t["state"] for t in tasks}, tasks


def test_offers_the_master_rescinds_are_dropped(cluster: Cluster, image: str, tmp_path: Path) -> None:
    """The master rescinds an offer held past its offer timeout (3 s here, the hold timeout 60 s):
    the daemon forgets it, and its launch starts on the offers that come next. (Agent2 is taken
    after cosched's offers of it stopped, so the core places the gang on it: a launch that waits.)"""
    name = "cosched-rescinds"
    daemon = mesos_daemon(cluster, tmp_path, name, mesos="hold_timeout = 60.0\nlaunch_timeout = 30.0")
    hog = None
    try:
        fid = framework_id_of(daemon)
        wait_until(lambda: cluster.metric(name, fid, "calls/suppress") >= 1, 30, "a SUPPRESS")
        hog, agent2 = _hog(cluster, "hog-rescind")
        gang = daemon.submit(image=image, command=["sleep", "1"], cores=2, span=True, memory_mib=128, walltime=60)
        wait_until(lambda: _offer_counts(cluster, name, fid)["rescinded"] >= 1, 20, "a held offer rescinded")
        hog.kill("hog", agent2)
        assert daemon.wait_final([gang], 60)[gang]["state"] == "done"
        assert daemon.job(gang)["reason"] == ""  # it never had to be requeued
    finally:
        if hog is not None:
            hog.teardown()
        finish(cluster, daemon)


def _row(daemon: Any, job_id: int, state: str) -> dict[str, Any] | None:
    return next((r for r in daemon.client.call("GET", "/v1/queue") if r["id"] == job_id and r["state"] == state), None)


def test_sigkill_of_the_daemon_at_random_moments_kills_no_task_and_runs_each_job_once(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """The daemon is SIGKILLed at 6 random moments while jobs (1-core ones and 2-core gangs over
    both agents) are submitted, launched and finished; each restart subscribes as the same
    framework, reconciles and adopts what runs. No task that started is ever killed or lost (a
    gang's part held when the daemon died between its two ACCEPTs is killed unstarted), and each
    job ran once (one run, every part exiting 0)."""
    rng = random.Random(2027)
    name = "cosched-sigkill"
    daemon = mesos_daemon(cluster, tmp_path, name)
    fid = framework_id_of(daemon)
    accepted: list[int] = []
    try:
        for trial in range(6):
            if trial:
                daemon.start(timeout=60)
                assert framework_id_of(daemon) == fid
            for _ in range(rng.randint(1, 3)):
                seconds = rng.choice(["0.5", "1", "2"])
                cores = rng.choice([1, 1, 2])
                accepted.append(
                    daemon.submit(
                        image=image, command=["sleep", seconds], cores=cores, span=True, memory_mib=64, walltime=60
                    )
                )
            time.sleep(rng.uniform(0.05, 3.0))
            daemon.signal(signal.SIGKILL)
        daemon.start(timeout=60)
        jobs = daemon.wait_final(accepted, 180)
        assert {j["state"] for j in jobs.values()} == {"done"}, {i: (j["state"], j["reason"]) for i, j in jobs.items()}
        tasks = _framework_tasks(cluster, fid)
        ran = container_events.containers(fid)
        started = {container.task for containers in ran.values() for container in containers}
        ended = {(t["state"], t["id"] in started) for t in tasks}
        assert ended <= {("TASK_FINISHED", True), ("TASK_KILLED", False)}, sorted(ended)
        assert [f["id"] for f in cluster.state()["frameworks"] if f["name"] == name] == [fid]
        for job_id in accepted:
            try:
                assert_ran_once(ran[job_id])
                assert len({c.run for c in ran[job_id]}) == 1, ran[job_id]  # never requeued: nothing was lost
            except AssertionError as exc:  # once in CI (c5adcd6) a job ran twice: the log is the evidence
                raise AssertionError(
                    f"{exc}\nthe daemon's lines of job {job_id}:\n{_lines_of(daemon, job_id)}"
                ) from None
    finally:
        finish(cluster, daemon)


def _lines_of(daemon: Any, job_id: int) -> str:
    """The daemon's log lines (every start's, appended) that name a job or its tasks, and its restarts."""
    marks = (
        f"job={job_id} ",
        f"job {job_id} ",
        f"job {job_id}:",
        f"cosched-job-{job_id}-",
        "recovered:",
        "cosched daemon ",
    )
    return "\n".join(line for line in daemon.log.read_text().splitlines() if any(m in line for m in marks))[-6000:]


def test_a_master_restart_under_the_daemon(
    zk_cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """The master restarts (ZooKeeper, replicated-log registry) under a running job: the daemon,
    which knows only the ZooKeeper group (`masters = "zk://..."`), loses the master, asks ZooKeeper
    again, re-subscribes as the same framework and reconciles; the job runs on, finishes once, and
    a job submitted meanwhile starts on the new master's offers."""
    name = "cosched-master-restart"
    daemon = mesos_daemon(zk_cluster, tmp_path, name, masters=zk_cluster.zookeeper)
    try:
        fid = framework_id_of(daemon)
        running = daemon.submit(image=image, command=["sleep", "15"], cores=1, memory_mib=64, walltime=120)
        daemon.wait_running(running, 60)
        zk_cluster.restart_master()
        later = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=64, walltime=120)
        jobs = daemon.wait_final([running, later], 120)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        assert [f["id"] for f in zk_cluster.state()["frameworks"] if f["name"] == name] == [fid]
        ran = container_events.containers(fid)
        for job_id in (running, later):
            assert_ran_once(ran[job_id])
            assert len(ran[job_id]) == 1
        log = daemon.log.read_text()
        assert "re-subscribing" in log
        named = f"ZooKeeper {zk_cluster.zookeeper} names 1 master(s), the leader http://{zk_cluster.master}"
        assert log.count(named) >= 2, log[-3000:]  # at the start, and again after the restart
    finally:
        finish(zk_cluster, daemon)


def test_a_silent_master_under_the_daemon(
    cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """The master is stopped (SIGSTOP): the daemon's event stream stays open but silent, no heartbeat
    comes. The client's watchdog (1.5 heartbeat intervals here) drops it, and its SUBSCRIBE calls go
    unanswered while the master is stopped; once it continues (SIGCONT) the daemon subscribes as the
    same framework and reconciles. The job that was running runs on and ends once; a job submitted
    while the master was silent starts afterwards, and runs once."""
    name = "cosched-silent-master"
    word = make_data_dir(tmp_path / "word")
    daemon = mesos_daemon(cluster, tmp_path, name, mesos="watchdog_heartbeats = 1.5", data_roots=True)
    try:
        fid = framework_id_of(daemon)
        log = daemon.log
        running = daemon.submit(
            image=image,
            command=["sh", "-c", f"until [ -e {word}/go ]; do sleep 0.2; done"],
            data_dirs=[str(word)],
            cores=1,
            memory_mib=64,
            walltime=300,
        )
        daemon.wait_running(running, 60)
        reconciles = cluster.metric(name, fid, "calls/reconcile")
        assert "(heartbeat 15.0 s)" in log.read_text()  # the master's interval: 1.5 of them is 22.5 s
        with cluster.master_stopped():
            wait_until(lambda: "s (watchdog); re-subscribing" in log.read_text(), 40, "the watchdog to fire")
            later = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=64, walltime=120)
            wait_until(
                lambda: "SUBSCRIBE failed" in log.read_text(), 20, "a SUBSCRIBE the stopped master leaves unanswered"
            )
        wait_until(lambda: cluster.metric(name, fid, "calls/reconcile") > reconciles, 40, "a reconciliation")
        assert [f["id"] for f in cluster.state()["frameworks"] if f["name"] == name] == [fid]
        [task] = [t for t in _framework_tasks(cluster, fid) if t["name"] == f"cosched job {running}"]
        assert (daemon.job(running)["state"], task["state"]) == ("running", "TASK_RUNNING")
        (word / "go").touch()
        jobs = daemon.wait_final([running, later], 90)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        assert daemon.job(later)["reason"] == ""
        # It started on the offers that came after. Its task may have reached agent2 while agent2 was
        # re-registering with the master (their pings stopped too): then the master says the task is
        # unknown to the agent (TASK_LOST), it never ran, and the job is launched again (seen once).
        tasks = _framework_tasks(cluster, fid)
        lost = [t for t in tasks if t["state"] == "TASK_LOST"]
        assert [t["state"] for t in tasks if t not in lost] == ["TASK_FINISHED"] * 2
        assert len(lost) <= 1 and all(t["name"] == f"cosched job {later}" for t in lost), tasks
        ran = container_events.containers(fid)
        for job_id in (running, later):
            assert_ran_once(ran[job_id])
            assert len(ran[job_id]) == 1
    finally:
        finish(cluster, daemon)


def _fail_over_and_restart(cluster: Cluster, daemon: Any, timeout: float) -> None:
    """The master restarts (a failover: ZooKeeper elects it again, its registry recovered), and the
    daemon is SIGKILLed and started again, while an agent is stopped and has not re-registered."""
    cluster.restart_master()
    daemon.signal(signal.SIGKILL)
    daemon.start(timeout=timeout)


def test_a_daemon_killed_mid_launch_before_the_agent_rejoins_a_new_master_runs_the_job_once(
    zk_cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """The job's task is on its way to agent2, which is stopped (its launch waits, the job
    `launching`), when the master fails over and the daemon is SIGKILLed and started again before
    agent2 re-registers: the new master knows nothing of that task. Recovery queued the job as never
    launched, and agent2, once back, could run the task too. Now the launch is asked for by name
    (its handle is the job's and run's alone): the job is held running until agent2 is back, and it
    runs once, and ends done."""
    name = "cosched-failover-launch"
    daemon = mesos_daemon(zk_cluster, tmp_path, name, masters=zk_cluster.zookeeper, fence=600.0)
    try:
        fid = framework_id_of(daemon)
        holder = daemon.submit(image=image, command=["sleep", "40"], cores=1, memory_mib=64, walltime=300)
        daemon.wait_running(holder, 60)
        with zk_cluster.agent_stopped(2):
            job = daemon.submit(image=image, command=["sleep", "3"], cores=1, memory_mib=64, walltime=300)
            task = f"cosched-job-{job}-r1-0of1-1c"  # the master sends it on to agent2, which cannot answer
            wait_until(
                lambda: task in {t["id"] for t in (zk_cluster.framework(fid) or {"tasks": []})["tasks"]},
                60,
                "the task sent",
            )
            assert daemon.job(job)["state"] == "launching"
            _fail_over_and_restart(zk_cluster, daemon, 90)
            assert daemon.job(job)["state"] == "running"
        jobs = daemon.wait_final([holder, job], 180)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        assert_ran_once(container_events.containers(fid)[job])
    finally:
        finish(zk_cluster, daemon)


def test_a_daemon_restarted_before_an_agent_rejoins_a_new_master_keeps_its_job(
    zk_cluster: Cluster, image: str, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """The master fails over (ZooKeeper, replicated-log registry) while agent2 is stopped, and the
    daemon is SIGKILLed and started before agent2 re-registers: the new master answers for none of
    its tasks. Recovery recorded the job there failed ("container lost while the daemon was down")
    while it ran on, unknown to the daemon, its core free for the next job. Now the run the state
    file records is expected: adopted, asked for by name until agent2 is back, and it ends done,
    once. The fence is long: the executor must not stop the job while its agent is stopped."""
    name = "cosched-failover-restart"
    daemon = mesos_daemon(zk_cluster, tmp_path, name, masters=zk_cluster.zookeeper, fence=600.0)
    try:
        fid = framework_id_of(daemon)
        holder = daemon.submit(image=image, command=["sleep", "3"], cores=1, memory_mib=64, walltime=120)
        job = daemon.submit(image=image, command=["sleep", "45"], cores=1, memory_mib=64, walltime=300)
        daemon.wait_running(job, 60)
        with daemon.db() as db:
            assert json.loads(db.execute("SELECT slots FROM jobs WHERE id = ?", (job,)).fetchone()[0]) == [[1, 1]]
        with zk_cluster.agent_stopped(2):
            _fail_over_and_restart(zk_cluster, daemon, 60)
            assert daemon.job(job)["state"] == "running"
        jobs = daemon.wait_final([holder, job], 120)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        assert_ran_once(container_events.containers(fid)[job])
        assert re.findall(r"recovered: \d+ adopted, \d+ queued, (\d+) lost", daemon.log.read_text())[-1] == "0"
    finally:
        finish(zk_cluster, daemon)

"""The daemon's Mesos backend on a REAL master with two agents and the real Docker engine.

The backend is driven as the daemon drives its Docker backend: launch on a node, list,
change a quota, sample, kill, collect the end; then a second backend with the same
FrameworkID finds the running job again, as a restarted daemon would.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import require_engine
from mesos_support import (
    Cluster,
    ContainerEvents,
    assert_ran_once,
    containers_left,
    start_cluster,
    stop_cluster,
    wait_until,
)

from cosched.daemon.cgroups import CgroupFiles
from cosched.daemon.docker_backend import ContainerInfo, RunLost
from cosched.mesos.backend import MesosBackend, MesosSettings
from cosched.mesos.errors import MesosError
from cosched.mesos.executor import instance_of
from workloads.images import busybox_image

EXECUTOR = f"{shlex.quote(sys.executable)} -m cosched.mesos.executor"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(Path(tmp_path_factory.mktemp("mesos-backend")), cpus=2, mem=2048)
    try:
        yield started
    finally:
        stop_cluster(started)


def _backend(cluster: Cluster, **kwargs: object) -> MesosBackend:
    settings = MesosSettings(masters=cluster.master, name="cosched-backend-test", executor_command=EXECUTOR)
    backend = MesosBackend(settings, nodes=2, **kwargs)  # type: ignore[arg-type]
    backend.connect()
    return backend


def _quota(engine: object, container_id: str) -> tuple[int, int]:
    pid = engine.api.inspect_container(container_id)["State"]["Pid"]  # type: ignore[attr-defined]
    files = CgroupFiles.of_pid(pid)
    assert files is not None
    return files.quota()


def _container(engine: object, framework_id: str, job_id: int) -> str:
    labels = {"label": [f"cosched.instance={instance_of(framework_id)}", f"cosched.job={job_id}"]}
    found = wait_until(lambda: engine.containers.list(filters=labels), 30, f"job {job_id}'s container")  # type: ignore[attr-defined]
    return str(found[0].id)


def test_jobs_run_lend_report_and_survive_a_restarted_backend(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    engine = require_engine()
    image = busybox_image(engine)
    ids: list[str] = []
    backend = _backend(cluster, on_framework_id=ids.append)
    fid = backend.framework_id or ""
    try:
        assert ids == [fid]
        assert [backend.hostnames[a] for a in backend.agents] == ["agent1", "agent2"]
        spec = {"image": image, "cores": 1, "command": ["sh", "-c", 'echo 1/4 > "$COSCHED_PROGRESS"; sleep 120']}
        host, started = backend.launch(1, spec, [], 1.0, 128, slots=((0, 1),))
        assert host.startswith("cosched-job-1-") and started > 0
        guest, _ = backend.launch(2, {**spec, "command": ["sleep", "120"]}, [], 0.4, 128, slots=((0, 1),), guest=True)
        failing = {"image": image, "cores": 1, "command": ["sh", "-c", "echo boom; exit 3"]}
        failed, _ = backend.launch(3, failing, [], 1.0, 128, slots=((1, 1),))

        # The host lends 0.4 CPUs: both cgroups, read here, show the quotas the backend reports.
        backend.set_quota(host, 0.6)
        assert backend.verify_quota(host, 0.6) and backend.verify_quota(guest, 0.4)
        assert _quota(engine, _container(engine, fid, 1)) == (60_000, 100_000)
        assert _quota(engine, _container(engine, fid, 2)) == (40_000, 100_000)

        wait_until(lambda: backend.containers()[3].state == "exited", 30, "the failing job's end")
        end = backend.exit_of(failed)
        assert end.code == 3 and "boom" in backend.logs(failed)
        backend.remove(failed)
        assert 3 not in backend.containers()

        sample = wait_until(lambda: backend.sample(host, 0.6, time.time()), 30, "a usage sample")
        assert (sample.done, sample.total) == (1, 4)

        backend.kill(guest)
        wait_until(lambda: backend.containers()[2].state == "exited", 30, "the guest killed")
        assert backend.exit_of(guest).code == 137
    finally:
        backend.close()

    # A restarted daemon: same FrameworkID, the running job comes back by reconciliation.
    again = _backend(cluster, framework_id=fid)
    try:
        assert again.framework_id == fid
        assert "did not finish reconciling" not in caplog.text  # the real master answered the end marker
        assert again.containers()[1] == ContainerInfo(host, 1, "running", run=0)
        assert [f["id"] for f in cluster.state()["frameworks"] if f["name"] == "cosched-backend-test"] == [fid]
        again.kill(host)
        wait_until(lambda: again.containers()[1].state == "exited", 30, "the host killed")
    finally:
        if again.client.subscribed:
            again.client.teardown()
        again.close()
    ours = {"label": f"cosched.instance={instance_of(fid)}"}
    wait_until(lambda: not containers_left(engine, ours), 30, "no container left")


class _SecondAccept:
    """The backend's ACCEPTs, the second of which is held until the first part's executor has
    reported (so that a part not held would have started), then fails, at once or once `release`d,
    as if the daemon died between the two: a gang's parts go one agent at a time."""

    def __init__(self, backend: MesosBackend, hangs: bool) -> None:
        self.backend, self.hangs, self.calls = backend, hangs, 0
        self.accept = backend.client.accept
        self.reported, self.release = threading.Event(), threading.Event()
        backend.client.accept = self  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls != 2:
            self.accept(*args, **kwargs)
            return
        runs = self.backend.runs
        wait_until(
            lambda: any(t.state != "TASK_STAGING" for r in runs.values() for t in r.tasks.values()), 30, "a part"
        )
        self.reported.set()
        if self.hangs:
            self.release.wait(120)
        raise MesosError("injected: the second ACCEPT never reached the master")


def _launch_gang(backend: MesosBackend, job: int, spec: dict[str, Any]) -> None:
    """Launch `job` over both nodes in a thread of its own, which the backend's death leaves to give up."""

    def launch() -> None:
        with contextlib.suppress(RunLost):
            backend.launch(job, spec, [], 2.0, 128, slots=((0, 1), (1, 1)))

    threading.Thread(target=launch, daemon=True).start()


def _dies(backend: MesosBackend) -> None:
    """The backend gone as a SIGKILLed daemon's: no TEARDOWN, and no KILL from its launch giving up."""
    backend.client.kill = lambda *args, **kwargs: None  # type: ignore[method-assign]
    backend.close()


def _killed(cluster: Cluster, framework_id: str) -> bool:
    """Whether the master holds a task of the framework killed (acknowledged, so completed, or not)."""
    framework = cluster.framework(framework_id) or {}
    return any(t["state"] == "TASK_KILLED" for t in framework.get("tasks", []) + framework.get("completed_tasks", []))


@pytest.mark.parametrize("fault", ["second ACCEPT fails", "daemon dies between ACCEPTs"])
def test_no_part_of_a_gang_runs_before_every_part_is_placed(cluster: Cluster, fault: str) -> None:
    """Each part waits, made and not started, until the framework says `go`: a gang whose second
    ACCEPT failed ran its first part alone, and after a daemon SIGKILLed between the two a short
    part had finished when the restarted daemon queued the job again (a crash audit). Now the first
    fault kills the held part; after the second, the restarted backend finds the run `created`
    (never started), which recovery removes and queues again. No container of the job ever starts."""
    engine = require_engine()
    image = busybox_image(engine)
    events = ContainerEvents(engine)
    backend = _backend(cluster)
    fid = backend.framework_id or ""
    second = _SecondAccept(backend, hangs=fault != "second ACCEPT fails")
    spec = {"image": image, "cores": 2, "command": ["echo", "a part alone"]}
    job = 11 if second.hangs else 12
    try:
        if not second.hangs:
            with pytest.raises(RunLost, match="injected"):
                backend.launch(job, spec, [], 2.0, 128, slots=((0, 1), (1, 1)))
            wait_until(lambda: _killed(cluster, fid), 30, "the held part killed")
        else:
            _launch_gang(backend, job, spec)
            assert second.reported.wait(60)
            assert "TASK_STARTING" in cluster.task_states(fid)  # made and held
            _dies(backend)
            again = _backend(cluster, framework_id=fid)
            try:
                info = again.containers()[job]
                assert info.state == "created"  # recovery removes it and queues the job: it never ran
                again.remove(info.id)
                wait_until(lambda: _killed(cluster, fid), 30, "the held part killed")
            finally:
                again.client.teardown()
                again.close()
        ours = {"label": f"cosched.instance={instance_of(fid)}"}
        wait_until(lambda: not containers_left(engine, ours), 30, "the held part's container removed")
        assert job not in events.containers(fid)  # made, never started
    finally:
        second.release.set()
        events.close()
        if backend.client.subscribed:
            backend.client.teardown()
        backend.close()


def test_a_restarted_daemon_starts_a_gang_whose_parts_were_all_held(cluster: Cluster) -> None:
    """The daemon died once every part of a gang was held, before it said `go`: the restarted one
    adopts the run (every part is there) and tells its parts to start; the job runs once, whole."""
    engine = require_engine()
    image = busybox_image(engine)
    events = ContainerEvents(engine)
    backend = _backend(cluster)
    fid = backend.framework_id or ""
    backend._go = lambda task_id, agent: None  # type: ignore[method-assign]  # it dies before it says it
    spec = {"image": image, "cores": 2, "command": ["sleep", "1"]}
    _launch_gang(backend, 13, spec)
    try:
        wait_until(lambda: cluster.task_states(fid).count("TASK_STARTING") == 2, 30, "both parts held")
        _dies(backend)
        again = _backend(cluster, framework_id=fid)
        try:
            info = again.containers()[13]
            assert info.state == "running"
            again.adopt(info.id)
            wait_until(lambda: again.containers()[13].state == "exited", 30, "the gang told to start, and its end")
            assert again.exit_of(info.id).code == 0
            again.remove(info.id)
        finally:
            again.client.teardown()
            again.close()
        assert_ran_once(events.containers(fid)[13])
    finally:
        events.close()
        backend.close()

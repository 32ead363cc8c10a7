"""The daemon's Mesos backend on a REAL master with two agents and the real Docker engine.

The backend is driven as the daemon drives its Docker backend: launch on a node, list,
change a quota, sample, kill, collect the end; then a second backend with the same
FrameworkID finds the running job again, as a restarted daemon would.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import require_engine
from mesos_support import Cluster, containers_left, start_cluster, stop_cluster, wait_until

from cosched.daemon.cgroups import CgroupFiles
from cosched.daemon.docker_backend import ContainerInfo
from cosched.mesos.backend import MesosBackend, MesosSettings
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

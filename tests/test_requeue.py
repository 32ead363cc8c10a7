"""Requeueing a running job (`cosched requeue JOB`, Slurm's `scontrol requeue`): it is killed and
queued again, runs again in a container of its own, and a daemon SIGKILLed right after the ask
still does it; a job that is not running is refused. The job keeps its place in the queue."""

from __future__ import annotations

import signal
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from daemon_support import DaemonProcess, require_engine

from cosched.daemon.client import ApiError
from cosched.daemon.config import DockerSection
from cosched.daemon.docker_backend import DockerBackend, LaunchRefused
from workloads.images import busybox_image


def started_again(daemon: DaemonProcess, job_id: int, after: float, timeout: float = 30) -> dict[str, Any]:
    """The job's status once it runs in a run that began after `after`."""
    deadline = time.monotonic() + timeout
    while not ((job := daemon.job(job_id))["state"] == "running" and job["start"] > after):
        assert time.monotonic() < deadline, f"job {job_id} not running again after {timeout} s: {job}"
        time.sleep(0.1)
    return job


def test_a_requeued_job_runs_again_even_when_the_daemon_dies_after_the_ask(tmp_path: Path) -> None:
    """The kill comes at once, from a review run on the ask or at the restart, not at the next
    review (a minute here)."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=1, intervals={"review": 60})
    daemon.start()
    try:
        job_id = daemon.submit(image=image, command=["sleep", "600"], cores=1, walltime=900)
        first = daemon.wait_running(job_id)
        waiting = daemon.submit(image=image, command=["true"], cores=1, walltime=60)
        with pytest.raises(ApiError, match=f"job {waiting} is pending: only a running job can be requeued"):
            daemon.client.call("POST", f"/v1/jobs/{waiting}/requeue")

        said = daemon.cli("requeue", str(job_id))
        assert said == f"job {job_id}: requeue asked (killed, then queued)\n"
        second = started_again(daemon, job_id, first["start"])
        assert second["reason"] == "requeued: requeued by an operator"

        daemon.cli("requeue", str(job_id))
        # Killed just before or after the ask's review kills it: either way the ask is in the state
        # file, for the restart's first review, or for the end the restarted daemon collects.
        daemon.signal(signal.SIGKILL)
        daemon.start()
        started_again(daemon, job_id, second["start"])
        labels = [f"cosched.instance={daemon.instance()}", f"cosched.job={job_id}"]
        assert len(engine.containers.list(filters={"label": labels, "status": "running"})) == 1  # never twice at once
        assert daemon.job(waiting)["state"] == "pending"  # the requeued job keeps its place, ahead of it
        with urllib.request.urlopen(daemon.client.url + "/metrics", timeout=10) as answer:
            assert "cosched_jobs_requeued_total 1.0" in answer.read().decode()  # the run after the restart
    finally:
        daemon.cleanup(engine)


def test_a_launch_takes_its_own_runs_container_and_never_an_earlier_runs() -> None:
    """On the real engine, under one container name per job. A launch whose create the engine
    carried out but whose answer was lost is tried again: it takes that container (its run's). A
    requeued run's container, its end recorded but its removal cut short by a kill, is still there
    when the next run launches: the launch took it, an exited container, and nothing ran again."""
    engine = require_engine()
    image = busybox_image(engine)
    backend = DockerBackend(f"rq{uuid.uuid4().hex[:8]}", DockerSection())
    job: dict[str, Any] = {"image": image, "cores": 1}
    try:
        first, _ = backend.launch(7, {**job, "command": ["sh", "-c", "exit 3"]}, [0], 1.0, 64, run=1)
        again, _ = backend.launch(7, {**job, "command": ["sh", "-c", "exit 5"]}, [0], 1.0, 64, run=1)
        assert again == first
        engine.containers.get(first).wait(timeout=30)
        assert backend.exit_of(first).code == 3
        second, _ = backend.launch(7, {**job, "command": ["sh", "-c", "exit 0"]}, [0], 1.0, 64, run=2)
        assert second != first
        engine.containers.get(second).wait(timeout=30)
        assert backend.exit_of(second).code == 0
        assert backend.containers()[7].run == 2 and backend.containers()[7].id == second  # the first is gone
        # Another instance's container under that name (a Mesos framework id whose label is
        # another's prefix makes one) is neither taken nor removed.
        other = DockerBackend(f"rq{uuid.uuid4().hex[:8]}", DockerSection())
        with pytest.raises(LaunchRefused, match="is another's"):
            other.launch(7, {**job, "command": ["true"]}, [0], 1.0, 64, run=2, name=backend.name_of(7))
        assert backend.containers()[7].id == second
    finally:
        for info in backend.containers().values():
            backend.remove(info.id)

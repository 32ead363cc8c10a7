"""The daemon when its state file fails under it: a full disk, a deleted file.

Both on the real engine and a real SQLite file. The disk is a small tmpfs
holding the state directory, filled with a file and emptied again; the
deletion is `rm` of the state file while the daemon runs. Each test checks
that nothing accepted is lost, nothing runs twice and no job is shown running
without a container.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine

from cosched.daemon.client import ApiError
from workloads.images import busybox_image
from workloads.real import make_data_dir


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image(require_engine())


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """The daemon's state directory on an 8 MiB tmpfs of its own."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(state)], check=True)
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def running_without_container(daemon: DaemonProcess, client) -> list[int]:
    """Jobs the daemon calls running whose container the engine does not run."""
    labels = [f"cosched.instance={daemon.instance()}"]
    alive = {int(c.labels["cosched.job"]) for c in client.containers.list(filters={"label": labels})}
    with sqlite3.connect(daemon.state / "state.sqlite") as db:
        running = [row[0] for row in db.execute("SELECT id FROM jobs WHERE state = 'running'")]
    return [job_id for job_id in running if job_id not in alive]


def test_a_full_disk_stops_submissions_with_503_and_scheduling_resumes_when_it_has_room(
    tmp_path: Path, small_disk: Path, image: str
) -> None:
    client = require_engine()
    runs = make_data_dir(tmp_path / "runs")
    daemon = DaemonProcess(tmp_path, extra='[policies]\ncosched = "none"\n')
    daemon.start()
    filler = small_disk / "filler"
    try:
        count = f"echo $COSCHED_JOB_ID >> {runs}/starts"
        dirs = [str(runs)]
        first = daemon.submit(
            image=image, command=["sh", "-c", f"{count}; sleep 2"], cores=2, walltime=60, data_dirs=dirs
        )
        queued = daemon.submit(image=image, command=["sh", "-c", count], cores=1, walltime=60, data_dirs=dirs)
        time.sleep(0.5)
        with open(filler, "wb") as f:  # the disk fills while `queued` waits for `first`'s cores
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        with pytest.raises(ApiError, match=r"(full|cannot write).*HTTP 503"):
            for _ in range(200):  # the WAL may take some pages before the disk refuses
                daemon.submit(image=image, command=["true"], cores=1, walltime=60)
        time.sleep(3)  # `first` ends; the pass that would start `queued` cannot write
        health = daemon.client.call("GET", "/v1/health")
        assert "full" in health["state"] or "cannot write" in health["state"], health
        assert daemon.job(queued)["state"] == "pending"
        filler.unlink()
        jobs = daemon.wait_final([first, queued], 60)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        assert daemon.client.call("GET", "/v1/health")["state"] == "ok"
        assert running_without_container(daemon, client) == []
        starts = (runs / "starts").read_text().split()
        assert sorted(map(int, starts)) == [first, queued]  # each ran once
        assert daemon.submit(image=image, command=["true"], cores=1, walltime=60) > queued
    finally:
        daemon.cleanup(client)


def test_a_deleted_state_file_stops_submissions_and_a_restart_until_it_is_put_back(tmp_path: Path, image: str) -> None:
    client = require_engine()
    daemon = DaemonProcess(tmp_path)
    daemon.start()
    instance = daemon.instance()
    state = daemon.state / "state.sqlite"
    try:
        running = daemon.submit(image=image, command=["sleep", "6"], cores=1, walltime=60)
        daemon.wait_running(running)
        state.unlink()
        with pytest.raises(ApiError, match=r"was deleted while the daemon ran.*copied to.*HTTP 503"):
            daemon.submit(image=image, command=["true"], cores=1, walltime=60)
        health = daemon.client.call("GET", "/v1/health")
        assert "deleted" in health["state"]
        [rescued] = daemon.state.glob("state.sqlite.rescued-*")
        with sqlite3.connect(rescued) as db:
            assert db.execute("SELECT state FROM jobs WHERE id = ?", (running,)).fetchone() == ("running",)
        daemon.stop()

        with pytest.raises(AssertionError, match=r"is missing but .*rescued"):  # a restart refuses, in one line
            daemon.start(timeout=15)
        labels = [f"cosched.instance={instance}", f"cosched.job={running}"]
        assert [c.status for c in client.containers.list(all=True, filters={"label": labels})] == ["running"]

        shutil.move(rescued, state)  # what the message says to do
        for suffix in ("-wal", "-shm"):
            Path(f"{state}{suffix}").unlink(missing_ok=True)
        daemon.start()
        assert daemon.wait_final([running], 60)[running]["state"] == "done"
    finally:
        daemon.cleanup(client)


def test_a_state_file_that_does_not_know_the_running_containers_is_refused(tmp_path: Path, image: str) -> None:
    client = require_engine()
    daemon = DaemonProcess(tmp_path, extra="")
    daemon.config.write_text(daemon.config.read_text().replace("[daemon]\n", '[daemon]\ninstance = "faults-x"\n'))
    daemon.start()
    try:
        job_id = daemon.submit(image=image, command=["sleep", "20"], cores=1, walltime=60)
        daemon.wait_running(job_id)
        daemon.stop()
        for path in daemon.state.glob("state.sqlite*"):
            path.unlink()
        with pytest.raises(AssertionError, match=f"has no record of job.s. {job_id} whose containers exist"):
            daemon.start(timeout=15)
        labels = ["cosched.instance=faults-x", f"cosched.job={job_id}"]
        assert [c.status for c in client.containers.list(all=True, filters={"label": labels})] == ["running"]
    finally:
        for container in client.containers.list(all=True, filters={"label": "cosched.instance=faults-x"}):
            container.remove(force=True)
        daemon.stop()

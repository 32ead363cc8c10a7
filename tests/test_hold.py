"""Holding and releasing a pending job (`cosched hold`, `cosched release`, Slurm's `scontrol
hold/release`): in the core, through the API, and on the real engine across a restart."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine

from cosched.core.events import JobCancelled, JobEnded, JobHeld, JobReleased, JobSubmitted, Launch, Offer
from cosched.core.scheduler import Scheduler
from cosched.model import Cluster, Job, JobState
from cosched.policies.registry import create
from workloads.images import busybox_image


def core_of(cluster: Cluster, backfill: str = "easy", queue: str = "fcfs") -> Scheduler:
    return Scheduler(
        cluster,
        create("queue", queue),
        create("backfill", backfill),
        create("estimate", "requested"),
        create("placement", "first-fit"),
    )


def started(decision: object) -> list[int]:
    return [a.job.id for a in decision.actions if isinstance(a, Launch)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("backfill", ["easy", "conservative"])
def test_a_held_job_never_starts_holds_no_one_back_and_runs_once_released(backfill: str) -> None:
    """One node of 4 cores, busy until 100. The head (4 cores) is held: the job behind it, which
    would have waited for the head's reservation, starts at once when the cores free, and the
    held head does not start though the node is then free; released, it starts at the next end."""
    core = core_of(Cluster(1, 4), backfill)
    busy = Job(1, 0.0, 4, 100.0, 100.0)
    assert started(core.step(0.0, [Offer(((0, 4),)), JobSubmitted(busy)])) == [1]
    head, small = Job(2, 1.0, 4, 500.0, 500.0), Job(3, 2.0, 2, 50.0, 50.0)
    decision = core.step(2.0, [JobSubmitted(head), JobSubmitted(small), JobHeld(2)])
    assert 2 not in decision.reservations and head.state is JobState.PENDING
    assert started(core.step(100.0, [JobEnded(1), Offer(((0, 4),))])) == [3]
    assert started(core.step(150.0, [JobEnded(3), Offer(((0, 2),))])) == []  # free, and held
    assert started(core.step(160.0, [JobHeld(2), JobReleased(2)])) == [2]  # held twice, released once


def test_a_job_held_before_its_begin_waits_for_both() -> None:
    """Held while it waits for its begin (200): released at 100 it waits on for 200; held at
    150 again and released at 300, it starts at 300. A held job can still be cancelled."""
    core = core_of(Cluster(1, 4))
    core.step(0.0, [Offer(((0, 4),))])
    later, other = Job(1, 0.0, 1, 10.0, 10.0, begin=200.0), Job(2, 0.0, 1, 10.0, 10.0)
    core.step(0.0, [JobSubmitted(later), JobSubmitted(other), JobHeld(1), JobHeld(2)])
    assert started(core.step(100.0, [JobReleased(1)])) == []
    assert later.begin == 200.0
    core.step(150.0, [JobHeld(1)])
    assert started(core.step(250.0, [])) == []
    assert started(core.step(300.0, [JobReleased(1)])) == [1]
    core.step(310.0, [JobCancelled(2)])
    assert other.state is JobState.CANCELLED and 2 not in core.jobs


# -- the API, in process, and the daemon on the real engine ----------------------------------------------


def test_hold_and_release_through_the_api(tmp_path: Path) -> None:
    """Answers and refusals: the hold is in the state file and reaches the core through the inbox;
    a running or unknown job, or a release of a job not held, is refused with one line."""
    from fastapi.testclient import TestClient

    from cosched.daemon.api import create_app
    from cosched.daemon.config import from_dict, validate
    from cosched.daemon.service import Daemon

    image = busybox_image(require_engine())
    document = {"daemon": {"state_dir": str(tmp_path / "state")}, "cluster": {"cores": 2, "memory_mib": 4096}}
    daemon = Daemon(validate(from_dict(document)))
    try:
        with TestClient(create_app(daemon)) as client:
            job = client.post("/v1/jobs", json={"image": image, "command": ["true"], "cores": 1, "walltime": 9})
            job_id = job.json()["id"]
            assert client.post(f"/v1/jobs/{job_id}/hold").json() == {"id": job_id, "state": "pending"}
            assert client.post(f"/v1/jobs/{job_id}/hold").status_code == 200  # again: nothing more
            assert daemon.store.job(job_id)["held"] == 1  # type: ignore[index]
            assert [type(e).__name__ for e in daemon.inbox] == ["JobSubmitted", "JobHeld"]
            assert client.get(f"/v1/jobs/{job_id}").json()["reason"] == "JobHeldUser"
            assert client.post(f"/v1/jobs/{job_id}/release").status_code == 200
            refused = client.post(f"/v1/jobs/{job_id}/release")
            assert (refused.status_code, refused.json()["error"]) == (409, f"job {job_id} is not held")
            assert client.post("/v1/jobs/999/hold").status_code == 404
            with daemon.store.transaction() as db:
                daemon.store.update_job(db, job_id, state="running")
            refused = client.post(f"/v1/jobs/{job_id}/hold")
            assert refused.status_code == 409
            assert refused.json()["error"] == f"job {job_id} is running: only a pending job can be held or released"
    finally:
        daemon.store.close()


def test_a_held_job_stays_held_across_a_restart_and_runs_once_released(tmp_path: Path) -> None:
    """The cluster (2 cores) is busy; a queued job is held (`cosched hold`), then the busy job is
    cancelled: the held job does not start though the cores are free, and `cosched queue` says
    JobHeldUser. The daemon is SIGKILLed and started again: still held. Released, it runs."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2)
    daemon.start()

    try:
        busy = daemon.submit(image=image, command=["sleep", "600"], cores=2, walltime=900)
        daemon.wait_running(busy)
        waiting = daemon.submit(image=image, command=["true"], cores=1, walltime=60)
        assert daemon.cli("hold", str(waiting)) == f"job {waiting}: held\n"
        daemon.client.call("DELETE", f"/v1/jobs/{busy}")
        daemon.wait_final([busy], 30)
        time.sleep(2)  # passes every 0.2 s: the free cores are never given to the held job
        assert daemon.job(waiting)["state"] == "pending"
        assert "JobHeldUser" in daemon.cli("queue")
        daemon.signal(signal.SIGKILL)
        daemon.start()
        time.sleep(2)
        assert daemon.job(waiting)["state"] == "pending" and "JobHeldUser" in daemon.cli("queue")
        assert daemon.cli("release", str(waiting)) == f"job {waiting}: released\n"
        assert daemon.wait_final([waiting], 30)[waiting]["state"] == "done"
    finally:
        daemon.cleanup(engine)

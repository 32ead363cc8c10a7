"""Changing a job's walltime (`cosched update --walltime`, Slurm's `scontrol update TimeLimit`): in
the core, a queued job is ordered and fitted by the new one and a running one's end moves for the
reservations; through the API, Slurm's rule (lower your own, an operator raises); on the real
engine, the kill follows the new walltime across a restart."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine
from test_hold import core_of, started

from cosched.core.events import JobEnded, JobSubmitted, JobUpdated, Offer
from cosched.model import Cluster, Job
from workloads.images import busybox_image


@pytest.mark.parametrize("backfill", ["easy", "conservative"])
def test_a_queued_job_lowered_to_fit_the_hole_backfills_at_once(backfill: str) -> None:
    """4 cores: a 2-core job runs until 100, the 4-core head is reserved at 100, and a 2-core job
    of walltime 500 behind it would delay the head. Lowered to 50, it starts in the hole."""
    core = core_of(Cluster(1, 4), backfill)
    assert started(core.step(0.0, [Offer(((0, 4),)), JobSubmitted(Job(1, 0.0, 2, 100.0, 100.0))])) == [1]
    decision = core.step(1.0, [JobSubmitted(Job(2, 1.0, 4, 100.0)), JobSubmitted(Job(3, 1.0, 2, 500.0))])
    assert started(decision) == [] and decision.reservations[2] == 100.0
    assert started(core.step(10.0, [JobUpdated(3, 50.0)])) == [3]


@pytest.mark.parametrize("backfill", ["easy", "conservative"])
def test_a_running_job_extended_moves_the_heads_reservation(backfill: str) -> None:
    """The head's reservation follows the running job's new end (100 -> 400), and a 2-core job of
    300 s that would have delayed the head at 100 now fits before it, so it starts at once."""
    core = core_of(Cluster(1, 4), backfill)
    core.step(0.0, [Offer(((0, 4),)), JobSubmitted(Job(1, 0.0, 2, 100.0, 100.0))])
    decision = core.step(1.0, [JobSubmitted(Job(2, 1.0, 4, 100.0)), JobSubmitted(Job(3, 1.0, 2, 300.0))])
    assert started(decision) == [] and decision.reservations[2] == 100.0
    decision = core.step(2.0, [JobUpdated(1, 400.0)])
    assert started(decision) == [3] and decision.reservations[2] == 400.0


def test_sjf_orders_a_queued_job_by_its_new_walltime() -> None:
    """SJF: of two queued 4-core jobs, the shorter starts first; lowering the longer one's
    walltime below the other's puts it first."""
    core = core_of(Cluster(1, 4), "none", "sjf")
    core.step(0.0, [Offer(((0, 4),)), JobSubmitted(Job(1, 0.0, 4, 100.0, 100.0))])
    core.step(1.0, [JobSubmitted(Job(2, 1.0, 4, 50.0)), JobSubmitted(Job(3, 1.0, 4, 80.0))])
    core.step(2.0, [JobUpdated(3, 20.0)])
    assert started(core.step(100.0, [JobEnded(1), Offer(((0, 4),))])) == [3]


def test_the_owner_lowers_an_operator_raises_and_an_ended_job_is_refused(tmp_path: Path) -> None:
    """Through the API, as Slurm: alice lowers her job's walltime, may not raise it, nor touch
    bob's; an operator raises it; the state file and the core's inbox have the change; an ended
    job gets 409, an unknown one 404, a walltime of 0 422."""
    from fastapi.testclient import TestClient
    from test_api_users import as_user, job, make_daemon

    from cosched.daemon.api import create_app
    from cosched.daemon.identity import create_key

    image = busybox_image(require_engine())
    key_file = tmp_path / "api.key"
    create_key(key_file)
    daemon = make_daemon(tmp_path, key_file)
    alice, bob, ops = (as_user(key_file, name) for name in ("alice", "bob", "ops"))
    try:
        with TestClient(create_app(daemon)) as client:
            hers = client.post("/v1/jobs", json=job(image), headers=alice).json()["id"]  # walltime 30

            def update(walltime: float, who: dict[str, str], job_id: int = hers) -> tuple[int, str]:
                answer = client.patch(f"/v1/jobs/{job_id}", json={"walltime": walltime}, headers=who)
                return answer.status_code, answer.json().get("error", "")

            assert update(20, alice) == (200, "")
            assert update(25, alice) == (403, f"job {hers}: only an operator may raise a walltime (20 s to 25 s)")
            assert update(10, bob)[0] == 403
            assert update(3600, ops) == (200, "")
            assert daemon.store.job(hers)["spec"]["walltime"] == 3600  # type: ignore[index]
            assert [(type(e).__name__, getattr(e, "walltime", None)) for e in daemon.inbox][-2:] == [
                ("JobUpdated", 20.0),
                ("JobUpdated", 3600.0),
            ]
            assert update(0, ops)[0] == 422 and update(10, ops, 999)[0] == 404
            with daemon.store.transaction() as db:
                daemon.store.update_job(db, hers, state="done")
            assert update(10, alice) == (409, f"job {hers} is done: only a queued or running job's walltime can change")
    finally:
        daemon.store.close()


def test_a_running_jobs_kill_follows_its_new_walltime_across_a_restart(tmp_path: Path) -> None:
    """A job of walltime 4 is given 600 while it runs; the daemon is SIGKILLed and started again:
    6 s on it still runs. Lowered to 2 (below what it ran), it is killed at once, `walltime exceeded`,
    not at the next review (a minute here)."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=1, intervals={"review": 60})
    daemon.start()
    try:
        job_id = daemon.submit(image=image, command=["sleep", "600"], cores=1, walltime=4)
        daemon.wait_running(job_id)
        assert daemon.cli("update", str(job_id), "--walltime", "600") == f"job {job_id}: walltime 600 s\n"
        daemon.signal(signal.SIGKILL)
        daemon.start()
        time.sleep(6)
        assert daemon.job(job_id)["state"] == "running"
        daemon.cli("update", str(job_id), "--walltime", "2")
        ended = daemon.wait_final([job_id], 30)[job_id]
        assert (ended["state"], ended["reason"]) == ("failed", "walltime exceeded")
    finally:
        daemon.cleanup(engine)

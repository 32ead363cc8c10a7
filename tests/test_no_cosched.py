"""Jobs co-scheduling leaves alone (`cosched submit --no-cosched`, `coschedule = false`): their cores
are never lent and they never run on another's, under every co-scheduling policy (the validator
checks each lending), in the core and on the real engine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from cosched.core.events import Colocate, JobSubmitted, Offer
from cosched.model import Cluster, Job
from cosched.replay.driver import PolicySet, replay
from workloads.images import busybox_image


@pytest.mark.parametrize(
    ("host_shares", "guest_shares", "lent"), [(True, True, True), (False, True, False), (True, False, False)]
)
def test_static_lends_only_between_jobs_that_both_take_part(host_shares: bool, guest_shares: bool, lent: bool) -> None:
    core = PolicySet("fcfs", "easy", cosched="static").build(Cluster(1, 4))
    core.step(0.0, [Offer(((0, 4),)), JobSubmitted(Job(1, 0.0, 4, 100.0, 100.0, coschedule=host_shares))])
    decision = core.step(1.0, [JobSubmitted(Job(2, 1.0, 2, 50.0, 50.0, coschedule=guest_shares))])
    assert [(a.guest.id, a.host_id) for a in decision.actions if isinstance(a, Colocate)] == ([(2, 1)] if lent else [])


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 2000), st.integers(1, 4), st.floats(1, 1000), st.booleans()), min_size=1, max_size=30
    ),
    st.sampled_from(["static", "asax"]),
)
def test_no_lending_ever_involves_a_job_that_opted_out(specs: list, cosched: str) -> None:  # type: ignore[type-arg]
    jobs = [
        Job(i + 1, submit, cores, walltime, walltime * 0.5, coschedule=shares)
        for i, (submit, cores, walltime, shares) in enumerate(sorted(specs))
    ]
    result = replay(jobs, Cluster(2, 4), PolicySet(cosched=cosched), validate=True)
    assert len(result.jobs) == len(jobs)


def test_the_daemon_never_lends_the_cores_of_a_job_that_opted_out(tmp_path: Path) -> None:
    """Static lending on 2 cores: a 2-core job submitted with --no-cosched keeps both while a 1-core
    job waits (`Resources`, and why it is not co-scheduled); the same job without the flag is lent
    to the waiting one at once."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2, extra='[policies]\ncosched = "static"\n')
    daemon.start()
    try:
        alone = daemon.submit(image=image, command=["sleep", "600"], cores=2, walltime=900, coschedule=False)
        daemon.wait_running(alone)
        waiting = daemon.submit(image=image, command=["sleep", "600"], cores=1, walltime=900)
        time.sleep(1.5)  # passes every 0.2 s: static would have lent at the first
        assert daemon.job(waiting)["state"] == "pending" and daemon.job(alone)["quota"] == 2.0
        assert daemon.job(alone)["coschedule"] is False  # `cosched status` says so
        why = "Resources; not co-scheduled: the running jobs of 1+ cores do not lend (--no-cosched)"
        assert daemon.job(waiting)["pending_reason"] == why
        daemon.client.call("DELETE", f"/v1/jobs/{alone}")
        daemon.wait_final([alone], 30)
        daemon.client.call("DELETE", f"/v1/jobs/{waiting}")
        daemon.wait_final([waiting], 30)
        host = daemon.submit(image=image, command=["sleep", "600"], cores=2, walltime=900)
        daemon.wait_running(host)
        guest = daemon.submit(image=image, command=["sleep", "600"], cores=1, walltime=900)
        assert daemon.wait_running(guest)["host"] == host
    finally:
        daemon.cleanup(engine)

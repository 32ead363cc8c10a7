"""Caps on each user's running cores and jobs (`max_cores_per_user`, `max_running_jobs_per_user`:
Slurm's MaxTRESPerUser=cpu=N and MaxJobsPerUser=N) and on each workflow's running jobs (a job
array's throttle, `%N`): the core keeps them under every
policy (the validator checks each start), a capped job holds no one back, and the daemon refuses
what can never run and says why a job waits."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from cosched.core.events import JobSubmitted
from cosched.daemon.client import ApiError
from cosched.errors import ConfigError
from cosched.model import Cluster, Job
from cosched.replay.driver import PolicySet, replay
from workloads.images import busybox_image


def _starts(jobs: list[Job], cap: int, queue: str = "fcfs", backfill: str = "easy", most: int = 0) -> dict[int, float]:
    policies = PolicySet(queue, backfill, max_cores_per_user=cap, max_running_jobs_per_user=most)
    return {job.id: job.start for job in replay(jobs, Cluster(1, 4), policies, validate=True).jobs}


def test_a_user_at_the_cap_waits_while_cores_are_free_and_others_go_by() -> None:
    """Four cores, a cap of 2. Alice queues three 1-core jobs at 0, Bob one at 1: two of hers
    start, her third waits though cores are free, Bob's starts at once; her third starts when
    one of hers ends (at 100), not when Bob's does (50)."""
    jobs = [Job(i, 0.0, 1, 100.0, 100.0, user=1) for i in (1, 2, 3)] + [Job(4, 1.0, 1, 50.0, 50.0, user=2)]
    assert _starts(jobs, cap=2) == {1: 0.0, 2: 0.0, 3: 100.0, 4: 1.0}
    uncapped = [Job(i, 0.0, 1, 100.0, 100.0, user=1) for i in (1, 2, 3)] + [Job(4, 1.0, 1, 50.0, 50.0, user=2)]
    assert _starts(uncapped, cap=0) == {1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}


def test_a_capped_job_at_the_head_holds_no_one_back_even_without_backfilling() -> None:
    """Alice's 2-core job is first in line but her running job holds the cap; with no backfill
    policy Bob's job behind it still starts (it is not the head: Alice's is out of sight)."""
    jobs = [
        Job(1, 0.0, 2, 100.0, 100.0, user=1),
        Job(2, 1.0, 2, 100.0, 100.0, user=1),
        Job(3, 2.0, 2, 10.0, 10.0, user=2),
    ]
    assert _starts(jobs, cap=2, backfill="none") == {1: 0.0, 2: 100.0, 3: 2.0}


def test_a_job_larger_than_the_cap_is_refused_with_its_reason() -> None:
    core = PolicySet(max_cores_per_user=2).build(Cluster(1, 4))
    decision = core.step(0.0, [JobSubmitted(Job(1, 0.0, 3, 10.0, user=1))])
    assert [(type(a).__name__, a.reason) for a in decision.actions] == [  # type: ignore[attr-defined]
        ("Reject", "job 1 asks for 3 cores, a user may hold at most 2 (max_cores_per_user)")
    ]
    with pytest.raises(ConfigError, match="max_cores_per_user must be >= 0"):
        PolicySet(max_cores_per_user=-1).build(Cluster(1, 4))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 3000), st.integers(1, 4), st.floats(1, 2000), st.floats(0.1, 1.0), st.integers(0, 3)),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 6),
    st.sampled_from(["fcfs:easy", "fcfs:conservative", "sjf:none", "wfp3:easy", "fairshare:easy"]),
    st.sampled_from(["none", "static"]),
)
def test_no_start_ever_takes_a_user_past_the_cap(specs: list, cap: int, pair: str, cosched: str) -> None:  # type: ignore[type-arg]
    """Every start, co-scheduled guests' too, is checked by the validator against the cap; every
    job within the cap runs, every larger one is refused."""
    jobs = [
        Job(i + 1, submit, cores, walltime, walltime * used, user=user)
        for i, (submit, cores, walltime, used, user) in enumerate(sorted(specs))
    ]
    queue, backfill = pair.split(":")
    policies = PolicySet(queue, backfill, cosched=cosched, max_cores_per_user=cap)
    result = replay(jobs, Cluster(2, 4), policies, validate=True)
    assert {job.id for job in result.jobs} == {job.id for job in jobs if job.cores <= cap}
    assert {job.id for job in result.rejected} == {job.id for job in jobs if job.cores > cap}


def test_a_user_at_their_most_running_jobs_waits_while_cores_are_free() -> None:
    """Four cores, at most 2 running jobs a user: Alice's third 1-core job waits for one of hers
    to end (100), Bob's starts at once."""
    jobs = [Job(i, 0.0, 1, 100.0, 100.0, user=1) for i in (1, 2, 3)] + [Job(4, 1.0, 1, 50.0, 50.0, user=2)]
    assert _starts(jobs, cap=0, most=2) == {1: 0.0, 2: 0.0, 3: 100.0, 4: 1.0}


def test_a_throttled_workflow_runs_at_most_its_throttle_and_holds_no_one_back() -> None:
    """Four cores; workflow a's four 1-core jobs have a throttle of 2, so two start at 0 and two at
    100; workflow b's job, submitted after them with no backfilling, starts at once on a free core."""
    jobs = [Job(i, 0.0, 1, 100.0, 100.0, workflow="a", throttle=2) for i in (1, 2, 3, 4)]
    jobs.append(Job(5, 1.0, 1, 10.0, 10.0, workflow="b"))
    assert _starts(jobs, cap=0, backfill="none") == {1: 0.0, 2: 0.0, 3: 100.0, 4: 100.0, 5: 1.0}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 3000), st.integers(1, 4), st.floats(1, 2000), st.floats(0.1, 1.0), st.integers(0, 2)),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.integers(0, 3), min_size=3, max_size=3),
    st.integers(0, 6),
    st.integers(0, 3),
    st.sampled_from(["fcfs:easy", "fcfs:conservative", "sjf:none", "wfp3:easy", "fairshare:easy"]),
    st.sampled_from(["none", "static"]),
)
def test_no_start_ever_takes_a_workflow_past_its_throttle(  # type: ignore[type-arg]
    specs: list, throttles: list[int], cap: int, most: int, pair: str, cosched: str
) -> None:
    """Three workflows with throttles (0: none), with or without caps on a user's cores and running
    jobs: the validator checks every start, co-scheduled guests' too, against all three; every job
    within the core cap runs."""
    jobs = [
        Job(i + 1, submit, cores, walltime, walltime * used, user=flow, workflow=str(flow), throttle=throttles[flow])
        for i, (submit, cores, walltime, used, flow) in enumerate(sorted(specs))
    ]
    queue, backfill = pair.split(":")
    policies = PolicySet(queue, backfill, cosched=cosched, max_cores_per_user=cap, max_running_jobs_per_user=most)
    result = replay(jobs, Cluster(2, 4), policies, validate=True)
    assert {job.id for job in result.jobs} == {job.id for job in jobs if not cap or job.cores <= cap}


def test_the_daemon_refuses_what_the_cap_forbids_and_says_why_a_job_waits(tmp_path: Path) -> None:
    """Two cores, a cap of 1 (jobs without a user token are one user). A 2-core job is refused
    with one line; of two 1-core jobs one runs and the other waits, `QOSMaxCpuPerUserLimit`,
    though a core is free; it runs once the first ends."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2, extra='[policies]\nmax_cores_per_user = 1\ncosched = "none"\n')
    daemon.start()
    try:
        with pytest.raises(ApiError, match=r"cores: 2 cores asked, a user may hold at most 1 \(policies"):
            daemon.submit(image=image, command=["true"], cores=2, walltime=60)
        first = daemon.submit(image=image, command=["sleep", "3"], cores=1, walltime=60)
        second = daemon.submit(image=image, command=["true"], cores=1, walltime=60)
        daemon.wait_running(first)
        time.sleep(1)  # passes every 0.2 s: the free core is not given to the second
        assert daemon.job(second)["state"] == "pending"
        assert "(QOSMaxCpuPerUserLimit)" in daemon.cli("queue")
        assert daemon.job(second)["pending_reason"] == "QOSMaxCpuPerUserLimit"  # `cosched status` says it too
        jobs = daemon.wait_final([first, second], 60)
        assert jobs[second]["start"] >= jobs[first]["end"] - 0.5, jobs
    finally:
        daemon.cleanup(engine)


@pytest.mark.parametrize("key", ["max_cores_per_user", "max_running_jobs_per_user"])
def test_a_negative_cap_in_the_config_names_its_key(key: str) -> None:
    from cosched.daemon.config import from_dict, validate

    with pytest.raises(ConfigError, match=rf"config key policies.{key}: must be >= 0 \(0: no cap\), got -1"):
        validate(from_dict({"policies": {key: -1}}))

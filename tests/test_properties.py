"""Properties every queue x backfill x estimate combination must keep, on random workloads.

Each replay runs through `ValidatingScheduler`, which already fails on a node
oversubscribed, a job started twice or before its submission, or a gang not
whole; the tests below add what needs the whole schedule to judge.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cosched.model import Allocation, Cluster, Job
from cosched.policies.backfill import EASY
from cosched.policies.conservative import Conservative
from cosched.policies.registry import available
from cosched.replay.driver import PolicySet, ReplayResult, replay

QUEUES = available("queue")
BACKFILLS = available("backfill")
ESTIMATES = ("requested", "actual")
# A queue policy that picks every start itself (dbf) leaves no job for conservative to reserve for.
COMBINATIONS = [c for c in itertools.product(QUEUES, BACKFILLS, ESTIMATES) if c[:2] != ("dbf", "conservative")]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Cluster, list[tuple[float, int, float, float]]]:
    """A small cluster and up to 30 jobs: bursts of equal submit times, walltimes >= runtimes."""
    cluster = Cluster(
        nodes=draw(st.integers(1, 6)),
        cores_per_node=draw(st.sampled_from([1, 2, 4])),
        allocation=draw(st.sampled_from(list(Allocation))),
    )
    rows = draw(
        st.lists(
            st.tuples(st.integers(0, 20), st.integers(1, cluster.cores), st.integers(1, 60), st.integers(0, 90)),
            min_size=1,
            max_size=30,
        )
    )
    submit, spec = 0, []
    for gap, cores, runtime, slack in rows:
        submit += gap
        spec.append((float(submit), cores, float(runtime), float(runtime + slack)))
    return cluster, spec


def make_jobs(spec: list[tuple[float, int, float, float]]) -> list[Job]:
    return [Job(id=i, submit=s, cores=c, runtime=r, walltime=w) for i, (s, c, r, w) in enumerate(spec, 1)]


def run(cluster: Cluster, spec: list, queue: str, backfill: str, estimate: str) -> ReplayResult:
    return replay(make_jobs(spec), cluster, PolicySet(queue, backfill, estimate), validate=True)


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(("queue", "backfill", "estimate"), COMBINATIONS)
@SETTINGS
@given(workload=workloads())
def test_schedule_is_valid_and_complete(workload, queue: str, backfill: str, estimate: str) -> None:
    cluster, spec = workload
    result = run(cluster, spec, queue, backfill, estimate)  # the validator checks capacity at every launch
    assert not result.rejected
    assert len(result.jobs) == len(spec)  # every job finishes
    for job in result.jobs:
        assert job.start >= job.submit
        assert job.end - job.start == min(job.runtime, job.walltime)

    if backfill == "easy":
        assert_easy_keeps_head_reservations(result)
    if backfill == "conservative":
        assert_reservations_never_move_later(result)
        assert_reserved_on_arrival(result)
    if queue == "fcfs" and backfill == "none":
        assert_started_in_submit_order(result)


def assert_easy_keeps_head_reservations(result: ReplayResult) -> None:
    """A head job reserved at shadow time S starts by S, as long as it stays the head
    (each later pass, up to the one it starts in, begins with it first in queue order)."""
    checker = result.validator
    assert checker is not None
    start = {j.id: j.start for j in result.jobs}
    for at, reservations in checker.reservation_log:
        for head, shadow in reservations.items():
            tenure = [h for t, h in checker.head_log if at < t <= start[head]]
            if all(h == head for h in tenure):
                assert start[head] <= shadow, f"head {head} reserved at {shadow} started at {start[head]}"


def assert_reservations_never_move_later(result: ReplayResult) -> None:
    checker = result.validator
    assert checker is not None
    history: dict[int, list[float]] = {}
    for _, reservations in checker.reservation_log:
        for job_id, at in reservations.items():
            history.setdefault(job_id, []).append(at)
    start = {j.id: j.start for j in result.jobs}
    for job_id, times in history.items():
        assert times == sorted(times, reverse=True), f"job {job_id} reservation moved later: {times}"
        assert start[job_id] <= times[0]


def assert_reserved_on_arrival(result: ReplayResult) -> None:
    """Every job is promised a start in the pass of its arrival, even while nothing is free."""
    checker = result.validator
    assert checker is not None
    first: dict[int, float] = {}
    for at, reservations in checker.reservation_log:
        for job_id in reservations:
            first.setdefault(job_id, at)
    assert first == {j.id: j.submit for j in result.jobs}


def assert_started_in_submit_order(result: ReplayResult) -> None:
    checker = result.validator
    assert checker is not None
    launched = [job_id for _, job_id in checker.launch_log]
    assert launched == sorted(launched, key=lambda i: (result.jobs[i - 1].submit, i))


@pytest.mark.parametrize("queue", QUEUES)
@SETTINGS
@given(workload=workloads())
def test_easy_reusing_work_decides_as_a_full_rescan(workload, queue: str) -> None:
    """EASY skips queue jobs it already refused at the same epoch; that must change nothing."""

    class Rescan(EASY):
        def plan(self, view, head):
            self._epoch = -1  # never reuse
            return super().plan(view, head)

    cluster, spec = workload
    fast = replay(make_jobs(spec), cluster, PolicySet(queue, EASY()))
    slow = replay(make_jobs(spec), cluster, PolicySet(queue, Rescan()))
    assert {j.id: j.start for j in fast.jobs} == {j.id: j.start for j in slow.jobs}


@SETTINGS
@given(workload=workloads())
def test_replay_is_deterministic(workload) -> None:
    cluster, spec = workload
    first = run(cluster, spec, "wfp3", "easy", "requested")
    again = run(cluster, spec, "wfp3", "easy", "requested")
    assert [(j.id, j.start, j.slots) for j in first.jobs] == [(j.id, j.start, j.slots) for j in again.jobs]


class _CheckEveryJob(Conservative):
    """Compression without its shortcut: every waiting job is checked, the first in priority
    order that can start earlier is moved, and the checks start over, until none can."""

    def _compress(self, profile, pending, now, gains):
        for gain in gains or ():
            profile.add(*gain)
        while True:
            for job in pending:
                at = self._reserved.get(job.id, now)
                start = profile.earliest(job.need, job.estimate, before=at) if at > now else at
                if start < at:
                    self._move(profile, job, start)
                    break
            else:
                return


class _Compressed(Conservative):
    """Asserts after every pass that no waiting job can start earlier than its reservation."""

    def plan(self, view, head):
        result = super().plan(view, head)
        for job in view.queue[head:]:
            at = self._reserved[job.id]
            assert at <= view.now or self._profile.earliest(job.need, job.estimate, before=at) == math.inf
        return result


@pytest.mark.parametrize(("queue", "estimate"), itertools.product(["fcfs", "sjf", "wfp3", "largest"], ESTIMATES))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_conservative_compression_checks_only_what_can_move(workload, queue: str, estimate: str) -> None:
    """Compression checks only the jobs near what came free; it must decide as checking every
    job does, and leave no job that could start earlier."""
    cluster, spec = workload
    fast = replay(make_jobs(spec), cluster, PolicySet(queue, _Compressed(), estimate), validate=True)
    slow = replay(make_jobs(spec), cluster, PolicySet(queue, _CheckEveryJob(), estimate), validate=True)
    assert {j.id: j.start for j in fast.jobs} == {j.id: j.start for j in slow.jobs}
    assert fast.validator is not None and slow.validator is not None
    assert fast.validator.reservation_log == slow.validator.reservation_log


class _Unhurt:
    """Jobs that use a tenth of their CPU: lending never slows anyone, so every job ends at
    its estimate and a broken reservation can only come from the scheduler's own accounting."""

    def speed(self, job: Job, quota: float, neighbours: object) -> float:
        return 1.0

    def usage(self, job: Job, quota: float, speed: float) -> tuple[float, float]:
        return 0.1, 0.1


@pytest.mark.parametrize(("backfill", "cosched"), list(itertools.product(["easy", "conservative"], ["static", "asax"])))
@SETTINGS
@given(workload=workloads())
def test_co_scheduling_keeps_the_backfill_reservations(workload, backfill: str, cosched: str) -> None:
    """A guest keeps its share of its host's cores after the host ends: reservations must count
    that, and a guest must not be placed where it would take cores a reservation counts on."""
    cluster, spec = workload
    policies = PolicySet("fcfs", backfill, "actual", cosched=cosched, keep_promises=True)
    result = replay(make_jobs(spec), cluster, policies, validate=True, rates=_Unhurt(), sample_every=5.0)
    assert len(result.jobs) == len(spec)
    if backfill == "easy":
        assert_easy_keeps_head_reservations(result)
    else:
        assert_first_reservations_kept(result)


def assert_first_reservations_kept(result: ReplayResult) -> None:
    """Every job starts by the first time it was promised (with guests about, a later plan may
    move a reservation back and forth, as the guests it must work around come and go)."""
    checker = result.validator
    assert checker is not None
    start = {j.id: j.start for j in result.jobs}
    first: dict[int, float] = {}
    for _, reservations in checker.reservation_log:
        for job_id, at in reservations.items():
            first.setdefault(job_id, at)
    for job_id, at in first.items():
        assert start[job_id] <= at, f"job {job_id} promised {at} started at {start[job_id]}"


@pytest.mark.parametrize(("keep_promises", "head_start"), [(False, 2.0), (True, 1.0)])
def test_a_guest_outliving_its_host_delays_the_head_unless_promises_are_kept(
    keep_promises: bool, head_start: float
) -> None:
    """2 cores. Job 1 (1 core, 1 s) runs; job 2 (2 cores) is the head, reserved at 1; job 3 (1 core,
    2 s) cannot backfill (it would hold a core past 1). As a guest of job 1 it would: it keeps that
    core when job 1 ends, and job 2 waits until 2. Keeping promises, job 3 waits its turn instead."""
    spec = [(0.0, 1, 1.0, 1.0), (0.0, 2, 1.0, 1.0), (0.0, 1, 2.0, 2.0)]
    policies = PolicySet("fcfs", "easy", "actual", cosched="static", keep_promises=keep_promises)
    result = replay(make_jobs(spec), Cluster(nodes=1, cores_per_node=2), policies, validate=True, rates=_Unhurt())
    start = {j.id: j.start for j in result.jobs}
    assert result.validator is not None and result.validator.reservation_log[0] == (0.0, {2: 1.0})
    assert start[2] == head_start
    assert start[3] == (0.0 if not keep_promises else 1.0)

"""Deferrable jobs (OSDEC's [e_i, l_i]) in the core and in replay, on schedules worked out by hand.

Why: a job with a begin must stay out of the policies' sight until then and enter the queue
at that very time; one still pending at its latest start must fail, never start late; and no
backfill reservation may be made for a job that would expire before it. Every replay here
runs through the validating wrapper, which checks each start against its window.
"""

from __future__ import annotations

import math

import pytest

from cosched.core.events import JobCancelled, JobEnded, JobSubmitted, Offer, Reject
from cosched.core.scheduler import Scheduler
from cosched.model import Cluster, Job, JobState
from cosched.policies.backfill import EASY
from cosched.policies.estimate import Requested
from cosched.policies.placement import FirstFit
from cosched.policies.queue import FCFS
from cosched.replay.deferrable import Windows, measure
from cosched.replay.driver import PolicySet, replay

NODE = Cluster(nodes=1, cores_per_node=4)


def job(id: int, submit: float, cores: int, runtime: float, **window: float) -> Job:
    return Job(id=id, submit=submit, cores=cores, runtime=runtime, walltime=runtime, **window)


def run(jobs: list[Job], queue: str = "fcfs", backfill: str = "easy") -> tuple[dict[int, Job], list[Job]]:
    result = replay(jobs, NODE, PolicySet(queue, backfill), validate=True)
    return {j.id: j for j in result.jobs}, result.rejected


def core(late_grace: float = 0.0) -> Scheduler:
    return Scheduler(NODE, FCFS(), EASY(), Requested(), FirstFit(), late_grace=late_grace)


def test_a_held_job_is_out_of_the_queue_and_enters_it_at_its_begin() -> None:
    scheduler = core()
    decision = scheduler.step(0, [Offer(((0, 4),)), JobSubmitted(job(1, 0, 2, 50, begin=100))])
    assert decision.actions == [] and scheduler.queue == [] and decision.wake_at == 100
    assert scheduler.jobs[1].state is JobState.PENDING
    [launch] = scheduler.step(100, []).actions
    assert launch.job.id == 1 and launch.job.start == 100


def test_a_job_still_pending_at_its_latest_start_fails_with_its_reason() -> None:
    # A fills the node until 100; B (latest start 50) cannot start by then.
    jobs, rejected = run([job(1, 0, 4, 100), job(2, 10, 2, 10, latest_start=50)])
    [b] = rejected
    assert b.id == 2 and b.state is JobState.FAILED and b.end == 50
    assert 2 not in jobs and jobs[1].end == 100


def test_the_reject_names_the_job_and_its_latest_start() -> None:
    scheduler = core()
    scheduler.step(
        0, [Offer(((0, 4),)), JobSubmitted(job(1, 0, 4, 100)), JobSubmitted(job(2, 0, 4, 5, latest_start=30))]
    )
    assert scheduler.step(29, []).wake_at == 30
    [reject] = scheduler.step(30, []).actions
    assert isinstance(reject, Reject)
    assert reject.reason == "job 2 did not start by its latest start, 30 s after its submission"
    assert scheduler.jobs.keys() == {1}


def test_a_job_may_start_at_its_latest_start_but_not_a_second_later() -> None:
    jobs, rejected = run([job(1, 0, 4, 50), job(2, 10, 4, 10, latest_start=50), job(3, 10, 4, 10, latest_start=50)])
    assert jobs[2].start == 50 and [r.id for r in rejected] == [3]


def test_a_late_pass_tries_a_job_whose_latest_start_it_stands_for_within_the_grace_only() -> None:
    """The daemon's pass after a latest start stands for the interval before it (`late_grace`): B,
    due by 60, whose cores an end at 59.8 freed, starts in the pass at 60.5. After a stretch with no
    step (the engine down), the pass at 600 stood for it all and started B 540 s late (a review);
    now B fails there. Replay (grace 0) steps at 60 itself."""
    for at, started in ((60.5, True), (600.0, False)):
        scheduler = core(late_grace=1.0)
        scheduler.step(
            0, [Offer(((0, 4),)), JobSubmitted(job(1, 0, 4, 100)), JobSubmitted(job(2, 0, 4, 5, latest_start=60))]
        )
        scheduler.step(59.0, [])
        actions = scheduler.step(at, [JobEnded(1, at=59.8), Offer(((0, 4),))]).actions
        assert [type(a).__name__ for a in actions] == (["Launch"] if started else ["Reject"]), (at, actions)


def test_a_begin_in_a_full_cluster_waits_for_room_and_keeps_its_window() -> None:
    jobs, rejected = run([job(1, 0, 4, 100), job(2, 0, 2, 10, begin=30, latest_start=200)])
    assert jobs[2].start == 100 and not rejected


def test_cancelling_a_held_job_ends_it_and_nothing_wakes_for_it() -> None:
    scheduler = core()
    scheduler.step(0, [Offer(((0, 4),)), JobSubmitted(job(1, 0, 2, 50, begin=100, latest_start=200))])
    decision = scheduler.step(5, [JobCancelled(1)])
    assert decision.wake_at == math.inf and scheduler.jobs == {} and scheduler.windows.held == {}


def test_no_reservation_for_a_job_that_would_expire_first_and_others_backfill() -> None:
    # A runs to 100. B (4 cores, latest start 50) could only fit at 100: no reservation for it,
    # so C (2 cores, 200 s) starts now instead of waiting behind B's reservation.
    scheduler = core()
    scheduler.step(0, [Offer(((0, 4),)), JobSubmitted(job(1, 0, 2, 100))])
    decision = scheduler.step(1, [JobSubmitted(job(2, 1, 4, 10, latest_start=50)), JobSubmitted(job(3, 1, 2, 200))])
    assert 2 not in decision.reservations
    assert [a.job.id for a in decision.actions] == [3]


def test_an_ordinary_blocked_head_still_gets_its_reservation() -> None:
    scheduler = core()
    scheduler.step(0, [Offer(((0, 4),)), JobSubmitted(job(1, 0, 2, 100))])
    decision = scheduler.step(1, [JobSubmitted(job(2, 1, 4, 10, latest_start=500)), JobSubmitted(job(3, 1, 2, 200))])
    assert decision.reservations == {2: 100} and decision.actions == []


@pytest.mark.parametrize("backfill", ["none", "easy", "conservative", "easy-dirlab"])
@pytest.mark.parametrize("queue", ["fcfs", "sjf", "wfp3", "osdec-fifo", "osdec-sjf", "osdec-tetris"])
def test_every_start_is_in_its_window_under_each_policy(queue: str, backfill: str) -> None:
    from workloads.lublin import generate

    jobs = Windows(0.6, width=(600.0, 7200.0), lead=(0.0, 1800.0), seed=3).apply(generate(300, 32, seed=2).jobs())
    result = replay(jobs, Cluster(1, 32), PolicySet(queue, backfill), validate=True)
    for j in result.jobs:
        assert j.begin <= j.start <= j.latest_start
    for j in result.rejected:
        assert j.state is JobState.FAILED and j.end >= j.latest_start
    assert len(result.jobs) + len(result.rejected) == 300


def test_windows_are_drawn_reproducibly_and_leave_the_rest_ordinary() -> None:
    jobs = [job(i, 10.0 * i, 1, 5) for i in range(1000)]
    one, two = (
        Windows(0.3, (100, 200), (0, 50), seed=7).apply(jobs),
        Windows(0.3, (100, 200), (0, 50), seed=7).apply(jobs),
    )
    assert [(j.begin, j.latest_start) for j in one] == [(j.begin, j.latest_start) for j in two]
    deferrable = [j for j in one if j.deferrable]
    assert 250 < len(deferrable) < 350
    assert all(0 <= j.begin - j.submit <= 50 and 100 <= j.latest_start - j.begin <= 200 for j in deferrable)
    assert all(j.begin == -math.inf and j.latest_start == math.inf for j in one if not j.deferrable)
    assert all(j.start == -1.0 for j in jobs)  # the originals untouched


def test_the_measures_by_hand() -> None:
    # A (ordinary) 4 cores 0-100. B (2 cores 10 s, begin 20, latest 300) starts at 100: delay 80 s.
    # C (4 cores, latest 50) expires at 50.
    result = replay(
        [job(1, 0, 4, 100), job(2, 0, 2, 10, begin=20, latest_start=300), job(3, 0, 4, 10, latest_start=50)],
        NODE,
        validate=True,
    )
    s = measure(result)
    assert (s.jobs, s.started, s.expired) == (3 - 1, 1, 1)
    assert s.utilization == pytest.approx(2 * 10 / 3600)
    assert s.delay_sum == pytest.approx(80 / 3600)
    assert s.reward == pytest.approx((20 - 2 * 80) / 3600)
    assert s.cluster_utilization == pytest.approx((400 + 20) / (4 * 110))


def test_tetris_starts_the_largest_deferrable_job_that_fits() -> None:
    jobs = [job(1, 0, 2, 100), job(2, 1, 1, 10, latest_start=999), job(3, 1, 2, 10, latest_start=999)]
    done, _ = run(jobs, "osdec-tetris", "none")
    assert done[3].start == 1 and done[2].start == 11


def test_the_study_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from cosched.cli import main

    assert main(["experiment", "deferrable", "lublin:200:32", "--policies", "fcfs:easy,osdec-tetris:easy"]) == 0
    out = capsys.readouterr().out
    assert "osdec-tetris:easy" in out and "reward" in out


def test_cosched_replay_gives_a_share_of_a_traces_jobs_start_windows(capsys: pytest.CaptureFixture[str]) -> None:
    """`--deferrable` draws the same windows as the study for the same seed, so its expired and
    reward columns are the study's; a share outside [0, 1] is one line and exit status 2."""
    from cosched.cli import main
    from cosched.replay.osdec import run

    assert main(["replay", "lublin:300:32", "--deferrable", "0.5", "--compare", "fcfs:easy"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    [(_, summary)] = run("lublin:300:32", Windows(0.5, seed=1), ["fcfs:easy"])
    assert summary.expired > 0
    assert (int(row[-3]), float(row[-2])) == (summary.expired, round(summary.reward, 1))
    assert main(["replay", "lublin:300:32", "--deferrable", "2"]) == 2
    assert capsys.readouterr().err.strip() == "cosched: error: deferrable fraction must be in [0, 1], got 2.0"

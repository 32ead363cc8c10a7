"""Small traces whose schedules were worked out by hand (the reasoning is in the comments)."""

from __future__ import annotations

import pytest

from cosched.core.events import JobCancelled, JobEnded, JobSubmitted, Kill, Launch, Offer
from cosched.core.scheduler import Scheduler
from cosched.model import Allocation, Cluster, Job, JobState
from cosched.policies.backfill import EASY
from cosched.policies.estimate import Requested
from cosched.policies.placement import FirstFit
from cosched.policies.queue import FCFS
from cosched.replay.driver import PolicySet, replay


def jobs(*rows: tuple[float, int, float, float]) -> list[Job]:
    """(submit, cores, runtime, walltime) rows; ids from 1."""
    return [Job(id=i, submit=s, cores=c, runtime=r, walltime=w) for i, (s, c, r, w) in enumerate(rows, start=1)]


def starts(workload: list[Job], cluster: Cluster, queue: str, backfill: str, estimate: str = "requested"):
    result = replay(workload, cluster, PolicySet(queue, backfill, estimate), validate=True)
    return {j.id: j.start for j in result.jobs}, result


# Three one-core nodes.
#   A t=0 2 cores 10 s   starts at 0 (3 free)
#   B t=1 2 cores 10 s   blocked: 1 free. EASY shadow = 10 (A ends), extra = 3 - 2 = 1
#   C t=2 3 cores 10 s   blocked
#   D t=3 1 core 100 s   EASY: fits now, ends at 103 > shadow, but 1 <= extra: starts at 3.
#                        That is legal for the head B (still starts at 10) but delays C:
#                        C needs all 3 cores, so it waits for D until 103.
#   Conservative: C is reserved at 20 (after B), so D may not run across [20, 30): D goes at 30.
#   Without backfilling: strict order A 0, B 10, C 20, D 30.
THREE_CORES = Cluster(nodes=3)


def delaying() -> list[Job]:
    return jobs((0, 2, 10, 10), (1, 2, 10, 10), (2, 3, 10, 10), (3, 1, 100, 100))


def test_easy_protects_only_the_head() -> None:
    got, result = starts(delaying(), THREE_CORES, "fcfs", "easy")
    assert got == {1: 0, 2: 10, 3: 103, 4: 3}
    # The head B's reservation at the shadow time was 10, and it was kept.
    assert result.validator is not None
    assert (3.0, {2: 10.0}) in result.validator.reservation_log


def test_conservative_protects_every_reservation() -> None:
    got, _ = starts(delaying(), THREE_CORES, "fcfs", "conservative")
    assert got == {1: 0, 2: 10, 3: 20, 4: 30}


# Eight one-core nodes: the shape of a 40-job mix run through Slurm 22.05 (issue 12), where a
# 4-core job waited behind four later 1-core jobs.
#   1 t=0 4 cores run 99 (wall 300)   2 t=0 2 cores 150   3 t=0 2 cores 400: the cluster is full.
#   4 t=1 4 cores 500: reserved on arrival, while nothing is free, at 300 (job 2's 2 + job 1's 4).
#   5-8 t=2 1 core 100: 5, 6 at 150 (job 2's cores, back by 300), 7, 8 at 250 (2 free after 300).
# Job 1 ends at 99, 201 s early. Compressed in priority order, job 4 comes first: 4 cores stay free
# from 99 on, so it moves to 99, and 5-8 stay (nothing is left before them). Compressed in order of
# reservation start instead, 5-8 went first and took those 4 cores at 99: job 4 only at 199.
def test_conservative_compresses_in_priority_order() -> None:
    workload = jobs((0, 4, 99, 300), (0, 2, 150, 150), (0, 2, 400, 400), (1, 4, 500, 500), *[(2, 1, 100, 100)] * 4)
    got, result = starts(workload, Cluster(nodes=8), "fcfs", "conservative")
    assert got == {1: 0, 2: 0, 3: 0, 4: 99, 5: 150, 6: 150, 7: 250, 8: 250}
    assert result.validator is not None
    assert (1.0, {4: 300.0}) in result.validator.reservation_log


def test_no_backfill_is_strict_order() -> None:
    got, _ = starts(delaying(), THREE_CORES, "fcfs", "none")
    assert got == {1: 0, 2: 10, 3: 20, 4: 30}


# Four one-core nodes; walltimes overestimate runtimes here.
#   1 t=0 2 cores run 10 (wall 10)   starts 0
#   2 t=1 4 cores run 5  (wall 5)    head, blocked; shadow 10
#   3 t=2 2 cores run 5  (wall 20)   EASY with requested walltime: 2 + 20 = 22 > 10, extra 0: waits.
#                                    EASY-AR (actual runtime): 2 + 5 = 7 <= 10: backfills at 2.
#   4 t=3 1 core  run 2  (wall 2)    EASY: 3 + 2 = 5 <= 10: backfills at 3.
#                                    EASY-AR: jobs 1 and 3 hold all 4 cores; when 3 ends at 7,
#                                    7 + 2 = 9 <= 10: backfills at 7.
#   Job 2 starts at 10 either way; under EASY job 3 then runs at 15.
ESTIMATES = ((0, 2, 10, 10), (1, 4, 5, 5), (2, 2, 5, 20), (3, 1, 2, 2))


@pytest.mark.parametrize(
    ("estimate", "expected"),
    [("requested", {1: 0, 2: 10, 3: 15, 4: 3}), ("actual", {1: 0, 2: 10, 3: 2, 4: 7})],
)
def test_easy_uses_the_estimator(estimate: str, expected: dict[int, float]) -> None:
    got, _ = starts(jobs(*ESTIMATES), Cluster(nodes=4), "fcfs", "easy", estimate)
    assert got == expected


# One 4-core node, nothing running: three jobs at t=0 in the queue order of each policy.
#   1: 3 cores, wall 30    2: 2 cores, wall 10    3: 1 core, wall 20   (runtime = walltime)
# SJF (no backfill): 2 at 0 (2 free), then 3 at 0 (1 free), 1 waits for 2 cores+: at 10 only
#   3 free? job 2 ends at 10 -> 3 free: job 1 starts at 10.
# Largest first: 1 at 0 (1 free), then 2 blocked -> strict: 2 waits until 30, 3 after 2 ...
#   at 30 job 1 ends: 2 starts (30), 3 starts (30).
# Smallest first: 3 at 0, 2 at 0 (1 free left), 1 blocked until 10 (job 2 ends: 3 free).
ONE_NODE = Cluster(nodes=1, cores_per_node=4)
ORDERING = ((0, 3, 30, 30), (0, 2, 10, 10), (0, 1, 20, 20))


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        ("sjf", {1: 10, 2: 0, 3: 0}),
        ("largest", {1: 0, 2: 30, 3: 30}),
        ("smallest", {1: 10, 2: 0, 3: 0}),
        ("fcfs", {1: 0, 2: 30, 3: 30}),
        ("lcfs", {1: 0, 2: 30, 3: 30}),  # equal submit times keep arrival order
    ],
)
def test_queue_order(queue: str, expected: dict[int, float]) -> None:
    got, _ = starts(jobs(*ORDERING), ONE_NODE, queue, "none")
    assert got == expected


def test_wfp3_prefers_the_job_that_waited_longest_relative_to_its_length() -> None:
    # Two one-core nodes. Job 1 holds both until 100. Job 2 (1 core, wall 1000) waits from 0,
    # job 3 (2 cores, wall 50) from 90. At 100: score 2 = -(100/1000)^3 * 1 = -0.001,
    # score 3 = -(10/50)^3 * 2 = -0.016: job 3 is more urgent and starts first; FCFS would not.
    workload = ((0, 2, 100, 100), (0, 1, 10, 1000), (90, 2, 50, 50))
    wfp3, _ = starts(jobs(*workload), Cluster(nodes=2), "wfp3", "none")
    fcfs, _ = starts(jobs(*workload), Cluster(nodes=2), "fcfs", "none")
    assert wfp3 == {1: 0, 2: 150, 3: 100}
    assert fcfs == {1: 0, 2: 100, 3: 110}


def test_whole_node_allocation_does_not_share_nodes() -> None:
    # Two 8-core nodes, three 3-core jobs at t=0 running 10 s. Per core all fit (9 <= 16);
    # by whole nodes each takes a node, so the third waits for the first to end.
    workload = ((0, 3, 10, 10), (0, 3, 10, 10), (0, 3, 10, 10))
    per_core, _ = starts(jobs(*workload), Cluster(nodes=2, cores_per_node=8), "fcfs", "easy")
    per_node, run = starts(
        jobs(*workload), Cluster(nodes=2, cores_per_node=8, allocation=Allocation.NODE), "fcfs", "easy"
    )
    assert per_core == {1: 0, 2: 0, 3: 0}
    assert per_node == {1: 0, 2: 0, 3: 10}
    assert {j.id: j.slots for j in run.jobs}[3] == ((0, 8),)


def test_a_job_larger_than_the_cluster_is_rejected_and_the_rest_runs() -> None:
    result = replay(jobs((0, 2, 5, 5), (0, 9, 5, 5), (1, 1, 5, 5)), Cluster(nodes=4), validate=True)
    assert [j.id for j in result.rejected] == [2]
    assert result.rejected[0].state is JobState.FAILED
    assert sorted(j.id for j in result.jobs) == [1, 3]


def test_runs_last_their_runtime_cut_at_walltime() -> None:
    result = replay(jobs((0, 1, 50, 20), (0, 1, 5, 20)), Cluster(nodes=2), validate=True)
    ends = {j.id: j.end - j.start for j in result.jobs}
    assert ends == {1: 20, 2: 5}  # job 1 is killed at its walltime
    # and fails, as the daemon's review kills it: a workflow stops there, ASAx scores the kill 1
    assert {j.id: j.state for j in result.jobs} == {1: JobState.FAILED, 2: JobState.DONE}


@pytest.mark.parametrize("lending", [False, True])
def test_a_job_cut_at_its_walltime_fails_whether_or_not_others_share_cores(lending: bool) -> None:
    """H and G lend (Static, half of H to G) on node 0 while V overruns its walltime on node 1,
    sharing nothing: once any lending had happened, every later end was judged by a rate it never
    had, and V, killed at 200, ended `done` (an audit of the two worlds). It fails, as with none."""
    from cosched.policies.cosched import Static

    workload = jobs((0, 2, 50, 100), (0, 2, 500, 200), (0, 2, 50, 100))
    cosched = Static(0.5) if lending else "none"
    result = replay(workload, Cluster(nodes=2, cores_per_node=2), PolicySet("fcfs", "easy", cosched=cosched))
    states = {j.id: j.state for j in result.jobs}
    assert states == {1: JobState.DONE, 2: JobState.FAILED, 3: JobState.DONE}
    assert {j.id: j.end for j in result.jobs}[2] == 200
    assert ({j.id: j.start for j in result.jobs}[3] == 0) is lending  # G ran as H's guest


def core(cluster: Cluster) -> Scheduler:
    return Scheduler(cluster, FCFS(), EASY(), Requested(), FirstFit())


def test_cancel_pending_and_running_jobs() -> None:
    sched = core(Cluster(nodes=1))
    a, b = jobs((0, 1, 10, 10), (0, 1, 10, 10))
    decision = sched.step(0.0, [Offer(((0, 1),)), JobSubmitted(a), JobSubmitted(b)])
    assert [type(x) for x in decision.actions] == [Launch]
    assert sched.step(1.0, [JobCancelled(b.id)]).actions == []
    assert b.state is JobState.CANCELLED and sched.queue == []
    assert sched.step(2.0, [JobCancelled(a.id)]).actions == [Kill(a.id)]
    sched.step(2.5, [JobEnded(a.id), Offer(a.slots)])
    assert a.state is JobState.CANCELLED and a.end == 2.5 and sched.pool.free_units == 1
    assert sched.step(3.0, [JobCancelled(a.id)]).actions == []  # cancelling a finished job is a no-op


def test_held_offers_decide_what_launches() -> None:
    # No offer yet: nothing can start. A partial offer: still not the whole gang. Then it launches.
    sched = core(Cluster(nodes=2, cores_per_node=2))
    (big,) = jobs((0, 3, 10, 10))
    assert sched.step(0.0, [JobSubmitted(big)]).actions == []
    assert sched.step(1.0, [Offer(((0, 2),))]).actions == []
    launched = sched.step(2.0, [Offer(((1, 2),))]).actions
    assert launched == [Launch(big, ((0, 2), (1, 1)))]

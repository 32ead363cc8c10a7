"""Co-scheduling in the core and the simulated backend, on schedules worked out by hand.

The backend's default rate model is CPU-bound: a job runs at quota / cores of
its full speed. Every replay here runs through the validating wrapper, which
checks that guests stay inside their host's cores and that the CPU quotas on
an allocation never add up to more than its cores.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cosched.core.events import Colocate, JobEnded, JobSubmitted, Offer, SetQuota
from cosched.core.scheduler import Scheduler, host_quota
from cosched.core.view import SchedulerView
from cosched.errors import ConfigError
from cosched.model import Cluster, Job, JobState
from cosched.policies.base import Lending
from cosched.policies.cosched import Static
from cosched.policies.registry import create
from cosched.replay.driver import PolicySet, replay

ONE_NODE = Cluster(nodes=1, cores_per_node=4)
ONE_NODE_OF_TWO = Cluster(nodes=1, cores_per_node=2)


def job(id: int, submit: float, cores: int, runtime: float, **extra: object) -> Job:
    return Job(id=id, submit=submit, cores=cores, runtime=runtime, walltime=runtime * 3, **extra)


def run(jobs: list[Job], cluster: Cluster = ONE_NODE, cosched: object = "static"):
    result = replay(jobs, cluster, PolicySet("fcfs", "easy", cosched=cosched), validate=True)
    return {j.id: j for j in result.jobs}, result


def test_guest_borrows_half_and_the_host_gets_it_back() -> None:
    # A (4 cores, 100 s) fills the node at 0. B (2 cores, 50 s) arrives at 10: Static lends 50%
    # of A: B's quota = min(0.5 * 4, 2) = 2 CPUs, A keeps 2 of 4 -> A runs at half speed.
    # A: 10 s of work by t=10, 25 more by t=60 when B ends (B at full speed: 2 CPUs for 2 cores),
    # then full speed for the last 65: A ends at 125.
    jobs, result = run([job(1, 0, 4, 100), job(2, 10, 2, 50)])
    a, b = jobs[1], jobs[2]
    assert (b.start, b.end) == (10, 60)
    assert a.end == pytest.approx(125)
    assert b.host == 1 and b.slots == ((0, 2),)
    assert a.quota == 4.0  # restored when B left
    launches = result.validator.launch_log
    assert launches == [(0, 1), (10, 2)]


def test_host_ending_first_leaves_its_guest_the_cores_it_uses() -> None:
    # A (4 cores, 20 s) from 0; B (2 cores, 100 s) joins at 10 with 2 CPUs: A is halved, so its last
    # 10 s of work take 20 s: A ends at 30. B keeps its 2 cores (speed 1 throughout): ends at 110.
    # The other 2 cores come back at 30, where C (2 cores, 10 s, queued since 15) starts at once.
    jobs, _ = run([job(1, 0, 4, 20), job(2, 10, 2, 100), job(3, 15, 2, 10)], cosched=Static())
    a, b, c = jobs[1], jobs[2], jobs[3]
    assert a.end == pytest.approx(30)
    assert (b.start, b.end) == (10, 110)
    assert b.host == -1  # adopted: an ordinary job on its own slots after A ended
    assert c.start == pytest.approx(30) and c.host == -1


def test_at_most_two_jobs_share_an_allocation_by_default() -> None:
    # B borrows from A at 5; C arrives at 6 and, with A already hosting, must wait for cores.
    jobs, _ = run([job(1, 0, 4, 100), job(2, 5, 2, 500), job(3, 6, 2, 10)])
    assert jobs[2].start == 5  # a guest at once (adopted as an ordinary job when A ends)
    assert jobs[3].start >= jobs[1].end


def test_memory_is_never_oversubscribed() -> None:
    # 1000 MiB node. A holds 4 x 100 = 400. B needs 2 x 200 = 400: it fits beside A (600 free).
    # C needs 2 x 400 = 800 > 600: it may not share A's cores, it waits.
    cluster = Cluster(nodes=1, cores_per_node=4, memory_per_node=1000)
    jobs, _ = run([job(1, 0, 4, 100, memory=100), job(2, 5, 2, 50, memory=200)], cluster)
    assert jobs[2].host == 1
    jobs, _ = run([job(1, 0, 4, 100, memory=100), job(3, 5, 2, 50, memory=400)], cluster)
    assert jobs[3].host == -1 and jobs[3].start >= jobs[1].end


class _Lends(Static):
    """Lends the first host each fraction in turn, as ASAx lends each guest what its experts say."""

    def __init__(self, *fractions: float) -> None:
        super().__init__()
        self.fractions = list(fractions)

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        return Lending(hosts[0], self.fractions.pop(0))


def test_a_host_whose_guests_left_has_exactly_its_cores_again() -> None:
    # A (2 cores) lends 10% to B and 20% to C (three may share); C, then B, ends. Given and taken
    # back one by one, A's quota came back as 1.7999999999999998 then 1.9999999999999998 CPUs, and a
    # restart, which works it out from the guests, saw a lending change where none was. One rule now
    # (`host_quota`).
    core = Scheduler(
        ONE_NODE_OF_TWO,
        *[create(kind, name) for kind, name in [("queue", "fcfs"), ("backfill", "easy")]],
        create("estimate", "requested"),
        create("placement", "first-fit"),
        _Lends(0.1, 0.2),
        sharing=3,
    )
    core.step(0.0, [Offer(((0, 2),)), JobSubmitted(job(1, 0, 2, 1000))])
    core.step(10.0, [JobSubmitted(job(2, 10, 2, 100))])
    core.step(20.0, [JobSubmitted(job(3, 20, 2, 100))])
    assert core.jobs[1].quota == host_quota(core.jobs[1], core.guests[1])
    assert [guest.quota for guest in core.guests[1]] == [0.2, 0.4]
    quotas = []
    for at, guest in ((30.0, 3), (40.0, 2)):
        decision = core.step(at, [JobEnded(guest, failed=False, at=at)])
        quotas += [action.cpus for action in decision.actions if isinstance(action, SetQuota)]
    assert quotas == [1.8, 2.0] and core.jobs[1].quota == 2.0


def test_space_sharing_never_lends() -> None:
    jobs, _ = run([job(1, 0, 4, 100), job(2, 10, 2, 50)], cosched="none")
    assert jobs[2].start == 100 and jobs[2].host == -1


def test_core_emits_quota_then_colocate() -> None:
    from cosched.core.events import JobSubmitted, Offer
    from cosched.core.scheduler import Scheduler
    from cosched.policies.backfill import EASY
    from cosched.policies.estimate import Requested
    from cosched.policies.placement import FirstFit
    from cosched.policies.queue import FCFS

    core = Scheduler(ONE_NODE, FCFS(), EASY(), Requested(), FirstFit(), Static(0.25))
    a, b = job(1, 0, 4, 100), job(2, 0, 1, 50)
    actions = core.step(0.0, [Offer(((0, 4),)), JobSubmitted(a), JobSubmitted(b)]).actions
    # 25% of A's 4 cores is 1 CPU: exactly B's one core.
    assert actions[1:] == [SetQuota(1, 3.0, 0.0), Colocate(b, 1, ((0, 1),), 1.0)]
    assert b.state is JobState.RUNNING and core.guests == {1: [b]}


def test_bad_lending_settings() -> None:
    with pytest.raises(ConfigError, match="fraction"):
        Static(1.5)


def test_every_queued_job_in_the_window_is_offered() -> None:
    # Two 8-core hosts run; three 1-core jobs queue behind a blocked 16-core head. Static lends
    # each host once (two jobs per allocation), so exactly two of the three small jobs become
    # guests in the same pass: the second must not be skipped when the first leaves the queue.
    cluster = Cluster(nodes=2, cores_per_node=8)
    jobs, result = run(
        [job(1, 0, 8, 100), job(2, 0, 8, 100), job(3, 1, 16, 10), job(4, 2, 1, 5), job(5, 2, 1, 5), job(6, 2, 1, 5)],
        cluster,
    )
    guests_at_2 = [jid for t, jid in result.validator.launch_log if t == 2]
    assert guests_at_2 == [4, 5]
    assert {jobs[4].slots, jobs[5].slots} == {((0, 1),), ((1, 1),)}  # one in each host


class _Never(Static):
    name = "never"

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        return None


def test_the_core_says_why_each_job_it_offered_for_co_scheduling_was_not_lent_to() -> None:
    # Two 2-core jobs fill a 4-core node of 1,000 MiB, 600 free. Behind them: a 4-core job (no host
    # that large), a 2-core job of 800 MiB (no memory beside them), and a 1-core job the policy
    # lends nothing. `cosched queue` showed Resources and Priority alone beside idle allocations.
    cluster = Cluster(nodes=1, cores_per_node=4, memory_per_node=1000)
    core = _core(cluster, _Never())
    running = [job(1, 0, 2, 100, memory=100), job(2, 0, 2, 100, memory=100)]
    queued = [job(3, 1, 4, 10), job(4, 1, 2, 10, memory=400), job(5, 1, 1, 10, memory=10)]
    core.step(1.0, [Offer(((0, 4),), (1000,)), *(JobSubmitted(j) for j in running + queued)])
    assert [j.id for j in core.running] == [1, 2]
    shown = {i: why.format(cores=4, policy="never", job=i) for i, why in core.not_lent.items()}
    assert shown == {
        3: "no running job of 4+ cores",
        4: "no host with its memory free beside it",
        5: "never decided not to lend to it (cosched explain 5)",
    }


class _AsksOnce(Static):
    """Asks each host once per guest (as ASAx does) and lends nothing."""

    name = "once"

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[tuple[int, int]] = set()

    def candidates(self, guest: Job, running: Sequence[Job]) -> Sequence[Job]:
        return [h for h in running if (guest.id, h.id) not in self.asked]

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        self.asked.update((guest.id, h.id) for h in hosts)
        return None


def test_a_guest_every_host_declined_says_so_until_a_new_host_may_be_asked() -> None:
    """ASAx asks each host once per guest: a pass after it lent nothing, `queue` said `no host to ask
    now: each was asked before, or has no usage sample yet` (a helper's walkthrough), where the docs
    promise `asax decided not to lend to it`. That stands until there is a host to ask."""
    policy = _AsksOnce()
    core = _core(ONE_NODE, policy)
    runner, head, guest = job(1, 0, 4, 100), job(2, 1, 4, 10), job(3, 1, 1, 10)
    core.step(1.0, [Offer(((0, 4),)), JobSubmitted(runner), JobSubmitted(head), JobSubmitted(guest)])
    lent_nothing = "once decided not to lend to it (cosched explain 3)"
    assert core.not_lent[3].format(cores=1, policy="once", job=3) == lent_nothing
    core.step(2.0, [])
    assert core.not_lent[3].format(cores=1, policy="once", job=3) == lent_nothing
    policy.asked.clear()  # a host it may ask again: asked, and its word is the new one
    core.step(3.0, [])
    assert (3, 1) in policy.asked and core.not_lent[3].format(cores=1, policy="once", job=3) == lent_nothing


@pytest.mark.parametrize("case", ["opted out", "guests already", "no sample"])
def test_the_core_tells_apart_why_no_running_job_takes_a_guest(case: str) -> None:
    # A 4-core job runs alone on a 4-core node, and a 1-core job waits behind a 4-core head. The
    # runner opted out of lending, or (Static) already has its guest, or (ASAx) was never measured:
    # "no running job of 1+ cores takes a guest" was said for the first two beside a running
    # 4-core job, and ASAx was said to lend nothing where it had not decided (a helper's walkthrough).
    policy = create("cosched", "asax") if case == "no sample" else Static()
    core = _core(ONE_NODE, policy)
    runner = job(1, 0, 4, 100, coschedule=case != "opted out")
    waiting = [job(2, 1, 4, 10), job(3, 1, 1, 10)] + ([job(4, 1, 1, 10)] if case == "guests already" else [])
    core.step(1.0, [Offer(((0, 4),)), JobSubmitted(runner), *(JobSubmitted(j) for j in waiting)])
    shown = core.not_lent[waiting[-1].id].format(cores=1, sharing=2)
    assert (
        shown
        == {
            "opted out": "the running jobs of 1+ cores do not lend (--no-cosched)",
            "guests already": "each running job of 1+ cores that lends has its guests already (sharing = 2)",
            "no sample": "no host to ask now: each was asked before, or has no usage sample yet",
        }[case]
    )


def _core(cluster: Cluster, cosched: object = None):
    from cosched.core.scheduler import Scheduler
    from cosched.policies.backfill import EASY
    from cosched.policies.estimate import Requested
    from cosched.policies.placement import FirstFit
    from cosched.policies.queue import FCFS

    return Scheduler(cluster, FCFS(), EASY(), Requested(), FirstFit(), cosched)


def test_a_requeued_job_goes_back_to_its_place_in_the_queue_and_gives_nothing_back() -> None:
    # Two 2-core nodes. A (2 cores) and B (2 cores) run, C (2 cores, submitted after both) waits.
    # A's machine goes away: A is queued again AHEAD of C (its submission is older), its slots
    # are not offered back (they may be gone), and when they are, A starts there first.
    from cosched.core.events import JobRequeued, JobSubmitted, Launch, Offer

    core = _core(Cluster(nodes=2, cores_per_node=2))
    a, b, c = job(1, 0, 2, 100), job(2, 1, 2, 100), job(3, 2, 2, 100)
    actions = core.step(3.0, [Offer(((0, 2), (1, 2))), JobSubmitted(a), JobSubmitted(b), JobSubmitted(c)]).actions
    assert [x.job.id for x in actions if isinstance(x, Launch)] == [1, 2]
    assert core.step(10.0, [JobRequeued(1)]).actions == []
    assert a.state is JobState.PENDING and (a.slots, a.host, a.start) == ((), -1, -1.0)
    assert [j.id for j in core.queue] == [1, 3] and core.pool.free_units == 0
    assert [j.id for j in core.running] == [2]
    [launch] = core.step(20.0, [Offer(((0, 2),))]).actions
    assert launch == Launch(a, ((0, 2),)) and a.start == 20.0


def test_a_requeued_job_goes_back_before_the_jobs_of_its_submission_time_behind_it() -> None:
    # An array's tasks share a submission time: task 1 requeued went after tasks 2 and 3, and ran
    # last (an operator's walkthrough). Among equal priorities it goes back to its place by id.
    from cosched.core.events import JobRequeued, JobSubmitted, Offer

    core = _core(Cluster(nodes=1, cores_per_node=2))
    tasks = [job(i, 0, 2, 100) for i in (1, 2, 3)]
    core.step(0.0, [Offer(((0, 2),)), *(JobSubmitted(t) for t in tasks)])
    assert [j.id for j in core.queue] == [2, 3]
    core.step(10.0, [JobRequeued(1)])
    assert [j.id for j in core.queue] == [1, 2, 3]


def test_a_requeued_job_is_ordered_by_an_aging_policy_like_any_other() -> None:
    # WFP3 keeps the queue's submit times and weights in arrays beside it: a requeued job must
    # enter them too, or every later order reads another job's numbers (or past the arrays' end).
    from cosched.core.events import JobRequeued, JobSubmitted, Launch, Offer
    from cosched.core.scheduler import Scheduler
    from cosched.policies.backfill import EASY
    from cosched.policies.estimate import Requested
    from cosched.policies.placement import FirstFit
    from cosched.policies.queue import WFP3

    core = Scheduler(Cluster(nodes=2, cores_per_node=2), WFP3(), EASY(), Requested(), FirstFit())
    a, b, c = job(1, 0, 2, 100), job(2, 1, 2, 100), job(3, 2, 2, 100)
    actions = core.step(3.0, [Offer(((0, 2), (1, 2))), JobSubmitted(a), JobSubmitted(b), JobSubmitted(c)]).actions
    assert [x.job.id for x in actions if isinstance(x, Launch)] == [1, 2]
    core.step(10.0, [JobRequeued(1)])
    # A waited longest (submitted at 0): WFP3 puts it first, ahead of C.
    assert [j.id for j in core.view(50.0).queue] == [1, 3]
    [launch] = core.step(50.0, [Offer(((0, 2),))]).actions
    assert launch.job is a


def test_a_requeued_host_leaves_its_guest_running_on_its_share() -> None:
    from cosched.core.events import JobRequeued, JobSubmitted, Offer, SetQuota

    core = _core(ONE_NODE, Static(0.5))
    host, guest = job(1, 0, 4, 100), job(2, 0, 2, 50)
    core.step(0.0, [Offer(((0, 4),)), JobSubmitted(host), JobSubmitted(guest)])
    assert guest.host == 1
    actions = core.step(5.0, [JobRequeued(1)]).actions
    assert SetQuota(2, 2.0, 5.0) in actions  # the guest keeps its cores as an ordinary job
    assert guest.host == -1 and core.guests == {} and [j.id for j in core.queue] == [1]
    core.step(6.0, [JobRequeued(2)])
    assert [j.id for j in core.queue] == [1, 2] and core.running == []


def test_a_requeued_job_being_cancelled_is_cancelled() -> None:
    from cosched.core.events import JobCancelled, JobRequeued, JobSubmitted, Kill, Offer
    from cosched.errors import SchedulingError

    core = _core(ONE_NODE)
    a = job(1, 0, 4, 100)
    core.step(0.0, [Offer(((0, 4),)), JobSubmitted(a)])
    assert core.step(1.0, [JobCancelled(1)]).actions == [Kill(1)]
    core.step(2.0, [JobRequeued(1)])
    assert a.state is JobState.CANCELLED and core.queue == [] and 1 not in core.jobs
    with pytest.raises(SchedulingError, match="not running"):
        core.step(3.0, [JobRequeued(1)])


def test_a_job_that_may_not_span_nodes_and_fits_none_is_rejected() -> None:
    from cosched.core.events import JobSubmitted, Offer, Reject

    core = _core(Cluster(nodes=2, cores_per_node=2))
    wide = job(1, 0, 3, 10, span=False)
    [reject] = core.step(0.0, [Offer(((0, 2), (1, 2))), JobSubmitted(wide)]).actions
    assert isinstance(reject, Reject) and reject.reason == "job 1 needs 3 cores on one node, nodes have 2"


def test_a_requeued_job_under_conservative_backfilling_gets_a_new_reservation_on_what_is_free() -> None:
    # One 4-core node. A (4 cores, wall 300) runs from 1; B (4 cores) is reserved at A's end, 301.
    # A's machine goes away at 10 and its cores are not offered back: the plan is rebuilt from
    # what is free, so neither B nor A (queued again ahead of B) starts on cores that are gone.
    from cosched.core.events import JobRequeued, JobSubmitted, Launch, Offer
    from cosched.core.scheduler import Scheduler
    from cosched.policies.conservative import Conservative
    from cosched.policies.estimate import Requested
    from cosched.policies.placement import FirstFit
    from cosched.policies.queue import FCFS

    core = Scheduler(ONE_NODE, FCFS(), Conservative(), Requested(), FirstFit())
    a, b = job(1, 0, 4, 100), job(2, 1, 4, 100)
    decision = core.step(1.0, [Offer(((0, 4),)), JobSubmitted(a), JobSubmitted(b)])
    assert [x.job.id for x in decision.actions if isinstance(x, Launch)] == [1]
    assert decision.reservations[2] == 301.0
    decision = core.step(10.0, [JobRequeued(1)])
    assert decision.actions == [] and [j.id for j in core.queue] == [1, 2]
    # Nothing is free until the cores come back: no reservation may claim them before then.
    assert decision.reservations == {} or min(decision.reservations.values()) > 10.0
    [launch] = core.step(20.0, [Offer(((0, 4),))]).actions
    assert launch == Launch(a, ((0, 4),))

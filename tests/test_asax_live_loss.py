"""ASAx's `live` loss: a lender's slowdown against its runtime alone, as a live scheduler knows it.

No oracle: the runtime alone comes from jobs of the same class and cores that neither lent
nor were guests; a lender whose kind never ran alone is held against its own pace (the CPUs
it kept busy alone and while it lent).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cosched.daemon.store import Store
from cosched.model import Cluster, Job, JobState, Usage
from cosched.policies.asax import ASAx, LendingDecision, loss_outcome
from cosched.replay.driver import PolicySet, replay
from experts.baselines import RuntimeBaselines, Stretch, paced_runtime_alone, shared_speed
from experts.loss import degradation_loss
from experts.tree import Expert, ExpertSet, Leaf

HALF = ExpertSet((Expert("half", Leaf((0.0, 1.0))),))
"""One expert that always lends 50% (action 1 of a 2-action grid)."""


def test_runtime_alone_is_the_median_of_the_last_runs_and_survives_a_restart() -> None:
    baselines = RuntimeBaselines(keep=3)
    assert baselines.expected(("x", 4)) is None
    for runtime in (100.0, 400.0, 110.0, 120.0):  # the first falls out of the last 3
        baselines.add(("x", 4), runtime)
    assert baselines.expected(("x", 4)) == 120.0
    assert baselines.expected(("x", 8)) is None
    again = RuntimeBaselines.from_state(baselines.to_state())
    assert again.expected(("x", 4)) == 120.0 and again.keep == 3


def _lend_half(first_alone: bool) -> tuple[ASAx, dict[int, Job], list[float | None]]:
    """A (4 cores, 100 s alone) lends half to B from the first sample at 5 s until B ends: it
    runs 125 s. With `first_alone`, C, the same kind as A, ran alone before A started."""
    offset = 200.0 if first_alone else 0.0
    jobs = [
        Job(id=1, submit=offset, cores=4, runtime=100.0, walltime=400.0, stage="x"),
        Job(id=2, submit=offset + 1.0, cores=2, runtime=50.0, walltime=400.0, stage="y"),
    ]
    if first_alone:
        jobs.append(Job(id=3, submit=0.0, cores=4, runtime=100.0, walltime=400.0, stage="x"))
    policy = ASAx(HALF, loss="live", min_guest_share=0.0)
    seen: list[float | None] = []
    original = policy.observe

    def observe(job: Job, now: float) -> None:
        original(job, now)
        if job.id == 1:
            seen.append(policy.decisions[0].loss)

    policy.observe = observe  # type: ignore[method-assign]
    result = replay(jobs, Cluster(nodes=1, cores_per_node=4), PolicySet(cosched=policy), sample_every=5.0)
    return policy, {j.id: j for j in result.jobs}, seen


def test_a_lender_whose_kind_never_ran_alone_is_scored_at_its_end_by_its_own_pace() -> None:
    """A kept 4 CPUs busy alone and 2 while it lent (its usage sampled during the lending): it
    ran at half speed for B's 50 s, so it lost 25 s and its runtime alone was 100 s. The loss,
    a 25% slowdown on the 50%-is-1 scale, is 0.5, known when A ends: no run alone is needed."""
    policy, jobs, seen = _lend_half(first_alone=False)
    a = jobs[1]
    assert a.end - a.start == pytest.approx(125.0)
    [decision] = policy.decisions
    assert (decision.host, decision.guest, decision.fraction, decision.host_cores) == (1, 2, 0.5, 4)
    assert seen == [pytest.approx(0.5)]  # scored at A's end
    assert decision.host_runtime == pytest.approx(125.0)
    assert decision.baseline == pytest.approx(100.0)
    assert decision.note.startswith("its own pace")
    assert policy.baselines.expected(("x", 4)) is None  # A lent: its 125 s are no runtime alone
    assert policy.baselines.expected(("y", 2)) is None  # B was a guest: not a runtime alone either


def test_a_lender_whose_kind_ran_alone_is_held_against_that_runtime() -> None:
    policy, _, seen = _lend_half(first_alone=True)
    [decision] = policy.decisions
    assert decision.host == 1 and seen == [pytest.approx(0.5)]
    assert decision.baseline == pytest.approx(100.0) and decision.note == "runtime alone of its kind"
    assert policy.baselines.expected(("x", 4)) == pytest.approx(100.0)


def test_the_pace_estimate_counts_only_the_time_lent_at_the_speed_measured() -> None:
    assert shared_speed(4.0, 2.0, 2.0, 4) == 0.5  # a CPU-bound lender throttled to half its cores
    assert shared_speed(4.0, None, 3.0, 4) == 0.75  # no sample in the lending: the quota it kept
    assert shared_speed(1.0, 1.5, 2.0, 4) == 1.0  # busier than alone, quota to spare: not slowed
    assert shared_speed(0.0, 0.0, 1.0, 4) == 1.0  # an idle lender loses nothing
    assert shared_speed(0.1, 2.0, 2.0, 4) == 0.5  # idle when asked, then held to its quota: it grew
    stretches = [Stretch(10.0, 60.0, 0.5), Stretch(100.0, 120.0, 0.75)]
    assert paced_runtime_alone(200.0, stretches) == pytest.approx(200.0 - 25.0 - 5.0)


def test_happiness_without_progress_comes_from_the_runtime_alone() -> None:
    policy = ASAx(HALF, loss="live")
    job = Job(id=1, submit=0.0, cores=4, walltime=400.0, stage="x")
    job.start, job.usage = 0.0, Usage(0.5, 0.1, 0, 0.0)
    assert policy.features(job, 50.0).happiness == 1.0  # no pace, nothing known: "on pace"
    policy.baselines.add(("x", 4), 100.0)
    assert policy.features(job, 50.0).happiness == pytest.approx(350.0 / 50.0)


def _waiting(**changes: object) -> LendingDecision:
    body = dict(
        time=100.0,
        guest=2,
        host=1,
        host_cores=4,
        app_class="x",
        features={"cpu": 1.0},
        experts=["half"],
        distributions=[[0.0, 1.0]],
        weights=[1.0],
        action=1,
        fraction=0.5,
    )
    return LendingDecision(**{**body, **changes})  # type: ignore[arg-type]


def test_a_restarted_daemon_scores_a_lending_pending_at_the_restart_when_its_lender_ends(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        store.save_decision(db, 1, _waiting().as_dict())
        store.save_decision(db, 2, _waiting(seq=1, loss=0.2, host_runtime=90.0).as_dict())
    needed = store.decisions_needed(recent=2)
    assert [d["loss"] for d in needed] == [None, 0.2]
    policy = ASAx(HALF, loss="live")
    policy.restore([LendingDecision(**d) for d in needed])
    lender = Job(id=1, submit=0.0, cores=4, walltime=400.0, stage="x")
    lender.start, lender.end, lender.quota = 0.0, 150.0, 2.0  # still lending half when it ended
    lender.state = lender.state.DONE
    policy.observe(lender, 150.0)
    decision = policy.decisions[0]
    # Busy on 4 CPUs alone (CPU% 1.0 of 4 cores), 2 left to it from 100 s to its end: 25 s lost.
    assert decision.baseline == pytest.approx(125.0)
    assert decision.loss == pytest.approx(degradation_loss(150.0, 125.0))
    assert decision in policy.resolved


def test_a_lending_an_older_daemon_left_unscored_is_scored_by_its_kind_or_says_why_not() -> None:
    old = _waiting(host_runtime=125.0)  # its lender ended before paces were estimated
    policy = ASAx(HALF, loss="live")
    policy.baselines.add(("x", 4), 100.0)
    policy.restore([old])
    assert old.loss == pytest.approx(0.5) and old.note == "runtime alone of its kind"
    unknown = _waiting(host_runtime=125.0)
    ASAx(HALF, loss="live").restore([unknown])
    assert unknown.loss is None and unknown.note.startswith("none:")
    assert loss_outcome(unknown.as_dict()) == unknown.note


def test_a_cancelled_or_crashed_lender_teaches_nothing() -> None:
    for state, runtime, expected in (("cancelled", 30.0, None), ("failed", 30.0, None), ("failed", 400.0, 1.0)):
        policy = ASAx(HALF, loss="live")
        policy.restore([_waiting()])
        lender = Job(id=1, submit=0.0, cores=4, walltime=400.0, stage="x")
        lender.start, lender.end, lender.quota = 0.0, runtime, 2.0
        lender.state = JobState(state)
        policy.observe(lender, runtime)
        decision = policy.decisions[0]
        assert decision.loss == expected, state
        assert policy.book.get("x").ledger.cases == (expected is not None)
        assert loss_outcome(decision.as_dict()).startswith("none:" if expected is None else "1.000")


def test_a_requeued_lenders_pending_lending_is_resolved_unscored_and_its_next_run_is_one_alone() -> None:
    """A's machine is lost while A lends half to B: the lending is resolved at once, without a
    loss (the lost run says nothing, as a crashed lender's), not scored at A's next end against
    that run's runtime. A's next run, alone, is a runtime alone of its kind; B's is not."""
    from cosched.core.events import JobEnded, JobRequeued, JobSubmitted, Offer, UsageReported
    from cosched.core.scheduler import Scheduler
    from cosched.policies.backfill import EASY
    from cosched.policies.estimate import Requested
    from cosched.policies.placement import FirstFit
    from cosched.policies.queue import FCFS

    policy = ASAx(HALF, loss="live", min_guest_share=0.0)
    core = Scheduler(Cluster(nodes=1, cores_per_node=4), FCFS(), EASY(), Requested(), FirstFit(), policy)
    a = Job(id=1, submit=0.0, cores=4, walltime=400.0, stage="x")
    b = Job(id=2, submit=1.0, cores=2, walltime=400.0, stage="y")
    core.step(0.0, [Offer(((0, 4),)), JobSubmitted(a)])
    core.step(5.0, [UsageReported(1, Usage(1.0, 0.1, 0, 5.0, 4.0)), JobSubmitted(b)])
    [decision] = policy.decisions
    assert (decision.host, decision.guest, decision.fraction) == (1, 2, 0.5) and b.host == 1
    core.step(20.0, [JobRequeued(1)])  # A's machine went away; B runs on as an ordinary job
    assert decision in policy.resolved and decision.loss is None and decision.note.startswith("none:")
    assert loss_outcome(decision.as_dict()) == decision.note
    assert policy.book.get("x").ledger.cases == 0  # nothing learned from the lost run
    core.step(60.0, [JobEnded(2), Offer(((0, 4),))])  # B left, the node is back: A runs again, alone
    assert a.start == 60.0
    core.step(160.0, [JobEnded(1)])
    assert decision.loss is None and decision.host_runtime is None  # not scored against the new run
    assert policy.baselines.expected(("x", 4)) == pytest.approx(100.0)  # the new run was one alone
    assert policy.baselines.expected(("y", 2)) is None  # B was a guest


def test_each_lending_of_a_lender_is_learnt_by_the_learner_it_was_decided_with() -> None:
    """A lender's lendings were all charged to its first one's learner: after a restart with
    another `learner`, a restored lending and a new one about the same lender landed in one (an
    audit of ASAx's live learning). Each goes to its own."""
    policy = ASAx(HALF, loss="live")
    policy.restore([_waiting(learner="x"), _waiting(seq=1, guest=3, learner="all")])
    lender = Job(id=1, submit=0.0, cores=4, walltime=400.0, stage="x")
    lender.start, lender.end, lender.quota = 0.0, 150.0, 2.0
    lender.state = JobState.DONE
    policy.observe(lender, 150.0)
    assert [policy.book.get(learner).ledger.cases for learner in ("x", "all")] == [1, 1]

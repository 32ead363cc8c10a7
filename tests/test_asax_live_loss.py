"""ASAx's `live` loss: a lender's slowdown against the runtime alone of its kind, learned online.

No oracle: the runtime alone comes from jobs of the same class and cores that neither lent
nor were guests; a lender that ends before any such job is scored once one has.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cosched.daemon.store import Store
from cosched.model import Cluster, Job, Usage
from cosched.policies.asax import ASAx, LendingDecision
from cosched.replay.driver import PolicySet, replay
from experts.baselines import RuntimeBaselines
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


def test_a_lenders_loss_waits_for_a_run_alone_of_its_kind_then_is_its_slowdown() -> None:
    """A (4 cores, 100 s alone) lends half to B from the first sample at 5 s until B ends: it
    runs 125 s. No ("x", 4) job has run alone then, so the loss waits; C, the same kind alone,
    takes 100 s: A's loss is the 25% slowdown on the 50%-is-1 scale, 0.5."""
    jobs = [
        Job(id=1, submit=0.0, cores=4, runtime=100.0, walltime=400.0, stage="x"),
        Job(id=2, submit=1.0, cores=2, runtime=50.0, walltime=400.0, stage="y"),
        Job(id=3, submit=1000.0, cores=4, runtime=100.0, walltime=400.0, stage="x"),
    ]
    policy = ASAx(HALF, loss="live", min_guest_share=0.0)
    seen: list[float | None] = []
    original = policy.observe

    def observe(job: Job, now: float) -> None:
        original(job, now)
        if job.id == 1:
            seen.append(policy.decisions[0].loss)

    policy.observe = observe  # type: ignore[method-assign]
    result = replay(jobs, Cluster(nodes=1, cores_per_node=4), PolicySet(cosched=policy), sample_every=5.0)
    a = next(j for j in result.jobs if j.id == 1)
    assert a.end - a.start == pytest.approx(125.0)
    [decision] = policy.decisions
    assert (decision.host, decision.guest, decision.fraction, decision.host_cores) == (1, 2, 0.5, 4)
    assert seen == [None]  # A ended with nothing to compare with
    assert decision.host_runtime == pytest.approx(125.0)
    assert decision.loss == pytest.approx(0.5)  # scored when C ran alone
    assert policy.baselines.expected(("x", 4)) == pytest.approx(100.0)
    assert policy.baselines.expected(("y", 2)) is None  # B was a guest: not a runtime alone


def test_happiness_without_progress_comes_from_the_runtime_alone() -> None:
    policy = ASAx(HALF, loss="live")
    job = Job(id=1, submit=0.0, cores=4, walltime=400.0, stage="x")
    job.start, job.usage = 0.0, Usage(0.5, 0.1, 0, 0.0)
    assert policy.features(job, 50.0).happiness == 1.0  # no pace, nothing known: "on pace"
    policy.baselines.add(("x", 4), 100.0)
    assert policy.features(job, 50.0).happiness == pytest.approx(350.0 / 50.0)


def test_a_restarted_daemon_takes_back_lendings_still_waiting_for_a_run_alone(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.sqlite")
    waiting = LendingDecision(
        time=1.0,
        guest=2,
        host=1,
        host_cores=4,
        app_class="x",
        features={},
        experts=["half"],
        distributions=[[0.0, 1.0]],
        weights=[1.0],
        action=1,
        fraction=0.5,
        host_runtime=125.0,
    )
    scored = LendingDecision(**{**waiting.as_dict(), "seq": 1, "loss": 0.2})
    with store.transaction() as db:
        store.save_decision(db, 1, waiting.as_dict())
        store.save_decision(db, 2, scored.as_dict())
    needed = store.decisions_needed(recent=0)  # neither is recent, no job is live
    assert [d["loss"] for d in needed] == [None]
    policy = ASAx(HALF, loss="live")
    policy.restore([LendingDecision(**d) for d in needed])
    done = Job(id=9, submit=0.0, cores=4, walltime=400.0, stage="x")
    done.start, done.end = 0.0, 100.0
    done.state = done.state.DONE
    policy.observe(done, 100.0)
    assert policy.decisions[0].loss == pytest.approx(0.5)

"""ASAx in replay: what it learns, how it decides, and the paper's experiment end to end."""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from types import SimpleNamespace

import pytest

from cosched.errors import ConfigError
from cosched.experiments.asax import APPS, Experiment, run_once
from cosched.model import Cluster, Job, JobState, Usage
from cosched.policies.asax import LEARNERS, ASAx
from cosched.replay.driver import PolicySet, replay
from experts.weights import Schedule


class TwoKinds:
    """A world with a clear answer: lending slows a CPU-bound job in proportion to
    what it lends, and costs an I/O-bound job nothing."""

    def speed(self, job: Job, quota: float, neighbours: object) -> float:
        return min(1.0, quota / job.cores) if job.stage == "cpu" else 1.0

    def usage(self, job: Job, quota: float, speed: float) -> tuple[float, float]:
        if job.stage == "cpu":
            return 0.97 * min(1.0, quota / job.cores), 0.4
        return 0.3, 0.1


def two_kinds(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 40)
        run = rng.uniform(300, 900)
        kind = "cpu" if i % 2 else "io"
        jobs.append(Job(id=i + 1, submit=t, cores=8, walltime=2 * run, runtime=run, tasks=20, stage=kind))
    return jobs


def lending_share(decisions: list, app_class: str) -> float:
    chosen = [d.fraction > 0 for d in decisions if d.app_class == app_class]
    return sum(chosen) / len(chosen)


def test_asax_learns_to_stop_lending_from_cpu_bound_jobs() -> None:
    # min_guest_share=0: every sampled lending is carried out, so this is Algorithm 1 alone.
    policy = ASAx(seed=3, loss="degradation", schedule=Schedule("constant", gamma=0.5), min_guest_share=0.0)
    cluster = Cluster(nodes=4, cores_per_node=8)
    for warmup in range(2):
        replay(two_kinds(200, warmup), cluster, PolicySet("fcfs", "easy", cosched=policy), rates=TwoKinds())
    early = policy.decisions[:60]
    after = len(policy.decisions)
    replay(two_kinds(200, 99), cluster, PolicySet("fcfs", "easy", cosched=policy), rates=TwoKinds())
    late = policy.decisions[after:]

    cpu, io = policy.book.get("cpu"), policy.book.get("io")
    # Lending from CPU-bound jobs was paid for: the weight went to the expert that says "busy: lend 0%".
    assert cpu.alpha[policy.experts.names.index("cpu")] > 0.9
    # Lending from I/O-bound jobs never cost anything: no risk, no round, weights untouched.
    assert cpu.t > 0 and io.t == 0
    assert max(io.alpha) == pytest.approx(0.25)
    # Shown in behaviour: after the warm-up CPU-bound jobs rarely lend, I/O-bound ones keep lending.
    assert lending_share(late, "cpu") < 0.15 < lending_share(early, "cpu")
    assert lending_share(late, "io") > 0.5


def test_declining_costs_nothing_and_each_pair_is_asked_once() -> None:
    policy = ASAx(seed=1, loss="degradation")
    replay(
        two_kinds(120, 1),
        Cluster(nodes=2, cores_per_node=8),
        PolicySet("fcfs", "easy", cosched=policy),
        rates=TwoKinds(),
        validate=True,
    )
    assert policy.decisions
    pairs = [(d.guest, d.host) for d in policy.decisions]
    assert len(pairs) == len(set(pairs))
    for d in policy.decisions:
        if d.fraction == 0:
            assert d.loss == 0.0
        elif not d.executed:
            assert d.loss is None  # refused: too little for the guest (min_guest_share)
        else:
            assert d.loss is not None and 0.0 <= d.loss <= 1.0  # every lender has ended by now
    some = policy.decisions[0]
    assert some in policy.explain(some.host) and some in policy.explain(some.guest)


def test_min_guest_share_refuses_starving_lendings() -> None:
    policy = ASAx(seed=1, min_guest_share=0.9)
    replay(
        two_kinds(120, 1),
        Cluster(nodes=2, cores_per_node=8),
        PolicySet("fcfs", "easy", cosched=policy),
        rates=TwoKinds(),
        validate=True,
    )
    refused = [d for d in policy.decisions if not d.executed]
    assert refused and all(0 < d.fraction * 8 < 0.9 * 8 for d in refused)
    assert all(d.loss is None for d in refused)  # nothing happened to the lender: nothing to learn


def test_bad_asax_settings() -> None:
    with pytest.raises(ConfigError, match="loss"):
        ASAx(loss="regret")
    with pytest.raises(ConfigError, match="min_guest_share"):
        ASAx(min_guest_share=2)


@pytest.fixture(scope="module")
def small_experiment() -> Experiment:
    experiment = Experiment()
    for strategy in ("slurm", "static", "asax"):
        experiment.runs.append(run_once(64, strategy, 1, repeats=1, validate=True))
    return experiment


def test_experiment_runs_every_workflow_to_the_end(small_experiment: Experiment) -> None:
    for run in small_experiment.runs:
        assert len(run.workflows) == 15
        assert all(w.finished for w in run.workflows)
        failed = [w for w in run.workflows if w.failed_stage]
        if run.strategy != "asax":
            assert not failed  # space sharing never slows anyone; Static leaves guests half a host
            assert len(run.jobs) == sum(len(w.workflow.stages) for w in run.workflows)
        for w in failed:  # ASAx explores: a lender that gave away too much is killed at its walltime
            job = w.jobs[w.failed_stage]
            assert job.end - job.start == pytest.approx(job.walltime)
            lent = [d for d in run.policy.decisions if d.host == job.id and d.fraction > 0]
            assert lent and lent[-1].loss == 1.0


def test_lending_shortens_waits_and_costs_some_runtime(small_experiment: Experiment) -> None:
    base = small_experiment.select(64, "slurm")[0]
    assert base.policy.name == "none"
    for strategy in ("static", "asax"):
        run = small_experiment.select(64, strategy)[0]
        assert run.overall()["wait_h"] < base.overall()["wait_h"]
        assert 0 < small_experiment.degradation(64, strategy) < 0.5
    # Space sharing: every job has its cores to itself, so stages run exactly their runtime alone.
    assert all(j.end - j.start == pytest.approx(j.runtime) for j in base.jobs)


def test_calibrated_runtimes_alone_match_the_papers_slurm_column(small_experiment: Experiment) -> None:
    from cosched.experiments.asax import PAPER_TABLE2

    base = small_experiment.select(64, "slurm")[0]
    for app in APPS:
        ours = base.per_app(app)
        runtime_h, _, cpu, mem = PAPER_TABLE2[64]["slurm"][app]
        assert ours["runtime_h"] == pytest.approx(runtime_h, rel=0.2)
        assert ours["cpu_pct"] == pytest.approx(cpu, abs=5)
        assert ours["mem_pct"] == pytest.approx(mem, abs=3)


def test_asax_keeps_memory_heavy_synthetic_out_of_sharing(small_experiment: Experiment) -> None:
    run = small_experiment.select(64, "asax")[0]
    assert isinstance(run.policy, ASAx)
    synthetic = {j.id for w in run.workflows if w.workflow.app == "synthetic" for j in w.jobs.values()}
    assert not [d for d in run.policy.decisions if d.host in synthetic]
    per_class: dict[str, list[float]] = defaultdict(list)
    for d in run.policy.decisions:
        per_class[d.app_class.split(".")[0]].append(d.fraction)
    assert statistics.fmean(per_class["statistics"]) > 0


def test_learners_key_the_weights_by_class_app_stage_or_one_for_all() -> None:
    job = Job(id=1, submit=0.0, cores=4, walltime=10.0, stage="blast.blastn", parallel=True)
    keys = {learner: ASAx(learner=learner).learner_of(job) for learner in LEARNERS}
    assert keys == {"class": "blast.blastn", "app": "blast", "stage": "parallel", "shared": "all"}
    with pytest.raises(ConfigError, match="unknown ASAx learner"):
        ASAx(learner="job")


def test_a_lender_is_judged_only_on_a_sample_under_its_current_quota() -> None:
    """A guest whose host just ended has its full quota back, but its last sample is of the
    throttled guest it was: neither its CPU% nor its pace alone can be read from it."""
    policy = ASAx(seed=1, min_guest_share=0.0)
    host = Job(id=1, submit=0.0, cores=4, walltime=100.0, stage="x")
    host.start, host.quota, host.state = 0.0, 4.0, JobState.RUNNING
    host.usage = Usage(1.0, 0.1, 0, 5.0, quota=2.0)  # measured as a guest on 2 CPUs
    guest = Job(id=2, submit=0.0, cores=2, walltime=100.0, stage="y")
    assert policy.candidates(guest, [host] * 64) == []
    view = SimpleNamespace(now=10.0)
    assert policy.lend(view, guest, [host]) is None and not policy.decisions  # type: ignore[arg-type]
    host.usage = Usage(0.5, 0.1, 0, 10.0, quota=4.0)
    policy.lend(view, guest, [host])  # type: ignore[arg-type]
    assert len(policy.decisions) == 1

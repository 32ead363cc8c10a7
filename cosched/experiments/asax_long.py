"""ASAx over a long horizon in replay: `cosched experiment asax-long`.

The paper's experiment submits 45 workflows at once: about 80 lendings per run, too
few for Algorithm 1 to learn from. Here the same 15 workflow types (the section 4.4
mix's apps and core counts) arrive one at a time, as a Poisson process whose rate
offers the cluster `load` times its cores in work (core-seconds alone), so the
queue fills and drains for as long as a site would run the daemon between restarts.

Every strategy replays the same arrivals with the same seed, each on its own:
space sharing, Static 50%, ASAx learning, and ASAx's mixture held fixed (uniform
weights, or one expert alone). An expert's loss can be counted two ways, and both
are reported, since they answer different questions:

- on ASAx's own decisions (Theorem 1's terms, `experts.weights.Ledger`): expert i's
  loss is the sum over the cases ASAx learned from of p_i(a) l(a), the probability
  it gave the action actually taken times that action's loss. The bound is about
  these sums, so they are what "ASAx against the best fixed expert" and the excess
  risk mean; uniform mixing is their mean.
- in a run of its own: the expert (or uniform mixing) decides every lending, and
  its lenders' slowdowns are scored by replay's oracle (each lender's true runtime
  alone), with the waits and degradation it caused. This is the true counterfactual,
  but each run is a different trajectory: different lendings, queues and states.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cosched.experiments.asax import Experiment, Run, run_once
from cosched.policies.asax import DEFAULT_LEARNER, ASAx, LendingDecision
from cosched.policies.base import CoschedulePolicy
from cosched.policies.cosched import SpaceSharing, Static
from cosched.workflows.interference import runtime_alone, shipped_profiles
from experts.default import default_experts
from experts.loss import degradation_loss
from experts.tree import ExpertSet
from experts.weights import Schedule, WeightBook
from workloads.workflows import APPS, MIX_CORES, Workflow, paper_workflows

SIZE = 128
WORKFLOWS = 1000
LOAD = 0.9


def arrivals(count: int, size: int, load: float, seed: int) -> list[tuple[float, Workflow]]:
    """`count` workflows of the mix's 15 types, drawn uniformly, arriving as a Poisson process
    whose mean offered work (core-seconds alone) is `load` times the cluster's cores."""
    profiles = shipped_profiles()
    types = [paper_workflows(cores)[app] for app in APPS for cores in MIX_CORES[app]]
    work = [sum(runtime_alone(profiles[s.app_class], w.cores) for s in w.stages) * w.cores for w in types]
    gap = statistics.fmean(work) / (size * load)
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(types), size=count)
    times = np.cumsum(rng.exponential(gap, size=count))
    return [
        (float(at), _named(types[k], f"{types[k].name}-n{n}"))
        for n, (at, k) in enumerate(zip(times, picks, strict=True))
    ]


def _named(workflow: Workflow, name: str) -> Workflow:
    return Workflow(name, workflow.app, workflow.cores, workflow.memory_per_core, workflow.stages)


def fixed_strategies(experts: ExpertSet) -> dict[str, list[float]]:
    """ASAx's mixture held fixed: uniform, and each expert alone."""
    n = len(experts)
    fixed = {"uniform": [1.0 / n] * n}
    for i, name in enumerate(experts.names):
        fixed[f"{name} alone"] = [1.0 if j == i else 0.0 for j in range(n)]
    return fixed


def make_long_policy(
    strategy: str,
    seed: int,
    experts: ExpertSet,
    *,
    learner: str = DEFAULT_LEARNER,
    schedule: Schedule | None = None,
) -> CoschedulePolicy:
    if strategy == "slurm":
        return SpaceSharing()
    if strategy == "static":
        return Static(0.5)
    fixed = fixed_strategies(experts).get(strategy)
    weights = WeightBook.fixed(fixed) if fixed is not None else None
    return ASAx(experts, seed=seed, loss="live", weights=weights, schedule=schedule, learner=learner)


@dataclass(slots=True)
class LongExperiment:
    """Every run, and the settings they shared."""

    size: int
    experts: ExpertSet
    runs: Experiment = field(default_factory=Experiment)

    def select(self, strategy: str) -> list[Run]:
        return self.runs.select(self.size, strategy)


def run_long(
    seeds: Sequence[int] = (1, 2, 3),
    *,
    size: int = SIZE,
    workflows: int = WORKFLOWS,
    load: float = LOAD,
    strategies: Sequence[str] | None = None,
    experts: ExpertSet | None = None,
    learners: Sequence[str] = (DEFAULT_LEARNER,),
    schedule: Schedule | None = None,
    keep_promises: bool = False,
) -> LongExperiment:
    """Replay the arrivals of each seed under every strategy. With several `learners`, ASAx
    learns once per learner (strategy "asax/<learner>"); the first is also plain "asax"."""
    experts = experts or default_experts()
    chosen = strategies or ["slurm", "static", "asax", *fixed_strategies(experts)]
    experiment = LongExperiment(size, experts)
    for seed in seeds:
        mix = arrivals(workflows, size, load, seed)
        for strategy in chosen:
            names = [strategy] if strategy != "asax" else ["asax", *(f"asax/{x}" for x in learners[1:])]
            for name, learner in zip(names, learners if strategy == "asax" else learners[:1], strict=False):
                policy = make_long_policy(strategy, seed, experts, learner=learner, schedule=schedule)
                run = run_once(size, name, seed, policy=policy, arrivals=mix, keep_promises=keep_promises)
                experiment.runs.runs.append(run)
    return experiment


# -- measures ------------------------------------------------------------------------


def lendings(run: Run) -> list[LendingDecision]:
    """Lendings carried out."""
    policy = run.policy
    if not isinstance(policy, ASAx):
        return []
    return [d for d in policy.decisions if d.executed and d.fraction > 0]


def oracle_loss(run: Run) -> float:
    """Sum over the run's lendings of its lender's true slowdown (1 at 50%), replay's oracle."""
    jobs = {j.id: j for j in run.jobs}
    total = 0.0
    for d in lendings(run):
        host = jobs[d.host]
        total += degradation_loss(host.end - host.start, host.runtime or host.walltime)
    return total


def learned_loss(run: Run) -> float:
    """Sum of the losses the learner was given (the `live` loss)."""
    return sum(d.loss or 0.0 for d in lendings(run))


@dataclass(frozen=True, slots=True)
class Regret:
    """Theorem 1's sums over a run's learners (`experts.weights.Ledger`), added up."""

    cases: int
    updates: int
    asax: float
    uniform: float
    experts: dict[str, float]
    best_per_learner: float
    bound: float

    @property
    def best_fixed(self) -> tuple[str, float]:
        name = min(self.experts, key=self.experts.__getitem__)
        return name, self.experts[name]

    @property
    def excess(self) -> float:
        """E_T summed over learners: ASAx against the best fixed expert of each learner."""
        return self.asax - self.best_per_learner


def regret(run: Run) -> Regret | None:
    policy = run.policy
    if not isinstance(policy, ASAx):
        return None
    names = policy.experts.names
    learners = [policy.book.get(c) for c in policy.book.classes()]
    ledgers = [w.ledger for w in learners if w.ledger.experts]
    per_expert = {name: sum(ledger.experts[i] for ledger in ledgers) for i, name in enumerate(names)}
    return Regret(
        cases=sum(ledger.cases for ledger in ledgers),
        updates=policy.book.updates,
        asax=sum(ledger.mixed for ledger in ledgers),
        uniform=sum(ledger.experts_mean for ledger in ledgers),
        experts=per_expert,
        best_per_learner=sum(min(ledger.experts) for ledger in ledgers),
        bound=sum(w.bound() for w in learners if w.ledger.experts),
    )


@dataclass(frozen=True, slots=True)
class LearnerMove:
    """One learner over a run: what it lent and lost, and where its weights went."""

    learner: str
    decisions: int
    lendings: int
    mean_loss: float
    updates: int
    lent_uniform: float
    """Mean lent fraction of its mixture with uniform weights, in the states it decided in."""
    lent_final: float
    """The same with its final weights: below `lent_uniform` once it moved from the lending experts."""
    alpha: tuple[float, ...]


def class_moves(run: Run) -> list[LearnerMove]:
    """Per learner of an ASAx run (none for another strategy)."""
    policy = run.policy
    if not isinstance(policy, ASAx):
        return []
    by_learner: dict[str, list[LendingDecision]] = {}
    for d in policy.decisions:
        if d.executed:
            by_learner.setdefault(d.learner, []).append(d)
    moves = []
    for learner, decisions in sorted(by_learner.items()):
        weights = policy.book.get(learner)
        dists = np.array([d.distributions for d in decisions])  # (decisions, n, m)
        per_expert = (dists @ policy.fractions).mean(axis=0)  # expected lent fraction of each expert
        lent = [d.loss or 0.0 for d in decisions if d.fraction > 0 and d.loss is not None]
        moves.append(
            LearnerMove(
                learner,
                len(decisions),
                len(lent),
                statistics.fmean(lent) if lent else 0.0,
                weights.t,
                float(per_expert.mean()),
                float(weights.alpha @ per_expert),
                tuple(float(a) for a in weights.alpha),
            )
        )
    return moves


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan

"""ASAx: lend CPU from running jobs as decision-tree experts advise, weighted by experience.

For a queued job that cannot start, each running job that could hold it is a
candidate lender. Its measured state (CPU%, Mem%, stage type, progress, happiness)
goes to every expert; the experts' distributions over the lent fractions are
mixed with the weights learned for the lender's application class, and an
action is sampled (Algorithm 1, lines 4-8). The lender's loss is known when it
ends; it feeds the risk of every decision made about it (line 10), and the
weights move when a round's risk passes 1 (line 12).

Each (guest, lender) pair is decided once: asking again at every pass until a
non-zero fraction came up would lend far more often than the sampled
distribution says. Every decision is kept for `cosched explain`.

One addition to the paper: a fraction that would give the guest less than
`min_guest_share` of its requested cores is not carried out. The paper's loss
is the lender's alone, so nothing would ever teach the experts that a guest
starved on 10% of a host's CPU is a bad co-location; such a decision changes
nothing for the lender, so it is logged but not learned from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosched.core.view import SchedulerView
from cosched.errors import ConfigError
from cosched.model import Job, JobState
from cosched.policies.base import CoschedulePolicy, Lending
from experts.baselines import Kind, RuntimeBaselines
from experts.default import default_experts
from experts.features import JobFeatures, happiness
from experts.loss import degradation_loss, walltime_loss
from experts.tree import ExpertSet, lent_fractions
from experts.weights import Schedule, WeightBook

LOSSES = ("live", "walltime", "degradation")
"""`live`: the lender's slowdown against the runtime alone of its kind, learned online
(`experts.baselines`), what a live scheduler can know. `walltime`: the paper's section 3.2,
only an overrun of the walltime counts. `degradation`: the slowdown against the job's true
runtime alone, which only replay knows (an oracle, for ablations)."""


@dataclass(slots=True)
class LendingDecision:
    """One co-scheduling decision, with everything needed to explain it later."""

    time: float
    guest: int
    host: int
    app_class: str
    features: dict[str, Any]
    experts: list[str]
    distributions: list[list[float]]
    weights: list[float]
    action: int
    fraction: float
    loss: float | None = None
    host_runtime: float | None = None
    host_cores: int = 0
    """The lender's cores: with its class, the kind whose runtime alone scores the `live` loss."""
    executed: bool = True
    """False when the fraction was too small to help the guest (`min_guest_share`): not carried out."""
    seq: int = 0
    """Position in the policy's decision log."""

    def as_dict(self) -> dict[str, Any]:
        body = {name: getattr(self, name) for name in self.__dataclass_fields__}
        body["features"] = dict(self.features)
        return body


@dataclass(slots=True)
class _Pending:
    decision: LendingDecision
    dists: np.ndarray = field(repr=False)


class ASAx(CoschedulePolicy):
    """The ASAx co-scheduler (Souza, Pelckmans and Tordsson, 2024)."""

    name = "asax"

    def __init__(
        self,
        experts: str | Path | ExpertSet | None = None,
        *,
        seed: int = 0,
        loss: str = "live",
        schedule: Schedule | None = None,
        weights: WeightBook | None = None,
        min_guest_share: float = 0.5,
    ) -> None:
        if not 0.0 <= min_guest_share <= 1.0:
            raise ConfigError(f"min_guest_share must be in [0, 1], got {min_guest_share}")
        self.min_guest_share = min_guest_share
        if loss not in LOSSES:
            raise ConfigError(f"unknown ASAx loss {loss!r}; known: {', '.join(LOSSES)}")
        if isinstance(experts, str | Path):
            experts = ExpertSet.load(str(experts))
        self.experts: ExpertSet = experts or default_experts()
        self.fractions = lent_fractions(self.experts.m)
        self.book = weights or WeightBook(len(self.experts), schedule)
        self.loss = loss
        self.rng = np.random.default_rng(seed)
        self.decisions: list[LendingDecision] = []
        """In order of `seq`: every decision in replay; the daemon keeps only recent ones (`forget`)."""
        self.decided = 0
        """How many decisions were ever made: the next one's `seq`."""
        self.weight_history: list[tuple[float, str, list[float]]] = []
        """(time, application class, weights) after each update of a class's weights."""
        self._asked: set[tuple[int, int]] = set()
        self._asked_by: dict[int, set[int]] = {}
        self.resolved: list[LendingDecision] = []
        """Decisions whose loss (or lender's runtime) became known, for a caller that persists them
        (the daemon drains it)."""
        self._awaiting: dict[int, list[_Pending]] = {}
        self.baselines = RuntimeBaselines()
        """Runtimes alone per (class, cores), from every job that neither lent nor was a guest."""
        self._shared: set[int] = set()
        """Running jobs that lent CPU or run as guests: their runtimes are not runtimes alone."""
        self._unscored: dict[Kind, list[tuple[float, list[_Pending]]]] = {}
        """Lenders that ended before any job of their kind ran alone: scored when one does."""

    # -- deciding -----------------------------------------------------------
    def candidates(self, guest: Job, running: Sequence[Job]) -> Sequence[Job]:
        """Measured running jobs this guest was not yet decided about (set arithmetic, not a scan per pair)."""
        if len(running) < 64:
            return running
        asked = self._asked_by.get(guest.id)
        if not asked:
            return [h for h in running if h.usage is not None]
        by_id = {h.id: h for h in running}
        return [by_id[i] for i in by_id.keys() - asked if by_id[i].usage is not None]

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        measured = [h for h in hosts if h.usage is not None and (guest.id, h.id) not in self._asked]
        for host in sorted(measured, key=lambda h: (h.usage.cpu if h.usage else 1.0, h.id)):
            self._asked.add((guest.id, host.id))
            self._asked_by.setdefault(guest.id, set()).add(host.id)
            features = self.features(host, view.now)
            dists = self.experts.predict_all(features)
            app_class = host.stage or "unknown"
            weights = self.book.get(app_class)
            action = weights.choose(dists, self.rng)
            decision = LendingDecision(
                time=view.now,
                guest=guest.id,
                host=host.id,
                host_cores=host.cores,
                app_class=app_class,
                features={
                    "cpu": features.cpu,
                    "mem": features.mem,
                    "parallel": features.parallel,
                    "progress": features.progress,
                    "happiness": features.happiness,
                },
                experts=list(self.experts.names),
                distributions=dists.round(6).tolist(),
                weights=[float(a) for a in weights.alpha],
                action=action,
                fraction=float(self.fractions[action]),
            )
            decision.seq = self.decided
            self.decided += 1
            self.decisions.append(decision)
            lent = decision.fraction * host.cores
            if 0 < lent < self.min_guest_share * guest.cores:
                decision.executed = False  # the guest would crawl; nothing happens, nothing to learn
                continue
            if decision.fraction == 0:
                # Lending nothing co-allocates nothing: its loss is 0, known now. Charging it
                # the host's later degradation (caused by another decision) would punish the
                # experts that advised against lending.
                decision.loss = 0.0
                weights.observe(dists, action, 0.0)
                continue
            self._awaiting.setdefault(host.id, []).append(_Pending(decision, dists))
            self._shared.update((host.id, guest.id))
            return Lending(host, decision.fraction)
        return None

    def features(self, job: Job, now: float) -> JobFeatures:
        """The lender's state, from its latest measured usage.

        Happiness needs a pace. A job that reports its tasks has one; for one that
        reports none yet (no progress file, or a single task), the runtime alone of
        its kind stands in: Hp = time left / (expected runtime - elapsed). Without
        either, Hp is 1.0 ("on pace, no slack").
        """
        usage = job.usage
        assert usage is not None
        elapsed = max(0.0, now - job.start)
        left = max(0.0, job.start + job.walltime - now)
        hp = happiness(left, usage.tasks_done, job.tasks, elapsed) if job.tasks else 1.0
        if usage.tasks_done == 0 and left > 0:
            expected = self.baselines.expected(_kind(job))
            if expected is not None and expected > elapsed:
                hp = left / (expected - elapsed)
        return JobFeatures(
            cpu=max(0.0, usage.cpu),
            mem=min(1.0, max(0.0, usage.mem)),
            parallel=job.parallel,
            progress=elapsed / job.walltime,
            happiness=hp,
        )

    # -- learning -----------------------------------------------------------
    def observe(self, job: Job, now: float) -> None:
        """A job ended: a lender's decisions get their loss; a job that ran alone teaches its kind's runtime."""
        runtime = job.end - job.start
        shared = job.id in self._shared
        self._shared.discard(job.id)
        if not shared and job.state is JobState.DONE:
            kind = _kind(job)
            self.baselines.add(kind, runtime)
            for lender_runtime, waiting in self._unscored.pop(kind, []):
                self._score(waiting, self._live_loss(lender_runtime, kind), now)
        pending = self._awaiting.pop(job.id, None)
        if not pending:
            return
        for item in pending:
            item.decision.host_runtime = runtime
        killed = job.state is JobState.FAILED and runtime >= job.walltime * (1 - 1e-9)
        if self.loss == "live" and not killed and self.baselines.expected(_kind(job)) is None:
            self._unscored.setdefault(_kind(job), []).append((runtime, pending))
            self.resolved.extend(item.decision for item in pending)  # persisted with their lender's runtime
            return
        self._score(pending, self.loss_of(job, runtime), now)

    def _score(self, pending: list[_Pending], loss: float, now: float) -> None:
        app_class = pending[0].decision.app_class
        weights = self.book.get(app_class)
        for item in pending:
            item.decision.loss = loss
            self.resolved.append(item.decision)
            if weights.observe(item.dists, item.decision.action, loss):
                self.weight_history.append((now, app_class, [float(a) for a in weights.alpha]))

    def _live_loss(self, runtime: float, kind: Kind) -> float:
        baseline = self.baselines.expected(kind)
        assert baseline is not None
        return degradation_loss(runtime, baseline)

    def loss_of(self, job: Job, runtime: float) -> float:
        """Section 3.2: 0 within the walltime, else the overrun over the walltime (capped at 1).

        A lender killed at its walltime ran exactly its walltime, which the formula
        would score 0; it is scored 1, the overrun a kill hides.

        With `loss="live"`, 1 means 50% slower than the median runtime alone of the
        job's kind (`experts.baselines`); with `loss="degradation"` (section 4.4), than
        the job's own true runtime alone (known in replay only; the walltime stands in
        for it otherwise).
        """
        if job.state is JobState.FAILED and runtime >= job.walltime * (1 - 1e-9):
            return 1.0  # killed at its walltime: it never finished, the worst outcome
        if self.loss == "walltime":
            return walltime_loss(runtime, job.walltime)
        if self.loss == "live":
            baseline = self.baselines.expected(_kind(job))
            return degradation_loss(runtime, baseline) if baseline is not None else walltime_loss(runtime, job.walltime)
        baseline = job.runtime if job.runtime else job.walltime
        return degradation_loss(runtime, baseline)

    def restore(self, decisions: Sequence[LendingDecision]) -> None:
        """Take back the decisions an earlier run of the daemon made (from its store).

        An executed lending whose loss is not known yet waits again for its
        lender's end, so a restart loses no learning and asks no pair twice.
        """
        for decision in decisions:
            self.decisions.append(decision)
            self.decided = max(self.decided, decision.seq + 1)
            self._asked.add((decision.guest, decision.host))
            self._asked_by.setdefault(decision.guest, set()).add(decision.host)
            if decision.loss is None and decision.executed and decision.fraction > 0:
                pending = _Pending(decision, np.asarray(decision.distributions, dtype=float))
                if decision.host_runtime is not None:  # its lender ended, no runtime alone was known yet
                    kind = (decision.app_class, decision.host_cores)
                    self._unscored.setdefault(kind, []).append((decision.host_runtime, [pending]))
                else:
                    self._awaiting.setdefault(decision.host, []).append(pending)

    def since(self, seq: int) -> list[LendingDecision]:
        """The decisions numbered `seq` and later that are still in memory."""
        first = self.decisions[0].seq if self.decisions else self.decided
        return self.decisions[max(0, seq - first) :]

    def forget(self, keep: int) -> None:
        """Keep only the last `keep` decisions in memory (the daemon's store has every one).

        Decisions still waiting for their lender's end stay reachable from
        `_awaiting`, so forgetting them here loses no learning.
        """
        if len(self.decisions) > 2 * keep:  # amortised: one slice per `keep` decisions
            del self.decisions[:-keep]

    def explain(self, job_id: int) -> list[LendingDecision]:
        """Every decision in which `job_id` was the guest or the lender."""
        return [d for d in self.decisions if job_id in (d.guest, d.host)]


def _kind(job: Job) -> Kind:
    return (job.stage or "unknown", job.cores)


def loss_outcome(decision: dict[str, Any]) -> str:
    """A logged decision's loss as `explain` shows it, whatever state it is in."""
    loss, ran = decision.get("loss"), decision.get("host_runtime")
    if not decision.get("executed", True):
        return "none: not carried out (too little CPU for the guest)"
    if loss is None:
        if ran is None:
            return "pending (the lender is still running)"
        return f"pending: the lender ran {ran:.0f}s; scored once a job of its kind has run alone"
    if ran is None:
        return f"{loss:.3f} (nothing lent)"
    return f"{loss:.3f} (lender ran {ran:.0f}s)"

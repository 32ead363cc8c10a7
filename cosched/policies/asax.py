"""ASAx: lend CPU from running jobs as decision-tree experts advise, weighted by experience.

For a queued job that cannot start, each running job that could hold it is a
candidate lender. Its measured state (CPU%, Mem%, stage type, progress, happiness)
goes to every expert; the experts' distributions over the lent fractions are
mixed with the weights learned for the lender's application class (`LEARNERS`),
and an action is sampled (Algorithm 1, lines 4-8). The lender's loss is known
when it ends; it feeds the risk of every decision made about it (line 10), and
the weights move when a round's risk passes the threshold (line 12; 1 in the
paper, `experts.weights.Schedule`).

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

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosched.core.view import SchedulerView
from cosched.errors import ConfigError
from cosched.model import Job, JobState
from cosched.policies.base import CoschedulePolicy, Lending
from experts.baselines import Kind, RuntimeBaselines, Stretch, paced_runtime_alone, shared_speed
from experts.default import default_experts
from experts.features import JobFeatures, happiness
from experts.loss import degradation_loss, walltime_loss
from experts.tree import ExpertSet, lent_fractions
from experts.weights import Schedule, WeightBook

LOSSES = ("live", "walltime", "degradation")
"""`live`: the lender's slowdown against its runtime alone as a live scheduler can know it: its
kind's runs alone, or its own pace until its kind has run alone (`experts.baselines`). `walltime`:
the paper's section 3.2, only an overrun of the walltime counts. `degradation`: the slowdown
against the job's true runtime alone, which only replay knows (an oracle, for ablations)."""

LEARNERS = ("class", "app", "stage", "shared")
"""Which lenders share one set of weights: each application class (`blast.blastn`, the paper's
"Job_a"), each application (`blast`), each stage type (parallel or sequential), or one learner for
all, whose experts still tell classes apart by their features (CPU%, Mem%, stage type). docs/asax.md
has the measurement that chose the default."""

DEFAULT_LEARNER = "app"

DEFAULT_GUEST_SHARE = 0.6
"""The least share of its cores a guest is lent: the smallest that kept workflow degradation within
5% at every size of the paper's experiment (docs/results.md has the sweep)."""


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
    """False when nothing was lent after all: the fraction was too small to help the guest
    (`min_guest_share`), or the daemon restarted before the guest started (`note` says which)."""
    seq: int = 0
    """Position in the policy's decision log."""
    learner: str = ""
    """The weights this decision was made with and is learned into ('' in logs from before
    learners were chosen: the application class)."""
    baseline: float | None = None
    """The runtime alone the loss compared the lender's runtime with."""
    note: str = ""
    """How the loss was found, or why there is none."""
    busy_then: float | None = None
    """CPUs the lender kept busy when the lending was decided: its pace alone, if it was never
    measured alone at full quota (a former guest)."""
    lent_until: float | None = None
    """When the lending ended (its guest's end, or its lender's)."""
    shared_busy: float | None = None
    """CPUs the lender kept busy while it lent, by its last sample in the lending (None: no sample
    fell in it); noted at each sample (`lending_paces`), not only at the lending's end."""
    shared_quota: float | None = None
    """The quota the lender kept while it lent. These four are what its loss needs: saved with the
    decision, so a restart before the lender's end scores it as the live daemon would."""
    lender_alone: float | None = None
    """CPUs the lender kept busy when last measured alone at full quota, as of this decision: its
    pace alone for every lending it is scored on, which a restart takes back from here."""

    def as_dict(self) -> dict[str, Any]:
        body = {name: getattr(self, name) for name in self.__dataclass_fields__}
        body["features"] = dict(self.features)
        return body

    @classmethod
    def from_stored(cls, body: dict[str, Any]) -> LendingDecision:
        """A decision as the state file holds it (`store.strict_json`), whose numbers JSON has none for
        (Hp +inf: a lender with nothing left to do) are named there ("inf"): numbers again here,
        or the decision's next save, and every pass with it, failed on the name."""
        numbers = {name for name, spec in cls.__dataclass_fields__.items() if "float" in str(spec.type)}
        restored = {name: _number(value) if name in numbers else value for name, value in body.items()}
        restored["features"] = {name: _number(value) for name, value in body.get("features", {}).items()}
        return cls(**restored)


@dataclass(slots=True)
class _Pending:
    """A lending carried out, waiting for its lender's end (how fast the lender ran meanwhile is
    on its decision: `busy_then`, `lent_until`, `shared_busy`, `shared_quota`)."""

    decision: LendingDecision
    dists: np.ndarray = field(repr=False)
    host: Job | None = field(default=None, repr=False)


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
        min_guest_share: float = DEFAULT_GUEST_SHARE,
        learner: str = DEFAULT_LEARNER,
    ) -> None:
        if not 0.0 <= min_guest_share <= 1.0:
            raise ConfigError(f"min_guest_share must be in [0, 1], got {min_guest_share}")
        self.min_guest_share = min_guest_share
        if loss not in LOSSES:
            raise ConfigError(f"unknown ASAx loss {loss!r}; known: {', '.join(LOSSES)}")
        if learner not in LEARNERS:
            raise ConfigError(f"unknown ASAx learner {learner!r}; known: {', '.join(LEARNERS)}")
        if isinstance(experts, str | Path):
            experts = ExpertSet.load(str(experts))
        self.experts: ExpertSet = experts or default_experts()
        self.fractions = lent_fractions(self.experts.m)
        self.book = weights or WeightBook(len(self.experts), schedule)
        self.loss = loss
        self.learner = learner
        self.rng = np.random.default_rng(seed)
        self.decisions: list[LendingDecision] = []
        """In order of `seq`: every decision in replay; the daemon keeps only recent ones (`forget`)."""
        self.decided = 0
        """How many decisions were ever made: the next one's `seq`."""
        self.weight_history: list[tuple[float, str, list[float]]] = []
        """(time, learner, weights) after each update of a learner's weights."""
        self._asked: set[tuple[int, int]] = set()
        self._asked_by: dict[int, set[int]] = {}
        self.resolved: list[LendingDecision] = []
        """Decisions whose outcome, or whose lending's end, became known, for a caller that persists
        them (the daemon drains it)."""
        self._awaiting: dict[int, list[_Pending]] = {}
        self._lent_to: dict[int, _Pending] = {}
        """Guest id -> its lending, while both run: the guest's end closes the lender's stretch."""
        self.baselines = RuntimeBaselines()
        """Runtimes alone per (class, cores), from every job that neither lent nor was a guest."""
        self._shared: set[int] = set()
        """Running jobs that lent CPU or run as guests: their runtimes are not runtimes alone."""
        self._alone: dict[int, float] = {}
        """Running job id -> the CPUs it kept busy when last measured alone at full quota."""

    def learner_of(self, job: Job) -> str:
        """The weights a decision about lender `job` uses (`LEARNERS`)."""
        app_class = job.stage or "unknown"
        if self.learner == "class":
            return app_class
        if self.learner == "app":
            return app_class.split(".", 1)[0]
        if self.learner == "stage":
            return "parallel" if job.parallel else "sequential"
        return "all"

    # -- deciding -----------------------------------------------------------
    def candidates(self, guest: Job, running: Sequence[Job]) -> Sequence[Job]:
        """Running jobs measured under their current quota that this guest was not yet decided
        about (set arithmetic, not a scan per pair)."""
        asked = self._asked_by.get(guest.id)
        if len(running) < 64:  # a scan: the core says why none is left (`Scheduler.not_lent`)
            return [h for h in running if measured_now(h) and not (asked and h.id in asked)]
        if not asked:
            return [h for h in running if measured_now(h)]
        by_id = {h.id: h for h in running}
        return [by_id[i] for i in by_id.keys() - asked if measured_now(by_id[i])]

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        measured = [h for h in hosts if measured_now(h) and (guest.id, h.id) not in self._asked]
        for host in sorted(measured, key=lambda h: (h.usage.cpu if h.usage else 1.0, h.id)):
            self._asked.add((guest.id, host.id))
            self._asked_by.setdefault(guest.id, set()).add(host.id)
            if host.quota >= host.cores:  # measured alone, at full quota
                self._alone[host.id] = busy_cpus(host)
            features = self.features(host, view.now)
            dists = self.experts.predict_all(features)
            learner = self.learner_of(host)
            weights = self.book.get(learner)
            action = weights.choose(dists, self.rng)
            decision = LendingDecision(
                time=view.now,
                guest=guest.id,
                host=host.id,
                host_cores=host.cores,
                app_class=host.stage or "unknown",
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
                learner=learner,
            )
            decision.seq = self.decided
            decision.lender_alone = self._alone.get(host.id)
            self.decided += 1
            self.decisions.append(decision)
            lent = decision.fraction * host.cores
            if 0 < lent < self.min_guest_share * guest.cores:
                decision.executed = False  # the guest would crawl; nothing happens, nothing to learn
                decision.note = NOT_CARRIED_OUT
                continue
            if decision.fraction == 0:
                # Lending nothing co-allocates nothing: its loss is 0, known now. Charging it
                # the host's later degradation (caused by another decision) would punish the
                # experts that advised against lending.
                decision.loss = 0.0
                decision.note = "nothing lent"
                weights.observe(dists, action, 0.0)
                continue
            decision.busy_then = busy_cpus(host)
            pending = _Pending(decision, dists, host)
            self._awaiting.setdefault(host.id, []).append(pending)
            self._lent_to[guest.id] = pending
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
        """A job ended: a lender's decisions get their loss; a guest's end closes its lender's
        stretch; a job that ran alone teaches its kind's runtime."""
        runtime = job.end - job.start
        if job.id not in self._shared and job.state is JobState.DONE:
            self.baselines.add(_kind(job), runtime)
        alone = self._alone.get(job.id)
        pending = self._run_over(job, job.end)
        if not pending:
            return
        if job.usage is not None and job.usage.quota >= job.cores:  # its last sample: alone again
            alone = busy_cpus(job)
        for item in pending:
            item.decision.host_runtime = runtime
        stretches = [
            Stretch(
                lent.time,
                lent.lent_until or job.end,
                shared_speed(
                    (lent.busy_then or 0.0) if alone is None else alone,
                    lent.shared_busy,
                    lent.shared_quota or 0.0,
                    job.cores,
                ),
            )
            for lent in (item.decision for item in pending)
        ]
        loss, baseline, note = self.verdict(job, runtime, stretches)
        for item in pending:
            decision = item.decision
            decision.loss, decision.baseline, decision.note = loss, baseline, note
            self.resolved.append(decision)
            weights = self.book.get(decision.learner or decision.app_class)  # its own: a restart may change `learner`
            if loss is not None and weights.observe(item.dists, decision.action, loss):
                self.weight_history.append((now, decision.learner, [float(a) for a in weights.alpha]))

    def requeued(self, job: Job, now: float) -> None:
        """A run of `job` was lost with its machine and the job is queued again. Its lendings as a
        lender end with the run and are resolved now, without a loss, as a crashed lender's are:
        left waiting, they would be scored at the job's next end against another run's runtime.
        As a guest, its lending ends here; its lender's end scores it."""
        for item in self._run_over(job, now):
            item.decision.note = LOST_RUN
            self.resolved.append(item.decision)

    def _run_over(self, job: Job, end: float) -> list[_Pending]:
        """A run of `job` is over: as a guest, its lender has its quota back; as a lender, its
        lendings (returned, each closed) wait no more, and their guests run on as ordinary jobs."""
        self._shared.discard(job.id)
        self._alone.pop(job.id, None)
        lending = self._lent_to.pop(job.id, None)
        if lending is not None:
            host_quota = lending.host.quota if lending.host is not None else float(lending.decision.host_cores)
            self._close(lending, end, host_quota - job.quota)
        pending = self._awaiting.pop(job.id, [])
        for item in pending:
            self._lent_to.pop(item.decision.guest, None)
            self._close(item, end, job.quota)
        return pending

    def _close(self, item: _Pending, end: float, shared_quota: float) -> None:
        """The lending ended (its guest or its lender did): what did the lender use meanwhile?"""
        decision = item.decision
        if decision.lent_until is not None:
            return
        decision.lent_until, decision.shared_quota = end, shared_quota
        self._note_pace(item)  # else the last one noted stands (a restart's lender has no sample yet)
        self.resolved.append(decision)

    def lending_paces(self) -> list[LendingDecision]:
        """The lendings under way whose lender was sampled since their pace was last noted, with it
        noted (`shared_busy`), for a caller that saves them: a restart before the lending ends then
        closes it on the reading the live daemon would have used, not on none."""
        return [item.decision for item in self._lent_to.values() if self._note_pace(item)]

    @staticmethod
    def _note_pace(item: _Pending) -> bool:
        """Note the lender's last sample taken in the lending on its decision; whether it changed."""
        host, decision = item.host, item.decision
        if host is None or host.usage is None or host.usage.at <= decision.time:
            return False
        busy = busy_cpus(host)
        changed = busy != decision.shared_busy
        decision.shared_busy = busy
        return changed

    def verdict(self, job: Job, runtime: float, stretches: Sequence[Stretch]) -> tuple[float | None, float | None, str]:
        """A lender's loss, the runtime alone it was held against, and how it was found.

        Section 3.2 for `walltime`: 0 within the walltime, else the overrun over the
        walltime (capped at 1). A lender killed at its walltime ran exactly its walltime,
        which the formula would score 0; it is scored 1, the overrun a kill hides.
        The slowdown losses (section 4.4: 1 at 50% slower) hold the runtime against the
        job's true runtime alone (`degradation`, replay's oracle) or, for `live`, against
        its kind's runs alone, else the lender's own pace (`experts.baselines`).
        A lender cancelled, or failed before its walltime, says nothing about lending:
        no loss, nothing learned.
        """
        if job.state is JobState.CANCELLED:
            return None, None, "none: the lender was cancelled"
        if job.state is JobState.FAILED:
            if runtime >= job.walltime * (1 - 1e-9):
                return 1.0, None, "killed at its walltime"
            return None, None, "none: the lender failed before its walltime"
        if self.loss == "walltime":
            return walltime_loss(runtime, job.walltime), None, "walltime overrun"
        if self.loss == "degradation":
            baseline = job.runtime if job.runtime else job.walltime
            return degradation_loss(runtime, baseline), baseline, "true runtime alone (replay's oracle)"
        known = self.baselines.expected(_kind(job))
        if known is not None:
            return degradation_loss(runtime, known), known, "runtime alone of its kind"
        paced = paced_runtime_alone(runtime, stretches)
        return degradation_loss(runtime, paced), paced, "its own pace (no run alone of its kind yet)"

    def restore(self, decisions: Sequence[LendingDecision], running: Mapping[int, Job] | None = None) -> None:
        """Take back the decisions an earlier run of the daemon made (from its store).

        An executed lending whose loss is not known yet waits again for its
        lender's end, with what was saved of it (its lender's pace then and while
        it lent), so a restart loses no learning and asks no pair twice. Its lender,
        if `running`, is watched again; where `running` is given (the daemon's recovery)
        and the lender is not in it, its run was lost unseen: no end will come, and the
        lending is resolved without a loss. A guest still running that outlived its
        lender ran shared all the same: its end teaches no runtime alone.
        (Logs from before lenders were scored by their own pace may hold lendings
        whose lender ended unscored: the runtime alone of their kind scores them
        if it is known by now, else they are left without a verdict.)
        """
        told = running is not None  # the daemon's recovery says which jobs run; a lender not among them never ends
        running = running or {}
        for decision in decisions:
            self.decisions.append(decision)
            self.decided = max(self.decided, decision.seq + 1)
            if decision.host in running and decision.lender_alone is not None:  # the last one stands
                self._alone[decision.host] = decision.lender_alone
            self._asked.add((decision.guest, decision.host))
            self._asked_by.setdefault(decision.guest, set()).add(decision.host)
            if decision.executed and decision.fraction > 0 and decision.guest in running:
                self._shared.add(decision.guest)
            if decision.loss is not None or not decision.executed or decision.fraction == 0 or decision.note:
                continue
            pending = _Pending(decision, np.asarray(decision.distributions, dtype=float), running.get(decision.host))
            if decision.busy_then is None:  # saved before busy_then was
                decision.busy_then = float(decision.features.get("cpu", 1.0)) * decision.host_cores
            if decision.host_runtime is None and told and decision.host not in running:
                decision.note = LOST_WHILE_DOWN  # its run is over, its end unseen: nothing to learn
                self.resolved.append(decision)
                continue
            if decision.host_runtime is None:
                self._awaiting.setdefault(decision.host, []).append(pending)
                self._shared.add(decision.host)  # its runtime is not one alone
                if decision.lent_until is None:  # the guest runs on it
                    self._lent_to[decision.guest] = pending
                    self._shared.add(decision.guest)
                continue
            known = self.baselines.expected((decision.app_class, decision.host_cores))
            if known is None:
                decision.note = "none: its lender ended before paces were estimated, unscored"
            else:
                decision.loss = degradation_loss(decision.host_runtime, known)
                decision.baseline, decision.note = known, "runtime alone of its kind"
                weights = self.book.get(decision.learner or decision.app_class)
                weights.observe(pending.dists, decision.action, decision.loss)
            self.resolved.append(decision)

    def since(self, seq: int) -> list[LendingDecision]:
        """The decisions numbered `seq` and later that are still in memory. Found by number, not by
        subtracting the first one's: a restart reloads the last ones and older ones still needed,
        with gaps between (the new ones were then not saved when made, and a kill lost them)."""
        return self.decisions[bisect_left(self.decisions, seq, key=_seq) :]

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


def _seq(decision: LendingDecision) -> int:
    return decision.seq


def _kind(job: Job) -> Kind:
    return (job.stage or "unknown", job.cores)


def measured_now(job: Job) -> bool:
    """A lender is judged on a measurement under the quota it has now: a sample from before its
    quota changed (a guest that just lost its host, a host whose guest just left) is of another job."""
    usage = job.usage
    return usage is not None and (not usage.quota or abs(usage.quota - job.quota) < 1e-9)


def busy_cpus(job: Job) -> float:
    """The CPUs a job kept busy when last measured (its current quota if the backend did not say)."""
    usage = job.usage
    assert usage is not None
    return max(0.0, usage.cpu) * (usage.quota or job.quota)


NOT_CARRIED_OUT = "none: not carried out (too little CPU for the guest)"
LOST_RUN = "none: the lender's run was lost with its machine (it was queued again)"
LOST_WHILE_DOWN = "none: the lender's run was lost while the daemon was down"


def _number(value: Any) -> Any:
    """A number the state file names (`inf`, `-inf`, `nan`) as the float it is; anything else as is."""
    return float(value) if value in ("inf", "-inf", "nan") else value


def loss_outcome(decision: dict[str, Any]) -> str:
    """A logged decision's loss as `explain` shows it, whatever state it is in."""
    loss, ran, note = decision.get("loss"), decision.get("host_runtime"), decision.get("note", "")
    if not decision.get("executed", True):
        return note or NOT_CARRIED_OUT
    if loss is None:
        return note or ("pending (the lender is still running)" if ran is None else f"none: the lender ran {ran:.0f}s")
    if ran is None:
        return f"{loss:.3f} (nothing lent)"
    baseline = decision.get("baseline")
    against = f" against {baseline:.0f}s alone: {note}" if baseline is not None and note else ""
    if not against and note:
        against = f": {note}"
    return f"{loss:.3f} (lender ran {ran:.0f}s{against})"

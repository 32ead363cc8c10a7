"""Replay: the scheduling core driven by a virtual clock.

The driver merges two time-ordered streams, submissions from the workload and
job ends from the simulated backend, and calls the core once per distinct
time with everything that happened then (ends first, so freed resources are
seen by that pass). It is the same `step(now, events)` the daemon calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from cosched.core.events import Event, JobEnded, JobSubmitted, Reject
from cosched.core.scheduler import Scheduler
from cosched.core.validate import ValidatingScheduler
from cosched.errors import SchedulingError
from cosched.model import Cluster, Job, JobState
from cosched.policies.registry import create, resolve, split_argument
from cosched.replay.backend import Accounts, RateModel, SimulatedBackend

PROGRESS_EVERY = 4096
_UNFINISHED = (JobState.PENDING, JobState.RUNNING)


@dataclass(slots=True)
class PolicySet:
    """The plugins a replay runs with, by alias, `module:Class`, or instance."""

    queue: Any = "fcfs"
    backfill: Any = "easy"
    estimate: Any = "requested"
    placement: Any = "first-fit"
    cosched: Any = "none"
    sharing: int = 2
    """Jobs that may share one allocation (a host and its guests)."""
    window: int = 32
    """Queued jobs offered for co-scheduling per pass."""
    keep_promises: bool = False
    """Co-scheduling keeps backfill promises (`Scheduler.keep_promises`)."""
    max_cores_per_user: int = 0
    """A cap on each user's running cores (`cosched.core.limits`; 0: none)."""
    max_running_jobs_per_user: int = 0
    """A cap on each user's running jobs (0: none)."""

    @property
    def label(self) -> str:
        """`queue+backfill[-estimate]`, by each plugin's short name (a model's as `rlbf[hpc2n]`)."""

        def name(kind: str) -> str:
            spec = getattr(self, kind)
            if isinstance(spec, str):
                alias, argument = split_argument(kind, spec)
                if argument is not None:
                    return f"{alias}[{PurePath(argument).stem or argument}]"
                return spec if ":" not in spec else str(getattr(resolve(kind, spec), "name", "")) or spec
            return getattr(spec, "name", "") or type(spec).__name__

        suffix = "" if name("estimate") == "requested" else f"-{name('estimate')}"
        sharing = "" if name("cosched") == "none" else f"+{name('cosched')}"
        return f"{name('queue')}+{name('backfill')}{suffix}{sharing}"

    def check(self) -> None:
        """Resolve every plugin name now (and load what an argument names, a model), so a typo
        fails before any work is done."""
        for kind in ("queue", "backfill", "estimate", "placement", "cosched"):
            spec = getattr(self, kind)
            if isinstance(spec, str):
                if split_argument(kind, spec)[1] is None:
                    resolve(kind, spec)
                else:
                    create(kind, spec)

    def build(self, cluster: Cluster) -> Scheduler:
        """A fresh core; policies named by string are created anew each time."""
        return Scheduler(
            cluster,
            create("queue", self.queue),
            create("backfill", self.backfill),
            create("estimate", self.estimate),
            create("placement", self.placement),
            create("cosched", self.cosched),
            sharing=self.sharing,
            window=self.window,
            keep_promises=self.keep_promises,
            max_cores_per_user=self.max_cores_per_user,
            max_running_jobs_per_user=self.max_running_jobs_per_user,
        )


@dataclass(slots=True)
class ReplayResult:
    """Finished and rejected jobs of one replay, and what it cost to compute."""

    policies: str
    cluster: Cluster
    jobs: list[Job]
    rejected: list[Job] = field(default_factory=list)
    passes: int = 0
    seconds: float = 0.0
    validator: ValidatingScheduler | None = None
    core: Scheduler | None = None
    accounts: dict[int, Accounts] = field(default_factory=dict)
    """Per-job CPU, quota and memory use over time (with `replay(account=True)`)."""


Reactor = Callable[[float, list[Event]], list[Event]]
"""Sees each step's backend events and may add submissions (workflow stages whose
predecessors just finished) to the same step. A job the core refuses is told to it as a
failed end after that step (a refused stage fails its workflow, as the daemon's `plan` has
it); a failed end adds nothing."""


class Replay:
    """One replay in progress: a core, a simulated backend, and the two event streams merged.

    `replay` runs it to the end. The learning environments (`cosched.learn.envs`) run the same
    passes but stop after those where a policy waits for an outside decision, answer it with
    `again`, and go on: an agent is trained on exactly the loop that replays and evaluates it.
    """

    def __init__(
        self,
        jobs: Sequence[Job],
        cluster: Cluster,
        policies: PolicySet | None = None,
        *,
        validate: bool = False,
        progress: Callable[[int], None] | None = None,
        rates: RateModel | None = None,
        react: Reactor | None = None,
        sample_every: float = 30.0,
        core: Scheduler | None = None,
        account: bool = False,
        keep_slots: bool = True,
    ) -> None:
        self.policies = policies or PolicySet()
        self.cluster = cluster
        self.core = core or self.policies.build(cluster)
        self.validator = ValidatingScheduler(self.core) if validate else None
        self.step = self.validator.step if self.validator else self.core.step
        self.backend = SimulatedBackend(cluster, rates, account=account, keep_slots=keep_slots)
        self.core.estimator.bind_truth(self.backend.truth)
        self.progress = progress
        self.react = react
        self.sample_every = sample_every
        self.pending = sorted(jobs, key=lambda j: j.submit)
        self.reacted: list[Job] = []
        self.passes_run = 0
        self.seconds = 0.0

    def run(self) -> ReplayResult:
        """Every pass, to the end."""
        for _ in self.passes():
            pass
        return self.result()

    def passes(self, pause: Callable[[float], bool] | None = None) -> Iterator[float]:
        """Run the replay pass by pass; after a pass where `pause(now)` is true, yield its time.

        While paused, the caller may take more passes at that time (`again`); the replay then
        goes on from whatever they changed. Without `pause` nothing is yielded.
        """
        core, backend, step, react, progress = self.core, self.backend, self.step, self.react, self.progress
        keep_slots, sample_every = backend.keep_slots, self.sample_every
        forget = None if keep_slots else backend.forget_slots
        sampling = core.cosched is not None and core.cosched.active
        pending, reacted = self.pending, self.reacted
        started_at = time.perf_counter()
        n, i, reported = len(pending), 0, 0
        apply, pop, next_time, admit = backend.apply, backend.pop, backend.next_time, backend.admit
        inf = math.inf
        next_wake = inf
        try:
            if n:
                decision = step(pending[0].submit, backend.start())
                apply(pending[0].submit, decision.actions)
                next_wake = decision.wake_at
            next_end = next_time()
            next_sample = pending[0].submit + sample_every if sampling and n else inf
            while True:
                next_submit = pending[i].submit if i < n else inf
                now = next_submit if next_submit < next_end else next_end
                if next_sample < now:
                    now = next_sample
                if next_wake < now:
                    now = next_wake
                if now == inf:
                    break
                ended = next_end <= now
                events: list[Event] = pop(now) if ended else []
                if react is not None and events:
                    added = react(now, events)
                    for event in added:
                        if isinstance(event, JobSubmitted):
                            reacted.append(admit(event.job))
                    events += added
                while i < n and pending[i].submit <= now:
                    events.append(JobSubmitted(admit(pending[i])))
                    i += 1
                if now == next_sample:
                    events += backend.sample(now)
                    busy = backend.running or core.queue or i < n
                    next_sample = now + sample_every if busy else inf
                decision = step(now, events)
                actions, next_wake = decision.actions, decision.wake_at
                if actions:
                    apply(now, actions)
                    if react is not None:
                        react(now, _refused(actions, now))
                self.passes_run += 1
                if pause is not None and pause(now):
                    self.seconds += time.perf_counter() - started_at
                    yield now
                    started_at = time.perf_counter()
                if forget and ended:  # only a pass that popped ends has slots to clear
                    forget()
                next_end = next_time()
                if sampling and next_sample == inf and (backend.running or core.queue):
                    next_sample = now + sample_every
                if progress is not None and i - reported >= PROGRESS_EVERY:
                    progress(i - reported)
                    reported = i
            if progress is not None and i > reported:
                progress(i - reported)
        finally:
            self.seconds += time.perf_counter() - started_at
            backend.reveal_all()
        if core.queue:
            raise SchedulingError(f"{len(core.queue)} jobs were still queued when the replay ran out of events")

    def again(self, now: float) -> None:
        """One more pass at `now` with no new event (as the daemon's periodic pass), after a
        decision was taken outside the core; what it starts, the backend starts."""
        actions = self.step(now, []).actions
        if actions:
            self.backend.apply(now, actions)
            if self.react is not None:
                self.react(now, _refused(actions, now))
        self.passes_run += 1

    def result(self) -> ReplayResult:
        """The finished and rejected jobs, once `passes` is exhausted."""
        backend = self.backend
        finished = _finished(self.pending + self.reacted if self.reacted else self.pending, backend.rejected)
        return ReplayResult(
            self.policies.label,
            self.cluster,
            finished,
            backend.rejected,
            self.passes_run,
            self.seconds,
            self.validator,
            self.core,
            backend.accounts,
        )


def replay(jobs: Sequence[Job], cluster: Cluster, policies: PolicySet | None = None, **options: Any) -> ReplayResult:
    """Run `jobs` (fresh, unstarted) through the core on `cluster`; `options` as `Replay`'s.

    `progress`, if given, is called with the number of newly submitted jobs
    every few thousand submissions. With `validate`, every step goes through
    `ValidatingScheduler`, which raises on any broken scheduling rule. When the
    core co-schedules, the backend's usage of running jobs is sampled every
    `sample_every` simulated seconds, as the daemon's monitor samples cgroups.
    With `keep_slots=False` a job's slots are cleared when it ends, so the memory
    a finished job holds does not grow with the nodes it ran on (studies and the
    CLI replay that way; keep them to inspect placements).

    Policies never see a job's true runtime: a job enters the core without it, as a live
    job does, and gets it back when it ends (`SimulatedBackend.admit`).
    """
    return Replay(jobs, cluster, policies, **options).run()


def _refused(actions: list[Any], now: float) -> list[Event]:
    """The jobs a step refused, as failed ends for the reactor."""
    return [JobEnded(a.job.id, failed=True, at=now) for a in actions if isinstance(a, Reject)]


def _finished(submitted: list[Job], rejected: list[Job]) -> list[Job]:
    """The jobs that ran, checked so that none is lost: every submitted job ran or was rejected.

    Whether a job ran is its state, not its start time: a trace's clock may start
    below zero, and a job started at -5 ran as surely as one started at 5.
    """
    refused = {id(job) for job in rejected}
    finished = [j for j in submitted if j.state not in _UNFINISHED and id(j) not in refused]
    lost = len(submitted) - len(finished) - len(refused)
    if lost:
        first = next(j for j in submitted if j.state in _UNFINISHED)
        raise SchedulingError(f"{lost} submitted jobs neither ran nor were rejected (first: job {first.id})")
    return finished

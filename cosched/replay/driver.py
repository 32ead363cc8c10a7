"""Replay: the scheduling core driven by a virtual clock.

The driver merges two time-ordered streams, submissions from the workload and
job ends from the simulated backend, and calls the core once per distinct
time with everything that happened then (ends first, so freed resources are
seen by that pass). It is the same `step(now, events)` the daemon calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosched.core.events import Event, JobSubmitted
from cosched.core.scheduler import Scheduler
from cosched.core.validate import ValidatingScheduler
from cosched.errors import SchedulingError
from cosched.model import Cluster, Job
from cosched.policies.registry import create, resolve
from cosched.replay.backend import SimulatedBackend

PROGRESS_EVERY = 4096


@dataclass(slots=True)
class PolicySet:
    """The four plugins a replay runs with, by alias, `module:Class`, or instance."""

    queue: Any = "fcfs"
    backfill: Any = "easy"
    estimate: Any = "requested"
    placement: Any = "first-fit"

    @property
    def label(self) -> str:
        """`queue+backfill[-estimate]`, by each plugin's short name."""

        def name(kind: str) -> str:
            spec = getattr(self, kind)
            if isinstance(spec, str):
                return spec if ":" not in spec else str(getattr(resolve(kind, spec), "name", "")) or spec
            return getattr(spec, "name", "") or type(spec).__name__

        suffix = "" if name("estimate") == "requested" else f"-{name('estimate')}"
        return f"{name('queue')}+{name('backfill')}{suffix}"

    def check(self) -> None:
        """Resolve every plugin name now, so a typo fails before any work is done."""
        for kind in ("queue", "backfill", "estimate", "placement"):
            spec = getattr(self, kind)
            if isinstance(spec, str):
                resolve(kind, spec)

    def build(self, cluster: Cluster) -> Scheduler:
        """A fresh core; policies named by string are created anew each time."""
        return Scheduler(
            cluster,
            create("queue", self.queue),
            create("backfill", self.backfill),
            create("estimate", self.estimate),
            create("placement", self.placement),
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


def replay(
    jobs: Sequence[Job],
    cluster: Cluster,
    policies: PolicySet | None = None,
    *,
    validate: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Run `jobs` (fresh, unstarted) through the core on `cluster`.

    `progress`, if given, is called with the number of newly submitted jobs
    every few thousand submissions. With `validate`, every step goes through
    `ValidatingScheduler`, which raises on any broken scheduling rule.
    """
    policies = policies or PolicySet()
    core = policies.build(cluster)
    checker = ValidatingScheduler(core) if validate else None
    step = checker.step if checker else core.step
    backend = SimulatedBackend(cluster)
    pending = sorted(jobs, key=lambda j: j.submit)
    started_at = time.perf_counter()
    n, i, passes, reported = len(pending), 0, 0, 0
    apply, pop, next_time = backend.apply, backend.pop, backend.next_time
    inf = math.inf
    if n:
        apply(pending[0].submit, step(pending[0].submit, backend.start()).actions)
    next_end = next_time()
    while True:
        next_submit = pending[i].submit if i < n else inf
        now = next_submit if next_submit < next_end else next_end
        if now == inf:
            break
        events: list[Event] = pop(now) if next_end <= now else []
        while i < n and pending[i].submit <= now:
            events.append(JobSubmitted(pending[i]))
            i += 1
        actions = step(now, events).actions
        if actions:
            apply(now, actions)
        next_end = next_time()
        passes += 1
        if progress is not None and i - reported >= PROGRESS_EVERY:
            progress(i - reported)
            reported = i
    if progress is not None and i > reported:
        progress(i - reported)

    if core.queue:
        raise SchedulingError(f"{len(core.queue)} jobs were still queued when the replay ran out of events")
    finished = [j for j in pending if j.start >= 0]
    return ReplayResult(
        policies.label,
        cluster,
        finished,
        backend.rejected,
        passes,
        time.perf_counter() - started_at,
        checker,
    )

"""How long a job would have run had nobody shared its cores, learned online.

Why: lending is judged by how much it slowed the lender, and the slowdown needs
a runtime to compare with. Replay knows each job's true runtime alone; a live
scheduler does not. It has two ways to know it, used in this order:

- Its kind's runs alone (`RuntimeBaselines`): every job that ran without lending
  and without a guest, per application class and core count (a stage's runtime
  depends on its cores). The last `keep` runtimes per kind are kept, and their
  median is the baseline, so one odd run (a failed input, a cold cache) moves
  it little and a workload that changes is followed.
- The lender's own pace (`paced_runtime_alone`), until its kind has run alone:
  the CPUs it kept busy alone (measured when the lending was decided) against
  those it kept busy while it shared (its usage sampled during the lending)
  give its speed while shared, so the time it lost is the shared time times
  (1 - that speed). CPU time is the measure of progress here: a throttled or
  contended job that progresses less also burns less CPU. What it misses is a
  neighbour that slows a job's every CPU-second (cache and memory-bandwidth
  contention keep the CPU busy): there the estimate errs low. Without it, a
  kind that never runs alone (every job of it lends) would never be scored,
  and its weights could never move.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Kind = tuple[str, int]
"""(application class, cores)."""


class RuntimeBaselines:
    """Runtimes alone per (application class, cores); `expected` is their median."""

    def __init__(self, keep: int = 20) -> None:
        self.keep = keep
        self._runtimes: dict[Kind, deque[float]] = {}

    def add(self, kind: Kind, runtime: float) -> None:
        if runtime > 0:
            self._runtimes.setdefault(kind, deque(maxlen=self.keep)).append(runtime)

    def expected(self, kind: Kind) -> float | None:
        """The median runtime alone of this kind, or None before one has been seen."""
        runs = self._runtimes.get(kind)
        return statistics.median(runs) if runs else None

    def kinds(self) -> int:
        return len(self._runtimes)

    def to_state(self) -> dict[str, Any]:
        """JSON-ready, for the daemon's state file."""
        return {
            "keep": self.keep,
            "runtimes": [[app, cores, list(runs)] for (app, cores), runs in self._runtimes.items()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RuntimeBaselines:
        baselines = cls(int(state.get("keep", 20)))
        for app, cores, runs in state.get("runtimes", []):
            for runtime in runs:
                baselines.add((str(app), int(cores)), float(runtime))
        return baselines


@dataclass(slots=True)
class Stretch:
    """A lender's time under one lending: from `start` to `end`, at `speed` of its pace alone."""

    start: float
    end: float
    speed: float


def shared_speed(alone_cpus: float, shared_cpus: float | None, shared_quota: float, cores: float) -> float:
    """A lender's speed while it lent, relative to alone, in [0, 1].

    `alone_cpus` are the CPUs it kept busy before lending; `shared_cpus` those it kept busy
    while lending (None if no sample fell in the lending: then the quota it kept stands in,
    the least it lost). A lender that used no CPU alone has nothing for a lending to slow.
    A lender that used more while lending than alone, and all the quota it kept, has grown
    (an idle phase, then a busy one): its need is taken as all its `cores`, the cautious guess.
    """
    if shared_cpus is not None and shared_cpus > alone_cpus and shared_cpus >= THROTTLED * shared_quota:
        alone_cpus = cores
    if alone_cpus <= 0:
        return 1.0
    busy = shared_cpus if shared_cpus is not None else shared_quota
    return min(1.0, max(0.0, busy / alone_cpus))


THROTTLED = 0.95
"""A job that used this share of its quota or more was held back by it."""


def paced_runtime_alone(runtime: float, stretches: Iterable[Stretch]) -> float:
    """The runtime alone of a lender that ran `runtime` seconds with these lendings: each
    stretch cost it (end - start) * (1 - speed) seconds of progress."""
    lost = sum(max(0.0, s.end - s.start) * (1.0 - s.speed) for s in stretches)
    return max(runtime - lost, 1e-9 * max(runtime, 1.0))

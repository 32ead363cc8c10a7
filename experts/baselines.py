"""How long a job of each kind runs when nobody shares its cores, learned online.

Why: lending is judged by how much it slowed the lender, and the slowdown needs
a runtime to compare with. Replay knows each job's true runtime alone; a live
scheduler does not. What it does see is every job that ran without lending
and without a guest: their runtimes, per application class and core count
(a stage's runtime depends on its cores), are the baseline the `live` loss
compares a lender's runtime with. The last `keep` runtimes per kind are kept,
and their median is the baseline, so one odd run (a failed input, a cold
cache) moves it little and a workload that changes is followed.
"""

from __future__ import annotations

import statistics
from collections import deque
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

"""What an expert sees about a running job: a few utilisation ratios and the happiness metric.

The ASAx paper (section 3.1) builds its cluster state from CPU%, Mem%, the workflow stage type,
the fraction of the walltime already used, and Hp(t), each metric combined with Hp in its own
decision tree. `JobFeatures` is that state for one running job; `as_vector` fixes the order in
which trees (and scikit-learn, when fitting them) read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cosched.errors import ConfigError

FEATURE_NAMES: tuple[str, ...] = ("cpu", "mem", "parallel", "progress", "happiness")
"""Column order of `JobFeatures.as_vector`; trees name features by these strings, so files stay readable."""

HAPPINESS_CAP = 10.0
"""Hp above this is written as this in `as_vector`: a job ten times ahead of its pace is simply
"very happy", and a finite cap keeps +inf (no tasks left) usable by scikit-learn, which rejects inf."""


@dataclass(frozen=True)
class JobFeatures:
    """Monitoring snapshot of one running job, as ratios so jobs of any size compare.

    cpu: CPU time actually used / CPU allocated, >= 0 (can exceed 1 slightly when a job bursts).
    mem: memory used / memory allocated, in [0, 1].
    parallel: True for a parallel stage (all cores busy), False for a sequential one (one core).
    progress: elapsed time / walltime, >= 0 (above 1 once the job overran its walltime).
    happiness: Hp(t) from `happiness`, >= 0, possibly +inf.

    Validated when built, so a broken monitor is caught where the snapshot is made, not inside a tree.
    """

    cpu: float
    mem: float
    parallel: bool
    progress: float
    happiness: float

    def __post_init__(self) -> None:
        for name in ("cpu", "progress"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"JobFeatures.{name} must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.mem) and 0.0 <= self.mem <= 1.0):
            raise ConfigError(f"JobFeatures.mem must be in [0, 1], got {self.mem!r}")
        if math.isnan(self.happiness) or self.happiness < 0:
            raise ConfigError(f"JobFeatures.happiness must be >= 0 (inf allowed), got {self.happiness!r}")
        if not isinstance(self.parallel, bool | np.bool_):
            raise ConfigError(f"JobFeatures.parallel must be a bool, got {self.parallel!r}")

    def value(self, name: str) -> float:
        """One feature as the float a tree compares (parallel -> 1.0/0.0, Hp capped at HAPPINESS_CAP)."""
        return float(self.as_vector()[FEATURE_NAMES.index(name)])

    def as_vector(self) -> np.ndarray:
        """Model input in FEATURE_NAMES order: [cpu, mem, parallel (1.0/0.0), progress, min(Hp, HAPPINESS_CAP)]."""
        return np.array(
            [self.cpu, self.mem, 1.0 if self.parallel else 0.0, self.progress, min(self.happiness, HAPPINESS_CAP)],
            dtype=float,
        )


def happiness(walltime_left: float, tasks_done: int, tasks_total: int, elapsed: float) -> float:
    """Hp(t) = walltime_left * (tasks_done / elapsed) / (tasks_total - tasks_done).

    This is (time left) / (time the remaining tasks need at the pace so far): Hp >= 1 means the job
    finishes within its walltime at its current pace, Hp < 1 that it will not. (Eq. 1 as typeset in
    the paper divides by the rate instead of multiplying, which has units of s^2; the text around it
    and Hp ~ 1.0 as the decision point only make sense for this dimensionless ratio.)

    Edge cases, chosen so that the experts never lend on made-up evidence:
    - no tasks remaining -> +inf: nothing left that lending could slow down (maximally happy).
    - elapsed == 0 or tasks_done == 0 -> 1.0: no pace observed yet. 1.0 means "on pace, no slack",
      which the default experts treat as "lend cautiously". 0 would brand every single-task job
      (done only at its end) as doomed for its whole run, +inf would lend recklessly at start-up.
    - walltime_left <= 0 with tasks remaining -> 0.0: the job already overran. The paper's
      |t_walltime - t| would make an overrunning job look happy again, which is backwards.
    Negative counts, tasks_done > tasks_total, negative elapsed or NaN are errors (ConfigError).
    """
    for name, value in (("walltime_left", walltime_left), ("elapsed", elapsed)):
        if math.isnan(value) or math.isinf(value):
            raise ConfigError(f"happiness: {name} must be finite, got {value!r}")
    if elapsed < 0:
        raise ConfigError(f"happiness: elapsed must be >= 0, got {elapsed!r}")
    if tasks_total < 1 or not 0 <= tasks_done <= tasks_total:
        raise ConfigError(
            f"happiness: need 0 <= tasks_done <= tasks_total and tasks_total >= 1, "
            f"got tasks_done={tasks_done}, tasks_total={tasks_total}"
        )
    remaining = tasks_total - tasks_done
    if remaining == 0:
        return math.inf
    if elapsed == 0 or tasks_done == 0:
        return 1.0
    if walltime_left <= 0:
        return 0.0
    return walltime_left * (tasks_done / elapsed) / remaining

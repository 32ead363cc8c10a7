"""Losses in [0, 1] for a finished lending decision, as Algorithm 1 needs them (|l(a)| <= 1).

Two views of "lending hurt the job":
- `walltime_loss` (paper section 3.2): only overrunning the walltime the user asked for counts;
  finishing late but within the walltime is free, since that time was the user's to spend.
- `degradation_loss` (paper section 4.4): any slowdown against a baseline run counts, and a 50%
  slowdown is already the worst case (loss 1).
"""

from __future__ import annotations

import math
from numbers import Real

from cosched.errors import ConfigError


def walltime_loss(runtime: float, walltime: float) -> float:
    """0 within the walltime, else min(1, (runtime - walltime) / walltime).

    Paper example: walltime 100 s, runtime 140 s -> 0.4; runtime 70 s -> 0.
    """
    _check_positive("walltime", walltime)
    _check_nonnegative("runtime", runtime)
    if runtime <= walltime:
        return 0.0
    return min(1.0, (runtime - walltime) / walltime)


def degradation_loss(runtime: float, baseline_runtime: float, full_at: float = 0.5) -> float:
    """min(1, max(0, runtime / baseline - 1) / full_at): the slowdown, scaled so `full_at` (50%) is 1.

    A run faster than its baseline (noise, a warmer cache) is loss 0, not a negative reward:
    Algorithm 1's risk only accumulates losses in [0, 1].
    """
    _check_positive("baseline_runtime", baseline_runtime)
    _check_positive("full_at", full_at)
    _check_nonnegative("runtime", runtime)
    return min(1.0, max(0.0, runtime / baseline_runtime - 1.0) / full_at)


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _check_nonnegative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")

"""Algorithm 1 of the ASAx paper: exponential weights over experts, updated in rounds of bounded risk.

Per decision: mix the experts' distributions with the current weights alpha (line 6), sample an
action (line 7). When that decision's loss l(a) in [0, 1] is known, add p_i(a) * l(a) to each
expert's round risk r_i (line 10). Once max_i r_i > 1 the round ends (line 3): alpha_i <-
alpha_i * exp(-gamma_t * r_i) / N_t, r <- 0, t <- t + 1 (line 12). Rounds therefore have
per-expert risk in [0, 2), which is what Hoeffding's lemma in the Appendix uses (its 4 gamma^2 / 8).

The step size gamma_t must be non-increasing (Theorem 1). Schedules, by name:
- "tuned" (default): constant gamma = sqrt(2 ln n / horizon). Theorem 1 with a constant gamma is
  E_t <= ln(n)/gamma + gamma t / 2; this gamma minimises it at t = horizon, giving
  E <= sqrt(2 horizon ln n). Constant schedules are the default because for them the Appendix
  proof is exact: with gamma_t varying, Algorithm 1's multiplicative update weights early rounds
  more (alpha_t ~ exp(-sum_s gamma_s r_s)), the step from the gamma-weighted bound to E_t (the
  "Abel inequality" step) needs every prefix of the weighted excess risk to be >= 0, and an
  adversary that makes the early leader bad later breaks it (tests/test_experts_weights.py shows
  a "sqrt" run exceeding the stated bound). `horizon` is the number of rounds one application
  class is expected to see; past it the bound still holds, only no longer at its optimum.
- "constant": gamma_t = gamma.
- "sqrt": gamma_t = gamma / sqrt(t), the usual anytime choice; kept for experiments (see above).

State (`to_state`) is a JSON-able dict, so the daemon persists it with the rest of its state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from cosched.errors import ConfigError

SCHEDULES = ("tuned", "constant", "sqrt")
DEFAULT_SCHEDULE = "tuned"
DEFAULT_GAMMA = 0.5
DEFAULT_HORIZON = 100
STATE_VERSION = 1
_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Schedule:
    """A non-increasing step-size schedule gamma_t, t = 1, 2, ... (see the module docstring)."""

    name: str = DEFAULT_SCHEDULE
    gamma: float = DEFAULT_GAMMA
    horizon: int = DEFAULT_HORIZON

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ConfigError(f"unknown gamma schedule {self.name!r} (known: {', '.join(SCHEDULES)})")
        if not (_is_real(self.gamma) and self.gamma > 0):
            raise ConfigError(f"gamma must be a finite number > 0, got {self.gamma!r}")
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or self.horizon < 1:
            raise ConfigError(f"horizon must be an integer >= 1, got {self.horizon!r}")

    def gamma_at(self, t: int, n: int) -> float:
        """gamma_t for update number t >= 1 with n experts."""
        if self.name == "constant":
            return float(self.gamma)
        if self.name == "sqrt":
            return float(self.gamma) / math.sqrt(t)
        return math.sqrt(2.0 * math.log(max(n, 2)) / self.horizon)

    def to_state(self) -> dict[str, Any]:
        return {"name": self.name, "gamma": float(self.gamma), "horizon": self.horizon}

    @classmethod
    def from_state(cls, state: Any) -> Schedule:
        if not isinstance(state, dict) or set(state) != {"name", "gamma", "horizon"}:
            raise ConfigError(f"schedule state must have keys name, gamma, horizon; got {state!r}")
        return cls(state["name"], state["gamma"], state["horizon"])


class ExponentialWeights:
    """Weights alpha over n experts plus the running round's risk r; Algorithm 1 lines 2-12.

    `mix` and `choose` only read alpha (one small matrix-vector product), so they are cheap enough
    to call per decision; the caller records the dists and alpha it used, for explanations.
    """

    def __init__(self, n: int, schedule: Schedule | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"number of experts must be an integer >= 1, got {n!r}")
        self.n = n
        self.schedule = schedule or Schedule()
        self.alpha = np.full(n, 1.0 / n)  # alpha_0 = 1/n
        self.r = np.zeros(n)
        self.t = 0  # completed rounds (weight updates) so far
        self.last_gamma: float | None = None  # gamma of the latest update, for tests and logs

    def mix(self, dists: np.ndarray) -> np.ndarray:
        """p = sum_i alpha_i p_i(x) (line 6); dists has shape (n, m), the result shape (m,)."""
        return self.alpha @ dists

    def choose(self, dists: np.ndarray, rng: np.random.Generator) -> int:
        """Sample an action index from `mix(dists)` (line 7) with the caller's generator (seeded there)."""
        cumulative = np.cumsum(self.mix(dists))
        k = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return min(k, len(cumulative) - 1)

    def observe(self, dists: np.ndarray, action: int, loss: float) -> bool:
        """Add p_i(action) * loss to each r_i (line 10); run `update` if max r > 1. True if it did.

        `dists` must be the (n, m) distributions the decision was made from, whatever alpha is now.
        """
        dists = np.asarray(dists, dtype=float)
        if dists.ndim != 2 or dists.shape[0] != self.n:
            raise ConfigError(f"dists must have shape (n={self.n}, m), got {dists.shape}")
        if isinstance(action, bool) or not 0 <= int(action) < dists.shape[1] or int(action) != action:
            raise ConfigError(f"action must be an index in 0..{dists.shape[1] - 1}, got {action!r}")
        if not (_is_real(loss) and 0.0 <= loss <= 1.0):
            raise ConfigError(f"loss must be in [0, 1], got {loss!r}")
        self.r += dists[:, int(action)] * float(loss)
        if self.r.max() > 1.0:
            self.update()
            return True
        return False

    def update(self) -> None:
        """End the round (line 12): alpha_i <- alpha_i exp(-gamma_t r_i) / N_t; r <- 0; t <- t + 1.

        `observe` calls this when the risk threshold is crossed; calling it earlier closes a round
        with less risk, which keeps Theorem 1's per-round condition (max_i r_i <= 2).
        """
        self.t += 1
        gamma = self.schedule.gamma_at(self.t, self.n)
        # Shift by min r before exponentiating: the factor cancels in N_t and keeps exp() in range.
        unnormalised = self.alpha * np.exp(-gamma * (self.r - self.r.min()))
        self.alpha = unnormalised / unnormalised.sum()
        self.r = np.zeros(self.n)
        self.last_gamma = gamma

    def to_state(self) -> dict[str, Any]:
        """JSON-able snapshot: version, alpha, r, t, schedule."""
        return {
            "version": STATE_VERSION,
            "alpha": [float(a) for a in self.alpha],
            "r": [float(x) for x in self.r],
            "t": self.t,
            "schedule": self.schedule.to_state(),
        }

    @classmethod
    def from_state(cls, state: Any) -> ExponentialWeights:
        """Rebuild from `to_state`; ConfigError on a newer version, wrong lengths, non-finite values,
        negative weights, weights not summing to 1, or a risk outside [0, 1] (a saved round is open)."""
        if not isinstance(state, dict):
            raise ConfigError(f"weights state must be an object, got {type(state).__name__}")
        missing = {"version", "alpha", "r", "t", "schedule"} - set(state)
        if missing:
            raise ConfigError(f"weights state lacks {sorted(missing)}")
        version = state["version"]
        if not isinstance(version, int) or version < 1:
            raise ConfigError(f"weights state version must be an integer >= 1, got {version!r}")
        if version > STATE_VERSION:
            raise ConfigError(f"weights state version {version} is newer than supported ({STATE_VERSION})")
        alpha, r = _real_list(state["alpha"], "alpha"), _real_list(state["r"], "r")
        if not alpha:
            raise ConfigError("weights state: alpha is empty")
        if len(r) != len(alpha):
            raise ConfigError(f"weights state: alpha has {len(alpha)} entries but r has {len(r)}")
        if min(alpha) < 0 or abs(math.fsum(alpha) - 1.0) > _SUM_TOLERANCE:
            raise ConfigError(f"weights state: alpha must be >= 0 and sum to 1, sums to {math.fsum(alpha)!r}")
        if min(r) < 0 or max(r) > 1.0:
            raise ConfigError(f"weights state: risks r must lie in [0, 1], got {r}")
        t = state["t"]
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ConfigError(f"weights state: t must be an integer >= 0, got {t!r}")
        weights = cls(len(alpha), Schedule.from_state(state["schedule"]))
        weights.alpha = np.array(alpha)  # as saved, not renormalised: a restored learner replays bit-identically
        weights.r = np.array(r)
        weights.t = t
        return weights


class WeightBook:
    """One ExponentialWeights per application class ("blast", "montage.project", ...).

    ASAx learns which expert to trust per kind of job (section 3.2 updates "Job_a's" weights);
    keying by class lets a class's history carry over to its next jobs. A class gets fresh
    uniform weights on first use.
    """

    def __init__(self, n_experts: int, schedule: Schedule | None = None) -> None:
        if isinstance(n_experts, bool) or not isinstance(n_experts, int) or n_experts < 1:
            raise ConfigError(f"number of experts must be an integer >= 1, got {n_experts!r}")
        self.n_experts = n_experts
        self.schedule = schedule or Schedule()
        self._weights: dict[str, ExponentialWeights] = {}

    def get(self, app_class: str) -> ExponentialWeights:
        """The weights of `app_class`, created (alpha = 1/n) on first use."""
        if not isinstance(app_class, str) or not app_class:
            raise ConfigError(f"application class must be a non-empty string, got {app_class!r}")
        if app_class not in self._weights:
            self._weights[app_class] = ExponentialWeights(self.n_experts, self.schedule)
        return self._weights[app_class]

    def classes(self) -> list[str]:
        """Classes seen so far, sorted."""
        return sorted(self._weights)

    def __contains__(self, app_class: object) -> bool:
        return app_class in self._weights

    def to_state(self) -> dict[str, Any]:
        """JSON-able snapshot of every class, plus the expert count and schedule new classes get."""
        return {
            "version": STATE_VERSION,
            "n_experts": self.n_experts,
            "schedule": self.schedule.to_state(),
            "classes": {name: self._weights[name].to_state() for name in self.classes()},
        }

    @classmethod
    def from_state(cls, state: Any) -> WeightBook:
        """Rebuild from `to_state`; ConfigError naming the class whose state is bad."""
        if not isinstance(state, dict) or not {"version", "n_experts", "schedule", "classes"} <= set(state):
            raise ConfigError("weight book state must have keys version, n_experts, schedule, classes")
        if not isinstance(state["version"], int) or state["version"] > STATE_VERSION:
            raise ConfigError(f"weight book state version {state['version']!r} is not supported ({STATE_VERSION})")
        book = cls(state["n_experts"], Schedule.from_state(state["schedule"]))
        classes = state["classes"]
        if not isinstance(classes, dict):
            raise ConfigError("weight book state: 'classes' must be an object")
        for name, sub in classes.items():
            try:
                weights = ExponentialWeights.from_state(sub)
            except ConfigError as exc:
                raise ConfigError(f"weight book class {name!r}: {exc}") from exc
            if weights.n != book.n_experts:
                raise ConfigError(f"weight book class {name!r}: {weights.n} weights for {book.n_experts} experts")
            book._weights[name] = weights
        return book


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _real_list(value: Any, name: str) -> list[float]:
    if not isinstance(value, list) or not all(_is_real(v) for v in value):
        raise ConfigError(f"weights state: {name} must be a list of finite numbers")
    return [float(v) for v in value]

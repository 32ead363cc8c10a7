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

The round threshold (`Schedule.threshold`, 1 in the paper's line 3) bounds a round's risk: it ends
once max_i r_i passes the threshold, so r_i < threshold + 1 (one case adds at most 1). Hoeffding's
term is then gamma^2 (threshold + 1)^2 / 8 per round (the paper's 4 gamma^2 / 8 at threshold 1), and
`Ledger.bound` states Theorem 1 with it. A lower threshold closes rounds sooner: more updates, each
smaller, which is what a learner whose losses come late and small needs to move at all within the
horizon it sees (docs/asax.md says how the defaults were chosen, with measurements).

Every learner keeps the two sums of Theorem 1's excess risk (`Ledger`): the mixture's risk (each
case's p_i(a) l(a) weighted by the alpha in force when it was counted) and each expert's risk, so
the bound can be checked on any run, live or replayed.

State (`to_state`) is a JSON-able dict, so the daemon persists it with the rest of its state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from cosched.errors import ConfigError

SCHEDULES = ("tuned", "constant", "sqrt")
DEFAULT_SCHEDULE = "tuned"
DEFAULT_GAMMA = 0.5
DEFAULT_HORIZON = 100
DEFAULT_THRESHOLD = 0.1
PAPER_THRESHOLD = 1.0
STATE_VERSION = 1
_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Schedule:
    """A non-increasing step-size schedule gamma_t, t = 1, 2, ..., and the round threshold (module docstring)."""

    name: str = DEFAULT_SCHEDULE
    gamma: float = DEFAULT_GAMMA
    horizon: int = DEFAULT_HORIZON
    threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ConfigError(f"unknown gamma schedule {self.name!r} (known: {', '.join(SCHEDULES)})")
        if not (_is_real(self.gamma) and self.gamma > 0):
            raise ConfigError(f"gamma must be a finite number > 0, got {self.gamma!r}")
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or self.horizon < 1:
            raise ConfigError(f"horizon must be an integer >= 1, got {self.horizon!r}")
        if not (_is_real(self.threshold) and 0 < self.threshold <= 1):
            raise ConfigError(f"round threshold must be a number in (0, 1], got {self.threshold!r}")

    @property
    def hoeffding(self) -> float:
        """(range of a round's risk)^2 / 8: Theorem 1's per-round term is gamma^2 times this."""
        return (self.threshold + 1.0) ** 2 / 8.0

    def gamma_at(self, t: int, n: int) -> float:
        """gamma_t for update number t >= 1 with n experts.

        "tuned" minimises ln(n)/gamma + gamma * horizon * hoeffding: gamma = sqrt(ln n / (horizon * hoeffding)),
        which is sqrt(2 ln n / horizon) at the paper's threshold 1.
        """
        if self.name == "constant":
            return float(self.gamma)
        if self.name == "sqrt":
            return float(self.gamma) / math.sqrt(t)
        return math.sqrt(math.log(max(n, 2)) / (self.horizon * self.hoeffding))

    def to_state(self) -> dict[str, Any]:
        return {"name": self.name, "gamma": float(self.gamma), "horizon": self.horizon, "threshold": self.threshold}

    @classmethod
    def from_state(cls, state: Any) -> Schedule:
        """A saved schedule; one saved before thresholds existed ran with the paper's threshold 1."""
        if not isinstance(state, dict) or not {"name", "gamma", "horizon"} <= set(state) <= _SCHEDULE_KEYS:
            raise ConfigError(f"schedule state must have keys name, gamma, horizon (and threshold); got {state!r}")
        return cls(state["name"], state["gamma"], state["horizon"], state.get("threshold", PAPER_THRESHOLD))


_SCHEDULE_KEYS = {"name", "gamma", "horizon", "threshold"}


@dataclass
class Ledger:
    """The two sums of Theorem 1's excess risk over every case a learner counted, and its gammas.

    mixed: sum over cases of sum_i alpha_i p_i(a) l(a), with the alpha in force when the case was
    counted (the round's alpha_{s-1}); experts[i]: sum of p_i(a) l(a), what expert i alone would
    have risked on the same cases (the paper's counterfactual: the action actually taken, scored by
    the probability the expert gave it). `excess` is E_t; `bound` is Theorem 1's, with the round
    still open counted as one more round (its risk is bounded like any other).
    """

    mixed: float = 0.0
    experts: list[float] = field(default_factory=list)
    cases: int = 0
    gamma_squares: float = 0.0

    def count(self, alpha: np.ndarray, risk: np.ndarray) -> None:
        if not self.experts:
            self.experts = [0.0] * len(risk)
        self.mixed += float(alpha @ risk)
        self.experts = [float(a + b) for a, b in zip(self.experts, risk, strict=True)]
        self.cases += 1

    @property
    def excess(self) -> float:
        return self.mixed - min(self.experts) if self.experts else 0.0

    @property
    def experts_mean(self) -> float:
        """Uniform mixing's risk on the same cases: the mean of the experts'."""
        return sum(self.experts) / len(self.experts) if self.experts else 0.0

    def to_state(self) -> dict[str, Any]:
        return {
            "mixed": self.mixed,
            "experts": list(self.experts),
            "cases": self.cases,
            "gamma_squares": self.gamma_squares,
        }

    @classmethod
    def from_state(cls, state: Any, n: int) -> Ledger:
        if not isinstance(state, dict) or set(state) != {"mixed", "experts", "cases", "gamma_squares"}:
            raise ConfigError("weights state: ledger must have keys mixed, experts, cases, gamma_squares")
        experts = _real_list(state["experts"], "ledger experts")
        if experts and len(experts) != n:
            raise ConfigError(f"weights state: ledger has {len(experts)} experts' risks for {n} experts")
        cases = state["cases"]
        if isinstance(cases, bool) or not isinstance(cases, int) or cases < 0:
            raise ConfigError(f"weights state: ledger cases must be an integer >= 0, got {cases!r}")
        for name in ("mixed", "gamma_squares"):
            if not _is_real(state[name]) or state[name] < 0:
                raise ConfigError(f"weights state: ledger {name} must be a finite number >= 0")
        return cls(float(state["mixed"]), experts, cases, float(state["gamma_squares"]))


class ExponentialWeights:
    """Weights alpha over n experts plus the running round's risk r; Algorithm 1 lines 2-12.

    `mix` and `choose` only read alpha (one small matrix-vector product), so they are cheap enough
    to call per decision; the caller records the dists and alpha it used, for explanations.
    """

    def __init__(
        self, n: int, schedule: Schedule | None = None, *, alpha: np.ndarray | None = None, frozen: bool = False
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"number of experts must be an integer >= 1, got {n!r}")
        self.n = n
        self.schedule = schedule or Schedule()
        self.alpha = np.full(n, 1.0 / n) if alpha is None else np.array(alpha, dtype=float)  # alpha_0 = 1/n
        self.r = np.zeros(n)
        self.t = 0  # completed rounds (weight updates) so far
        self.last_gamma: float | None = None  # gamma of the latest update, for tests and logs
        self.frozen = frozen
        """Count risks but never update: a fixed mixture (one expert alone, uniform) to compare with."""
        self.ledger = Ledger()

    def bound(self) -> float:
        """Theorem 1: E_t <= gamma_t^-1 (ln n + hoeffding * sum_s gamma_s^2), over the rounds so far
        plus the open one (the paper's hoeffding is 1/2: threshold 1)."""
        gamma = self.schedule.gamma_at(self.t + 1, self.n)
        squares = self.ledger.gamma_squares + gamma**2
        return (math.log(self.n) + self.schedule.hoeffding * squares) / gamma

    def mix(self, dists: np.ndarray) -> np.ndarray:
        """p = sum_i alpha_i p_i(x) (line 6); dists has shape (n, m), the result shape (m,)."""
        return self.alpha @ dists

    def choose(self, dists: np.ndarray, rng: np.random.Generator) -> int:
        """Sample an action index from `mix(dists)` (line 7) with the caller's generator (seeded there)."""
        cumulative = np.cumsum(self.mix(dists))
        k = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return min(k, len(cumulative) - 1)

    def observe(self, dists: np.ndarray, action: int, loss: float) -> bool:
        """Add p_i(action) * loss to each r_i (line 10); run `update` if max r passes the threshold. True if it did.

        `dists` must be the (n, m) distributions the decision was made from, whatever alpha is now.
        """
        dists = np.asarray(dists, dtype=float)
        if dists.ndim != 2 or dists.shape[0] != self.n:
            raise ConfigError(f"dists must have shape (n={self.n}, m), got {dists.shape}")
        if isinstance(action, bool) or not 0 <= int(action) < dists.shape[1] or int(action) != action:
            raise ConfigError(f"action must be an index in 0..{dists.shape[1] - 1}, got {action!r}")
        if not (_is_real(loss) and 0.0 <= loss <= 1.0):
            raise ConfigError(f"loss must be in [0, 1], got {loss!r}")
        risk = dists[:, int(action)] * float(loss)
        self.ledger.count(self.alpha, risk)
        if self.frozen:
            return False
        self.r += risk
        if self.r.max() > self.schedule.threshold:
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
        self.ledger.gamma_squares += gamma**2

    def to_state(self) -> dict[str, Any]:
        """JSON-able snapshot: version, alpha, r, t, schedule."""
        return {
            "version": STATE_VERSION,
            "alpha": [float(a) for a in self.alpha],
            "r": [float(x) for x in self.r],
            "t": self.t,
            "schedule": self.schedule.to_state(),
            "ledger": self.ledger.to_state(),
        }

    @classmethod
    def from_state(cls, state: Any) -> ExponentialWeights:
        """Rebuild from `to_state`; ConfigError on a newer version, wrong lengths, non-finite values,
        negative weights, weights not summing to 1, or a risk outside [0, threshold] (a saved round is open)."""
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
        t = state["t"]
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ConfigError(f"weights state: t must be an integer >= 0, got {t!r}")
        schedule = Schedule.from_state(state["schedule"])
        if min(r) < 0 or max(r) > schedule.threshold:
            raise ConfigError(f"weights state: risks r must lie in [0, {schedule.threshold:g}], got {r}")
        weights = cls(len(alpha), schedule)
        weights.alpha = np.array(alpha)  # as saved, not renormalised: a restored learner replays bit-identically
        weights.r = np.array(r)
        weights.t = t
        if "ledger" in state:  # absent in states saved before the ledger existed: it starts afresh
            weights.ledger = Ledger.from_state(state["ledger"], len(alpha))
        return weights


class WeightBook:
    """One ExponentialWeights per application class ("blast", "montage.project", ...).

    ASAx learns which expert to trust per kind of job (section 3.2 updates "Job_a's" weights);
    keying by class lets a class's history carry over to its next jobs. A class gets fresh
    uniform weights on first use.

    `fixed` makes a book whose learners never move from the given weights (one expert alone,
    uniform mixing): the baselines a learning book is measured against, on the same code path.
    """

    def __init__(self, n_experts: int, schedule: Schedule | None = None) -> None:
        if isinstance(n_experts, bool) or not isinstance(n_experts, int) or n_experts < 1:
            raise ConfigError(f"number of experts must be an integer >= 1, got {n_experts!r}")
        self.n_experts = n_experts
        self.schedule = schedule or Schedule()
        self._weights: dict[str, ExponentialWeights] = {}
        self._fixed: np.ndarray | None = None

    @classmethod
    def fixed(cls, alpha: list[float]) -> WeightBook:
        """A book whose every class keeps `alpha` (>= 0, summing to 1) for ever."""
        weights = np.array(alpha, dtype=float)
        if weights.ndim != 1 or not len(weights) or weights.min() < 0 or abs(weights.sum() - 1) > _SUM_TOLERANCE:
            raise ConfigError(f"fixed weights must be >= 0 and sum to 1, got {alpha!r}")
        book = cls(len(weights))
        book._fixed = weights
        return book

    def get(self, app_class: str) -> ExponentialWeights:
        """The weights of `app_class`, created (alpha = 1/n) on first use."""
        if not isinstance(app_class, str) or not app_class:
            raise ConfigError(f"application class must be a non-empty string, got {app_class!r}")
        if app_class not in self._weights:
            self._weights[app_class] = ExponentialWeights(
                self.n_experts, self.schedule, alpha=self._fixed, frozen=self._fixed is not None
            )
        return self._weights[app_class]

    def rescheduled(self, schedule: Schedule) -> WeightBook:
        """This book with `schedule` for every learner, old and new (the daemon's configured one wins over a
        saved one). A round whose risk already passes a lowered threshold ends now."""
        self.schedule = schedule
        for weights in self._weights.values():
            weights.schedule = schedule
            if weights.r.max() > schedule.threshold:
                weights.update()
        return self

    def classes(self) -> list[str]:
        """Classes seen so far, sorted."""
        return sorted(self._weights)

    def __contains__(self, app_class: object) -> bool:
        return app_class in self._weights

    @property
    def updates(self) -> int:
        """Rounds ended (weight updates) over all learners: how much the book has learned."""
        return sum(weights.t for weights in self._weights.values())

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

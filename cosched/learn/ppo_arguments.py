"""The MaskablePPO arguments `cosched train --ppo KEY=VALUE` may set, and the values each takes.

Checked when the option is parsed and when a resumed run's settings.json is read, so a misspelt
key or an impossible value is one line before any trace is read: MaskablePPO itself answers a
bad key with a TypeError, a bad learning rate with an assertion, and a batch of 0 only after a
whole epoch has run. Torch-free, so the check needs no training extra.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cosched.errors import ConfigError


@dataclass(frozen=True)
class _Range:
    """A number of `kind` in [low, high] (`open_low`: low itself refused); `none`: null allowed too."""

    kind: type
    low: float
    high: float = math.inf
    open_low: bool = False
    none: bool = False

    def check(self, value: Any) -> Any:
        """The value as the argument's kind, or ValueError saying what it must be."""
        if value is None and self.none:
            return None
        if self.kind is bool:
            if isinstance(value, bool) or value in ("true", "false"):
                return value in (True, "true")
            raise ValueError("must be true or false")
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not (whole or (isinstance(value, float) and self.kind is float)) or not self._within(value):
            raise ValueError(f"must be {self.describe()}")
        return self.kind(value)

    def _within(self, value: float) -> bool:
        low_ok = value > self.low if self.open_low else value >= self.low
        return low_ok and value <= self.high and abs(value) < 1e300  # finite, and no int beyond a float

    def describe(self) -> str:
        noun = "a whole number" if self.kind is int else "a number"
        low, high = _shown(self.low), _shown(self.high)
        bounds = f"{'(' if self.open_low else '['}{low}, {high}{')' if self.high == math.inf else ']'}"
        return f"{noun} in {bounds}{' or none' if self.none else ''}"


def _shown(bound: float) -> str:
    return f"{bound:g}" if bound == math.inf or not float(bound).is_integer() else str(int(bound))


PPO_ARGUMENTS: dict[str, _Range] = {
    "learning_rate": _Range(float, 0.0, 1.0),  # 0: the warm-started actor, no update (docs/learned-policies.md)
    "n_epochs": _Range(int, 1, 10_000),
    "batch_size": _Range(int, 2, 10**7),  # MaskablePPO normalizes advantages over a batch: one sample has none
    "gamma": _Range(float, 0.0, 1.0),
    "gae_lambda": _Range(float, 0.0, 1.0),
    "clip_range": _Range(float, 0.0, open_low=True),
    "clip_range_vf": _Range(float, 0.0, open_low=True, none=True),
    "normalize_advantage": _Range(bool, 0.0),
    "ent_coef": _Range(float, 0.0),
    "vf_coef": _Range(float, 0.0),
    "max_grad_norm": _Range(float, 0.0, open_low=True),
    "target_kl": _Range(float, 0.0, open_low=True, none=True),
    "stats_window_size": _Range(int, 1, 10**7),
}
"""MaskablePPO's scalar arguments a run may override. The others are cosched's: `n_steps` is
--steps, `seed` --seed, and the policy, its network and the device follow from the policy trained."""

_OWN = {"n_steps": "--steps", "seed": "--seed"}


def check_ppo_argument(key: str, value: Any) -> Any:
    """The value MaskablePPO gets for `key`; ConfigError naming the key when it takes no such value."""
    if key in _OWN:
        raise ConfigError(f"{key} is set by {_OWN[key]}, not --ppo")
    if key not in PPO_ARGUMENTS:
        raise ConfigError(f"unknown PPO argument {key!r}; known: {', '.join(PPO_ARGUMENTS)}")
    try:
        return PPO_ARGUMENTS[key].check(value)
    except ValueError as exc:
        raise ConfigError(f"{key} {exc}, got {value!r:.40}") from None


def check_ppo(arguments: Any) -> dict[str, Any]:
    """Every override of a run (`TrainSettings.ppo`), checked; ConfigError names the first bad one."""
    if not isinstance(arguments, dict):
        raise ConfigError(f"PPO arguments must be an object of KEY: VALUE, got {arguments!r:.40}")
    return {key: check_ppo_argument(key, value) for key, value in arguments.items()}

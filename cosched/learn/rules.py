"""Fixed rules in the learned policies' action spaces, as `decide` functions.

A rule answers from the observation and the mask alone, as an agent does. So it shows what
an agent could reach with what it sees (`benchmarks/learned_ceiling.py`), and training can
start from one (`cosched train --warm-start RULE`: the actor is first fitted to imitate it).

Each picks, among the jobs it may start now, the one with the lowest score (ties: arrival
order): `first` (arrival), `shortest` (requested time), `fewest` (cores), `area` (cores x
requested time), `f1` (F1's log10(requested time) x cores, without its submit-time term,
near constant within a window). RLBackfilling must start one of the jobs it is shown; DBF
may forward, and its rules do so when no job of the window fits, or, `ORDER-reserving`,
as EASY holds cores: the window's first job in the rule's order, if blocked, is reserved
the time it would fit (`dbf_observation(expected_start=True)`), and another job starts only
if it ends by then (EASY without its extra-capacity rule).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cosched.errors import ConfigError
from cosched.learn.features import CLUSTER_QUANTILES, RLBF_FEATURES, dbf_row_features, unscaled_time

ORDERS = ("first", "shortest", "fewest", "area", "f1")
RESERVING = "-reserving"


def rule_names(kind: str) -> tuple[str, ...]:
    """The rules of a kind of policy: every order, and for DBF each order reserving."""
    return ORDERS if kind == "rlbf" else ORDERS + tuple(order + RESERVING for order in ORDERS)


def check_rule(name: str, kind: str, expected_start: bool) -> None:
    """ConfigError (one line) unless `name` is a rule of `kind` that these observations allow."""
    if name not in rule_names(kind):
        raise ConfigError(f"unknown {kind} rule {name!r}; known: {', '.join(rule_names(kind))}")
    if name.endswith(RESERVING) and not expected_start:
        raise ConfigError(f"rule {name!r} reads when jobs would fit: it needs --expected-start")


def _scores(order: str, requested: np.ndarray, cores: np.ndarray) -> np.ndarray:
    if order == "first":
        return np.arange(len(requested), dtype=np.float64)
    if order == "shortest":
        return requested
    if order == "fewest":
        return cores
    if order == "area":
        return requested * cores
    return np.log10(np.maximum(requested, 1.0)) * cores


def rule(
    name: str,
    kind: str,
    *,
    time_scale: float,
    capacity: int,
    log_time: bool = False,
    expected_start: bool = False,
) -> Callable[[np.ndarray, np.ndarray], int]:
    """The `decide` of rule `name` for observations of `kind` made with these settings
    (a `policies.learned.Decide` that always answers: a rule never leaves a decision open)."""
    check_rule(name, kind, expected_start)
    order = name.removesuffix(RESERVING)
    reserving = name != order
    width = RLBF_FEATURES if kind == "rlbf" else dbf_row_features(expected_start)
    size_column, time_column = (2, 1) if kind == "rlbf" else (0, 1)

    def decide(observation: np.ndarray, mask: np.ndarray) -> int:
        rows = (observation if kind == "rlbf" else observation[CLUSTER_QUANTILES:]).reshape(-1, width)
        requested = unscaled_time(rows[:, time_column].astype(np.float64), time_scale, log_time)
        score = _scores(order, requested, rows[:, size_column] * capacity)
        allowed = np.flatnonzero(mask[: len(rows)])
        if reserving:
            present = np.flatnonzero(rows[:, 3] > 0)
            first = present[np.argmin(score[present])] if len(present) else -1
            if first >= 0 and not mask[first]:  # blocked: only what ends by its reserved start goes first
                allowed = allowed[rows[allowed, time_column] <= rows[first, 4]]
        if not len(allowed):
            return len(mask) - 1  # DBF's forward (RLBackfilling is always shown a job it may start)
        return int(allowed[np.argmin(score[allowed])])

    return decide

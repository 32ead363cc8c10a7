"""Fit expert trees with scikit-learn from logged decisions, so a site can replace the hand-written defaults.

For each expert family (one metric plus happiness, mirroring experts.default) a
DecisionTreeClassifier learns "which action was taken here" from the records, with
sample_weight = (1 - loss) + epsilon: a decision that went well counts fully, one that hit the
maximum loss barely counts, so each leaf's class frequencies lean toward the actions that worked
in that region of the state space. The fitted sklearn trees are converted to our Split/Leaf nodes,
so a fitted set saves, loads, validates, mixes and `describe`s exactly like the default one, and
scikit-learn is needed only here, at fit time (imported lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cosched.errors import ConfigError
from experts.features import FEATURE_NAMES
from experts.records import DecisionRecord, read_log, write_log
from experts.show import describe
from experts.store import MAX_DEPTH
from experts.tree import Expert, ExpertSet, Leaf, Node, Split

__all__ = ["FAMILIES", "DecisionRecord", "describe", "fit_experts", "read_log", "write_log"]

FAMILIES: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu", "happiness"),
    "mem": ("mem", "happiness"),
    "stage": ("parallel", "cpu", "happiness"),
    "progress": ("progress", "happiness"),
}
"""Expert name -> the features its tree may split on; the same families as the default set."""

EPSILON = 1e-3
"""Weight floor, so a region where every action had loss 1 still yields a (smoothed) leaf, not an error."""


def fit_experts(
    records: Sequence[DecisionRecord],
    m: int = 10,
    max_depth: int = 3,
    seed: int = 0,
    *,
    min_samples_leaf: int = 5,
    smoothing: float = 1.0,
) -> ExpertSet:
    """One fitted tree per family in FAMILIES, as an ExpertSet over the m-action grid.

    Leaf distributions cover all m actions by additive (Laplace) smoothing of the leaf's weighted
    action counts w_k: p_k = (w_k + smoothing) / (W + smoothing * m). An action never taken in a
    leaf thus keeps a small probability (`smoothing` pseudo-decisions of full weight), so Algorithm 1
    can still try it and every leaf is a valid distribution; leaves with much evidence are barely
    changed. `min_samples_leaf` keeps a split from isolating a handful of noisy decisions (a leaf
    that few cases reach says little). `seed` fixes scikit-learn's tie-breaking between equal splits.
    """
    from sklearn.tree import DecisionTreeClassifier  # lazy: only fitting needs scikit-learn

    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ConfigError(f"m must be an integer >= 1, got {m!r}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 1 <= max_depth <= MAX_DEPTH:
        # deeper, and the saved set would not load back (`experts.store.MAX_DEPTH`)
        raise ConfigError(f"max_depth must be an integer in [1, {MAX_DEPTH}], got {max_depth!r}")
    if isinstance(min_samples_leaf, bool) or not isinstance(min_samples_leaf, int) or min_samples_leaf < 1:
        raise ConfigError(f"min_samples_leaf must be an integer >= 1, got {min_samples_leaf!r}")
    if not smoothing > 0:
        raise ConfigError(f"smoothing must be > 0, got {smoothing!r}")
    if not records:
        raise ConfigError("cannot fit experts from an empty decision log")
    bad = [r.action for r in records if r.action >= m]
    if bad:
        raise ConfigError(f"action index {bad[0]} is outside the grid of m={m} actions")

    x = np.stack([r.features.as_vector() for r in records])
    y = np.array([r.action for r in records])
    weight = 1.0 - np.array([r.loss for r in records]) + EPSILON
    experts = []
    for name, columns in FAMILIES.items():
        index = [FEATURE_NAMES.index(c) for c in columns]
        model = DecisionTreeClassifier(max_depth=max_depth, min_samples_leaf=min_samples_leaf, random_state=seed)
        model.fit(x[:, index], y, sample_weight=weight)
        root = _convert(model.tree_, [int(c) for c in model.classes_], columns, m, smoothing)
        experts.append(Expert(name, root, f"fitted on {len(records)} decisions: {' x '.join(columns)}"))
    return ExpertSet(tuple(experts))


def _convert(tree: Any, classes: list[int], columns: tuple[str, ...], m: int, smoothing: float) -> Node:
    """sklearn's arrays -> Split/Leaf. Left child is `X[:, f] <= threshold`, our `below`.

    `tree.value` holds per-node class fractions (sklearn >= 1.4) or weighted counts (older); rescaling
    to `weighted_n_node_samples` gives weighted counts either way.
    """

    def build(node: int) -> Node:
        left, right = int(tree.children_left[node]), int(tree.children_right[node])
        if left == -1:  # sklearn's TREE_LEAF
            value = np.asarray(tree.value[node][0], dtype=float)
            counts = np.zeros(m)
            counts[classes] = value / value.sum() * float(tree.weighted_n_node_samples[node])
            return Leaf(tuple(_normalise(counts + smoothing)))
        feature = columns[int(tree.feature[node])]
        return Split(feature, float(tree.threshold[node]), build(left), build(right))

    return build(0)


def _normalise(weights: np.ndarray) -> list[float]:
    """Probabilities summing to 1 up to float rounding (the remainder goes to the largest entry)."""
    p = weights / weights.sum()
    p[int(np.argmax(p))] += 1.0 - p.sum()
    return [float(v) for v in p]

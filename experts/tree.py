"""Decision-tree experts: a job's features in, a distribution over CPU-quota lending actions out.

Action k of an m-action grid lends the fraction k/m of the running job's CPU allocation to a
co-scheduled job (m = 10: 0%, 10%, ..., 90%; section 3.2 of the ASAx paper). Each leaf holds
one distribution over those m actions, so an expert never has to pick a single action: the
weights learner mixes the experts' distributions and samples.

Everything is checked when a tree is built or loaded, so `predict` is a plain walk down the tree
at decision time and cannot fail on a tree that loaded.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cosched.errors import ConfigError
from experts.features import FEATURE_NAMES, JobFeatures

DIST_TOLERANCE = 1e-6
"""How far a leaf's probabilities may sum from 1 (rounding in hand-written files)."""


def lent_fractions(m: int) -> np.ndarray:
    """The action grid: action k lends k/m of the allocation (0, 1/m, ..., (m-1)/m; never all of it)."""
    return np.arange(m, dtype=float) / m


def expected_lent(dist: np.ndarray) -> float:
    """Mean lent fraction under a distribution over the grid: one number to compare distributions by."""
    return float(np.asarray(dist, dtype=float) @ lent_fractions(len(dist)))


@dataclass(frozen=True)
class Leaf:
    """A distribution over the m actions. Checked here: no negatives, sums to 1 within DIST_TOLERANCE."""

    dist: tuple[float, ...]
    array: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            values = tuple(float(p) for p in self.dist)
        except OverflowError:  # an integer beyond any float, which JSON allows (10**400)
            raise ConfigError("leaf distribution has a number too large for a float") from None
        if not values:
            raise ConfigError("leaf distribution is empty")
        if not all(math.isfinite(p) for p in values):
            raise ConfigError(f"leaf distribution has a non-finite value: {list(values)}")
        if min(values) < 0:
            raise ConfigError(f"leaf distribution has a negative probability {min(values)!r}")
        total = math.fsum(values)
        if abs(total - 1.0) > DIST_TOLERANCE:
            raise ConfigError(f"leaf distribution sums to {total!r}, not 1 (tolerance {DIST_TOLERANCE})")
        array = np.array(values, dtype=float)
        array.setflags(write=False)  # predict hands this array out without copying
        object.__setattr__(self, "dist", values)
        object.__setattr__(self, "array", array)


@dataclass(frozen=True)
class Split:
    """Go to `below` when features[feature] <= threshold, else to `above` (scikit-learn's convention)."""

    feature: str
    threshold: float
    below: Node
    above: Node
    index: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.feature not in FEATURE_NAMES:
            raise ConfigError(f"unknown feature {self.feature!r} (known: {', '.join(FEATURE_NAMES)})")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float):
            raise ConfigError(f"threshold of {self.feature!r} must be a number, got {self.threshold!r}")
        try:
            threshold = float(self.threshold)
        except OverflowError:  # an integer beyond any float, which JSON allows (10**400)
            threshold = math.inf
        if not math.isfinite(threshold):
            raise ConfigError(f"threshold of {self.feature!r} must be finite, got {_short(self.threshold)}")
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(self, "index", FEATURE_NAMES.index(self.feature))


Node = Split | Leaf


def _short(value: object) -> str:
    """repr, cut to one readable line: a hostile file's 400-digit integer is named, not printed whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def leaves(node: Node) -> Iterator[Leaf]:
    """Every leaf under `node`, left to right."""
    if isinstance(node, Leaf):
        yield node
    else:
        yield from leaves(node.below)
        yield from leaves(node.above)


@dataclass(frozen=True)
class Expert:
    """One named decision tree; `description` says which situation it encodes (shown by `describe`)."""

    name: str
    root: Node
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError(f"expert name must be a non-empty string, got {self.name!r}")
        sizes = {len(leaf.dist) for leaf in leaves(self.root)}
        if len(sizes) != 1:
            raise ConfigError(f"expert {self.name!r}: leaves have different lengths {sorted(sizes)}")

    @property
    def m(self) -> int:
        """Number of actions, the length of every leaf."""
        return len(next(leaves(self.root)).dist)

    def predict(self, features: JobFeatures) -> np.ndarray:
        """The leaf distribution for these features, shape (m,); read-only and shared, so do not modify it."""
        return self.predict_vector(features.as_vector())

    def predict_vector(self, x: np.ndarray) -> np.ndarray:
        """Like `predict` for a vector already in FEATURE_NAMES order (saves rebuilding it per expert)."""
        node = self.root
        while isinstance(node, Split):
            node = node.below if x[node.index] <= node.threshold else node.above
        return node.array


@dataclass(frozen=True)
class ExpertSet:
    """An ordered tuple of experts over one action grid; the order is the order of the weights."""

    experts: tuple[Expert, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "experts", tuple(self.experts))
        if not self.experts:
            raise ConfigError("an expert set needs at least one expert")
        names = [e.name for e in self.experts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"duplicate expert names: {', '.join(duplicates)}")
        m = self.experts[0].m
        for expert in self.experts[1:]:
            if expert.m != m:
                raise ConfigError(
                    f"expert {expert.name!r} has {expert.m} actions, "
                    f"expert {self.experts[0].name!r} has {m}: all must share one grid"
                )

    @property
    def m(self) -> int:
        """Number of actions shared by every expert."""
        return self.experts[0].m

    @property
    def names(self) -> tuple[str, ...]:
        """Expert names in weight order."""
        return tuple(e.name for e in self.experts)

    def __len__(self) -> int:
        return len(self.experts)

    def __iter__(self) -> Iterator[Expert]:
        return iter(self.experts)

    def predict_all(self, features: JobFeatures) -> np.ndarray:
        """Every expert's distribution, shape (n, m): row i is p_i(x), ready for `ExponentialWeights.mix`."""
        x = features.as_vector()
        return np.stack([e.predict_vector(x) for e in self.experts])

    def digest(self) -> str:
        """A short fingerprint of the set (its JSON document's SHA-256): weights learned for one set
        mean nothing for another, even of as many experts."""
        from experts.store import dumps

        return hashlib.sha256(dumps(self).encode()).hexdigest()[:16]

    def save(self, path: str | Path) -> None:
        """Write the set as a versioned JSON document (see experts.store)."""
        from experts.store import save_expert_set

        save_expert_set(self, path)

    @classmethod
    def load(cls, path: str | Path) -> ExpertSet:
        """Read and fully validate a JSON document written by `save` (or by hand); ConfigError if bad."""
        from experts.store import load_expert_set

        return load_expert_set(path)

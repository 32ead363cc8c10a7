"""Exponential backoff with jitter, so that many frameworks do not hammer a recovering master in step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delay before retry number `attempt` (0-based): half of min(cap, base * 2**attempt), plus up to that again.

    Half fixed, half random ("equal jitter"): spread out, yet never a near-zero wait that would turn a
    retry loop into a busy loop.
    """

    base: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        ceiling = min(self.cap, self.base * 2 ** min(attempt, 60))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

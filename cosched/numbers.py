"""What counts as a number in a file cosched reads: one rule for every loader of JSON.

Why its own module: JSON integers have no bound, and `math.isfinite(10**400)` raises
OverflowError instead of answering, so each loader's "is this a finite number" would
otherwise repeat the same four lines (expert sets, decision logs, explain records).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def is_finite_number(value: Any) -> bool:
    """A finite number a float holds (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False

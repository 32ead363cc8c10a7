"""A submission's start window: `begin` and `latest_start`, as given and as stored.

Why its own module: a deferrable job (OSDEC's [e_i, l_i]) may be given its times two ways,
as absolute epoch seconds or relative to its acceptance (`+600`, `now+600`, `now`, as
Slurm's `--begin=now+600`). Relative forms are resolved once, by the daemon's clock when it
accepts the job, and stored absolute: a restart must not move a window, and a client's
clock is not the daemon's. The form is checked with the request (a 422 naming the field);
the times against the clock when the job is accepted (`resolve`).
"""

from __future__ import annotations

import math
import re
from typing import Any

PAST_TOLERANCE = 60.0
"""A `begin` this many seconds in the past is taken as now (clock skew, a script's stamp);
one further back is refused: the user meant some other time."""

MAX_AHEAD = 3653 * 86400.0
"""How far ahead a window may lie (ten years): further is a typo, and a time past what the
platform's clocks hold (1e300) broke `cosched queue` for every user."""

_RELATIVE = re.compile(r"^\s*(?:now\s*)?\+\s*(\d+(?:\.\d+)?)\s*$|^\s*(now)\s*$")


def parse(value: Any) -> float | str | None:
    """A time as the API takes it: an absolute float, a relative `+N` (seconds after
    acceptance; `now` is `+0`), or None. ValueError with the problem otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("must be epoch seconds or +SECONDS, not a boolean")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError("must be a finite number of epoch seconds")
        if value < 0:
            raise ValueError(f"{value:g} is not epoch seconds (negative); use +SECONDS for a delay")
        return float(value)
    if isinstance(value, str):
        relative = _RELATIVE.match(value)
        if relative:
            return f"+{relative.group(1) or 0}"
        try:
            return parse(float(value))
        except ValueError:
            pass
    raise ValueError(f"{value!r} is neither epoch seconds nor +SECONDS (or now+SECONDS)")


def absolute(value: float | str | None, now: float) -> float | None:
    """A parsed time on the daemon's clock."""
    if isinstance(value, str):
        return now + float(value[1:])
    return value


def problem(begin: float | None, latest: float | None, now: float) -> tuple[str, str] | None:
    """(field, message) when the absolute window cannot be kept, else None."""
    for field, value in (("begin", begin), ("latest_start", latest)):
        if value is not None and value > now + MAX_AHEAD:
            return field, f"{value:.6g} is more than {MAX_AHEAD / 86400:.0f} days ahead"
    if begin is not None and begin < now - PAST_TOLERANCE:
        return "begin", f"{begin:.0f} is {now - begin:.0f} s in the past (more than {PAST_TOLERANCE:.0f} s)"
    if latest is not None:
        if latest < now:
            return "latest_start", f"{latest:.0f} has passed ({now - latest:.0f} s ago)"
        if begin is not None and latest < begin:
            return "latest_start", f"{latest:.0f} is before begin {begin:.0f}"
    return None


def stored(document: dict[str, Any]) -> tuple[float, float]:
    """(begin, latest start) of a stored job document, as the core's `Job` takes them."""
    begin, latest = document.get("begin"), document.get("latest_start")
    return (
        -math.inf if begin is None else float(begin),
        math.inf if latest is None else float(latest),
    )

"""Free capacity over time, as reservation-based backfilling plans it."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

from cosched.core.view import SchedulerView


class Profile:
    """Free capacity over time as a step function: free[i] holds on [times[i], times[i+1]).

    It starts at the running jobs' expected ends (`SchedulerView.releases`); a
    planner takes units from it for each reservation. Neighbouring steps never
    hold the same value (they are merged), so it has at most two steps per running
    job and reservation, and a scan for a start crosses only real changes.
    """

    __slots__ = ("free", "times")

    def __init__(self, view: SchedulerView) -> None:
        times, free = [view.now], [view.free_units]
        for end, units in view.releases():  # in time order
            if end == times[-1]:
                free[-1] += units
            elif units:
                times.append(end)
                free.append(free[-1] + units)
        self.times, self.free = times, free

    def earliest(self, need: int, duration: float, before: float = math.inf, since: float = -math.inf) -> float:
        """The first start from `since` on from which `need` units stay free for `duration`;
        inf if there is none before `before`.

        The window is checked up to `before` only: a job asking whether it can start
        earlier than its own reservation at `before` holds what it needs from there.
        """
        times, free = self.times, self.free
        n = len(times)
        i = bisect_right(times, since) - 1 if since > times[0] else 0
        while i < n:
            start = times[i]
            if start >= before:
                break
            if free[i] < need:
                i += 1
                continue
            end = start + duration
            if end > before:
                end = before
            j = i + 1
            while j < n and times[j] < end:
                if free[j] < need:
                    break
                j += 1
            else:
                return start
            i = j + 1
        return math.inf

    def add(self, start: float, end: float, units: int) -> None:
        """Add `units` (negative: take them) on [start, end), where times[0] <= start < end."""
        times, free = self.times, self.free
        i = bisect_left(times, start)
        if i == len(times) or times[i] != start:
            times.insert(i, start)
            free.insert(i, free[i - 1])
        j = bisect_left(times, end, lo=i + 1)
        if end != math.inf and (j == len(times) or times[j] != end):
            times.insert(j, end)
            free.insert(j, free[j - 1])
        if j == i + 1:
            free[i] += units
        else:
            free[i:j] = [f + units for f in free[i:j]]
        if j < len(times) and free[j] == free[j - 1]:
            del times[j], free[j]
        if i and free[i] == free[i - 1]:
            del times[i], free[i]

    def advance(self, now: float) -> None:
        """Drop the past: the profile then starts at `now`."""
        times = self.times
        i = bisect_right(times, now) - 1
        if i > 0:
            del times[:i]
            del self.free[:i]
        times[0] = now

    def stretches(self, start: float, end: float, need: int, gained: int, horizon: float) -> list[tuple[float, float]]:
        """The stretches with `need` units free throughout that `gained` units more on [start, end)
        made: (since, until), each holding a moment of [start, end) where fewer were free before.
        A stretch that lasts past `horizon` ends at infinity."""
        times, free = self.times, self.free
        n = len(times)
        k = bisect_right(times, start) - 1
        stop = bisect_left(times, end)
        found = []
        while k < stop:
            units = free[k]
            if units < need or units - gained >= need:
                k += 1
                continue
            lo = k
            while lo and free[lo - 1] >= need:
                lo -= 1
            while k + 1 < n and free[k + 1] >= need:
                k += 1
                if times[k] > horizon:
                    found.append((times[lo], math.inf))
                    return found
            found.append((times[lo], times[k + 1] if k + 1 < n else math.inf))
            k += 1
        return found

"""What the learned policies see: fixed-size observations built from a scheduler view.

Both the training environments and the plugins call these functions on the same
`SchedulerView` at the same decision points, so a trained agent sees in replay and
in the daemon exactly what it saw while learning. Only requested times, sizes,
waits and estimated ends go in: the true runtime is not in the view.

RLBackfilling (Kolker-Hicks, Zhang and Dai): one row per job that could start now
behind the blocked head, in submission order, with the features of DIR-LAB's
simulator: the wait, the requested time, the size, the requested time against the
gap to the head's reserved start (the shadow time), and the size against the free
capacity. Padding rows are masked.

DBF (Wang, Harwood and Rodriguez): a window of M queued jobs, the first `head` and
the last `tail` (the split window; `tail = 0` is the head-only window), each as
(size, requested time, wait, present) and, with `expected_start`, the time until it
would fit by the running jobs' estimates (its reserved start under EASY, 0 when it
fits now), and the cluster as the remaining estimated busy time of its units. The
paper gives one value per core; here it is summarised by `CLUSTER_QUANTILES` evenly
spaced values of the sorted per-unit times, so one model runs on a cluster of any
size (the daemon's host as well as Lublin's 256 cores). The last action is DBF's
forward (wait for the next arrival or end).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cosched.core.view import SchedulerView
from cosched.model import Job

MAX_WAIT = 12 * 3600.0
"""Waits are normalised by 12 hours and capped there, as in DIR-LAB's simulator."""
CAP = 1.0 - 1e-5
RLBF_FEATURES = 5
RLBF_PAD = np.array([0.0, 1.0, 1.0, 1.0, 1.0], dtype=np.float32)
DBF_FEATURES = 4
"""Per job of DBF's window: size, requested time, wait, present."""
DBF_START_FEATURES = 5
"""The same and the time until the job would fit (`dbf_observation(expected_start=True)`)."""
CLUSTER_QUANTILES = 32


def scaled_time(seconds: np.ndarray, time_scale: float, log_time: bool) -> np.ndarray:
    """Times (requested, remaining) as features: `seconds / time_scale` (the papers'), or with
    `log_time` `log(1 + seconds) / log(1 + time_scale)`. Requests span seconds to days and a
    trace's longest one can be 100 days (HPC2N): divided by it, almost every job reads as 0.00x
    and a small network barely tells a 10-minute job from a 10-hour one; on a log scale they
    are evenly spread (docs/learned-policies.md measures both)."""
    if log_time:
        return np.log1p(np.maximum(seconds, 0.0)) / math.log1p(time_scale)
    return seconds / time_scale


def unscaled_time(features: np.ndarray, time_scale: float, log_time: bool) -> np.ndarray:
    """Seconds back from `scaled_time`'s features (for rules that read an observation)."""
    if log_time:
        return np.expm1(features * math.log1p(time_scale))
    return features * time_scale


def rlbf_candidates(view: SchedulerView, head: int) -> list[Job]:
    """The queued jobs behind the blocked head that fit in the free capacity now, in
    submission order (the paper sorts its observation by submit time)."""
    free = view.free_units
    queue = view.queue
    fits = [job for job in queue[head + 1 :] if job.need <= free]
    fits.sort(key=lambda job: (job.submit, job.id))
    return fits


def rlbf_observation(
    jobs: Sequence[Job], view: SchedulerView, shadow: float, window: int, time_scale: float, log_time: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(observation of `window` rows of `RLBF_FEATURES`, flattened; mask of the rows that hold a job)."""
    rows = np.tile(RLBF_PAD, (window, 1))
    mask = np.zeros(window, dtype=bool)
    shown = jobs[:window]
    n = len(shown)
    if n:
        now, free, capacity = view.now, max(view.free_units, 1), view.capacity_units
        walltime = np.fromiter((job.walltime for job in shown), dtype=np.float64, count=n)
        submit = np.fromiter((job.submit for job in shown), dtype=np.float64, count=n)
        need = np.fromiter((job.need for job in shown), dtype=np.float64, count=n)
        gap = shadow - now + 2.0 if math.isfinite(shadow) else math.inf
        block = np.stack(
            (
                (now - submit) / MAX_WAIT,
                scaled_time(walltime, time_scale, log_time),
                need / capacity,
                walltime / gap,
                need / free,
            ),
            axis=1,
        )
        rows[:n] = np.clip(block, 0.0, CAP)
        mask[:n] = True
    return rows.reshape(-1), mask


def dbf_window(queue: Sequence[Job], head: int, tail: int) -> list[Job]:
    """The jobs DBF observes: the whole queue when it fits the window, else its first
    `head` and its last `tail` jobs (arrival order)."""
    size = head + tail
    if len(queue) <= size:
        return list(queue)
    return list(queue[:head]) + (list(queue[len(queue) - tail :]) if tail else [])


def dbf_row_features(expected_start: bool) -> int:
    """Features per job row of DBF's observation."""
    return DBF_START_FEATURES if expected_start else DBF_FEATURES


def until_fits(view: SchedulerView, needs: np.ndarray) -> np.ndarray:
    """For each need, the time from now until it fits by the running jobs' estimated ends
    (`shadow_time`'s rule, for many jobs at once): 0 if it fits now, inf if it never does."""
    now, free = view.now, view.free_units
    freed = list(view.releases())
    ends = np.fromiter((end for end, _ in freed), np.float64, len(freed))
    available = free + np.cumsum(np.fromiter((units for _, units in freed), np.float64, len(freed)))
    first = np.searchsorted(available, needs, side="left")
    later = np.append(ends, math.inf)[first] - now
    return np.where(needs <= free, 0.0, later)


def dbf_observation(
    window_jobs: Sequence[Job],
    view: SchedulerView,
    size: int,
    time_scale: float,
    log_time: bool = False,
    expected_start: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(cluster summary then `size` job rows, flattened; mask over the `size` slots and forward).

    A slot may be chosen when it holds a job that fits now. Forward is refused only
    when nothing runs: then nothing would ever happen, and every queued job fits an
    idle cluster, so some job must start. With `expected_start` each row also says how
    long until its job would fit: what an agent needs to see to hold cores for a blocked
    job (EASY's reservation) instead of filling them with jobs that outlast its start.
    """
    now, free, capacity = view.now, view.free_units, view.capacity_units
    cluster = np.zeros(CLUSTER_QUANTILES, dtype=np.float32)
    running = view.running
    if running:
        # Units sorted by remaining estimated busy time: `free` zeros, then each running
        # job's units at its remaining time.
        remaining = np.fromiter((max(0.0, job.expected_end - now) for job in running), np.float64, len(running))
        units = np.fromiter((job.need for job in running), np.int64, len(running))
        by_end = np.argsort(remaining, kind="stable")
        remaining, units = remaining[by_end], units[by_end]
        edges = free + np.cumsum(units)
        positions = (np.arange(CLUSTER_QUANTILES) + 0.5) * capacity / CLUSTER_QUANTILES
        which = np.searchsorted(edges, positions, side="right")
        busy = which < len(running)
        values = np.zeros(CLUSTER_QUANTILES)
        values[busy] = scaled_time(remaining[which[busy]], time_scale, log_time)
        values[positions < free] = 0.0
        cluster[:] = np.clip(values, 0.0, CAP)
    rows = np.zeros((size, dbf_row_features(expected_start)), dtype=np.float32)
    mask = np.zeros(size + 1, dtype=bool)
    n = min(len(window_jobs), size)
    if n:
        shown = window_jobs[:n]
        need = np.fromiter((job.need for job in shown), np.float64, n)
        walltime = np.fromiter((job.walltime for job in shown), np.float64, n)
        submit = np.fromiter((job.submit for job in shown), np.float64, n)
        rows[:n, 0] = np.clip(need / capacity, 0.0, CAP)
        rows[:n, 1] = np.clip(scaled_time(walltime, time_scale, log_time), 0.0, CAP)
        rows[:n, 2] = np.clip((now - submit) / MAX_WAIT, 0.0, CAP)
        rows[:n, 3] = 1.0
        if expected_start:
            rows[:n, 4] = np.clip(scaled_time(until_fits(view, need), time_scale, log_time), 0.0, CAP)
        mask[:n] = need <= free
    mask[size] = bool(running)
    return np.concatenate((cluster, rows.reshape(-1))), mask


OSDEC_FEATURES = 5
"""Per deferrable job of the learned OSDEC policy's window (`osdec_observation`)."""
OSDEC_PAD = RLBF_PAD


def osdec_observation(
    jobs: Sequence[Job],
    view: SchedulerView,
    window: int,
    time_scale: float,
    log_time: bool = True,
    free: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The learned OSDEC policy's observation: `window` rows of `OSDEC_FEATURES`, flattened, and
    the mask of the rows whose job fits now.

    One row per deferrable job of B_cur (eligible, queued), laid out as RLBackfilling's so its
    kernel network and rules read it alike: the time waited since its earliest start
    (p_i so far), its requested time, its size against the cluster, the time left to its latest
    start (times by `scaled_time`), and its size against the free capacity. Padding rows are
    RLBackfilling's and masked. `free`: the free units, when jobs the view does not know of yet
    start before these (the policy's own picks earlier in the same pass)."""
    rows = np.tile(OSDEC_PAD, (window, 1))
    mask = np.zeros(window, dtype=bool)
    shown = jobs[:window]
    n = len(shown)
    if n:
        now, capacity = view.now, view.capacity_units
        free = view.free_units if free is None else free
        walltime = np.fromiter((job.walltime for job in shown), dtype=np.float64, count=n)
        eligible = np.fromiter((job.eligible for job in shown), dtype=np.float64, count=n)
        latest = np.fromiter((min(job.latest_start, now + 1e9) for job in shown), dtype=np.float64, count=n)
        need = np.fromiter((job.need for job in shown), dtype=np.float64, count=n)
        block = np.stack(
            (
                scaled_time(now - eligible, time_scale, log_time),
                scaled_time(walltime, time_scale, log_time),
                need / capacity,
                scaled_time(latest - now, time_scale, log_time),
                need / max(free, 1),
            ),
            axis=1,
        )
        rows[:n] = np.clip(block, 0.0, CAP)
        mask[:n] = need <= free
    return rows.reshape(-1), mask

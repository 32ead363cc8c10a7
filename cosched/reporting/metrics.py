"""The metrics HPC scheduling papers report, computed from finished jobs.

Everything here is vectorised: the `Job` objects are read once into NumPy
columns (`job_metrics`), and every later figure is array arithmetic on those
columns, so a 500,000-job replay is measured in well under a second.

Definitions (times in seconds; `run` is the time the job actually ran,
``end - start``, which equals `Job.runtime` for a job that ran to completion):

* wait = start - submit
* response = end - submit (also called turnaround or flow time)
* slowdown = response / run. A job with zero run time has no slowdown in the
  usual sense: it is reported as 1.0 if it also did not wait, else ``inf``.
  Bounded slowdown exists precisely to avoid this; real traces drop such jobs.
* bounded slowdown = max(1, response / max(run, threshold)), threshold 10 s by
  default (Feitelson et al., "Theory and practice in parallel job scheduling").
* utilization = sum(cores * run) / (capacity * makespan), makespan = last end
  - first submit.
* queue length at time t = jobs submitted at or before t that have not started
  by t. It is a right-continuous step function: at an instant where events
  coincide, the value is the one after all of them, so a job that starts the
  moment it is submitted is never counted as queued, and a job that ends the
  moment another starts never counts twice against the capacity.

Every function that takes ``jobs`` accepts either a sequence of finished `Job`
objects or a `JobMetrics` already built from them, so a caller that wants a
summary, a time series and a CSV reads the job objects only once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from cosched.errors import ConfigError
from cosched.model import Allocation, Cluster, Job

DEFAULT_BSLD_THRESHOLD = 10.0
_NO_JOBS = "no finished jobs to measure"


@dataclass(frozen=True, slots=True, eq=False)
class JobMetrics:
    """Per-job columns, all of length ``len(self)``, in the order jobs were given.

    The arrays are read-only. `runtime` is ``end - start``; `walltime` is the
    requested time. `bsld` used `bsld_threshold` as its lower bound on run time.
    """

    id: np.ndarray
    submit: np.ndarray
    start: np.ndarray
    end: np.ndarray
    cores: np.ndarray
    runtime: np.ndarray
    walltime: np.ndarray
    wait: np.ndarray
    response: np.ndarray
    slowdown: np.ndarray
    bsld: np.ndarray
    user: np.ndarray
    bsld_threshold: float = DEFAULT_BSLD_THRESHOLD

    def __len__(self) -> int:
        return int(self.id.shape[0])

    @property
    def first_submit(self) -> float:
        return float(self.submit.min())

    @property
    def last_end(self) -> float:
        return float(self.end.max())

    @property
    def makespan(self) -> float:
        """Last end minus first submit."""
        return self.last_end - self.first_submit


def _column(jobs: Sequence[Job], name: str, dtype: type, n: int) -> np.ndarray:
    return np.fromiter(map(attrgetter(name), jobs), dtype=dtype, count=n)


def job_metrics(jobs: Sequence[Job], *, bsld_threshold: float = DEFAULT_BSLD_THRESHOLD) -> JobMetrics:
    """Read finished jobs into per-job metric columns.

    Raises `ConfigError` for an empty list, a non-positive threshold, or any
    job that has not finished (never started, ended before it started, or
    started before it was submitted); pass only the jobs that completed.
    """
    n = len(jobs)
    if n == 0:
        raise ConfigError(_NO_JOBS)
    if not bsld_threshold > 0:
        raise ConfigError(f"bsld_threshold must be positive, got {bsld_threshold}")
    ids = _column(jobs, "id", np.int64, n)
    submit = _column(jobs, "submit", np.float64, n)
    start = _column(jobs, "start", np.float64, n)
    end = _column(jobs, "end", np.float64, n)
    cores = _column(jobs, "cores", np.int64, n)
    walltime = _column(jobs, "walltime", np.float64, n)

    bad = ~((start >= submit) & (end >= start) & np.isfinite(end))
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(
            f"{int(bad.sum())} of {n} jobs are not finished jobs (need submit <= start <= end); "
            f"first is job {int(ids[i])}: submit {submit[i]}, start {start[i]}, end {end[i]}"
        )

    run = end - start
    wait = start - submit
    response = end - submit
    with np.errstate(divide="ignore", invalid="ignore"):
        slowdown = response / run
    zero_run = run == 0
    if zero_run.any():
        slowdown[zero_run] = np.where(response[zero_run] == 0, 1.0, np.inf)
    bsld = np.maximum(1.0, response / np.maximum(run, bsld_threshold))

    user = _column(jobs, "user", np.int64, n)
    cols = (ids, submit, start, end, cores, run, walltime, wait, response, slowdown, bsld, user)
    for c in cols:
        c.flags.writeable = False
    return JobMetrics(*cols, bsld_threshold=float(bsld_threshold))


def as_metrics(jobs: Sequence[Job] | JobMetrics, bsld_threshold: float | None = None) -> JobMetrics:
    """`jobs` as `JobMetrics`: built with `job_metrics`, or passed through if already built.

    A given `bsld_threshold` must match the one a passed-through `JobMetrics` used.
    """
    if isinstance(jobs, JobMetrics):
        if bsld_threshold is not None and bsld_threshold != jobs.bsld_threshold:
            raise ConfigError(
                f"JobMetrics were built with bsld_threshold={jobs.bsld_threshold}, asked for {bsld_threshold}"
            )
        return jobs
    if bsld_threshold is None:
        return job_metrics(jobs)
    return job_metrics(jobs, bsld_threshold=bsld_threshold)


def _check_capacity(capacity_cores: int) -> None:
    if not capacity_cores >= 1:
        raise ConfigError(f"capacity_cores must be at least 1, got {capacity_cores}")


def _step(up: np.ndarray, down: np.ndarray, weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact step function of sum(weight) over intervals [up[i], down[i]).

    Returns ``(t, v)`` with `t` strictly increasing: the function equals
    ``v[k]`` on ``[t[k], t[k+1])`` (and ``v[-1]`` from ``t[-1]`` on). All events
    at one instant are applied together before the value is read.
    """
    times = np.concatenate((up, down))
    if weight is None:
        delta = np.concatenate((np.ones(up.shape[0], np.int64), -np.ones(down.shape[0], np.int64)))
    else:
        delta = np.concatenate((weight, -weight))
    order = np.argsort(times, kind="stable")
    times = times[order]
    level = np.cumsum(delta[order])
    # Keep the last event of each run of equal times: the level after all of them.
    last = np.empty(times.shape[0], dtype=bool)
    last[:-1] = times[1:] != times[:-1]
    last[-1] = True
    return times[last], level[last]


def _queue_step(m: JobMetrics) -> tuple[np.ndarray, np.ndarray]:
    return _step(m.submit, m.start)


def _busy_step(m: JobMetrics) -> tuple[np.ndarray, np.ndarray]:
    return _step(m.start, m.end, m.cores)


@dataclass(frozen=True, slots=True)
class Summary:
    """One replay's headline numbers. Times in seconds; percentiles interpolate linearly."""

    jobs: int
    capacity_cores: int
    bsld_threshold: float
    mean_wait: float
    mean_response: float
    mean_slowdown: float
    mean_bsld: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    wait_max: float
    bsld_p50: float
    bsld_p90: float
    bsld_p99: float
    bsld_max: float
    utilization: float
    makespan: float
    mean_queue_length: float
    max_queue_length: int
    users: int
    user_mean_wait: float

    def as_dict(self) -> dict[str, float | int]:
        """Field name to plain Python number, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# Fields of `Summary` that describe the setup rather than measure the run.
_SETUP_FIELDS = frozenset({"capacity_cores", "bsld_threshold"})
METRIC_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Summary) if f.name not in _SETUP_FIELDS)


def summarize(
    jobs: Sequence[Job] | JobMetrics,
    capacity_cores: int,
    *,
    bsld_threshold: float = DEFAULT_BSLD_THRESHOLD,
) -> Summary:
    """Headline metrics of one replay on a machine of `capacity_cores` cores.

    The mean queue length is exact: the integral of the queue-length step
    function over [first submit, last end] is the sum of all waits, divided
    by the makespan. With a zero makespan (every job submitted, run and ended
    at one instant) utilization and mean queue length are reported as 0.
    """
    _check_capacity(capacity_cores)
    m = as_metrics(jobs, bsld_threshold)
    makespan = m.makespan
    wait_q = np.percentile(m.wait, [50, 90, 99])
    bsld_q = np.percentile(m.bsld, [50, 90, 99])
    if makespan > 0:
        work = float(np.dot(m.cores.astype(np.float64), m.runtime))
        utilization = work / (capacity_cores * makespan)
        mean_queue = float(m.wait.sum()) / makespan
    else:
        utilization = mean_queue = 0.0
    _, queue = _queue_step(m)
    users, user_mean_wait = per_user_mean_wait(m)
    return Summary(
        jobs=len(m),
        capacity_cores=int(capacity_cores),
        bsld_threshold=m.bsld_threshold,
        mean_wait=float(m.wait.mean()),
        mean_response=float(m.response.mean()),
        mean_slowdown=float(m.slowdown.mean()),
        mean_bsld=float(m.bsld.mean()),
        wait_p50=float(wait_q[0]),
        wait_p90=float(wait_q[1]),
        wait_p99=float(wait_q[2]),
        wait_max=float(m.wait.max()),
        bsld_p50=float(bsld_q[0]),
        bsld_p90=float(bsld_q[1]),
        bsld_p99=float(bsld_q[2]),
        bsld_max=float(m.bsld.max()),
        utilization=utilization,
        makespan=makespan,
        mean_queue_length=mean_queue,
        max_queue_length=int(queue.max()),
        users=users,
        user_mean_wait=user_mean_wait,
    )


def per_user_mean_wait(m: JobMetrics) -> tuple[int, float]:
    """How many users the jobs have, and the mean over users of each user's mean wait.

    Why beside the mean over jobs: on a shared machine one user who submits thousands of
    jobs sets the job mean; a policy that makes every other user wait (or one that serves
    them first, as fair-share does) shows here. Jobs with no user (-1) count as one user.
    """
    users, index = np.unique(m.user, return_inverse=True)
    waits = np.bincount(index, weights=m.wait) / np.bincount(index)
    return len(users), float(waits.mean())


class TimeSeries(NamedTuple):
    """Utilization (cores in use / capacity) and queue length at times `t` (seconds)."""

    t: np.ndarray
    utilization: np.ndarray
    queue_length: np.ndarray


def time_series(
    jobs: Sequence[Job] | JobMetrics,
    capacity_cores: int,
    points: int | None = 2000,
) -> TimeSeries:
    """Utilization and queue length over [first submit, last end].

    Both are exact step functions built from the submit/start/end events. With
    `points` (default 2000, at least 2) they are *sampled*: `t` is `points`
    evenly spaced times from first submit to last end, and each value is the
    one in force at that instant (so a spike shorter than the spacing can fall
    between samples; use `summarize` for exact maxima and means). With
    ``points=None`` the exact breakpoints are returned instead: `t` holds every
    distinct event time in [first submit, last end], and the functions equal
    the given values on ``[t[k], t[k+1])``; the last value (at last end) is
    utilization 0 and queue length 0.
    """
    _check_capacity(capacity_cores)
    m = as_metrics(jobs)
    bt, busy = _busy_step(m)
    qt, queue = _queue_step(m)
    if points is None:
        t = np.union1d(bt, qt)
    else:
        if points < 2:
            raise ConfigError(f"points must be at least 2, got {points}")
        t = np.linspace(m.first_submit, m.last_end, int(points))

    def at(times: np.ndarray, values: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(times, t, side="right") - 1
        out = np.where(idx >= 0, values[np.maximum(idx, 0)], 0)
        return out

    return TimeSeries(t, at(bt, busy).astype(np.float64) / capacity_cores, at(qt, queue).astype(np.int64))


def aggregate(summaries: Sequence[Summary | Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Mean, std, min and max of every metric across samples (K samples of L jobs).

    `std` is the sample standard deviation (ddof=1), 0.0 for a single sample.
    Setup fields (capacity_cores, bsld_threshold) are not aggregated. Plain
    mappings (e.g. `Summary.as_dict()` read back from JSON) are accepted too.
    """
    if not summaries:
        raise ConfigError("no summaries to aggregate")
    rows = [s.as_dict() if isinstance(s, Summary) else dict(s) for s in summaries]
    names = [k for k in rows[0] if k not in _SETUP_FIELDS]
    out: dict[str, dict[str, float]] = {}
    for name in names:
        try:
            values = np.array([r[name] for r in rows], dtype=np.float64)
        except KeyError as exc:
            raise ConfigError(f"summary is missing metric {exc.args[0]!r}") from None
        std = float(values.std(ddof=1)) if values.shape[0] > 1 else 0.0
        out[name] = {
            "mean": float(values.mean()),
            "std": std,
            "min": float(values.min()),
            "max": float(values.max()),
        }
    return out


def mean_hops(jobs: Sequence[Job], cluster: Cluster) -> float:
    """Mean communication-hop cost per job (the NSA paper's eq. 1 with c = 1) on the cluster's
    fat-tree: one rank per node under whole-node allocation, per core under core allocation."""
    tree = cluster.topology
    if tree is None or not jobs:
        return math.nan
    per_core = cluster.allocation is Allocation.CORE
    return sum(tree.slots_cost(job.slots, per_core) for job in jobs) / len(jobs)

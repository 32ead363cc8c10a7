"""The Lublin-Feitelson rigid-job workload model, as a seeded, vectorised generator.

Reference
---------
U. Lublin and D. G. Feitelson, "The workload on parallel supercomputers: modeling the
characteristics of rigid jobs", Journal of Parallel and Distributed Computing 63(11),
pp. 1105-1122, 2003.

The constants below are those of the authors' reference C implementation of the model
(``lublin99.c``, distributed as ``m_lublin99.c``); the code here is written afresh on
NumPy and shares none of that program's structure. Tests use it to get realistic
traces without real trace files.

The model, per job class (batch or interactive; each has its own constants)
---------------------------------------------------------------------------
Size (processors)
    ``SERIAL_PROB``  probability that a job is serial (1 processor).
    ``POW2_PROB``    probability (over all jobs of the class, as in the reference) that a
                     job is parallel *and* its size is rounded to a power of two; so the
                     power-of-two share of parallel jobs is at least
                     ``POW2_PROB / (1 - SERIAL_PROB)`` (unrounded sizes can also land on
                     one).
    ``ULOW, UMED, UHI, UPROB``  log2 of a parallel job's size is two-stage uniform: with
                     probability ``UPROB`` uniform on [ULOW, UMED], else on [UMED, UHI].
                     ``UHI`` is log2 of the largest job. The size is round(2 ** value).
Runtime (seconds)
    ``A1, B1, A2, B2``  log(runtime) is hyper-gamma: gamma(shape A1, scale B1) with
                     probability p, else gamma(shape A2, scale B2).
    ``PA, PB``       p = PA * size + PB, clipped to [0, 1]: bigger jobs run longer.
Arrivals
    ``AARR, BARR``   log(inter-arrival time, seconds) during rush hours is
                     gamma(shape AARR * ARAR, scale BARR).
    ``ARAR``         "arrive rush to all ratio": rescales AARR to represent all hours.
    ``ANUM, BNUM``   the daily cycle: the day is 48 half-hour buckets, and bucket i gets
                     the weight gamma_cdf(i + 0.5) - gamma_cdf(i - 0.5) of gamma(shape ANUM,
                     scale BNUM), for i counted from ``CYCLIC_DAY_START`` = 11 and wrapped
                     so that index i lands on bucket (i - 1) mod 48. Weights are normalised
                     to mean 1. The gamma gaps are drawn on a "virtual" clock and crossing
                     bucket b of real time costs weight[b] * 1800 virtual seconds, so
                     arrivals are denser where the weight is high (the peak is early
                     afternoon, the trough around 04:00-05:00).
Limits
    log(runtime) above 12 (about 1.9 days) and log(gap) above 13 (about 5 days) are
    redrawn, as in the reference.

How this generator uses the model
---------------------------------
* The constants were fitted for a 128-processor machine (``reference_log2_size`` = 7).
  For ``procs`` processors each class's UMED and UHI are shifted by
  ``log2(procs) - 7`` (so batch UHI = log2(procs), interactive UHI = log2(procs) - 1.5),
  ULOW is kept, the interval is clamped to stay ordered, and sizes are clipped to
  [1, procs]. PA, PB are used as published.
* Job type: with ``interactive_fraction=None`` (the reference's default mode) batch and
  interactive jobs are two independent arrival streams merged in time, so the mix is
  whatever their rates give (roughly 85 % interactive with the default constants). With a
  number f in [0, 1], exactly round(f * n_jobs) jobs are interactive: the class with more
  jobs keeps its model gaps and the other stream is stretched or compressed uniformly to
  cover the same span. ``LublinParams.typeless()`` with ``interactive_fraction=1.0`` is the
  reference's "whole sample" mode (one stream, one parameter set). The job type is written
  to the SWF ``queue`` column as the reference does: 0 interactive, 1 batch.
* Time: the model's clock starts at midnight (the reference's START = 0). Submit times are
  rebased so the first job submits at 0; the header's ``unix_start_time`` holds the first
  job's offset from midnight, so ``(submit + unix_start_time) % 86400`` is the time of day.
  Times are computed in floating point and rounded to whole seconds at the end (the
  reference truncates every gap, which makes its clock drift about 0.5 s per job).
* ``load``: the offered load sum(procs_i * runtime_i) / (procs * (last_submit -
  first_submit)) is reached by multiplying every inter-arrival gap by one factor, found
  numerically. The gaps are scaled on the virtual clock, so the daily cycle keeps its
  24-hour period. Submits are whole seconds, so the load is met to within one second of
  span: exact enough once the span is more than a minute or so, not for a few tiny jobs
  at load 10.
* The model has no user runtime estimates: ``req_time`` equals ``runtime``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np

from cosched.errors import ConfigError
from cosched.model import MAX_REPLAY_PROCS
from cosched.traces.trace import SwfHeader, Trace

__all__ = [
    "BATCH",
    "INTERACTIVE",
    "WHOLE_SAMPLE",
    "JobClassParams",
    "LublinParams",
    "daily_weights",
    "generate",
]

MAX_JOBS = 10**7
"""The most jobs one generated workload holds: ten times the longest archive log; its columns then take
about 3 GB, and more would fail in NumPy's allocations instead of here."""
BUCKETS = 48  # half-hour buckets in a day
SECONDS_IN_BUCKET = 86400 // BUCKETS
QUEUE_INTERACTIVE = 0  # the reference's type codes, written to the SWF queue column
QUEUE_BATCH = 1


@dataclass(frozen=True, slots=True)
class JobClassParams:
    """The model's constants for one job class (see the module docstring)."""

    serial_prob: float
    pow2_prob: float
    ulow: float
    umed: float
    uhi: float
    uprob: float
    a1: float
    b1: float
    a2: float
    b2: float
    pa: float
    pb: float
    aarr: float
    barr: float
    anum: float
    bnum: float
    arar: float

    def __post_init__(self) -> None:
        for name in ("serial_prob", "pow2_prob", "uprob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"LublinParams: {name} must be in [0, 1], got {value}")
        if self.serial_prob + self.pow2_prob > 1.0:
            raise ConfigError("LublinParams: serial_prob + pow2_prob must be <= 1")
        if not self.ulow <= self.umed <= self.uhi:
            raise ConfigError("LublinParams: need ulow <= umed <= uhi")
        for name in ("a1", "b1", "a2", "b2", "aarr", "barr", "anum", "bnum", "arar"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"LublinParams: {name} must be positive, got {value}")


# Batch jobs (the reference's *_BATCH constants).
BATCH = JobClassParams(
    serial_prob=0.2927, pow2_prob=0.6686, ulow=1.2, umed=5.0, uhi=7.0, uprob=0.875,
    a1=6.57, b1=0.823, a2=639.1, b2=0.0156, pa=-0.003, pb=0.6986,
    aarr=6.0415, barr=0.8531, anum=6.1271, bnum=5.2740, arar=1.0519,
)  # fmt: skip

# Interactive jobs (the reference's *_ACTIVE constants).
INTERACTIVE = JobClassParams(
    serial_prob=0.1541, pow2_prob=0.625, ulow=1.0, umed=3.0, uhi=5.5, uprob=0.705,
    a1=3.8351, b1=0.6605, a2=7.073, b2=0.6856, pa=-0.0118, pb=0.9156,
    aarr=6.5510, barr=0.6621, anum=8.9186, bnum=3.6680, arar=0.9797,
)  # fmt: skip

# Both types fitted together (the reference's constants without suffix, "whole sample").
WHOLE_SAMPLE = JobClassParams(
    serial_prob=0.244, pow2_prob=0.576, ulow=0.8, umed=4.5, uhi=7.0, uprob=0.86,
    a1=4.2, b1=0.94, a2=312.0, b2=0.03, pa=-0.0054, pb=0.78,
    aarr=10.2303, barr=0.4871, anum=8.1737, bnum=3.9631, arar=1.0225,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LublinParams:
    """All the model's constants: one set per job class, plus the model's limits.

    The defaults are the published values (see the module docstring).
    """

    batch: JobClassParams = field(default=BATCH)
    interactive: JobClassParams = field(default=INTERACTIVE)
    reference_log2_size: float = 7.0  # log2 of the machine the sizes were fitted on (128)
    max_log_runtime: float = 12.0  # TOO_MUCH_TIME: redraw log(runtime) above this
    max_log_interarrival: float = 13.0  # TOO_MUCH_ARRIVE_TIME: redraw log(gap) above this
    cyclic_day_start: int = 11  # CYCLIC_DAY_START: first bucket index of the fitted day
    start_hour: int = 0  # START: hour of day at which the clock starts

    def __post_init__(self) -> None:
        if not 0 <= self.start_hour <= 23:
            raise ConfigError(f"LublinParams: start_hour must be in [0, 23], got {self.start_hour}")
        if not (self.max_log_runtime > 0 and self.max_log_interarrival > 0):
            raise ConfigError("LublinParams: max_log_runtime and max_log_interarrival must be positive")

    @classmethod
    def typeless(cls) -> LublinParams:
        """The reference's "whole sample" set for both classes (use interactive_fraction=1)."""
        return cls(batch=WHOLE_SAMPLE, interactive=WHOLE_SAMPLE)

    def as_dict(self) -> dict[str, object]:
        """Flat view, for logging: ``batch.a1`` and so on."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, JobClassParams):
                out.update({f"{f.name}.{g.name}": getattr(value, g.name) for g in fields(value)})
            else:
                out[f.name] = value
        return out


# --------------------------------------------------------------------------------------
# Gamma cumulative distribution (regularised lower incomplete gamma), for the daily cycle.
# Series for x < a + 1, continued fraction (modified Lentz) otherwise.


def _gamma_p(a: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    log_prefactor = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        denom = a
        for _ in range(10_000):
            denom += 1.0
            term *= x / denom
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(log_prefactor)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return 1.0 - math.exp(log_prefactor) * h


def daily_weights(cls: JobClassParams, cyclic_day_start: int = 11) -> np.ndarray:
    """Arrival weight of each of the 48 half-hour buckets of a day, mean 1."""
    w = np.empty(BUCKETS)
    for i in range(cyclic_day_start, cyclic_day_start + BUCKETS):
        hi = _gamma_p(cls.anum, (i + 0.5) / cls.bnum)
        lo = _gamma_p(cls.anum, (i - 0.5) / cls.bnum)
        w[(i - 1) % BUCKETS] = hi - lo
    if not (np.all(np.isfinite(w)) and w.min() > 0):
        raise ConfigError("LublinParams: anum/bnum give a daily cycle with an empty half hour")
    return w / w.mean()


class _Clock:
    """Maps the virtual arrival clock to real seconds through one class's daily cycle."""

    def __init__(self, weights: np.ndarray, start_hour: int) -> None:
        self.weights = weights
        # virtual seconds needed to reach the start of each bucket; a day costs 86400
        self.edges = np.concatenate(([0.0], np.cumsum(weights * SECONDS_IN_BUCKET)))
        self.day_virtual = float(self.edges[-1])
        start_bucket = start_hour * BUCKETS // 24
        self.offset_virtual = float(self.edges[start_bucket])
        self.offset_real = float(start_bucket * SECONDS_IN_BUCKET)

    def real(self, virtual: np.ndarray) -> np.ndarray:
        v = virtual + self.offset_virtual
        days = np.floor(v / self.day_virtual)
        rest = v - days * self.day_virtual
        bucket = np.clip(np.searchsorted(self.edges, rest, side="right") - 1, 0, BUCKETS - 1)
        within = (rest - self.edges[bucket]) / self.weights[bucket]
        return days * 86400.0 + bucket * SECONDS_IN_BUCKET + within - self.offset_real


# --------------------------------------------------------------------------------------
# Samplers (vectorised; every draw comes from the one Generator passed in).


def _gamma_below(rng: np.random.Generator, shape: float, scale: float, n: int, limit: float) -> np.ndarray:
    """n draws of gamma(shape, scale), each redrawn until it is <= limit."""
    out = rng.gamma(shape, scale, n)
    bad = np.flatnonzero(out > limit)
    while bad.size:
        out[bad] = rng.gamma(shape, scale, bad.size)
        bad = bad[out[bad] > limit]
    return out


def _virtual_arrivals(rng: np.random.Generator, cls: JobClassParams, n: int, limit: float) -> np.ndarray:
    """Arrival instants of one class on the virtual clock; the first comes one gap after 0."""
    if n == 0:
        return np.empty(0)
    return np.cumsum(np.exp(_gamma_below(rng, cls.aarr * cls.arar, cls.barr, n, limit)))


def _sizes(rng: np.random.Generator, cls: JobClassParams, n: int, procs: int, shift: float) -> np.ndarray:
    uhi = max(cls.uhi + shift, 0.0)
    ulow = min(cls.ulow, uhi)
    umed = min(max(cls.umed + shift, ulow), uhi)
    u = rng.random(n)
    first = rng.random(n) <= cls.uprob
    lo = np.where(first, ulow, umed)
    hi = np.where(first, umed, uhi)
    log_size = lo + rng.random(n) * (hi - lo)
    pow2 = (u > cls.serial_prob) & (u <= cls.serial_prob + cls.pow2_prob)
    log_size = np.where(pow2, np.floor(log_size + 0.5), log_size)
    size = np.floor(np.exp2(log_size) + 0.5)
    size[u <= cls.serial_prob] = 1
    return np.clip(size, 1, procs).astype(np.int64)


def _runtimes(rng: np.random.Generator, cls: JobClassParams, sizes: np.ndarray, limit: float) -> np.ndarray:
    n = sizes.shape[0]
    p = np.clip(cls.pa * sizes + cls.pb, 0.0, 1.0)
    first = rng.random(n) <= p
    log_rt = np.empty(n)
    n1 = int(first.sum())
    log_rt[first] = _gamma_below(rng, cls.a1, cls.b1, n1, limit)
    log_rt[~first] = _gamma_below(rng, cls.a2, cls.b2, n - n1, limit)
    return np.maximum(np.floor(np.exp(log_rt)), 1.0)


def _solve_scale(span_of: Callable[[float], float], target: float) -> float:
    """Factor s > 0 with span_of(s) == target (span_of is continuous, 0 at 0, unbounded)."""
    lo, hi = 0.0, 1.0
    while span_of(hi) < target:
        lo, hi = hi, hi * 4.0
    s = hi
    for _ in range(200):
        span = span_of(s)
        if abs(span - target) <= 1e-9 * target:
            return s
        if span < target:
            lo = s
        else:
            hi = s
        guess = s * target / span if span > 0 else 0.5 * (lo + hi)
        s = guess if lo < guess < hi else 0.5 * (lo + hi)
    return s


# --------------------------------------------------------------------------------------


def generate(
    n_jobs: int,
    procs: int,
    *,
    seed: int,
    load: float | None = None,
    interactive_fraction: float | None = None,
    params: LublinParams | None = None,
) -> Trace:
    """A trace of ``n_jobs`` jobs from the Lublin-Feitelson model for ``procs`` processors.

    ``seed`` fixes every draw (same seed, same trace). ``load``, in (0, 10], is the target
    offered load, reached by scaling the inter-arrival times (needs ``n_jobs >= 2``).
    ``interactive_fraction``: None for the model's own batch/interactive mix, else the exact
    share of interactive jobs in [0, 1]. See the module docstring for the details.
    """
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int | np.integer) or not 1 <= n_jobs <= MAX_JOBS:
        raise ConfigError(f"n_jobs must be an integer in [1, {MAX_JOBS:,}], got {n_jobs!r}")
    if isinstance(procs, bool) or not isinstance(procs, int | np.integer) or not 1 <= procs <= MAX_REPLAY_PROCS:
        raise ConfigError(f"procs must be an integer in [1, {MAX_REPLAY_PROCS:,}], got {procs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    if load is not None:
        if isinstance(load, bool) or not isinstance(load, int | float) or not 0 < load <= 10:
            raise ConfigError(f"load must be a number in (0, 10], got {load!r}")
        if n_jobs < 2:
            raise ConfigError("load needs n_jobs >= 2 (one job has no submit span)")
    if interactive_fraction is not None and not (
        isinstance(interactive_fraction, int | float)
        and not isinstance(interactive_fraction, bool)
        and 0.0 <= interactive_fraction <= 1.0
    ):
        raise ConfigError(f"interactive_fraction must be None or in [0, 1], got {interactive_fraction!r}")
    if params is None:
        params = LublinParams()
    elif not isinstance(params, LublinParams):
        raise ConfigError(f"params must be a LublinParams, got {type(params).__name__}")

    n_jobs, procs = int(n_jobs), int(procs)
    rng = np.random.default_rng(seed)
    classes = {QUEUE_BATCH: params.batch, QUEUE_INTERACTIVE: params.interactive}
    clocks = {q: _Clock(daily_weights(c, params.cyclic_day_start), params.start_hour) for q, c in classes.items()}

    # 1. Arrivals on each class's virtual clock, then which jobs make the trace.
    limit = params.max_log_interarrival
    if interactive_fraction is None:
        v_b = _virtual_arrivals(rng, params.batch, n_jobs, limit)
        v_i = _virtual_arrivals(rng, params.interactive, n_jobs, limit)
        t_b = clocks[QUEUE_BATCH].real(v_b)
        t_i = clocks[QUEUE_INTERACTIVE].real(v_i)
        keep = np.argsort(np.concatenate((t_b, t_i)), kind="stable")[:n_jobs]
        from_b = keep < n_jobs
        v_b, v_i = v_b[np.sort(keep[from_b])], v_i[np.sort(keep[~from_b] - n_jobs)]
    else:
        n_i = round(interactive_fraction * n_jobs)
        v_b = _virtual_arrivals(rng, params.batch, n_jobs - n_i, limit)
        v_i = _virtual_arrivals(rng, params.interactive, n_i, limit)
        if v_b.size and v_i.size:  # the bigger class sets the span, the other is stretched to it
            if v_i.size > v_b.size:
                v_b = v_b * (v_i[-1] / v_b[-1])
            else:
                v_i = v_i * (v_b[-1] / v_i[-1])
    queue = np.concatenate((np.full(v_b.size, QUEUE_BATCH), np.full(v_i.size, QUEUE_INTERACTIVE)))

    # 2. Sizes and runtimes, per class.
    shift = math.log2(procs) - params.reference_log2_size
    sizes = np.empty(n_jobs, dtype=np.int64)
    runtimes = np.empty(n_jobs)
    for q, cls in classes.items():
        mask = queue == q
        sizes[mask] = _sizes(rng, cls, int(mask.sum()), procs, shift)
        runtimes[mask] = _runtimes(rng, cls, sizes[mask], params.max_log_runtime)

    # 3. Real time; with a target load, one factor on all gaps (virtual clock) sets the span.
    def real_times(scale: float) -> np.ndarray:
        return np.concatenate((clocks[QUEUE_BATCH].real(v_b * scale), clocks[QUEUE_INTERACTIVE].real(v_i * scale)))

    scale = 1.0
    if load is not None:
        work = float(np.sum(sizes * runtimes))
        target_span = work / (procs * load)

        def span_of(s: float) -> float:
            t = real_times(s)
            return float(t.max() - t.min())

        scale = _solve_scale(span_of, target_span)
    times = real_times(scale)
    order = np.argsort(times, kind="stable")
    times, queue, sizes, runtimes = times[order], queue[order], sizes[order], runtimes[order]
    # Whole seconds, rounded relative to the first job so the span (and the load) is
    # as close as integers allow.
    submit = np.floor(times - times[0] + 0.5)

    header = SwfHeader(
        max_nodes=procs,
        max_procs=procs,
        unix_start_time=math.floor(params.start_hour * 3600 + times[0] + 0.5),
    )
    return Trace.from_columns(
        name=f"lublin-{procs}-s{seed}",
        submit=submit,
        runtime=runtimes,
        procs=sizes,
        req_time=runtimes.copy(),
        header=header,
        queue=queue.astype(np.int64),
    )

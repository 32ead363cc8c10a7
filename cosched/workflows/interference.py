"""How fast a workflow stage runs under a CPU quota, next to a neighbour: the replay's cost model.

Why this exists
---------------
A co-scheduler that lends CPU quota between co-located jobs can only be evaluated
in replay if co-location costs something, and costs different things for different
applications: the ASAx paper (Table 2) shows I/O-bound workflows (Montage,
Statistics) barely notice losing half their quota while CPU-bound ones (BLAST,
Synthetic) slow down. This module is that model, deliberately small and explicit,
with its numbers in ``workloads/profiles.toml`` so that they can be recalibrated
against measurements without touching code.

The model
---------
A stage's `StageProfile` says, for the stage running alone on its allocation of
``c`` cores at full quota: ``cpu`` the busy share of the cores it can use (all ``c``
if ``parallel``, one if sequential), ``mem`` the share of its allocated memory in use,
``io`` the share of its time bound on I/O or network, ``work`` and ``serial_fraction``
its runtime, ``tasks`` its unit of progress.

Runtime alone (Amdahl's law; `serial_fraction` is the part of the runtime that does
not shrink with more cores: serial sections, per-task fixed costs, synchronisation)::

    T(c) = work * (s + (1 - s) / c)     parallel stage
    T(c) = work                         sequential stage

A measured speed-up can beat Amdahl's: a stage waiting on wake-ups (fsync-bound
messages) runs more than twice as fast on two cores as on one, since the second
core hides the first one's waits. Calibration then records ``s < 0`` (down to
-1), which interpolates between the core counts it measured; ``T(c)`` is never
taken below ``work / c**2``.

CPU demand, the cores it keeps busy alone: ``u = cpu * c`` (parallel) or ``cpu``
(sequential, one core). A parallel stage confined to one core keeps it busier than
its share of many (its processes no longer wait on each other's messages and files
in parallel), so where calibration measured that share, ``cpu_one_core``, it is
``u`` on one core: without it, a one-core Statistics stage under half a core read
as barely throttled (0.41 of a core wanted, 0.49 measured). Under a quota ``q`` CPUs (clamped to ``c``), its compute
runs at the rate::

    r = g(q / u) / g(c / u),   g(x) = x / (1 + x**k) ** (1/k)

``g`` is a soft ``min(1, x)``: demand fluctuates around its mean ``u``, so a quota
just above the mean still throttles bursts (CFS quotas are enforced per 100 ms
period), while a quota far above it costs nothing. Normalising by ``g(c / u)`` makes
``r = 1`` at full quota; ``k`` is ``throttle_sharpness`` (large = hard minimum), from
``[interference]`` or, where a profile measured its own, from the profile: a stage of
many short bursts (Statistics' fsynced messages) is throttled well below its mean.

Contention with a neighbour on the same cores, running at activity ``a`` (its own
speed alone under its quota: a throttled neighbour issues less I/O and memory
traffic)::

    f_io  = 1 + beta_io  * io_self  * io_nb  * a     shared file system / network
    f_mem = 1 + beta_mem * mem_self * mem_nb * a     memory bandwidth and cache

so two I/O-heavy or two memory-heavy stages hurt each other while a light
neighbour is nearly free. If both quotas together exceed the cores, the kernel's
fair share decides: the stage gets at most ``max(c - d_nb, c / 2)`` CPUs, where
``d_nb = min(q_nb, u_nb)`` is what the neighbour wants.

Time per unit of work relative to alone, and the speed (progress rate)::

    t = (1 - io) * (f_mem / r + p * (1 / r - 1)) + io * f_io
    speed = 1 / t

The CPU quota only stretches the compute part ``(1 - io)`` (an I/O-bound stage
barely slows when its quota is cut). ``p``, the profile's ``throttle_penalty``,
is the opposite case: a stage of short bursts that wake on fsyncs and messages,
once throttled, waits out the rest of each CFS period after every burst, so it
slows more than its quota was cut. Statistics' moments stage ran 3.5 times slower
under half its demand, where ``1 / r`` alone says 2.1 and no ``k`` says more
(``g(x) <= x``): ``p = 1.35``. Calibration finds either ``io`` or ``p`` from that
run, never both. Hence: speed <= 1; speed == 1 alone at full quota; speed is
non-decreasing in the quota; speed == 0 at zero quota.

What a monitor sees (`usage`): busy CPUs ``min(u * speed, q)`` as a share of the
``c`` allocated cores, and ``mem`` of the allocated memory.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

from cosched.errors import ConfigError

__all__ = [
    "AloneTotals",
    "InterferenceParams",
    "StageProfile",
    "alone_totals",
    "cpu_rate",
    "load_params",
    "load_profiles",
    "runtime_alone",
    "shipped_params",
    "shipped_profiles",
    "speed",
    "usage",
]

MAX_THROTTLE_PENALTY: Final = 5.0
"""Calibration's bound on `throttle_penalty`: beyond it a throttled run measured something else."""
PROFILES_RESOURCE: Final = ("workloads", "profiles.toml")
"""Package and file name of the shipped profiles (found through importlib.resources)."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class StageProfile:
    """How one application class behaves alone; see the module docstring for the model.

    `serial_fraction` only matters for parallel stages (a sequential stage's runtime
    is `work` whatever its cores), hence its default of 1.
    """

    app_class: str
    parallel: bool
    cpu: float
    mem: float
    io: float
    work: float
    tasks: int
    serial_fraction: float = 1.0
    throttle_sharpness: float | None = None
    """This stage's own k of the soft min (None: the [interference] one)."""
    cpu_one_core: float | None = None
    """Busy share of the core when a parallel stage runs on one (None: `cpu`)."""
    throttle_penalty: float = 0.0
    """Slowdown beyond the quota cut, per unit of it, of a throttled bursty stage (`p`)."""

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ConfigError:
            return ConfigError(f"profile {self.app_class!r}: {name} must be {rule}, got {getattr(self, name)!r}")

        if not isinstance(self.parallel, bool):
            raise bad("parallel", "true or false")
        if not _is_number(self.cpu) or not 0 < self.cpu <= 1:
            raise bad("cpu", "in (0, 1]")
        for name in ("mem", "io"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value <= 1:
                raise bad(name, "in [0, 1]")
        if not _is_number(self.serial_fraction) or not -1 <= self.serial_fraction <= 1:
            raise bad("serial_fraction", "in [-1, 1] (negative: a measured superlinear speed-up)")
        if not _is_number(self.work) or self.work <= 0:
            raise bad("work", "a positive number of seconds")
        if not isinstance(self.tasks, int) or isinstance(self.tasks, bool) or self.tasks < 1:
            raise bad("tasks", "an integer >= 1")
        if self.throttle_sharpness is not None and (
            not _is_number(self.throttle_sharpness) or self.throttle_sharpness < 1
        ):
            raise bad("throttle_sharpness", "a number >= 1")
        if not _is_number(self.throttle_penalty) or not 0 <= self.throttle_penalty <= MAX_THROTTLE_PENALTY:
            raise bad("throttle_penalty", f"in [0, {MAX_THROTTLE_PENALTY:g}]")
        if self.cpu_one_core is not None and (not _is_number(self.cpu_one_core) or not 0 < self.cpu_one_core <= 1):
            raise bad("cpu_one_core", "in (0, 1]")

    def demand(self, cores: int) -> float:
        """CPUs kept busy alone at full quota: `cpu` of all cores, or of one if sequential."""
        if not self.parallel:
            return self.cpu
        if cores == 1 and self.cpu_one_core is not None:
            return self.cpu_one_core
        return self.cpu * cores


@dataclass(frozen=True, slots=True)
class InterferenceParams:
    """The `[interference]` table: contention strengths and throttling sharpness."""

    beta_io: float
    beta_mem: float
    throttle_sharpness: float

    def __post_init__(self) -> None:
        for name in ("beta_io", "beta_mem"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                raise ConfigError(f"[interference]: {name} must be a number >= 0, got {value!r}")
        if not _is_number(self.throttle_sharpness) or self.throttle_sharpness < 1:
            raise ConfigError(
                f"[interference]: throttle_sharpness must be a number >= 1, got {self.throttle_sharpness!r}"
            )


# -- Loading -------------------------------------------------------------------------

_PROFILE_REQUIRED: Final = ("parallel", "cpu", "mem", "io", "work", "tasks")
_PROFILE_KEYS: Final = frozenset(
    (*_PROFILE_REQUIRED, "serial_fraction", "throttle_sharpness", "cpu_one_core", "throttle_penalty")
)
_PARAM_KEYS: Final = ("beta_io", "beta_mem", "throttle_sharpness")


def _read_document(path: str | Path | None) -> tuple[str, dict[str, Any]]:
    """The parsed TOML and a name for error messages; None is the shipped file."""
    if path is None:
        resource = resources.files(PROFILES_RESOURCE[0]).joinpath(PROFILES_RESOURCE[1])
        where, reader = str(resource), resource.read_text
    else:
        where, reader = str(path), Path(path).read_text
    try:
        text = reader(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{where}: cannot read profiles: {reason}") from None
    try:
        return where, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None


def _profile(app_class: str, table: Any) -> StageProfile:
    if not isinstance(table, dict):
        raise ConfigError(f"profile {app_class!r} must be a table")
    missing = [key for key in _PROFILE_REQUIRED if key not in table]
    if missing:
        raise ConfigError(f"profile {app_class!r} is missing {', '.join(missing)}")
    unknown = sorted(set(table) - _PROFILE_KEYS)
    if unknown:
        raise ConfigError(f"profile {app_class!r} has unknown key(s) {', '.join(unknown)}")
    for key in ("serial_fraction", "cpu_one_core"):
        if not table["parallel"] and key in table:
            raise ConfigError(f"profile {app_class!r}: {key} only applies to parallel stages")
    if table["parallel"] is True and "serial_fraction" not in table:
        raise ConfigError(f"profile {app_class!r} is missing serial_fraction (required for parallel stages)")
    return StageProfile(app_class=app_class, **table)


def load_profiles(path: str | Path | None = None) -> dict[str, StageProfile]:
    """Stage profiles by application class, from `[profile."<app_class>"]` tables.

    `path=None` reads the shipped ``workloads/profiles.toml``. Every problem (missing
    or unknown field, value out of range) is one ConfigError naming file and class.
    """
    where, document = _read_document(path)
    tables = document.get("profile")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f'{where}: no [profile."<app_class>"] tables')
    profiles = {}
    for app_class, table in tables.items():
        try:
            profiles[app_class] = _profile(app_class, table)
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return profiles


def load_params(path: str | Path | None = None) -> InterferenceParams:
    """The `[interference]` table of a profiles file (None: the shipped one)."""
    where, document = _read_document(path)
    table = document.get("interference")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: missing the [interference] table")
    missing = [key for key in _PARAM_KEYS if key not in table]
    unknown = sorted(set(table) - set(_PARAM_KEYS))
    try:
        if missing:
            raise ConfigError(f"[interference] is missing {', '.join(missing)}")
        if unknown:
            raise ConfigError(f"[interference] has unknown key(s) {', '.join(unknown)}")
        return InterferenceParams(**table)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@lru_cache(maxsize=1)
def shipped_params() -> InterferenceParams:
    """The shipped `[interference]` parameters, read once (the default of `speed`)."""
    return load_params()


@lru_cache(maxsize=1)
def _shipped_profiles() -> Mapping[str, StageProfile]:
    return load_profiles()


def shipped_profiles() -> dict[str, StageProfile]:
    """The shipped profiles (a fresh dict over a cached read)."""
    return dict(_shipped_profiles())


# -- The model ------------------------------------------------------------------------


def _check_cores(cores: int) -> None:
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ConfigError(f"cores must be a positive integer, got {cores!r}")


def _check_quota(name: str, quota: float) -> None:
    if not _is_number(quota) or quota < 0:
        raise ConfigError(f"{name} must be a number of CPUs >= 0, got {quota!r}")


def runtime_alone(profile: StageProfile, cores: int) -> float:
    """Seconds the stage takes alone on `cores` cores at full quota (Amdahl's law)."""
    _check_cores(cores)
    if not profile.parallel:
        return profile.work
    s = profile.serial_fraction
    return profile.work * max(s + (1.0 - s) / cores, 1.0 / cores**2)


def _soft_min1(x: float, k: float) -> float:
    """g(x) = x / (1 + x**k) ** (1/k), a smooth min(1, x), written so no power overflows."""
    if x >= 1.0:
        return (1.0 + x**-k) ** (-1.0 / k)
    return x * (1.0 + x**k) ** (-1.0 / k)


def cpu_rate(profile: StageProfile, cores: int, quota: float, k: float) -> float:
    """Compute rate under `quota` CPUs relative to full quota: g(q/u) / g(c/u), in [0, 1]."""
    if quota <= 0:
        return 0.0
    demand = profile.demand(cores)
    return min(1.0, _soft_min1(quota / demand, k) / _soft_min1(cores / demand, k))


def _slowdown(profile: StageProfile, rate: float, f_io: float, f_mem: float) -> float:
    """t = (1-io) (f_mem / r + p (1/r - 1)) + io f_io, as 1 + increments so that it is exactly 1 alone."""
    penalty = profile.throttle_penalty
    compute = (f_mem + penalty) / rate - (1.0 + penalty)  # f_mem / r - 1 + p (1/r - 1); no 0 * inf
    return 1.0 + (1.0 - profile.io) * compute + profile.io * (f_io - 1.0)


def speed(
    profile: StageProfile,
    cores: int,
    quota_cpus: float,
    neighbour: StageProfile | None = None,
    neighbour_quota: float = 0.0,
    *,
    params: InterferenceParams | None = None,
) -> float:
    """Progress rate of a stage on `cores` cores under a `quota_cpus` CPU quota, in [0, 1].

    1.0 means as fast as alone with its full allocation. `neighbour` shares the same
    cores under its own `neighbour_quota` (a neighbour with no quota does nothing).
    `params` defaults to the shipped `[interference]` table. Equations: module docstring.
    """
    _check_cores(cores)
    _check_quota("quota_cpus", quota_cpus)
    _check_quota("neighbour_quota", neighbour_quota)
    p = params if params is not None else shipped_params()
    quota = min(float(quota_cpus), float(cores))
    f_io = f_mem = 1.0
    if neighbour is not None and neighbour_quota > 0:
        neighbour_q = min(float(neighbour_quota), float(cores))
        wanted = min(neighbour_q, neighbour.demand(cores))
        quota = min(quota, max(cores - wanted, cores / 2))
        neighbour_k = neighbour.throttle_sharpness or p.throttle_sharpness
        activity = 1.0 / _slowdown(neighbour, cpu_rate(neighbour, cores, neighbour_q, neighbour_k), 1, 1)
        f_io += p.beta_io * profile.io * neighbour.io * activity
        f_mem += p.beta_mem * profile.mem * neighbour.mem * activity
    rate = cpu_rate(profile, cores, quota, profile.throttle_sharpness or p.throttle_sharpness)
    if rate <= 0.0:
        return 0.0
    return min(1.0, 1.0 / _slowdown(profile, rate, f_io, f_mem))


def usage(profile: StageProfile, cores: int, quota_cpus: float, speed: float) -> tuple[float, float]:
    """What a monitor observes: (busy CPUs / allocated cores, used memory / allocated memory).

    CPU time is consumed in proportion to progress, `demand * speed`, and never beyond
    the quota. Divide the CPU share by `quota_cpus / cores` for the utilisation of the
    quota (what the paper's Static and ASAx columns report).
    """
    _check_cores(cores)
    _check_quota("quota_cpus", quota_cpus)
    if not _is_number(speed) or not 0 <= speed <= 1:
        raise ConfigError(f"speed must be in [0, 1], got {speed!r}")
    busy = min(profile.demand(cores) * speed, float(quota_cpus), float(cores))
    return busy / cores, profile.mem


@dataclass(frozen=True, slots=True)
class AloneTotals:
    """Runs alone pooled: total seconds, and CPU and memory use per allocated core-second."""

    runtime: float
    cpu: float
    mem: float


def alone_totals(runs: Iterable[tuple[StageProfile, int]]) -> AloneTotals:
    """Sum of runtimes and core-second-weighted CPU and memory shares of (profile, cores) runs.

    Table 2's utilisations are "proportional to total allocated capacity", so each run
    weighs by its allocated core-seconds; a workflow's runtime is the sum over its stages.
    """
    runtime = allocated = busy = memory = 0.0
    for profile, cores in runs:
        seconds = runtime_alone(profile, cores)
        cpu_share, mem_share = usage(profile, cores, cores, 1.0)
        runtime += seconds
        allocated += seconds * cores
        busy += seconds * cores * cpu_share
        memory += seconds * cores * mem_share
    if allocated == 0:
        raise ConfigError("alone_totals needs at least one run")
    return AloneTotals(runtime, busy / allocated, memory / allocated)

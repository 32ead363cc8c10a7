"""Statistics: global moments and channel correlations of REDD-like household power data.

Why this shape: the paper's statistics workflow reads a multi-year, one-minute power
series, distributes it by month, reduces per-month moments (many small messages),
regroups them into global moments, then computes correlations per month and reduces
again. The data is synthetic but REDD-like (mains plus appliances with daily and
weekly cycles, on/off events and noise), seeded, so `verify` can recompute the
answer with NumPy straight from the series.

Files in the working directory:
    series.npy, series.json             generate (float32, minutes x channels; start, step, channel names)
    months/YYYY-MM.npy                  read (rows of one calendar month)
    moments/YYYY-MM.json                moments (count, sum, sum of squares, min, max per channel)
    global.json, normalized/YYYY-MM.npy regroup (global moments; month rows as z-scores, float64)
    cross/YYYY-MM.npy                   correlations (per-month cross-products at lags 0 .. lags - 1)
    statistics.json, lagged.npy         correlations' final reduce (the results)
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

# One BLAS thread per process: correlations runs one process per core, and OpenBLAS's own
# threads on top of those fight for the same cores (measured: twice as slow). Set before NumPy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from .common import Params, Progress, StageError, parallel_map, require

SIZES: dict[str, dict[str, Any]] = {
    "test": {"years": 0.25, "channels": 4, "lags": 60, "seed": 1},
    "small": {"years": 1.0, "channels": 24, "lags": 1440, "seed": 1},
    "study": {"years": 3.85, "channels": 48, "lags": 1440, "seed": 1},  # 47 months, as in the paper
}
DEFAULTS: dict[str, Any] = SIZES["test"]

START = datetime(2011, 4, 18, tzinfo=UTC)  # REDD's first recordings
STEP_SECONDS = 60
MINUTES_PER_YEAR = 365 * 24 * 60
APPLIANCES = ("refrigerator", "lighting", "microwave", "dishwasher", "washer_dryer", "electric_heat")


def minutes(params: Params) -> int:
    return max(1, round(float(params["years"]) * MINUTES_PER_YEAR))


def month_ranges(start: datetime, count: int) -> list[tuple[str, int, int]]:
    """(YYYY-MM, first row, end row) of each calendar month the series touches."""
    ranges: list[tuple[str, int, int]] = []
    month = start.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    while True:
        following = (month + timedelta(days=32)).replace(day=1)
        first = max(0, math.ceil((month - start).total_seconds() / STEP_SECONDS))
        end = min(count, math.ceil((following - start).total_seconds() / STEP_SECONDS))
        if first >= count:
            return ranges
        if end > first:
            ranges.append((month.strftime("%Y-%m"), first, end))
        month = following


def tasks(params: Params) -> dict[str, int]:
    """One task per month for the two parallel stages."""
    months = len(month_ranges(START, minutes(params)))
    return {"generate": 1, "read": 1, "moments": months, "regroup": 1, "correlations": months}


def _write_json(path: Path, data: object) -> None:
    """Atomically, so a killed stage never leaves half a result."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _save(path: Path, array: np.ndarray) -> None:
    temporary = path.with_name(path.name + ".tmp.npy")
    np.save(temporary, array)
    os.replace(temporary, path)


def _series_months(work_dir: Path) -> list[tuple[str, int, int]]:
    """The months of the generated series, from its own timestamp convention (series.json)."""
    meta_path = work_dir / "series.json"
    require(meta_path)
    meta = json.loads(meta_path.read_text())
    if meta["step_seconds"] != STEP_SECONDS:
        raise StageError(f"{meta_path}: step {meta['step_seconds']} s, expected {STEP_SECONDS}")
    return month_ranges(datetime.fromisoformat(meta["start"]), int(meta["minutes"]))


# -- generate ---------------------------------------------------------------------------


def _events(rng: np.random.Generator, count: int, per_day: float, duration: tuple[int, int]) -> np.ndarray:
    """On/off state of an appliance switched on at random (Poisson) for random durations."""
    events = rng.poisson(per_day * count / 1440)
    starts = rng.integers(0, count, size=events)
    ends = np.minimum(count, starts + rng.integers(duration[0], duration[1], size=events))
    delta = np.zeros(count + 1, dtype=np.int32)
    np.add.at(delta, starts, 1)
    np.add.at(delta, ends, -1)
    return np.cumsum(delta[:-1]) > 0


def _appliance(kind: str, clock: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Power (W) drawn by one appliance of `kind`, minute by minute."""
    count = clock["day"].size
    scale = rng.uniform(0.7, 1.3)
    if kind == "refrigerator":  # compressor cycles, a bit longer on summer afternoons
        period = rng.uniform(40, 60)
        on = ((np.arange(count) / period + rng.random()) % 1.0) < 0.35 + 0.1 * clock["summer"] * clock["afternoon"]
        power = 120.0 * on + 5.0
    elif kind == "lighting":  # mornings and evenings, more at weekends, fewer in summer
        evening = (clock["hour"] >= 18) & (clock["hour"] < 23)
        morning = (clock["hour"] >= 6) & (clock["hour"] < 8)
        power = 150.0 * evening * (1.2 - 0.4 * clock["summer"]) + 80.0 * morning + 40.0 * clock["weekend"] * evening
    elif kind == "electric_heat":  # winter, mostly when people are home
        home = 1.0 - 0.6 * ((clock["hour"] >= 9) & (clock["hour"] < 17) & ~clock["weekend"])
        power = 1500.0 * (1.0 - clock["summer"]) * home * _events(rng, count, 6, (30, 120))
    else:  # short high-power uses at random times
        per_day, duration, watts = {
            "microwave": (3.0, (2, 8), 1100.0),
            "dishwasher": (0.7, (60, 110), 1200.0),
        }.get(kind, (0.5, (40, 90), 800.0))
        power = watts * _events(rng, count, per_day, duration)
    return scale * power + rng.normal(0.0, 2.0, size=count)


def _clock(count: int) -> dict[str, np.ndarray]:
    """Hour of day, weekend flag, summer weight and afternoon flag of every minute."""
    offset = START.hour * 60 + START.minute
    minute = np.arange(count, dtype=np.int64) + offset
    day = minute // 1440
    hour = (minute % 1440) // 60
    weekday = (START.weekday() + day) % 7
    day_of_year = (START.timetuple().tm_yday - 1 + day) % 365
    return {
        "day": day,
        "hour": hour,
        "weekend": weekday >= 5,
        "summer": 0.5 - 0.5 * np.cos(2 * np.pi * (day_of_year - 20) / 365),
        "afternoon": (hour >= 12) & (hour < 18),
    }


def channel_names(count: int) -> list[str]:
    """mains first, then appliances of REDD's kinds, numbered when there are more channels than kinds."""
    return ["mains"] + [f"{APPLIANCES[i % len(APPLIANCES)]}_{i // len(APPLIANCES) + 1}" for i in range(count - 1)]


def generate(work_dir: Path, params: Params, progress: Progress) -> None:
    """The seeded series (float32, minutes x channels): mains is the appliances plus base load and noise."""
    count, channels = minutes(params), int(params["channels"])
    if channels < 2:
        raise StageError("channels must be at least 2 (mains and one appliance)")
    rng = np.random.default_rng(int(params["seed"]))
    clock = _clock(count)
    series = np.empty((count, channels), dtype=np.float32)
    mains = 60.0 + 20.0 * np.sin(2 * np.pi * clock["hour"] / 24) + rng.normal(0.0, 5.0, size=count)
    for index, name in enumerate(channel_names(channels)[1:], 1):
        power = _appliance(name.rsplit("_", 1)[0], clock, rng)
        series[:, index] = power
        mains += power
    series[:, 0] = mains
    _save(work_dir / "series.npy", series)
    meta = {
        "start": START.isoformat(),
        "step_seconds": STEP_SECONDS,
        "minutes": count,
        "channels": channel_names(channels),
    }
    _write_json(work_dir / "series.json", meta)
    progress.advance()


# -- read -------------------------------------------------------------------------------


def read(work_dir: Path, params: Params, progress: Progress) -> None:
    """Distribute the series into one file per calendar month (the I/O-heavy step)."""
    months = _series_months(work_dir)
    require(work_dir / "series.npy")
    series = np.load(work_dir / "series.npy", mmap_mode="r")
    (work_dir / "months").mkdir(exist_ok=True)
    for name, first, end in months:
        _save(work_dir / "months" / f"{name}.npy", np.ascontiguousarray(series[first:end]))
    progress.advance()


# -- moments ----------------------------------------------------------------------------


def _month_moments(work_dir: Path, name: str) -> None:
    """One small message per month: count, sum, sum of squares, min, max of every channel."""
    rows = np.load(work_dir / "months" / f"{name}.npy").astype(np.float64)
    moments = {
        "count": int(rows.shape[0]),
        "sum": rows.sum(axis=0).tolist(),
        "sumsq": np.einsum("ij,ij->j", rows, rows).tolist(),
        "min": rows.min(axis=0).tolist(),
        "max": rows.max(axis=0).tolist(),
    }
    _write_json(work_dir / "moments" / f"{name}.json", moments)


def moments(work_dir: Path, params: Params, progress: Progress) -> None:
    """Per-month moments in parallel processes."""
    names = [name for name, _, _ in _series_months(work_dir)]
    require(*(work_dir / "months" / f"{name}.npy" for name in names))
    (work_dir / "moments").mkdir(exist_ok=True)
    parallel_map(partial(_month_moments, work_dir), names, progress, processes=True)


# -- regroup ----------------------------------------------------------------------------


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Global count, mean, std (population), min and max from per-month moments."""
    count = sum(part["count"] for part in parts)
    total = np.sum([part["sum"] for part in parts], axis=0)
    squares = np.sum([part["sumsq"] for part in parts], axis=0)
    mean = total / count
    variance = np.maximum(squares / count - mean * mean, 0.0)
    return {
        "count": count,
        "mean": mean.tolist(),
        "std": np.sqrt(variance).tolist(),
        "min": np.min([part["min"] for part in parts], axis=0).tolist(),
        "max": np.max([part["max"] for part in parts], axis=0).tolist(),
    }


def _with_halo(months_dir: Path, names: list[str], index: int, halo: int) -> np.ndarray:
    """Month `index`'s rows followed by the next `halo` rows of the series (from the following months)."""
    parts = [np.load(months_dir / f"{names[index]}.npy")]
    for name in names[index + 1 :]:
        if halo <= 0:
            break
        following = np.load(months_dir / f"{name}.npy", mmap_mode="r")[:halo]
        parts.append(np.asarray(following))
        halo -= following.shape[0]
    return np.concatenate(parts).astype(np.float64)


def regroup(work_dir: Path, params: Params, progress: Progress) -> None:
    """Reduce the monthly moments, then rewrite each month as z-scores, with a halo of the next lags - 1 rows.

    The halo is what lets each correlation task see the pairs (t, t + lag) that cross into the next month.
    """
    names = [name for name, _, _ in _series_months(work_dir)]
    paths = [work_dir / "moments" / f"{name}.json" for name in names]
    require(*paths, *(work_dir / "months" / f"{name}.npy" for name in names))
    overall = combine([json.loads(path.read_text()) for path in paths])
    _write_json(work_dir / "global.json", overall)
    mean, std = np.array(overall["mean"]), np.array(overall["std"])
    std[std == 0] = 1.0  # a constant channel: z-scores of 0, correlations of 0
    (work_dir / "normalized").mkdir(exist_ok=True)
    for index, name in enumerate(names):
        rows = _with_halo(work_dir / "months", names, index, int(params["lags"]) - 1)
        _save(work_dir / "normalized" / f"{name}.npy", (rows - mean) / std)
    progress.advance()


# -- correlations -----------------------------------------------------------------------


def _month_cross(work_dir: Path, lags: int, month: tuple[str, int, int]) -> None:
    """Channel x channel sums of z[t] z[t + lag] over this month's t, for every lag (lags x C x C)."""
    name, first, end = month
    rows = np.load(work_dir / "normalized" / f"{name}.npy")
    own = end - first
    cross = np.empty((lags, rows.shape[1], rows.shape[1]))
    for lag in range(lags):
        pairs = min(own, rows.shape[0] - lag)
        cross[lag] = rows[:pairs].T @ rows[lag : lag + pairs]
    _save(work_dir / "cross" / f"{name}.npy", cross)


def correlations(work_dir: Path, params: Params, progress: Progress) -> None:
    """Per-month lagged cross-products in parallel, then the final reduce into statistics.json and lagged.npy.

    lagged.npy[lag, i, j] is the correlation of channel i at t with channel j at t + lag;
    lag 0 is the usual correlation matrix, also written into statistics.json.
    """
    months = _series_months(work_dir)
    lags = int(params["lags"])
    require(work_dir / "global.json", *(work_dir / "normalized" / f"{name}.npy" for name, _, _ in months))
    (work_dir / "cross").mkdir(exist_ok=True)
    parallel_map(partial(_month_cross, work_dir, lags), months, progress, processes=True)
    overall = json.loads((work_dir / "global.json").read_text())
    cross = sum(np.load(work_dir / "cross" / f"{name}.npy") for name, _, _ in months)
    pairs = np.maximum(overall["count"] - np.arange(lags), 1)
    lagged = cross / pairs[:, None, None]
    _save(work_dir / "lagged.npy", lagged)
    meta = json.loads((work_dir / "series.json").read_text())
    result = {"channels": meta["channels"], **overall, "lags": lags, "correlation": lagged[0].tolist()}
    _write_json(work_dir / "statistics.json", result)


STAGES = {"generate": generate, "read": read, "moments": moments, "regroup": regroup, "correlations": correlations}


# -- verify (on the host, after the workflow) ---------------------------------------------


def _compare(name: str, got: object, expected: np.ndarray, rtol: float, atol: float) -> list[str]:
    got_array = np.asarray(got, dtype=np.float64)
    if got_array.shape != expected.shape:
        return [f"{name}: shape {got_array.shape}, expected {expected.shape}"]
    bad = ~np.isclose(got_array, expected, rtol=rtol, atol=atol)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        return [f"{name}{list(where)}: {got_array[where]!r}, expected {expected[where]!r} ({int(bad.sum())} differ)"]
    return []


def verify(work_dir: Path, params: Params) -> list[str]:
    """Recompute the statistics with NumPy directly from series.npy and compare."""
    result_path, series_path = work_dir / "statistics.json", work_dir / "series.npy"
    missing = [f"missing {p}" for p in (result_path, series_path) if not p.exists()]
    if missing:
        return missing
    result = json.loads(result_path.read_text())
    series = np.load(series_path).astype(np.float64)
    problems: list[str] = []
    if series.shape != (minutes(params), int(params["channels"])):
        problems.append(f"series shape {series.shape}, expected {(minutes(params), int(params['channels']))}")
    if result.get("count") != series.shape[0]:
        problems.append(f"count {result.get('count')}, expected {series.shape[0]}")
    expected = {
        "mean": series.mean(axis=0),
        "std": series.std(axis=0),
        "min": series.min(axis=0),
        "max": series.max(axis=0),
    }
    for key, values in expected.items():
        problems += _compare(key, result.get(key), values, rtol=1e-6, atol=1e-9)
    correlation = np.corrcoef(series, rowvar=False)
    problems += _compare("correlation", result.get("correlation"), correlation, rtol=1e-6, atol=1e-8)
    return problems + _verify_lagged(work_dir, series, int(params["lags"]))


def _verify_lagged(work_dir: Path, series: np.ndarray, lags: int) -> list[str]:
    """A few lags of lagged.npy against the whole series' z-scores (all lags would cost as much as the stage)."""
    path = work_dir / "lagged.npy"
    if not path.exists():
        return [f"missing {path}"]
    lagged = np.load(path)
    if lagged.shape != (lags, series.shape[1], series.shape[1]):
        return [f"lagged.npy shape {lagged.shape}, expected {(lags, series.shape[1], series.shape[1])}"]
    std = series.std(axis=0)
    z = (series - series.mean(axis=0)) / np.where(std == 0, 1.0, std)
    problems: list[str] = []
    for lag in sorted({0, 1, lags // 2, lags - 1} & set(range(lags))):
        pairs = max(1, series.shape[0] - lag)
        expected = z[:pairs].T @ z[lag : lag + pairs] / pairs
        problems += _compare(f"lagged[{lag}]", lagged[lag], expected, rtol=1e-6, atol=1e-8)
    return problems

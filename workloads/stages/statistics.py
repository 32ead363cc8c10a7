"""Statistics: global moments and channel correlations of REDD-like household power data.

Why this shape: the paper's statistics workflow reads a multi-year, one-minute power
series, distributes it by month, reduces per-month moments, regroups them into global
moments, then computes correlations per month and reduces again. The paper calls it
"I/O and network/message intensive, low CPU: most time goes to exchanging messages",
so the two parallel stages are built that way: each month's task sends its partial
results as many small durable messages, one per block of `message_minutes` rows and
per channel (at "small": 6 hours x 24 channels, ~35,000 messages per stage), and the
reduce reads them all back. The arithmetic is kept cheap (a few lags, not a day's
worth), so the stages' time goes to making messages durable, not to computing.
The data is synthetic but REDD-like (mains plus appliances with daily and weekly
cycles, on/off events and noise), seeded, so `verify` can recompute the answer with
NumPy straight from the series. The partials are exact block sums (and minima,
maxima), so combining them gives the same statistics up to float rounding.

How a message is made durable, as a broker with durable queues does before it
acknowledges one: written to DIR/messages/<stage>/<YYYY-MM>.<block>.<channel>.msg.tmp,
fsynced, renamed into place, then the spool directory is fsynced, before the next
message is sent. Each carries a header (month, block, channel, length) and a CRC-32,
so the reduce fails with a StageError naming the message when one is missing,
truncated, damaged or half-sent (never statistics from an incomplete spool), and
removes the spool once its result is written.

Files in the working directory:
    series.npy, series.json             generate (float32, minutes x channels; start, step, channel names)
    months/YYYY-MM.npy                  read (rows of one calendar month)
    messages/moments/*.msg              moments (count, sum, sum of squares, min, max of a block and channel)
    global.json, normalized/YYYY-MM.npy regroup: the moments' reduce (global moments; the spool stays),
                                        month rows as z-scores (float64) with a halo of lags - 1 rows
    messages/correlations/*.msg         correlations (a block's cross-products of channel i at lags 0 .. lags - 1)
    statistics.json, lagged.npy         correlations' final reduce (the results; consumes both spools)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import zlib
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
    "test": {"years": 0.25, "channels": 4, "lags": 60, "message_minutes": 1440, "seed": 1},
    "small": {"years": 1.0, "channels": 24, "lags": 10, "message_minutes": 360, "seed": 1},
    "study": {
        "years": 3.85,
        "channels": 48,
        "lags": 10,
        "message_minutes": 360,
        "seed": 1,
    },  # 47 months, as in the paper
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


# -- messages ---------------------------------------------------------------------------
#
# A message is one file DIR/messages/<stage>/<YYYY-MM>.<block>.<channel>.msg:
#     header (magic, month, block, channel, number of float64s), little-endian float64 payload, CRC-32 of both.
# It is written under a temporary name, fsynced, renamed into place, then the spool directory is fsynced:
# what a broker with durable queues does before acknowledging a message.


MAGIC = b"CSM1"
HEADER = struct.Struct("<4s7sIII")  # magic, month (YYYY-MM), block, channel, float64s in the payload
CHECKSUM = struct.Struct("<I")


def _spool(work_dir: Path, stage: str) -> Path:
    return work_dir / "messages" / stage


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fresh_spool(work_dir: Path, stage: str) -> None:
    """An empty spool for `stage` (a rerun after a kill must not mix old and new messages)."""
    spool = _spool(work_dir, stage)
    for path in (spool, spool.with_name(f".{stage}.consumed")):
        shutil.rmtree(path, ignore_errors=True)
    spool.mkdir(parents=True)
    _fsync_dir(spool.parent)


def _message_name(month: str, block: int, channel: int) -> str:
    return f"{month}.{block:05d}.{channel:03d}.msg"


def _blocks(rows: int, params: Params) -> int:
    return -(-rows // int(params["message_minutes"]))


def _send(spool: Path, spool_fd: int, month: str, block: int, channel: int, values: np.ndarray) -> None:
    """One durable message: on disk (file and directory entry) before the next one is sent."""
    body = HEADER.pack(MAGIC, month.encode(), block, channel, values.size) + values.astype("<f8").tobytes()
    data = body + CHECKSUM.pack(zlib.crc32(body))
    name = _message_name(month, block, channel)
    temporary = spool / f"{name}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise StageError(f"short write to {temporary}")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, spool / name)
    os.fsync(spool_fd)


def _send_all(spool: Path, month: str, messages: np.ndarray) -> None:
    """messages[block, channel] is the payload of message (block, channel) of this month."""
    spool_fd = os.open(spool, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for block in range(messages.shape[0]):
            for channel in range(messages.shape[1]):
                _send(spool, spool_fd, month, block, channel, messages[block, channel])
    finally:
        os.close(spool_fd)


def _receive(spool: Path, month: str, blocks: int, channels: int, size: int) -> np.ndarray:
    """All of one month's messages as an array [block, channel, value]; a missing or damaged one is an error."""
    out = np.empty((blocks, channels, size))
    expected = HEADER.size + 8 * size + CHECKSUM.size
    for block in range(blocks):
        for channel in range(channels):
            path = spool / _message_name(month, block, channel)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise StageError(f"message {path} is missing: the spool is incomplete") from None
            if len(data) != expected:
                raise StageError(f"message {path} is corrupt: {len(data)} bytes, expected {expected}")
            (checksum,) = CHECKSUM.unpack_from(data, expected - CHECKSUM.size)
            if zlib.crc32(data[: -CHECKSUM.size]) != checksum:
                raise StageError(f"message {path} is corrupt: checksum mismatch")
            if HEADER.unpack_from(data) != (MAGIC, month.encode(), block, channel, size):
                raise StageError(f"message {path} is corrupt: header {HEADER.unpack_from(data)!r}")
            out[block, channel] = np.frombuffer(data, dtype="<f8", count=size, offset=HEADER.size)
    return out


def _check_spool(spool: Path, count: int) -> None:
    """Call after every expected message was received: anything else there is an error (a half-sent message)."""
    entries = len(os.listdir(spool))
    if entries != count:
        raise StageError(f"{spool}: {entries} entries, expected {count} messages (stale or half-sent messages)")


def _consume(spool: Path) -> None:
    """Remove a reduced spool: renamed first, so a kill mid-removal never leaves a partial spool."""
    consumed = spool.with_name(f".{spool.name}.consumed")
    shutil.rmtree(consumed, ignore_errors=True)
    os.rename(spool, consumed)
    _fsync_dir(spool.parent)
    shutil.rmtree(consumed)
    with contextlib.suppress(OSError):  # another stage's spool is still there
        spool.parent.rmdir()


# -- moments ----------------------------------------------------------------------------

MOMENTS = 5  # count, sum, sum of squares, min, max


def _month_moments(work_dir: Path, params: Params, name: str) -> None:
    """One message per block of message_minutes rows and channel: count, sum, sum of squares, min, max."""
    rows = np.load(work_dir / "months" / f"{name}.npy").astype(np.float64)
    starts = np.arange(0, rows.shape[0], int(params["message_minutes"]))
    messages = np.empty((starts.size, rows.shape[1], MOMENTS))
    messages[:, :, 0] = np.diff(np.append(starts, rows.shape[0]))[:, None]
    messages[:, :, 1] = np.add.reduceat(rows, starts, axis=0)
    messages[:, :, 2] = np.add.reduceat(rows * rows, starts, axis=0)
    messages[:, :, 3] = np.minimum.reduceat(rows, starts, axis=0)
    messages[:, :, 4] = np.maximum.reduceat(rows, starts, axis=0)
    _send_all(_spool(work_dir, "moments"), name, messages)


def moments(work_dir: Path, params: Params, progress: Progress) -> None:
    """Per-month moments in parallel processes, sent as durable messages (regroup reduces them)."""
    names = [name for name, _, _ in _series_months(work_dir)]
    require(*(work_dir / "months" / f"{name}.npy" for name in names))
    (work_dir / "global.json").unlink(missing_ok=True)  # regroup's reduce of an earlier run's messages
    _fresh_spool(work_dir, "moments")
    parallel_map(partial(_month_moments, work_dir, params), names, progress, processes=True)


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


def _reduce_moments(work_dir: Path, params: Params, months: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    """Each month's moments from its messages (exact sums of the blocks' sums)."""
    spool = _spool(work_dir, "moments")
    require(spool)
    channels = len(json.loads((work_dir / "series.json").read_text())["channels"])
    parts, received = [], 0
    for name, first, end in months:
        blocks = _blocks(end - first, params)
        messages = _receive(spool, name, blocks, channels, MOMENTS)
        received += blocks * channels
        counts = messages[:, :, 0].sum(axis=0)
        if (counts != end - first).any():
            raise StageError(f"{spool}: month {name} has {counts.tolist()} rows per channel, expected {end - first}")
        parts.append(
            {
                "count": end - first,
                "sum": messages[:, :, 1].sum(axis=0),
                "sumsq": messages[:, :, 2].sum(axis=0),
                "min": messages[:, :, 3].min(axis=0),
                "max": messages[:, :, 4].max(axis=0),
            }
        )
    _check_spool(spool, received)
    return parts


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
    """Reduce the moments' messages, then rewrite each month as z-scores, with a halo of the next lags - 1 rows.

    The halo is what lets each correlation task see the pairs (t, t + lag) that cross into the next month.
    The spool stays until correlations has written the results, so that a rerun of regroup
    (after a kill, or calibration's repeated runs) does the same work; once it is gone, a
    rerun uses global.json, the reduce's result.
    """
    months = _series_months(work_dir)
    names = [name for name, _, _ in months]
    require(*(work_dir / "months" / f"{name}.npy" for name in names))
    spool = _spool(work_dir, "moments")
    if spool.exists() or not (work_dir / "global.json").exists():
        overall = combine(_reduce_moments(work_dir, params, months))
        _write_json(work_dir / "global.json", overall)
    else:
        overall = json.loads((work_dir / "global.json").read_text())
    mean, std = np.array(overall["mean"]), np.array(overall["std"])
    std[std == 0] = 1.0  # a constant channel: z-scores of 0, correlations of 0
    (work_dir / "normalized").mkdir(exist_ok=True)
    for index, name in enumerate(names):
        rows = _with_halo(work_dir / "months", names, index, int(params["lags"]) - 1)
        _save(work_dir / "normalized" / f"{name}.npy", (rows - mean) / std)
    progress.advance()


# -- correlations -----------------------------------------------------------------------


def _month_cross(work_dir: Path, params: Params, month: tuple[str, int, int]) -> None:
    """Sums of z[t, i] z[t + lag, j] over each block's t: one message (lags x C) per block and channel i."""
    name, first, end = month
    lags, size = int(params["lags"]), int(params["message_minutes"])
    rows = np.load(work_dir / "normalized" / f"{name}.npy")
    own, channels = end - first, rows.shape[1]
    blocks = _blocks(own, params)
    left, right = np.zeros((blocks * size, channels)), np.zeros((blocks * size, channels))
    cross = np.empty((blocks, channels, lags, channels))
    for lag in range(lags):
        pairs = min(own, rows.shape[0] - lag)  # fewer at the end of the series; the zero padding adds nothing
        left[:pairs], left[pairs:] = rows[:pairs], 0.0
        right[:pairs], right[pairs:] = rows[lag : lag + pairs], 0.0
        a = left.reshape(blocks, size, channels)
        cross[:, :, lag, :] = np.matmul(a.transpose(0, 2, 1), right.reshape(blocks, size, channels))
    _send_all(_spool(work_dir, "correlations"), name, cross.reshape(blocks, channels, lags * channels))


def _reduce_cross(work_dir: Path, params: Params, months: list[tuple[str, int, int]], channels: int) -> np.ndarray:
    """The whole series' cross-products [lag, i, j] from every month's messages."""
    spool = _spool(work_dir, "correlations")
    require(spool)
    lags = int(params["lags"])
    total, received = np.zeros((channels, lags * channels)), 0
    for name, first, end in months:
        blocks = _blocks(end - first, params)
        total += _receive(spool, name, blocks, channels, lags * channels).sum(axis=0)
        received += blocks * channels
    _check_spool(spool, received)
    return total.reshape(channels, lags, channels).transpose(1, 0, 2)


def correlations(work_dir: Path, params: Params, progress: Progress) -> None:
    """Per-month lagged cross-products in parallel, sent as durable messages, then the final reduce.

    lagged.npy[lag, i, j] is the correlation of channel i at t with channel j at t + lag;
    lag 0 is the usual correlation matrix, also written into statistics.json.
    """
    months = _series_months(work_dir)
    lags = int(params["lags"])
    require(work_dir / "global.json", *(work_dir / "normalized" / f"{name}.npy" for name, _, _ in months))
    meta = json.loads((work_dir / "series.json").read_text())
    _fresh_spool(work_dir, "correlations")
    parallel_map(partial(_month_cross, work_dir, params), months, progress, processes=True)
    overall = json.loads((work_dir / "global.json").read_text())
    cross = _reduce_cross(work_dir, params, months, len(meta["channels"]))
    pairs = np.maximum(overall["count"] - np.arange(lags), 1)
    lagged = cross / pairs[:, None, None]
    _save(work_dir / "lagged.npy", lagged)
    result = {"channels": meta["channels"], **overall, "lags": lags, "correlation": lagged[0].tolist()}
    _write_json(work_dir / "statistics.json", result)
    _consume(_spool(work_dir, "correlations"))
    moments_spool = _spool(work_dir, "moments")
    if moments_spool.exists():  # reduced by regroup into global.json, kept until the results exist
        _consume(moments_spool)


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

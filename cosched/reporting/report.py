"""Output of a replay: terminal tables, per-job CSV, summary JSON and PNG plots.

Plots are drawn on `matplotlib.figure.Figure` objects directly, which needs no
pyplot, no GUI backend and no global figure registry, so this module is safe
in headless runs and never changes the caller's matplotlib backend.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cosched.model import Job
from cosched.reporting.metrics import JobMetrics, Summary, as_metrics, time_series

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CSV_COLUMNS: tuple[str, ...] = (
    "id",
    "submit",
    "start",
    "end",
    "cores",
    "runtime",
    "walltime",
    "wait",
    "response",
    "slowdown",
    "bsld",
)

_CSV_CHUNK = 65536

# Floats at or above this magnitude, or nonzero below the smallest value two
# decimals can show, are written in scientific notation.
_SCI_ABOVE = 1e7
_SCI_BELOW = 0.005


def format_value(value: object) -> str:
    """One table cell: ints plain, floats with 2 decimals (scientific when huge or tiny)."""
    if value is None:
        return ""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        x = float(value)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x != 0 and (abs(x) >= _SCI_ABOVE or abs(x) < _SCI_BELOW):
            return f"{x:.3e}"
        return f"{x:.2f}"
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def shortened(text: str, most: int) -> str:
    """`text` in at most `most` characters: cut, and marked with '...', when longer."""
    return text if len(text) <= most else text[: most - 3].rstrip() + "..."


def format_table(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str] | None = None,
    title: str | None = None,
) -> str:
    """Rows of dicts as a plain-text table with a header and a dashed rule.

    `columns` defaults to every key, in order of first appearance. A column
    whose non-empty cells are all numbers is right-aligned, any other column
    left-aligned; a missing key is an empty cell. Lines carry no trailing
    spaces and the result no trailing newline.
    """
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            seen.update(dict.fromkeys(row))
        columns = list(seen)
    columns = [str(c) for c in columns]
    cells = [[format_value(row.get(c)) for c in columns] for row in rows]
    numeric = [
        all(_is_number(row.get(c)) for row in rows if row.get(c) is not None)
        and any(row.get(c) is not None for row in rows)
        for c in columns
    ]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(columns))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def write_jobs_csv(path: str | Path, jobs: Sequence[Job] | JobMetrics) -> Path:
    """Write one CSV row per job with the columns in `CSV_COLUMNS`; returns the path.

    Times are written with Python's shortest round-tripping float repr, so
    reading the file back gives the exact values. Parent folders are created.
    """
    m = as_metrics(jobs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = [getattr(m, name) for name in CSV_COLUMNS]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        # Chunks bound the Python objects alive at once (500k rows x 11 columns would be ~200 MB).
        for lo in range(0, len(m), _CSV_CHUNK):
            cols = [a[lo : lo + _CSV_CHUNK].tolist() for a in arrays]
            writer.writerows(zip(*cols, strict=True))
    return path


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_summary_json(path: str | Path, summary: Summary | Mapping[str, object]) -> Path:
    """Write a `Summary` (or any dict, e.g. `aggregate`'s) as indented JSON; returns the path.

    NaN and infinite values become ``null`` so the file is strict JSON.
    """
    data = summary.as_dict() if isinstance(summary, Summary) else summary
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        json.dump(_jsonable(data), fh, indent=2, allow_nan=False)
        fh.write("\n")
    return path


def _time_unit(span: float) -> tuple[float, str]:
    if span >= 3 * 86400:
        return 86400.0, "days"
    if span >= 3 * 3600:
        return 3600.0, "hours"
    if span >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _figure(right: float = 0.97) -> Figure:
    # A bare Figure needs no pyplot and no backend switch; savefig picks Agg for .png.
    # Fixed margins instead of a layout engine: constrained layout doubles the draw time.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.5))
    fig.subplots_adjust(left=0.1, right=right, bottom=0.14, top=0.9)
    return fig


def plot_run(
    out_dir: str | Path,
    jobs: Sequence[Job] | JobMetrics,
    capacity_cores: int,
    title: str | None = None,
    *,
    points: int = 2000,
    dpi: int = 100,
) -> list[Path]:
    """Draw utilization.png, queue_length.png and wait_distribution.png in `out_dir`.

    Utilization and queue length are the `time_series` step functions sampled
    at `points` instants, against time since the first submission. The wait
    plot is a histogram over log-spaced bins plus the empirical CDF on a log
    x-axis; jobs that did not wait cannot sit on a log axis, so their share is
    stated in the legend and is where the CDF starts. Returns the three paths.
    """
    from matplotlib.patches import Patch

    m = as_metrics(jobs)
    ts = time_series(m, capacity_cores, points=points)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scale, unit = _time_unit(m.makespan)
    x = (ts.t - ts.t[0]) / scale
    prefix = f"{title}: " if title else ""
    paths: list[Path] = []

    def save(fig: Figure, name: str) -> None:
        p = out / name
        fig.savefig(p, dpi=dpi)
        fig.clear()
        paths.append(p)

    fig = _figure()
    ax = fig.add_subplot()
    ax.step(x, ts.utilization, where="post", lw=0.8)
    busy = float(np.dot(m.cores.astype(np.float64), m.runtime))
    mean_util = busy / (capacity_cores * m.makespan) if m.makespan > 0 else 0.0
    ax.axhline(mean_util, color="C3", ls="--", lw=1, label=f"mean {mean_util:.1%}")
    ax.set_ylim(0, max(1.05, float(ts.utilization.max()) * 1.05))
    ax.set_xlabel(f"time since first submission ({unit})")
    ax.set_ylabel(f"utilization ({capacity_cores} cores)")
    ax.set_title(f"{prefix}utilization")
    ax.legend(loc="lower right")
    save(fig, "utilization.png")

    fig = _figure()
    ax = fig.add_subplot()
    ax.step(x, ts.queue_length, where="post", lw=0.8, color="C1")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time since first submission ({unit})")
    ax.set_ylabel("jobs waiting")
    ax.set_title(f"{prefix}queue length")
    save(fig, "queue_length.png")

    fig = _figure(right=0.91)
    ax = fig.add_subplot()
    wait = m.wait
    n = wait.shape[0]
    positive = np.sort(wait[wait > 0])
    zero_share = 1.0 - positive.shape[0] / n
    ax.set_xlabel("wait (seconds, log scale)")
    ax.set_ylabel("jobs")
    ax.set_title(f"{prefix}wait distribution ({n} jobs)")
    if positive.shape[0]:
        lo, hi = float(positive[0]), float(positive[-1])
        if hi <= lo:
            lo, hi = lo / 2, hi * 2
        bins = np.geomspace(lo, hi, 50).tolist()
        ax.hist(positive, bins=bins, color="C0", alpha=0.6, label=f"waited > 0 s ({1 - zero_share:.1%})")
        ax.set_xscale("log")
        cdf_ax = ax.twinx()
        # The CDF over all jobs, from the zero-wait share up to 1, on at most ~2000 points.
        step = max(1, positive.shape[0] // 2000)
        xs = np.concatenate((positive[::step], positive[-1:]))
        ranks = np.concatenate((np.arange(0, positive.shape[0], step), [positive.shape[0] - 1]))
        ys = zero_share + (ranks + 1) / n
        cdf_ax.step(xs, ys, where="post", color="C3", lw=1.2, label="CDF (all jobs)")
        cdf_ax.set_ylim(0, 1.02)
        cdf_ax.set_ylabel("fraction of jobs")
        handles = ax.get_legend_handles_labels()[0] + cdf_ax.get_legend_handles_labels()[0]
        handles.append(Patch(color="none", label=f"waited 0 s: {zero_share:.1%}"))
        ax.legend(handles=handles, loc="upper left")
    else:
        ax.text(
            0.5,
            0.5,
            "every job started at submission (wait 0 s)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_xticks([])
        ax.set_yticks([])
    save(fig, "wait_distribution.png")
    return paths

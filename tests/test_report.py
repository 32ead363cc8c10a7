"""Output files and the terminal table."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from cosched.model import Job
from cosched.reporting.metrics import aggregate, job_metrics, summarize
from cosched.reporting.report import (
    CSV_COLUMNS,
    format_table,
    format_value,
    plot_run,
    write_jobs_csv,
    write_summary_json,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def finished(jid: int, submit: float, cores: int, runtime: float, start: float, walltime: float) -> Job:
    job = Job(id=jid, submit=submit, cores=cores, walltime=walltime, runtime=runtime)
    job.start = start
    job.end = start + runtime
    return job


def hand_jobs() -> list[Job]:
    # Same schedule as tests/test_metrics.py on 4 cores: waits 0, 9, 28; bsld 1, 1.45, 3.3.
    return [
        finished(1, 0, 2, 10, start=0, walltime=60),
        finished(2, 1, 4, 20, start=10, walltime=20),
        finished(3, 2, 2, 5, start=30, walltime=3600),
    ]


def test_format_value() -> None:
    assert format_value(3) == "3"
    assert format_value(np.int64(120000)) == "120000"
    assert format_value(2.0) == "2.00"
    assert format_value(0.785714) == "0.79"
    assert format_value(123456789.0) == "1.235e+08"
    assert format_value(0.0001) == "1.000e-04"
    assert format_value(0.0) == "0.00"
    assert format_value(float("nan")) == "nan"
    assert format_value(float("inf")) == "inf"
    assert format_value(True) == "True"
    assert format_value(None) == ""
    assert format_value("easy") == "easy"


def test_format_table_alignment() -> None:
    rows = [
        {"policy": "fcfs", "jobs": 3, "mean_bsld": 1.9166666},
        {"policy": "easy-backfill", "jobs": 12000, "mean_bsld": 123.4},
    ]
    text = format_table(rows, title="comparison")
    lines = text.split("\n")
    assert lines == [
        "comparison",
        "policy          jobs  mean_bsld",
        "-------------  -----  ---------",
        "fcfs               3       1.92",
        "easy-backfill  12000     123.40",
    ]
    # Every table line (header, rule, rows) has the same width: columns line up.
    assert len({len(line) for line in lines[1:]}) == 1


def test_format_table_columns_and_missing_cells() -> None:
    rows: list[dict[str, object]] = [{"a": 1, "b": "x"}, {"a": 22, "c": 0.5}]
    text = format_table(rows, columns=["c", "a"])
    assert text.split("\n") == [
        "   c   a",
        "----  --",
        "       1",
        "0.50  22",
    ]
    # Default columns: every key in order of first appearance; text is left-aligned.
    header = format_table(rows).split("\n")[0]
    assert header.split() == ["a", "b", "c"]
    assert format_table(rows).split("\n")[2] == " 1  x"


def test_csv_round_trip(tmp_path: Path) -> None:
    jobs = hand_jobs()
    path = write_jobs_csv(tmp_path / "sub" / "jobs.csv", jobs)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3
    assert tuple(rows[0]) == CSV_COLUMNS
    r = rows[2]
    assert int(r["id"]) == 3 and int(r["cores"]) == 2
    assert float(r["submit"]) == 2 and float(r["start"]) == 30 and float(r["end"]) == 35
    assert float(r["runtime"]) == 5 and float(r["walltime"]) == 3600
    assert float(r["wait"]) == 28 and float(r["response"]) == 33
    assert float(r["slowdown"]) == pytest.approx(6.6) and float(r["bsld"]) == pytest.approx(3.3)
    # Floats round-trip exactly.
    m = job_metrics(jobs)
    assert [float(x["slowdown"]) for x in rows] == m.slowdown.tolist()


def test_csv_large_is_complete(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 20_000
    submit = np.cumsum(rng.exponential(10.0, n))
    wait = rng.exponential(100.0, n)
    run = rng.integers(1, 1000, n).astype(float)
    jobs = [
        finished(i, s, 1, r, start=s + w, walltime=r) for i, (s, w, r) in enumerate(zip(submit, wait, run, strict=True))
    ]
    path = write_jobs_csv(tmp_path / "jobs.csv", job_metrics(jobs))
    with path.open() as fh:
        assert sum(1 for _ in fh) == n + 1


def test_summary_json(tmp_path: Path) -> None:
    s = summarize(hand_jobs(), 4)
    data = json.loads(write_summary_json(tmp_path / "summary.json", s).read_text())
    assert data == s.as_dict()
    assert data["max_queue_length"] == 2 and data["utilization"] == pytest.approx(11 / 14)
    agg = aggregate([s, s])
    assert json.loads(write_summary_json(tmp_path / "agg.json", agg).read_text()) == agg
    # Non-finite values become null so the file stays strict JSON.
    out = write_summary_json(tmp_path / "inf.json", {"mean_slowdown": math.inf, "n": np.int64(3)})
    assert json.loads(out.read_text()) == {"mean_slowdown": None, "n": 3}


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_MAGIC


def test_plot_run_writes_pngs(tmp_path: Path) -> None:
    paths = plot_run(tmp_path / "plots", hand_jobs(), 4, "hand example")
    assert [p.name for p in paths] == ["utilization.png", "queue_length.png", "wait_distribution.png"]
    for p in paths:
        _assert_png(p)


def test_plot_run_no_waits_and_many_jobs(tmp_path: Path) -> None:
    # Nobody waited: the wait plot cannot use a log axis and says so instead.
    jobs = [finished(i, float(i), 1, 5.0, start=float(i), walltime=5.0) for i in range(10)]
    for p in plot_run(tmp_path / "nowait", jobs, 8, None):
        _assert_png(p)
    # All positive waits equal: the histogram still gets a usable bin range.
    same = [finished(i, 0.0, 1, 5.0, start=7.0, walltime=5.0) for i in range(4)]
    for p in plot_run(tmp_path / "same", same, 8, "same"):
        _assert_png(p)

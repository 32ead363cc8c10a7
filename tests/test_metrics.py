"""Metrics on hand-made schedules whose answers are worked out in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cosched.errors import ConfigError
from cosched.model import Job
from cosched.reporting.metrics import (
    METRIC_FIELDS,
    JobMetrics,
    Summary,
    aggregate,
    as_metrics,
    job_metrics,
    summarize,
    time_series,
)


def finished(jid: int, submit: float, cores: int, runtime: float, start: float, walltime: float = 0) -> Job:
    job = Job(id=jid, submit=submit, cores=cores, walltime=walltime or runtime, runtime=runtime)
    job.start = start
    job.end = start + runtime
    return job


# The hand example, on a 4-core machine:
#
#   job  submit  cores  runtime  start  end   wait  response  slowdown    bsld (threshold 10)
#   1    0       2      10       0      10    0     10        10/10=1     max(1, 10/10)=1
#   2    1       4      20       10     30    9     29        29/20=1.45  29/20=1.45
#   3    2       2      5        30     35    28    33        33/5=6.6    33/max(5,10)=3.3
#
# Cores in use: 2 on [0,10), 4 on [10,30) (job 1 ends at 10 as job 2 starts), 2 on [30,35).
# Queue: 0 on [0,1), 1 on [1,2), 2 on [2,10), 1 on [10,30), 0 from 30 on.
# makespan = 35 - 0 = 35; work = 2*10 + 4*20 + 2*5 = 110 core-s
# utilization = 110 / (4 * 35) = 11/14
# queue integral = 1*1 + 2*8 + 1*20 = 37 (= 0 + 9 + 28, the sum of waits); mean = 37/35
CAPACITY = 4


def hand_jobs() -> list[Job]:
    return [
        finished(1, 0, 2, 10, start=0),
        finished(2, 1, 4, 20, start=10),
        finished(3, 2, 2, 5, start=30),
    ]


def test_job_metrics_hand_example() -> None:
    m = job_metrics(hand_jobs())
    assert len(m) == 3
    assert m.id.tolist() == [1, 2, 3]
    assert m.wait.tolist() == [0, 9, 28]
    assert m.response.tolist() == [10, 29, 33]
    assert m.runtime.tolist() == [10, 20, 5]
    np.testing.assert_allclose(m.slowdown, [1.0, 1.45, 6.6])
    np.testing.assert_allclose(m.bsld, [1.0, 1.45, 3.3])
    assert m.makespan == 35
    with pytest.raises(ValueError):
        m.wait[0] = 5.0  # columns are read-only


def test_summarize_hand_example() -> None:
    s = summarize(hand_jobs(), CAPACITY)
    assert s.jobs == 3
    assert s.capacity_cores == 4
    assert s.makespan == 35
    assert s.utilization == pytest.approx(110 / 140)
    assert s.mean_wait == pytest.approx(37 / 3)
    assert s.mean_response == pytest.approx(72 / 3)  # (10 + 29 + 33) / 3 = 24
    assert s.mean_slowdown == pytest.approx((1 + 1.45 + 6.6) / 3)
    assert s.mean_bsld == pytest.approx((1 + 1.45 + 3.3) / 3)
    assert s.mean_queue_length == pytest.approx(37 / 35)
    assert s.max_queue_length == 2
    # Percentiles of waits [0, 9, 28] with linear interpolation:
    # p50 is the middle value 9; p90 sits at rank 0.9 * 2 = 1.8, 9 + 0.8 * (28 - 9) = 24.2.
    assert s.wait_p50 == 9
    assert s.wait_p90 == pytest.approx(24.2)
    assert s.wait_p99 == pytest.approx(9 + 0.98 * 19)
    assert s.wait_max == 28
    # bsld sorted [1, 1.45, 3.3]: p50 1.45, max 3.3.
    assert s.bsld_p50 == pytest.approx(1.45)
    assert s.bsld_max == pytest.approx(3.3)
    d = s.as_dict()
    assert d["utilization"] == s.utilization and d["max_queue_length"] == 2
    assert next(iter(d)) == "jobs"


def test_summarize_accepts_job_metrics_and_is_order_independent() -> None:
    jobs = hand_jobs()
    a = summarize(jobs, CAPACITY)
    b = summarize(job_metrics(list(reversed(jobs))), CAPACITY)
    # Equal up to float summation order.
    assert b.as_dict() == pytest.approx(a.as_dict())


def test_bsld_threshold_for_a_two_second_job() -> None:
    # A 2 s job that waited 3 s: response 5, slowdown 5 / 2 = 2.5.
    # Threshold 10: 5 / max(2, 10) = 0.5, bounded below by 1 -> 1.
    # Threshold 1: 5 / max(2, 1) = 2.5, the plain slowdown.
    # A 2 s job that waited 18 s: response 20, bsld 20 / 10 = 2 (slowdown 10).
    jobs = [finished(1, 0, 1, 2, start=3), finished(2, 0, 1, 2, start=18)]
    m = job_metrics(jobs)
    np.testing.assert_allclose(m.slowdown, [2.5, 10.0])
    np.testing.assert_allclose(m.bsld, [1.0, 2.0])
    m1 = job_metrics(jobs, bsld_threshold=1.0)
    np.testing.assert_allclose(m1.bsld, [2.5, 10.0])
    assert summarize(jobs, 2, bsld_threshold=1.0).mean_bsld == pytest.approx(6.25)
    assert summarize(jobs, 2).mean_bsld == pytest.approx(1.5)
    with pytest.raises(ConfigError):
        summarize(m, 2, bsld_threshold=1.0)  # metrics built with 10, asked for 1


def test_zero_runtime_slowdown() -> None:
    # 0/0 (no wait, no run) is slowdown 1; waited 5 s for a 0 s job is inf; bsld stays finite: 5/10 -> 1.
    m = job_metrics([finished(1, 0, 1, 0, start=0), finished(2, 0, 1, 0, start=5)])
    assert m.slowdown[0] == 1.0 and math.isinf(m.slowdown[1])
    assert m.bsld.tolist() == [1.0, 1.0]


def test_time_series_exact_breakpoints() -> None:
    ts = time_series(hand_jobs(), CAPACITY, points=None)
    assert ts.t.tolist() == [0, 1, 2, 10, 30, 35]
    # At t=10 job 1 ends as job 2 starts: 4 cores in use, never 6.
    assert ts.utilization.tolist() == [0.5, 0.5, 0.5, 1.0, 0.5, 0.0]
    assert ts.queue_length.tolist() == [0, 1, 2, 1, 0, 0]
    assert ts.utilization.max() <= 1.0


def test_time_series_sampled() -> None:
    t, util, queue = time_series(hand_jobs(), CAPACITY, points=8)
    # linspace(0, 35, 8) = 0, 5, 10, ..., 35; value in force at each instant.
    assert t.tolist() == [0, 5, 10, 15, 20, 25, 30, 35]
    assert util.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0]
    assert queue.tolist() == [0, 2, 1, 1, 1, 1, 0, 0]
    assert len(time_series(hand_jobs(), CAPACITY).t) == 2000
    with pytest.raises(ConfigError):
        time_series(hand_jobs(), CAPACITY, points=1)


def test_time_series_matches_summary_on_random_valid_schedule() -> None:
    # A greedy FCFS schedule on 16 cores is valid by construction, so utilization stays <= 1,
    # and the exact step functions integrate to the summary's means.
    rng = np.random.default_rng(7)
    cap = 16
    free_at = np.zeros(cap)
    jobs = []
    t = 0.0
    for i in range(300):
        t += float(rng.integers(0, 30))
        cores = int(rng.integers(1, cap + 1))
        run = float(rng.integers(1, 200))
        free_at.sort()
        start = max(t, float(free_at[cores - 1]))
        free_at[:cores] = start + run
        jobs.append(finished(i, t, cores, run, start=start))
    s = summarize(jobs, cap)
    ts = time_series(jobs, cap, points=None)
    assert ts.utilization.max() <= 1.0
    dt = np.diff(ts.t)
    assert float(np.dot(ts.utilization[:-1], dt)) / s.makespan == pytest.approx(s.utilization)
    assert float(np.dot(ts.queue_length[:-1], dt)) / s.makespan == pytest.approx(s.mean_queue_length)
    assert ts.queue_length.max() == s.max_queue_length
    assert ts.t[0] == min(j.submit for j in jobs) and ts.t[-1] == max(j.end for j in jobs)


def test_aggregate_two_summaries() -> None:
    a = summarize(hand_jobs(), CAPACITY)  # utilization 11/14, mean wait 37/3
    b = summarize([finished(1, 0, 4, 10, start=0)], CAPACITY)  # one full-machine job: utilization 1, wait 0
    agg = aggregate([a, b])
    assert set(agg) == set(METRIC_FIELDS)
    assert "capacity_cores" not in agg
    u = agg["utilization"]
    # mean (11/14 + 1) / 2 = 25/28; sample std of two values = |x - y| / sqrt(2) = (3/14) / sqrt(2).
    assert u["mean"] == pytest.approx(25 / 28)
    assert u["std"] == pytest.approx(3 / 14 / math.sqrt(2))
    assert u["min"] == pytest.approx(11 / 14) and u["max"] == 1.0
    w = agg["mean_wait"]
    assert w["mean"] == pytest.approx(37 / 6)
    assert w["std"] == pytest.approx(37 / 3 / math.sqrt(2))
    assert aggregate([a])["utilization"]["std"] == 0.0
    assert aggregate([a.as_dict(), b.as_dict()]) == agg


def test_empty_and_invalid_input() -> None:
    for call in (lambda: job_metrics([]), lambda: summarize([], 4), lambda: time_series([], 4)):
        with pytest.raises(ConfigError, match="no finished jobs to measure"):
            call()
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        summarize([], 4)
    never_started = Job(id=9, submit=5.0, cores=1, walltime=10.0, runtime=10.0)
    with pytest.raises(ConfigError, match="job 9"):
        job_metrics([never_started])
    with pytest.raises(ConfigError):
        summarize(hand_jobs(), 0)
    with pytest.raises(ConfigError):
        aggregate([])


def test_types() -> None:
    m = as_metrics(hand_jobs())
    assert isinstance(m, JobMetrics) and as_metrics(m) is m
    assert isinstance(summarize(m, CAPACITY), Summary)
    assert m.id.dtype == np.int64 and m.cores.dtype == np.int64 and m.wait.dtype == np.float64

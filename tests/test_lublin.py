"""Tests of the Lublin-Feitelson workload generator (workloads/lublin.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from cosched.errors import ConfigError
from workloads.lublin import (
    BATCH,
    INTERACTIVE,
    JobClassParams,
    LublinParams,
    daily_weights,
    generate,
)


def _load(trace, procs: int) -> float:
    c = trace.columns
    span = c["submit"][-1] - c["submit"][0]
    return float(np.sum(c["procs"] * c["runtime"]) / (procs * span))


def _hour_counts(trace) -> np.ndarray:
    c = trace.columns
    seconds_of_day = (c["submit"] + trace.header.unix_start_time) % 86400
    return np.bincount((seconds_of_day // 3600).astype(int), minlength=24)


def _expected_pow2_share(cls: JobClassParams) -> float:
    """P(size is a power of two | parallel) on the 128-processor machine the constants fit.

    Rounded jobs (probability pow2_prob among all) are powers of two by construction; an
    unrounded job is one when round(2 ** U) == 2 ** k, i.e. U in [log2(2^k - .5), log2(2^k + .5)),
    with U two-stage uniform on [ulow, umed] (prob uprob) and [umed, uhi].
    """
    parts = [(cls.ulow, cls.umed, cls.uprob), (cls.umed, cls.uhi, 1.0 - cls.uprob)]
    p_unrounded_pow2 = 0.0
    for k in range(1, 8):
        lo, hi = math.log2(2**k - 0.5), math.log2(2**k + 0.5)
        for a, b, weight in parts:
            overlap = max(0.0, min(hi, b) - max(lo, a))
            p_unrounded_pow2 += weight * overlap / (b - a)
    rounded = cls.pow2_prob / (1.0 - cls.serial_prob)
    return rounded + (1.0 - rounded) * p_unrounded_pow2


# ------------------------------------------------------------------ determinism


def test_same_seed_gives_identical_trace() -> None:
    a = generate(3000, 256, seed=11)
    b = generate(3000, 256, seed=11)
    assert a.name == b.name == "lublin-256-s11"
    assert a.columns.keys() == b.columns.keys()
    for key in a.columns:
        np.testing.assert_array_equal(a.columns[key], b.columns[key], err_msg=key)
    assert a.header == b.header


def test_same_seed_identical_with_load_and_fraction() -> None:
    a = generate(2000, 64, seed=5, load=0.9, interactive_fraction=0.4)
    b = generate(2000, 64, seed=5, load=0.9, interactive_fraction=0.4)
    for key in ("submit", "runtime", "procs", "queue"):
        np.testing.assert_array_equal(a.columns[key], b.columns[key])


def test_different_seeds_differ() -> None:
    a = generate(2000, 256, seed=1).columns
    b = generate(2000, 256, seed=2).columns
    for key in ("submit", "runtime", "procs"):
        assert not np.array_equal(a[key], b[key]), key


def test_generator_leaves_global_rng_alone() -> None:
    np.random.seed(123)
    before = np.random.random(3)
    np.random.seed(123)
    generate(500, 128, seed=9)
    assert np.array_equal(np.random.random(3), before)


# ------------------------------------------------------------------ shape and bounds


@pytest.mark.parametrize(
    ("procs", "kwargs"),
    [
        (256, {}),
        (128, {"interactive_fraction": 0.0}),
        (128, {"interactive_fraction": 1.0}),
        (1024, {"interactive_fraction": 0.3, "load": 1.5}),
        (4, {}),
        (3, {"load": 0.5}),
        (1, {}),
        (256, {"params": LublinParams.typeless(), "interactive_fraction": 1.0}),
    ],
)
def test_bounds_and_columns(procs: int, kwargs: dict) -> None:
    n = 4000
    trace = generate(n, procs, seed=3, **kwargs)
    c = trace.columns
    assert len(trace) == n
    assert c["procs"].min() >= 1 and c["procs"].max() <= procs
    assert c["runtime"].min() >= 1
    assert c["runtime"].max() <= math.exp(12.0)  # the model's runtime cap, TOO_MUCH_TIME
    assert c["submit"][0] == 0
    assert np.all(np.diff(c["submit"]) >= 0)
    for key in ("submit", "runtime"):
        assert np.array_equal(c[key], np.floor(c[key])), f"{key} not whole seconds"
    np.testing.assert_array_equal(c["req_time"], c["runtime"])
    np.testing.assert_array_equal(c["job_id"], np.arange(1, n + 1))
    assert set(np.unique(c["queue"])) <= {0, 1}
    assert trace.header.max_procs == procs and trace.header.max_nodes == procs
    assert 0 <= trace.header.unix_start_time < 5 * 86400


def test_one_processor_machine_has_only_serial_jobs() -> None:
    assert np.all(generate(500, 1, seed=0).columns["procs"] == 1)


def test_single_job() -> None:
    trace = generate(1, 32, seed=0)
    assert len(trace) == 1 and trace.columns["submit"][0] == 0


def test_trace_replays_as_jobs() -> None:
    jobs = generate(50, 64, seed=2).jobs()
    assert len(jobs) == 50
    assert all(1 <= j.cores <= 64 and j.runtime >= 1 for j in jobs)


def test_largest_batch_jobs_reach_machine_size() -> None:
    # UHI follows log2(procs): on 512 processors, batch jobs above the 128 the constants
    # were fitted for must appear (P(log2 size in [7, 9]) = 0.125 of parallel jobs).
    procs = generate(5000, 512, seed=4, interactive_fraction=0.0).columns["procs"]
    assert procs.max() > 128
    assert procs.max() <= 512


# ------------------------------------------------------------------ the model's statistics


@pytest.mark.parametrize(("fraction", "cls"), [(0.0, BATCH), (1.0, INTERACTIVE)])
def test_serial_and_power_of_two_shares(fraction: float, cls: JobClassParams) -> None:
    # procs=128 is the machine the constants were fitted on, so no shift applies.
    # Tolerances: binomial SDs on 20,000 jobs are ~0.0032 (serial) and <= 0.0035 (power of
    # two among ~14,000-17,000 parallel jobs); 0.015 is over 4 SDs, yet a wrong constant
    # (e.g. swapping batch and interactive: 0.29 vs 0.15, 0.96 vs 0.80) fails by far.
    procs = generate(20_000, 128, seed=21, interactive_fraction=fraction).columns["procs"]
    serial_share = float(np.mean(procs == 1))
    assert serial_share == pytest.approx(cls.serial_prob, abs=0.015)
    parallel = procs[procs > 1]
    pow2_share = float(np.mean((parallel & (parallel - 1)) == 0))
    assert pow2_share == pytest.approx(_expected_pow2_share(cls), abs=0.015)


def test_interactive_fraction_is_exact() -> None:
    for fraction in (0.0, 0.25, 0.5, 1.0):
        queue = generate(4000, 128, seed=8, interactive_fraction=fraction).columns["queue"]
        assert int(np.sum(queue == 0)) == round(fraction * 4000)


def test_natural_mix_is_mostly_interactive() -> None:
    # The reference's default: two independent streams with mean virtual gaps of about
    # 3,500 s (batch) and 620 s (interactive), i.e. ~85 % interactive. Heavy-tailed gaps
    # make one trace's share vary; (0.7, 0.95) holds with a wide margin.
    queue = generate(20_000, 128, seed=13).columns["queue"]
    share = float(np.mean(queue == 0))
    assert 0.7 < share < 0.95


def test_bigger_jobs_run_longer() -> None:
    # PA < 0 lowers the weight of the short gamma as size grows (batch: p from 0.70 at 1
    # processor to 0.31 at 128), so median runtime must grow with size.
    c = generate(20_000, 128, seed=17, interactive_fraction=0.0).columns
    small = c["runtime"][c["procs"] <= 2]
    big = c["runtime"][c["procs"] >= 64]
    assert np.median(big) > 2 * np.median(small)


@pytest.mark.parametrize("target", [0.3, 0.8, 1.0, 2.5])
def test_target_load_is_reached(target: float) -> None:
    procs = 256
    trace = generate(3000, procs, seed=7, load=target)
    assert _load(trace, procs) == pytest.approx(target, rel=0.02)


def test_target_load_with_fixed_mix_and_small_trace() -> None:
    trace = generate(20, 64, seed=1, load=0.6, interactive_fraction=0.5)
    assert _load(trace, 64) == pytest.approx(0.6, rel=0.02)


def test_daily_cycle_follows_the_model() -> None:
    # The model's weights put the peak in the early afternoon and the trough around
    # 04:00-05:00 (all hourly weights in 10:00-18:00 exceed 1, all in 00:00-06:00 are
    # below 0.65), so daytime hours must get several times the arrivals of night hours.
    trace = generate(20_000, 128, seed=23, interactive_fraction=1.0)
    counts = _hour_counts(trace)
    assert counts[10:18].mean() > 2.5 * counts[0:6].mean()
    weights = daily_weights(INTERACTIVE).reshape(24, 2).mean(axis=1)
    assert np.corrcoef(counts, weights)[0, 1] > 0.9


def test_daily_cycle_survives_load_scaling() -> None:
    # Gaps are scaled on the model's virtual clock, so the 24-hour cycle stays put.
    counts = _hour_counts(generate(20_000, 128, seed=29, load=3.0))
    assert counts[10:18].mean() > 2.5 * counts[0:6].mean()


def test_daily_weights_have_mean_one() -> None:
    for cls in (BATCH, INTERACTIVE):
        w = daily_weights(cls)
        assert w.shape == (48,)
        assert w.mean() == pytest.approx(1.0)
        assert np.all(w > 0)


# ------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"n_jobs": 0}, "n_jobs"),
        ({"n_jobs": -5}, "n_jobs"),
        ({"n_jobs": 2.5}, "n_jobs"),
        ({"procs": 0}, "procs"),
        ({"procs": -1}, "procs"),
        ({"load": 0.0}, "load"),
        ({"load": -1.0}, "load"),
        ({"load": 10.5}, "load"),
        ({"load": float("nan")}, "load"),
        ({"n_jobs": 1, "load": 0.5}, "load"),
        ({"interactive_fraction": 1.5}, "interactive_fraction"),
        ({"interactive_fraction": -0.1}, "interactive_fraction"),
        ({"params": "default"}, "params"),
        ({"seed": -1}, "seed"),
        ({"seed": None}, "seed"),
    ],
)
def test_bad_arguments_raise_config_error(kwargs: dict, word: str) -> None:
    args = {"n_jobs": 100, "procs": 64, "seed": 0} | kwargs
    with pytest.raises(ConfigError, match=word) as info:
        generate(**args)
    assert "\n" not in str(info.value)


def test_bad_params_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="serial_prob"):
        replace(BATCH, serial_prob=1.2)
    with pytest.raises(ConfigError, match="ulow"):
        replace(BATCH, umed=8.0)
    with pytest.raises(ConfigError, match="start_hour"):
        LublinParams(start_hour=24)

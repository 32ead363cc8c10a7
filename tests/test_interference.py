"""Tests of the replay's interference model and its shipped profiles (cosched/workflows/interference.py)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cosched.errors import ConfigError
from cosched.workflows.interference import (
    InterferenceParams,
    StageProfile,
    alone_totals,
    load_params,
    load_profiles,
    runtime_alone,
    shipped_params,
    speed,
    usage,
)
from workloads.workflows import APPS, paper_mix, paper_workflows

PROFILES = load_profiles()
PARAMS = load_params()

# Table 2, Slurm column, 64-core cluster: runtime (h), CPU util (%), Mem util (%).
TABLE2_SLURM = {
    "montage": (0.35, 45, 10),
    "blast": (0.71, 96, 44),
    "statistics": (0.69, 26, 5),
    "synthetic": (0.49, 99, 95),
}

HOST_PROFILES = load_profiles(Path(__file__).resolve().parents[1] / "workloads" / "profiles-host.toml")
"""Measured on a host: with `cpu_one_core` and `throttle_penalty`, which the paper's profiles lack."""
profiles = st.sampled_from(
    [*sorted(PROFILES.values(), key=lambda p: p.app_class), *sorted(HOST_PROFILES.values(), key=lambda p: p.app_class)]
)
core_counts = st.sampled_from([1, 2, 8, 16, 32, 64, 256])
fractions = st.floats(min_value=0.0, max_value=1.0)


# -- Shipped data --------------------------------------------------------------------


def test_every_paper_stage_has_a_matching_profile() -> None:
    for wf in paper_workflows(8).values():
        for stage in wf.stages:
            profile = PROFILES[stage.app_class]
            assert profile.parallel == stage.parallel, stage.app_class
            assert profile.tasks == stage.tasks, stage.app_class


def test_default_params_are_the_shipped_file() -> None:
    assert shipped_params() == PARAMS
    blast = PROFILES["blast.blastn"]
    assert speed(blast, 16, 8) == speed(blast, 16, 8, params=PARAMS)


def _mix_runs(app: str) -> list[list[tuple[StageProfile, int]]]:
    return [[(PROFILES[s.app_class], wf.cores) for s in wf.stages] for wf in paper_mix(1) if wf.app == app]


@pytest.mark.parametrize("app", APPS)
def test_alone_runs_reproduce_table2_slurm(app: str) -> None:
    hours, cpu_pct, mem_pct = TABLE2_SLURM[app]
    runs = _mix_runs(app)
    mean_runtime = statistics.mean(alone_totals(r).runtime for r in runs) / 3600
    pooled = alone_totals(run for workflow in runs for run in workflow)
    assert mean_runtime == pytest.approx(hours, rel=0.20)
    assert 100 * pooled.cpu == pytest.approx(cpu_pct, abs=5)
    assert 100 * pooled.mem == pytest.approx(mem_pct, abs=3)


def test_scalable_apps_spread_more_across_core_counts() -> None:
    """Table 2's +-%: BLAST and Synthetic scale (large spread), Montage barely does."""

    def spread(app: str) -> float:
        runtimes = [alone_totals(r).runtime for r in _mix_runs(app)]
        return statistics.pstdev(runtimes) / statistics.mean(runtimes)

    assert spread("montage") < 0.08
    assert spread("blast") > 0.15
    assert spread("synthetic") > 0.10
    assert spread("montage") < spread("statistics") < spread("blast")


# -- Runtime alone -------------------------------------------------------------------------


def test_runtime_alone_follows_amdahl_for_parallel_and_is_flat_for_sequential() -> None:
    par = StageProfile("x.par", True, 1.0, 0.1, 0.0, work=1000.0, tasks=1, serial_fraction=0.2)
    assert runtime_alone(par, 1) == pytest.approx(1000.0)
    assert runtime_alone(par, 4) == pytest.approx(1000.0 * (0.2 + 0.8 / 4))
    seq = StageProfile("x.seq", False, 1.0, 0.1, 0.0, work=50.0, tasks=1)
    assert runtime_alone(seq, 1) == runtime_alone(seq, 64) == 50.0


# -- Speed: properties -----------------------------------------------------------------------


@pytest.mark.parametrize("app_class", sorted(PROFILES))
@pytest.mark.parametrize("cores", [1, 8, 64])
def test_alone_at_full_quota_is_exactly_one(app_class: str, cores: int) -> None:
    profile = PROFILES[app_class]
    assert speed(profile, cores, cores) == 1.0
    assert speed(profile, cores, cores + 10) == 1.0  # a quota beyond the cores buys nothing
    assert speed(profile, cores, cores, PROFILES["blast.blastn"], 0.0) == 1.0  # idle neighbour


@given(profile=profiles, cores=core_counts, share=fractions, neighbour=profiles, nshare=fractions)
def test_speed_is_in_unit_interval(
    profile: StageProfile, cores: int, share: float, neighbour: StageProfile, nshare: float
) -> None:
    value = speed(profile, cores, share * cores, neighbour, nshare * cores, params=PARAMS)
    assert 0.0 <= value <= 1.0


@given(profile=profiles, cores=core_counts, a=fractions, b=fractions, neighbour=profiles, nshare=fractions)
def test_speed_is_monotone_in_quota(
    profile: StageProfile, cores: int, a: float, b: float, neighbour: StageProfile, nshare: float
) -> None:
    low, high = sorted((a * cores, b * cores))
    assert speed(profile, cores, low, params=PARAMS) <= speed(profile, cores, high, params=PARAMS) + 1e-12
    with_nb = [speed(profile, cores, q, neighbour, nshare * cores, params=PARAMS) for q in (low, high)]
    assert with_nb[0] <= with_nb[1] + 1e-12


@given(profile=profiles, cores=core_counts, share=fractions, neighbour=profiles, nshare=fractions)
def test_a_neighbour_never_speeds_a_stage_up(
    profile: StageProfile, cores: int, share: float, neighbour: StageProfile, nshare: float
) -> None:
    alone = speed(profile, cores, share * cores, params=PARAMS)
    shared = speed(profile, cores, share * cores, neighbour, nshare * cores, params=PARAMS)
    assert shared <= alone + 1e-12


def test_zero_quota_stops_the_stage() -> None:
    assert speed(PROFILES["montage.project"], 8, 0.0) == 0.0


@pytest.mark.parametrize(("quota", "neighbour_quota"), [(-1.0, 0.0), (1.0, -0.5), (float("nan"), 0.0)])
def test_bad_quota_is_rejected(quota: float, neighbour_quota: float) -> None:
    with pytest.raises(ConfigError, match="quota"):
        speed(PROFILES["blast.blastn"], 8, quota, PROFILES["blast.blastn"], neighbour_quota)


@pytest.mark.parametrize("cores", [0, -4, 2.0])
def test_bad_cores_are_rejected(cores: object) -> None:
    with pytest.raises(ConfigError, match="cores"):
        speed(PROFILES["blast.blastn"], cores, 1.0)  # type: ignore[arg-type]


# -- Speed: the paper's contrast -------------------------------------------------------------


@pytest.mark.parametrize("app_class", ["blast.blastn", "synthetic.compute"])
@pytest.mark.parametrize("cores", [8, 16, 32, 64])
def test_cpu_bound_stages_lose_about_half_when_half_their_quota_is_lent(app_class: str, cores: int) -> None:
    value = speed(PROFILES[app_class], cores, cores / 2)
    assert 0.50 <= value <= 0.60  # a 40-50 % loss


IO_BOUND_PARALLEL = [
    "montage.project",
    "montage.diff",
    "montage.fit",
    "montage.background",
    "montage.add",
    "statistics.moments",
    "statistics.correlations",
]


@pytest.mark.parametrize("app_class", IO_BOUND_PARALLEL)
@pytest.mark.parametrize("cores", [8, 16, 32, 64])
def test_io_bound_stages_lose_a_few_percent_when_half_their_quota_is_lent(app_class: str, cores: int) -> None:
    value = speed(PROFILES[app_class], cores, cores / 2)
    assert 0.94 <= value <= 1.0


@pytest.mark.parametrize("app_class", ["blast.split", "synthetic.fill", "montage.bgmodel"])
def test_sequential_stages_lose_nothing_while_the_quota_covers_their_core(app_class: str) -> None:
    assert speed(PROFILES[app_class], 16, 8) == pytest.approx(1.0, abs=1e-6)
    assert speed(PROFILES[app_class], 16, 0.25 * PROFILES[app_class].cpu) < 0.5


def test_cutting_the_quota_further_costs_an_io_bound_stage_eventually() -> None:
    project = PROFILES["montage.project"]
    assert speed(project, 32, 4) < 0.8 * speed(project, 32, 16)


def test_memory_heavy_pair_hurts_more_than_memory_light_pair() -> None:
    synth, montage = PROFILES["synthetic.compute"], PROFILES["montage.project"]
    heavy = speed(synth, 32, 32, synth, 32)
    light = speed(montage, 32, 32, montage, 32)
    # Full quotas on both sides would be a CPU overcommit; isolate the memory term with
    # a CPU-light neighbour of the same memory footprint.
    synth_like = replace(synth, cpu=0.01)
    montage_like = replace(montage, cpu=0.01)
    heavy_mem = speed(synth, 32, 32, synth_like, 32)
    light_mem = speed(montage, 32, 32, montage_like, 32)
    assert heavy < light
    assert heavy_mem < 0.8
    assert light_mem > 0.9
    assert heavy_mem < light_mem


def test_io_heavy_pair_hurts_more_than_io_light_pair() -> None:
    stats, synth = PROFILES["statistics.moments"], PROFILES["synthetic.compute"]
    io_pair = speed(stats, 32, 16, stats, 16)
    assert io_pair < 0.9
    assert speed(stats, 32, 16, replace(synth, mem=0.0), 16) > io_pair


def test_throttled_neighbour_interferes_less() -> None:
    synth = PROFILES["synthetic.compute"]
    busy = speed(synth, 32, 16, synth, 16)
    starved = speed(synth, 32, 16, synth, 1)
    assert busy < starved


def test_cpu_overcommit_is_shared_not_free() -> None:
    blast = PROFILES["blast.blastn"]
    no_contention = replace(PARAMS, beta_io=0.0, beta_mem=0.0)
    shared = speed(blast, 32, 32, blast, 32, params=no_contention)
    assert shared == pytest.approx(speed(blast, 32, 16, params=no_contention))


def test_harder_throttling_makes_a_quota_near_demand_free() -> None:
    project = PROFILES["montage.project"]
    soft = speed(project, 32, 16, params=replace(PARAMS, throttle_sharpness=2.0))
    hard = speed(project, 32, 16, params=replace(PARAMS, throttle_sharpness=200.0))
    assert soft < speed(project, 32, 16) < hard
    assert hard == pytest.approx(1.0, abs=0.01)


def test_a_parallel_stage_on_one_core_wants_its_measured_one_core_share() -> None:
    """Statistics on two cores keeps 0.41 of each busy, on one 0.49: half a core then throttles
    it hard, which the two-core share alone would not show."""
    measured = StageProfile("s.moments", True, 0.41, 0.03, 0.0, 21.8, 13, 0.03, 1.5, cpu_one_core=0.49)
    shared_only = replace(measured, cpu_one_core=None)
    assert measured.demand(1) == 0.49 and shared_only.demand(1) == 0.41
    assert measured.demand(2) == shared_only.demand(2) == pytest.approx(0.82)
    assert speed(measured, 1, 0.5) < speed(shared_only, 1, 0.5)
    assert speed(measured, 2, 1.0) == speed(shared_only, 2, 1.0)
    assert usage(measured, 1, 1.0, 1.0)[0] == pytest.approx(0.49)


def test_a_throttled_bursty_stage_slows_more_than_its_quota_was_cut() -> None:
    """Statistics' moments ran 3.5 times slower at half its demand; the quota alone says 2.1."""
    bursty = StageProfile("s.moments", True, 0.41, 0.03, 0.0, 21.8, 13, 0.03, 2.0, throttle_penalty=1.35)
    smooth = replace(bursty, throttle_penalty=0.0)
    assert 1 / speed(bursty, 2, 0.41) == pytest.approx(1 + 2.35 * (1 / speed(smooth, 2, 0.41) - 1))
    assert 1 / speed(bursty, 2, 0.41) > 3.0 > 1 / speed(smooth, 2, 0.41)
    assert speed(bursty, 2, 2.0) == speed(smooth, 2, 2.0) == 1.0  # nothing throttled, nothing to pay
    beside = PROFILES["blast.blastn"]
    assert speed(bursty, 2, 1.0, beside, 1.0) < speed(smooth, 2, 1.0, beside, 1.0)


# -- Usage -----------------------------------------------------------------------------------


def test_usage_alone_is_the_profile() -> None:
    blast = PROFILES["blast.blastn"]
    assert usage(blast, 32, 32, 1.0) == pytest.approx((blast.cpu, blast.mem))
    seq = PROFILES["blast.merge"]
    assert usage(seq, 32, 32, 1.0) == pytest.approx((seq.cpu / 32, seq.mem))


def test_usage_never_exceeds_the_quota() -> None:
    blast = PROFILES["blast.blastn"]
    rate = speed(blast, 32, 16)
    cpu, _ = usage(blast, 32, 16, rate)
    assert cpu == pytest.approx(0.5)  # a CPU-bound stage fills what it is lent
    stats = PROFILES["statistics.moments"]
    cpu, _ = usage(stats, 32, 16, speed(stats, 32, 16))
    assert cpu == pytest.approx(stats.cpu, rel=0.01)  # an I/O-bound one leaves it idle


def test_usage_rejects_bad_speed() -> None:
    with pytest.raises(ConfigError, match="speed"):
        usage(PROFILES["blast.blastn"], 8, 8, 1.5)


# -- Profile files ------------------------------------------------------------------------

_GOOD = """
[interference]
beta_io = 0.5
beta_mem = 0.5
throttle_sharpness = 8.0

[profile."a.par"]
parallel = true
cpu = 0.9
mem = 0.2
io = 0.1
work = 100.0
serial_fraction = 0.1
tasks = 4

[profile."a.seq"]
parallel = false
cpu = 1.0
mem = 0.1
io = 0.0
work = 10
tasks = 1
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profiles.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_a_good_file(tmp_path: Path) -> None:
    path = _write(tmp_path, _GOOD)
    profiles = load_profiles(path)
    assert set(profiles) == {"a.par", "a.seq"}
    assert profiles["a.seq"].serial_fraction == 1.0
    assert profiles["a.par"] == StageProfile("a.par", True, 0.9, 0.2, 0.1, 100.0, 4, 0.1)
    assert load_params(path) == InterferenceParams(0.5, 0.5, 8.0)


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("cpu = 0.9", "cpu = 1.5", r"profile 'a.par': cpu must be in \(0, 1\]"),
        ("cpu = 0.9", "cpu = 0", r"profile 'a.par': cpu"),
        ("mem = 0.1", "mem = -0.1", r"profile 'a.seq': mem must be in \[0, 1\]"),
        ("io = 0.1", "io = 2", r"profile 'a.par': io"),
        ("work = 10\n", "work = 0\n", r"profile 'a.seq': work"),
        ("tasks = 4", "tasks = 0", r"profile 'a.par': tasks"),
        ("tasks = 4", "tasks = 2.5", r"profile 'a.par': tasks"),
        ("parallel = false", 'parallel = "no"', r"profile 'a.seq': parallel"),
        ("serial_fraction = 0.1", "serial_fraction = 1.1", r"profile 'a.par': serial_fraction"),
        ("serial_fraction = 0.1\n", "", r"profile 'a.par' is missing serial_fraction"),
        ("cpu = 1.0\n", "", r"profile 'a.seq' is missing cpu"),
        ("tasks = 1\n", "tasks = 1\ncores = 3\n", r"profile 'a.seq' has unknown key\(s\) cores"),
        ("work = 10\n", "work = 10\nserial_fraction = 0.5\n", r"'a.seq': serial_fraction only applies"),
        ("work = 10\n", "work = 10\ncpu_one_core = 0.5\n", r"'a.seq': cpu_one_core only applies"),
        ("work = 10\n", "work = 10\nthrottle_penalty = -1\n", r"'a.seq': throttle_penalty must be in \[0, 5\]"),
        ("serial_fraction = 0.1", "serial_fraction = 0.1\ncpu_one_core = 0", r"'a.par': cpu_one_core must be in"),
    ],
)
def test_profile_errors_name_file_and_stage(tmp_path: Path, old: str, new: str, problem: str) -> None:
    assert old in _GOOD
    path = _write(tmp_path, _GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError, match=problem) as info:
        load_profiles(path)
    assert str(info.value).startswith(str(path))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("beta_io = 0.5", "beta_io = -1", "beta_io must be a number >= 0"),
        ("throttle_sharpness = 8.0", "throttle_sharpness = 0.5", "throttle_sharpness"),
        ("beta_mem = 0.5\n", "", "missing beta_mem"),
        ("beta_mem = 0.5\n", "beta_mem = 0.5\ngamma = 1\n", "unknown key"),
        ("[interference]", "[interferences]", r"missing the \[interference\] table"),
    ],
)
def test_param_errors_name_the_file(tmp_path: Path, old: str, new: str, problem: str) -> None:
    path = _write(tmp_path, _GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError, match=problem) as info:
        load_params(path)
    assert str(info.value).startswith(str(path))


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read profiles"):
        load_profiles(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_profiles(_write(tmp_path, "[profile\n"))
    with pytest.raises(ConfigError, match="no \\[profile"):
        load_profiles(_write(tmp_path, "[interference]\nbeta_io = 1\n"))

"""`cosched calibrate` and `cosched experiment asax --real` against the real engine, at test size.

Small on purpose (seconds per workflow): these check that the measurements
are real and consistent (cgroup CPU seconds never exceed the CPU granted, every
stage is profiled, the outputs verify), not the numbers the README reports,
which come from the commands it names at the "small" size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cosched.experiments.asax_real import MixEntry, StrategyRun, WorkflowResult, host_cpus, mean_run, predict, run_real
from cosched.experiments.asax_real_report import agreement, table2, table3
from cosched.workflows.calibration import calibrate, profiles_toml
from cosched.workflows.interference import load_params, load_profiles
from tests.daemon_support import require_engine, workflow_image
from workloads.real import stage_dag

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def image() -> str:
    return workflow_image()


def test_calibrate_profiles_every_stage_from_real_runs(image: str, tmp_path: Path) -> None:
    cpus = host_cpus()
    apps = ["statistics", "synthetic"]
    result = calibrate(require_engine(), image, tmp_path, cpus, size="test", apps=apps, pairs=len(cpus) > 1)
    expected = {f"{app}.{name}" for app in apps for name, _, _ in stage_dag(app)}
    assert set(result.profiles) == expected
    for m in result.stages:
        for run in (m.full, m.throttled, *([m.one_core] if m.one_core else [])):
            assert run.wall > 0 and run.cpu_seconds > 0 and run.peak_bytes > 0
            # cgroup accounting: a container never uses more CPU than its CFS quota allows. The quota
            # is per 100 ms period, and a run of W seconds touches up to W/period + 2 of them (the
            # first and last in part): a 0.26 s run at 0.482 CPUs used 0.196 s once, under load.
            assert run.cpu_seconds <= run.quota * (run.wall + 2 * 0.1) * 1.1 + 0.05, (m.app_class, run)
        assert m.throttled.quota == pytest.approx(max(0.05, round(m.full.busy / 2, 3)))
    if len(cpus) > 1:
        assert len(result.pairs) == 3
    path = tmp_path / "profiles.toml"
    path.write_text(profiles_toml(result.profiles, result.params, ["test"]))
    assert set(load_profiles(path)) == expected
    assert load_params(path) == result.params


def test_a_real_run_measures_cgroup_cpu_within_the_granted_quota(image: str, tmp_path: Path) -> None:
    require_engine()
    host = len(host_cpus())
    mix = [
        MixEntry("statistics-8-r1", "statistics", 1),
        MixEntry("synthetic-16-r1", "synthetic", 1),
        MixEntry("blast-64-r1", "blast", host),
        MixEntry("montage-64-r1", "montage", host),
    ]
    profiles_path = ROOT / "workloads" / "profiles-host.toml"
    profiles, params = load_profiles(profiles_path), load_params(profiles_path)
    run = run_real("static", mix, image, tmp_path / "static", host, profiles, size="test")
    assert [w.name for w in run.workflows] == [e.name for e in mix]
    for w in run.workflows:
        assert w.ok, (w.name, w.problems)
        assert w.runtime > 0 and w.response >= w.runtime
        assert 0 < w.cpu_seconds <= w.quota_seconds * 1.1 + 0.2, w
        assert w.quota_seconds <= w.cores * w.runtime + 1e-6
    assert run.makespan >= max(w.response for w in run.workflows) - 1e-6
    predicted = predict("static", mix, profiles, params, host, size="test")
    real, guess = {"static": run}, {"static": predicted}
    assert "montage" in table2(real, guess) and "Static" in table3(real, guess)
    assert len(agreement(real, guess)) == 4


def test_the_real_experiment_command_prints_the_tables(image: str, tmp_path: Path) -> None:
    require_engine()
    command = [sys.executable, "-m", "cosched.cli", "experiment", "asax", "--real", "--size", "test"]
    done = subprocess.run(
        [*command, "--strategies", "slurm", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Table 2 on this host" in done.stdout and "Table 3 on this host" in done.stdout
    assert "Replay within 15% of the measured runtime" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    workflows = summary["measured"]["slurm"]["workflows"]
    assert len(workflows) == 15 and all(w["ok"] for w in workflows)
    # space sharing never lends: every workflow was granted exactly its cores for its runtime
    for w in workflows:
        assert w["quota_seconds"] == pytest.approx(w["cores"] * w["runtime"], rel=1e-6)


def test_asax_prediction_is_the_mean_over_seeds_and_the_others_one_replay() -> None:
    """ASAx samples its lendings: its prediction averages the seeds' replays, workflow by
    workflow; Static and space sharing do not sample, so more seeds change nothing."""
    from cosched.experiments.asax_real import scaled_mix

    profiles_path = ROOT / "workloads" / "profiles-host.toml"
    profiles, params = load_profiles(profiles_path), load_params(profiles_path)
    mix = scaled_mix(2)

    def replay(strategy: str, seeds: list[int]) -> list[float]:
        return [w.runtime for w in predict(strategy, mix, profiles, params, 2, seeds=seeds).workflows]

    draws = [replay("asax", [seed]) for seed in (1, 2, 3)]
    assert draws[0] != draws[1]  # the seeds do draw differently, or the mean would prove nothing
    mean = replay("asax", [1, 2, 3])
    assert mean == pytest.approx([sum(column) / 3 for column in zip(*draws, strict=True)])
    both = predict("asax", mix, profiles, params, 2, seeds=[1, 2])
    one, two = (predict("asax", mix, profiles, params, 2, seeds=[seed]) for seed in (1, 2))
    assert both.makespan == pytest.approx((one.makespan + two.makespan) / 2)
    assert replay("static", [1, 2, 3]) == replay("static", [7])
    # ASAx learns in the replay of the mix (its rounds end), and the mean over seeds says how much
    assert one.weight_updates > 0 and both.weight_updates == (one.weight_updates + two.weight_updates) / 2
    assert predict("static", mix, profiles, params, 2, seeds=[1]).weight_updates == 0


def test_runs_of_one_mix_average_workflow_by_workflow_and_keep_every_problem() -> None:
    def run(runtime: float, makespan: float, problems: list[str]) -> StrategyRun:
        workflows = [
            WorkflowResult("m1", "montage", 1, runtime, runtime + 10, runtime / 2, runtime, 0.1),
            WorkflowResult(
                "b1", "blast", 1, 2 * runtime, 2 * runtime, runtime, 2 * runtime, 0.2, not problems, problems
            ),
        ]
        return StrategyRun("asax", workflows, makespan, 2)

    mean = mean_run([run(10.0, 100.0, []), run(20.0, 200.0, ["no hits"]), run(30.0, 150.0, ["no db"])])
    assert [w.runtime for w in mean.workflows] == [20.0, 40.0]
    assert mean.workflows[0].response == 30.0 and mean.workflows[0].cpu_seconds == 10.0
    assert mean.makespan == 150.0
    assert mean.workflows[0].ok and not mean.workflows[1].ok
    assert mean.workflows[1].problems == ["no hits", "no db"]


def test_a_saved_run_is_held_against_the_replay_again_without_running(tmp_path: Path) -> None:
    """`--measured SUMMARY`: after a recalibration, the tables again from the saved measurements."""
    from cosched.errors import ConfigError
    from cosched.experiments.asax_real import scaled_mix
    from cosched.experiments.asax_real_report import read_measured, write_json

    profiles_path = ROOT / "workloads" / "profiles-host.toml"
    profiles, params = load_profiles(profiles_path), load_params(profiles_path)
    mix = scaled_mix(2)
    measured = {s: predict(s, mix, profiles, params, 2, seeds=[4]) for s in ("slurm", "asax")}
    summary = tmp_path / "summary.json"
    write_json(measured, measured, summary, {"host_cores": 2, "size": "small", "seeds": [4], "repeats": 1})
    again, settings = read_measured(summary, host_cores=64)
    assert settings["host_cores"] == 2 and settings["seeds"] == [4]
    assert {s: r.overall() for s, r in again.items()} == {s: r.overall() for s, r in measured.items()}
    assert again["asax"].weight_updates == measured["asax"].weight_updates > 0
    done = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "experiment", "asax", "--real", "--measured", str(summary)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # the same replay as the one saved as measured: every gap is zero
    assert "Replay within 15% of the measured runtime: 8/8" in done.stdout
    assert "+0%" in done.stdout and "ASAx" in done.stdout and "Static" not in done.stdout
    summary.write_text('{"measured": {"asax": {"makespan": 1}}}')
    with pytest.raises(ConfigError, match=r"summary\.json: not a summary\.json .*workflows"):
        read_measured(summary, host_cores=2)

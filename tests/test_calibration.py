"""Calibration fitting and the real experiment's bookkeeping, without an engine.

The fits are checked by recovering known parameters from measurements the
model itself produces: if a fit were wrong (a sign, a missing term), the
recovered values would differ.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cosched.daemon.commands import _workflow_body
from cosched.daemon.specs import WorkflowSpec
from cosched.experiments.asax_real import _quota_seconds, predict, replay_workflow, scaled_mix
from cosched.workflows.calibration import (
    MEMORY_PER_CORE_MIB,
    Measured,
    PairMeasurement,
    StageMeasurements,
    fit_interference,
    fit_profile,
    predicted_pair,
    profiles_toml,
)
from cosched.workflows.interference import (
    InterferenceParams,
    StageProfile,
    load_params,
    load_profiles,
    runtime_alone,
    speed,
)
from workloads.images import DEBIAN_PACKAGES, IMAGE_ENV, one_builder
from workloads.real import real_workflow, spec_to_toml, stage_dag
from workloads.workflows import APPS, MIX_CORES

HOST = 2
PARAMS = InterferenceParams(beta_io=0.8, beta_mem=1.4, throttle_sharpness=8.0)


def _measure(profile: StageProfile) -> StageMeasurements:
    """What calibration would measure if the stage behaved exactly as `profile` says."""
    usable = HOST if profile.parallel else 1
    full_wall = runtime_alone(profile, HOST)
    busy = profile.cpu * usable
    full = Measured(full_wall, busy * full_wall, int(profile.mem * MEMORY_PER_CORE_MIB * HOST * 2**20), HOST, HOST)
    one = None
    if profile.parallel:
        one_wall = runtime_alone(profile, 1)
        one = Measured(one_wall, profile.demand(1) * one_wall, 0, 1, 1.0)
    runs = []
    for quota in (busy / 2, HOST / 2):
        runs.append(Measured(full_wall / speed(profile, HOST, quota, params=PARAMS), 0.0, 0, HOST, quota))
    return StageMeasurements(profile.app_class, profile.parallel, profile.tasks, full, one, *runs)


@pytest.mark.parametrize(
    "profile",
    [
        StageProfile("a.cpu", True, 0.95, 0.4, 0.05, 100.0, 8, 0.1, 32.0),
        StageProfile("a.io", True, 0.3, 0.05, 0.7, 40.0, 8, 0.4, 8.0, cpu_one_core=0.45),
        StageProfile("a.bursty", True, 0.45, 0.05, 0.2, 40.0, 8, 0.4, 2.0),
        StageProfile("a.fsyncs", True, 0.41, 0.03, 0.0, 21.8, 13, 0.03, 2.0, 0.49, throttle_penalty=1.35),
        StageProfile("a.seq", False, 0.7, 0.1, 0.3, 12.0, 1, 1.0, 4.0),
    ],
)
def test_fit_profile_recovers_the_profile_that_produced_the_measurements(profile: StageProfile) -> None:
    fitted = fit_profile(_measure(profile), HOST)
    assert fitted.parallel == profile.parallel and fitted.tasks == profile.tasks
    assert fitted.cpu == pytest.approx(profile.cpu, rel=1e-6)
    assert fitted.mem == pytest.approx(profile.mem, rel=1e-6)
    assert fitted.io == pytest.approx(profile.io, abs=1e-6)
    assert fitted.throttle_sharpness == profile.throttle_sharpness
    assert fitted.throttle_penalty == pytest.approx(profile.throttle_penalty, abs=1e-6)
    assert fitted.work == pytest.approx(profile.work, rel=1e-6)
    assert runtime_alone(fitted, HOST) == pytest.approx(runtime_alone(profile, HOST), rel=1e-6)
    if profile.parallel:
        assert fitted.serial_fraction == pytest.approx(profile.serial_fraction, abs=1e-6)
        assert fitted.demand(1) == pytest.approx(profile.demand(1), rel=1e-6)


def test_a_throttled_run_faster_than_alone_cannot_make_a_busy_stage_io_bound() -> None:
    # synthetic.fill as measured on the calibration host: the cold first run (alone) was the slowest
    full = Measured(2.34, 2.34, 525 << 20, HOST, float(HOST))
    throttled, half = Measured(1.99, 1.03, 525 << 20, HOST, 0.499), Measured(1.07, 0.84, 525 << 20, HOST, 1.0)
    fitted = fit_profile(StageMeasurements("synthetic.fill", False, 1, full, None, throttled, half), HOST)
    assert fitted.cpu == pytest.approx(1.0)
    assert fitted.io <= 1 - fitted.cpu + 1e-9


def test_fit_interference_recovers_the_betas_of_the_pairs() -> None:
    profiles = {
        p.app_class: p
        for p in (
            StageProfile("m.project", True, 0.5, 0.1, 0.5, 60.0, 9, 0.3),
            StageProfile("b.blastn", True, 0.99, 0.45, 0.02, 90.0, 8, 0.1),
            StageProfile("s.moments", True, 0.3, 0.3, 0.7, 50.0, 12, 0.2),
            StageProfile("y.compute", True, 0.99, 0.9, 0.01, 80.0, 16, 0.05),
        )
    }
    names = sorted(profiles)
    pairs = []
    for i, first in enumerate(names):
        for second in names[i:]:
            a, b = predicted_pair(profiles[first], profiles[second], HOST, 1.0, PARAMS)
            pairs.append(PairMeasurement(first, second, 1.0, a, b))
    fitted = fit_interference(pairs, profiles, HOST, base=replace(PARAMS, beta_io=0.0, beta_mem=0.0))
    assert fitted.beta_io == pytest.approx(PARAMS.beta_io, abs=0.051)
    assert fitted.beta_mem == pytest.approx(PARAMS.beta_mem, abs=0.051)


def test_a_pair_that_ends_apart_finishes_its_tail_alone() -> None:
    short = StageProfile("x.short", True, 0.9, 0.0, 0.0, 10.0, 1, 0.0)
    long = StageProfile("x.long", True, 0.9, 0.0, 0.0, 100.0, 1, 0.0)
    a, b = predicted_pair(short, long, HOST, 1.0, PARAMS)
    alone_at_half = runtime_alone(long, HOST) / speed(long, HOST, 1.0, params=PARAMS)
    assert a < b
    assert b == pytest.approx(alone_at_half, rel=1e-9)  # no contention without io or mem: same as alone


def test_profiles_file_round_trips_through_the_replay_loader(tmp_path: Path) -> None:
    profiles = {
        p.app_class: fit_profile(_measure(p), HOST)
        for p in (
            StageProfile("a.cpu", True, 0.95, 0.4, 0.05, 100.0, 8, 0.1),
            StageProfile("a.seq", False, 0.8, 0.1, 0.3, 12.0, 1),
        )
    }
    path = tmp_path / "profiles.toml"
    path.write_text(profiles_toml(profiles, PARAMS, ["measured on a test", ""]))
    loaded = load_profiles(path)
    assert set(loaded) == set(profiles)
    for name, profile in profiles.items():
        assert loaded[name].cpu == pytest.approx(profile.cpu, rel=1e-3)
        assert loaded[name].work == pytest.approx(profile.work, rel=1e-3)
    assert load_params(path) == PARAMS


def test_quota_seconds_integrate_the_quota_log_over_the_run() -> None:
    host = {"start": 100.0, "end": 130.0, "cores": 2, "quota_changes": [{"at": 110.0, "cpus": 1.0}]}
    assert _quota_seconds(host) == pytest.approx(2 * 10 + 1 * 20)
    guest = {"start": 50.0, "end": 60.0, "cores": 2, "quota_changes": [{"at": 49.5, "cpus": 1.0}]}
    assert _quota_seconds(guest) == pytest.approx(10.0)  # the launch quota counts from the start
    alone = {"start": 0.0, "end": 5.0, "cores": 1, "quota_changes": []}
    assert _quota_seconds(alone) == pytest.approx(5.0)


def test_the_scaled_mix_keeps_the_papers_cores_at_64_and_fits_a_small_host() -> None:
    full = scaled_mix(64)
    assert [e.cores for e in full] == [c for app in APPS for c in MIX_CORES[app]]
    small = scaled_mix(2, repeats=2)
    assert len(small) == 30 and len({e.name for e in small}) == 30
    assert {e.cores for e in small} == {1, 2}
    assert max(e.cores for e in small if e.app == "blast") == 2


def test_real_workflows_are_the_replay_dags_plus_generate_and_submit_through_toml(tmp_path: Path) -> None:
    for app in APPS:
        spec = real_workflow(app, cores=2, data_dir=tmp_path, image="img:1", size="test")
        names = [stage["name"] for stage in spec["stages"]]
        assert names == [name for name, _, _ in stage_dag(app)] and names[0] == "generate"
        body = _workflow_body(__import__("tomllib").loads(spec_to_toml(spec)))
        parsed = WorkflowSpec.model_validate(body)
        assert parsed.dag().stages[1].depends == ("generate",)
        assert parsed.job_spec(names[-1]).command[:4] == ["python3", "-m", "workloads.stages", app]
        dag = replay_workflow(scaled_mix(2)[0], "test") if app == "montage" else None
        if dag is not None:
            assert [s.name for s in dag.stages] == names


def test_the_dockerfile_installs_what_the_debootstrap_image_has() -> None:
    text = (Path(__file__).resolve().parents[1] / "workloads" / "Dockerfile").read_text()
    installed = re.search(r"--no-install-recommends ([^&\\]+)", text)
    assert installed is not None and tuple(installed.group(1).split()) == DEBIAN_PACKAGES
    assert "FROM debian:bookworm-slim" in text
    for entry in IMAGE_ENV[1:]:
        assert entry in text


def test_one_image_build_at_a_time_on_the_machine(tmp_path: Path) -> None:
    """A process building an image holds `one_builder`; another process's build waits until the
    first is done (then finds the image), rather than running a second debootstrap beside it."""
    done = tmp_path / "done"
    script = (
        "import time; from pathlib import Path; from workloads.images import one_builder\n"
        f"with one_builder():\n    print('held', flush=True); time.sleep(1); Path({str(done)!r}).touch()\n"
    )
    root = Path(__file__).resolve().parents[1]
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with one_builder():
            assert done.exists(), "got the lock while another process held it"
    finally:
        holder.wait(30)


def test_predict_without_lending_gives_each_workflow_its_runtime_alone() -> None:
    profiles = {}
    for app in APPS:
        for name, parallel, _ in stage_dag(app):
            p = StageProfile(f"{app}.{name}", parallel, 0.9, 0.1, 0.1, 5.0, 1, 0.2 if parallel else 1.0)
            profiles[p.app_class] = p
    mix = scaled_mix(2)
    run = predict("slurm", mix, profiles, PARAMS, 2, size="test")
    for entry, result in zip(mix, run.workflows, strict=True):
        expected = sum(runtime_alone(profiles[f"{entry.app}.{n}"], entry.cores) for n, _, _ in stage_dag(entry.app))
        assert result.runtime == pytest.approx(expected, rel=1e-6)
        assert result.quota_seconds == pytest.approx(result.runtime * entry.cores, rel=1e-6)
    static = predict("static", mix, profiles, PARAMS, 2, size="test")
    lent = [w for w in static.workflows if w.quota_seconds < w.runtime * w.cores * 0.99]
    assert lent  # Static co-located some stages on half an allocation
    assert all(w.ok for w in static.workflows)


def test_refit_from_saved_measurements_gives_the_same_profiles() -> None:
    from dataclasses import asdict

    from cosched.workflows.calibration import refit

    measurements = [_measure(StageProfile("a.cpu", True, 0.95, 0.4, 0.05, 100.0, 8, 0.1, 32.0))]
    pairs = [PairMeasurement("a.cpu", "a.cpu", 1.0, 230.0, 231.0)]
    document = {"stages": [asdict(m) for m in measurements], "pairs": [asdict(p) for p in pairs]}
    again = refit(document, HOST)
    assert again.profiles == {"a.cpu": fit_profile(measurements[0], HOST)}
    assert again.params == fit_interference(pairs, again.profiles, HOST)
    with pytest.raises(Exception, match="not a calibration measurements file"):
        refit({"stages": [{"app_class": "x"}], "pairs": []}, HOST)


def test_recalibrating_some_workflows_keeps_the_others_raw_runs(tmp_path) -> None:
    import json

    from cosched.workflows.commands import _merge_measurements

    path = tmp_path / "profiles.measurements.json"
    saved = {"stages": [{"app_class": "blast.split"}, {"app_class": "montage.add"}], "pairs": [{"first": "old"}]}
    path.write_text(json.dumps(saved))
    new = {"stages": [{"app_class": "montage.add", "new": True}], "pairs": []}
    merged = _merge_measurements(path, new, ["montage"])
    assert merged["stages"] == [{"app_class": "blast.split"}, {"app_class": "montage.add", "new": True}]
    assert merged["pairs"] == [{"first": "old"}]  # no pairs measured: the saved ones still explain the betas
    assert _merge_measurements(path, {**new, "pairs": [{"first": "new"}]}, ["montage"])["pairs"] == [{"first": "new"}]
    assert _merge_measurements(tmp_path / "absent.json", new, ["montage"]) == new


def test_every_timed_run_starts_from_the_data_its_first_run_found(tmp_path) -> None:
    from cosched.workflows.calibration import _restore, _snapshot

    data = tmp_path / "statistics"
    (data / "months").mkdir(parents=True)
    (data / "months" / "2011-04.npy").write_bytes(b"input")
    before = _snapshot(data, "moments")
    # what a run does: writes a spool of messages, consumes (removes) an input
    (data / "messages" / "moments").mkdir(parents=True)
    (data / "messages" / "moments" / "a.msg").write_bytes(b"output")
    (data / "months" / "2011-04.npy").unlink()
    again = _restore(before, data)
    assert again == data
    assert sorted(p.relative_to(data).as_posix() for p in data.rglob("*")) == ["months", "months/2011-04.npy"]
    assert (data / "months" / "2011-04.npy").read_bytes() == b"input"
    assert (before / "months" / "2011-04.npy").read_bytes() == b"input"  # the snapshot survives the run

"""The long-horizon ASAx experiment, its Theorem 1 accounting and the oracle ceiling (small runs)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from cosched.cli import main
from cosched.experiments.asax_ceiling import LiveCpuModel, Oracle
from cosched.experiments.asax_long import (
    LongExperiment,
    arrivals,
    class_moves,
    fixed_strategies,
    lendings,
    regret,
    run_long,
)
from cosched.model import Job, JobState, Usage
from cosched.workflows.interference import runtime_alone, shipped_profiles
from experts.default import default_experts

STRATEGIES = ["slurm", "asax", "uniform", "mem alone"]


@pytest.fixture(scope="module")
def small() -> LongExperiment:
    return run_long((1,), size=64, workflows=60, strategies=STRATEGIES)


def test_arrivals_offer_the_load_asked_and_repeat_per_seed() -> None:
    mix = arrivals(3000, 128, 0.9, seed=4)
    assert mix == arrivals(3000, 128, 0.9, seed=4) and mix != arrivals(3000, 128, 0.9, seed=5)
    times = [t for t, _ in mix]
    assert times == sorted(times) and len({w.name for _, w in mix}) == 3000
    profiles = shipped_profiles()
    work = sum(sum(runtime_alone(profiles[s.app_class], w.cores) for s in w.stages) * w.cores for _, w in mix)
    assert work / (128 * times[-1]) == pytest.approx(0.9, rel=0.1)  # offered core-seconds over capacity


def test_every_strategy_replays_the_same_arrivals_to_the_end(small: LongExperiment) -> None:
    names = [{w.workflow.name for w in run.workflows} for run in small.runs.runs]
    assert all(n == names[0] for n in names) and len(names[0]) == 60
    for run in small.runs.runs:
        assert all(w.finished for w in run.workflows), run.strategy
    for run in small.runs.runs:  # every lending carried out was scored when its lender ended
        assert all(d.loss is not None for d in lendings(run)), run.strategy


def test_fixed_mixtures_never_move_and_one_expert_alone_risks_exactly_its_own(small: LongExperiment) -> None:
    names = default_experts().names
    uniform = regret(small.select("uniform")[0])
    alone = regret(small.select("mem alone")[0])
    assert uniform is not None and alone is not None
    assert uniform.updates == 0 and alone.updates == 0
    assert uniform.asax == pytest.approx(uniform.uniform)  # weights 1/n: the mixture is the mean
    assert alone.asax == pytest.approx(alone.experts["mem"])  # all weight on mem
    assert set(fixed_strategies(default_experts())) == {"uniform", *(f"{n} alone" for n in names)}


def test_learning_stays_within_theorem_1_and_moves_weights(small: LongExperiment) -> None:
    g = regret(small.select("asax")[0])
    assert g is not None and g.cases > 50 and g.updates > 0
    assert g.best_per_learner <= min(g.experts.values()) + 1e-9
    assert g.excess == pytest.approx(g.asax - g.best_per_learner)
    assert g.excess <= g.bound
    moved = [move for move in class_moves(small.select("asax")[0]) if move.updates > 0]
    assert moved and all(move.lent_final != move.lent_uniform for move in moved)
    assert class_moves(small.select("slurm")[0]) == []


def test_oracle_lends_from_an_idle_stage_not_from_a_cpu_bound_one() -> None:
    """A CPU-bound guest barely slows a mostly idle host, and loses little on its CPU; next to
    another CPU-bound stage, even 10% costs the host more than 5% (interference model)."""
    oracle = Oracle(host_loss=0.05, guest_speed=0.7)

    def job(job_id: int, stage: str, cores: int) -> Job:
        return Job(id=job_id, submit=0.0, cores=cores, walltime=1e5, stage=stage)

    guest = job(1, "blast.blastn", 8)
    light = oracle.lend(None, guest, [job(2, "statistics.moments", 32)])  # type: ignore[arg-type]
    assert light is not None and light.host.id == 2 and 0 < light.fraction < 1
    assert oracle.lend(None, guest, [job(3, "blast.blastn", 32)]) is None  # type: ignore[arg-type]


def test_the_live_model_lends_by_measured_cpu_and_learns_a_guests_demand_from_its_runs_alone() -> None:
    """Its rule sees CPU only: a host busy on 4 of 32 cores lends, one busy on all does not; a guest
    kind never run alone needs all its cores, one measured alone at 2 busy CPUs needs far fewer."""
    model = LiveCpuModel(host_loss=0.05, guest_speed=0.8)

    def job(job_id: int, stage: str, cores: int, busy: float) -> Job:
        running = Job(id=job_id, submit=0.0, cores=cores, walltime=1e5, stage=stage, quota=float(cores))
        running.usage = Usage(cpu=busy / cores, mem=0.1, tasks_done=0, at=1.0, quota=float(cores))
        return running

    guest = job(1, "statistics.moments", 8, 0.0)
    assert model.lend(None, guest, [job(2, "blast.blastn", 32, 32.0)]) is None  # type: ignore[arg-type]
    idle = job(3, "montage.project", 32, 4.0)
    first = model.lend(None, guest, [idle])  # type: ignore[arg-type]
    assert first is not None and first.host is idle and first.fraction * 32 >= 0.8 * 8
    busier = job(5, "montage.project", 32, 30.0)  # 3 cores to spare within 5%: not the 6.4 of 8 asked
    assert model.lend(None, guest, [busier]) is None  # type: ignore[arg-type]
    alone = job(4, "statistics.moments", 8, 2.0)
    alone.start, alone.end, alone.state = 0.0, 10.0, JobState.DONE
    model.observe(alone, 10.0)
    assert model.demands[("statistics.moments", 8)] == pytest.approx(2.0)
    second = model.lend(None, guest, [busier])  # type: ignore[arg-type]
    assert second is not None and 0.8 * 2 <= second.fraction * 32 <= 0.05 * 30 + 2


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def test_cli_prints_tables_goals_and_writes_logs_and_plots(tmp_path: Path) -> None:
    rc, text, _ = run_cli(
        "experiment", "asax-long", "--size", "64", "--workflows", "40", "--seeds", "1",
        "--learners", "app,shared", "--out", str(tmp_path),
    )  # fmt: skip
    assert rc == 0
    for title in ("Each strategy on its own", "Theorem 1 on ASAx's own cases", "Which learners", "Goals"):
        assert title in text, title
    assert "ASAx, learner per shared" in text
    for name in ("decisions.jsonl", "training.jsonl", "summary.json", "expert_weights.png", "cumulative_loss.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"slurm/seed1", "asax/seed1", "uniform/seed1", "asax/shared/seed1"} <= set(summary)
    assert math.isfinite(summary["asax/seed1"]["regret"]["bound"])
    rc, text, _ = run_cli("experts", "fit", str(tmp_path / "training.jsonl"), "--out", str(tmp_path / "fit.json"))
    assert rc == 0
    rc, text, _ = run_cli(
        "experiment", "asax-long", "--size", "64", "--workflows", "20", "--seeds", "2",
        "--compare-experts", str(tmp_path / "fit.json"),
    )  # fmt: skip
    assert rc == 0 and "ASAx with each expert set" in text and "fit.json" in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--learners", "class,bogus"], "unknown learner 'bogus'"),
        (["--size", "60"], "multiple of 8"),
        (["--round-threshold", "2"], "round threshold"),
        (["--compare-experts", "/nonexistent.json"], "expert set not found"),
    ],
)
def test_cli_bad_input_is_one_line(args: list[str], needle: str) -> None:
    rc, _, err = run_cli("experiment", "asax-long", "--workflows", "5", *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and needle in lines[0], err


def test_saving_by_thirds_is_one_without_learning(small: LongExperiment) -> None:
    from cosched.experiments.asax_long_report import saving_by_thirds

    assert np.allclose(saving_by_thirds(small.select("uniform")[0]), 1.0)


def test_the_ceiling_table_has_each_rules_best_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from cosched.experiments import asax_ceiling
    from cosched.experiments.asax import run_experiment

    monkeypatch.setattr(asax_ceiling, "HOST_LOSSES", (0.1,))
    monkeypatch.setattr(asax_ceiling, "GUEST_SPEEDS", (0.8,))
    experiment = run_experiment(sizes=(64,), seeds=(1,))
    base = experiment.select(64, "slurm")[0]
    sweeps = {64: {rule: asax_ceiling.sweep(64, base, rule) for rule in asax_ceiling.RULES}}
    table = asax_ceiling.format_ceiling(experiment, sweeps)
    for rule in asax_ceiling.RULES:
        [point] = sweeps[64][rule]
        assert point.degradation >= 0 and point.wait_change < 0  # lending shortens waits, at some cost
        if asax_ceiling.ceiling([point], "response_change") is not None:
            assert f"{rule}, best response (host loss <= 0.1, guest speed >= 0.8)" in table
        else:
            assert f"{rule}, best response: none within 5%" in table

"""Fitting expert trees with scikit-learn from decision logs (experts.fit, experts.records)."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from cosched.errors import ConfigError
from experts.features import JobFeatures
from experts.fit import DecisionRecord, describe, fit_experts, read_log, write_log
from experts.tree import ExpertSet, expected_lent, leaves
from experts.weights import ExponentialWeights


@pytest.fixture(autouse=True)
def _sklearn() -> None:
    """Every test here fits trees: without scikit-learn they skip, or fail under CI."""
    require_module("sklearn")


def synthetic_records(count: int = 600, seed: int = 0) -> list[DecisionRecord]:
    """Random states and actions; lending from low CPU (<= 0.5) never hurts, lending >= 30% from a
    busy job (CPU > 0.5) always hits the maximum loss."""
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(count):
        x = JobFeatures(
            cpu=float(rng.random()),
            mem=float(rng.random()),
            parallel=bool(rng.random() < 0.5),
            progress=float(rng.random()),
            happiness=float(rng.uniform(0.8, 2.0)),
        )
        action = int(rng.integers(10))
        loss = 1.0 if x.cpu > 0.5 and action >= 3 else 0.0
        records.append(DecisionRecord(x, action, loss, app="synthetic"))
    return records


LOW = JobFeatures(cpu=0.2, mem=0.5, parallel=True, progress=0.5, happiness=1.3)
HIGH = JobFeatures(cpu=0.9, mem=0.5, parallel=True, progress=0.5, happiness=1.3)


def test_fitted_set_lends_more_from_low_cpu_states() -> None:
    fitted = fit_experts(synthetic_records(), m=10, max_depth=3, seed=0)
    assert fitted.names == ("cpu", "mem", "stage", "progress")
    cpu = fitted.experts[0]
    assert expected_lent(cpu.predict(LOW)) > expected_lent(cpu.predict(HIGH)) + 0.2
    assert expected_lent(cpu.predict(HIGH)) < 0.2  # mostly 0..20% where big loans failed
    weights = ExponentialWeights(len(fitted))
    assert expected_lent(weights.mix(fitted.predict_all(LOW))) > expected_lent(weights.mix(fitted.predict_all(HIGH)))


def test_fitted_leaves_cover_all_actions_with_smoothing() -> None:
    # only actions 0 and 1 ever taken: the other eight still get probability, by smoothing
    records = [DecisionRecord(LOW if k % 2 else HIGH, k % 2, 0.0) for k in range(40)]
    fitted = fit_experts(records, m=10)
    for expert in fitted:
        for leaf in leaves(expert.root):
            assert len(leaf.dist) == 10 and min(leaf.dist) > 0 and math.fsum(leaf.dist) == pytest.approx(1.0)
    # leaf with 20 decisions of action 1 (weight 1 + 1e-3 each) and smoothing 1:
    # p(1) = (20 * 1.001 + 1) / (20 * 1.001 + 10) = 21.02 / 30.02
    assert fitted.experts[0].predict(LOW)[1] == pytest.approx(21.02 / 30.02)


def test_fit_is_deterministic_and_round_trips_through_json(tmp_path: Path) -> None:
    records = synthetic_records(300, seed=1)
    fitted = fit_experts(records, seed=0)
    assert fit_experts(records, seed=0) == fitted
    path = tmp_path / "fitted.json"
    fitted.save(str(path))
    loaded = ExpertSet.load(str(path))
    assert loaded == fitted
    assert loaded.predict_all(LOW).tolist() == fitted.predict_all(LOW).tolist()
    text = describe(loaded)
    assert "[1] cpu" in text and "if cpu <=" in text and "mean lent" in text


def test_fit_input_errors() -> None:
    with pytest.raises(ConfigError, match="empty"):
        fit_experts([])
    with pytest.raises(ConfigError, match="outside the grid"):
        fit_experts([DecisionRecord(LOW, 7, 0.0)], m=5)
    with pytest.raises(ConfigError, match="loss"):
        DecisionRecord(LOW, 1, 1.5)


def test_log_round_trip(tmp_path: Path) -> None:
    records = synthetic_records(20)
    records.append(DecisionRecord(JobFeatures(0.1, 0.2, False, 0.9, math.inf), 3, 0.25))
    path = tmp_path / "decisions.jsonl"
    write_log(path, records[:10])
    write_log(path, records[10:], append=True)
    assert '"happiness": "inf"' in path.read_text()
    assert read_log(path) == records


def test_read_log_errors_name_the_line(tmp_path: Path) -> None:
    good = DecisionRecord(LOW, 2, 0.0)
    path = tmp_path / "decisions.jsonl"
    write_log(path, [good, good])
    lines = path.read_text().splitlines()
    cases = {
        '{"features": ': "not valid JSON",
        lines[0].replace('"action": 2', '"action": -2'): "action",
        lines[0].replace('"cpu": 0.2', '"cpu": "x"'): "cpu",
        lines[0].replace('"loss": 0.0', '"loss": 2.0'): "loss",
        lines[0].replace('"mem": 0.5', '"mem": 1.5'): "mem",
        lines[0].replace('"loss": 0.0', '"loss": NaN'): "NaN",
        '{"features": {}, "action": 1, "loss": 0}': "features",
    }
    for bad, word in cases.items():
        path.write_text("\n".join([lines[0], "", bad, lines[1]]) + "\n")
        with pytest.raises(ConfigError) as info:
            read_log(path)
        assert f"{path}:3:" in str(info.value) and word in str(info.value)
    with pytest.raises(ConfigError, match="cannot read"):
        read_log(tmp_path / "missing.jsonl")


def test_a_daemons_state_file_is_a_decision_log(tmp_path: Path) -> None:
    """`cosched experts fit /var/lib/cosched/state.sqlite`: the scored lendings a daemon stored are
    the records, in order; one not carried out or not scored yet is left out; a file that is not a
    state file is one line."""
    from cosched.cli import main
    from cosched.daemon.store import Store
    from cosched.policies.asax import LendingDecision

    records = synthetic_records(50, seed=3)
    store = Store(tmp_path / "state.sqlite")
    with store.transaction() as db:
        for seq, record in enumerate(records, start=1):
            f = record.features
            features = {"cpu": f.cpu, "mem": f.mem, "parallel": f.parallel, "progress": f.progress}
            body = LendingDecision(
                time=float(seq),
                guest=seq,
                host=1000 + seq,
                app_class=record.app or "",
                features={**features, "happiness": math.inf if seq == 7 else f.happiness},
                experts=[],
                distributions=[],
                weights=[],
                action=record.action,
                fraction=record.action / 10,
                loss=None if seq == 5 else record.loss,
                executed=seq != 9,
            )
            store.save_decision(db, seq, body.as_dict())
    try:
        expected = [r for seq, r in enumerate(records, start=1) if seq not in (5, 9)]
        expected[5] = replace(expected[5], features=replace(expected[5].features, happiness=math.inf))  # seq 7
        read = read_log(tmp_path / "state.sqlite")  # beside a daemon that holds it open
        assert [(r.features, r.action, r.loss) for r in read] == [(r.features, r.action, r.loss) for r in expected]
        assert {r.app for r in read} == {"synthetic"}
    finally:
        store.close()
    assert main(["experts", "fit", str(tmp_path / "state.sqlite"), "--out", str(tmp_path / "fitted.json")]) == 0
    assert ExpertSet.load(str(tmp_path / "fitted.json")).names == ("cpu", "mem", "stage", "progress")
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(ConfigError, match=r"other\.sqlite: cannot read the lending decisions .*no such table"):
        read_log(other)

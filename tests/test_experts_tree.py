"""Expert trees, the default set, the JSON format and its load-time validation, and Hp(t)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from cosched.errors import ConfigError
from experts.default import JSON_PATH, default_experts, peaked
from experts.features import HAPPINESS_CAP, JobFeatures, happiness
from experts.store import dumps, loads
from experts.tree import Expert, ExpertSet, Leaf, Split, expected_lent, lent_fractions
from experts.weights import ExponentialWeights


def job(cpu: float, hp: float, mem: float = 0.3, parallel: bool = True, progress: float = 0.5) -> JobFeatures:
    return JobFeatures(cpu=cpu, mem=mem, parallel=parallel, progress=progress, happiness=hp)


# ---------------------------------------------------------------- default experts in the paper's situations


def test_high_cpu_and_hp_near_one_makes_zero_lending_most_likely() -> None:
    """Section 3.1.1: CPU% > 0.75 and Hp ~ 1.0 -> a0 (0% lent) is the most likely action."""
    experts = default_experts()
    x = job(cpu=0.9, hp=1.02)
    cpu = experts.experts[0].predict(x)
    assert experts.experts[0].name == "cpu"
    assert int(np.argmax(cpu)) == 0
    assert cpu[0] > 0.5
    mixture = ExponentialWeights(len(experts)).mix(experts.predict_all(x))  # uniform weights
    assert int(np.argmax(mixture)) == 0


def test_low_cpu_and_happy_lends_more() -> None:
    """Section 3.1.1: low CPU% and Hp > 1.1 -> degradation likely small, collocate more."""
    experts = default_experts()
    busy, idle = job(cpu=0.9, hp=1.02), job(cpu=0.1, hp=1.5)
    cpu = experts.experts[0]
    assert expected_lent(cpu.predict(idle)) > expected_lent(cpu.predict(busy)) + 0.3
    weights = ExponentialWeights(len(experts))
    assert expected_lent(weights.mix(experts.predict_all(idle))) > expected_lent(weights.mix(experts.predict_all(busy)))


def test_other_default_experts_follow_their_rules() -> None:
    e = {expert.name: expert for expert in default_experts()}
    # memory-bound jobs lend less than light ones, at the same Hp
    heavy, light = e["mem"].predict(job(0.3, 1.5, mem=0.95)), e["mem"].predict(job(0.3, 1.5, mem=0.2))
    assert expected_lent(heavy) < expected_lent(light)
    # a sequential stage using one core lends a lot, a busy parallel stage little
    seq = e["stage"].predict(job(0.12, 1.05, parallel=False))
    par = e["stage"].predict(job(0.9, 1.05, parallel=True))
    assert expected_lent(seq) > 0.5 > 0.1 > expected_lent(par)
    # late in the run with slack lends more than early with the same slack; overran lends ~nothing
    late, early = e["progress"].predict(job(0.5, 1.5, progress=0.9)), e["progress"].predict(job(0.5, 1.5, progress=0.1))
    assert expected_lent(late) > expected_lent(early)
    assert int(np.argmax(e["progress"].predict(job(0.5, 0.0, progress=1.2)))) == 0
    # every expert: behind schedule (Hp < 1) never lends more than with slack
    for expert in e.values():
        for x in (job(0.2, 0.5), job(0.9, 0.5, parallel=False)):
            slack = JobFeatures(x.cpu, x.mem, x.parallel, x.progress, 2.0)
            assert expected_lent(expert.predict(x)) <= expected_lent(expert.predict(slack))


def test_default_distributions_and_shapes() -> None:
    experts = default_experts()
    assert experts.names == ("cpu", "mem", "stage", "progress")
    assert experts.predict_all(job(0.5, 1.0)).shape == (4, 10)
    assert lent_fractions(10).tolist() == pytest.approx([k / 10 for k in range(10)])
    p = peaked(10, 0.0)
    assert math.fsum(p) == pytest.approx(1.0, abs=1e-12) and min(p) > 0 and p[0] > p[1] > p[2]
    assert default_experts(m=4).m == 4
    with pytest.raises(ConfigError):
        default_experts(m=0)


def test_predict_returns_shared_read_only_leaf() -> None:
    expert = default_experts().experts[0]
    out = expert.predict(job(0.9, 1.0))
    with pytest.raises(ValueError):
        out[0] = 1.0


def test_infinite_happiness_takes_the_happy_branch() -> None:
    cpu = default_experts().experts[0]
    assert cpu.predict(job(0.1, math.inf)).tolist() == cpu.predict(job(0.1, 5.0)).tolist()
    assert job(0.1, math.inf).as_vector()[4] == HAPPINESS_CAP


# ---------------------------------------------------------------- JSON format


def test_shipped_json_is_generated_from_code() -> None:
    assert JSON_PATH.read_text(encoding="utf-8") == dumps(default_experts()), (
        "regenerate with: python -m experts.default"
    )
    assert ExpertSet.load(str(JSON_PATH)) == default_experts()


def test_save_load_round_trip(tmp_path: Path) -> None:
    experts = default_experts(m=5)
    path = tmp_path / "e.json"
    experts.save(str(path))
    loaded = ExpertSet.load(str(path))
    assert loaded == experts
    x = job(0.3, 1.2)
    assert loaded.predict_all(x).tolist() == experts.predict_all(x).tolist()
    doc = json.loads(path.read_text())
    assert doc["format"] == "cosched-experts" and doc["version"] == 1 and doc["m"] == 5


def _doc() -> dict:
    return json.loads(dumps(default_experts()))


def _bad(tmp_path: Path, doc: dict | str) -> str:
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        ExpertSet.load(str(path))
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_unparsable_file(tmp_path: Path) -> None:
    assert "not valid JSON" in _bad(tmp_path, '{"format": "cosched-experts",')
    assert "cannot read" in _bad_missing(tmp_path)


def _bad_missing(tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        ExpertSet.load(str(tmp_path / "missing.json"))
    return str(info.value)


def test_newer_version_refused(tmp_path: Path) -> None:
    assert "newer" in _bad(tmp_path, _doc() | {"version": 2})


def test_unknown_feature(tmp_path: Path) -> None:
    doc = _doc()
    doc["experts"][1]["tree"]["feature"] = "memory"
    message = _bad(tmp_path, doc)
    assert "expert 'mem'" in message and "unknown feature 'memory'" in message and "node root" in message


def test_distribution_not_summing_to_one(tmp_path: Path) -> None:
    doc = _doc()
    doc["experts"][0]["tree"]["below"]["below"]["dist"][0] += 0.01
    message = _bad(tmp_path, doc)
    assert "expert 'cpu'" in message and "root.below.below" in message and "sums to" in message


def test_negative_probability(tmp_path: Path) -> None:
    doc = _doc()
    dist = doc["experts"][2]["tree"]["above"]["above"]["below"]["dist"]
    dist[0], dist[1] = dist[0] + 0.5, dist[1] - 0.5  # same sum, one entry negative
    assert min(dist) < 0
    message = _bad(tmp_path, doc)
    assert "expert 'stage'" in message and "negative" in message


def test_leaf_of_wrong_length(tmp_path: Path) -> None:
    doc = _doc()
    doc["experts"][3]["tree"]["below"]["below"]["dist"] = [0.5, 0.5]
    message = _bad(tmp_path, doc)
    assert "expert 'progress'" in message and "root.below.below" in message and "expected m=10" in message


def test_experts_with_mismatched_m(tmp_path: Path) -> None:
    doc = _doc()
    doc["experts"][1] = json.loads(dumps(default_experts(m=4)))["experts"][1]
    message = _bad(tmp_path, doc)
    assert "expert 'mem'" in message and "4 actions" in message and "m=10" in message


@pytest.mark.parametrize(
    "node",
    [
        [0.5, 0.5],
        {"feature": "cpu", "threshold": 0.5, "below": {"dist": [1.0] + [0.0] * 9}},  # no "above"
        {"dist": [1.0] + [0.0] * 9, "feature": "cpu"},
        {
            "feature": "cpu",
            "threshold": "high",
            "below": {"dist": [1.0] + [0.0] * 9},
            "above": {"dist": [1.0] + [0.0] * 9},
        },
    ],
)
def test_malformed_node(tmp_path: Path, node: object) -> None:
    doc = _doc()
    doc["experts"][0]["tree"]["above"] = node
    message = _bad(tmp_path, doc)
    assert "expert 'cpu'" in message and "root.above" in message


def test_other_document_errors(tmp_path: Path) -> None:
    assert "'format'" in _bad(tmp_path, _doc() | {"format": "something"})
    assert "'experts'" in _bad(tmp_path, _doc() | {"experts": []})
    doc = _doc()
    doc["experts"].append(copy.deepcopy(doc["experts"][0]))
    assert "duplicate expert names: cpu" in _bad(tmp_path, doc)
    assert "NaN" in _bad(tmp_path, dumps(default_experts()).replace("0.25", "NaN", 1))


def test_validation_happens_when_building_not_when_predicting() -> None:
    with pytest.raises(ConfigError, match="unknown feature"):
        Split("gpu", 0.5, Leaf((1.0,)), Leaf((1.0,)))
    with pytest.raises(ConfigError, match="sums to"):
        Leaf((0.5, 0.6))
    with pytest.raises(ConfigError, match="different lengths"):
        Expert("x", Split("cpu", 0.5, Leaf((1.0,)), Leaf((0.5, 0.5))))
    with pytest.raises(ConfigError, match="share one grid"):
        ExpertSet((Expert("a", Leaf((1.0,))), Expert("b", Leaf((0.5, 0.5)))))
    assert loads(dumps(default_experts()), source="s") == default_experts()


# ---------------------------------------------------------------- features and Hp(t)


def test_happiness_formula() -> None:
    # 100 s left; 10 tasks in 50 s = 0.2 tasks/s; 20 tasks remaining need 100 s -> exactly on pace
    assert happiness(walltime_left=100, tasks_done=10, tasks_total=30, elapsed=50) == pytest.approx(1.0)
    # 300 s left for the same 100 s of work -> Hp = 3
    assert happiness(300, 10, 30, 50) == pytest.approx(3.0)
    # 60 s left -> 0.6: will miss the walltime at this pace
    assert happiness(60, 10, 30, 50) == pytest.approx(0.6)


def test_happiness_edge_cases() -> None:
    assert happiness(100, 30, 30, 50) == math.inf  # nothing left to slow down
    assert happiness(100, 30, 30, 0) == math.inf
    assert happiness(100, 0, 30, 50) == 1.0  # no pace observed yet: neutral
    assert happiness(100, 5, 30, 0) == 1.0  # elapsed 0: no rate yet, neutral
    assert happiness(0, 10, 30, 50) == 0.0  # out of time with work left
    assert happiness(-20, 10, 30, 50) == 0.0  # overran (no hard kill): not |.| as in eq. 1
    for args in [(100, 31, 30, 50), (100, -1, 30, 50), (100, 0, 0, 50), (100, 1, 30, -1), (math.nan, 1, 30, 5)]:
        with pytest.raises(ConfigError):
            happiness(*args)


def test_job_features_validation_and_vector() -> None:
    x = JobFeatures(cpu=0.4, mem=0.7, parallel=False, progress=0.3, happiness=1.2)
    assert x.as_vector().tolist() == [0.4, 0.7, 0.0, 0.3, 1.2]
    assert x.value("parallel") == 0.0 and x.value("happiness") == 1.2
    for bad in [dict(cpu=-0.1), dict(mem=1.5), dict(progress=math.nan), dict(happiness=-1.0), dict(parallel=1)]:
        fields = dict(cpu=0.4, mem=0.7, parallel=False, progress=0.3, happiness=1.2) | bad
        with pytest.raises(ConfigError):
            JobFeatures(**fields)

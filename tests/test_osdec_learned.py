"""The learned OSDEC policy (`osdec`): its environment, its shipped model in NumPy against torch,
validated replays in the deferrable study, and a tiny training run end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import require_module

from cosched.learn.envs import DeferrableEnv
from cosched.learn.models import load_model, model_path
from cosched.learn.network import PolicyNetwork
from cosched.model import Cluster, Job
from cosched.policies.osdec_learned import LearnedOSDEC
from cosched.policies.registry import create
from cosched.replay.deferrable import Windows
from cosched.replay.osdec import DEFAULT_POLICIES, run
from cosched.replay.study import cluster_for, load_workload, split_pair

TRACE = "lublin:1200:64:0.9"


def _env(length: int = 100) -> DeferrableEnv:
    trace = load_workload(TRACE, seed=1)
    return DeferrableEnv(trace, cluster_for(trace, "core", None), length=length, window=8)


def test_environment_passes_gymnasiums_checker_and_is_seeded() -> None:
    from gymnasium.utils.env_checker import check_env

    check_env(_env(), skip_render_check=True)

    def episode(seed: int) -> tuple[list[int], float, dict]:
        env = _env()
        obs, _ = env.reset(seed=seed)
        rng, total, picks = np.random.default_rng(seed), 0.0, []
        while True:
            mask = env.action_masks()
            assert mask.sum() >= 2 and obs.shape == env.observation_space.shape  # asked only with a choice
            picks.append(int(rng.choice(np.flatnonzero(mask))))
            obs, reward, terminated, truncated, info = env.step(picks[-1])
            total += reward
            if terminated or truncated:
                return picks, total, info

    first, again = episode(3), episode(3)
    assert first == again and first[0]
    _, total, info = first
    # The return is the episode's eq. 6 reward (after the first decision) over the capacity.
    assert math.isclose(total * 64, info["reward"], rel_tol=1e-9) and info["expired"] >= 0


def test_on_demand_jobs_first_and_the_network_only_chooses_among_deferrable_ones() -> None:
    asked: list[tuple[np.ndarray, np.ndarray]] = []

    def decide(observation: np.ndarray, mask: np.ndarray) -> int:
        asked.append((observation, mask))
        return int(np.flatnonzero(mask)[-1])

    policy = LearnedOSDEC(decide=decide, window=4, time_scale=3600.0)
    from cosched.replay.driver import PolicySet, Replay

    jobs = [
        Job(id=1, submit=0.0, cores=4, walltime=3600.0, runtime=3600.0),
        Job(id=2, submit=0.0, cores=1, walltime=600.0, runtime=600.0, begin=0.0, latest_start=7200.0),
        Job(id=3, submit=0.0, cores=1, walltime=900.0, runtime=900.0, begin=0.0, latest_start=7200.0),
        Job(id=4, submit=1.0, cores=2, walltime=60.0, runtime=60.0),
    ]
    result = Replay(jobs, Cluster(4), PolicySet(policy, "easy"), validate=True).run()
    start = {job.id: job.start for job in result.jobs}
    assert start[1] == 0.0  # the on-demand job first, though the deferrable ones were there too
    assert asked and all(m.sum() >= 2 for _, m in asked)
    assert start[4] <= min(start[2], start[3])  # on-demand again before the deferrable ones


def test_shipped_model_numpy_equals_torch_on_its_check_batch() -> None:
    path = model_path("osdec", None)
    assert path.name == "lublin-osdec.npz" and path.with_suffix(".json").is_file()
    network, check = PolicyNetwork.load(path), PolicyNetwork.check_batch(path)
    assert network.kind == "osdec" and len(check["obs"]) >= 16
    logits = network.logits(check["obs"])
    np.testing.assert_allclose(logits, check["logits"], rtol=1e-4, atol=1e-4)
    masked = np.where(check["mask"], check["logits"], -np.inf).argmax(axis=1)
    assert [network.act(o, m) for o, m in zip(check["obs"], check["mask"], strict=True)] == masked.tolist()
    alone = np.stack([network.logits(observation) for observation in check["obs"]])
    assert np.array_equal(logits, alone)
    assert path.stat().st_size < 200_000
    assert isinstance(create("queue", "osdec"), LearnedOSDEC)
    assert create("queue", "osdec:lublin").window == int(load_model("osdec", "lublin").config["window"])


def test_the_study_replays_the_shipped_model_validly_and_deterministically() -> None:
    assert "osdec:easy" in DEFAULT_POLICIES
    assert split_pair("[osdec:/m.npz]:none") == ("osdec:/m.npz", "none") and split_pair("osdec") == ("osdec", "easy")
    windows = Windows(0.5)
    pairs = ["osdec:easy", "osdec:none", "osdec-sjf:easy"]
    rows = run("lublin:600:64", windows, pairs)  # validate=True: every start within its window
    again = run("lublin:600:64", windows, pairs[:1])
    assert rows[0][1] == again[0][1]
    for _, summary in rows:
        assert summary.started + summary.expired == summary.jobs > 0


def test_a_tiny_training_run_exports_a_model_the_policy_runs(tmp_path: Path) -> None:
    require_module("torch")
    require_module("sb3_contrib")
    out = tmp_path / "osdec"
    command = [sys.executable, "-m", "cosched.cli", "train", "osdec", TRACE, "--out", str(out)]
    command += ["--steps", "64", "--epochs", "1", "--length", "100", "--window", "8", "--warm-start", "none"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("checkpoint.zip", "training.jsonl", "learning-curve.png", "model.npz", "record.json"):
        assert (out / name).is_file(), name
    record = json.loads((out / "record.json").read_text())
    assert record["decisions"] == 64 and record["settings"]["kind"] == "osdec" and record["settings"]["log_time"]
    network = PolicyNetwork.load(out / "model.npz")
    assert network.config["kind"] == "osdec" and network.config["window"] == 8
    check = PolicyNetwork.check_batch(out / "model.npz")
    np.testing.assert_allclose(network.logits(check["obs"]), check["logits"], rtol=1e-4, atol=1e-4)
    rows = run("lublin:300:64", Windows(0.5), [f"[osdec:{out / 'model.npz'}]:easy"])
    assert rows[0][1].jobs > 0

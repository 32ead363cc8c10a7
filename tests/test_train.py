"""`cosched train`: a few hundred PPO steps end to end (CI trains nothing longer), resuming,
and the exported NumPy network against the live torch policy on fresh observations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from cosched.learn.network import PolicyNetwork
from cosched.model import Cluster
from cosched.replay.driver import PolicySet, replay
from cosched.replay.study import load_workload

TRACE = "lublin:1200:64:0.9"


def _train(out: Path, policy: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "cosched.cli", "train", policy, TRACE, "--out", str(out), "--steps", "128"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require_module("torch")
    require_module("sb3_contrib")
    runs = {}
    dbf = ["--head", "6", "--tail", "2", "--length", "100", "--time-features", "log", "--reward", "bsld"]
    kernel = ["--actor", "kernel", "--expected-start", "--warm-start", "f1-reserving"]
    for label, extra in (
        ("rlbf", ["--length", "150", "--window", "32", "--time-features", "log", "--reward", "trace"]),
        ("dbf", dbf),
        ("dbf-kernel", [*dbf, *kernel]),
    ):
        out = tmp_path_factory.mktemp(label)
        run = _train(out, label.split("-")[0], "--epochs", "1", *extra)
        assert run.returncode == 0, run.stderr[-2000:]
        runs[label] = out
    return runs


def test_training_writes_its_files_and_a_model_the_plugin_runs(trained: dict[str, Path]) -> None:
    for label, out in trained.items():
        policy = label.split("-")[0]
        for name in ("checkpoint.zip", "training.jsonl", "learning-curve.png", "model.npz", "record.json"):
            assert (out / name).is_file(), name
        record = json.loads((out / "record.json").read_text())
        assert record["epochs"] == 1 and record["decisions"] == 128 and record["wall_seconds"] > 0
        assert record["settings"]["trace"] == TRACE and record["machine"]["torch"]
        settings = record["settings"]
        assert settings["log_time"] and settings["reward"] == {"rlbf": "trace", "dbf": "bsld"}[policy]
        assert PolicyNetwork.load(out / "model.npz").config["log_time"] is True  # the plugin observes as trained
        assert (
            record["warm_start"]["rule"]
            == settings["warm_start"]
            == ("f1-reserving" if "kernel" in label else "shortest")
        )
        assert record["warm_start"]["agreement"] > 0.8  # the actor does imitate the rule before PPO
        spec = ("fcfs", f"rlbf:{out / 'model.npz'}") if policy == "rlbf" else (f"dbf:{out / 'model.npz'}", "none")
        jobs = load_workload(TRACE, seed=2).slice(0, 300).jobs()
        result = replay(jobs, Cluster(64), PolicySet(*spec), validate=True)
        assert len(result.jobs) == 300


def test_training_resumes_from_its_checkpoint(trained: dict[str, Path]) -> None:
    out = trained["rlbf"]
    run = _train(out, "rlbf", "--epochs", "2", "--resume", "--length", "150", "--window", "32")
    assert run.returncode == 0, run.stderr[-2000:]
    log = [json.loads(line) for line in (out / "training.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in log] == [1, 2] and log[-1]["steps"] == 256
    again = _train(out, "rlbf", "--epochs", "2")
    assert again.returncode == 2 and "holds a training run already" in again.stderr


def test_numpy_network_acts_as_the_torch_policy(trained: dict[str, Path]) -> None:
    """On fresh observations of real decisions: same logits, same deterministic action."""
    import torch
    from sb3_contrib import MaskablePPO

    from cosched.learn.envs import BackfillEnv, JobSelectionEnv

    trace = load_workload(TRACE, seed=9)
    for label, out in trained.items():
        network = PolicyNetwork.load(out / "model.npz")
        agent = MaskablePPO.load(out / "checkpoint.zip", device="cpu")
        scale, log = float(network.config["time_scale"]), bool(network.config["log_time"])
        if label == "rlbf":
            env = BackfillEnv(trace, Cluster(64), length=150, window=32, time_scale=scale, log_time=log)
        else:
            expected_start = bool(network.config["expected_start"])
            env = JobSelectionEnv(
                trace,
                Cluster(64),
                head=6,
                tail=2,
                length=100,
                time_scale=scale,
                log_time=log,
                expected_start=expected_start,
            )
            assert expected_start is (label == "dbf-kernel")
            assert network.config.get("actor", "mlp") == ("kernel" if expected_start else "mlp")
        obs, _ = env.reset(seed=4)
        for _ in range(40):
            mask = env.action_masks()
            with torch.no_grad():
                tensor = torch.as_tensor(obs[None])
                features = agent.policy.extract_features(tensor)
                logits = agent.policy.action_net(agent.policy.mlp_extractor.forward_actor(features)).numpy()[0]
            np.testing.assert_allclose(network.logits(obs), logits, rtol=1e-4, atol=1e-5)
            action, _ = agent.predict(obs, action_masks=mask, deterministic=True)
            assert network.act(obs, mask) == int(action)
            obs, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                obs, _ = env.reset()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--warm-start", "f1-reserving"], "rule 'f1-reserving' reads when jobs would fit: it needs --expected-start"),
        (["--warm-start", "fastest"], "unknown dbf rule 'fastest'; known: first, shortest"),
    ],
)
def test_a_warm_start_rule_the_observation_cannot_serve_is_one_line(
    tmp_path: Path, args: list[str], error: str
) -> None:
    require_module("torch")
    require_module("sb3_contrib")
    run = _train(tmp_path / "o", "dbf", *args)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert error in run.stderr and not (tmp_path / "o").exists()


def test_training_without_the_extra_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "torch"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no torch here')\n")
    run = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "train", "rlbf", TRACE, "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "pip install torch==2.13.0" in run.stderr

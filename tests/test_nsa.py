"""NSA (`nsa`): the learned repair's observation and mask, its environment, the shipped model's
NumPy forward pass against torch, the plugin in a validated replay, and a tiny training run."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from cosched.core.topology import FatTree
from cosched.errors import ConfigError
from cosched.experiments.topology import Window, paper_cluster, paper_jobs, record_windows
from cosched.learn.models import load_model, model_path
from cosched.learn.network import PolicyNetwork
from cosched.learn.nsa import RepairEnv, action_mask, observation
from cosched.policies.nsa import NeuralAnnealing
from cosched.policies.registry import create
from cosched.replay.driver import PolicySet, replay

TREE = FatTree(16, 2, 2)
"""8 leaf switches of 2 nodes, 4 pods of 2 switches."""


def test_observation_and_mask_of_a_small_window() -> None:
    queue = [1, 2, 3, 6, 9]
    obs = observation(TREE, queue, 2, [3, 1], q=8, n_max=4)
    expected = np.zeros((8, 4), dtype=np.float32)
    # (switch + 1) / 8, (pod + 1) / 4, n / n_max, mean of the later sizes / n_max
    expected[0] = [1 / 8, 1 / 4, 0.5, 0.5]  # node 1: switch 0, pod 0
    expected[1] = [2 / 8, 1 / 4, 0.5, 0.5]  # node 2: switch 1, pod 0
    expected[2] = [2 / 8, 1 / 4, 0.5, 0.5]  # node 3
    expected[3] = [4 / 8, 2 / 4, 0.5, 0.5]  # node 6: switch 3, pod 1
    expected[4] = [5 / 8, 3 / 4, 0.5, 0.5]  # node 9: switch 4, pod 2
    np.testing.assert_array_equal(obs, expected)
    assert action_mask(queue, 8).tolist() == [True] * 5 + [False] * 3
    last = observation(TREE, queue, 3, [], q=8, n_max=4)  # nothing left after it
    assert last[:5, 3].tolist() == [0.0] * 5 and last[:5, 2].tolist() == [0.75] * 5
    longer = list(range(12))
    assert action_mask(longer, 8).all()
    assert observation(TREE, longer, 1, [], q=8, n_max=4)[:, 0].tolist() == [(n // 2 + 1) / 8 for n in range(8)]


@pytest.fixture(scope="module")
def windows() -> tuple[FatTree, list[Window]]:
    return record_windows(400, 5)


def test_the_environment_passes_gymnasiums_checks_and_rewards_the_improvement(
    windows: tuple[FatTree, list[Window]],
) -> None:
    from gymnasium.utils.env_checker import check_env

    tree, recorded = windows
    env = RepairEnv(tree, recorded, hop_cost=1000.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no spec" for the render modes it cannot test
        check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    steps, rewards = 0, []
    while True:
        mask = env.action_masks()
        assert mask.any() and obs.shape == (100, 4)
        assert not obs[~mask].any()  # zero rows past |Q|
        obs, reward, done, _, info = env.step(int(np.flatnonzero(mask)[-1]))
        steps, rewards = steps + 1, [*rewards, reward]
        if done:
            break
    assert 1 <= steps <= 2 and all(r == 0 for r in rewards[:-1])
    assert rewards[-1] == pytest.approx(info["improvement"] / (1000.0 * 40))
    env.reset(seed=4)
    with pytest.raises(ValueError, match="not an action"):
        env.step(len(env.action_masks()))


def _one_hot_network(position: int, q: int = 8) -> PolicyNetwork:
    """An FCN that puts (nearly) all its mass on one start position."""
    bias = np.zeros(q, dtype=np.float32)
    bias[position] = 50.0
    config = {"kind": "nsa", "actor": "mlp", "q": q, "n_max": 4, "activation": "tanh"}
    return PolicyNetwork(config, (np.zeros((q, q * 4), dtype=np.float32),), (bias,))


def test_the_repair_samples_the_networks_choice_among_allowed_positions() -> None:
    nsa = NeuralAnnealing(network=_one_hot_network(3), seed=1)
    assert {nsa.choose_start(TREE, list(range(10)), 2, []) for _ in range(20)} == {3}
    short = {nsa.choose_start(TREE, [4, 5, 6], 2, []) for _ in range(200)}  # position 3 is masked
    assert short <= {0, 1, 2} and len(short) == 3


def test_the_shipped_models_numpy_forward_pass_is_torchs() -> None:
    path = model_path("nsa", "paper")
    network, check = PolicyNetwork.load(path), PolicyNetwork.check_batch(path)
    assert network.kind == "nsa" and len(check["obs"]) >= 16
    logits = network.logits(check["obs"])
    np.testing.assert_allclose(logits, check["logits"], rtol=1e-4, atol=1e-4)
    assert np.array_equal(logits, np.stack([network.logits(o) for o in check["obs"]]))  # same bits alone
    assert path.with_suffix(".json").is_file()
    assert path.stat().st_size < 500_000  # the CNN-3's dense layer: larger than the MLPs' 200 KB bound
    torch = require_module("torch")
    # The same weights in torch's own layers: the NumPy convolutions and flattening are torch's.
    from gymnasium import spaces

    from cosched.learn.torch_nets import NsaConvExtractor

    convs = NsaConvExtractor(spaces.Box(0.0, 1.0, shape=check["obs"].shape[1:], dtype=np.float32))
    layers = [m for m in convs.conv if isinstance(m, torch.nn.Conv1d)]
    linears = [torch.nn.Linear(w.shape[1], w.shape[0]) for w in network.weights[len(layers) :]]
    with torch.no_grad():
        for layer, w, b in zip([*layers, *linears], network.weights, network.biases, strict=True):
            layer.weight.copy_(torch.as_tensor(w))
            layer.bias.copy_(torch.as_tensor(b))
        x = convs(torch.as_tensor(check["obs"]))
        for k, layer in enumerate(linears):
            x = layer(x)
            x = torch.tanh(x) if k < len(linears) - 1 else x
    np.testing.assert_allclose(logits, x.numpy(), rtol=1e-4, atol=1e-4)


def test_nsa_replaces_a_replays_windows_validated_and_reproducibly() -> None:
    jobs = paper_jobs(150, 11)
    spec = "nsa:model=paper,iterations=40,seed=3"
    nsa = create("placement", spec)
    assert isinstance(nsa, NeuralAnnealing) and nsa.iterations == 40

    def run() -> list[tuple[int, float, object]]:
        result = replay(jobs, paper_cluster(), PolicySet("fcfs", "easy", placement=spec), validate=True)
        assert len(result.jobs) == len(jobs)
        return sorted((job.id, job.start, job.slots) for job in result.jobs)

    first = run()
    assert first == run()
    placed = replay(jobs, paper_cluster(), PolicySet("fcfs", "easy", placement=nsa), validate=True)
    assert nsa.searched > 0 and nsa.improved > 0 and len(placed.jobs) == len(jobs)
    with pytest.raises(ConfigError, match="unknown option"):
        create("placement", "nsa:model=paper,colour=red")


def test_a_tiny_training_run_writes_a_model_that_loads(tmp_path: Path) -> None:
    require_module("torch")
    require_module("sb3_contrib")
    out = tmp_path / "nsa"
    command = [sys.executable, "-m", "cosched.cli", "train", "nsa", "paper:200", "--out", str(out)]
    run = subprocess.run([*command, "--steps", "128", "--epochs", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads((out / "record.json").read_text())
    assert record["epochs"] == 2 and record["decisions"] == 256 and record["trace"]["windows"] > 0
    network = load_model("nsa", str(out / "model.npz"))
    assert network.config["actor"] == "cnn" and network.config["seed"] == 0
    check = PolicyNetwork.check_batch(out / "model.npz")
    np.testing.assert_allclose(network.logits(check["obs"]), check["logits"], rtol=1e-4, atol=1e-4)
    nsa = NeuralAnnealing(f"model={out / 'model.npz'},iterations=20")
    tree, recorded = record_windows(200, 9)
    window = recorded[0]
    best = nsa.search(tree, window.free, window.sizes, [list(nodes) for nodes in window.initial])
    assert best is None or sorted(len(nodes) for nodes in best) == sorted(window.sizes)
    bad = subprocess.run([*command[:5], "lublin", "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert bad.returncode == 2 and "paper" in bad.stderr

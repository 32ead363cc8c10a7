"""Training the learned policies with PPO (sb3-contrib's MaskablePPO), and exporting them.

`cosched train rlbf|dbf TRACE --out DIR` trains on windows of the trace replayed by the
core (`cosched.learn.envs`). An epoch is one PPO rollout of `steps` decisions and its
update. After every epoch DIR gets `checkpoint.zip` (resumable with `--resume`), a line
of `training.jsonl` and a fresh `learning-curve.png`; at the end, `model.npz` (the actor
in NumPy, with a check batch of torch's outputs, `cosched.learn.network`) and
`record.json` (trace, windows, seeds, epochs, wall time, machine).

`cosched train osdec TRACE --out DIR` trains the learned OSDEC policy on windows of the trace
given start windows (`cosched.replay.deferrable.Windows`, drawn afresh per episode), with
OSDEC's eq. 6 as the reward (`cosched.learn.envs.DeferrableEnv`).

`cosched train nsa paper[:JOBS] --out DIR` trains NSA's repair (`cosched.learn.nsa`) on the
windows a joint placement meets replaying JOBS of the NSA paper's jobs (seeded by --seed).

Torch is imported here only: install the CPU build first (`pip install torch==2.13.0`),
then `pip install 'cosched[train]'`.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import time
import types
import typing
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cosched.errors import ConfigError
from cosched.learn.envs import BackfillEnv, DeferrableEnv, JobSelectionEnv
from cosched.learn.features import OSDEC_FEATURES, dbf_row_features
from cosched.learn.network import PolicyNetwork
from cosched.learn.nsa import RepairEnv
from cosched.learn.ppo_arguments import check_ppo
from cosched.learn.rules import rule
from cosched.model import Cluster
from cosched.traces.trace import Trace

try:
    import torch
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
    from stable_baselines3.common.callbacks import BaseCallback
    from torch import nn

    from cosched.learn.torch_nets import (
        KernelExtractor,
        KernelPolicy,
        NsaConvExtractor,
        WindowKernelExtractor,
        WindowKernelPolicy,
    )
except ImportError as exc:  # pragma: no cover - the CLI turns this into one line
    raise ImportError(
        "training needs torch and sb3-contrib: pip install torch==2.13.0 && pip install 'cosched[train]'"
    ) from exc

CHECKPOINT = "checkpoint.zip"
LOG = "training.jsonl"
CURVE = "learning-curve.png"
MODEL = "model.npz"
RECORD = "record.json"
WARM_START = "warm-start.json"


@dataclass
class TrainSettings:
    """Everything a training run depends on, kept in its record."""

    kind: str
    trace: str
    epochs: int = 100
    steps: int = 4096
    """Decisions per epoch (one PPO rollout)."""
    length: int = 256
    """Jobs per episode window (the papers: 256 for RLBackfilling, 1,000 starts for DBF)."""
    seed: int = 0
    queue: str = "fcfs"
    window: int = 128
    head: int = 10
    tail: int = 0
    cleaning: str = "standard"
    procs: int | None = None
    max_minutes: float | None = None
    """Stop after the epoch that passes this much training time (the record says how many ran)."""
    ppo: dict[str, Any] = field(default_factory=dict)
    """MaskablePPO arguments that override the defaults of `new_agent` (kept in the record)."""
    warm_start: str = "shortest"
    """A rule of `cosched.learn.rules` (`shortest`: the job with the shortest requested time) the
    actor is fitted to imitate before PPO (`warm_start`); `none`: PPO from a random actor, as the
    papers."""
    log_time: bool = False
    """Times as features on a log scale (`features.scaled_time`); False: divided by the scale."""
    reward: str = "paper"
    """What the environment rewards (`cosched.learn.REWARDS`), the paper's by default."""
    expected_start: bool = False
    """DBF: each job's row also holds the time until it would fit (`features.dbf_observation`)."""
    actor: str = "mlp"
    """DBF's actor: `mlp`, the paper's (an MLP over the whole observation), or `kernel`, one
    network scoring each job of the window (`torch_nets.WindowKernelExtractor`). NSA's: `cnn`, the
    paper's CNN-3, or `mlp`, its FCN-1."""
    jobs: int = 3000
    """NSA: the paper's jobs replayed (seeded by `seed`) for the windows it trains on."""
    remove: int = 2
    """NSA: n_D, a move removes 1..n_D jobs."""
    fraction: float = 0.5
    """OSDEC: the share of each episode's jobs made deferrable (`Windows`)."""
    width: tuple[float, float] = (3600.0, 4 * 3600.0)
    """OSDEC: latest start - begin, drawn from U[width] seconds."""
    lead: tuple[float, float] = (0.0, 0.0)
    """OSDEC: begin - submission, drawn from U[lead] seconds."""


Env = BackfillEnv | JobSelectionEnv | RepairEnv | DeferrableEnv


def make_env(settings: TrainSettings, trace: Trace | None, cluster: Cluster | None) -> Env:
    if settings.kind == "nsa":
        from cosched.experiments.topology import HOP_COST, record_windows

        tree, windows = record_windows(settings.jobs, settings.seed)
        return RepairEnv(tree, windows, remove=settings.remove, hop_cost=HOP_COST)
    assert trace is not None and cluster is not None  # rlbf's and dbf's
    if settings.kind == "rlbf":
        return BackfillEnv(
            trace,
            cluster,
            queue=settings.queue,
            length=settings.length,
            window=settings.window,
            log_time=settings.log_time,
            reward=settings.reward,
        )
    if settings.kind == "dbf":
        return JobSelectionEnv(
            trace,
            cluster,
            head=settings.head,
            tail=settings.tail,
            length=settings.length,
            log_time=settings.log_time,
            reward=settings.reward,
            expected_start=settings.expected_start,
        )
    if settings.kind == "osdec":
        return DeferrableEnv(
            trace,
            cluster,
            length=settings.length,
            window=settings.window,
            log_time=settings.log_time,
            fraction=settings.fraction,
            width=(float(settings.width[0]), float(settings.width[1])),
            lead=(float(settings.lead[0]), float(settings.lead[1])),
        )
    raise ConfigError(f"unknown policy to train {settings.kind!r}; known: rlbf, dbf, nsa, osdec")


def new_agent(settings: TrainSettings, env: Env) -> MaskablePPO:
    """PPO close to the papers'. RLBackfilling: its terminal reward undiscounted (gamma 1);
    the paper's lambda 0.97, learning rate 1e-3 and early stop at a KL of 0.01 learned far
    slower here than Monte Carlo returns (lambda 1) at 3e-4 with no KL stop (docs/learned-
    policies.md), so those are the defaults. DBF: gamma 0.99, learning rate 3e-4, clip 0.2,
    minibatches of 128; its 1024-512-256 hidden layers become 128-64, to train on 2 cores
    (or its actor is the kernel one, `settings.actor`)."""
    common: dict[str, Any] = {"n_steps": settings.steps, "seed": settings.seed, "verbose": 0, "device": "cpu"}
    if settings.kind == "nsa":
        return _nsa_agent(settings, env, common)
    if settings.kind == "rlbf":
        arguments: dict[str, Any] = {
            "learning_rate": 3e-4,
            "gamma": 1.0,
            "gae_lambda": 1.0,
            "batch_size": 256,
            "n_epochs": 10,
            "target_kl": None,
            "policy_kwargs": {"window": settings.window},
        }
        return MaskablePPO(KernelPolicy, env, **{**common, **arguments, **settings.ppo})
    if settings.kind == "osdec":
        # A reward at every step (eq. 6 of the jobs started since), so discounted returns with
        # GAE; the kernel actor of RLBackfilling scores each deferrable job of the window.
        arguments = {
            "learning_rate": 3e-4,
            "gamma": 0.99,
            "gae_lambda": 0.95,
            "batch_size": 256,
            "n_epochs": 10,
            "policy_kwargs": {"window": settings.window, "features": OSDEC_FEATURES},
        }
        return MaskablePPO(KernelPolicy, env, **{**common, **arguments, **settings.ppo})
    arguments = {
        "learning_rate": 3e-4,
        "gamma": 0.99,
        "clip_range": 0.2,
        "batch_size": 128,
        "n_epochs": 10,
    }
    if settings.actor == "kernel":
        assert isinstance(env, JobSelectionEnv)  # make_env's for kind dbf
        arguments["policy_kwargs"] = {"size": env.size, "features": dbf_row_features(settings.expected_start)}
        return MaskablePPO(WindowKernelPolicy, env, **{**common, **arguments, **settings.ppo})
    if settings.actor != "mlp":
        raise ConfigError(f"unknown dbf actor {settings.actor!r}; known: mlp, kernel")
    arguments["policy_kwargs"] = {"net_arch": {"pi": [128, 64], "vf": [128, 64]}, "activation_fn": nn.ReLU}
    return MaskablePPO("MlpPolicy", env, **{**common, **arguments, **settings.ppo})


def _nsa_agent(settings: TrainSettings, env: Env, common: dict[str, Any]) -> MaskablePPO:
    """NSA: episodes of one or two decisions with one terminal reward, so Monte Carlo returns
    (gamma and lambda 1); tanh, as the paper's networks. Learning rate 1e-3 and 5 passes of
    256-decision minibatches: at 3e-4 and 10 passes of 128, 12 minutes on 2 cores had the
    repair barely better than SA's random one. `cnn`: CNN-3, its convolutions shared
    by actor and critic, then Linear(352, 256) Tanh each and the action (value) layer; `mlp`:
    FCN-1, 400-64-64-q (a critic of its own shape)."""
    arguments: dict[str, Any] = {
        "learning_rate": 1e-3,
        "gamma": 1.0,
        "gae_lambda": 1.0,
        "batch_size": 256,
        "n_epochs": 5,
        "ent_coef": 0.01,
    }
    if settings.actor == "cnn":
        arguments["policy_kwargs"] = {
            "features_extractor_class": NsaConvExtractor,
            "net_arch": {"pi": [256], "vf": [256]},
            "activation_fn": nn.Tanh,
        }
        return MaskablePPO(MaskableActorCriticPolicy, env, **{**common, **arguments, **settings.ppo})
    if settings.actor != "mlp":
        raise ConfigError(f"unknown nsa actor {settings.actor!r}; known: cnn, mlp")
    arguments["policy_kwargs"] = {"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": nn.Tanh}
    return MaskablePPO("MlpPolicy", env, **{**common, **arguments, **settings.ppo})


class _EpochLog(BaseCallback):  # type: ignore[misc]
    """Progress bar, one log line and one checkpoint per epoch."""

    def __init__(
        self, out: Path, epochs_done: int, total_steps: int, started: float, wall_before: float, budget: float | None
    ) -> None:
        super().__init__()
        self.budget = budget
        self.out_of_time = False
        self.out = out
        self.epoch = epochs_done
        self.started = started
        self.wall_before = wall_before
        self.episodes: list[dict[str, float]] = []
        self.returns: list[float] = []
        self._return = 0.0
        self.bar: Any = None
        self.total_steps = total_steps

    def _on_training_start(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=self.total_steps, initial=self.num_timesteps, unit="step", leave=False)

    def _on_step(self) -> bool:
        if self.out_of_time:
            return False  # the first step of a new rollout: stop before collecting it
        self.bar.update(1)
        self._return += float(self.locals["rewards"][0])
        if self.locals["dones"][0]:
            self.episodes.append(dict(self.locals["infos"][0]))
            self.returns.append(self._return)
            self._return = 0.0
        return True

    def _on_rollout_start(self) -> None:
        self.model.save(self.out / CHECKPOINT)  # after the last update: a consistent place to resume

    def _on_rollout_end(self) -> None:
        self.epoch += 1
        line: dict[str, Any] = {
            "epoch": self.epoch,
            "steps": int(self.num_timesteps),
            "episodes": len(self.episodes),
            "mean_return": float(np.mean(self.returns)) if self.returns else None,
            "wall_s": round(self.wall_before + time.perf_counter() - self.started, 1),
        }
        for key in ("bsld", "baseline_bsld", "mean_wait", "improvement", "random_improvement", "reward", "expired"):
            values = [e[key] for e in self.episodes if key in e]
            if values:
                line[key] = float(np.mean(values))
        with open(self.out / LOG, "a") as handle:
            handle.write(json.dumps(line) + "\n")
        self.episodes, self.returns = [], []
        shown = {k: round(v, 2) for k, v in line.items() if k in ("bsld", "mean_return") and v is not None}
        self.bar.set_postfix(shown)
        plot_curve(self.out)
        self.out_of_time = self.budget is not None and line["wall_s"] >= self.budget

    def _on_training_end(self) -> None:
        self.bar.close()


def read_log(out: Path) -> list[dict[str, Any]]:
    """The epochs logged so far; ConfigError naming file and line for a line that is no epoch's,
    as a resumed run reads the last one's wall time and the curve every one's epoch."""
    path = out / LOG
    if not path.is_file():
        return []
    entries = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            raise ConfigError(f"{path}:{number}: not a JSON line; mend it, or train into another --out") from None
        if not isinstance(entry, dict) or not _fits(entry.get("epoch"), int) or not _fits(entry.get("wall_s"), float):
            raise ConfigError(f"{path}:{number}: not an epoch's line (a whole 'epoch' and a number 'wall_s')")
        entries.append(entry)
    return entries


def read_settings(path: Path) -> TrainSettings:
    """A run's saved settings.json, for --resume; ConfigError naming the file and the first key
    that is missing, unknown or of the wrong type (a resumed run trains with every one of them)."""
    try:
        saved = json.loads(_read_text(path))
    except (ValueError, RecursionError):
        raise ConfigError(f"{path}: not JSON; mend it, or train into another --out") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: expected a JSON object of settings")
    hints = typing.get_type_hints(TrainSettings)
    unknown = sorted(set(saved) - set(hints))
    if unknown:
        raise ConfigError(f"{path}: unknown setting {unknown[0]!r}")
    for key in ("kind", "trace"):
        if key not in saved:
            raise ConfigError(f"{path}: no {key!r}")
    for key, value in saved.items():
        if not _fits(value, hints[key]):
            raise ConfigError(f"{path}: {key!r} is {value!r:.40}, not {_type_name(hints[key])}")
    try:
        saved["ppo"] = check_ppo(saved.get("ppo", {}))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return TrainSettings(**saved)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"nothing to resume: {path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a settings field's type: a bool is no number, numbers are finite,
    whole ones 32-bit unsigned (a seed NumPy takes, and no count that runs for ever)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_fits(value, arm) for arm in args)
    if origin is tuple:
        return isinstance(value, list | tuple) and len(value) == len(args) and all(map(_fits, value, args))
    if origin is dict:
        return isinstance(value, dict)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if isinstance(value, bool) or hint is bool:
        return isinstance(value, bool) and hint is bool
    if hint is int:
        return isinstance(value, int) and 0 <= value < 2**32
    if hint is float:
        return isinstance(value, int | float) and abs(value) < 1e300  # NaN fails too
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def plot_curve(out: Path) -> None:
    """The learning curve: RLBackfilling's episode bsld against EASY's, or DBF's return and wait."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = read_log(out)
    if not log:
        return
    epochs = [line["epoch"] for line in log]

    def series(key: str) -> list[float]:
        return [np.nan if line.get(key) is None else line[key] for line in log]

    fig, ax = plt.subplots(figsize=(7, 4))
    kind = json.loads((out / "settings.json").read_text())["kind"]
    if kind == "nsa":
        ax.plot(epochs, series("improvement"), label="learned repair (training episodes)")
        ax.plot(epochs, series("random_improvement"), label="SA's random repair, same removals", alpha=0.7)
        ax.set_ylabel("mean CH cost improvement of a move")
    elif kind == "osdec":
        ax.plot(epochs, series("reward"), label="eq. 6 reward per episode (training windows)")
        ax.set_ylabel("reward (core-hours)")
    elif kind == "rlbf":
        ax.plot(epochs, series("bsld"), label="RLBF (training episodes)")
        ax.plot(epochs, series("baseline_bsld"), label="base policy + EASY, same windows", alpha=0.7)
        ax.set_ylabel("mean bounded slowdown")
    else:
        ax.plot(epochs, series("mean_return"), label="episode return")
        ax.set_ylabel("return (DBF reward)")
        twin = ax.twinx()
        twin.plot(epochs, series("mean_wait"), color="tab:red", alpha=0.6)
        twin.set_ylabel("mean wait of started jobs (s)", color="tab:red")
    ax.set_xlabel("epoch")
    ax.legend(loc="upper right")
    ax.set_title(out.name)
    fig.tight_layout()
    fig.savefig(out / CURVE, dpi=100)
    plt.close(fig)


def train(
    settings: TrainSettings, trace: Trace | None, cluster: Cluster | None, out: Path, *, resume: bool = False
) -> Path:
    """Train (or go on training) into `out`; returns the exported model's path."""
    torch.set_num_threads(1)  # the networks are tiny: one thread is fastest, and leaves cores to the env
    settings = replace(settings, ppo=check_ppo(settings.ppo))  # MaskablePPO would fail late, or with a TypeError
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / CHECKPOINT
    settings_path = out / "settings.json"
    log = read_log(out)
    wall_before = float(log[-1]["wall_s"]) if log else 0.0
    if checkpoint.exists() and not resume:
        raise ConfigError(f"{out} holds a training run already: pass --resume, or another --out")
    if resume:
        if not checkpoint.exists():
            raise ConfigError(f"nothing to resume in {out} (no {CHECKPOINT})")
        saved = read_settings(settings_path)
        if (saved.kind, saved.trace) != (settings.kind, settings.trace):
            raise ConfigError(f"{out} trained {saved.kind} on {saved.trace}; resume it with the same policy and trace")
        # How long to go on is the new command's; what is trained, the checkpoint's.
        settings = TrainSettings(**{**asdict(saved), "epochs": settings.epochs, "max_minutes": settings.max_minutes})
    settings_path.write_text(json.dumps(asdict(settings), indent=2) + "\n")

    env = make_env(settings, trace, cluster)
    if resume:
        agent = _load_checkpoint(checkpoint, env)
        env.reset(seed=settings.seed + int(agent.num_timesteps))  # fresh windows, still seeded
    else:
        agent = new_agent(settings, env)
        if settings.warm_start != "none":
            agreement = warm_start(agent, env, settings)
            (out / WARM_START).write_text(json.dumps({"rule": settings.warm_start, "agreement": agreement}) + "\n")
        env.reset(seed=settings.seed)
    total = settings.epochs * settings.steps
    remaining = total - int(agent.num_timesteps)
    started = time.perf_counter()
    if remaining > 0:
        budget = settings.max_minutes * 60 if settings.max_minutes else None
        callback = _EpochLog(out, len(log), total, started, wall_before, budget)
        agent.learn(total_timesteps=remaining, callback=callback, reset_num_timesteps=not resume)
    agent.save(checkpoint)
    wall = wall_before + time.perf_counter() - started
    path = export(agent, env, settings, out / MODEL)
    record = training_record(settings, trace, cluster, agent, out, wall, env)
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    plot_curve(out)
    env.close()
    return path


def _load_checkpoint(checkpoint: Path, env: Env) -> MaskablePPO:
    """The saved agent; ConfigError naming the file when it is damaged or not an agent for `env`."""
    damaged = (ValueError, KeyError, EOFError, OSError, RuntimeError, zipfile.BadZipFile, pickle.UnpicklingError)
    try:
        return MaskablePPO.load(checkpoint, env=env, device="cpu")
    except (*damaged, AssertionError) as exc:  # SB3 asserts that the zip holds its data
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{checkpoint}: not a checkpoint this run can resume: {message}") from None


def warm_start(agent: MaskablePPO, env: Env, settings: TrainSettings, decisions: int = 4096) -> float:
    """Fit the actor to the rule `settings.warm_start` on `decisions` decisions of the rule's own
    episodes (cross-entropy over the allowed actions), so PPO starts from a sensible policy
    instead of a random one: on 2 cores PPO alone did not get there in our training budget
    (docs/learned-policies.md). Returns the fraction of decisions the actor then agrees with."""
    if isinstance(env, RepairEnv):
        raise ConfigError("nsa trains from a random actor, as the paper's (--warm-start none)")
    decide = rule(
        settings.warm_start,
        "rlbf" if settings.kind == "osdec" else settings.kind,  # osdec's rows are laid out as rlbf's
        time_scale=env.time_scale,
        capacity=env.cluster.capacity_units,
        log_time=settings.log_time,
        expected_start=settings.expected_start,
    )
    rng = np.random.default_rng(settings.seed)
    obs, _ = env.reset(seed=settings.seed + 777)
    observations: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    actions: list[int] = []
    while len(actions) < decisions:
        mask = env.action_masks()
        action = decide(obs, mask)
        observations.append(obs)
        masks.append(mask)
        actions.append(action)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
    policy = agent.policy
    x, m = torch.as_tensor(np.asarray(observations)), torch.as_tensor(np.asarray(masks))
    y = torch.as_tensor(np.asarray(actions))
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(400):
        batch = torch.as_tensor(rng.integers(0, len(y), 256))
        logits = _logits(policy, x[batch])
        logits = logits.masked_fill(~m[batch], -1e8)
        loss = nn.functional.cross_entropy(logits, y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        logits = _logits(policy, x)
        agree = float((logits.masked_fill(~m, -1e8).argmax(1) == y).float().mean())
    return agree


def export(agent: MaskablePPO, env: Env, settings: TrainSettings, path: Path) -> Path:
    """The actor as a NumPy model, with a check batch of torch's own logits."""
    policy = agent.policy
    extractor = policy.mlp_extractor
    activation = "relu"
    config: dict[str, Any]
    layers: list[Any]  # Linear and Conv1d layers: each has a weight and a bias
    if isinstance(env, RepairEnv):
        activation = "tanh"
        config = {"kind": "nsa", "actor": settings.actor, "q": env.q, "n_max": env.n_max, "remove": env.remove}
        config.update(jobs=settings.jobs, seed=settings.seed)  # the windows it trained on
        layers = [m for m in extractor.policy_net if isinstance(m, nn.Linear)]
        assert isinstance(policy.action_net, nn.Linear)
        layers.append(policy.action_net)
        if settings.actor == "cnn":
            assert isinstance(policy.features_extractor, NsaConvExtractor)
            convs, config["convs"] = policy.features_extractor.exported()
            layers = [*convs, *layers]
    elif settings.kind in ("rlbf", "osdec"):
        assert isinstance(extractor, KernelExtractor)  # KernelPolicy's
        layers = [m for m in extractor.kernel if isinstance(m, nn.Linear)]
        config = {
            "kind": settings.kind,
            "features": extractor.features,
            "window": settings.window,
            "time_scale": env.time_scale,
        }
    else:
        config = {
            "kind": "dbf",
            "head": settings.head,
            "tail": settings.tail,
            "time_scale": env.time_scale,
            "expected_start": settings.expected_start,
        }
        if settings.actor == "kernel":
            assert isinstance(extractor, WindowKernelExtractor)  # WindowKernelPolicy's
            layers, actor = extractor.exported()
            config.update(actor)
        else:
            layers = [m for m in extractor.policy_net if isinstance(m, nn.Linear)]
            assert isinstance(policy.action_net, nn.Linear)  # MlpPolicy's, for a Discrete action space
            layers.append(policy.action_net)
    config.update(
        activation=activation, trace=Path(settings.trace).name, queue=settings.queue, log_time=settings.log_time
    )
    network = PolicyNetwork(
        config,
        tuple(layer.weight.detach().cpu().numpy() for layer in layers),
        tuple(layer.bias.detach().cpu().numpy() for layer in layers),
    )
    obs, masks = _sample_observations(env, settings.seed, 32)
    with torch.no_grad():
        tensor = torch.as_tensor(obs)
        logits = _logits(policy, tensor).numpy()
    return network.save(path, check={"obs": obs, "mask": masks, "logits": logits.astype(np.float32)})


def _logits(policy: MaskableActorCriticPolicy, obs: torch.Tensor) -> torch.Tensor:
    """The actor's logits for a batch of observations, before masking."""
    features = policy.extract_features(obs)
    assert isinstance(features, torch.Tensor)  # a pair only if actor and critic had their own extractors
    return policy.action_net(policy.mlp_extractor.forward_actor(features))


def _sample_observations(env: Env, seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Observations of real decisions (random allowed actions), for the export's check batch."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed + 12345)
    observations: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    while len(observations) < count:
        mask = env.action_masks()
        observations.append(obs)
        masks.append(mask)
        obs, _, terminated, truncated, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
        if terminated or truncated:
            obs, _ = env.reset()
    return np.asarray(observations, dtype=np.float32), np.asarray(masks, dtype=bool)


def training_record(
    settings: TrainSettings,
    trace: Trace | None,
    cluster: Cluster | None,
    agent: MaskablePPO,
    out: Path,
    wall: float,
    env: Env | None = None,
) -> dict[str, Any]:
    """How a model was made: enough to train it again and to judge what it has seen."""
    import sb3_contrib

    log = read_log(out)
    if isinstance(env, RepairEnv):
        tree = env.tree
        seen: dict[str, Any] = {
            "name": "the NSA paper's workload (cosched.experiments.topology.record_windows)",
            "jobs": settings.jobs,
            "seed": settings.seed,
            "windows": len(env.windows),
            "cluster": f"{tree.nodes} nodes, {tree.per_switch} per leaf switch, {tree.switches} switches per pod",
        }
    else:
        assert trace is not None and cluster is not None
        seen = {"name": trace.name, "jobs": len(trace), "cluster": f"{cluster.nodes} x {cluster.cores_per_node}"}
    return {
        "settings": asdict(settings),
        "trace": seen,
        "epochs": len(log),
        "decisions": int(agent.num_timesteps),
        "episodes": sum(line.get("episodes", 0) for line in log),
        "wall_seconds": round(wall, 1),
        "last_epoch": log[-1] if log else None,
        "warm_start": json.loads((out / WARM_START).read_text()) if (out / WARM_START).is_file() else None,
        "machine": {
            "node": platform.node(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "sb3_contrib": sb3_contrib.__version__,
        },
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

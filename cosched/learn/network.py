"""A trained policy network as a small NumPy file, run without torch.

Training (`cosched.learn.train`) exports the actor of a PPO agent to an `.npz`:
its layers' weights (`w0`, `b0`, `w1`, ...), a JSON `config` (the kind of policy,
its window and normalisation, how it was trained) and a check batch (`check_obs`,
`check_mask`, `check_logits`: what torch computed on some observations), so the
NumPy forward pass can be held to torch's without torch. Inference is a few small
matrix products; the daemon never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosched.errors import ConfigError
from cosched.learn.features import CLUSTER_QUANTILES

FORMAT = 1
KINDS = ("rlbf", "dbf", "nsa", "osdec")
NEGLIGIBLE = -1e9
"""The attention key of an empty slot of DBF's window: finite, so that a window without jobs
averages instead of giving NaN."""


@dataclass(frozen=True)
class PolicyNetwork:
    """An MLP actor. For `rlbf` it scores each job row with the same small network (the
    paper's kernel network), and so for `osdec`; for `dbf` it maps the whole observation to one logit per action;
    for `nsa`, the (q, 4) observation to a logit per start position, through convolutions
    first where its config's `actor` is `cnn` (`convs`: kernel and stride of each)."""

    config: dict[str, Any]
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    @property
    def kind(self) -> str:
        return str(self.config["kind"])

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """Unmasked logits for one observation (or a batch, leading axis), the same bits on
        any machine at any load (`tests/test_learned.py`)."""
        x = np.asarray(obs, dtype=np.float32)
        if self.config.get("actor") == "kernel":
            return self._window_kernel(x)
        if self.config.get("actor") == "cnn":
            return self._cnn(x)
        if self.kind in ("rlbf", "osdec"):  # the kernel network: one score per job row
            x = x.reshape(*x.shape[:-1], -1, int(self.config["features"]))
            return self._mlp(x, 0, len(self.weights))[..., 0]
        if self.kind == "nsa":  # FCN-1 over the flattened (q, 4) observation
            x = x.reshape(*x.shape[:-2], -1)
        return self._mlp(x, 0, len(self.weights))

    def _mlp(self, x: np.ndarray, first: int, end: int) -> np.ndarray:
        """Layers `first` to `end` (exclusive), with the activation between them."""
        for k in range(first, end):
            # einsum's own loops, not BLAS: a multi-threaded BLAS sums in an order that depends on
            # the machine's load, and one flipped near-tie changes a whole replay's schedule.
            x = np.einsum("...i,oi->...o", x, self.weights[k]) + self.biases[k]
            if k < end - 1:
                x = np.maximum(x, 0.0) if self.config.get("activation", "relu") == "relu" else np.tanh(x)
        return x

    def _cnn(self, x: np.ndarray) -> np.ndarray:
        """NSA's CNN-3 (`cosched.learn.torch_nets.NsaConvExtractor`): the (q, 4) observation's
        columns as channels along Q through the convolutions (tanh after each), flattened
        channel by channel as torch does, then the MLP layers."""
        convs = [(int(kernel), int(stride)) for kernel, stride in self.config["convs"]]
        for k, (kernel, stride) in enumerate(convs):
            windows = np.lib.stride_tricks.sliding_window_view(x, kernel, axis=-2)[..., ::stride, :, :]
            x = np.tanh(np.einsum("...lck,ock->...lo", windows, self.weights[k]) + self.biases[k])
        x = np.swapaxes(x, -1, -2).reshape(*x.shape[:-2], -1)
        return self._mlp(x, len(convs), len(self.weights))

    def _window_kernel(self, x: np.ndarray) -> np.ndarray:
        """DBF's kernel actor (`cosched.learn.torch_nets.WindowKernelExtractor`): keys and
        values of the window's jobs, their attention average with the cluster as context,
        then each job's score and forward's."""
        keys, rows, forward = (int(n) for n in self.config["layers"])
        cluster = x[..., :CLUSTER_QUANTILES]
        jobs = x[..., CLUSTER_QUANTILES:].reshape(*x.shape[:-1], -1, int(self.config["features"]))
        keyed = self._mlp(jobs, 0, keys)
        key = np.where(jobs[..., 3] > 0, keyed[..., 0], np.float32(NEGLIGIBLE))
        weight = np.exp(key - key.max(axis=-1, keepdims=True))
        weight = weight / np.einsum("...m->...", weight)[..., None]
        context = np.concatenate((np.einsum("...m,...mv->...v", weight, keyed[..., 1:]), cluster), axis=-1)
        each = np.concatenate((jobs, np.broadcast_to(context[..., None, :], (*jobs.shape[:-1], context.shape[-1]))), -1)
        scores = self._mlp(each, keys, keys + rows)[..., 0]
        return np.concatenate((scores, self._mlp(context, keys + rows, keys + rows + forward)), axis=-1)

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The most likely allowed action (deterministic, as the paper tests its agent)."""
        scores = np.where(mask, self.logits(obs), -np.inf)
        return int(np.argmax(scores))

    def save(self, path: str | Path, *, check: dict[str, np.ndarray] | None = None) -> Path:
        path = Path(path)
        arrays: dict[str, np.ndarray] = {"config": np.array(json.dumps({**self.config, "format": FORMAT}))}
        for k, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            arrays[f"w{k}"], arrays[f"b{k}"] = w.astype(np.float32), b.astype(np.float32)
        for key, value in (check or {}).items():
            arrays[f"check_{key}"] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            # allow_pickle named (its default), else mypy matches **arrays to it; no key is "allow_pickle"
            np.savez_compressed(handle, allow_pickle=True, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> PolicyNetwork:
        """Read a model file; ConfigError (one line) for anything that is not one."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                config = json.loads(str(data["config"]))
                count = sum(1 for key in data.files if key.startswith("w"))
                weights = tuple(data[f"w{k}"] for k in range(count))
                biases = tuple(data[f"b{k}"] for k in range(count))
        except FileNotFoundError:
            raise ConfigError(f"model file {path} does not exist") from None
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"{path} is not a cosched model file: {exc}") from None
        if config.get("kind") not in KINDS or not count:
            raise ConfigError(f"{path} is not a cosched model file (kind {config.get('kind')!r})")
        return cls(config, weights, biases)

    @staticmethod
    def check_batch(path: str | Path) -> dict[str, np.ndarray]:
        """The observations, masks and torch logits stored with a model at export."""
        with np.load(path, allow_pickle=False) as data:
            return {key[6:]: data[key] for key in data.files if key.startswith("check_")}

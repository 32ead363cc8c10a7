"""A trained policy network as a small NumPy file, run without torch.

Training (`cosched.learn.train`) exports the actor of a PPO agent to an `.npz`:
its layers' weights (`w0`, `b0`, `w1`, ...), a JSON `config` (the kind of policy,
its window and normalisation, how it was trained) and a check batch (`check_obs`,
`check_mask`, `check_logits`: what torch computed on some observations), so the
NumPy forward pass can be held to torch's without torch. Inference is a few small
matrix products; the daemon never imports torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosched.errors import ConfigError
from cosched.learn.features import CLUSTER_QUANTILES, OSDEC_FEATURES, RLBF_FEATURES, dbf_row_features

FORMAT = 1
KINDS = ("rlbf", "dbf", "nsa", "osdec")
MAX_WINDOW = 100_000
"""The most job rows (or NSA positions) a model's window may hold: trained ones hold up to 128, and
checking a larger one at load would allocate its observation."""
ACTORS = {"rlbf": (), "osdec": (), "dbf": ("mlp", "kernel"), "nsa": ("mlp", "cnn")}
"""The `actor` a model's config may name, by kind (none: the kind's only network)."""
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
    digest: str = field(default="", compare=False)
    """The first 12 hex digits of its file's SHA-256 ('' for one not read from a file): what a
    daemon records, so that a restart under another model says so."""

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
            raw = path.read_bytes()  # once: parsed and digested, the same bytes
        except FileNotFoundError:
            raise ConfigError(f"model file {path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"{path} is not a cosched model file: {exc}") from None
        if raw[:4] != b"PK\x03\x04":  # numpy's own word for other bytes is about loading pickles unsafely
            raise ConfigError(f"{path} is not a cosched model file: not an .npz (zip) archive")
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as data:
                config = json.loads(str(data["config"]))
                count = sum(1 for key in data.files if key.startswith("w"))
                weights = tuple(data[f"w{k}"] for k in range(count))
                biases = tuple(data[f"b{k}"] for k in range(count))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ConfigError(f"{path} is not a cosched model file: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{path} is not a cosched model file: its config is nested too deeply") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{path} is not a cosched model file: its config is a JSON {type(config).__name__}")
        if config.get("kind") not in KINDS or not count:
            raise ConfigError(f"{path} is not a cosched model file (kind {config.get('kind')!r})")
        network = cls(config, weights, biases, hashlib.sha256(raw).hexdigest()[:12])
        try:
            network.check()
        except ConfigError as exc:
            raise ConfigError(f"{path}: bad model: {exc}") from None
        return network

    def check(self) -> None:
        """ConfigError unless the policies can run this network: the settings they read, of the
        right types, and layers that chain from the observation they build to one logit per
        action. Run at load, so a bad file fails before a replay, not at its first decision."""
        _check_settings(self.config)
        _check_layers(self.weights, self.biases)
        scores = _score_layers(self.config, len(self.weights))
        shape, actions = _observation_shape(self.config)
        try:
            logits = self.logits(np.zeros(shape, dtype=np.float32))
        except (ValueError, IndexError) as exc:
            message = str(exc).strip()
            raise ConfigError(f"its layers do not chain from an observation of shape {shape}: {message}") from None
        if logits.shape != (actions,):
            raise ConfigError(f"it gives {logits.shape[-1]} logits, its policy has {actions} actions")
        for k in scores:
            if self.weights[k].shape[0] != 1:
                raise ConfigError(f"layer w{k} gives {self.weights[k].shape[0]} outputs, not the 1 score of a job")

    @staticmethod
    def check_batch(path: str | Path) -> dict[str, np.ndarray]:
        """The observations, masks and torch logits stored with a model at export."""
        with np.load(path, allow_pickle=False) as data:
            return {key[6:]: data[key] for key in data.files if key.startswith("check_")}


def _check_settings(config: dict[str, Any]) -> None:
    """The config keys a policy reads for the model's kind, each of the type and range it needs."""
    kind = config["kind"]
    if kind in ("rlbf", "osdec"):
        _whole(config, "window", 2)
        _time_scale(config)
    elif kind == "dbf":
        if _whole(config, "head", 0) + _whole(config, "tail", 0) < 1:
            raise ConfigError("'head' + 'tail' must be at least 1")
        _time_scale(config)
    else:
        _whole(config, "q", 1)
        _whole(config, "n_max", 1, 10**7)
    actor = config.get("actor")
    if actor is not None and actor not in ACTORS[kind]:
        raise ConfigError(f"'actor' {actor!r} is not one of a {kind} model's: {', '.join(ACTORS[kind]) or 'none'}")
    if config.get("activation", "relu") not in ("relu", "tanh"):
        raise ConfigError(f"'activation' must be relu or tanh, got {config['activation']!r}")
    for key in ("log_time", "expected_start"):
        if not isinstance(config.get(key, False), bool):
            raise ConfigError(f"{key!r} must be true or false, got {config[key]!r}")
    if kind in ("rlbf", "osdec") or actor == "kernel":
        _whole(config, "features", 1)
    if actor == "kernel":
        layers = config.get("layers")
        if not isinstance(layers, list) or len(layers) != 3 or not all(_is_whole(n) and n >= 1 for n in layers):
            raise ConfigError(f"'layers' must be 3 whole numbers >= 1 (keys, rows, forward), got {layers!r}")
    if actor == "cnn":
        convs = config.get("convs")
        if not isinstance(convs, list) or not convs or not all(_is_pair(c) for c in convs):
            raise ConfigError(f"'convs' must be a list of [kernel, stride] whole numbers >= 1, got {convs!r}")


def _whole(config: dict[str, Any], key: str, low: int, high: int = MAX_WINDOW) -> int:
    if key not in config:
        raise ConfigError(f"its config has no {key!r}")
    value: Any = config[key]
    if not _is_whole(value) or not low <= value <= high:
        raise ConfigError(f"{key!r} must be a whole number in [{low}, {high}], got {value!r}")
    return int(value)


def _time_scale(config: dict[str, Any]) -> None:
    if "time_scale" not in config:
        raise ConfigError("its config has no 'time_scale'")
    value = config["time_scale"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"'time_scale' must be a finite number of seconds > 0, got {value!r}")


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_is_whole(n) and 1 <= n <= MAX_WINDOW for n in value)


def _check_layers(weights: tuple[np.ndarray, ...], biases: tuple[np.ndarray, ...]) -> None:
    """Numbers, all finite, and a bias per output of each layer (convolutions' weights are 3-D)."""
    for k, (w, b) in enumerate(zip(weights, biases, strict=True)):
        if w.dtype.kind not in "fiu" or b.dtype.kind not in "fiu":
            raise ConfigError(f"layer {k} holds {w.dtype} and {b.dtype}, not numbers")
        if w.ndim not in (2, 3) or b.shape != (w.shape[0],):
            raise ConfigError(f"layer {k}'s weight {w.shape} and bias {b.shape} do not make a layer")
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise ConfigError(f"layer {k} holds a value that is not a finite number")


def _observation_shape(config: dict[str, Any]) -> tuple[tuple[int, ...], int]:
    """The observation the model's policy builds (`cosched.learn.features`), and its action count."""
    kind = config["kind"]
    if kind in ("rlbf", "osdec"):
        features = RLBF_FEATURES if kind == "rlbf" else OSDEC_FEATURES
        if config["features"] != features:
            raise ConfigError(f"a {kind} observation has {features} features per job, the model {config['features']}")
        return (config["window"] * features,), config["window"]
    if kind == "dbf":
        size, row = config["head"] + config["tail"], dbf_row_features(config.get("expected_start", False))
        if config.get("actor") == "kernel" and config["features"] != row:
            raise ConfigError(f"a dbf observation has {row} features per job, the model {config['features']}")
        return (CLUSTER_QUANTILES + size * row,), size + 1
    from cosched.learn.nsa import FEATURES  # lazy: that module brings Gymnasium when installed

    return (config["q"], FEATURES), config["q"]


def _score_layers(config: dict[str, Any], count: int) -> list[int]:
    """The layers that give one score per job (a larger output would be cut to its first value)."""
    if config["kind"] in ("rlbf", "osdec"):
        return [count - 1]
    if config.get("actor") == "kernel":
        keys, rows, forward = config["layers"]
        if keys + rows + forward != count:
            raise ConfigError(
                f"'layers' {config['layers']} adds up to {keys + rows + forward} layers, the file has {count}"
            )
        return [keys + rows - 1, count - 1]
    return []

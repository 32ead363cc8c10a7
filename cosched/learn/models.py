"""Finding a trained model by name: a shipped one (`hpc2n`) or a file (`/srv/m.npz`).

Shipped models live beside this module in `models/`, one `NAME-KIND.npz` each with
its training record `NAME-KIND.json` (trace, windows, seeds, epochs, wall time,
machine). A policy spec names them after a colon: `rlbf:hpc2n`, `dbf:lublin-1-split`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from cosched.errors import ConfigError
from cosched.learn.network import PolicyNetwork

SHIPPED = Path(__file__).parent / "models"
DEFAULT_MODEL = {"rlbf": "sdsc-sp2", "dbf": "lublin-1-m32-split-bsld", "osdec": "lublin"}
"""The model a bare `rlbf`, `dbf` or `osdec` runs."""


def shipped(kind: str) -> list[str]:
    """Names of the models shipped for a kind of policy, sorted."""
    suffix = f"-{kind}.npz"
    return sorted(p.name[: -len(suffix)] for p in SHIPPED.glob(f"*{suffix}"))


def model_path(kind: str, name: str | None) -> Path:
    """The file a model name stands for; ConfigError naming the shipped ones if none."""
    name = name or DEFAULT_MODEL[kind]
    path = SHIPPED / f"{name}-{kind}.npz"
    if path.is_file():
        return path
    given = Path(name).expanduser()
    if given.is_file():
        return given
    known = ", ".join(shipped(kind)) or "none"
    raise ConfigError(f"unknown {kind} model {name!r}: not a shipped model ({known}) and no such file")


def load_model(kind: str, name: str | None) -> PolicyNetwork:
    """A model by name, read once per file version; it must be of `kind`."""
    path = model_path(kind, name).resolve()
    network = _load(path, path.stat().st_mtime_ns)
    if network.kind != kind:
        raise ConfigError(f"{path} is a {network.kind} model, not a {kind} one")
    return network


@cache
def _load(path: Path, mtime_ns: int) -> PolicyNetwork:
    return PolicyNetwork.load(path)

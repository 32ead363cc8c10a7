"""Finding plugins by name: entry-point aliases, `alias:ARGUMENT`, or `module:Class` strings.

Each kind of plugin is an entry-point group (`cosched.queue`, `cosched.backfill`,
`cosched.estimate`, `cosched.placement`, `cosched.cosched`), so a package can add policies without
touching cosched, and a research script can name its class directly. A registered alias may take
one argument after a colon, passed to the class (a learned policy's model: `rlbf:hpc2n`,
`dbf:/srv/models/m.npz`); a name whose part before the colon is no alias is `module:Class`.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points
from typing import Any, TypeVar

from cosched.errors import ConfigError
from cosched.policies.base import BackfillPolicy, CoschedulePolicy, Estimator, PlacementPolicy, QueuePolicy

KINDS: dict[str, type] = {
    "queue": QueuePolicy,
    "backfill": BackfillPolicy,
    "estimate": Estimator,
    "placement": PlacementPolicy,
    "cosched": CoschedulePolicy,
}

T = TypeVar("T")


@cache
def _aliases(kind: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=f"cosched.{kind}")}


def available(kind: str) -> list[str]:
    """The aliases registered for a kind of plugin, sorted."""
    return sorted(_aliases(kind))


def split_argument(kind: str, name: str) -> tuple[str, str | None]:
    """`alias:ARGUMENT` as (alias, ARGUMENT) when the part before the colon is a registered
    alias of `kind`; anything else (an alias, `module:Class`) as (name, None)."""
    alias, colon, argument = name.partition(":")
    if colon and alias in _aliases(kind):
        return alias, argument
    return name, None


def resolve(kind: str, name: str) -> type:
    """The class behind an alias (with or without an argument) or a `module:Class` string."""
    if kind not in KINDS:
        raise ConfigError(f"unknown plugin kind {kind!r}; known: {', '.join(KINDS)}")
    base = KINDS[kind]
    name = split_argument(kind, name)[0]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load {kind} policy {name!r}: {exc}") from None
    else:
        aliases = _aliases(kind)
        if name not in aliases:
            known = ", ".join(sorted(aliases)) or "none (is cosched installed?)"
            raise ConfigError(f"unknown {kind} policy {name!r}; known: {known}")
        cls = aliases[name].load()
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{kind} policy {name!r} is not a subclass of {base.__name__}")
    return cls


def create(kind: str, spec: str | Any, **options: Any) -> Any:
    """An instance from an alias, `alias:ARGUMENT`, a `module:Class` string, or an instance (passed through)."""
    if not isinstance(spec, str):
        if not isinstance(spec, KINDS[kind]):
            raise ConfigError(f"{spec!r} is not a {KINDS[kind].__name__}")
        return spec
    cls = resolve(kind, spec)
    argument = split_argument(kind, spec)[1]
    if argument is not None and not argument.strip():  # `rlbf:` ran the default model unannounced
        raise ConfigError(f"{kind} policy {spec!r}: nothing after the ':' (name a model or options, or drop the ':')")
    try:
        return cls(**options) if argument is None else cls(argument, **options)
    except TypeError as exc:
        if argument is not None:
            raise ConfigError(f"{kind} policy {spec.partition(':')[0]!r} takes no argument ({spec!r})") from None
        raise ConfigError(f"bad options for {kind} policy {spec!r}: {exc}") from None

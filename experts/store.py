"""Expert sets as JSON documents people can read, diff and review like any other config.

Format (version 1)::

    {
      "format": "cosched-experts",
      "version": 1,
      "m": 10,
      "lent_fractions": [0.0, 0.1, ..., 0.9],        # informational, must match m
      "experts": [
        {"name": "cpu", "description": "...",
         "tree": {"feature": "cpu", "threshold": 0.75,
                  "below": {"dist": [0.6, 0.3, ...]},  # taken when cpu <= 0.75
                  "above": {...}}}
      ]
    }

A node is either a leaf {"dist": [...]} or a split {"feature", "threshold", "below", "above"}.
Every check happens here, at load time; each failure is a one-line ConfigError naming the file,
the expert and the node path (e.g. "root.above.below"), so a bad edit is found before a daemon
starts, never in the middle of a scheduling decision.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosched.errors import ConfigError
from cosched.numbers import is_finite_number
from experts.tree import Expert, ExpertSet, Leaf, Node, Split, lent_fractions

FORMAT = "cosched-experts"
VERSION = 1
MAX_DEPTH = 32
"""Deeper trees are refused: no sensible expert needs them, and it bounds recursion on hostile files."""

_SPLIT_KEYS = {"feature", "threshold", "below", "above"}


def dumps(expert_set: ExpertSet) -> str:
    """The JSON text `save_expert_set` writes: indented, with each distribution on one line."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "m": expert_set.m,
        "lent_fractions": [float(f) for f in lent_fractions(expert_set.m)],
        "experts": [{"name": e.name, "description": e.description, "tree": _node_doc(e.root)} for e in expert_set],
    }
    return _pretty(doc, 0) + "\n"


def save_expert_set(expert_set: ExpertSet, path: str | Path) -> None:
    """Write `dumps(expert_set)` to path (UTF-8)."""
    Path(path).write_text(dumps(expert_set), encoding="utf-8")


def load_expert_set(path: str | Path) -> ExpertSet:
    """Read, check and build an ExpertSet; every problem is a ConfigError starting with the path."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read expert file: {exc}") from exc
    return loads(text, source=str(path))


def loads(text: str, source: str = "<string>") -> ExpertSet:
    """Parse and validate a JSON document; `source` names it in error messages."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    except RecursionError:  # a hostile file of nested brackets, deeper than Python's parser goes
        raise ConfigError(f"{source}: JSON nested too deeply to be an expert set") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a JSON object at the top level")
    if doc.get("format") != FORMAT:
        raise ConfigError(f"{source}: 'format' must be {FORMAT!r}, got {doc.get('format')!r}")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(f"{source}: 'version' must be a positive integer, got {version!r}")
    if version > VERSION:
        raise ConfigError(f"{source}: format version {version} is newer than this cosched supports ({VERSION})")
    m = doc.get("m")
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ConfigError(f"{source}: 'm' (number of actions) must be a positive integer, got {m!r}")
    fractions = doc.get("lent_fractions")
    if fractions is not None and (
        not isinstance(fractions, list)
        or len(fractions) != m
        or any(not is_finite_number(f) or abs(f - k / m) > 1e-9 for k, f in enumerate(fractions))
    ):
        raise ConfigError(f"{source}: 'lent_fractions' must be [0, 1/m, ..., (m-1)/m] for m={m}")
    raw_experts = doc.get("experts")
    if not isinstance(raw_experts, list) or not raw_experts:
        raise ConfigError(f"{source}: 'experts' must be a non-empty list")
    experts = [_load_expert(raw, k, m, source) for k, raw in enumerate(raw_experts)]
    try:
        return ExpertSet(tuple(experts))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _load_expert(raw: Any, k: int, m: int, source: str) -> Expert:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: experts[{k}] must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: experts[{k}] needs a non-empty string 'name'")
    where = f"{source}: expert {name!r}"
    unknown = set(raw) - {"name", "description", "tree"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}: 'description' must be a string")
    if "tree" not in raw:
        raise ConfigError(f"{where}: missing 'tree'")
    sizes: list[tuple[str, int]] = []  # (node path, leaf length), to tell a stray leaf from another grid
    root = _load_node(raw["tree"], sizes, "root", 0, where)
    lengths = {n for _, n in sizes}
    if lengths != {m}:
        if len(lengths) == 1:
            raise ConfigError(
                f"{where}: has {lengths.pop()} actions but the set has m={m}; all experts must share one action grid"
            )
        path, n = next((p, n) for p, n in sizes if n != m)
        raise ConfigError(f"{where}: node {path}: leaf has {n} probabilities, expected m={m}")
    return Expert(name, root, description)


def _load_node(raw: Any, sizes: list[tuple[str, int]], path: str, depth: int, where: str) -> Node:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: node {path}: tree deeper than {MAX_DEPTH}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: node {path}: malformed node (expected an object, got {type(raw).__name__})")
    if set(raw) == {"dist"}:
        dist = raw["dist"]
        if not isinstance(dist, list) or not all(is_finite_number(p) for p in dist):
            raise ConfigError(f"{where}: node {path}: 'dist' must be a list of numbers")
        sizes.append((path, len(dist)))
        try:
            return Leaf(tuple(dist))
        except ConfigError as exc:
            raise ConfigError(f"{where}: node {path}: {exc}") from exc
    if set(raw) != _SPLIT_KEYS:
        raise ConfigError(
            f"{where}: node {path}: malformed node with keys {sorted(raw)}; expected "
            f"{{'dist'}} or {sorted(_SPLIT_KEYS)}"
        )
    below = _load_node(raw["below"], sizes, path + ".below", depth + 1, where)
    above = _load_node(raw["above"], sizes, path + ".above", depth + 1, where)
    try:
        return Split(raw["feature"], raw["threshold"], below, above)
    except ConfigError as exc:
        raise ConfigError(f"{where}: node {path}: {exc}") from exc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in an expert file (JSON has no such number)")


def _node_doc(node: Node) -> dict[str, Any]:
    if isinstance(node, Leaf):
        return {"dist": list(node.dist)}
    return {
        "feature": node.feature,
        "threshold": node.threshold,
        "below": _node_doc(node.below),
        "above": _node_doc(node.above),
    }


def _pretty(value: Any, indent: int) -> str:
    """json.dumps(indent=2), except that lists of scalars stay on one line (a leaf reads as one row)."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {_pretty(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return "[\n" + ",\n".join(inner + _pretty(v, indent + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value, allow_nan=False)

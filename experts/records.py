"""Decision logs: what the co-scheduler saw, which action it took, and the loss that followed.

One JSON object per line (JSON Lines), appendable by a running daemon and readable by `fit`::

    {"features": {"cpu": 0.2, "mem": 0.4, "parallel": true, "progress": 0.5, "happiness": 1.3},
     "action": 4, "loss": 0.0, "app": "blast"}

"happiness" may be the string "inf" (no tasks left): JSON has no infinity, and Python's
non-standard `Infinity` would break other tools reading the log. "app" is optional.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

from cosched.errors import ConfigError
from experts.features import FEATURE_NAMES, JobFeatures


@dataclass(frozen=True)
class DecisionRecord:
    """One finished lending decision: the state, the action index taken, its loss in [0, 1]."""

    features: JobFeatures
    action: int
    loss: float
    app: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.action, bool) or not isinstance(self.action, int) or self.action < 0:
            raise ConfigError(f"action must be an integer index >= 0, got {self.action!r}")
        if not _is_real(self.loss) or not 0.0 <= self.loss <= 1.0:
            raise ConfigError(f"loss must be a number in [0, 1], got {self.loss!r}")

    def to_json(self) -> dict[str, Any]:
        """The log line's object (see the module docstring)."""
        f = self.features
        doc: dict[str, Any] = {
            "features": {
                "cpu": f.cpu,
                "mem": f.mem,
                "parallel": f.parallel,
                "progress": f.progress,
                "happiness": "inf" if math.isinf(f.happiness) else f.happiness,
            },
            "action": self.action,
            "loss": self.loss,
        }
        if self.app is not None:
            doc["app"] = self.app
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> DecisionRecord:
        """Parse one log object; ConfigError says what is wrong (the reader adds the line number)."""
        if not isinstance(doc, dict):
            raise ConfigError("expected a JSON object")
        unknown = set(doc) - {"features", "action", "loss", "app"}
        if unknown:
            raise ConfigError(f"unknown keys {sorted(unknown)}")
        for key in ("features", "action", "loss"):
            if key not in doc:
                raise ConfigError(f"missing {key!r}")
        raw = doc["features"]
        if not isinstance(raw, dict) or set(raw) != set(FEATURE_NAMES):
            raise ConfigError(f"'features' must have exactly the keys {', '.join(FEATURE_NAMES)}")
        if not isinstance(raw["parallel"], bool):
            raise ConfigError(f"'parallel' must be true or false, got {raw['parallel']!r}")
        hp = math.inf if raw["happiness"] == "inf" else raw["happiness"]
        for name in ("cpu", "mem", "progress"):
            if not _is_real(raw[name]):
                raise ConfigError(f"feature {name!r} must be a number, got {raw[name]!r}")
        if isinstance(hp, bool) or not isinstance(hp, Real):
            raise ConfigError(f"feature 'happiness' must be a number or \"inf\", got {raw['happiness']!r}")
        features = JobFeatures(
            cpu=float(raw["cpu"]),
            mem=float(raw["mem"]),
            parallel=raw["parallel"],
            progress=float(raw["progress"]),
            happiness=float(hp),
        )
        app = doc.get("app")
        if app is not None and not isinstance(app, str):
            raise ConfigError(f"'app' must be a string, got {app!r}")
        return cls(features, doc["action"], doc["loss"], app)


def write_log(path: str | Path, records: Iterable[DecisionRecord], append: bool = False) -> None:
    """Write (or append) records, one compact JSON object per line."""
    with Path(path).open("a" if append else "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_json(), allow_nan=False) + "\n")


def read_log(path: str | Path) -> list[DecisionRecord]:
    """Every record of a JSON Lines log; blank lines are skipped. ConfigError names path and line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read decision log: {exc}") from exc
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(DecisionRecord.from_json(json.loads(line, parse_constant=_reject_constant)))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not valid JSON: {exc.msg} at column {exc.colno}") from exc
        except (ConfigError, ValueError) as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from exc
    return records


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _reject_constant(name: str) -> Any:
    raise ValueError(f'{name} is not a JSON number (write happiness as "inf")')

"""Decision logs: what the co-scheduler saw, which action it took, and the loss that followed.

One JSON object per line (JSON Lines), appendable by a running daemon and readable by `fit`::

    {"features": {"cpu": 0.2, "mem": 0.4, "parallel": true, "progress": 0.5, "happiness": 1.3},
     "action": 4, "loss": 0.0, "app": "blast"}

"happiness" may be the string "inf" (no tasks left): JSON has no infinity, and Python's
non-standard `Infinity` would break other tools reading the log. "app" is optional.

A running daemon's own record is its state file: `read_log` reads the scored lending decisions
from it directly (read-only), so a site fits experts on what its live scheduler saw.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cosched.errors import ConfigError
from cosched.numbers import is_finite_number
from experts.features import FEATURE_NAMES, JobFeatures

SQLITE_MAGIC = b"SQLite format 3\x00"
MAX_FEATURE = 1e6
"""The largest cpu, mem or progress a record may hold: each is a ratio near 1, so a larger one is a corrupt
record; scikit-learn fits in float32, which fails on values beyond 3.4e38 with no line to blame."""


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
        if not is_finite_number(self.loss) or not 0.0 <= self.loss <= 1.0:
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
            if not is_finite_number(raw[name]) or abs(raw[name]) > MAX_FEATURE:
                raise ConfigError(
                    f"feature {name!r} must be a number of at most {MAX_FEATURE:g}, got {_short(raw[name])}"
                )
        if hp != math.inf and not is_finite_number(hp):
            raise ConfigError(f"feature 'happiness' must be a number or \"inf\", got {_short(raw['happiness'])}")
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


def from_decision(body: Mapping[str, Any]) -> DecisionRecord | None:
    """A lending decision (`LendingDecision.as_dict`, as a daemon stores it) as a record to learn
    from; None when nothing was lent or its loss is not known yet."""
    if not isinstance(body, Mapping):
        raise ConfigError(f"expected a JSON object, got {type(body).__name__}")
    if not body.get("executed", True) or body.get("loss") is None:
        return None
    doc = {"features": body["features"], "action": body["action"], "loss": body["loss"], "app": body.get("app_class")}
    return DecisionRecord.from_json(doc)


def read_state(path: str | Path) -> list[DecisionRecord]:
    """The scored lending decisions of a daemon's state file, oldest first. The file is opened
    read-only, so this may run beside the daemon (as root: the file is 0600)."""
    uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True, timeout=30)) as db:
            rows = db.execute("SELECT seq, body FROM decisions ORDER BY seq").fetchall()
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: cannot read the lending decisions of this state file: {exc}") from None
    records = []
    for seq, body in rows:
        try:
            record = from_decision(json.loads(body))
        except (ConfigError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: decision {seq}: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{path}: decision {seq}: JSON nested too deeply") from None
        if record is not None:
            records.append(record)
    return records


def read_log(path: str | Path) -> list[DecisionRecord]:
    """Every record of a JSON Lines log (blank lines skipped), or of a daemon's state file
    (`read_state`). ConfigError names path and line."""
    try:
        with Path(path).open("rb") as head:
            if head.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
                return read_state(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read decision log: {exc}") from exc
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
        except RecursionError:  # nested brackets deeper than Python's parser goes: no record has them
            raise ConfigError(f"{path}:{number}: JSON nested too deeply to be a decision") from None
    return records


def _short(value: Any) -> str:
    """repr, cut to one readable line: a corrupt record's 400-digit integer is named, not printed whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _reject_constant(name: str) -> Any:
    raise ValueError(f'{name} is not a JSON number (write happiness as "inf")')

"""Where the Mesos masters are: parsing the configured addresses and a leader's redirect `Location`.

Only explicit `host:port` lists are understood; a `zk://` address (ZooKeeper discovery) is refused with a
clear error rather than half-supported. A non-leading master answers 307 with `Location:
//leader:port/api/v1/scheduler`, so the configured list needs to name only one reachable master.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from cosched.errors import ConfigError

DEFAULT_PORT = 5050
SCHEDULER_PATH = "/api/v1/scheduler"


@dataclass(frozen=True)
class Master:
    host: str
    port: int
    scheme: str = "http"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def parse_master(text: str) -> Master:
    """`host`, `host:port` or `http(s)://host:port[/...]` -> Master; anything else is a ConfigError."""
    text = text.strip()
    if text.startswith("zk://"):
        raise ConfigError(f"mesos master {text!r}: ZooKeeper discovery is not supported, list the masters' host:port")
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"mesos master {text!r}: the port is not a number in 1..65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"mesos master {text!r}: expected host:port or http(s)://host:port")
    return Master(parts.hostname, port, parts.scheme)


def parse_masters(addresses: str | Iterable[str]) -> list[Master]:
    """A comma-separated string or a list of addresses, in the order they are tried."""
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    masters = [parse_master(a) for a in items if a.strip()]
    if not masters:
        raise ConfigError("mesos masters: no address given")
    return masters


def follow_location(location: str, current: Master) -> Master:
    """The master a 307 points at (`//host:port/path` keeps the current scheme)."""
    if location.startswith("//"):
        location = f"{current.scheme}:{location}"
    try:
        return parse_master(location)
    except ConfigError:
        raise ConfigError(f"master {current} redirected to an unusable Location {location!r}") from None

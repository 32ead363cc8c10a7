"""Where the Mesos masters are: the configured addresses, ZooKeeper, and a leader's redirect `Location`.

Two ways to name them, as Mesos's own `--master` flag takes them: a `host:port` list, or
`zk://host:port[,host:port...]/path`, the ZooKeeper group the masters elect their leader in (what
a production cluster runs with: its masters come and go, ZooKeeper always says who they are).
A group is read again whenever the master subscribed to fails, so a new leader on another host
is found without a config change. A non-leading master answers 307 with `Location:
//leader:port/api/v1/scheduler`, so either way one reachable master is enough to find the leader.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cosched.errors import ConfigError
from cosched.mesos.errors import MesosError

DEFAULT_PORT = 5050
SCHEDULER_PATH = "/api/v1/scheduler"


@dataclass(frozen=True)
class Master:
    host: str
    port: int
    scheme: str = "http"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


@dataclass(frozen=True)
class ZooKeeperGroup:
    """`zk://[user:password@]hosts/path`: the ZooKeeper servers, the znode the masters contend
    under, and the digest credentials its ACL asks for (as Mesos's own `--zk` takes them). The
    credentials are never printed: `str` and `repr` leave them out."""

    hosts: str
    path: str
    credentials: str = field(default="", repr=False)

    def __str__(self) -> str:
        return f"zk://{self.hosts}{self.path}"


class DiscoveryFailed(MesosError):
    """ZooKeeper could not be reached, or names no master now (retryable: elections take seconds)."""


MASTER_ENTRY = re.compile(r"^json\.info_(\d+)$")
"""A contending master's znode: its MasterInfo as JSON, the lowest sequence number is the leader."""


def parse_zookeeper(text: str) -> ZooKeeperGroup | None:
    """`zk://host:port[,host:port...]/path` -> ZooKeeperGroup; None for anything not `zk://`."""
    text = text.strip()
    if not text.startswith("zk://"):
        return None
    hosts, slash, path = text.removeprefix("zk://").partition("/")
    credentials, at, hosts = hosts.rpartition("@")
    shown = f"zk://{'***@' if at else ''}{hosts}{slash}{path}"  # an error never prints the password
    if at and not re.fullmatch(r"[^:@/]+:.+", credentials):
        raise ConfigError(f"mesos master {shown!r}: ZooKeeper credentials are user:password@ (a digest ACL's)")
    servers = hosts.split(",")
    if not slash or not path.strip("/") or not all(re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}", h) for h in servers):
        raise ConfigError(f"mesos master {shown!r}: expected zk://[user:password@]host:port[,host:port...]/path")
    return ZooKeeperGroup(hosts, "/" + path.strip("/"), credentials)


def zookeeper_masters(group: ZooKeeperGroup, timeout: float) -> list[Master]:
    """The masters contending in `group` now, the leader first. Raises DiscoveryFailed."""
    from kazoo.client import KazooClient  # only a zk:// framework needs it
    from kazoo.exceptions import KazooException, NoAuthError
    from kazoo.handlers.threading import KazooTimeoutError

    auth = [("digest", group.credentials)] if group.credentials else None
    client = KazooClient(hosts=group.hosts, timeout=timeout, read_only=True, auth_data=auth)
    client.logger.setLevel(logging.ERROR)  # each retry says why in one line of our own
    try:
        client.start(timeout=timeout)
        names = client.get_children(group.path)
        entries = sorted((int(m[1]), name) for name in names if (m := MASTER_ENTRY.match(name)))
        masters = [_master_info(client.get(f"{group.path}/{name}")[0], group) for _, name in entries]
    except NoAuthError:
        given = "the credentials given" if group.credentials else "no credentials (zk://user:password@...)"
        raise DiscoveryFailed(f"ZooKeeper {group}: its ACL refuses {given}") from None
    except (KazooException, KazooTimeoutError, OSError) as exc:
        raise DiscoveryFailed(f"ZooKeeper {group}: {type(exc).__name__} {exc}".rstrip()) from None
    finally:
        client.stop()
        client.close()
    if not masters:
        raise DiscoveryFailed(f"ZooKeeper {group}: no master is registered (an election may be under way)")
    return masters


def _master_info(data: bytes, group: ZooKeeperGroup) -> Master:
    """A master's address from the MasterInfo JSON it registered (`address`, else its old `pid`)."""
    try:
        info = json.loads(data)
        address = info.get("address") or {}
        host = address.get("ip") or address.get("hostname")  # the IP it advertises, as agents use
        port = address.get("port")
        if not (host and port):
            host, port = info["pid"].split("@", 1)[1].rsplit(":", 1)
        return Master(str(host), int(port))
    except (ValueError, KeyError, AttributeError, TypeError, IndexError):
        raise DiscoveryFailed(f"ZooKeeper {group}: a master entry that is not MasterInfo JSON: {data[:80]!r}") from None


def parse_master(text: str) -> Master:
    """`host`, `host:port` or `http(s)://host:port[/...]` -> Master; anything else is a ConfigError."""
    text = text.strip()
    if text.startswith("zk://"):
        raise ConfigError(f"mesos master {text!r}: a ZooKeeper group must be the only address given")
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

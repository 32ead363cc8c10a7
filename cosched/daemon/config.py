"""The daemon's settings: one TOML file, every key known, every default embedded.

With no file the daemon runs on its embedded default: the local Docker engine,
this host's CPUs as one node, state in a per-user directory. A key the daemon
does not know is an error naming it, so a typo never silently falls back to a
default. Every key, with its default and what it does: `deploy/cosched.toml` (a test holds
it to the defaults here).
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import psutil

from cosched.daemon.accounts import RUN_AS
from cosched.daemon.identity import USER_NAME, refuse_shared
from cosched.daemon.seccomp import load_profile, profile_path
from cosched.daemon.specs import MIN_MEMORY_MIB
from cosched.errors import ConfigError
from cosched.mesos.calls import role_problem


def _default_state_dir() -> str:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "/var/lib/cosched"
    return str(Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / "cosched")


@dataclass(frozen=True)
class DaemonSection:
    state_dir: str = field(default_factory=_default_state_dir)
    instance: str = ""
    keep_ended_days: float = 0.0
    keep_decisions_days: float = 0.0
    durable_power: bool = False
    """`synchronous=FULL`: each commit reaches the disk before the daemon acts on it (`Store`)."""


@dataclass(frozen=True)
class ApiSection:
    host: str = "127.0.0.1"
    port: int = 6817
    token: str = ""
    key_file: str = ""
    operators: tuple[str, ...] = ("root",)
    private_data: bool = False
    max_body: int = 1 << 20
    max_connections: int = 64
    max_jobs: int = 100_000
    max_jobs_per_user: int = 0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    tls_cert: str = ""
    tls_key: str = ""


@dataclass(frozen=True)
class ClusterSection:
    nodes: int = 1
    cores: int = 0
    memory_mib: int = 0
    default_memory_per_core: int = 1024
    nodes_per_switch: int = 0
    switches_per_pod: int = 0


@dataclass(frozen=True)
class DockerSection:
    base_url: str = ""
    cpu_period: int = 100_000
    data_roots: tuple[str, ...] = ()
    log_tail: int = 20
    job_user: str = "65534:65534"
    run_as: str = "job_user"
    pids_limit: int = 4096
    log_max_mib: int = 10
    nofile: int = 4096
    seccomp_profile: str = "auto"
    engine_calls: int = 8
    ptys: bool = True


@dataclass(frozen=True)
class BackendSection:
    kind: str = "docker"


@dataclass(frozen=True)
class MesosSection:
    masters: str = ""
    name: str = "cosched"
    user: str = "root"
    role: str = ""
    order_by: tuple[str, ...] = ()
    executor_command: str = "python3 -m cosched.mesos.executor"
    launch_timeout: float = 30.0
    hold_timeout: float = 10.0
    refuse_seconds: float = 120.0
    revive_interval: float = 1.0
    watchdog_heartbeats: float = 3.0
    fence: float = 60.0
    principal: str = ""
    secret_file: str = ""


@dataclass(frozen=True)
class IntervalSection:
    schedule: float = 1.0
    sample: float = 2.0
    review: float = 5.0
    reconcile: float = 30.0
    launch_wait: float = 2.0


@dataclass(frozen=True)
class PolicySection:
    queue: str = "fcfs"
    backfill: str = "easy"
    estimate: str = "requested"
    placement: str = "first-fit"
    cosched: str = "asax"
    sharing: int = 2
    window: int = 32
    keep_promises: bool = True
    max_cores_per_user: int = 0
    max_running_jobs_per_user: int = 0
    seed: int = 0
    loss: str = "live"
    min_guest_share: float = 0.6
    experts: str = ""
    learner: str = "app"
    round_threshold: float = 0.1
    horizon: int = 100


@dataclass(frozen=True)
class DaemonConfig:
    """Everything `cosched daemon` reads from its TOML file."""

    daemon: DaemonSection = field(default_factory=DaemonSection)
    api: ApiSection = field(default_factory=ApiSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    docker: DockerSection = field(default_factory=DockerSection)
    backend: BackendSection = field(default_factory=BackendSection)
    mesos: MesosSection = field(default_factory=MesosSection)
    intervals: IntervalSection = field(default_factory=IntervalSection)
    policies: PolicySection = field(default_factory=PolicySection)

    @property
    def state_dir(self) -> Path:
        return Path(self.daemon.state_dir).expanduser()

    def cpus(self) -> list[int]:
        """The cluster's cores as host CPU numbers, one entry per core.

        More cores than this host's CPUs oversubscribe them (Slurm's OverSubscribe):
        core k runs on CPU k mod n. Quotas still bound every job; that is how the
        monitoring benchmark runs 50 one-core jobs on a 2-CPU machine.
        """
        allowed = (
            sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        )
        count = self.cluster.cores or len(allowed)
        if count < self.cluster.nodes:
            raise ConfigError(f"cluster.nodes: {self.cluster.nodes} nodes need at least as many cores, have {count}")
        return [allowed[k % len(allowed)] for k in range(count)]

    def memory_mib(self) -> int:
        return self.cluster.memory_mib or int(psutil.virtual_memory().total * 0.9) // (1 << 20)


_SECTIONS = {f.name: f for f in fields(DaemonConfig)}
MAX_CORES = 1 << 20
"""More cores or nodes than any cluster has: a typo, and the daemon lists every core at start."""
MAX_MEMORY_MIB = 1 << 40


def load_config(path: str | Path | None) -> DaemonConfig:
    """The config in `path`, or the embedded default; ConfigError naming any bad key or value."""
    if path is None:
        return validate(DaemonConfig())
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
            info = os.fstat(handle.fileno())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # TOML is UTF-8
        raise ConfigError(f"config file {path}: {exc}") from None
    config = validate(from_dict(document))
    if config.api.token:  # whoever reads it is an operator, as whoever reads `key_file` mints any user
        refuse_shared(info, Path(path), "api.token (in it)")
    return config


def from_dict(document: dict[str, Any]) -> DaemonConfig:
    """Build a config from nested tables, refusing unknown sections and keys."""
    config = DaemonConfig()
    for section, table in document.items():
        if section not in _SECTIONS:
            raise ConfigError(f"unknown config section [{section}] (known: {', '.join(_SECTIONS)})")
        if not isinstance(table, dict):
            raise ConfigError(f"config [{section}] must be a table")
        current = getattr(config, section)
        known = {f.name: f for f in fields(current)}
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in known:
                raise ConfigError(f"unknown config key {section}.{key} (known: {', '.join(known)})")
            values[key] = _coerce(f"{section}.{key}", getattr(current, key), value)
        config = replace(config, **{section: replace(current, **values)})
    return config


def _coerce(name: str, default: Any, value: Any) -> Any:
    """Check a value against its default's type (ints are accepted where floats are)."""
    if isinstance(default, bool) or isinstance(value, bool):
        if type(value) is not type(default):
            raise ConfigError(f"config key {name}: expected {type(default).__name__}, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int | float):
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"config key {name}: expected a list of strings, got {value!r}")
        return tuple(value)
    if not isinstance(value, type(default)):
        raise ConfigError(f"config key {name}: expected {type(default).__name__}, got {value!r}")
    return value


def validate(config: DaemonConfig) -> DaemonConfig:
    """Range checks the types cannot express."""
    api, cluster, intervals = config.api, config.cluster, config.intervals
    for key in ("max_cores_per_user", "max_running_jobs_per_user"):
        if (cap := getattr(config.policies, key)) < 0:
            raise ConfigError(f"config key policies.{key}: must be >= 0 (0: no cap), got {cap}")
    for key in ("keep_ended_days", "keep_decisions_days"):
        if not 0 <= (days := getattr(config.daemon, key)) <= 36500:
            raise ConfigError(f"config key daemon.{key}: must be in 0..36500 (0 = keep), got {days}")
    if not 0 < api.port < 65536:
        raise ConfigError(f"config key api.port: must be in 1..65535, got {api.port}")
    if api.max_body < 1024:
        raise ConfigError(f"config key api.max_body: must be >= 1024 bytes, got {api.max_body}")
    if api.max_connections < 4:
        raise ConfigError(f"config key api.max_connections: must be >= 4, got {api.max_connections}")
    if api.max_jobs < 1 or api.max_jobs_per_user < 0:
        raise ConfigError(
            f"config [api]: max_jobs must be >= 1 and max_jobs_per_user >= 0 (0 = no limit), "
            f"got {api.max_jobs} and {api.max_jobs_per_user}"
        )
    for key in ("header_timeout", "body_timeout"):
        if not 0 < getattr(api, key) <= 3600:
            raise ConfigError(f"config key api.{key}: must be in (0, 3600] seconds, got {getattr(api, key)}")
    if bool(api.tls_cert) != bool(api.tls_key):
        raise ConfigError("config keys api.tls_cert and api.tls_key: give both (HTTPS) or neither")
    if api.private_data and not api.key_file:
        raise ConfigError(
            "config key api.private_data: needs per-user tokens (api.key_file); without them every caller is one user"
        )
    if not _is_loopback(api.host) and not (api.token or api.key_file):
        raise ConfigError(
            f"config key api.token: required (or api.key_file) when api.host ({api.host}) is not a loopback address"
        )
    for name in api.operators:
        if not USER_NAME.fullmatch(name):
            raise ConfigError(f"config key api.operators: {name!r} is not a POSIX user name (a-z, 0-9, '_', '.', '-')")
    if (
        not 1 <= cluster.nodes <= MAX_CORES
        or not 0 <= cluster.cores <= MAX_CORES
        or not 0 <= cluster.memory_mib <= MAX_MEMORY_MIB
        or not MIN_MEMORY_MIB <= cluster.default_memory_per_core <= MAX_MEMORY_MIB
    ):
        raise ConfigError(
            f"config [cluster]: nodes must be in 1..{MAX_CORES}, cores in 0..{MAX_CORES}, memory_mib in "
            f"0..{MAX_MEMORY_MIB}, default_memory_per_core in {MIN_MEMORY_MIB}..{MAX_MEMORY_MIB} "
            "(Docker sets no less memory)"
        )
    if config.policies.seed < 0:
        raise ConfigError(f"config key policies.seed: must be >= 0, got {config.policies.seed}")
    if (cluster.nodes_per_switch > 0) != (cluster.switches_per_pod > 0) or min(
        cluster.nodes_per_switch, cluster.switches_per_pod
    ) < 0:
        raise ConfigError(
            "config [cluster]: nodes_per_switch and switches_per_pod are both >= 1 (a fat-tree) or both 0, "
            f"got {cluster.nodes_per_switch} and {cluster.switches_per_pod}"
        )
    validate_job_settings(config.docker, here=config.backend.kind != "mesos")
    if config.docker.run_as not in RUN_AS:
        expected = " or ".join(repr(choice) for choice in RUN_AS)
        raise ConfigError(f"config key docker.run_as: expected {expected}, got {config.docker.run_as!r}")
    if config.backend.kind not in ("docker", "mesos"):
        raise ConfigError(f"config key backend.kind: expected 'docker' or 'mesos', got {config.backend.kind!r}")
    if config.backend.kind == "mesos" and not config.mesos.masters.strip():
        raise ConfigError(
            "config key mesos.masters: backend.kind = 'mesos' needs the masters' host:port or a zk://host:port/path"
        )
    for key in ("launch_timeout", "hold_timeout", "refuse_seconds", "revive_interval", "fence"):
        value = getattr(config.mesos, key)
        if not a_duration(value):
            raise ConfigError(f"config key mesos.{key}: must be in (0, 86400] seconds, got {value}")
    for name in config.mesos.order_by:
        if not name or not name.isprintable() or any(c.isspace() or c in ":;" for c in name):
            raise ConfigError(f"config key mesos.order_by: {name!r} is not an agent attribute's name")
    if config.mesos.role and (problem := role_problem(config.mesos.role)):
        raise ConfigError(f"config key mesos.role: {config.mesos.role!r} is not a Mesos role: {problem}")
    if bool(config.mesos.principal) != bool(config.mesos.secret_file):
        raise ConfigError("config keys mesos.principal and mesos.secret_file: give both (authentication) or neither")
    if not 1 <= config.mesos.watchdog_heartbeats <= 100:
        raise ConfigError(
            f"config key mesos.watchdog_heartbeats: must be in [1, 100] heartbeat intervals, "
            f"got {config.mesos.watchdog_heartbeats}"
        )
    for f in fields(intervals):
        if not a_duration(getattr(intervals, f.name)):
            raise ConfigError(f"config key intervals.{f.name}: must be in (0, 86400] seconds")
    return config


def a_duration(seconds: float) -> bool:
    """Whether `seconds` is in (0, 86400], as every interval and timeout must be (NaN and inf are
    not): also what a Mesos executor checks of those the framework hands it."""
    return 0 < seconds <= 86400


def validate_job_settings(docker: DockerSection, here: bool = True) -> None:
    """The [docker] keys that make a job's sandbox: checked where the daemon reads its config and
    again by each Mesos executor, which is handed them (`cosched.mesos.jobs.JOB_SETTINGS`)."""
    if not 1000 <= docker.cpu_period <= 1_000_000:
        raise ConfigError(f"config key docker.cpu_period: must be in 1000..1000000 us, got {docker.cpu_period}")
    for root in docker.data_roots:
        if not os.path.isabs(root):
            raise ConfigError(f"config key docker.data_roots: {root!r} is not an absolute path")
    uid, sep, gid = docker.job_user.partition(":")
    ids = (uid, gid) if sep and uid.isdigit() and gid.isdigit() else ("0", "0")
    if not all(0 < int(number) < 2**32 - 1 for number in ids):  # (uid_t)-1 means "no change"
        raise ConfigError(
            f"config key docker.job_user: expected 'uid:gid', each in 1..4294967294 (jobs never run as root), "
            f"got {docker.job_user!r}"
        )
    for key, least in (("pids_limit", 16), ("log_max_mib", 1), ("nofile", 64), ("engine_calls", 1), ("log_tail", 0)):
        if getattr(docker, key) < least:
            raise ConfigError(f"config key docker.{key}: must be >= {least}, got {getattr(docker, key)}")
    if here and (profile := profile_path(docker.seccomp_profile)):  # on Mesos, each executor checks its own
        load_profile(profile)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

"""An in-process engine the test ends, samples and times, and a daemon on a clock the test sets.

Why: what a restart rebuilds (`Daemon.rebuild`, as `recover` after a SIGKILL) must equal what the
live daemon held, and that takes many passes at chosen moments; a real engine makes such a test
slow and its times unrepeatable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosched.daemon.config import from_dict
from cosched.daemon.docker_backend import ContainerInfo, EngineUnavailable, Exit, Sample
from cosched.daemon.service import Daemon


class Clock:
    """The daemon's clock: epoch seconds the test moves."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeEngine:
    """Containers start at the clock's time and run until `finish`; `unavailable` job ids' launches
    fail as an engine gone; `samples` is what sampling a job's container reads."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.running: dict[int, str] = {}
        self.runs: dict[int, int] = {}
        """The run each job's container was launched for (its `cosched.run` label)."""
        self.exits: dict[int, Exit] = {}
        self.unavailable: set[int] = set()
        self.quotas: list[tuple[str, float]] = []
        self.samples: dict[int, Sample] = {}
        self.start_delay = 0.0
        """Seconds from a launch's decision to its container's start (a launch's latency)."""

    def finish(self, job_id: int, code: int = 0) -> None:
        self.exits[job_id] = Exit(code, 0.0, self.clock(), False)

    def launch(
        self, job_id: int, spec: dict[str, Any], cpuset: str, quota: float, memory: int, run: int = 0, **placement: Any
    ):
        """A container named by its job, as Docker's: one of the same `run` there already is taken,
        one an earlier run left is replaced (`DockerBackend._create`)."""
        if job_id in self.unavailable:
            raise EngineUnavailable("engine gone")
        if self.runs.get(job_id) != run:
            self.exits.pop(job_id, None)
        self.runs[job_id] = run
        self.running[job_id] = f"c{job_id}"
        return f"c{job_id}", self.clock() + self.start_delay

    def containers(self) -> dict[int, ContainerInfo]:
        return {
            j: ContainerInfo(c, j, "exited" if j in self.exits else "running", run=self.runs.get(j))
            for j, c in self.running.items()
        }

    def exit_of(self, container: str) -> Exit:
        return self.exits[int(container[1:])]

    def kill(self, container: str) -> None:
        job_id = int(container[1:])
        if job_id in self.running and job_id not in self.exits:
            self.finish(job_id, 137)

    def remove(self, container: str) -> None:
        for held in (self.running, self.exits, self.runs):
            held.pop(int(container[1:]), None)

    def set_quota(self, container: str, cpus: float) -> None:
        self.quotas.append((container, cpus))

    def sample(self, container: str, quota: float, now: float) -> Sample | None:
        return self.samples.get(int(container[1:]))

    def logs(self, container: str, lines: int = 20) -> str:
        return ""

    def verify_quota(self, container: str, cpus: float) -> bool:
        return True

    def has_image(self, name: str) -> bool:
        return True

    def ping(self) -> bool:
        return True

    def connect(self) -> None: ...
    def expect(self, handle: str, job_id: int, slots: Any) -> None: ...
    def expect_launch(self, job_id: int, run: int, slots: Any) -> None: ...
    def adopt(self, container: str) -> None: ...
    def withdraw(self, job_id: int) -> None: ...
    def queued(self, jobs: int) -> None: ...
    def close(self) -> None: ...

    def nodes_changed(self) -> list[tuple[int, bool]]:
        return []

    def node_status(self) -> list[Any]:
        return []  # one host: its nodes are parts of it, not machines

    def others_hold(self, cores: int, memory: int) -> dict[int, tuple[int, int]]:
        return {}

    def unsized(self) -> list[tuple[str, int]]:
        return []

    def waiting(self) -> dict[int, str]:
        return {}


def clocked_daemon(state_dir: Path, clock: Clock, engine: FakeEngine, cores: int = 8, **policies: Any) -> Daemon:
    """A started daemon of `cores` cores on `engine`, its passes run by the test (`schedule`)."""
    config = from_dict(
        {
            "daemon": {"state_dir": str(state_dir)},
            "cluster": {"cores": cores, "memory_mib": 8192},
            "intervals": {"launch_wait": 2.0},
            "policies": {"cosched": "none", **policies},
        }
    )
    daemon = Daemon(config, backend=engine, clock=clock)  # type: ignore[arg-type]
    daemon.start()
    return daemon

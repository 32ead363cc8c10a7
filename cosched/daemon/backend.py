"""What the daemon asks of the machines it runs jobs on: one protocol, a backend per kind.

`DockerBackend` runs jobs as containers of one host's engine; `cosched.mesos.backend.
MesosBackend` as tasks of the cosched executor on Mesos agents. The daemon's pass,
review, reconciliation and recovery call only these methods, so a backend is chosen
in the config (`[backend] kind`) and nothing else changes. A job's handle (`str`) is
a container id on Docker, a task id on Mesos.
"""

from __future__ import annotations

from typing import Any, Protocol

from cosched.daemon.docker_backend import ContainerInfo, Exit, Sample


class Backend(Protocol):
    def connect(self) -> None:
        """Reach the machines; EngineUnavailable (one line) if they do not answer."""

    def ping(self) -> bool: ...

    def has_image(self, name: str) -> bool: ...

    def launch(
        self,
        job_id: int,
        spec: dict[str, Any],
        cpus: list[int],
        quota: float,
        memory_mib: int,
        *,
        node: int = 0,
        guest: bool = False,
    ) -> tuple[str, float]:
        """Start a job on `node` (as a guest on another job's cores if `guest`): its handle and start time."""
        ...

    def containers(self) -> dict[int, ContainerInfo]:
        """This daemon's jobs the machines know, by job id."""
        ...

    def adopt(self, handle: str) -> None: ...

    def exit_of(self, handle: str) -> Exit: ...

    def logs(self, handle: str) -> str: ...

    def kill(self, handle: str) -> None: ...

    def remove(self, handle: str) -> None: ...

    def set_quota(self, handle: str, cpus: float) -> None:
        """Change a running job's CPU quota and check the kernel enforces it (QuotaMismatch if not)."""

    def verify_quota(self, handle: str, cpus: float) -> bool: ...

    def sample(self, handle: str, quota: float, now: float) -> Sample | None: ...

    def close(self) -> None:
        """Let go of the machines; running jobs keep running for the next start."""

"""What the daemon asks of the machines it runs jobs on: one protocol, a backend per kind.

`DockerBackend` runs jobs as containers of one host's engine; `cosched.mesos.backend.
MesosBackend` as tasks of the cosched executor on Mesos agents. The daemon's pass,
review, reconciliation and recovery call only these methods, so a backend is chosen
in the config (`[backend] kind`) and nothing else changes. A job's handle (`str`) is
a container id on Docker, a run of tasks on Mesos.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from cosched.core.events import Slots
from cosched.daemon.docker_backend import ContainerInfo, Exit, Sample


@dataclass(frozen=True)
class NodeStatus:
    """What stands behind one of the core's nodes (a Mesos agent), for `cosched nodes`."""

    name: str
    """The agent's hostname ('' on one host)."""
    id: str
    up: bool
    attributes: tuple[tuple[str, str], ...] = ()
    """The agent's attributes (rack, switch, ...), as its last offer told them."""


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
        slots: Slots = (),
        guest: bool = False,
        run: int = 0,
    ) -> tuple[str, float]:
        """Start a job's `run` (`Store.begin_run`) on the core's `slots` (as a guest on another
        job's cores if `guest`): its handle and start time. What it starts carries `run`
        (`ContainerInfo.run`); what an earlier run of the job left under its name is not taken for
        it. LaunchRefused if the job itself cannot start (its image, its command), RunLost if its
        machines could not run it (see RunLost)."""
        ...

    def expect(self, handle: str, job_id: int, slots: Slots) -> None:
        """Before `containers` at a start: a run the state file records as running. Where the
        machines may not have told of it yet (Mesos, after a master failover), it is listed running
        until they tell; one host's engine lists all it has, and one it does not is gone."""

    def expect_launch(self, job_id: int, run: int, slots: Slots) -> None:
        """Before `containers` at a start: a run the state file records as launching (`run`, on
        `slots`), of which the machines told nothing. Where they may not have told of it yet (Mesos,
        after a master failover), it is listed running until they tell; one host's engine lists
        every container it made, and a run it has not was never started."""

    def containers(self) -> dict[int, ContainerInfo]:
        """This daemon's jobs the machines know, by job id (`lost` runs too, see ContainerInfo)."""
        ...

    def adopt(self, handle: str) -> None: ...

    def exit_of(self, handle: str) -> Exit: ...

    def logs(self, handle: str) -> str: ...

    def live_log(self, handle: str, lines: int) -> str | None:
        """The last `lines` of a running job's output as its machine has them now (as `tail` of a
        Slurm job's output file); None where the backend cannot read it while the job runs."""
        ...

    def kill(self, handle: str) -> None: ...

    def withdraw(self, job_id: int) -> None:
        """Give up the launch under way of job `job_id`, whose cancel came before it ran: where the
        machines hold its parts made and unstarted (a Mesos gang at its start barrier), they are
        removed, never started. A no-op where a launch cannot be given up midway (one host's engine:
        its job is killed once the launch is recorded)."""

    def remove(self, handle: str) -> None: ...

    def set_quota(self, handle: str, cpus: float) -> None:
        """Change a running job's CPU quota and check the kernel enforces it (QuotaMismatch if not)."""

    def verify_quota(self, handle: str, cpus: float) -> bool: ...

    def sample(self, handle: str, quota: float, now: float) -> Sample | None: ...

    def queued(self, jobs: int) -> None:
        """How many jobs wait in the core's queue after a pass (a Mesos framework stops offers while none)."""

    def nodes_changed(self) -> list[tuple[int, bool]]:
        """Nodes that went away (False) or came back (True) since the last call, in order."""
        ...

    def node_status(self) -> list[NodeStatus]:
        """Per node, what stands behind it ([] when nodes are parts of one host)."""
        ...

    def waiting(self) -> dict[int, str]:
        """Jobs whose launch waits for resources the machines have not given yet, or whose run waits
        to be known stopped on a machine lost, and for what."""
        ...

    def others_hold(self, cores: int, memory: int) -> dict[int, tuple[int, int]]:
        """Per node, the cores and MiB (of its `cores` and `memory`) that others hold of its machine
        (other frameworks of a shared Mesos agent), which the core must not place on."""
        ...

    def unsized(self) -> list[tuple[str, int]]:
        """(handle, job id) of runs adopted after a restart whose sizes the backend cannot know."""
        ...

    def size(self, handle: str, memory_mib: int, guest: bool) -> None:
        """What an adopted run holds: its job's memory, and whether it is a guest."""

    def close(self) -> None:
        """Let go of the machines; running jobs keep running for the next start."""

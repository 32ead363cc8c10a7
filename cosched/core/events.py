"""What flows across the core's boundary: events in, actions out.

Backends (the simulated one in replay, Docker or Mesos in the daemon) turn what
happened into events; the core answers with actions. Nothing here knows which
world it is in. Slots are `(node, cores)` pairs; memory, where tracked, travels
alongside as MiB per slot.

Events and actions are treated as immutable once made. They are not frozen
dataclasses only because a frozen one costs twice as much to construct, and
replay makes several per job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from cosched.model import Job, Usage

Slots = tuple[tuple[int, int], ...]


@dataclass(slots=True)
class JobSubmitted:
    """A job entered the queue."""

    job: Job


@dataclass(slots=True)
class JobEnded:
    """A running job stopped; its resources come back separately, as an `Offer`.

    `at` is when the backend saw it stop (defaults to the step's `now`).
    """

    job_id: int
    failed: bool = False
    at: float | None = None


@dataclass(slots=True)
class JobCancelled:
    """The user withdrew a job; a running one gets a `Kill` action."""

    job_id: int


@dataclass(slots=True)
class JobHeld:
    """The user holds a pending job (Slurm's `scontrol hold`): it stays pending, out of every
    policy's sight, until released; a job that already runs is not touched."""

    job_id: int


@dataclass(slots=True)
class JobReleased:
    """A held job may start again: it is queued (or waits for its begin, if that is still to come)."""

    job_id: int


@dataclass(slots=True)
class JobUpdated:
    """A queued or running job's walltime changed (Slurm's `scontrol update TimeLimit`): it is
    ordered, fitted and reserved for by the new one, and a running one is killed at it."""

    job_id: int
    walltime: float


@dataclass(slots=True)
class Offer:
    """Resources a backend offers the framework, Mesos-style.

    The core holds offered resources until a job's whole gang fits in them.
    `memory`, if given, is MiB per slot, aligned with `slots`.
    """

    slots: Slots
    memory: tuple[int, ...] | None = None


@dataclass(slots=True)
class Rescind:
    """A backend takes offered resources back (a node drained or lost)."""

    slots: Slots
    memory: tuple[int, ...] | None = None


@dataclass(slots=True)
class UsageReported:
    """A backend's latest measurement of a running job (CPU%, Mem%, tasks done)."""

    job_id: int
    usage: Usage


@dataclass(slots=True)
class JobAdopted:
    """A job found already running when the framework (re)started: the daemon's
    containers survive the daemon. The job carries its `slots`, `start`, `quota`
    and `host` (a guest names its host, adopted before it); the resources it holds
    are not part of any offer.
    """

    job: Job


@dataclass(slots=True)
class JobRequeued:
    """A running job's run was lost, not ended by the job: its machine went away (a Mesos
    agent removed, its executor killed) or its gang could not start whole. The job goes
    back to the queue with its place (its submission time); the interrupted run teaches
    the co-scheduling policy nothing. What it held comes back separately, as an `Offer`,
    only where the machine is still there.
    """

    job_id: int


@dataclass(slots=True)
class Launch:
    """Start `job` on `slots`: the job's whole gang, taken from held offers."""

    job: Job
    slots: Slots


@dataclass(slots=True)
class Colocate:
    """Start `guest` inside the running `host`'s allocation, on `slots` (a part
    of the host's slots), with a CPU quota of `quota` CPUs lent by the host."""

    guest: Job
    host_id: int
    slots: Slots
    quota: float


@dataclass(slots=True)
class SetQuota:
    """Change a running job's CPU quota (cgroup CPU quota, in CPUs), counted from `at`.

    Why `at`: the core counts a quota from its own moment (a guest's end is its container's
    finish, which a daemon collects a pass later); the daemon's quota log says that moment.
    """

    job_id: int
    cpus: float
    at: float


@dataclass(slots=True)
class Kill:
    """Stop a running job (cancelled by its user)."""

    job_id: int


@dataclass(slots=True)
class Reject:
    """A job that can never run here (larger than the cluster), or no longer may (its latest
    start passed while it was pending); it leaves the queue, failed, with `reason`."""

    job: Job
    reason: str


Event = (
    JobSubmitted
    | JobEnded
    | JobCancelled
    | JobHeld
    | JobReleased
    | JobUpdated
    | Offer
    | Rescind
    | UsageReported
    | JobAdopted
    | JobRequeued
)
Action = Launch | Colocate | SetQuota | Kill | Reject


@dataclass(slots=True)
class Decision:
    """The core's answer to one step.

    `reservations` maps job ids to the start time the backfill policy reserved
    for them in this pass (EASY: the blocked head; conservative: every queued
    job).
    """

    actions: list[Action] = field(default_factory=list)
    reservations: Mapping[int, float] = field(default_factory=dict)
    wake_at: float = math.inf
    """The core wants a pass at this time even if nothing happens: a placement window's end, a
    held job's begin or a pending job's latest start, whichever comes first."""

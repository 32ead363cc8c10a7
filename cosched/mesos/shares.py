"""What other frameworks hold of an agent, from its offers, in the core's units. Pure.

The core's node is `cores` cores and `memory` MiB (`[cluster]`); the agent behind it may be
shared with other frameworks. Mesos never tells a framework an agent's total, but each offer
says what is free for us now, and we know what our own tasks there hold (their cores or a
guest's token CPU, their memory, each executor's 0.05 CPU and 64 MiB). Their sum is the
agent's *room* for cosched: its total less what others hold. It does not move when our own
jobs start or end (what a launch takes from the offers it holds as a task; what an end frees
is offered again), only when others take or give back, so it is learnt at each offer and kept
between offers (declined with a refuse filter, suppressed): stale, never guessed.

The room is then turned into what the core must hold back on the node: the cores and MiB of
its node that the room cannot host, counting one executor per core (the most tasks its
whole-core jobs can have there). An agent with a node's cores and memory plus 0.05 CPU and
64 MiB per core holds nothing back when no other framework is there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from cosched.mesos.jobs import EXECUTOR_CPUS, EXECUTOR_MEM
from cosched.mesos.offers import Offer

SLACK = 1e-6
"""Float sums of offers (0.1 + 0.2 cpus) must not cost a core."""


@dataclass(frozen=True)
class Room:
    """What cosched could hold on an agent as its last offers showed: offered plus its own tasks'."""

    cpus: float
    mem: float


def room(offers: Iterable[Offer], ours: Iterable[tuple[float, float] | None]) -> Room | None:
    """The agent's room from the offers of it we hold now and what each of our tasks there holds
    ((cpus, MiB), its executor's included); None when one of ours is of unknown size (a task known
    only from reconciliation, before the daemon told its size)."""
    cpus = mem = 0.0
    for offer in offers:
        cpus += offer.cpus
        mem += offer.mem
    for size in ours:
        if size is None:
            return None
        cpus += size[0]
        mem += size[1]
    return Room(cpus, mem)


def held_back(room: Room, cores: int, memory: int) -> tuple[int, int]:
    """The cores and MiB of a node of `cores` cores and `memory` MiB (0: memory not scheduled) that
    `room` cannot host: what the core must not place on. Each core counts its executor."""
    usable_cores = math.floor(room.cpus / (1.0 + EXECUTOR_CPUS) + SLACK)
    held_cores = max(0, cores - max(0, usable_cores))
    if memory <= 0:
        return held_cores, 0
    usable_mem = math.floor(room.mem - EXECUTOR_MEM * cores + SLACK)
    return held_cores, max(0, memory - max(0, usable_mem))


def task_size(cpus: float, memory_mib: int) -> tuple[float, float]:
    """What a task of `cpus` CPUs and `memory_mib` MiB holds on its agent with its executor."""
    return cpus + EXECUTOR_CPUS, memory_mib + EXECUTOR_MEM

"""Machines gone and back (a Mesos agent lost, then registered again), as the core's events.

Why its own module: the core's pool must never offer cores of a machine that is
gone, nor count twice what a machine back still runs. The daemon keeps the gone
nodes in `daemon.down`; these functions turn the backend's node changes into
`Rescind` and `Offer`, and cut what an end gives back to the nodes still there.
Both run under `lock`, inside the pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cosched.core.events import Event, Offer, Rescind
from cosched.core.pool import slot_memory
from cosched.model import JobState

if TYPE_CHECKING:
    from cosched.daemon.service import Daemon


def events(daemon: Daemon, changes: list[tuple[int, bool]]) -> list[Event]:
    """A node gone leaves the core's pool (what it had free is rescinded; what its jobs held
    never comes back); a node back is offered whole, less what the core still counts on it."""
    pool, cluster = daemon.core.pool, daemon.cluster
    events: list[Event] = []
    final = dict(changes)  # gone and back within one pass: its jobs' ends say what was lost
    for node, up in final.items():
        if not up and node not in daemon.down:
            daemon.down.add(node)
            cores, memory = pool.free_cores(node), pool.free_mem[node]
            if cores or memory:
                events.append(Rescind(((node, cores),), (memory,)))
        elif up and node in daemon.down:
            daemon.down.discard(node)
            cores, memory = cluster.cores_per_node - pool.free_cores(node), cluster.memory_per_node
            memory -= pool.free_mem[node]
            for job in daemon.core.jobs.values():
                if job.state is not JobState.RUNNING:
                    continue
                held = slot_memory(cluster, job, job.slots) or (0,) * len(job.slots)
                for (n, count), mib in zip(job.slots, held, strict=True):
                    if n == node:
                        cores -= count if job.host < 0 else 0
                        memory -= mib
            if cores > 0 or memory > 0:
                events.append(Offer(((node, max(cores, 0)),), (max(memory, 0),)))
    return events


def live_part(daemon: Daemon, offer: Offer) -> Offer | None:
    """What an end gives back, less what was on nodes that are gone."""
    if not daemon.down:
        return offer
    memory = offer.memory or (0,) * len(offer.slots)
    kept = [(slot, mib) for slot, mib in zip(offer.slots, memory, strict=True) if slot[0] not in daemon.down]
    if not kept:
        return None
    return Offer(tuple(slot for slot, _ in kept), tuple(mib for _, mib in kept) if offer.memory else None)

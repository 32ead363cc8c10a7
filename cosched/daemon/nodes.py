"""Machines gone and back (a Mesos agent lost, then registered again), machines shared
with others (a Mesos agent another framework partly holds) and nodes drained by an operator,
as the core's events.

Why its own module: the core's pool must never offer cores of a machine that is
gone, nor count twice what a machine back still runs, nor count what another
framework holds. The daemon keeps the gone nodes in `daemon.down`; these functions
turn the backend's node changes into `Rescind` and `Offer`, hold back of each node
what the backend says others hold (`others_hold`: a `Rescind` of it from the node's
free resources, an `Offer` when they give it back; what is not free yet is taken from
the next ends on that node), hold back a drained node whole by the same rule, and cut what
an end gives back to the nodes still there. All run under `lock`, inside the pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from cosched.core.events import Event, Offer, Rescind
from cosched.core.frees import ends_to_come
from cosched.core.pool import slot_memory
from cosched.daemon import drain
from cosched.model import Allocation, JobState

if TYPE_CHECKING:
    from cosched.core.scheduler import Scheduler
    from cosched.daemon.service import Daemon

log = logging.getLogger("cosched.daemon")


@dataclass
class Held:
    """What other frameworks hold of one node (`want`, as the backend last said) and how much of it
    the core's pool holds back now (`have`): cores and MiB. `want - have` is owed: taken from the
    node's next ends, since it was not free when others took it (the core's view lags Mesos's)."""

    want_cores: int = 0
    want_mem: int = 0
    have_cores: int = 0
    have_mem: int = 0
    others: tuple[int, int] = (0, 0)
    """Of `want`, what other frameworks hold (the rest: the node is drained)."""


_HELD: WeakKeyDictionary[Scheduler, dict[int, Held]] = WeakKeyDictionary()
"""Per core (a rebuilt core, offered every node whole by recovery, starts with nothing held back)."""


def _ledger(daemon: Daemon) -> dict[int, Held]:
    """Node -> what the core holds back of it for other frameworks (nodes holding nothing absent)."""
    return _HELD.setdefault(daemon.core, {})


def events(daemon: Daemon, changes: list[tuple[int, bool]]) -> list[Event]:
    """A node gone leaves the core's pool (what it had free is rescinded; what its jobs held
    never comes back); a node back is offered whole, less what the core still counts on it."""
    pool, cluster = daemon.core.pool, daemon.cluster
    events: list[Event] = []
    final = dict(changes)  # gone and back within one pass: its jobs' ends say what was lost
    for node, up in final.items():
        if not up and node not in daemon.down:
            daemon.down.add(node)
            _ledger(daemon).pop(node, None)  # all it has free leaves; it comes back whole, then held back anew
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
    events += _shared(daemon, events)
    withheld = drain.withheld(daemon)
    for job_id, units in _owed(daemon).items():
        withheld[job_id] = withheld.get(job_id, 0) + units
    daemon.core.withhold(withheld)
    return events


def _shared(daemon: Daemon, pending: list[Event]) -> list[Event]:
    """Hold back of each node up what other frameworks hold of it now (all of it if it is drained),
    give back what they left.

    Only free resources can be rescinded: what others took while the core counted it as its own
    (a launch in flight, or jobs that ended) is owed, taken from the node's next ends (`live_part`);
    so is what a drained node's jobs hold. `pending` are this pass's events before these (a node
    back is offered in them)."""
    _size_adopted(daemon)
    cluster, pool = daemon.cluster, daemon.core.pool
    by_others = daemon.backend.others_hold(cluster.cores_per_node, cluster.memory_per_node)
    target = {**by_others, **{node: (cluster.cores_per_node, cluster.memory_per_node) for node in daemon.drained}}
    ledger = _ledger(daemon)
    if not target and not ledger:
        return []
    coming: dict[int, list[int]] = {}
    for event in pending:
        if isinstance(event, Offer | Rescind):
            sign = 1 if isinstance(event, Offer) else -1
            memory = event.memory or (0,) * len(event.slots)
            for (node, cores), mib in zip(event.slots, memory, strict=True):
                have = coming.setdefault(node, [0, 0])
                have[0] += sign * cores
                have[1] += sign * mib
    events: list[Event] = []
    for node in sorted(set(target) | set(ledger)):
        if node in daemon.down:
            continue
        want_cores, want_mem = target.get(node, (0, 0))
        entry = ledger.setdefault(node, Held())
        others = by_others.get(node, (0, 0))
        if entry.others != others:
            log.info("node %d: other frameworks hold %s of its machine", node, _describe(*others) or "nothing")
        entry.others = others
        entry.want_cores, entry.want_mem = want_cores, want_mem
        extra = coming.get(node, [0, 0])
        free_cores = pool.free_cores(node) + extra[0]
        free_mem = pool.free_mem[node] + extra[1]
        back_cores = min(max(0, entry.have_cores - want_cores), cluster.cores_per_node - free_cores)
        back_mem = max(0, entry.have_mem - want_mem)
        if back_cores > 0 or back_mem > 0:
            events.append(Offer(((node, max(back_cores, 0)),), (back_mem,)))
            entry.have_cores -= max(back_cores, 0)
            entry.have_mem -= back_mem
        take_cores = min(max(0, want_cores - entry.have_cores), max(0, free_cores))
        take_mem = min(max(0, want_mem - entry.have_mem), max(0, free_mem))
        if take_cores or take_mem:
            events.append(Rescind(((node, take_cores),), (take_mem,)))
            entry.have_cores += take_cores
            entry.have_mem += take_mem
        if not (entry.want_cores or entry.want_mem or entry.have_cores or entry.have_mem):  # `others` is in want
            del ledger[node]
    return events


def _owed(daemon: Daemon) -> dict[int, int]:
    """Running job -> the cores of its that its end will not give back because other frameworks
    took them while the core counted them (owed: `live_part` cuts them from the node's next ends),
    so that reservations do not count on them. The next ends are foreseen as reservations foresee
    them (`cosched.core.frees.ends_to_come`); a host's withheld cores count its guests'
    (`cosched.core.frees.releases`)."""
    if daemon.cluster.allocation is not Allocation.CORE:
        return {}
    owed = {
        node: entry.want_cores - entry.have_cores
        for node, entry in _ledger(daemon).items()
        if entry.want_cores > entry.have_cores and node not in daemon.down and node not in daemon.drained
    }
    if not owed:
        return {}
    core = daemon.core
    withheld: dict[int, int] = {}
    for _, job_id, slots in ends_to_come(core.running, core.guests, core.jobs):
        for node, cores in slots:
            cut = min(cores, owed.get(node, 0))
            if cut <= 0:
                continue
            owed[node] -= cut
            withheld[job_id] = withheld.get(job_id, 0) + cut
            host = core.jobs[job_id].host
            if host >= 0:
                withheld[host] = withheld.get(host, 0) + cut
    return withheld


def _size_adopted(daemon: Daemon) -> None:
    """Tell the backend the size of the runs it knows only from reconciliation (its jobs': their
    memory, and whether a guest), so that it can tell what others hold of their agents."""
    for handle, job_id in daemon.backend.unsized():
        job = daemon.core.jobs.get(job_id)
        if job is not None and daemon.containers.get(job_id) == handle:
            daemon.backend.size(handle, job.memory * job.cores, job.host >= 0)


def _describe(cores: int, mib: int) -> str:
    """'1 core, 532 MiB' ('' when nothing)."""
    parts = [f"{cores} core{'s' if cores != 1 else ''}"] if cores else []
    return ", ".join(parts + ([f"{mib} MiB"] if mib else []))


def others(daemon: Daemon) -> dict[int, str]:
    """Node -> what other frameworks hold of it, in words, for `cosched nodes` (nodes up only)."""
    return {
        node: what
        for node, entry in _ledger(daemon).items()
        if node not in daemon.down and (what := _describe(*entry.others))
    }


def live_part(daemon: Daemon, offer: Offer) -> Offer | None:
    """What an end gives back, less what was on nodes that are gone, and less what other
    frameworks took on its nodes while the core still counted it (owed, see `_shared`)."""
    ledger = _ledger(daemon)
    if not daemon.down and not ledger:
        return offer
    memory = offer.memory or (0,) * len(offer.slots)
    kept = []
    for (node, cores), mib in zip(offer.slots, memory, strict=True):
        if node in daemon.down:
            continue
        entry = ledger.get(node)
        if entry is not None:
            cut_cores = min(cores, max(0, entry.want_cores - entry.have_cores))
            cut_mem = min(mib, max(0, entry.want_mem - entry.have_mem))
            entry.have_cores += cut_cores
            entry.have_mem += cut_mem
            cores, mib = cores - cut_cores, mib - cut_mem
        if cores or mib:
            kept.append(((node, cores), mib))
    if not kept:
        return None
    return Offer(tuple(slot for slot, _ in kept), tuple(mib for _, mib in kept) if offer.memory else None)

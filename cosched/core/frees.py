"""What a running job's end gives back, and when: one rule for the core, replay and the daemon.

A guest runs on a share of its host's cores. While its host runs, a guest's end
gives nothing back: the cores are the host's. When the host ends first, its guests
keep their share, so the host's end gives back its slots less theirs, and each
guest gives its share back at its own end. Backfill reservations are computed from
the same rule (`releases`), so a promise never counts cores a guest still holds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType

from cosched.core.events import Slots
from cosched.model import Job

_NONE: Mapping[int, int] = MappingProxyType({})


def freed_slots(job: Job, host_running: bool, surviving_guests: Iterable[Job]) -> Slots | None:
    """The slots a job's end gives back; None for a guest whose host still runs."""
    if host_running:
        return None
    slots: Slots = job.slots
    for guest in surviving_guests:
        held = dict(guest.slots)
        slots = tuple((node, cores - held.get(node, 0)) for node, cores in slots)
    return slots


def outlives(guest: Job, host: Job) -> bool:
    """Whether a guest is expected to end after its host, and so keeps its share past the host's end."""
    return guest.expected_end > host.expected_end


def ends_to_come(
    running: Iterable[Job], guests: Mapping[int, Sequence[Job]], jobs: Mapping[int, Job]
) -> list[tuple[float, int, Slots]]:
    """(expected end, job id, slots its end gives back) of each host in `running`, and of each guest
    expected to outlive its host, in that order: a host its slots less those of such guests, such a
    guest its own (`freed_slots`). `releases` in slots: for callers who must know which node's cores
    come back, not just how many (`running`, `guests`, `jobs` as there)."""
    ends: list[tuple[float, int, Slots]] = []
    for host in running:
        kept = (guest for guest in guests.get(host.id, ()) if outlives(guest, host))
        ends.append((host.expected_end, host.id, freed_slots(host, False, kept) or ()))
    for host_id, members in guests.items():
        lender = jobs.get(host_id)
        if lender is not None:
            ends += [(guest.expected_end, guest.id, guest.slots) for guest in members if outlives(guest, lender)]
    ends.sort(key=lambda end: end[:2])
    return ends


def releases(
    running: Sequence[Job],
    guests: Mapping[int, Sequence[Job]],
    jobs: Mapping[int, Job],
    now: float,
    withheld: Mapping[int, int] = _NONE,
) -> Iterator[tuple[float, int]]:
    """(time, units) the running jobs give back by their expected ends (never before `now`), in time order.

    `running` is sorted by expected end and holds hosts, not guests; `guests` maps a
    host's id to its guests. A guest expected to outlive its host keeps its units
    past the host's end and gives them back at its own. `withheld` maps a job (host or
    guest) to the units of it that its end will not give back (on a drained node, or taken by
    another framework meanwhile), which a reservation must not count on. A guest's withheld units are part of its
    host's, so they are not kept twice when it outlives the host.
    """
    if not guests:
        if not withheld:
            for job in running:
                yield max(job.expected_end, now), job.need
            return
        for job in running:
            yield max(job.expected_end, now), job.need - withheld.get(job.id, 0)
        return
    kept: dict[int, int] = {}
    later: list[tuple[float, int]] = []
    for host_id, members in guests.items():
        host = jobs.get(host_id)
        if host is None:
            continue
        for guest in members:
            if outlives(guest, host):
                units = guest.need - withheld.get(guest.id, 0)
                kept[host_id] = kept.get(host_id, 0) + units
                later.append((max(guest.expected_end, now), units))
    later.sort()
    own = ((max(job.expected_end, now), job.need - kept.get(job.id, 0) - withheld.get(job.id, 0)) for job in running)
    yield from heapq.merge(own, later)


def shadow(free: int, releases: Iterable[tuple[float, int]], need: int) -> tuple[float, int]:
    """When `need` units are free, with `free` free now and `releases` (time, units) to come in
    time order (inf: never), and the units left over then: EASY's shadow time and extra units,
    the one rule every reservation and every "would it fit by then" is computed with."""
    available = free
    for end, units in releases:
        available += units
        if available >= need:
            return end, available - need
    return math.inf, 0

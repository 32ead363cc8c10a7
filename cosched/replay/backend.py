"""The simulated backend: runs launched jobs for their recorded runtime.

It plays the part Docker or Mesos play in the daemon: it offers the cluster's
resources, takes `Launch`, `Colocate`, `SetQuota` and `Kill` actions, and
reports when jobs end and their resources are offered again. It alone knows a
job's true runtime while the job waits and runs (`admit`), as the real world does
for the daemon: policies plan with requested times only. A job alone on
its cores runs for its actual runtime; a job whose CPU quota is cut, or that
shares cores with a guest, progresses at the rate a `RateModel` gives, so
co-location costs in replay what it would cost for real. Every job is killed
at its walltime, as a real resource manager would.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Protocol

from cosched.core.events import Action, Colocate, Event, JobEnded, Kill, Launch, Offer, Reject, SetQuota, UsageReported
from cosched.core.frees import freed_slots
from cosched.core.pool import slot_memory
from cosched.model import Cluster, Job, Usage


class RateModel(Protocol):
    """How fast a job progresses under a CPU quota, next to other jobs on its cores."""

    def speed(self, job: Job, quota: float, neighbours: Sequence[tuple[Job, float]]) -> float:
        """Progress rate in (0, 1]: 1 is as fast as alone with all its cores."""
        ...

    def usage(self, job: Job, quota: float, speed: float) -> tuple[float, float]:
        """(CPU%, Mem%) of its allocation a monitor would measure, as fractions."""
        ...


class CpuBound:
    """Every job needs all its cores: the rate is the quota's share of them.

    The pessimistic default when no workload profiles are known (plain traces).
    """

    def speed(self, job: Job, quota: float, neighbours: Sequence[tuple[Job, float]]) -> float:
        return max(1e-6, min(1.0, quota / job.cores))

    def usage(self, job: Job, quota: float, speed: float) -> tuple[float, float]:
        return min(1.0, quota / job.cores), 0.0


class Accounts:
    """A job's use integrated over time: CPU-seconds used, quota-seconds granted,
    and memory fraction x seconds; what cgroup accounting reports for a real job."""

    __slots__ = ("_cpu", "_mem", "_quota", "_since", "cpu_seconds", "mem_seconds", "quota_seconds")

    def __init__(self) -> None:
        self.cpu_seconds = self.quota_seconds = self.mem_seconds = 0.0
        self._since = math.nan
        self._cpu = self._quota = self._mem = 0.0

    def switch(self, now: float, cpus: float, mem: float, quota: float) -> None:
        self.close(now)
        self._since, self._cpu, self._mem, self._quota = now, cpus, mem, quota

    def close(self, now: float) -> None:
        if self._since == self._since:  # not NaN: a stretch is open
            dt = now - self._since
            self.cpu_seconds += self._cpu * dt
            self.quota_seconds += self._quota * dt
            self.mem_seconds += self._mem * dt
        self._since = now


class SimulatedBackend:
    """Virtual-time execution of launched jobs."""

    def __init__(
        self, cluster: Cluster, rates: RateModel | None = None, *, account: bool = False, keep_slots: bool = True
    ) -> None:
        self.cluster = cluster
        self.rates: RateModel = rates or CpuBound()
        self.account = account
        """Integrate each job's CPU, memory and quota use over time (see `Accounts`)."""
        self.accounts: dict[int, Accounts] = {}
        self.rejected: list[Job] = []
        self.running: dict[int, Job] = {}
        self._ends: list[tuple[float, int, Job]] = []
        self._end_at: dict[int, float] = {}
        self._seq = 0
        self._stale = 0
        """Heap entries superseded since pushed (upper bound): next_time skips them."""
        self._memory_tracked = cluster.memory_per_node > 0
        # Only jobs whose rate ever changed are tracked here.
        self._speed: dict[int, float] = {}
        self._natural_end: dict[int, float] = {}
        self._host: dict[int, int] = {}
        self._guests: dict[int, list[int]] = {}
        self._quota: dict[int, float] = {}
        self.keep_slots = keep_slots
        """False: `forget_slots` clears the slots of ended jobs (see there)."""
        self._ended: list[Job] = []
        """Jobs `pop` ended since the last `forget_slots` (only without `keep_slots`)."""
        self.truth: dict[int, float | None] = {}
        """True runtimes of the admitted jobs, by id (None: unknown, the walltime stands in)."""
        self._admitted: list[Job] = []

    def admit(self, job: Job) -> Job:
        """Take a job's true runtime into the backend's keeping before the core sees the job.

        From submission to its end a job's `runtime` is None, in replay as in the daemon,
        so no policy can read what only the future knows; `pop` gives it back when the job
        ends (ASAx's replay-only `degradation` loss reads it then), `reveal_all` when the
        replay stops. The one plugin that may plan with it, the `actual` estimator
        (EASY-AR), is handed `truth` explicitly (`Estimator.bind_truth`).
        """
        self.truth[job.id] = job.runtime
        job.runtime = None
        self._admitted.append(job)
        return job

    def reveal_all(self) -> None:
        """Give every admitted job its runtime back (the replay is over, or was abandoned)."""
        truth = self.truth
        for job in self._admitted:
            job.runtime = truth[job.id]

    def start(self) -> list[Event]:
        """Offer every node of the cluster."""
        c = self.cluster
        memory = (c.memory_per_node,) * c.nodes if c.memory_per_node else None
        return [Offer(tuple((n, c.cores_per_node) for n in range(c.nodes)), memory)]

    # -- actions ------------------------------------------------------------
    def apply(self, now: float, actions: list[Action]) -> None:
        changed: set[int] = set()
        for action in actions:
            if isinstance(action, Launch):
                job = action.job
                runtime = self.truth.get(job.id, job.runtime)
                if runtime is None:
                    runtime = job.walltime
                self.running[job.id] = job
                if runtime > job.walltime:  # killed at its walltime: its natural end says so at its end
                    self._natural_end[job.id] = now + runtime
                self._schedule_end(job, now + min(runtime, job.walltime))
                if self.account:
                    self._open(now, job, float(job.cores), 1.0)
            elif isinstance(action, Colocate):
                self._colocate(now, action)
                changed.update((action.guest.id, action.host_id))
            elif isinstance(action, SetQuota):
                self._quota[action.job_id] = action.cpus
                changed.add(action.job_id)
            elif isinstance(action, Kill):
                self._kill(now, action.job_id)
            elif isinstance(action, Reject):
                self.rejected.append(action.job)
        for job_id in changed:
            self._respeed(now, job_id)

    def _colocate(self, now: float, action: Colocate) -> None:
        guest = action.guest
        runtime = self.truth.get(guest.id, guest.runtime)
        if runtime is None:
            runtime = guest.walltime
        self.running[guest.id] = guest
        self._host[guest.id] = action.host_id
        self._guests.setdefault(action.host_id, []).append(guest.id)
        self._quota[guest.id] = action.quota
        self._speed[guest.id] = 1.0
        self._natural_end[guest.id] = now + runtime
        self._end_at[guest.id] = math.nan  # rescheduled by _respeed
        if self.account:
            self._open(now, guest, action.quota, 1.0)

    def _respeed(self, now: float, job_id: int) -> None:
        """Recompute a job's rate (and its partners') from now on."""
        job = self.running.get(job_id)
        if job is None:
            return
        for member in self._sharing_group(job_id):
            self._set_rate(now, self.running[member])

    def _sharing_group(self, job_id: int) -> list[int]:
        host = self._host.get(job_id, job_id)
        return [host, *self._guests.get(host, [])] if host in self.running else [job_id]

    def _set_rate(self, now: float, job: Job) -> None:
        jid = job.id
        old_speed = self._speed.get(jid, 1.0)
        natural = self._natural_end.get(jid, self._end_at.get(jid, now))
        work_left = max(0.0, (natural - now) * old_speed)
        quota = self._quota.get(jid, float(job.cores))
        neighbours = [
            (self.running[o], self._quota.get(o, float(self.running[o].cores)))
            for o in self._sharing_group(jid)
            if o != jid
        ]
        speed = self.rates.speed(job, quota, neighbours)
        self._speed[jid] = speed
        if self.account:
            self._open(now, job, quota, speed)
        self._natural_end[jid] = now + work_left / speed
        self._schedule_end(job, min(self._natural_end[jid], job.start + job.walltime))

    # -- time ---------------------------------------------------------------
    def next_time(self) -> float:
        ends = self._ends
        if self._stale:  # some ends were superseded by a rate change or a kill: skip those
            end_at = self._end_at
            while ends and end_at.get(ends[0][2].id) != ends[0][0]:
                heapq.heappop(ends)
                self._stale -= 1
        return ends[0][0] if ends else math.inf

    def pop(self, now: float) -> list[Event]:
        """Events for every job ending at or before `now`, with the offers they free."""
        ends, end_at, running, truth = self._ends, self._end_at, self.running, self.truth
        events: list[Event] = []
        # Plain replays never share cores: their ends need none of the co-location bookkeeping.
        shared = bool(self._speed or self._host or self._guests)
        memory_of = slot_memory if self._memory_tracked else None
        while ends and ends[0][0] <= now:
            at, _, job = heapq.heappop(ends)
            if end_at.get(job.id) != at:
                self._stale -= 1
                continue
            del end_at[job.id]
            del running[job.id]
            job.runtime = truth.get(job.id, job.runtime)
            if not self.keep_slots:
                self._ended.append(job)
            if self.account:
                self.accounts[job.id].close(at)
            # Ended before its work did (its walltime, a kill): failed, as the daemon's review has it.
            # Only a job whose rate changed, or that would overrun, has a natural end apart from `at`.
            natural = self._natural_end.pop(job.id, at)
            self._speed.pop(job.id, None)
            events.append(JobEnded(job.id, failed=natural > at + 1e-9))
            if not shared:
                events.append(Offer(job.slots, memory_of(self.cluster, job, job.slots) if memory_of else None))
                continue
            offer = self._released(job)
            if offer is not None:
                events.append(offer)
        return events

    def _released(self, job: Job) -> Offer | None:
        """What a job's end gives back (`cosched.core.frees`): nothing while its cores are its host's."""
        jid = job.id
        host = self._host.pop(jid, None)
        host_running = host is not None and host in self.running
        if host is not None and host_running:
            self._guests[host].remove(jid)
        surviving = [self.running[g] for g in self._guests.pop(jid, []) if g in self.running]
        for guest in surviving:  # they keep their share of the cores, as ordinary jobs now
            del self._host[guest.id]
        slots = freed_slots(job, host_running, surviving)
        if slots is None:
            return None
        memory = slot_memory(self.cluster, job, job.slots) if self._memory_tracked else None
        return Offer(slots, memory)

    def forget_slots(self) -> None:
        """Clear the slots of the jobs ended since the last call, once the core has taken their offers back.

        A finished job's slots hold one entry per node it used: kept for every job
        of a long trace on a large machine they were most of a replay's memory
        (1.8 GB for CEA-Curie's 296k jobs), and no result reads them.
        """
        for job in self._ended:
            job.slots = ()
        self._ended.clear()

    def sample(self, now: float) -> list[Event]:
        """Usage of every running job, as a monitor sampling cgroups would report it."""
        events: list[Event] = []
        for job in self.running.values():
            speed = self._speed.get(job.id, 1.0)
            quota = self._quota.get(job.id, float(job.cores))
            cpu, mem = self.rates.usage(job, quota, speed)
            cpu = cpu * job.cores / quota if quota > 0 else 1.0  # of the quota granted
            natural = self._natural_end.get(job.id, self._end_at.get(job.id, now))
            total = self.truth.get(job.id, job.runtime) or job.walltime
            done = 1.0 - max(0.0, (natural - now) * speed) / total if total > 0 else 1.0
            tasks = int(job.tasks * min(1.0, max(0.0, done)))
            events.append(UsageReported(job.id, Usage(cpu, mem, tasks, now, quota)))
        return events

    def _open(self, now: float, job: Job, quota: float, speed: float) -> None:
        """Start a new stretch of constant use for a job's accounts."""
        cpu, mem = self.rates.usage(job, quota, speed)
        accounts = self.accounts.get(job.id)
        if accounts is None:
            accounts = self.accounts[job.id] = Accounts()
        accounts.switch(now, cpu * job.cores, mem, quota)

    def _kill(self, now: float, job_id: int) -> None:
        job = self.running.get(job_id)
        if job is not None:
            self._schedule_end(job, now)

    def _schedule_end(self, job: Job, at: float) -> None:
        if job.id in self._end_at:
            self._stale += 1  # its earlier heap entry is now out of date
        self._end_at[job.id] = at
        self._seq += 1
        heapq.heappush(self._ends, (at, self._seq, job))

"""A validating wrapper around the core, for tests and checked replays.

It keeps its own, independent ledger of the cluster, so a bug in the core's
bookkeeping (the pool, the queue) cannot hide itself: every launch is checked
against what the validator believes is free, and every rule a scheduler must
keep is asserted at the moment it could be broken.
"""

from __future__ import annotations

from cosched.core.events import Colocate, Decision, Event, JobEnded, JobSubmitted, Launch, Reject, SetQuota
from cosched.core.scheduler import Scheduler
from cosched.errors import SchedulingError
from cosched.model import Allocation, Job


class ValidatingScheduler:
    """Checks each step of a `Scheduler`: no double allocation, no start before
    submission, each job started once, every gang whole; records decisions."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        cluster = scheduler.cluster
        self.used = [0] * cluster.nodes
        self.started: dict[int, float] = {}
        self.submitted: dict[int, float] = {}
        self.ended: set[int] = set()
        self.slots: dict[int, tuple[tuple[int, int], ...]] = {}
        self.reservation_log: list[tuple[float, dict[int, float]]] = []
        self.head_log: list[tuple[float, int | None]] = []
        """(time, id of the job first in queue order as each pass began)."""
        self.launch_log: list[tuple[float, int]] = []
        self.host_of: dict[int, int] = {}
        """Running guests' hosts."""
        self.quota: dict[int, float] = {}
        self.cores: dict[int, int] = {}
        self.user_of: dict[int, int] = {}
        self.user_cores: dict[int, int] = {}
        """Cores held by each user's running jobs (hosts and guests alike), against the core's cap."""
        self.user_jobs: dict[int, int] = {}
        """Running jobs of each user, against the core's cap."""
        self.workflow_jobs: dict[str, int] = {}
        """Running jobs of each workflow, against its jobs' throttle."""
        self.throttled: dict[int, str] = {}
        """Running jobs with a throttle, and their workflow."""

    def step(self, now: float, events: list[Event]) -> Decision:
        self.head_log.append((now, self._ordered_head(now, events)))
        for event in events:
            if isinstance(event, JobSubmitted):
                self._check(event.job.id not in self.submitted, f"job {event.job.id} submitted twice")
                self._check(event.job.submit <= now, f"job {event.job.id} submitted in the future")
                self.submitted[event.job.id] = event.job.submit
            elif isinstance(event, JobEnded):
                self._release(event.job_id)
        decision = self.scheduler.step(now, events)
        for action in decision.actions:
            if isinstance(action, Launch):
                self._launch(now, action)
            elif isinstance(action, Colocate):
                self._colocate(now, action)
            elif isinstance(action, SetQuota):
                self._check(action.job_id in self.slots, f"quota set for job {action.job_id}, which is not running")
                self.quota[action.job_id] = action.cpus
            elif isinstance(action, Reject):
                self._check(
                    action.job.need > self.scheduler.cluster.capacity_units or bool(action.reason),
                    f"job {action.job.id} rejected without a reason",
                )
        self._check_quotas(decision)
        if decision.reservations:
            self.reservation_log.append((now, dict(decision.reservations)))
            jobs = self.scheduler.jobs
            for jid, at in decision.reservations.items():
                job = jobs.get(jid)
                self._check(
                    job is None or at <= job.latest_start,
                    f"job {jid} reserved for {at}, after its latest start {job and job.latest_start}",
                )
        return decision

    def _ordered_head(self, now: float, events: list[Event]) -> int | None:
        """The job the queue policy will serve first in this pass (before anything starts)."""
        core = self.scheduler
        pending = core.queue + [e.job for e in events if isinstance(e, JobSubmitted) and e.job.begin <= now]
        if not pending:
            return None
        return min(pending, key=lambda job: core.queue_policy.score(job, now)).id

    def _launch(self, now: float, action: Launch) -> None:
        job, cluster = action.job, self.scheduler.cluster
        jid = job.id
        self._check(jid in self.submitted, f"job {jid} launched but never submitted")
        self._check(jid not in self.started, f"job {jid} started twice")
        self._check(now >= job.submit, f"job {jid} started at {now} before its submission at {job.submit}")
        self._in_window(now, job)
        per_node = cluster.cores_per_node
        nodes = [node for node, _ in action.slots]
        self._check(len(set(nodes)) == len(nodes), f"job {jid} got one node twice")
        if cluster.allocation is Allocation.NODE:
            self._check(len(nodes) == job.need, f"job {jid} needs {job.need} nodes, got {len(nodes)}")
            for node, cores in action.slots:
                self._check(cores == per_node and self.used[node] == 0, f"job {jid}: node {node} is not whole")
        else:
            got = sum(cores for _, cores in action.slots)
            self._check(got == job.cores, f"job {jid} needs {job.cores} cores, got {got}")
        for node, cores in action.slots:
            self._check(self.used[node] + cores <= per_node, f"job {jid} oversubscribes node {node}")
            self.used[node] += cores
        self.started[jid] = now
        self.slots[jid] = action.slots
        self.launch_log.append((now, jid))
        self.quota[jid] = float(job.cores)
        self.cores[jid] = job.cores
        self._user_took(job)

    def _colocate(self, now: float, action: Colocate) -> None:
        guest, host = action.guest, action.host_id
        gid = guest.id
        self._check(gid in self.submitted and gid not in self.started, f"guest {gid} not pending")
        self._check(now >= guest.submit, f"guest {gid} started before its submission")
        self._in_window(now, guest)
        self._check(host in self.slots and host not in self.host_of, f"guest {gid}: host {host} cannot host")
        hosting = self.scheduler.jobs.get(host)
        self._check(
            guest.coschedule and hosting is not None and hosting.coschedule, f"guest {gid}: on {host}, one opted out"
        )
        held = dict(self.slots[host])
        for node, cores in action.slots:
            self._check(cores <= held.get(node, 0), f"guest {gid} runs outside host {host}'s cores")
        self._check(sum(c for _, c in action.slots) == guest.cores, f"guest {gid} got the wrong core count")
        self._check(0 < action.quota <= guest.cores, f"guest {gid} quota {action.quota} out of range")
        self.started[gid] = now
        self.slots[gid] = action.slots
        self.host_of[gid] = host
        self.quota[gid] = action.quota
        self.cores[gid] = guest.cores
        self.launch_log.append((now, gid))
        self._user_took(guest)

    def _user_took(self, job: Job) -> None:
        """A start never takes its user past the core's caps on cores and jobs, nor its workflow
        past its throttle."""
        self.user_of[job.id] = job.user
        held = self.user_cores[job.user] = self.user_cores.get(job.user, 0) + job.cores
        limit = self.scheduler.limit
        cap = limit.max_cores if limit else 0
        self._check(
            not cap or held <= cap, f"job {job.id} takes user {job.user} to {held} cores, past the cap of {cap}"
        )
        count = self.user_jobs[job.user] = self.user_jobs.get(job.user, 0) + 1
        most = limit.max_jobs if limit else 0
        self._check(not most or count <= most, f"job {job.id} is user {job.user}'s job {count} running, past {most}")
        if job.throttle:
            workflow = self.throttled[job.id] = job.workflow or ""
            running = self.workflow_jobs[workflow] = self.workflow_jobs.get(workflow, 0) + 1
            self._check(
                running <= job.throttle,
                f"job {job.id} makes workflow {workflow} run {running} jobs, past its throttle of {job.throttle}",
            )

    def _check_quotas(self, decision: Decision) -> None:
        """CPU quotas on one allocation never add up to more than its cores."""
        lent: dict[int, float] = {}
        for guest, host in self.host_of.items():
            lent[host] = lent.get(host, 0.0) + self.quota[guest]
        for host, guests_quota in lent.items():
            total = self.quota[host] + guests_quota
            self._check(total <= self.cores[host] + 1e-9, f"allocation of job {host} oversubscribed: {total} CPUs")

    def _release(self, jid: int) -> None:
        self._check(jid in self.started and jid not in self.ended, f"job {jid} ended but was not running")
        self.ended.add(jid)
        user = self.user_of.pop(jid)
        self.user_cores[user] -= self.cores[jid]
        self.user_jobs[user] -= 1
        if jid in self.throttled:
            self.workflow_jobs[self.throttled.pop(jid)] -= 1
        slots = self.slots.pop(jid)
        self.quota.pop(jid, None)
        if jid in self.host_of:  # a guest inside a live host: the cores stay the host's
            del self.host_of[jid]
            return
        held = {node: cores for node, cores in slots}
        for guest in [g for g, h in self.host_of.items() if h == jid]:  # guests inherit their share
            del self.host_of[guest]
            for node, cores in self.slots[guest]:
                held[node] -= cores
        for node, cores in held.items():
            self.used[node] -= cores

    def _in_window(self, now: float, job: Job) -> None:
        """A deferrable job starts within [begin, latest start], never outside it."""
        self._check(now >= job.begin, f"job {job.id} started at {now} before its begin at {job.begin}")
        self._check(
            now <= job.latest_start, f"job {job.id} started at {now} after its latest start at {job.latest_start}"
        )

    @staticmethod
    def _check(ok: bool, message: str) -> None:
        if not ok:
            raise SchedulingError(f"validation: {message}")

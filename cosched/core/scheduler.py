"""The scheduling core: `step(now, events) -> Decision`, and nothing else.

It knows no clock, no Docker, no Mesos. Replay calls it at virtual times with
events from a simulated backend; the daemon calls it at wall-clock times with
events from a real one. Both get exactly this logic.

A pass serves the queue in the queue policy's order, launching jobs while
their whole gang fits in the held offers; at the first job that does not fit
(the blocked head) it asks the backfill policy which later jobs may start now.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from cosched.core.events import (
    Action,
    Colocate,
    Decision,
    Event,
    JobAdopted,
    JobCancelled,
    JobEnded,
    JobHeld,
    JobReleased,
    JobRequeued,
    JobSubmitted,
    JobUpdated,
    Kill,
    Launch,
    Offer,
    Reject,
    Rescind,
    SetQuota,
    Slots,
    UsageReported,
)
from cosched.core.limits import Limits
from cosched.core.pool import ResourcePool, slot_memory
from cosched.core.promises import Promises
from cosched.core.view import SchedulerView
from cosched.core.waiting import Ordered, Waiting
from cosched.core.windows import StartWindows, doomed
from cosched.errors import ConfigError, SchedulingError
from cosched.model import Cluster, Job, JobState
from cosched.policies.base import (
    AgingPolicy,
    BackfillPlan,
    BackfillPolicy,
    CoschedulePolicy,
    Estimator,
    PlacementPolicy,
    QueuePolicy,
)

_expected_end = attrgetter("expected_end")
_priority = attrgetter("priority")
_place = attrgetter("priority", "id")
"""A requeued job's place among equal priorities: by id, as it first stood (after them, an array's
first task ran last of its throttle: an operator's walkthrough)."""
_NONE: Mapping[int, float] = MappingProxyType({})
_NO_GUESTS: Mapping[int, list[Job]] = MappingProxyType({})


class Scheduler:
    """Queue, running set and held offers, advanced one step at a time."""

    def __init__(
        self,
        cluster: Cluster,
        queue_policy: QueuePolicy,
        backfill: BackfillPolicy,
        estimator: Estimator,
        placement: PlacementPolicy,
        cosched: CoschedulePolicy | None = None,
        *,
        sharing: int = 2,
        window: int = 32,
        keep_promises: bool = False,
        max_cores_per_user: int = 0,
        max_running_jobs_per_user: int = 0,
        late_grace: float = 0.0,
    ) -> None:
        if sharing < 1 or window < 1:
            raise ConfigError(f"sharing and window must be >= 1, got {sharing} and {window}")
        if not 0.0 <= late_grace < math.inf:
            raise ConfigError(f"late_grace must be a finite number of seconds >= 0, got {late_grace}")
        caps = {"max_cores_per_user": max_cores_per_user, "max_running_jobs_per_user": max_running_jobs_per_user}
        for name, cap in caps.items():
            if cap < 0:
                raise ConfigError(f"{name} must be >= 0 (0: no cap), got {cap}")
        if queue_policy.one_by_one and backfill.serves_head:
            raise ConfigError(
                f"queue policy {queue_policy.name!r} chooses every start itself; "
                f"backfill {backfill.name!r} would reserve for every job: use none or easy"
            )
        self.cluster = cluster
        self.queue_policy = queue_policy
        self.backfill = backfill
        self.estimator = estimator
        self.placement = placement
        self.cosched = cosched
        self.sharing = sharing
        """At most this many jobs share one allocation (the host and its guests)."""
        self.window = window
        """Queued jobs offered to the co-scheduling policy per pass, in queue order."""
        self._cosched_active = cosched is not None and cosched.active and sharing > 1
        self.keep_promises = keep_promises
        """Backfill promises count the cores guests keep after their hosts end, and a guest is
        placed only where it keeps every promise (`cosched.core.promises`). Off, a guest may
        outlive its host on cores a reservation counts on (the ASAx paper's framework had no
        reservations to keep)."""
        self.guests: dict[int, list[Job]] = {}
        """Running hosts' co-scheduled guests, by host id."""
        self.not_lent: dict[int, str] = {}
        """Why each job the last pass offered for co-scheduling got no lending (`cosched queue`
        shows it: a queued job beside idle allocations was a question no view answered). A
        template of `{cores}`, `{sharing}`, `{policy}` and `{job}`: a pass in replay formats nothing."""
        self.pool = ResourcePool(cluster)
        self.queue: list[Job] = []
        """Pending jobs: sorted by score for a static queue policy, else in arrival order."""
        self._waiting = Waiting(queue_policy) if isinstance(queue_policy, AgingPolicy) else None
        """The queue's submit times and weights as arrays, for an aging queue policy."""
        self.running: list[Job] = []
        """Running jobs sorted by expected end."""
        self.jobs: dict[int, Job] = {}
        """Pending and running jobs by id."""
        self._killing: set[int] = set()
        """Running jobs the core asked the backend to kill."""
        self._held_begins: dict[int, float] = {}
        """Jobs the user holds (`JobHeld`), with the begin each had before."""
        self._withheld: dict[int, int] = {}
        """Running jobs' units their ends will not give back to the pool (`withhold`)."""
        self._stepped = -math.inf
        """When the core last stepped: a pass stands for the time since (`_timed_pass`)..."""
        self.late_grace = late_grace
        """...up to this many seconds: the daemon's pass interval (`intervals.schedule`), 0 in replay,
        which steps at every latest start. After a stretch with no step (the engine or the state
        file down) a job whose latest start passed long before would start that much late."""
        per_user = max_cores_per_user or max_running_jobs_per_user
        self.limit = Limits(max_cores_per_user, max_running_jobs_per_user) if per_user else None
        """The caps on each user's running cores and jobs and each workflow's running jobs
        (`cosched.core.limits`); None until there is one, so a pass without caps checks none."""
        self._handlers: dict[type, Callable[[Any, float, list[Action]], None]] = {
            JobSubmitted: self._on_submitted,
            JobEnded: self._on_ended,
            JobCancelled: self._on_cancelled,
            JobHeld: self._on_held,
            JobReleased: self._on_released,
            Offer: self._on_offer,
            Rescind: self._on_rescind,
            UsageReported: self._on_usage,
            JobAdopted: self._on_adopted,
            JobRequeued: self._on_requeued,
            JobUpdated: self._on_updated,
        }
        guests: Mapping[int, list[Job]] = self.guests if keep_promises else _NO_GUESTS
        self._view = SchedulerView(0.0, cluster, self.queue, self.running, self.pool, guests, self.jobs, self._withheld)
        self._capacity = cluster.capacity_units
        self._memory_tracked = cluster.memory_per_node > 0
        self._place = placement.place
        self._joint = placement.joint
        self._period = placement.period
        if self._period < 0:
            raise ConfigError(f"placement period must be >= 0, got {self._period}")
        self._next_window = 0.0
        """With a placement `period`: the queue is served at the first pass at or after this."""
        self._started: list[Launch] = []
        """A joint placement's launches in the current pass."""
        self.windows = StartWindows()
        """Jobs held until their begin, and pending jobs with a latest start (`cosched.core.windows`)."""
        # Hooks a policy leaves as the base class's no-op are not called: replay calls each once per job.
        self._forget = _overridden(backfill.forget, BackfillPolicy.forget)
        self._backfill_ended = _overridden(backfill.ended, BackfillPolicy.ended)
        self._observe = None if cosched is None else _overridden(cosched.observe, CoschedulePolicy.observe)
        self._ran = _overridden(queue_policy.ran, QueuePolicy.ran)
        self.charged: list[tuple[int, float, float, float]] = []
        """What each job ran with what quota, as this step found it, (job id, CPUs, since, until): a
        daemon saves it in the pass's transaction and a restart tells the queue policy again
        (`QueuePolicy.ran`), so fair-share counts after a restart what it counted live."""

    # -- the contract -------------------------------------------------------
    def step(self, now: float, events: list[Event]) -> Decision:
        """Apply what happened, then decide what to do at `now`."""
        actions: list[Action] = []
        self.charged = []
        since, self._stepped = self._stepped, now
        sharing = bool(self.guests)  # before the events: a host's end empties `guests`
        if self._period and not self.queue:
            # A window opens with the first job queued: the jobs arriving now start together
            # at the next boundary (now, if it is one).
            self._next_window = math.ceil(now / self._period) * self._period
        for event in events:
            # The three events of every replayed job skip the handler table.
            if isinstance(event, JobSubmitted):
                self._on_submitted(event, now, actions)
            elif isinstance(event, Offer):
                self.pool.add(event.slots, event.memory)
                self._view.epoch += 1
            elif isinstance(event, JobEnded):
                self._on_ended(event, now, actions)
            else:
                self._handlers[type(event)](event, now, actions)
        if sharing and actions:
            # A host and its guest can end in one step: no quota change for a job already gone.
            actions = [a for a in actions if not isinstance(a, SetQuota) or a.job_id in self.jobs]
        windows = self.windows
        if windows.held or windows.deadlines or self._period:
            return self._timed_pass(now, since, actions)
        busy = self.queue and (self.pool.free_units or self._cosched_active or self.backfill.serves_head)
        return Decision(actions, self._schedule(now, actions) if busy else _NONE)

    def _timed_pass(self, now: float, since: float, actions: list[Action]) -> Decision:
        """A pass with times to keep: held jobs' begins, latest starts, placement windows.

        The pass stands for the time since the core last stepped (`since`), `late_grace` at most:
        a job whose latest start fell in it has this pass as its last chance. Replay steps at each
        latest start (`wake_at`); the daemon's passes are up to an interval apart, and one that
        expired such a job before trying it failed a job whose cores an end had freed before its
        latest start (that end is in this pass). One whose latest start came before never starts."""
        windows = self.windows
        if windows.held:
            for job in windows.due(now):  # their begin came: they enter the queue as arrivals do
                self._enqueue(job, now)
        if windows.watching:
            self._expire(now, actions, at_now=False, passed=max(since, now - self.late_grace))
        busy = self.queue and (self.pool.free_units or self._cosched_active or self.backfill.serves_head)
        wake = windows.next_time(now) if windows.watching or windows.held else math.inf
        if self._period and not busy and self.queue and now >= self._next_window:
            # A boundary passed with no core to serve its window: the queue waits for the next
            # one, not for the first pass mid-window that finds a core (which started a job that
            # arrived after the boundary before its own: seen in CI).
            self._next_window = (math.floor(now / self._period) + 1) * self._period
        if self._period and busy and now < self._next_window:
            if windows.watching:
                self._expire(now, actions, at_now=True)
                wake = windows.next_time(now)
            return Decision(actions, _NONE, min(self._next_window, wake))  # collecting until the window ends
        reservations = self._schedule(now, actions) if busy else _NONE
        if windows.watching:
            self._expire(now, actions, at_now=True)  # this pass was their last chance
            wake = windows.next_time(now)
        if self._period and busy:
            self._next_window = (math.floor(now / self._period) + 1) * self._period
            return Decision(actions, reservations, min(self._next_window if self.queue else math.inf, wake))
        if self._period and self.queue:  # no core free: the next boundary moves the window on (above), as the
            wake = min(self._next_window, wake)  # daemon's pass then does; replay passed at the next end instead
        return Decision(actions, reservations, wake)

    @property
    def withheld(self) -> Mapping[int, int]:
        """Running jobs' units their ends will not give back (`withhold`), read-only."""
        return MappingProxyType(self._withheld)

    def view(self, now: float) -> SchedulerView:
        """The policies' view of the state at `now` (queue in policy order).

        One view object is reused across passes; it is only valid until the next.
        """
        view = self._view
        view.now = now
        view.queue = self.queue
        if not self.queue_policy.static:
            view.epoch += 1  # the order may change with time alone
        if self._waiting is not None:
            view.queue = self._waiting.order(self.queue, now, self.backfill.reads_queue)
        else:
            view.queue = self.queue_policy.order(self.queue, view)
        if self.limit is not None:
            view.queue = self._within_limit(view, view.queue)
        return view

    def _watch_limits(self, job: Job) -> None:
        """A job with a throttle brings the caps' bookkeeping, where none was needed so far: its
        workflow's jobs are counted from its own start on, the first of them to run."""
        if job.throttle and self.limit is None:
            self.limit = Limits()

    def _within_limit(self, view: SchedulerView, order: Sequence[Job]) -> Sequence[Job]:
        """`order` less the jobs whose start would break a cap: out of the policies' sight for this
        pass, as held jobs are (`_leave_out`)."""
        assert self.limit is not None
        admits = self.limit.admits
        return self._leave_out(view, order, {job.id for job in order if not admits(job)})

    # -- events -------------------------------------------------------------
    def _on_submitted(self, event: JobSubmitted, now: float, actions: list[Action]) -> None:
        job = event.job
        if job.id in self.jobs:
            raise SchedulingError(f"job {job.id} submitted twice")
        job.need = need = self.cluster.units_for(job)
        if (
            not (0 < need <= self._capacity and job.walltime > 0)
            or (job.memory and self._memory_tracked)
            or not job.span
        ):
            reason = self._never_fits(job)
            if reason:
                job.state = JobState.FAILED
                actions.append(Reject(job, reason))
                return
        self._watch_limits(job)
        if self.limit is not None and (refusal := self.limit.refusal(job)):
            job.state = JobState.FAILED
            actions.append(Reject(job, refusal))
            return
        job.estimate = self.estimator.estimate(job)
        job.state = JobState.PENDING
        self.jobs[job.id] = job
        if job.latest_start < math.inf:
            self.windows.watch(job)
        if job.begin > now:
            self.windows.hold(job)  # out of the policies' sight until its begin
            return
        self._enqueue(job, now)

    def _enqueue(self, job: Job, now: float) -> None:
        """Put a pending job in the queue (at its place for a static queue policy)."""
        queue = self.queue
        if not self.queue_policy.static:
            queue.append(job)
            if self._waiting is not None:
                self._waiting.append(job)
            return
        job.priority = priority = self.queue_policy.score(job, now)
        if not queue or queue[-1].priority <= priority:
            queue.append(job)
        else:
            insort(queue, job, key=_priority)
            self._view.epoch += 1

    def _on_ended(self, event: JobEnded, now: float, actions: list[Action]) -> None:
        job = self.jobs.pop(event.job_id, None)
        if job is None or job.state is not JobState.RUNNING:
            raise SchedulingError(f"job {event.job_id} ended but was not running")
        job.end = now if event.at is None else event.at
        if self._backfill_ended is not None:
            self._backfill_ended(job, job.host >= 0 or job.id in self.guests)
        self._leave_running(job, job.end, now, actions)
        job.state = self.end_state(job.id, event.failed)
        self._killing.discard(job.id)
        self._view.epoch += 1
        if self._observe is not None:
            self._observe(job, now)

    def end_state(self, job_id: int, failed: bool, cancel_asked: bool = False) -> JobState:
        """What a running job's end leaves it: cancelled if a cancel was killing it (or is asked in
        the step that takes the end, before it: `cancel_asked`), else failed or done. A caller that
        acts on an end in the step that takes it (the daemon releases the next workflow stage into
        that step, as replay does) asks this one rule first."""
        if cancel_asked or job_id in self._killing:
            return JobState.CANCELLED
        return JobState.FAILED if failed else JobState.DONE

    def _on_cancelled(self, event: JobCancelled, now: float, actions: list[Action]) -> None:
        job = self.jobs.get(event.job_id)
        if job is None:
            return  # already finished: cancelling is idempotent
        if job.state is JobState.RUNNING:
            if job.id not in self._killing:
                self._killing.add(job.id)
                actions.append(Kill(job.id))  # it leaves `running` when the backend reports the end
            return
        self._leave_pending(job, JobState.CANCELLED, now)

    def is_held(self, job_id: int) -> bool:
        """Whether the user holds this job (`JobHeld`)."""
        return job_id in self._held_begins

    def begin_once_released(self, job: Job) -> float:
        """The begin a job the user holds gets back when released (a held one's is +inf)."""
        return self._held_begins.get(job.id, job.begin)

    def _on_held(self, event: JobHeld, now: float, actions: list[Action]) -> None:
        """A pending job leaves the queue (or, held until its begin, stays held past it) until
        released: its begin becomes +inf, the one it had is kept for the release."""
        job = self.jobs.get(event.job_id)
        if job is None or job.state is not JobState.PENDING or job.id in self._held_begins:
            return  # ended, running, or held already: holding is idempotent
        self._held_begins[job.id] = job.begin
        if not self.windows.drop(job):
            self._unqueue(job)
            self.backfill.forget(job)
        job.begin = math.inf
        self.windows.hold(job)
        self._view.epoch += 1

    def _on_released(self, event: JobReleased, now: float, actions: list[Action]) -> None:
        job = self.jobs.get(event.job_id)
        if job is None or event.job_id not in self._held_begins:
            return  # not held by the user: releasing is idempotent
        job.begin = self._held_begins.pop(job.id)
        self.windows.drop(job)
        if job.begin > now:
            self.windows.hold(job)
        else:
            self._enqueue(job, now)
        self._view.epoch += 1

    def _leave_pending(self, job: Job, state: JobState, now: float) -> None:
        """A pending job (queued, or held until its begin) is over before it started."""
        del self.jobs[job.id]
        self._held_begins.pop(job.id, None)
        if not self.windows.drop(job):
            self._unqueue(job)
        self._view.epoch += 1
        self.backfill.forget(job)
        job.state = state
        job.end = now

    def _expire(self, now: float, actions: list[Action], *, at_now: bool, passed: float | None = None) -> None:
        """Pending jobs whose latest start passed (before `passed`, by default `now`; or is then, once
        the pass is over) fail at `now` with a `Reject`, as refusals do: OSDEC's X_it = 0 for t > l_i."""
        for job in self.windows.expired(now if passed is None else passed, at_now=at_now):
            if job.id not in self.jobs:
                continue
            self._leave_pending(job, JobState.FAILED, now)
            # counted from its submission: the daemon's clock is epoch seconds, which a reader cannot place
            after = job.latest_start - job.submit
            why = f"job {job.id} did not start by its latest start, {after:.0f} s after its submission"
            actions.append(Reject(job, why))

    def _on_usage(self, event: UsageReported, now: float, actions: list[Action]) -> None:
        job = self.jobs.get(event.job_id)
        if job is not None and job.state is JobState.RUNNING:
            job.usage = event.usage

    def _on_adopted(self, event: JobAdopted, now: float, actions: list[Action]) -> None:
        job = event.job
        if job.id in self.jobs:
            raise SchedulingError(f"job {job.id} adopted twice")
        job.need = self.cluster.units_for(job)
        job.estimate = self.estimator.estimate(job)
        job.expected_end = job.start + job.estimate
        job.state = JobState.RUNNING
        self.jobs[job.id] = job
        if job.quota_since < job.start:  # the daemon says when its quota last changed, if it did
            job.quota_since = job.start
        self._watch_limits(job)
        if self.limit is not None:
            self.limit.took(job)
        if job.host >= 0:
            if job.host not in self.jobs:
                raise SchedulingError(f"guest {job.id} adopted before its host {job.host}")
            self.guests.setdefault(job.host, []).append(job)
            memory = slot_memory(self.cluster, job, job.slots)
            if memory is not None:
                self.pool.take_memory([node for node, _ in job.slots], memory)
        else:
            insort(self.running, job, key=_expected_end)
        self._view.epoch += 1

    def _on_updated(self, event: JobUpdated, now: float, actions: list[Action]) -> None:
        """A new walltime: a queued job takes its place anew (SJF and WFP order by it, backfilling
        fits by it), a running one's expected end moves (reservations count on it); a plan kept
        from earlier passes is dropped. A guest is no part of the running list: its host is."""
        job = self.jobs.get(event.job_id)
        if job is None or not (event.walltime > 0 and math.isfinite(event.walltime)):
            return
        queued = job.state is JobState.PENDING and job.id not in self.windows.held
        running = job.state is JobState.RUNNING and job.host < 0
        if queued:
            self._dequeue(job)
        elif running:
            self._remove_running(job)
        job.walltime = event.walltime
        job.estimate = self.estimator.estimate(job)
        if job.state is JobState.RUNNING:
            job.expected_end = job.start + job.estimate
        if queued:
            self._enqueue(job, now)
        elif running:
            insort(self.running, job, key=_expected_end)
        self.backfill.reestimated(job)
        self._view.epoch += 1

    def _on_requeued(self, event: JobRequeued, now: float, actions: list[Action]) -> None:
        job = self.jobs.get(event.job_id)
        if job is None or job.state is not JobState.RUNNING:
            raise SchedulingError(f"job {event.job_id} requeued but was not running")
        if job.id in self._killing:  # it was being cancelled: its run is over, and so is the job
            self._on_ended(JobEnded(job.id, failed=True, at=now), now, actions)
            return
        # Its slots are not given back (its machine may be gone): a plan kept between passes is
        # rebuilt from what is free, as after a shared end.
        self.backfill.ended(job, True)
        self._leave_running(job, now, now, actions)  # the lost run used its cores all the same
        if self.cosched is not None:
            self.cosched.requeued(job, now)
        job.state = JobState.PENDING
        job.start = job.end = -1.0
        job.expected_end = math.inf
        job.slots = ()
        job.quota = 0.0
        job.quota_since = -1.0
        job.host = -1
        job.usage = None
        queue = self.queue
        if self.queue_policy.static:
            insort(queue, job, key=_place)
        else:
            queue.append(job)
            if self._waiting is not None:  # an aging policy's arrays follow the queue, entry for entry
                self._waiting.append(job)
        self.windows.watch(job)  # it must still start by its latest start, or fail
        self._view.epoch += 1

    def started(self, job_id: int, at: float) -> None:
        """A backend says when a launched job's container started, a launch's latency after the
        decision (seconds on Mesos): its runtime, its quota and its expected end count from there,
        so a reservation does not count on its cores before its end can free them."""
        job = self.jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING or at == job.start:
            return
        listed = job.host < 0  # hosts and ordinary jobs are in `running`, guests with their host
        if listed:
            self._remove_running(job)
        job.start = at
        job.quota_since = max(job.quota_since, at)
        job.expected_end = at + job.estimate
        if listed:
            insort(self.running, job, key=_expected_end)
        self._view.epoch += 1

    def _leave_running(self, job: Job, end: float, now: float, actions: list[Action]) -> None:
        """A run is over at `end`: the queue policy is told (fair-share counts it), its user's cores
        come back under the cap, a guest leaves its host's allocation, a host the running set, and
        a host's guests keep their slots as ordinary jobs."""
        self._charge(job, end)
        if self.limit is not None:
            self.limit.gave_back(job)
        if job.host >= 0:
            self._guest_ended(job, end, actions)
        else:
            self._remove_running(job)
        if self.guests:
            self._adopt_guests(job, end, actions)

    def _requota(self, job: Job, quota: float, at: float) -> None:
        """A running job's CPU quota changes `at` (a lending began or ended): the queue policy is
        told what it had until then (`QueuePolicy.ran`), so fair-share charges each job the CPU it
        was given and a lent core is charged once, to whoever had it."""
        self._charge(job, at)
        job.quota = quota
        job.quota_since = at

    def _charge(self, job: Job, until: float) -> None:
        """What `job` ran since its quota last changed: told to the queue policy, if it counts
        usage, and kept in `charged` whether or not (a daemon that turns fair-share on later
        counts what ran before)."""
        if self._ran is not None:
            self._ran(job, job.quota_since, until, job.quota)
        self.charged.append((job.id, job.quota, job.quota_since, until))

    def _guest_ended(self, guest: Job, end: float, actions: list[Action]) -> None:
        """A guest left its host's allocation: the host gets its CPU back."""
        host = self.jobs.get(guest.host)
        self.guests[guest.host].remove(guest)
        if host is not None:
            self._requota(host, host_quota(host, self.guests[guest.host]), end)
            actions.append(SetQuota(host.id, host.quota, host.quota_since))
        if not self.guests[guest.host]:
            del self.guests[guest.host]
        memory = slot_memory(self.cluster, guest, guest.slots)
        if memory is not None:
            self.pool.give_memory([node for node, _ in guest.slots], memory)

    def _adopt_guests(self, host: Job, end: float, actions: list[Action]) -> None:
        """The host ended first (at `end`): its guests keep their slots as ordinary jobs.

        The backend offers the rest of the host's allocation; each guest's memory
        was reserved when it arrived and comes back with its own end.
        """
        for guest in self.guests.pop(host.id, ()):
            guest.host = -1
            self._requota(guest, float(guest.cores), end)
            actions.append(SetQuota(guest.id, guest.quota, guest.quota_since))
            insort(self.running, guest, key=_expected_end)

    def _on_offer(self, event: Offer, now: float, actions: list[Action]) -> None:
        self.pool.add(event.slots, event.memory)
        self._view.epoch += 1

    def withhold(self, units: Mapping[int, int]) -> None:
        """Say which running jobs' ends will give back less than they hold, in units by job id (those
        on a node being drained, or that another framework took meanwhile: the backend's `Offer`
        at their end leaves them out). Reservations then never count on those units. Replaces what
        was said before; the backend says it again whenever it changes."""
        if units != self._withheld:
            self._withheld.clear()
            self._withheld.update(units)
            self._view.epoch += 1

    def _on_rescind(self, event: Rescind, now: float, actions: list[Action]) -> None:
        self.pool.remove(event.slots, event.memory)
        self._view.epoch += 1

    # -- the pass -----------------------------------------------------------
    def _schedule(self, now: float, actions: list[Action]) -> Mapping[int, float]:
        view = self.view(now)
        pool, place = self.pool, self._place
        if self.queue_policy.one_by_one:
            view = self._serve_one_by_one(view, now, actions)
        order = full = view.queue
        if self._period:  # a window serves the jobs that came by its boundary; later ones, the next
            boundary = self._next_window
            order = self._leave_out(view, order, {job.id for job in order if job.submit > boundary})
        watching = bool(self.windows.deadlines)
        if watching:
            order = self._reservable(view, order, ())
        head = 0
        late_before: set[int] | None = None
        while True:
            n = len(order)
            while head < n and not self.backfill.serves_head:
                job = order[head]
                if self.limit is not None and not self.limit.admits(job):  # its user's last start filled the cap
                    order = view.queue = [*order[:head], *self._within_limit(view, order[head:])]
                    n = len(order)
                    continue
                if job.need > pool.free_units:
                    break
                slots = place(job, pool)
                if slots is None:
                    break
                self._launch(job, slots, now, actions)
                head += 1
            plan = (
                self.backfill.plan(view, head) if head < n and (pool.free_units or self.backfill.serves_head) else None
            )
            if not watching or plan is None:
                break
            late = set(self._late(plan))
            if not late or (late_before is not None and late <= late_before):
                break  # (a policy that reserves again what it forgot gets no second try)
            late_before = late | (late_before or set())
            order = self._reservable(view, order, list(late))  # plan again without them
        self._dequeue_prefix(order, head)
        reservations = _NONE
        if plan is not None:
            reservations = plan.reservations
            started = self._start_planned(plan.start, now, actions)
            while started and self.backfill.one_by_one and pool.free_units and self.queue:
                view = self.view(now)
                if watching:
                    self._reservable(view, view.queue, ())
                plan = self.backfill.plan(view, 0)
                reservations = plan.reservations or reservations
                started = self._start_planned(plan.start, now, actions)
        if self._started:
            self._arrange()
        if self._cosched_active and self.queue:
            promises = None
            if self.keep_promises:
                waiting = islice((job for job in order if job.state is JobState.PENDING), 2)
                standing = reservations if plan is not None else self.backfill.reservations
                promises = Promises(view, waiting, standing)
            self._coschedule(view, full, now, actions, promises)
        return reservations

    def _reservable(self, view: SchedulerView, order: Sequence[Job], late: Sequence[int]) -> Sequence[Job]:
        """`order` without the jobs no reservation may be made for: those in `late` and those
        that cannot fit by their latest start (`cosched.core.windows.doomed`). They stay queued
        (a job may still start in time if others end early) but hold no one back; a policy that
        kept a reservation for one forgets it. The view's queue becomes the result."""
        return self._leave_out(view, order, set(late) | doomed(view, order))

    def _leave_out(self, view: SchedulerView, order: Sequence[Job], out: set[int]) -> Sequence[Job]:
        """`order` without the jobs in `out`, which stay queued but hold no one back this pass: a
        policy that kept a reservation for one forgets it. The view's queue becomes the result."""
        if not out:
            return order
        if self._forget is not None:
            for job_id in out:
                self._forget(self.jobs[job_id])
        kept = [job for job in order if job.id not in out]
        view.queue = kept
        view.epoch += 1
        return kept

    def _late(self, plan: BackfillPlan) -> list[int]:
        """Jobs the plan reserved for after their latest start: they would expire first."""
        jobs = self.jobs
        return [
            job_id
            for job_id, at in plan.reservations.items()
            if job_id in jobs and at > jobs[job_id].latest_start and jobs[job_id].state is JobState.PENDING
        ]

    def _start_planned(self, jobs: Sequence[Job], now: float, actions: list[Action]) -> bool:
        """Launch each job a backfill plan returned that still fits; whether any started."""
        pool, place = self.pool, self._place
        started = False
        limit = self.limit
        for job in jobs:
            if limit is not None and not limit.admits(job):
                continue
            slots = place(job, pool) if job.need <= pool.free_units else None
            if slots is not None:
                self._launch(job, slots, now, actions)
                self._dequeue(job)
                started = True
        return started

    def _serve_one_by_one(self, view: SchedulerView, now: float, actions: list[Action]) -> SchedulerView:
        """Start the job a one-by-one queue policy puts first while it fits, asking it again
        after each start; the view returned holds its last answer, which starts nothing."""
        pool = self.pool
        while view.queue:
            job = view.queue[0]
            slots = self._place(job, pool) if job.need <= pool.free_units else None
            if slots is None:
                break
            self._launch(job, slots, now, actions)
            self._dequeue(job)
            view = self.view(now)
        return view

    # -- co-scheduling ------------------------------------------------------
    def _coschedule(
        self,
        view: SchedulerView,
        order: Sequence[Job],
        now: float,
        actions: list[Action],
        promises: Promises | None,
    ) -> None:
        """Offer the first queued jobs that did not start to the co-scheduling policy
        (with `keep_promises`, on hosts where they keep the backfill's promises)."""
        assert self.cosched is not None
        # A snapshot: co-locating a guest removes it from the queue `order` may be.
        pending = (job for job in order if job.state is JobState.PENDING and job.coschedule)
        window = list(islice(pending, self.window))
        candidates = self.cosched.candidates
        # The hosts with room for a guest of each size, in running order, listed once a pass: asking
        # every pair of a thousand hosts and the window made most of a pass. The lists go stale as
        # guests arrive; `_can_host` checks each pair all the same.
        open_hosts = [h for h in self.running if h.coschedule and len(self.guests.get(h.id, ())) < self.sharing - 1]
        fitting: dict[int, list[Job]] = {}
        last = self.not_lent
        self.not_lent = not_lent = {}
        why_closed: dict[int, str] = {}  # by size: none of that size takes a guest (`_no_open_host`)
        for guest in window:
            if self.limit is not None and not self.limit.admits(guest):
                not_lent[guest.id] = "its user's limits"
                continue
            large = fitting.get(guest.cores)
            if large is None:
                large = fitting[guest.cores] = [h for h in open_hosts if h.cores >= guest.cores]
            asked = candidates(guest, large)
            roomy = [h for h in asked if self._can_host(h, guest)]
            hosts = roomy if promises is None else [h for h in roomy if promises.allow(guest, h)]
            if not hosts:
                if large:
                    # Asked every host before and lent nothing: still what stands (ASAx asks each once).
                    kept = not asked and last.get(guest.id) == _LENT_NOTHING
                    not_lent[guest.id] = _LENT_NOTHING if kept else self._why_no_host(asked, roomy)
                    continue
                if guest.cores not in why_closed:
                    why_closed[guest.cores] = self._no_open_host(guest.cores)
                not_lent[guest.id] = why_closed[guest.cores]
                continue
            lending = self.cosched.lend(view, guest, hosts)
            if lending is None:
                not_lent[guest.id] = _LENT_NOTHING
            elif not self._colocate(guest, lending.host, lending.fraction, now, actions):
                not_lent[guest.id] = _NO_MEMORY
            elif promises is not None:
                promises.took(guest, lending.host)

    def _why_no_host(self, asked: Sequence[Job], roomy: Sequence[Job]) -> str:
        """Why no running job that takes guests of its size may host a job: the first of the core's
        checks after size that left none."""
        if not asked:
            return "no host to ask now: each was asked before, or has no usage sample yet"
        if roomy:
            return "a guest there would delay a reserved start"
        full = sum(len(self.guests.get(h.id, ())) >= self.sharing - 1 for h in asked)  # guests placed this pass
        if full == len(asked):
            return _GUESTS_ALREADY
        return _NO_MEMORY if not full else f"{_NO_MEMORY}; the others have their guests already"

    def _no_open_host(self, cores: int) -> str:
        """Why no running job of `cores` or more takes a guest now (a template, `not_lent`)."""
        large = [h for h in self.running if h.cores >= cores]
        if not large:
            return "no running job of {cores}+ cores"
        if not any(h.coschedule for h in large):
            return "the running jobs of {cores}+ cores do not lend (--no-cosched)"
        return _GUESTS_ALREADY

    def _can_host(self, host: Job, guest: Job) -> bool:
        if not host.coschedule or host.cores < guest.cores or len(self.guests.get(host.id, ())) >= self.sharing - 1:
            return False
        share = _share(host.slots, guest.cores)
        memory = slot_memory(self.cluster, guest, share)
        return memory is None or all(
            self.pool.free_mem[node] >= mib for (node, _), mib in zip(share, memory, strict=True)
        )

    def _colocate(self, guest: Job, host: Job, fraction: float, now: float, actions: list[Action]) -> bool:
        if not 0.0 < fraction < 1.0:
            raise SchedulingError(f"lending fraction must be in (0, 1), got {fraction}")
        slots = _share(host.slots, guest.cores)
        memory = slot_memory(self.cluster, guest, slots)
        if memory is not None and not self.pool.take_memory([node for node, _ in slots], memory):
            return False
        quota = min(fraction * host.cores, float(guest.cores), host.quota)
        guest.quota = quota
        guest.quota_since = now
        guest.host = host.id
        guest.slots = slots
        guest.state = JobState.RUNNING
        guest.start = now
        guest.expected_end = now + guest.estimate
        self.guests.setdefault(host.id, []).append(guest)
        self._requota(host, host_quota(host, self.guests[host.id]), now)
        if self.limit is not None:
            self.limit.took(guest)
        self._dequeue(guest)
        self._view.epoch += 1
        actions.append(SetQuota(host.id, host.quota, host.quota_since))
        actions.append(Colocate(guest, host.id, slots, quota))
        return True

    def _dequeue_prefix(self, order: Sequence[Job], count: int) -> None:
        """Remove the first `count` jobs of `order`, which were just started."""
        if not count:
            return
        self._view.epoch += 1  # positions shift
        forget = self._forget
        if forget is not None:
            for job in order[:count]:
                forget(job)
        if order is self.queue:
            del self.queue[:count]
        elif isinstance(order, Ordered) and self._waiting is not None:
            for index in sorted(order.positions(count), reverse=True):
                del self.queue[index]
                self._waiting.delete(index)
        else:
            for job in order[:count]:
                self._unqueue(job)

    def _dequeue(self, job: Job) -> None:
        self._unqueue(job)
        if self._forget is not None:
            self._forget(job)

    def _unqueue(self, job: Job) -> None:
        if self._waiting is None:
            self.queue.remove(job)
            return
        index = self.queue.index(job)
        del self.queue[index]
        self._waiting.delete(index)

    def _launch(self, job: Job, slots: tuple[tuple[int, int], ...], now: float, actions: list[Action]) -> None:
        self.pool.remove(slots, slot_memory(self.cluster, job, slots) if self._memory_tracked else None)
        job.state = JobState.RUNNING
        job.start = now
        job.slots = slots
        job.quota = float(job.cores)
        job.quota_since = now
        job.expected_end = now + job.estimate
        insort(self.running, job, key=_expected_end)
        if self.limit is not None:
            self.limit.took(job)
        launch = Launch(job, slots)
        actions.append(launch)
        if self._joint:
            self._started.append(launch)
        self._view.epoch += 1

    def _arrange(self) -> None:
        """A joint placement re-places the pass's starts together (before any guest is put on
        their cores): their slots go back to the pool, and come out again as it arranges them."""
        launches, self._started = self._started, []
        if len(launches) < 2:
            return
        pool, cluster, tracked = self.pool, self.cluster, self._memory_tracked
        jobs = [launch.job for launch in launches]
        for job in jobs:
            pool.add(job.slots, slot_memory(cluster, job, job.slots) if tracked else None)
        arranged = self.placement.arrange(jobs, pool)
        if arranged is None or len(arranged) != len(jobs):
            arranged = [job.slots for job in jobs]
        for launch, job, slots in zip(launches, jobs, arranged, strict=True):
            if sum(cores for _, cores in slots) != sum(cores for _, cores in job.slots):
                raise SchedulingError(f"placement {self.placement.name!r} gave job {job.id} another size")
            pool.remove(slots, slot_memory(cluster, job, slots) if tracked else None)
            job.slots = launch.slots = slots

    def _remove_running(self, job: Job) -> None:
        running = self.running
        i = bisect_left(running, job.expected_end, key=_expected_end)
        while running[i] is not job:
            i += 1
        del running[i]

    def _never_fits(self, job: Job) -> str:
        cluster = self.cluster
        if job.cores <= 0:
            return f"job {job.id} asks for {job.cores} cores"
        if job.walltime <= 0:
            return f"job {job.id} asks for walltime {job.walltime}"
        if job.need > cluster.capacity_units:
            return f"job {job.id} needs {job.need} {cluster.allocation.value}s, cluster has {cluster.capacity_units}"
        if not job.span and job.cores > cluster.cores_per_node:
            return f"job {job.id} needs {job.cores} cores on one node, nodes have {cluster.cores_per_node}"
        if job.memory and cluster.memory_per_node:
            per_node = cluster.memory_on_one_node(job.cores, job.memory)
            if per_node > cluster.memory_per_node:
                return f"job {job.id} needs {per_node} MiB on a node, nodes have {cluster.memory_per_node}"
        return ""


_NO_MEMORY = "no host with its memory free beside it"
_GUESTS_ALREADY = "each running job of {cores}+ cores that lends has its guests already (sharing = {sharing})"
_LENT_NOTHING = "{policy} decided not to lend to it (cosched explain {job})"


def host_quota(host: Job, guests: Iterable[Job]) -> float:
    """A host's CPU quota: its cores less what its guests were lent. The one rule, whether a lending
    begins or ends, or a restart adopts them: worked out anew each time, not added to and taken
    from, so that a host whose guests are gone has exactly its cores again."""
    return float(host.cores) - sum(guest.quota for guest in guests)


def _overridden(hook: Callable[..., None], default: Callable[..., None]) -> Callable[..., None] | None:
    """`hook`, a plugin's bound method, or None where it is the base class's no-op `default`."""
    return None if getattr(hook, "__func__", None) is default else hook


def _share(slots: Slots, cores: int) -> Slots:
    """The first `cores` cores of an allocation: where a guest of that size runs."""
    share = []
    for node, have in slots:
        take = min(have, cores)
        share.append((node, take))
        cores -= take
        if cores == 0:
            break
    return tuple(share)

"""The small protocols every scheduling plugin implements.

Each kind is a base class with one pure method: it reads a `SchedulerView`
and returns an answer; it never touches a backend. The core calls them, and
registering a new one (an entry point or a `module:Class` string) never
touches the loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

from cosched.core.events import Slots
from cosched.core.pool import ResourcePool
from cosched.core.view import SchedulerView
from cosched.model import Job


class QueuePolicy(ABC):
    """Decides which pending job is served first.

    Most policies are a priority `score` (lower runs first, as in the RL
    backfilling paper's Table 3). A `static` score ignores `now`, which lets the
    core keep its queue sorted on insertion instead of sorting at every pass;
    learned policies that look at a window of the queue override `order`.
    """

    name: ClassVar[str] = ""
    static: ClassVar[bool] = True
    one_by_one: ClassVar[bool] = False
    """A policy that chooses one job at a time (a learned one, DBF): the core starts the first
    job `order` returns if it fits, then asks again with the view as it now is; an empty
    order, or a first job that does not fit, ends the serving for this pass (DBF's forward)."""

    history: float = 0.0
    """Seconds of past runs `ran` should be told of when a daemon restarts (0: none)."""

    @abstractmethod
    def score(self, job: Job, now: float) -> float:
        """Priority of `job` at `now`; the lowest score is the head."""

    def ran(self, job: Job, start: float, end: float, cpus: float) -> None:  # noqa: B027 - optional hook
        """`job` ran with `cpus` CPUs of quota from `start` to `end`: its run ended (or was
        requeued), or a lending changed its quota then (each such stretch is told once).

        Why a hook: a priority that depends on what a user already used (fair-share) must
        count every run, and only the core sees every end and every lending in both worlds.
        Why by quota: a lent core is given to one job at a time, and is charged to that one."""

    def order(self, queue: Sequence[Job], view: SchedulerView) -> Sequence[Job]:
        """The queue in service order. `queue` is in arrival order, or already
        sorted by `score` when the policy is static."""
        if self.static:
            return queue
        now, score = view.now, self.score
        return sorted(queue, key=lambda job: score(job, now))


class AgingPolicy(QueuePolicy):
    """A priority that grows with waiting time: score = growth(waited) * weight(job).

    The core keeps each waiting job's weight and submit time in arrays
    (`cosched.core.waiting`), so a pass scores a long queue in a few vector operations
    instead of a Python call per job. `growth` must therefore work on a number and on a
    numpy array alike; `score` is the same product, one job at a time.
    """

    static: ClassVar[bool] = False

    @abstractmethod
    def weight(self, job: Job) -> float:
        """The part of the score that does not change while the job waits."""

    @abstractmethod
    def growth(self, waited: Any) -> Any:
        """How the score grows with the seconds waited (a number or an array of them)."""

    def score(self, job: Job, now: float) -> float:
        return self.growth(now - job.submit) * self.weight(job)


class BackfillPlan(NamedTuple):
    """Jobs to start now out of order, and the reservations that justified it."""

    start: list[Job]
    reservations: Mapping[int, float]


NO_BACKFILL = BackfillPlan([], MappingProxyType({}))


class BackfillPolicy(ABC):
    """Chooses jobs behind a blocked head that may start now.

    A policy that keeps reservations for jobs behind the head (conservative)
    sets `serves_head`: the core then starts nothing on its own and asks the
    policy with `head = 0`, since even an in-order start could take capacity
    reserved for another job, and asks at every pass, even while nothing is
    free, so a job gets its reservation when it arrives. Other policies are
    asked only while something is free: with nothing free they start nothing.
    """

    name: ClassVar[str] = ""
    serves_head: ClassVar[bool] = False
    one_by_one: ClassVar[bool] = False
    """A policy that starts one job per plan (RLBackfilling's agent): after each start the core
    plans again with the view as it now is, until a plan starts nothing."""
    reads_queue: ClassVar[bool] = True
    """Whether `plan` reads the queue past the head. A policy that does not lets the core
    order a queue whose order changes with time only as far as it starts jobs."""

    @abstractmethod
    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        """`view.queue[head]` is the first job in order that does not fit now
        (or 0 for a policy that `serves_head`).

        Returned jobs must come from `view.queue[head:]`, in the order they
        should be tried; the core launches each that still fits.
        """

    def reserved_start(self, view: SchedulerView, job: Job) -> float | None:
        """The start this policy promises `job`, the blocked head, by its own rule, for `cosched
        queue` (as `squeue --start`) while no pass asks it for a plan (nothing free, or nothing to
        backfill); None: it promises the head nothing."""
        return None

    def forget(self, job: Job) -> None:  # noqa: B027 - optional hook, most policies keep no state
        """A job left the queue (started, cancelled, rejected): drop any state on it."""

    def ended(self, job: Job, shared: bool) -> None:  # noqa: B027 - optional hook, as `forget`
        """A running job ended (`end` set), maybe before its `expected_end`. `shared`: it ran
        as a co-scheduled guest or hosted one, so what its end frees is not simply its units
        (`cosched.core.frees`). A policy that keeps a plan learns here what came free early."""

    def reestimated(self, job: Job) -> None:  # noqa: B027 - optional hook, as `forget`
        """A queued or running job's estimate changed (its walltime was updated): a plan kept
        from earlier passes that counted on the old one no longer holds."""

    @property
    def reservations(self) -> Mapping[int, float]:
        """Starts promised in earlier passes that still stand (conservative backfilling's);
        none for a policy that promises anew in each pass it plans (EASY)."""
        return {}


class Estimator(ABC):
    """Predicts a job's runtime once, at submission (what backfilling plans with)."""

    name: ClassVar[str] = ""

    @abstractmethod
    def estimate(self, job: Job) -> float:
        """Seconds the job is expected to run; must be > 0."""

    def bind_truth(self, truth: Mapping[int, float | None]) -> None:  # noqa: B027 - optional hook
        """Replay hands every estimator the true runtimes by job id (a job's own `runtime` is
        None until it ends); only an oracle (EASY-AR's `actual`) keeps them. The daemon has none."""


class PlacementPolicy(ABC):
    """Picks the slots for a job's whole gang from the held offers.

    A window-based policy (the NSA paper's) places jointly the jobs started together: it sets
    `joint`, and the core calls `arrange` once per pass with the jobs the pass started. A
    `period` makes those passes windows: the core then serves the queue only at multiples of
    `period` seconds, so the jobs that arrive meanwhile are placed together.
    """

    name: ClassVar[str] = ""
    joint: ClassVar[bool] = False
    period: float = 0.0

    @abstractmethod
    def place(self, job: Job, pool: ResourcePool) -> Slots | None:
        """The job's gang, or None when it does not fit whole. Must not change `pool`."""

    def arrange(self, jobs: Sequence[Job], pool: ResourcePool) -> list[Slots] | None:
        """For a `joint` policy: new slots for `jobs`, which one pass started (their slots are
        given back to `pool` for the call), one each and in order, or None to keep theirs.
        Each job must get its `need` in the pool's unit; the core takes them from `pool`."""
        return None


class Lending(NamedTuple):
    """Lend `fraction` of `host`'s allocation to the queued job being placed."""

    host: Job
    fraction: float


class CoschedulePolicy(ABC):
    """Decides whether a queued job that cannot start may share a running job's cores.

    The core offers it a queued job and the running jobs whose allocation could
    hold it (enough cores, memory free on their nodes, no other guest); the
    policy answers with a host and the fraction of the host's CPU to lend, or
    None. Learning policies hear every job's end through `observe`, where the
    lender's loss becomes known.
    """

    name: ClassVar[str] = ""
    active: ClassVar[bool] = True
    """False for space sharing: the core then skips co-scheduling altogether."""

    @abstractmethod
    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        """A host among `hosts` and the fraction of it to lend to `guest`, or None."""

    def candidates(self, guest: Job, running: Sequence[Job]) -> Sequence[Job]:
        """The running jobs worth checking as hosts for `guest` (all of them by default).

        A policy that decides each (guest, host) pair once narrows this to the pairs
        it has not seen, so a pass stays cheap with thousands of running jobs.
        """
        return running

    def observe(self, job: Job, now: float) -> None:  # noqa: B027 - optional hook
        """`job` ended (its `end`, `start` and `state` are set)."""

    def requeued(self, job: Job, now: float) -> None:  # noqa: B027 - optional hook
        """A run of `job` was lost, not ended by the job, and it is queued again; called before its
        run's `start`, `quota` and `host` are cleared. The run says nothing about lending."""

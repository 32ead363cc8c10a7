"""The offer book: which offers to hold, which gangs to launch on them, which to give back. Pure.

Mesos offers resources agent by agent; a job's gang may need several agents at once, and no framework
among Cook, Marathon or Aurora holds offers for that. The book holds an offer only while a queued job
could run a task on its agent, places each job's whole gang first-fit across the agents of the held
offers (in queue order: the caller passes the jobs the core lets start, in its priority order), and
declines the rest with a long refuse filter so other frameworks are not starved. A held offer is given
back after `hold_timeout` with a short filter (the gang did not fit in time; it may fit later). An empty
queue asks for SUPPRESS; a queue with new jobs after that, or after long refuse filters, asks for a
REVIVE, at most one per `revive_interval`.

State and time in, actions out: no I/O, so every rule is unit-tested and the daemon only executes the
actions (ACCEPT per agent, DECLINE, SUPPRESS, REVIVE).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cosched.mesos.offers import Offer

EPSILON = 1e-9
"""Slack for float resource sums (0.1 + 0.2 cpus must host a 0.3-cpu task)."""


@dataclass(frozen=True)
class Demand:
    """A queued job: `tasks` tasks (its gang), each needing `cpus` and `mem` (MiB) on one agent."""

    job_id: str
    tasks: int
    cpus: float
    mem: float

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.cpus < 0 or self.mem < 0 or self.cpus == self.mem == 0:
            raise ValueError(
                f"job {self.job_id}: a gang needs >= 1 task and non-negative cpus and mem per task, not both 0 "
                f"(got tasks={self.tasks}, cpus={self.cpus}, mem={self.mem})"
            )


@dataclass(frozen=True)
class Accept:
    """One ACCEPT: all held offers of one agent, with the tasks to launch there as (job_id, count)."""

    agent_id: str
    offer_ids: tuple[str, ...]
    tasks: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Decline:
    offer_ids: tuple[str, ...]
    refuse_seconds: float


@dataclass(frozen=True)
class Suppress:
    """No queued job: stop offers."""


@dataclass(frozen=True)
class Revive:
    """Queued jobs may need resources we filtered or suppressed: offers again, please."""


Action = Accept | Decline | Suppress | Revive


@dataclass
class _Agent:
    offers: list[Offer]
    cpus: float
    mem: float

    def slots(self, demand: Demand) -> int:
        """How many of `demand`'s tasks fit in what is left on this agent."""
        by_cpus = (self.cpus + EPSILON) // demand.cpus if demand.cpus > 0 else demand.tasks
        by_mem = (self.mem + EPSILON) // demand.mem if demand.mem > 0 else demand.tasks
        return int(max(0, min(by_cpus, by_mem, demand.tasks)))


class OfferBook:
    def __init__(
        self,
        *,
        hold_timeout: float = 30.0,
        refuse_seconds: float = 120.0,
        expired_refuse_seconds: float = 5.0,
        revive_interval: float = 5.0,
    ) -> None:
        self.hold_timeout = hold_timeout
        self.refuse_seconds = refuse_seconds
        self.expired_refuse_seconds = expired_refuse_seconds
        self.revive_interval = revive_interval
        self._held: dict[str, Offer] = {}
        self._suppressed = False
        self._filtered = False
        """A long refuse filter was set since the last REVIVE: new jobs need a REVIVE to see those agents."""
        self._last_revive = float("-inf")
        self._known_jobs: set[str] = set()
        self._revive_wanted = False

    @property
    def held(self) -> tuple[Offer, ...]:
        return tuple(self._held.values())

    def add(self, offers: Iterable[Offer]) -> None:
        """Offers just received (OFFERS event); they are held until the next `decide`."""
        for offer in offers:
            self._held[offer.id] = offer
        self._suppressed = False  # offers only come while not suppressed (e.g. after a re-subscription)

    def rescind(self, offer_id: str) -> None:
        """The master took an offer back (RESCIND): it is no longer ours to use or decline."""
        self._held.pop(offer_id, None)

    def agent_lost(self, agent_id: str) -> None:
        """An agent was removed (FAILURE without executor): its offers are void."""
        for offer_id in [o.id for o in self._held.values() if o.agent_id == agent_id]:
            del self._held[offer_id]

    def decide(self, queue: Sequence[Demand], now: float) -> list[Action]:
        """Place what fits, keep what may still serve a queued job, give back the rest; update state."""
        agents = self._agents()
        placed: dict[str, list[tuple[str, int]]] = {}
        waiting: list[Demand] = []
        for demand in queue:
            plan = self._first_fit(demand, agents)
            if plan is None:
                waiting.append(demand)
                continue
            for agent_id, count in plan.items():
                agents[agent_id].cpus -= count * demand.cpus
                agents[agent_id].mem -= count * demand.mem
                placed.setdefault(agent_id, []).append((demand.job_id, count))

        actions: list[Action] = [
            Accept(agent_id, tuple(o.id for o in agents[agent_id].offers), tuple(tasks))
            for agent_id, tasks in placed.items()
        ]
        expired: list[str] = []
        useless: list[str] = []
        for agent_id, agent in agents.items():
            if agent_id in placed:
                continue  # accepted whole: Mesos declines what the launches leave unused
            if not any(agent.slots(d) for d in waiting):
                useless.extend(o.id for o in agent.offers)
            else:
                expired.extend(o.id for o in agent.offers if now - o.received_at >= self.hold_timeout)
        accepted = [o.id for agent_id in placed for o in agents[agent_id].offers]
        for offer_id in [*accepted, *expired, *useless]:
            del self._held[offer_id]
        if expired:
            actions.append(Decline(tuple(expired), self.expired_refuse_seconds))
        if useless:
            actions.append(Decline(tuple(useless), self.refuse_seconds))
        flow = self._offer_flow(queue, waiting, now)  # judged on the filters of earlier rounds: these saw this queue
        if useless and not flow:
            self._filtered = True
        return actions + flow

    def _agents(self) -> dict[str, _Agent]:
        """Held offers grouped by agent, in the order their first offer arrived (first fit follows it)."""
        agents: dict[str, _Agent] = {}
        for offer in sorted(self._held.values(), key=lambda o: o.received_at):
            agent = agents.setdefault(offer.agent_id, _Agent([], 0.0, 0.0))
            agent.offers.append(offer)
            agent.cpus += offer.cpus
            agent.mem += offer.mem
        return agents

    @staticmethod
    def _first_fit(demand: Demand, agents: dict[str, _Agent]) -> dict[str, int] | None:
        """Tasks per agent for the whole gang, filling agents in order; None when the gang does not fit."""
        plan: dict[str, int] = {}
        left = demand.tasks
        for agent_id, agent in agents.items():
            if left == 0:
                break
            count = min(agent.slots(demand), left)
            if count:
                plan[agent_id] = count
                left -= count
        return plan if left == 0 else None

    def _offer_flow(self, queue: Sequence[Demand], waiting: Sequence[Demand], now: float) -> list[Action]:
        """SUPPRESS when nothing is queued; REVIVE (rate-limited) when new jobs wait behind filters or a suppress."""
        jobs = {d.job_id for d in queue}
        new_jobs = bool(jobs - self._known_jobs)
        self._known_jobs = jobs
        if not queue:
            self._revive_wanted = False
            if self._suppressed:
                return []
            self._suppressed = True
            return [Suppress()]
        if waiting and (self._suppressed or (new_jobs and self._filtered)):
            self._revive_wanted = True
        if self._revive_wanted and now - self._last_revive >= self.revive_interval:
            self._revive_wanted = False
            self._suppressed = self._filtered = False
            self._last_revive = now
            return [Revive()]
        return []

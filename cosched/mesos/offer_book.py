"""The offer book: which offers to hold, which launches to start on them, which to give back. Pure.

The scheduling core decides which jobs start and where (its placement policy puts each
job's gang on nodes, and each node is an agent): the book only carries those launches out
on Mesos offers, so no placement is decided twice. A launch names what it needs on each of
its agents (`Demand`); it starts whole, one ACCEPT per agent, once the held offers of every
one of its agents have room, or not at all. Offers are held only while a waiting launch
needs their agent; the rest are declined with a long refuse filter (`refuse_seconds`) so
that other frameworks get them. A held offer is given back after `hold_timeout` with a
short filter (a gang waiting for another agent must not sit on resources). SUPPRESS when
no launch waits and the core's queue is empty; REVIVE, at most once per `revive_interval`,
when a launch waits for an agent whose offers we filtered or suppressed, or when jobs are
queued again after a SUPPRESS.

State and time in, actions out: no I/O, so every rule is unit-tested, and the Mesos backend
only executes the actions (ACCEPT, DECLINE, SUPPRESS, REVIVE).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cosched.mesos.offers import Offer

EPSILON = 1e-9
"""Slack for float resource sums (0.1 + 0.2 cpus must host a 0.3-cpu task)."""


@dataclass(frozen=True)
class Need:
    """What one launch needs on one agent: CPUs and MiB."""

    agent_id: str
    cpus: float
    mem: float


@dataclass(frozen=True)
class Demand:
    """A launch the core decided: its needs, one per agent, started whole or not at all."""

    key: str
    needs: tuple[Need, ...]

    def __post_init__(self) -> None:
        agents = [need.agent_id for need in self.needs]
        if not agents or len(set(agents)) != len(agents):
            raise ValueError(f"launch {self.key}: needs one entry per agent, at least one (got {agents})")
        for need in self.needs:
            if need.cpus < 0 or need.mem < 0 or need.cpus == need.mem == 0:
                raise ValueError(
                    f"launch {self.key}: needs non-negative cpus and mem on agent {need.agent_id}, not both 0 "
                    f"(got cpus={need.cpus}, mem={need.mem})"
                )


@dataclass(frozen=True)
class Accept:
    """One ACCEPT: all held offers of one agent, for the launches with a part there."""

    agent_id: str
    offer_ids: tuple[str, ...]
    launches: tuple[str, ...]


@dataclass(frozen=True)
class Decline:
    offer_ids: tuple[str, ...]
    refuse_seconds: float


@dataclass(frozen=True)
class Suppress:
    """Nothing waits: stop offers."""


@dataclass(frozen=True)
class Revive:
    """A launch waits for resources we filtered or suppressed: offers again, please."""


Action = Accept | Decline | Suppress | Revive


@dataclass
class _Agent:
    offers: list[Offer]
    cpus: float
    mem: float

    def fits(self, need: Need) -> bool:
        return need.cpus <= self.cpus + EPSILON and need.mem <= self.mem + EPSILON


class OfferBook:
    def __init__(
        self,
        *,
        hold_timeout: float = 10.0,
        refuse_seconds: float = 120.0,
        expired_refuse_seconds: float = 5.0,
        revive_interval: float = 1.0,
    ) -> None:
        self.hold_timeout = hold_timeout
        self.refuse_seconds = refuse_seconds
        self.expired_refuse_seconds = expired_refuse_seconds
        self.revive_interval = revive_interval
        self._held: dict[str, Offer] = {}
        self._suppressed = False
        self._filtered: dict[str, float] = {}
        """Agent -> until when a long refuse filter we set keeps its offers away."""
        self._last_revive = float("-inf")
        self._revive_wanted = False

    @property
    def held(self) -> tuple[Offer, ...]:
        return tuple(self._held.values())

    def add(self, offers: Iterable[Offer]) -> None:
        """Offers just received (OFFERS event); they are held until the next `decide`."""
        for offer in offers:
            self._held[offer.id] = offer
            self._filtered.pop(offer.agent_id, None)
        self._suppressed = False  # offers only come while not suppressed (e.g. after a re-subscription)

    def rescind(self, offer_id: str) -> None:
        """The master took an offer back (RESCIND): it is no longer ours to use or decline."""
        self._held.pop(offer_id, None)

    def agent_lost(self, agent_id: str) -> None:
        """An agent was removed (FAILURE without executor): its offers are void."""
        for offer_id in [o.id for o in self._held.values() if o.agent_id == agent_id]:
            del self._held[offer_id]

    def revive_soon(self) -> None:
        """REVIVE at the next decision that has something to offer for: offers filtered earlier are wanted."""
        self._revive_wanted = True

    def resubscribed(self) -> None:
        """A new subscription: not suppressed, and filters of the old one may still apply."""
        self._suppressed = False
        self._revive_wanted = True

    def decide(self, demands: Sequence[Demand], queued: int, now: float, *, watching: bool = False) -> list[Action]:
        """Start what fits whole, keep what a waiting launch needs, give back the rest.

        `demands` in the order the core decided them; `queued` is how many jobs wait in
        the core's queue (they will be launches when resources free up); `watching` keeps
        offers coming with nothing queued (an agent that went away is seen back by its offer).
        """
        agents = self._agents()
        placed: dict[str, list[str]] = {}
        waiting: list[Demand] = []
        for demand in demands:
            if not all(need.agent_id in agents and agents[need.agent_id].fits(need) for need in demand.needs):
                waiting.append(demand)
                continue
            for need in demand.needs:
                agents[need.agent_id].cpus -= need.cpus
                agents[need.agent_id].mem -= need.mem
                placed.setdefault(need.agent_id, []).append(demand.key)

        actions: list[Action] = [
            Accept(agent_id, tuple(o.id for o in agents[agent_id].offers), tuple(keys))
            for agent_id, keys in placed.items()
        ]
        wanted = {need.agent_id for demand in waiting for need in demand.needs}
        expired: list[str] = []
        useless: list[str] = []
        for agent_id, agent in agents.items():
            if agent_id in placed:
                continue  # accepted whole: Mesos declines what the launches leave unused
            if agent_id not in wanted:
                useless.extend(o.id for o in agent.offers)
                self._filtered[agent_id] = now + self.refuse_seconds
            else:
                # A short filter: the offer comes back by itself soon, no REVIVE needed.
                expired.extend(o.id for o in agent.offers if now - o.received_at >= self.hold_timeout)
        for offer_id in [o.id for agent_id in placed for o in agents[agent_id].offers] + expired + useless:
            del self._held[offer_id]
        if expired:
            actions.append(Decline(tuple(expired), self.expired_refuse_seconds))
        if useless:
            actions.append(Decline(tuple(useless), self.refuse_seconds))
        return actions + self._offer_flow(waiting, queued or watching, now)

    def _agents(self) -> dict[str, _Agent]:
        """Held offers grouped by agent (an ACCEPT takes every held offer of its agent)."""
        agents: dict[str, _Agent] = {}
        for offer in sorted(self._held.values(), key=lambda o: o.received_at):
            agent = agents.setdefault(offer.agent_id, _Agent([], 0.0, 0.0))
            agent.offers.append(offer)
            agent.cpus += offer.cpus
            agent.mem += offer.mem
        return agents

    def _offer_flow(self, waiting: Sequence[Demand], queued: int | bool, now: float) -> list[Action]:
        """SUPPRESS when nothing waits; REVIVE (rate-limited) when a launch waits for an agent we
        filtered, or anything waits after a SUPPRESS."""
        if not waiting and not queued:
            self._revive_wanted = False
            if self._suppressed:
                return []
            self._suppressed = True
            return [Suppress()]
        blocked = any(
            self._filtered.get(need.agent_id, float("-inf")) > now for demand in waiting for need in demand.needs
        )
        if self._suppressed or blocked:
            self._revive_wanted = True
        if self._revive_wanted and now - self._last_revive >= self.revive_interval:
            self._revive_wanted = False
            self._suppressed = False
            self._filtered.clear()  # REVIVE removes every filter the framework set
            self._last_revive = now
            return [Revive()]
        return []

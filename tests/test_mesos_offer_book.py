"""The offer book's rules (pure: offers, queue and time in, actions out)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cosched.mesos.errors import MesosError
from cosched.mesos.offer_book import Accept, Decline, Demand, Need, OfferBook, Revive, Suppress
from cosched.mesos.offers import Offer, parse_offer


def offer(offer_id: str, agent: str, cpus: float, mem: float = 4096, at: float = 0.0) -> Offer:
    return Offer(offer_id, agent, f"host-{agent}", cpus, mem, at)


def accepts(actions: list[object]) -> dict[str, Accept]:
    return {a.agent_id: a for a in actions if isinstance(a, Accept)}


def declines(actions: list[object]) -> list[Decline]:
    return [a for a in actions if isinstance(a, Decline)]


def demand(key: str, *needs: tuple[str, float, float]) -> Demand:
    return Demand(key, tuple(Need(agent, cpus, mem) for agent, cpus, mem in needs))


def test_a_gang_starts_on_the_agents_the_core_chose_and_the_unused_agent_is_declined() -> None:
    book = OfferBook(refuse_seconds=120)
    book.add([offer("O1", "A", 3, at=1), offer("O2", "B", 2, at=2), offer("O3", "C", 8, at=3)])
    actions = book.decide([demand("j1", ("A", 3, 100), ("B", 1, 100))], queued=0, now=3)
    assert accepts(actions) == {"A": Accept("A", ("O1",), ("j1",)), "B": Accept("B", ("O2",), ("j1",))}
    # C is needed by no waiting launch: declined with the long filter, though it is the largest.
    assert declines(actions) == [Decline(("O3",), 120)]
    assert book.held == ()


def test_offers_of_one_agent_combine_and_two_launches_share_one_accept() -> None:
    book = OfferBook()
    book.add([offer("O1", "A", 1, at=1), offer("O2", "A", 1.5, at=2)])
    actions = book.decide([demand("j1", ("A", 1.2, 100)), demand("j2", ("A", 1.2, 100))], queued=1, now=2)
    assert actions == [Accept("A", ("O1", "O2"), ("j1", "j2"))], "2.5 cpus host 2 x 1.2"
    book.add([offer("O3", "B", 0.1, at=3), offer("O4", "B", 0.2, at=4)])
    actions = book.decide([demand("j3", ("B", 0.3, 10))], queued=1, now=4)
    assert accepts(actions) == {"B": Accept("B", ("O3", "O4"), ("j3",))}


def test_a_gang_waits_whole_memory_counts_and_a_later_launch_may_start_first() -> None:
    book = OfferBook()
    book.add([offer("O1", "A", cpus=8, mem=1000)])
    gang = demand("g", ("A", 1, 400), ("B", 1, 400))
    big = demand("big", ("A", 1, 1200))
    small = demand("small", ("A", 1, 500))
    actions = book.decide([gang, big, small], queued=0, now=0)
    assert actions == [Accept("A", ("O1",), ("small",))], "neither the gang (no B) nor big (memory) fit"


def test_a_partial_gang_holds_its_offers_until_the_hold_timeout_then_declines_them_briefly() -> None:
    book = OfferBook(hold_timeout=30, expired_refuse_seconds=5)
    book.add([offer("O1", "A", 2, at=0)])
    gang = [demand("j1", ("A", 2, 100), ("B", 1, 100), ("C", 1, 100))]
    assert book.decide(gang, queued=0, now=10) == []
    book.add([offer("O2", "B", 1, at=20)])
    assert book.decide(gang, queued=0, now=29) == []
    assert [o.id for o in book.held] == ["O1", "O2"]
    # O1 has waited 30 s: released with a short filter; O2 is younger and stays.
    assert book.decide(gang, queued=0, now=30) == [Decline(("O1",), 5)]
    assert [o.id for o in book.held] == ["O2"]
    # A's offer comes back once the short filter is over, C's arrives: the whole gang launches.
    book.add([offer("O3", "A", 2, at=40), offer("O4", "C", 1, at=41)])
    assert set(accepts(book.decide(gang, queued=0, now=41))) == {"A", "B", "C"}


def test_a_launch_waiting_for_an_agent_we_filtered_revives_once_per_interval() -> None:
    book = OfferBook(refuse_seconds=120, revive_interval=5)
    book.add([offer("O1", "A", 0.5, at=0)])
    assert book.decide([], queued=1, now=0) == [Decline(("O1",), 120)], "a queued job: no suppress"
    assert book.decide([demand("j1", ("A", 1, 1))], queued=0, now=2) == [Revive()]
    book.add([offer("O2", "A", 0.5, at=3)])
    assert book.decide([demand("j1", ("A", 1, 1))], queued=0, now=3) == [], "held: j1 needs A"
    assert book.decide([], queued=1, now=4) == [Decline(("O2",), 120)]
    assert book.decide([demand("j2", ("A", 1, 1))], queued=0, now=5) == [], "a revive 3 s ago"
    assert book.decide([demand("j2", ("A", 1, 1))], queued=0, now=7) == [Revive()]
    assert book.decide([demand("j2", ("A", 1, 1))], queued=0, now=20) == [], "no churn without news"


def test_an_empty_queue_suppresses_once_and_queued_jobs_revive() -> None:
    book = OfferBook(refuse_seconds=120, revive_interval=5)
    book.add([offer("O1", "A", 4)])
    assert book.decide([], queued=0, now=0) == [Decline(("O1",), 120), Suppress()]
    assert book.decide([], queued=0, now=1) == []
    assert book.decide([], queued=2, now=2) == [Revive()]
    assert book.decide([], queued=2, now=3) == []
    assert book.decide([], queued=0, now=4) == [Suppress()]
    assert book.decide([], queued=0, now=10, watching=True) == [Revive()], "an agent to see back"


def test_rescinded_offers_and_lost_agents_are_forgotten() -> None:
    book = OfferBook()
    book.add([offer("O1", "A", 2), offer("O2", "B", 2), offer("O3", "B", 1)])
    book.rescind("O1")
    book.rescind("unknown")  # a rescind for an offer already used or declined is harmless
    book.agent_lost("B")
    assert book.held == ()
    assert book.decide([demand("j1", ("A", 1, 1))], queued=0, now=0) == []


def test_bad_demands_and_offers_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="launch j0: needs one entry per agent"):
        demand("j0", ("A", 1, 1), ("A", 1, 1))
    with pytest.raises(ValueError, match="not both 0"):
        demand("j0", ("A", 0, 0))
    with pytest.raises(MesosError, match="malformed offer") as error:
        parse_offer({"id": {"value": "O1"}, "resources": []}, 0.0)
    assert "\n" not in str(error.value)


def test_parse_offer_sums_scalars_of_all_roles() -> None:
    raw = {
        "id": {"value": "O1"},
        "agent_id": {"value": "S1"},
        "hostname": "agent1",
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1.0}, "role": "*"},
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}, "role": "hpc"},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 1024.0}},
            {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 1, "end": 2}]}},
        ],
    }
    offer = parse_offer(raw, 7.0)
    assert offer == Offer("O1", "S1", "agent1", 1.5, 1024.0, 7.0, pieces=tuple(raw["resources"][:3]))


@given(
    offers=st.lists(st.tuples(st.sampled_from("ABCD"), st.integers(0, 8), st.integers(0, 8)), min_size=0, max_size=10),
    launches=st.lists(
        st.dictionaries(st.sampled_from("ABCD"), st.tuples(st.integers(0, 4), st.integers(1, 3)), min_size=1),
        max_size=6,
    ),
    now=st.integers(0, 60),
    queued=st.integers(0, 2),
)
def test_every_offer_is_used_declined_or_held_once_and_no_agent_is_overcommitted(
    offers: list[tuple[str, int, int]], launches: list[dict[str, tuple[int, int]]], now: int, queued: int
) -> None:
    book = OfferBook(hold_timeout=30)
    given_offers = [offer(f"O{i}", agent, cpus / 2, mem * 256.0, at=i) for i, (agent, cpus, mem) in enumerate(offers)]
    book.add(given_offers)
    demands = [
        demand(f"j{i}", *[(agent, cpus / 2, mem * 256.0) for agent, (cpus, mem) in parts.items()])
        for i, parts in enumerate(launches)
    ]
    actions = book.decide(demands, queued=queued, now=now)
    used = [o for a in accepts(actions).values() for o in a.offer_ids]
    declined = [o for d in declines(actions) for o in d.offer_ids]
    held = [o.id for o in book.held]
    assert sorted(used + declined + held) == sorted(o.id for o in given_offers)
    by_id = {o.id: o for o in given_offers}
    needs = {d.key: {n.agent_id: n for n in d.needs} for d in demands}
    started: dict[str, set[str]] = {}
    for accept in accepts(actions).values():
        assert {by_id[o].agent_id for o in accept.offer_ids} == {accept.agent_id}
        assert {by_id[o].agent_id for o in held}.isdisjoint({accept.agent_id}), "an ACCEPT takes all of its agent"
        cpus = sum(by_id[o].cpus for o in accept.offer_ids)
        mem = sum(by_id[o].mem for o in accept.offer_ids)
        assert sum(needs[k][accept.agent_id].cpus for k in accept.launches) <= cpus + 1e-6
        assert sum(needs[k][accept.agent_id].mem for k in accept.launches) <= mem + 1e-6
        for key in accept.launches:
            started.setdefault(key, set()).add(accept.agent_id)
    assert all(agents == set(needs[key]) for key, agents in started.items()), "a launch starts whole or not at all"
    waiting_agents = {a for d in demands if d.key not in started for a in needs[d.key]}
    assert all(by_id[o].agent_id in waiting_agents for o in held), "only what a waiting launch needs is held"

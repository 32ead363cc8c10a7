"""The offer book's rules (pure: offers, queue and time in, actions out)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cosched.mesos.errors import MesosError
from cosched.mesos.offer_book import Accept, Decline, Demand, OfferBook, Revive, Suppress
from cosched.mesos.offers import Offer, parse_offer


def offer(offer_id: str, agent: str, cpus: float, mem: float = 4096, at: float = 0.0) -> Offer:
    return Offer(offer_id, agent, f"host-{agent}", cpus, mem, at)


def accepts(actions: list[object]) -> dict[str, Accept]:
    return {a.agent_id: a for a in actions if isinstance(a, Accept)}


def declines(actions: list[object]) -> list[Decline]:
    return [a for a in actions if isinstance(a, Decline)]


def test_a_gang_is_placed_first_fit_across_agents_and_the_unused_agent_declined() -> None:
    book = OfferBook(refuse_seconds=120)
    book.add([offer("O1", "A", 3, at=1), offer("O2", "B", 2, at=2), offer("O3", "C", 8, at=3)])
    actions = book.decide([Demand("j1", tasks=4, cpus=1, mem=100)], now=3)
    assert accepts(actions) == {
        "A": Accept("A", ("O1",), (("j1", 3),)),
        "B": Accept("B", ("O2",), (("j1", 1),)),
    }
    # C can host a task of no waiting job (none is waiting): declined with the long filter.
    assert declines(actions) == [Decline(("O3",), 120)]
    assert book.held == ()


def test_offers_of_one_agent_combine_and_two_jobs_share_one_accept() -> None:
    book = OfferBook()
    book.add([offer("O1", "A", 1, at=1), offer("O2", "A", 1.5, at=2)])
    actions = book.decide([Demand("j1", 1, 1.2, 100), Demand("j2", 1, 1.2, 100)], now=2)
    assert actions == [Accept("A", ("O1", "O2"), (("j1", 1), ("j2", 1)))], "2.5 cpus host 2 x 1.2"
    book.add([offer("O3", "B", 0.3, at=3), offer("O4", "B", 0.3, at=4)])
    actions = book.decide([Demand("j3", 1, 0.25, 10), Demand("j4", 1, 0.3, 10)], now=4)
    assert accepts(actions) == {"B": Accept("B", ("O3", "O4"), (("j3", 1), ("j4", 1)))}


def test_memory_limits_slots_too() -> None:
    book = OfferBook()
    book.add([offer("O1", "A", cpus=8, mem=1000)])
    assert accepts(book.decide([Demand("j1", tasks=3, cpus=1, mem=400)], now=0)) == {}
    assert [o.id for o in book.held] == ["O1"], "held: it can run 2 of the 3 tasks"


def test_a_partial_gang_holds_its_offers_until_the_hold_timeout_then_declines_them_briefly() -> None:
    book = OfferBook(hold_timeout=30, expired_refuse_seconds=5)
    book.add([offer("O1", "A", 2, at=0)])
    gang = [Demand("j1", tasks=4, cpus=1, mem=100)]
    assert book.decide(gang, now=10) == []
    book.add([offer("O2", "B", 1, at=20)])
    assert book.decide(gang, now=29) == []
    assert [o.id for o in book.held] == ["O1", "O2"]
    # O1 has waited 30 s: released with a short filter; O2 is younger and stays.
    assert book.decide(gang, now=30) == [Decline(("O1",), 5)]
    assert [o.id for o in book.held] == ["O2"]
    # The last piece arrives in time: the whole gang launches.
    book.add([offer("O3", "C", 1, at=40), offer("O4", "D", 2, at=41)])
    placed = accepts(book.decide(gang, now=41))
    assert {a: t for a, acc in placed.items() for _, t in acc.tasks} == {"B": 1, "C": 1, "D": 2}


def test_an_offer_too_small_for_every_waiting_job_is_declined_with_the_long_filter() -> None:
    book = OfferBook(refuse_seconds=120)
    book.add([offer("O1", "A", 0.5), offer("O2", "B", 1.0)])
    actions = book.decide([Demand("big", tasks=3, cpus=1, mem=100)], now=0)
    assert actions == [Decline(("O1",), 120)]
    assert [o.id for o in book.held] == ["O2"]


def test_rescinded_offers_and_lost_agents_are_forgotten() -> None:
    book = OfferBook()
    book.add([offer("O1", "A", 2), offer("O2", "B", 2), offer("O3", "B", 1)])
    book.rescind("O1")
    book.rescind("unknown")  # a rescind for an offer already used or declined is harmless
    book.agent_lost("B")
    assert book.held == ()
    assert book.decide([Demand("j1", 1, 1, 1)], now=0) == []


def test_empty_queue_suppresses_once_and_a_new_job_revives_rate_limited() -> None:
    book = OfferBook(refuse_seconds=120, revive_interval=5)
    book.add([offer("O1", "A", 4)])
    assert book.decide([], now=0) == [Decline(("O1",), 120), Suppress()]
    assert book.decide([], now=1) == []
    assert book.decide([Demand("j1", 1, 1, 1)], now=2) == [Revive()]
    # Offers come back; a job too big for them leaves them declined; another new job right away waits for
    # the revive interval.
    book.add([offer("O2", "A", 0.5, at=3)])
    assert book.decide([Demand("j1", 1, 1, 1)], now=3) == [Decline(("O2",), 120)]
    assert book.decide([Demand("j1", 1, 1, 1), Demand("j2", 1, 1, 1)], now=4) == []
    assert book.decide([Demand("j1", 1, 1, 1), Demand("j2", 1, 1, 1)], now=7) == [Revive()]
    assert book.decide([Demand("j1", 1, 1, 1), Demand("j2", 1, 1, 1)], now=20) == [], "no churn without news"


def test_bad_demands_and_offers_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="job j0: a gang needs >= 1 task"):
        Demand("j0", tasks=0, cpus=1, mem=1)
    with pytest.raises(ValueError, match="not both 0"):
        Demand("j0", tasks=1, cpus=0, mem=0)
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
    assert parse_offer(raw, 7.0) == Offer("O1", "S1", "agent1", 1.5, 1024.0, 7.0)


@given(
    offers=st.lists(st.tuples(st.sampled_from("ABCD"), st.integers(0, 8), st.integers(0, 8)), min_size=0, max_size=10),
    jobs=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(0, 3)), max_size=6),
    now=st.integers(0, 60),
)
def test_every_offer_is_used_declined_or_held_once_and_no_agent_is_overcommitted(
    offers: list[tuple[str, int, int]], jobs: list[tuple[int, int, int]], now: int
) -> None:
    book = OfferBook(hold_timeout=30)
    given_offers = [offer(f"O{i}", agent, cpus / 2, mem * 256.0, at=i) for i, (agent, cpus, mem) in enumerate(offers)]
    book.add(given_offers)
    queue = [Demand(f"j{i}", tasks, cpus / 2, mem * 256.0) for i, (tasks, cpus, mem) in enumerate(jobs)]
    actions = book.decide(queue, now=now)
    used = [o for a in accepts(actions).values() for o in a.offer_ids]
    declined = [o for d in declines(actions) for o in d.offer_ids]
    held = [o.id for o in book.held]
    assert sorted(used + declined + held) == sorted(o.id for o in given_offers)
    by_id = {o.id: o for o in given_offers}
    demand = {d.job_id: d for d in queue}
    gang: dict[str, int] = {}
    for accept in accepts(actions).values():
        assert {by_id[o].agent_id for o in accept.offer_ids} == {accept.agent_id}
        cpus = sum(by_id[o].cpus for o in accept.offer_ids)
        mem = sum(by_id[o].mem for o in accept.offer_ids)
        assert sum(demand[j].cpus * n for j, n in accept.tasks) <= cpus + 1e-6
        assert sum(demand[j].mem * n for j, n in accept.tasks) <= mem + 1e-6
        for job, count in accept.tasks:
            gang[job] = gang.get(job, 0) + count
    assert all(gang[j] == demand[j].tasks for j in gang), "a gang launches whole or not at all"

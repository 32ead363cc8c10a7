"""Queue policy scores against values computed by hand from their formulas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosched.core.waiting import Waiting
from cosched.errors import ConfigError
from cosched.model import Job
from cosched.policies import registry
from cosched.policies.base import QueuePolicy
from cosched.policies.queue import F1, FCFS, LCFS, SJF, UNICEF, WFP3, LargestFirst, SmallestFirst


def job(submit: float, cores: int, walltime: float) -> Job:
    return Job(id=1, submit=submit, cores=cores, walltime=walltime)


def test_static_scores() -> None:
    j = job(100.0, 8, 3600.0)
    assert FCFS().score(j, 500.0) == 100.0
    assert LCFS().score(j, 500.0) == -100.0
    assert SJF().score(j, 500.0) == 3600.0
    assert SmallestFirst().score(j, 0) == 8
    assert LargestFirst().score(j, 0) == -8


def test_wfp3_grows_with_wait_cubed() -> None:
    j = job(0.0, 4, 100.0)
    # -(w / r)^3 * n with w = 200, r = 100, n = 4: -(2^3) * 4 = -32
    assert WFP3().score(j, 200.0) == pytest.approx(-32.0)
    assert WFP3().score(j, 400.0) == pytest.approx(-256.0)  # twice the wait, 8x the urgency


def test_unicef_counts_serial_jobs_as_two_cores() -> None:
    # -w / (log2(n) * r): w = 100, n = 16 (log2 = 4), r = 50 -> -0.5
    assert UNICEF().score(job(0.0, 16, 50.0), 100.0) == pytest.approx(-0.5)
    # n = 1 would divide by log2(1) = 0; it counts as 2 (log2 = 1): -100 / 50 = -2
    assert UNICEF().score(job(0.0, 1, 50.0), 100.0) == pytest.approx(-2.0)


def test_f1_formula() -> None:
    # log10(r) * n + 870 * log10(s): r = 1000, n = 2, s = 1e6 -> 3 * 2 + 870 * 6 = 5226
    assert F1().score(job(1e6, 2, 1000.0), 0) == pytest.approx(5226.0)
    assert math.isfinite(F1().score(job(0.0, 2, 1000.0), 0))  # s = 0 counts as 1


def test_time_dependent_policies_are_not_static() -> None:
    assert {p.name for p in (WFP3(), UNICEF())} == {"wfp3", "unicef"}
    assert not WFP3.static and not UNICEF.static
    assert FCFS.static and SJF.static and F1.static


@pytest.mark.parametrize("policy", [WFP3(), UNICEF()])
@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 50), st.sampled_from([1, 2, 3, 8]), st.sampled_from([5.0, 10.0, 60.0])),
        min_size=1,
        max_size=40,
    ),
    removed=st.sets(st.integers(0, 39)),
    read=st.integers(1, 45),
    now=st.integers(50, 500),
)
def test_aging_order_from_arrays_is_the_order_by_score(policy, rows, removed, read: int, now: int) -> None:
    """The core orders an aging policy's queue from arrays of submit times and weights, sorting
    only as far as it reads: that must be the order of `score`, ties in queue order."""
    queue = [Job(id=i, submit=float(s), cores=c, walltime=w) for i, (s, c, w) in enumerate(rows)]
    waiting = Waiting(policy)
    for j in queue:
        waiting.append(j)
    for index in sorted((i for i in removed if i < len(queue)), reverse=True):
        del queue[index]
        waiting.delete(index)
    expected = sorted(queue, key=lambda j: policy.score(j, now))
    assert list(waiting.order(queue, now, whole=True)) == expected
    lazy = waiting.order(queue, now, whole=False)
    assert [queue[i] for i in waiting.order(queue, now, whole=False).positions(read)] == expected[:read]
    assert len(lazy) == len(expected)
    assert [lazy[i] for i in range(min(read, len(queue)))] == expected[:read]
    assert lazy[:read] == expected[:read] and list(lazy) == expected and lazy[read:] == expected[read:]


def test_registry_finds_every_builtin_and_rejects_strangers() -> None:
    assert set(registry.available("queue")) >= {"fcfs", "lcfs", "sjf", "smallest", "largest", "wfp3", "unicef", "f1"}
    assert set(registry.available("backfill")) >= {"none", "easy", "conservative"}
    assert isinstance(registry.create("queue", "wfp3"), WFP3)
    assert isinstance(registry.create("queue", "cosched.policies.queue:SJF"), SJF)
    with pytest.raises(ConfigError, match=r"unknown queue policy 'nope'; known: .*fcfs"):
        registry.create("queue", "nope")
    with pytest.raises(ConfigError, match="not a subclass of QueuePolicy"):
        registry.create("queue", "cosched.policies.backfill:EASY")
    with pytest.raises(ConfigError, match="cannot load"):
        registry.create("queue", "no.such.module:Thing")
    with pytest.raises(ConfigError, match="bad options"):
        registry.create("queue", "fcfs", window=3)


def test_a_new_policy_plugs_in_by_module_path() -> None:
    assert issubclass(registry.resolve("queue", f"{__name__}:OldestUserFirst"), QueuePolicy)


class OldestUserFirst(QueuePolicy):
    """A policy defined outside cosched, found by `module:Class`."""

    name = "oldest-user"

    def score(self, job: Job, now: float) -> float:
        return job.user

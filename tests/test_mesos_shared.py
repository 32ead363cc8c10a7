"""Agents shared with other frameworks, without a cluster: what the backend learns from offers of what
others hold (`cosched/mesos/shares.py`, `MesosBackend.others_hold`), and how the daemon holds it back of
the core's pool (`cosched/daemon/nodes.py`). The real-Mesos side is in tests/test_daemon_mesos_faults.py
(`-k "partly or fits_what"`)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from cosched.core.events import Offer, Rescind
from cosched.core.pool import ResourcePool
from cosched.daemon import nodes
from cosched.daemon.docker_backend import QuotaMismatch
from cosched.mesos import shares
from cosched.mesos.backend import MesosBackend, MesosSettings
from cosched.mesos.offers import Offer as MesosOffer
from cosched.model import Cluster, JobState


# -- the rule: room -> what the core holds back ----------------------------------------------
def _offer(cpus: float, mem: float, agent: str = "a2") -> MesosOffer:
    return MesosOffer("o", agent, "agent2", cpus, mem, 0.0)


def test_an_agent_with_a_nodes_cores_memory_and_executors_holds_nothing_back() -> None:
    # 16 cores and 60000 MiB, with 0.05 CPU and 64 MiB per core for the executors.
    room = shares.room([_offer(16.8, 60000 + 16 * 64)], [])
    assert room is not None and shares.held_back(room, 16, 60000) == (0, 0)
    # The test cluster: agents of 2 CPUs and 2048 MiB for nodes of 1 core and 768 MiB.
    assert shares.held_back(shares.Room(2.0, 2048.0), 1, 768) == (0, 0)


def test_what_others_hold_is_held_back_in_cores_and_mib() -> None:
    # Another framework left 1.0 CPU and 100 MiB: a core's task needs 1.05 with its executor.
    assert shares.held_back(shares.Room(1.0, 100.0), 1, 768) == (1, 732)
    # 1.5 CPUs and 300 MiB: the core stays, 300 - 64 = 236 MiB of the node's 768 remain.
    assert shares.held_back(shares.Room(1.5, 300.0), 1, 768) == (0, 532)
    # 16-core node, others hold 5.5 CPUs of 17: 11.5 / 1.05 = 10.95 -> 10 cores usable.
    assert shares.held_back(shares.Room(11.5, 1e6), 16, 1000) == (6, 0)
    # Memory not scheduled ([cluster] memory 0): only cores.
    assert shares.held_back(shares.Room(0.0, 0.0), 4, 0) == (4, 0)


def test_offer_sums_in_floats_do_not_cost_a_core() -> None:
    offers = [_offer(0.1, 10), _offer(0.2, 10)] + [_offer(0.35, 10)] * 3  # 1.35 in floats
    room = shares.room(offers, [(0.0, 2000.0)])
    assert room is not None and shares.held_back(room, 1, 0) == (0, 0)
    assert shares.held_back(shares.Room(2.1 - 1e-12, 0.0), 2, 0) == (0, 0)


def test_the_room_counts_our_tasks_and_is_unknown_while_one_has_no_size() -> None:
    ours = [shares.task_size(1.0, 128), shares.task_size(0.01, 64)]  # a host and a guest
    assert ours[0] == (1.05, 192.0) and ours[1] == (pytest.approx(0.06), 128.0)
    room = shares.room([_offer(0.5, 100)], ours)
    assert room is not None and room.cpus == pytest.approx(1.61) and room.mem == pytest.approx(420)
    assert shares.room([_offer(0.5, 100)], [*ours, None]) is None


# -- the backend: rooms learnt from offers ---------------------------------------------------
def _backend(launch_timeout: float = 30.0) -> MesosBackend:
    settings = MesosSettings(masters="127.0.0.1:1", launch_timeout=launch_timeout, hold_timeout=1.0)
    backend = MesosBackend(settings, nodes=2, node_hosts=["agent1", "agent2"])
    backend.client._framework_id = "fw"  # as if subscribed; no call is made in these tests
    return backend


def _raw(offer_id: str, agent: str, cpus: float, mem: float) -> dict[str, Any]:
    return {
        "id": {"value": offer_id},
        "agent_id": {"value": agent},
        "hostname": f"agent{agent[-1]}",
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}},
        ],
    }


def _round(backend: MesosBackend, now: float | None = None) -> None:
    """The offer thread's decision, without its calls (no master here)."""
    with backend.cond:
        backend._offer_round(time.monotonic() if now is None else now)


def test_the_backend_learns_what_others_hold_from_each_offer() -> None:
    backend = _backend()
    backend.on_offers([_raw("o1", "a1", 2.0, 2048), _raw("o2", "a2", 1.0, 100)])
    assert backend.others_hold(1, 768) == {1: (1, 732)}
    # Declined with a refuse filter, the offers are gone: what they showed stays (stale until the next).
    _round(backend)
    assert backend.book.held == () and backend.others_hold(1, 768) == {1: (1, 732)}
    # The other framework gave some back: a larger offer.
    backend.on_offers([_raw("o3", "a2", 1.5, 300)])
    assert backend.others_hold(1, 768) == {1: (0, 532)}
    # ... and took more again: the next offer says so.
    _round(backend)
    backend.on_offers([_raw("o4", "a2", 0.5, 100)])
    assert backend.others_hold(1, 768) == {1: (1, 732)}
    # Two offers of one agent held at once: the room is their sum.
    backend.on_offers([_raw("o5", "a2", 1.0, 1000)])
    assert backend.others_hold(1, 768) == {}
    # Gone altogether: the agent is free.
    _round(backend)
    backend.on_offers([_raw("o6", "a2", 2.0, 2048)])
    assert backend.others_hold(1, 768) == {} and backend.rooms["a2"] == shares.Room(2.0, 2048.0)


def test_an_agent_lost_forgets_its_room() -> None:
    backend = _backend()
    backend.on_offers([_raw("o1", "a2", 0.5, 100)])
    assert backend.others_hold(1, 768) == {1: (1, 732)}
    backend.on_failure({"agent_id": {"value": "a2"}})
    assert backend.others_hold(1, 768) == {}  # node 1 is down; its next offer says anew
    backend.on_offers([_raw("o2", "a2", 2.0, 2048)])
    assert 1 not in backend.others_hold(1, 768)


def _launch_in_thread(backend: MesosBackend, job_id: int, memory: int, node: int) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["started"] = backend.launch(
                job_id, {"image": "x", "command": ["true"], "cores": 1}, [], 1.0, memory, slots=((node, 1),)
            )
        except Exception as exc:  # the test reads it
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    result["thread"] = thread
    deadline = time.monotonic() + 5
    while not backend.launches and time.monotonic() < deadline:
        time.sleep(0.01)
    return result


def test_a_launch_in_flight_counts_once_it_is_accepted_not_while_it_waits() -> None:
    backend = _backend(launch_timeout=5.0)
    backend.on_offers([_raw("o1", "a2", 2.0, 2048)])
    assert backend.others_hold(1, 768) == {}
    _round(backend)  # declined
    launch = _launch_in_thread(backend, 7, 128, 1)
    # While the launch waits, an offer arrives: its need is not ours yet, the room is the offer.
    backend.on_offers([_raw("o2", "a2", 2.0, 2048)])
    assert backend.others_hold(1, 768) == {} and backend.rooms["a2"] == shares.Room(2.0, 2048.0)
    _round(backend)  # accepted: the task holds 1.05 CPUs and 192 MiB of the agent now
    [run] = backend.runs.values()
    [task] = run.tasks.values()
    assert task.size == (1.05, 192.0)
    # The next offer shows what the launch left; with the task counted, nothing is held back.
    backend.on_offers([_raw("o3", "a2", 0.95, 1856)])
    assert backend.rooms["a2"].cpus == pytest.approx(2.0) and backend.others_hold(1, 768) == {}
    # Another framework took 0.5 CPUs meanwhile: 1.5 is left for cosched, the running task holds
    # its core, and the core's node must hold nothing back (1.5 / 1.05 = 1 core).
    _round(backend)
    backend.on_offers([_raw("o5", "a2", 0.45, 1856)])
    assert backend.rooms["a2"].cpus == pytest.approx(1.5) and backend.others_hold(1, 768) == {}
    backend.on_update(_status(task.id, "TASK_RUNNING", "a2"))
    launch["thread"].join(5)
    assert "started" in launch, launch


def _status(task_id: str, state: str, agent: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": {"value": task_id}, "state": state, "agent_id": {"value": agent}, **extra}


def test_runs_known_from_reconciliation_count_once_the_daemon_told_their_size() -> None:
    """A restarted daemon: its tasks come back from reconciliation, with no size. Until the daemon
    says its jobs' sizes, an offer of their agent leaves the room as it was (none yet: nothing held
    back), never counts the tasks as others'."""
    backend = _backend()
    task = "cosched-job-4-0123abcd-0of1-1c"
    backend.on_update(_status(task, "TASK_RUNNING", "a2", reason="REASON_RECONCILIATION"))
    assert backend.unsized() == [("cosched-job-4-0123abcd", 4)]
    backend.on_offers([_raw("o1", "a2", 0.95, 1856)])
    assert "a2" not in backend.rooms and backend.others_hold(1, 768) == {}
    backend.size("cosched-job-4-0123abcd", 128, guest=False)
    assert backend.unsized() == []
    _round(backend)
    backend.on_offers([_raw("o2", "a2", 0.95, 1856)])
    assert (backend.rooms["a2"].cpus, backend.rooms["a2"].mem) == (pytest.approx(2.0), pytest.approx(2048.0))
    assert backend.others_hold(1, 768) == {}


def test_an_ended_tasks_executor_counts_until_the_master_says_it_left() -> None:
    """An executor leaves once its task's end is acknowledged; the master then sends FAILURE for it,
    before it offers what the executor held. Until then it is ours, not another framework's."""
    backend = _backend()
    task = "cosched-job-5-0123abcd-0of1-1c"
    backend.on_update(_status(task, "TASK_RUNNING", "a2"))
    backend.size("cosched-job-5-0123abcd", 128, guest=False)
    backend.on_update(_status(task, "TASK_FINISHED", "a2", uuid="dXVpZA==", source="SOURCE_EXECUTOR"))
    # The task's 1 CPU and 128 MiB are offered again; its executor's 0.05 and 64 MiB are not yet.
    backend.on_offers([_raw("o1", "a2", 1.95, 1984)])
    assert (backend.rooms["a2"].cpus, backend.rooms["a2"].mem) == (pytest.approx(2.0), pytest.approx(2048.0))
    _round(backend)
    backend.client.call = lambda *args, **kwargs: None  # type: ignore[method-assign]
    backend.remove("cosched-job-5-0123abcd")  # the end recorded and acknowledged: the run is forgotten
    backend.on_offers([_raw("o2", "a2", 1.95, 1984)])
    assert (backend.rooms["a2"].cpus, backend.rooms["a2"].mem) == (pytest.approx(2.0), pytest.approx(2048.0))
    _round(backend)
    backend.on_failure({"agent_id": {"value": "a2"}, "executor_id": {"value": task}, "status": 0})
    backend.on_offers([_raw("o3", "a2", 2.0, 2048)])
    assert (backend.rooms["a2"].cpus, backend.rooms["a2"].mem) == (pytest.approx(2.0), pytest.approx(2048.0))
    assert backend.others_hold(1, 768) == {} and backend._leaving == {}


# -- the daemon: what the core's pool holds back ---------------------------------------------
class _Core:
    def __init__(self, cluster: Cluster) -> None:
        self.pool = ResourcePool(cluster)
        self.jobs: dict[int, Any] = {}
        self.guests: dict[int, list[Any]] = {}
        self.withheld: dict[int, int] = {}

    @property
    def running(self) -> list[Any]:
        """The running jobs that are no guests, by expected end, as the core keeps them."""
        return sorted((job for job in self.jobs.values() if job.host < 0), key=lambda job: job.expected_end)

    def withhold(self, units: dict[int, int]) -> None:
        self.withheld = dict(units)


class _Backend:
    def __init__(self) -> None:
        self.held: dict[int, tuple[int, int]] = {}

    def others_hold(self, cores: int, memory: int) -> dict[int, tuple[int, int]]:
        return dict(self.held)

    def unsized(self) -> list[tuple[str, int]]:
        return []


class _Daemon:
    def __init__(self, cores: int = 4, memory: int = 1000) -> None:
        self.cluster = Cluster(2, cores, memory)
        self.core = _Core(self.cluster)
        self.core.pool.add(((0, cores), (1, cores)), (memory, memory))
        self.backend = _Backend()
        self.down: set[int] = set()
        self.drained: dict[int, Any] = {}
        self.containers: dict[int, str] = {}

    def step(self, changes: list[tuple[int, bool]] = ()) -> list[Any]:  # type: ignore[assignment]
        """A pass's node events, applied to the pool as the core would."""
        events = nodes.events(self, changes)  # type: ignore[arg-type]
        for event in events:
            if isinstance(event, Offer):
                self.core.pool.add(event.slots, event.memory)
            elif isinstance(event, Rescind):
                self.core.pool.remove(event.slots, event.memory)
        return events

    def free(self, node: int) -> tuple[int, int]:
        return self.core.pool.free_cores(node), self.core.pool.free_mem[node]


def test_what_others_take_is_rescinded_from_the_free_and_offered_when_given_back() -> None:
    daemon = _Daemon()
    daemon.backend.held = {1: (3, 200)}
    assert daemon.step() == [Rescind(((1, 3),), (200,))]
    assert daemon.free(1) == (1, 800) and daemon.free(0) == (4, 1000)
    assert daemon.step() == []  # nothing changed: nothing sent
    assert nodes.others(daemon) == {1: "3 cores, 200 MiB"}  # type: ignore[arg-type]
    daemon.backend.held = {1: (1, 300)}
    assert daemon.step() == [Offer(((1, 2),), (0,)), Rescind(((1, 0),), (100,))]
    assert daemon.free(1) == (3, 700)
    daemon.backend.held = {}
    assert daemon.step() == [Offer(((1, 1),), (300,))]
    assert daemon.free(1) == (4, 1000) and nodes.others(daemon) == {}  # type: ignore[arg-type]


def test_what_others_took_while_the_core_counted_it_is_taken_from_the_next_ends() -> None:
    """The core placed 3 cores on node 1 (a launch in flight, or jobs whose end it has not seen)
    when others took 2: only the free core can be rescinded now, the other is owed and cut from
    what the next end on node 1 gives back."""
    daemon = _Daemon()
    daemon.core.pool.remove(((1, 3),), (300,))  # the core's jobs there
    daemon.backend.held = {1: (2, 0)}
    assert daemon.step() == [Rescind(((1, 1),), (0,))]
    assert daemon.free(1) == (0, 700)
    daemon.core.pool.remove(((0, 1),), (100,))  # a job on node 0 too
    end = nodes.live_part(daemon, Offer(((0, 1), (1, 2)), (100, 200)))  # type: ignore[arg-type]
    assert end == Offer(((0, 1), (1, 1)), (100, 200))  # one core of node 1 was owed, none of node 0
    daemon.core.pool.add(end.slots, end.memory)
    assert daemon.step() == [] and daemon.free(1) == (1, 900)
    # They give both back: both are offered.
    daemon.backend.held = {}
    assert daemon.step() == [Offer(((1, 2),), (0,))] and daemon.free(1) == (3, 900)


def test_a_drained_node_is_held_back_whole_by_the_same_rule_and_given_back_at_resume() -> None:
    """Node 1 runs a 3-core job (job 7) and others hold 1 core of it, when it is drained: what is free
    leaves the pool, the job's cores are owed (its end gives back nothing of node 1), the core is told
    that job 7's end frees none of its units, and `others` still says only what others hold. At
    resume the node comes back less what others still hold."""
    daemon = _Daemon()
    daemon.core.pool.remove(((1, 3),), (300,))
    job = type("RunningJob", (), {"id": 7, "state": JobState.RUNNING, "slots": ((1, 3),), "host": -1})()
    daemon.core.jobs[7] = job
    daemon.backend.held = {1: (1, 0)}
    assert daemon.step() == [Rescind(((1, 1),), (0,))]
    daemon.drained = {1: "fan"}
    assert daemon.step() == [Rescind(((1, 0),), (700,))]
    assert daemon.free(1) == (0, 0) and daemon.core.withheld == {7: 3}
    assert nodes.others(daemon) == {1: "1 core"}  # type: ignore[arg-type]
    del daemon.core.jobs[7]
    assert nodes.live_part(daemon, Offer(((1, 3),), (300,))) is None  # type: ignore[arg-type]
    assert daemon.step() == [] and daemon.core.withheld == {}
    daemon.drained = {}
    assert daemon.step() == [Offer(((1, 3),), (1000,))] and daemon.free(1) == (3, 1000)


def _running(job_id: int, slots: tuple[tuple[int, int], ...], end: float, host: int = -1) -> Any:
    return type(
        "RunningJob", (), {"id": job_id, "state": JobState.RUNNING, "slots": slots, "host": host, "expected_end": end}
    )()


def test_what_others_took_from_running_jobs_is_no_promise_until_their_ends_pay_it() -> None:
    """Node 1 is full (job 1: 2 cores until 100, job 2: 2 cores until 200, with a guest on 1 of them
    that outlives it, until 300) when others take 3 of its cores: nothing is free to rescind, so all
    3 are owed. The ends foreseen in order pay them: job 1's 2 cores, then job 2's end, which gives
    back 1 (its guest keeps the other). The core hears that jobs 1 and 2 give back nothing; the
    guest's core is still a promise. Once others give 1 core back, only 2 are owed: job 1's."""
    daemon = _Daemon(cores=4)
    daemon.core.pool.remove(((1, 4),), (0,))
    first, second = _running(1, ((1, 2),), 100.0), _running(2, ((1, 2),), 200.0)
    guest = _running(3, ((1, 1),), 300.0, host=2)
    daemon.core.jobs.update({1: first, 2: second, 3: guest})
    daemon.core.guests[2] = [guest]
    daemon.backend.held = {1: (3, 0)}
    assert daemon.step() == []
    assert daemon.core.withheld == {1: 2, 2: 1}
    daemon.backend.held = {1: (2, 0)}
    daemon.step()
    assert daemon.core.withheld == {1: 2}
    daemon.backend.held = {1: (4, 0)}  # all of it: the guest's core too
    daemon.step()
    assert daemon.core.withheld == {1: 2, 2: 2, 3: 1}


def test_a_node_gone_forgets_what_it_held_back_and_comes_back_whole_then_held_back_anew() -> None:
    daemon = _Daemon()
    daemon.backend.held = {1: (2, 100)}
    daemon.step()
    assert daemon.free(1) == (2, 900)
    daemon.backend.held = {}  # the backend says nothing of a node down
    assert daemon.step([(1, False)]) == [Rescind(((1, 2),), (900,))]
    assert daemon.free(1) == (0, 0) and nodes.others(daemon) == {}  # type: ignore[arg-type]
    # An end on the node while it is down gives nothing back.
    assert nodes.live_part(daemon, Offer(((1, 1),), (10,))) is None  # type: ignore[arg-type]
    daemon.backend.held = {1: (1, 0)}  # its first offer back: others still hold a core
    assert daemon.step([(1, True)]) == [Offer(((1, 4),), (1000,)), Rescind(((1, 1),), (0,))]
    assert daemon.free(1) == (3, 1000)


def test_one_core_nodes_are_held_back_whole() -> None:
    """Nodes of one core: the pool counts whole nodes (node mode); a core held back takes the node
    out of the usable ones, memory alone leaves it usable for jobs that fit."""
    daemon = _Daemon(cores=1, memory=768)
    daemon.backend.held = {1: (0, 532)}
    daemon.step()
    assert daemon.free(1) == (1, 236)
    daemon.backend.held = {1: (1, 732)}
    daemon.step()
    assert daemon.free(1) == (0, 36) and daemon.core.pool.free_units == 1
    daemon.backend.held = {}
    daemon.step()
    assert daemon.free(1) == (1, 768) and daemon.core.pool.free_units == 2


def test_a_rebuilt_core_starts_with_nothing_held_back() -> None:
    daemon = _Daemon()
    daemon.backend.held = {0: (1, 0)}
    daemon.step()
    daemon.core = _Core(daemon.cluster)  # rebuilt: recovery offers every node whole
    daemon.core.pool.add(((0, 4), (1, 4)), (1000, 1000))
    assert daemon.step() == [Rescind(((0, 1),), (0,))]


@pytest.mark.parametrize("first", [1, 2])
def test_a_restarted_daemon_is_told_a_jobs_latest_run_whatever_order_reconciliation_gives(first: int) -> None:
    """A requeued run's end was recorded, then the daemon died before acknowledging it: after the
    restart, reconciliation tells of that run (ended) and of the next (running). Recovery adopts
    only the run the state file began last; `containers` names the latest, with its number."""
    backend = _backend()
    tasks = ["cosched-job-4-r1-4567abcd-0of1-1c", "cosched-job-4-r2-0123abcd-0of1-1c"]
    for task in tasks if first == 1 else tasks[::-1]:
        state = "TASK_RUNNING" if "-r2-" in task else "TASK_KILLED"
        backend.on_update(_status(task, state, "a2", reason="REASON_RECONCILIATION"))
    info = backend.containers()[4]
    assert (info.id, info.run, info.state) == ("cosched-job-4-r2-0123abcd", 2, "running")


def test_a_run_the_state_file_records_is_known_before_the_master_tells_of_it() -> None:
    """After a master failover the new master answers for no task of an agent that has not
    re-registered. A restarted daemon's recovery saw no run of job 6 and recorded it failed
    while it ran on. Now the run it records (a gang on both nodes, one part told by
    reconciliation) is expected: listed running, its untold part asked for by name until the
    master says it runs, and none of its parts killed as a broken gang."""
    backend = _backend()
    backend.agents = ["a1", "a2"]
    asked: list[list[tuple[str, str | None]]] = []
    backend.client.reconcile = asked.append  # type: ignore[method-assign, assignment]
    handle = "cosched-job-6-r2-0123abcd"
    backend.on_update(_status(f"{handle}-0of2-1c", "TASK_RUNNING", "a1", reason="REASON_RECONCILIATION"))
    backend.expect(handle, 6, ((0, 1), (1, 1)))
    info = backend.containers()[6]
    assert (info.id, info.state, info.run) == (handle, "running", 2)
    assert not any(task.killed for task in backend.runs[handle].tasks.values())
    for call in backend._ask_unanswered(time.monotonic()):
        call()
    assert asked == [[(f"{handle}-1of2-1c", "a2")]]
    assert backend._ask_unanswered(time.monotonic()) == []  # asked again only after ASK_FIRST s
    backend.on_update(_status(f"{handle}-1of2-1c", "TASK_RUNNING", "a2", reason="REASON_RECONCILIATION"))
    assert backend._ask_unanswered(time.monotonic() + 3600) == []  # answered: no more asks
    assert backend.unsized() == [(handle, 6)]  # its size is the daemon's to tell, as for any run learnt


def _reconciled(backend: MesosBackend, asked: list[list[tuple[str, str | None]]], finish: bool = True) -> None:
    """The start's reconciliation (`_settle`), the master answering its marker (it told all) if `finish`."""

    def reconcile(tasks: list[tuple[str, str | None]] | None = None) -> None:
        asked.append(tasks or [])
        marker = (tasks or [("", None)])[0][0]
        if finish and marker.startswith("cosched-reconciled-"):
            backend.on_update({"task_id": {"value": marker}, "state": "TASK_LOST", "reason": "REASON_RECONCILIATION"})

    backend.client.reconcile = reconcile  # type: ignore[method-assign, assignment]
    backend._settle(limit=0.05)
    asked.clear()


def test_a_launch_the_state_file_records_is_asked_for_only_where_its_agent_was_not_back() -> None:
    """A daemon SIGKILLed mid-launch left jobs `launching`; reconciliation told nothing of them. Where
    each agent of the run's slots had offered when the start's reconciliation began, the master
    told all it holds: the launch never went out, and recovery queues the job. After a master
    failover an agent not re-registered yet may hold the task: that run is expected under the
    handle its launch gave it (the job's and run's alone), listed running, and asked for by name."""
    backend = _backend()
    backend.agents, backend.hostnames = ["a1", ""], {"a1": "agent1"}
    asked: list[list[tuple[str, str | None]]] = []
    backend.on_update(_status("cosched-job-8-r4-0of2-1c", "TASK_STARTING", "a1", reason="REASON_RECONCILIATION"))
    _reconciled(backend, asked)  # agent2 not back yet
    backend.expect_launch(5, 2, ((0, 1),))  # on agent1, which the master told of: never launched
    backend.expect_launch(6, 3, ((1, 1),))  # on agent2: perhaps there
    backend.expect_launch(7, 1, ((0, 1), (1, 1)))  # a gang with a part there
    backend.expect_launch(8, 4, ((0, 1), (1, 1)))  # a gang whose part on agent1 the master told of
    listed = backend.containers()
    assert sorted(listed) == [6, 7, 8]
    assert (listed[6].id, listed[6].state, listed[6].run) == ("cosched-job-6-r3", "running", 3)
    assert listed[8].state == "running"  # its part on agent2 expected: not a gang never whole ("created")
    assert not any(task.killed for task in backend.runs["cosched-job-8-r4"].tasks.values())
    for call in backend._ask_unanswered(time.monotonic()):
        call()
    assert asked == [
        [
            ("cosched-job-6-r3-0of1-1c", None),
            ("cosched-job-7-r1-0of2-1c", "a1"),
            ("cosched-job-7-r1-1of2-1c", None),
            ("cosched-job-8-r4-1of2-1c", None),
        ]
    ]


@pytest.mark.parametrize("case", ["reconciliation unfinished", "a rebuild"])
def test_a_launch_is_asked_for_wherever_reconciliation_did_not_finish_and_never_in_a_rebuild(case: str) -> None:
    """A reconciliation that did not finish told nothing for sure: each launch is asked for. A
    rebuild (a failed pass) recovers in the same process, which made every launch since its start:
    a launch it gave up on (forgotten) was held running for good, its updates dropped (a helper's
    review)."""
    backend = _backend()
    backend.agents, backend.hostnames = ["a1", ""], {"a1": "agent1"}
    asked: list[list[tuple[str, str | None]]] = []
    _reconciled(backend, asked, finish=case == "a rebuild")
    if case == "a rebuild":
        backend._recovered = True
    if case == "reconciliation unfinished":
        backend.expect_launch(5, 2, ((0, 1),))  # agent1 offered, but the master may not have told all
        assert sorted(backend.containers()) == [5]
    else:
        backend.expect_launch(5, 2, ((1, 1),))  # agent2 not back, but the launch is this process's own
        assert sorted(backend.containers()) == []


def test_an_expected_run_whose_agent_is_not_back_is_the_jobs_and_is_not_messaged() -> None:
    """After a failover its agent made no offer yet (its id unknown): a quota change has no one to
    ask and says so at once (it waited the whole quota timeout, holding up the restart's recovery).
    An older run of the job that reconciliation told of is not taken for it."""
    backend = _backend()
    backend.agents = ["a1", ""]
    stale = "cosched-job-6-0123abcd"  # a daemon of before runs were numbered launched it
    backend.on_update(_status(f"{stale}-0of1-1c", "TASK_RUNNING", "a1", reason="REASON_RECONCILIATION"))
    handle = "cosched-job-6-r3-4567abcd"
    backend.expect(handle, 6, ((1, 1),))
    assert backend.containers()[6].id == handle
    started = time.monotonic()
    with pytest.raises(QuotaMismatch, match="its agent is not known yet"):
        backend.set_quota(handle, 0.5)
    assert time.monotonic() - started < 1
    # Asked for without its agent, a master answers TASK_LOST for a task it does not know, even one
    # whose agent is on its way back: passed over (the job was queued again while it ran there).
    task = f"{handle}-0of1-1c"
    backend.on_update({"task_id": {"value": task}, "state": "TASK_LOST", "reason": "REASON_RECONCILIATION"})
    assert backend.containers()[6].state == "running" and backend.runs[handle].tasks[0].state == "TASK_STAGING"
    backend.agents[1] = "a2"  # its agent offers: asked again, by name
    asked: list[list[tuple[str, str | None]]] = []
    backend.client.reconcile = asked.append  # type: ignore[method-assign, assignment]
    for call in backend._ask_unanswered(time.monotonic() + 3600):
        call()
    assert asked == [[(task, "a2")]]
    assert backend.verify_quota(handle, 0.5) is False  # nothing read, no one to ask: not a mismatch yet
    backend.on_update(_status(task, "TASK_RUNNING", "a2", reason="REASON_RECONCILIATION"))
    assert backend.runs[handle].tasks[0].agent_id == "a2" and backend._unanswered == {}
    # Its agent back, the quota the restart could not apply is a mismatch the review applies (it was
    # left as it was for the rest of the run: a lending that ended meanwhile gave back nothing).
    with pytest.raises(QuotaMismatch, match="never read since the restart"):
        backend.verify_quota(handle, 0.5)

"""Draining a node (`cosched drain`, `cosched resume`): no job starts there, running ones finish,
reservations never count on it, and the drain survives a restart.

The core's part (what a drained node's jobs give back) is checked without an engine; the API in
process; the whole daemon on the real engine.
"""

from __future__ import annotations

import json
import math
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import DaemonProcess, require_engine
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from cosched.core.events import JobSubmitted, Launch, Offer
from cosched.core.frees import ends_to_come, releases
from cosched.core.scheduler import Scheduler
from cosched.daemon.api import create_app
from cosched.daemon.config import from_dict, validate
from cosched.daemon.identity import create_key, load_key, mint
from cosched.daemon.service import Daemon
from cosched.model import Cluster, Job, JobState
from cosched.policies.registry import create
from workloads.images import busybox_image

# -- the core: what a drained node's jobs give back ----------------------------------------------------


def running(job_id: int, slots: tuple[tuple[int, int], ...], end: float, host: int = -1) -> Job:
    job = Job(job_id, 0.0, sum(c for _, c in slots), end, end)
    job.state, job.start, job.slots, job.host, job.need = JobState.RUNNING, 0.0, slots, host, job.cores
    job.expected_end = end
    return job


def core_of(cluster: Cluster) -> Scheduler:
    policies = [create(kind, name) for kind, name in [("queue", "fcfs"), ("backfill", "easy")]]
    return Scheduler(cluster, *policies, create("estimate", "requested"), create("placement", "first-fit"))


LENDINGS = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=3, unique_by=lambda s: s[0]),
        st.integers(1, 100),
        st.booleans(),
        st.integers(1, 200),
    ),
    min_size=1,
    max_size=6,
)
"""Hosts (slots, expected end), each perhaps with a guest on half its cores (its expected end)."""


def lendings(
    specs: list[tuple[list[tuple[int, int]], int, bool, int]],
) -> tuple[list[Job], dict[int, list[Job]], dict[int, Job]]:
    """The running hosts (by expected end), their guests by host, and every job by id."""
    jobs: dict[int, Job] = {}
    guests: dict[int, list[Job]] = {}
    hosts = []
    for index, (slots, end, has_guest, guest_end) in enumerate(specs):
        host = running(index * 2 + 1, tuple(slots), float(end))
        hosts.append(host)
        jobs[host.id] = host
        if has_guest:
            share = tuple((node, max(1, cores // 2)) for node, cores in slots)
            guest = running(index * 2 + 2, share, float(guest_end), host=host.id)
            jobs[guest.id] = guest
            guests[host.id] = [guest]
    hosts.sort(key=lambda job: job.expected_end)
    return hosts, guests, jobs


@given(LENDINGS, st.sets(st.integers(0, 3)))
def test_reservations_count_only_what_comes_back_from_nodes_still_in_service(
    specs: list[tuple[list[tuple[int, int]], int, bool, int]], drained: set[int]
) -> None:
    """Hosts, some with a guest on a share of their cores that may outlive them: whatever the
    order of ends, the units released add up to the hosts' cores on nodes not drained, and no
    release is negative (a guest's withheld units are its host's, not counted twice)."""
    hosts, guests, jobs = lendings(specs)
    withheld = {job.id: units for job in jobs.values() if (units := sum(c for n, c in job.slots if n in drained))}
    released = list(releases(hosts, guests, jobs, 0.0, withheld))
    assert all(units >= 0 for _, units in released)
    assert [t for t, _ in released] == sorted(t for t, _ in released)
    expected = sum(c for job in hosts for n, c in job.slots if n not in drained)
    assert sum(units for _, units in released) == expected


@given(LENDINGS)
def test_the_ends_to_come_per_node_are_the_releases_per_time(
    specs: list[tuple[list[tuple[int, int]], int, bool, int]],
) -> None:
    """What the daemon owes other frameworks from the next ends (`ends_to_come`, per node) and what
    reservations count on (`releases`, in units) foresee the same ends: at every time, the same
    cores, and a guest's cores come back from the host's end or from its own, never from both."""
    hosts, guests, jobs = lendings(specs)
    per_time: dict[float, int] = {}
    for at, units in releases(hosts, guests, jobs, 0.0):
        per_time[at] = per_time.get(at, 0) + units
    ends = ends_to_come(hosts, guests, jobs)
    per_node_time: dict[float, int] = {}
    for at, _, slots in ends:
        per_node_time[at] = per_node_time.get(at, 0) + sum(cores for _, cores in slots)
    assert per_node_time == {at: units for at, units in per_time.items() if units or at in per_node_time}
    assert [(at, job_id) for at, job_id, _ in ends] == sorted((at, job_id) for at, job_id, _ in ends)


def test_a_withheld_job_is_no_promise_for_the_head() -> None:
    """Two nodes of 4 cores: job 1 holds 2 cores of node 0 until 50, job 2 all of node 1 until 100;
    the head needs 8 cores, and a 2-core job of 200 s waits behind it. Node 1 in service: the head
    is promised 100, and the small job, which would delay it, waits. Node 1 drained: nothing job 2
    holds comes back, the head can be promised no start, and the small job is backfilled."""
    cluster = Cluster(2, 4)
    outcomes = []
    for drained in (False, True):
        core = core_of(cluster)
        first, second = Job(1, 0.0, 2, 50.0, 50.0), Job(2, 0.0, 4, 100.0, 100.0)
        core.step(0.0, [Offer(((0, 4), (1, 4))), JobSubmitted(second), JobSubmitted(first)])
        if drained:
            core.withhold({2: 4})
        head, small = Job(3, 1.0, 8, 10.0, 10.0), Job(4, 1.0, 2, 200.0, 200.0)
        decision = core.step(1.0, [JobSubmitted(head), JobSubmitted(small)])
        started = {action.job.id for action in decision.actions if isinstance(action, Launch)}
        outcomes.append((decision.reservations.get(3), started))
    assert outcomes[0] == (100.0, set())
    assert outcomes[1][0] in (None, math.inf) and outcomes[1][1] == {4}


# -- the API, in process ---------------------------------------------------------------------------------


def make_daemon(root: Path, **api: Any) -> Daemon:
    document = {
        "daemon": {"state_dir": str(root / "state"), "instance": "draintest"},
        "api": api,
        "cluster": {"nodes": 2, "cores": 2, "memory_mib": 4096},
    }
    return Daemon(validate(from_dict(document)))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    require_engine()
    daemon = make_daemon(tmp_path)
    yield daemon
    daemon.store.close()


def test_drain_and_resume_answer_and_the_drain_is_kept_in_the_state_file(daemon: Daemon, tmp_path: Path) -> None:
    with TestClient(create_app(daemon)) as client:
        answer = client.post("/v1/nodes/1/drain", json={"reason": "  fan replaced  "})
        assert answer.status_code == 200, answer.text
        assert answer.json()["reason"] == "fan replaced" and answer.json()["node"] == 1
        [first, second] = client.get("/v1/nodes").json()
        assert first["drain"] is None and second["drain"]["state"] == "drained"
        assert second["drain"]["reason"] == "fan replaced"
        for path, body, code, words in [
            ("/v1/nodes/2/drain", {"reason": "x"}, 404, "node 2: no such node (the cluster has nodes 0 to 1)"),
            ("/v1/nodes/-1/drain", {"reason": "x"}, 404, "node -1: no such node"),
            ("/v1/nodes/0/drain", {"reason": " "}, 422, "reason: say why, in 1 to 200 printable characters"),
            ("/v1/nodes/0/drain", {"reason": "a\x1b[2Jb"}, 422, "reason: say why"),
            ("/v1/nodes/0/drain", {"reason": "x" * 201}, 422, "reason"),
            ("/v1/nodes/0/drain", {}, 422, "reason"),
            ("/v1/nodes/0/resume", None, 409, "node 0 is not drained"),
        ]:
            refused = client.post(path, json=body)
            assert refused.status_code == code, (path, refused.text)
            assert refused.json()["error"].startswith(words), refused.text
    again = make_daemon(tmp_path)  # a restart reads it back
    try:
        assert set(again.drained) == {1} and again.drained[1].reason == "fan replaced"
        with TestClient(create_app(again)) as client:
            assert client.post("/v1/nodes/1/resume").json()["reason"] == "fan replaced"
            assert client.post("/v1/nodes/1/resume").status_code == 409
    finally:
        again.store.close()
    assert make_daemon(tmp_path).drained == {}


def test_only_an_operator_drains_or_resumes(tmp_path: Path) -> None:
    require_engine()
    key_file = tmp_path / "api.key"
    assert create_key(key_file)
    daemon = make_daemon(tmp_path, key_file=str(key_file), operators=["ops"])
    user = {"authorization": f"Bearer {mint(load_key(key_file), 'alice', 600)}"}
    ops = {"authorization": f"Bearer {mint(load_key(key_file), 'ops', 600)}"}
    try:
        with TestClient(create_app(daemon)) as client:
            refused = client.post("/v1/nodes/0/drain", json={"reason": "mine now"}, headers=user)
            assert refused.status_code == 403
            assert refused.json()["error"] == "node 0: only an operator may drain a node, not alice"
            assert daemon.drained == {}
            drained = client.post("/v1/nodes/0/drain", json={"reason": "disk", "by": "bob"}, headers=ops).json()
            assert (drained["by"], drained["reason"]) == ("ops", "disk")
            assert client.post("/v1/nodes/0/resume", headers=user).status_code == 403 and daemon.drained
    finally:
        daemon.store.close()


# -- the daemon on the real engine -----------------------------------------------------------------------


@pytest.fixture
def image() -> str:
    return busybox_image(require_engine())


def node_of(daemon: DaemonProcess, job_id: int) -> int:
    with daemon.db() as db:
        slots = db.execute("SELECT slots FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
    return int(json.loads(slots)[0][0])


def test_a_drained_node_runs_its_jobs_out_takes_no_new_one_and_stays_drained_across_a_restart(
    tmp_path: Path, image: str
) -> None:
    """Two nodes of one core. Job X runs on node 0, job Y (3 s) on node 1; node 1 is drained. A new
    job Z waits although Y ends and node 1's core is free; the daemon is SIGKILLed and started again,
    node 1 is still drained and Z still waits; once node 1 is resumed, Z runs there."""
    engine = require_engine()
    daemon = DaemonProcess(tmp_path, cores=2, cluster="nodes = 2")
    daemon.start()
    try:
        busy = daemon.submit(image=image, command=["sleep", "600"], cores=1, walltime=900)
        daemon.wait_running(busy)
        short = daemon.submit(image=image, command=["sleep", "3"], cores=1, walltime=60)
        daemon.wait_running(short)
        assert (node_of(daemon, busy), node_of(daemon, short)) == (0, 1)
        assert daemon.cli("drain", "node1", "--reason", "memory test") == "node1: draining (memory test)\n"
        shown = daemon.cli("nodes")
        assert "draining (memory test)" in shown, shown
        waiting = daemon.submit(image=image, command=["true"], cores=1, walltime=60)
        wide = daemon.submit(image=image, command=["true"], cores=2, span=True, walltime=60)
        assert daemon.wait_final([short], 30)[short]["state"] == "done"
        time.sleep(3)  # passes run every 0.2 s: the free core of node 1 is never given to the waiting job
        assert daemon.job(waiting)["state"] == "pending"
        assert "drained (memory test)" in daemon.cli("nodes")
        reasons = {row["id"]: row["reason"] for row in daemon.client.call("GET", "/v1/queue")}
        assert reasons[wide] == "ReqNodeNotAvail: node1 drained"  # two cores: more than node 0 alone
        assert not reasons[waiting].startswith("ReqNodeNotAvail")
        metrics = urllib.request.urlopen(daemon.client.url + "/metrics", timeout=10).read().decode()
        assert "cosched_nodes_drained 1.0" in metrics

        daemon.signal(signal.SIGKILL)
        daemon.start()
        time.sleep(3)
        assert daemon.job(waiting)["state"] == "pending" and daemon.job(busy)["state"] == "running"
        assert "drained (memory test)" in daemon.cli("nodes")

        assert daemon.cli("resume", "1").startswith("node1: resumed (drained since ")
        assert daemon.wait_final([waiting], 30)[waiting]["state"] == "done"
        daemon.client.call("DELETE", f"/v1/jobs/{wide}")
        assert node_of(daemon, waiting) == 1
        assert "drain" not in daemon.cli("nodes")
        daemon.client.call("DELETE", f"/v1/jobs/{busy}")
        daemon.wait_final([busy], 30)
    finally:
        daemon.cleanup(engine)

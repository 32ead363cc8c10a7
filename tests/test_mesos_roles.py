"""A framework role and the agents' reservations for it: launches cut from reserved pieces first.

Unit tests of `cosched.mesos.carve` and the role's config check; the real-master tests reserve part of
each agent for the role (an operator's dynamic reservation, `/master/reserve`) and run jobs there.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import require_engine
from hypothesis import given
from hypothesis import strategies as st
from mesos_support import Cluster, finish, framework_id_of, mesos_daemon, start_cluster, stop_cluster, wait_until

from cosched.daemon.config import from_dict, validate
from cosched.errors import ConfigError
from cosched.mesos import calls
from cosched.mesos.carve import carve, reserved
from cosched.mesos.errors import MesosError
from cosched.mesos.offers import Offer, parse_offer
from workloads.images import busybox_image

ROLE = "hpc"


def scalar(name: str, value: float, **fields: Any) -> dict[str, Any]:
    return {"name": name, "type": "SCALAR", "scalar": {"value": value}, **fields}


def for_role(name: str, value: float) -> dict[str, Any]:
    """A piece reserved for ROLE, as a MULTI_ROLE framework with reservation refinement is offered it."""
    return scalar(name, value, allocation_info={"role": ROLE}, reservations=[{"type": "DYNAMIC", "role": ROLE}])


def unreserved(name: str, value: float) -> dict[str, Any]:
    return scalar(name, value, allocation_info={"role": ROLE})


def offer_of(offer_id: str, *pieces: dict[str, Any]) -> Offer:
    raw = {"id": {"value": offer_id}, "agent_id": {"value": "S1"}, "hostname": "agent1", "resources": list(pieces)}
    return parse_offer(raw, 0.0)


def task(task_id: str, cpus: float, mem: float, executor: tuple[float, float] | None = (0.05, 64.0)) -> dict[str, Any]:
    info: dict[str, Any] = {
        "task_id": {"value": task_id},
        "resources": [scalar("cpus", cpus), scalar("mem", mem)],
    }
    if executor is not None:
        info["executor"] = {
            "executor_id": {"value": task_id},
            "resources": [scalar("cpus", executor[0]), scalar("mem", executor[1])],
        }
    return info


def totals(resources: list[dict[str, Any]], name: str, *, reserved_only: bool | None = None) -> float:
    return sum(
        r["scalar"]["value"]
        for r in resources
        if r["name"] == name and (reserved_only is None or reserved(r) == reserved_only)
    )


def test_a_task_takes_the_reserved_pieces_first_and_the_rest_unreserved() -> None:
    offers = [
        offer_of("O1", unreserved("cpus", 2.0), unreserved("mem", 1024.0)),
        offer_of("O2", for_role("cpus", 1.5), for_role("mem", 256.0)),
    ]
    [info] = carve(offers, [task("t1", 2.0, 512.0)])
    executor = info["executor"]["resources"]
    # the executor comes after its task: the task took 1.5 reserved cpus and all 256 reserved MiB
    assert totals(info["resources"], "cpus", reserved_only=True) == 1.5
    assert totals(info["resources"], "cpus", reserved_only=False) == 0.5
    assert totals(info["resources"], "mem", reserved_only=True) == 256.0
    assert totals(info["resources"], "mem", reserved_only=False) == 256.0
    assert totals(executor, "cpus", reserved_only=False) == 0.05 and totals(executor, "mem") == 64.0
    for piece in info["resources"] + executor:  # each entry is its piece, role and reservations kept
        assert piece["allocation_info"] == {"role": ROLE}


def test_a_default_role_offer_is_sent_back_as_it_came() -> None:
    """Without a role, offers carry no role fields: the task asks what it asked before."""
    offers = [offer_of("O1", scalar("cpus", 4.0), scalar("mem", 4096.0))]
    [info] = carve(offers, [task("t1", 2.0, 512.0, executor=None)])
    assert info["resources"] == [scalar("cpus", 2.0), scalar("mem", 512.0)]


def test_pieces_are_shared_out_across_tasks_and_never_spent_twice() -> None:
    offers = [offer_of("O1", for_role("cpus", 1.0), unreserved("cpus", 1.2), unreserved("mem", 300.0))]
    first, second = carve(offers, [task("a", 1.0, 100.0, None), task("b", 1.2, 200.0, None)])
    assert totals(first["resources"], "cpus", reserved_only=True) == 1.0
    assert totals(second["resources"], "cpus", reserved_only=False) == pytest.approx(1.2)
    assert totals(second["resources"], "cpus", reserved_only=True) == 0
    with pytest.raises(MesosError, match=r"lack 0\.1 cpus for task c$"):
        carve(offers, [task("a", 1.0, 100.0, None), task("b", 1.1, 100.0, None), task("c", 0.2, 1.0, None)])


@given(
    st.lists(st.tuples(st.booleans(), st.integers(1, 4000), st.integers(1, 4000)), min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 3000)), min_size=1, max_size=5),
)
def test_what_is_carved_is_what_was_asked_from_what_was_offered(
    pieces: list[tuple[bool, int, int]], asks: list[tuple[int, int]]
) -> None:
    """Amounts in thousandths: each task gets exactly its cpus and mem, no piece pays out more than
    it holds, and carving fails exactly when the offers' sum is short."""
    offer_pieces = []
    for is_reserved, cpus, mem in pieces:
        make = for_role if is_reserved else unreserved
        offer_pieces += [make("cpus", cpus / 1000), make("mem", float(mem))]
    offers = [offer_of("O1", *offer_pieces)]
    infos = [task(f"t{i}", cpus / 1000, float(mem), None) for i, (cpus, mem) in enumerate(asks)]
    enough = sum(c for _, c, _ in pieces) >= sum(c for c, _ in asks) and sum(m for _, _, m in pieces) >= sum(
        m for _, m in asks
    )
    if not enough:
        with pytest.raises(MesosError, match="lack"):
            carve(offers, infos)
        return
    carved = carve(offers, infos)
    for info, (cpus, mem) in zip(carved, asks, strict=True):
        assert round(totals(info["resources"], "cpus") * 1000) == cpus
        assert round(totals(info["resources"], "mem")) == mem
    spent = [r for info in carved for r in info["resources"]]
    for name in ("cpus", "mem"):
        for kind in (True, False):
            offered = totals(offer_pieces, name, reserved_only=kind)
            assert totals(spent, name, reserved_only=kind) <= offered + 1e-9
    reserved_cpus = totals(offer_pieces, "cpus", reserved_only=True)
    assert totals(spent, "cpus", reserved_only=True) == pytest.approx(
        min(reserved_cpus, sum(c for c, _ in asks) / 1000)
    )


def test_the_role_goes_into_the_subscription_with_its_capabilities() -> None:
    info = calls.framework_info(name="cosched", user="root", framework_id=None, roles=[ROLE])
    assert info["roles"] == [ROLE]
    assert {c["type"] for c in info["capabilities"]} == {"MULTI_ROLE", "RESERVATION_REFINEMENT"}
    assert "roles" not in calls.framework_info(name="cosched", user="root", framework_id=None)


@pytest.mark.parametrize(
    ("role", "problem"),
    [
        ("/hpc", "single slashes"),
        ("hpc/", "single slashes"),
        ("eng//hpc", "single slashes"),
        ("eng/../hpc", "'..'"),
        ("eng/*", "'\\*'"),
        ("-hpc", "dash"),
        ("h pc", "whitespace"),
    ],
)
def test_a_role_the_master_would_refuse_is_a_one_line_config_error(role: str, problem: str) -> None:
    raw = {"backend": {"kind": "mesos"}, "mesos": {"masters": "127.0.0.1:5050", "role": role}}
    with pytest.raises(ConfigError, match=rf"^config key mesos\.role: .* is not a Mesos role: .*{problem}"):
        validate(from_dict(raw))
    for good in ("hpc", "eng/hpc", "*"):
        assert validate(from_dict({**raw, "mesos": {**raw["mesos"], "role": good}})).mesos.role == good


# -- on a real master ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two agents of 2 CPUs and 2048 MiB; an operator reserves 1.2 CPUs and 500 MiB of each for ROLE."""
    started = start_cluster(Path(tmp_path_factory.mktemp("mesos-roles")), cpus=2, mem=2048)
    try:
        for agent in started.state()["slaves"]:
            reserve(started, agent["id"], 1.2, 500.0)
        wait_until(lambda: all(_reserved(a) for a in started.state()["slaves"]), 20, "the reservations")
        yield started
    finally:
        stop_cluster(started)


def reserve(cluster: Cluster, agent_id: str, cpus: float, mem: float) -> None:
    """The operator endpoint's dynamic reservation for ROLE (no principal: the master does not authenticate)."""
    pieces = [
        {**scalar(name, value), "reservations": [{"type": "DYNAMIC", "role": ROLE}]}
        for name, value in (("cpus", cpus), ("mem", mem))
    ]
    data = urllib.parse.urlencode({"slaveId": agent_id, "resources": json.dumps(pieces)}).encode()
    urllib.request.urlopen(f"http://{cluster.master}/master/reserve", data=data, timeout=10).close()


def _reserved(agent: dict[str, Any]) -> bool:
    return ROLE in agent.get("reserved_resources", {})


def _tasks_of(cluster: Cluster, fid: str, job_id: int) -> list[dict[str, Any]]:
    framework = cluster.framework(fid) or {"tasks": [], "completed_tasks": []}
    tasks = list(framework["tasks"]) + list(framework["completed_tasks"])
    return [t for t in tasks if t["name"] == f"cosched job {job_id}"]


def test_a_job_in_the_role_runs_on_the_reserved_resources_and_the_unreserved_rest(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Each agent has 1.2 CPUs and 500 MiB reserved for the role, 0.8 CPUs and 1548 MiB unreserved.
    A 1-core, 700 MiB job takes its CPU and 500 MiB from the reservation and 200 MiB unreserved,
    as the master's task record shows. Asked plainly (unreserved), as before the role was read,
    its 1.05 CPUs are more than the 0.8 unreserved there, and the master refuses the task."""
    image = busybox_image(require_engine())
    daemon = mesos_daemon(cluster, tmp_path, "cosched-role", mesos=f'role = "{ROLE}"')
    try:
        fid = framework_id_of(daemon)
        assert (cluster.framework(fid) or {})["roles"] == [ROLE]
        job = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=700, walltime=60)
        assert daemon.wait_final([job], 60)[job]["state"] == "done", daemon.job(job)["reason"]
        [ran] = _tasks_of(cluster, fid, job)
        assert ran["state"] == "TASK_FINISHED", ran
        used = _task_resources(cluster, fid, job)
        assert totals(used, "cpus", reserved_only=True) == 1.0 and totals(used, "cpus", reserved_only=False) == 0
        assert totals(used, "mem", reserved_only=True) == 500.0 and totals(used, "mem", reserved_only=False) == 200.0
        assert all(r["allocation_info"] == {"role": ROLE} for r in used)
    finally:
        finish(cluster, daemon)


def _tasks_of(cluster: Cluster, fid: str, job_id: int) -> list[dict[str, Any]]:
    framework = cluster.framework(fid) or {"tasks": [], "completed_tasks": []}
    tasks = list(framework["tasks"]) + list(framework["completed_tasks"])
    return [t for t in tasks if t["name"] == f"cosched job {job_id}"]


def _task_resources(cluster: Cluster, fid: str, job_id: int) -> list[dict[str, Any]]:
    """The job's task's resources (not its executor's) as the master's v1 operator API lists them: pieces
    with their reservations."""
    body = json.dumps({"type": "GET_TASKS"}).encode()
    request = urllib.request.Request(
        f"http://{cluster.master}/api/v1", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.load(response)["get_tasks"]
    tasks = answer.get("tasks", []) + answer.get("completed_tasks", [])
    [mine] = [t for t in tasks if t["framework_id"]["value"] == fid and t["name"] == f"cosched job {job_id}"]
    return list(mine["resources"])


def test_a_daemon_restarted_in_a_role_stays_the_same_framework(cluster: Cluster, tmp_path: Path) -> None:
    """An operator sets `role` on a daemon that ran without one: the restarted daemon subscribes as
    the same framework (its tasks stay its own), now in the role, and its jobs run on the reservation."""
    image = busybox_image(require_engine())
    daemon = mesos_daemon(cluster, tmp_path, "cosched-role-change")
    try:
        fid = framework_id_of(daemon)
        assert (cluster.framework(fid) or {}).get("role") == "*"
        daemon.stop()
        named = 'name = "cosched-role-change"'
        daemon.config.write_text(daemon.config.read_text().replace(named, f'{named}\nrole = "{ROLE}"'))
        daemon.start(timeout=60)
        assert framework_id_of(daemon) == fid and (cluster.framework(fid) or {})["roles"] == [ROLE]
        job = daemon.submit(image=image, command=["sleep", "1"], cores=1, memory_mib=700, walltime=60)
        assert daemon.wait_final([job], 60)[job]["state"] == "done", daemon.job(job)["reason"]
        assert totals(_task_resources(cluster, fid, job), "mem", reserved_only=True) == 500.0
    finally:
        finish(cluster, daemon)

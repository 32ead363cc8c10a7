"""Nodes numbered by the agents' attributes (`[mesos] order_by`), so that a fat-tree's switches are
runs of consecutive nodes on a real cluster as in replay.

Unit tests feed the backend offers; the real-master test starts agents of its own, each with its
`--attributes`, and reads the daemon's nodes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import DaemonProcess
from mesos_support import EXECUTOR, MESOS_HOME, Cluster, free_port_run, start_cluster, stop_cluster, wait_until

from cosched.daemon.config import from_dict, validate
from cosched.errors import ConfigError
from cosched.mesos.backend import MesosBackend, MesosSettings
from cosched.mesos.offers import parse_offer


def raw(offer_id: str, agent: str, hostname: str, **attributes: Any) -> dict[str, Any]:
    return {
        "id": {"value": offer_id},
        "agent_id": {"value": agent},
        "hostname": hostname,
        "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 2.0}}],
        "attributes": [
            {"name": name, "type": "SCALAR", "scalar": {"value": value}}
            if isinstance(value, float)
            else {"name": name, "type": "TEXT", "text": {"value": value}}
            for name, value in attributes.items()
        ],
    }


def test_an_offer_carries_its_agents_text_and_scalar_attributes() -> None:
    offer = raw("o1", "a1", "n1", rack="r2", slot=3.0)
    offer["attributes"].append({"name": "gpus", "type": "SET", "set": {"item": ["a"]}})
    assert parse_offer(offer, 0.0).attributes == (("rack", "r2"), ("slot", "3"))


def test_the_first_start_numbers_nodes_by_the_attributes_then_hostname(caplog: pytest.LogCaptureFixture) -> None:
    """Racks compared as numbers within their names (r9 before r10), hostnames within a rack; an
    agent without the attribute comes first, and the log says which nodes each rack has."""
    backend = MesosBackend(MesosSettings(masters="127.0.0.1:1", order_by=("rack",)), nodes=5)
    backend.on_offers(
        [
            raw("o1", "a1", "node-a", rack="r10"),
            raw("o2", "a2", "node-b", rack="r9"),
            raw("o3", "a3", "node-c", rack="r10"),
            raw("o4", "a4", "node-d", rack="r9"),
            raw("o5", "a5", "node-e"),
        ]
    )
    with caplog.at_level(logging.INFO, logger="cosched.mesos"), backend.cond:
        backend._map_nodes(timeout=0.0)
    assert backend.node_hosts == ["node-e", "node-b", "node-d", "node-a", "node-c"]
    assert "nodes by rack: node 0 rack=?; nodes 1-2 rack=r9; nodes 3-4 rack=r10" in caplog.text
    plain = MesosBackend(MesosSettings(masters="127.0.0.1:1"), nodes=3)
    plain.on_offers([raw("o1", "a1", "h10", rack="r1"), raw("o2", "a2", "h9", rack="r0"), raw("o3", "a3", "h1")])
    with plain.cond:
        plain._map_nodes(timeout=0.0)
    assert plain.node_hosts == ["h1", "h9", "h10"]  # no order_by: hostnames, numbers as numbers


@pytest.mark.parametrize("bad", ["", "rack switch", "rack:r1"])
def test_an_attribute_name_an_agent_cannot_have_is_a_one_line_config_error(bad: str) -> None:
    raw = {"backend": {"kind": "mesos"}, "mesos": {"masters": "127.0.0.1:5050", "order_by": ["pod", bad]}}
    with pytest.raises(ConfigError, match=r"^config key mesos\.order_by: .* is not an agent attribute's name$"):
        validate(from_dict(raw))


# -- on a real master --------------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A master alone; the test starts its agents."""
    started = start_cluster(tmp_path / "mesos", agents=0)
    try:
        wait_until(lambda: _answers(started), 30, "the master to answer")  # the script waits for agents only
        yield started
    finally:
        stop_cluster(started)


def _answers(cluster: Cluster) -> bool:
    try:
        cluster.state()
    except OSError:
        return False
    return True


def start_agent(cluster: Cluster, index: int, hostname: str, attributes: str) -> None:
    """An agent as `local-cluster.sh` starts one, with `--attributes`."""
    work = cluster.run_dir / f"agent{index}"
    work.mkdir(parents=True, exist_ok=True)
    port = free_port_run(1)
    argv = [
        str(MESOS_HOME / "sbin" / "mesos-agent"),
        f"--master={cluster.master}",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--hostname={hostname}",
        f"--work_dir={work / 'work'}",
        f"--runtime_dir={work / 'run'}",
        f"--log_dir={work}",
        f"--launcher_dir={MESOS_HOME / 'libexec' / 'mesos'}",
        "--resources=cpus:1.1;mem:512;disk:1024",
        f"--attributes={attributes}",
        "--containerizers=mesos",
        "--launcher=posix",
        "--isolation=posix/cpu,posix/mem",
        "--no-systemd_enable_support",
        "--switch_user=false",
    ]
    cluster.start_agent(index, [arg.encode() for arg in argv])


def test_a_daemon_numbers_real_agents_by_their_switch_and_shows_it(cluster: Cluster, tmp_path: Path) -> None:
    """Four agents whose hostnames run across two switches (s10: agent1, agent3; s9: agent2, agent4):
    with a fat-tree of 2 nodes per switch and `order_by = ["switch"]`, nodes 0-1 are switch s9's and
    2-3 switch s10's, and `cosched nodes` shows each agent's attributes. An agent is drained by its
    hostname."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(MESOS_HOME / "lib"))
    cluster.env.update(env)
    for index, (hostname, switch) in enumerate(
        [("agent1", "s10"), ("agent2", "s9"), ("agent3", "s10"), ("agent4", "s9")], start=1
    ):
        start_agent(cluster, index, hostname, f"switch:{switch};pod:p0")
    wait_until(lambda: cluster.active_agents() == 4, 60, "four agents registered")
    (tmp_path / "daemon").mkdir()
    daemon = DaemonProcess(
        tmp_path / "daemon",
        cores=4,
        cluster="nodes = 4\nmemory_mib = 1024\nnodes_per_switch = 2\nswitches_per_pod = 2",
        data_roots=False,
        extra=(
            f'[backend]\nkind = "mesos"\n[mesos]\nmasters = "{cluster.master}"\nname = "cosched-topology"\n'
            f'executor_command = "{EXECUTOR}"\norder_by = ["pod", "switch"]\n'
            '[policies]\ncosched = "none"\nplacement = "contiguous"\n'
        ),
    )
    daemon.start(timeout=60)
    try:
        rows = daemon.client.call("GET", "/v1/nodes")
        assert [row["hostname"] for row in rows] == ["agent2", "agent4", "agent1", "agent3"]
        assert [row["attributes"]["switch"] for row in rows] == ["s9", "s9", "s10", "s10"]
        shown = subprocess.run(
            [sys.executable, "-m", "cosched.cli", "nodes", "--url", daemon.client.url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "switch=s9 pod=p0" in shown, shown  # as the agent lists them
        assert "nodes by pod, switch: nodes 0-1 pod=p0 switch=s9; nodes 2-3 pod=p0 switch=s10" in daemon.log.read_text()
        drained = subprocess.run(  # an operator names the machine, not the node number
            [sys.executable, "-m", "cosched.cli", "drain", "agent4", "--reason", "PSU", "--url", daemon.client.url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert drained == "node1: drained (PSU)\n"
        drains = [row["drain"] for row in daemon.client.call("GET", "/v1/nodes")]
        assert [drain is not None for drain in drains] == [False, True, False, False]
    finally:
        daemon.stop()

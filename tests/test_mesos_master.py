"""The scheduler client against a REAL Mesos master with two agents (see tests/mesos_support.py).

Each test subscribes its own framework and tears it down at the end, so no task outlives the test;
every wait is bounded.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mesos_support import Cluster, Recorder, command_task, start_cluster, stop_cluster, wait_until

from cosched.mesos import NotSubscribed, SchedulerClient, SchedulerConfig, calls
from cosched.mesos.masters import DiscoveryFailed, parse_zookeeper, zookeeper_masters


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(Path(tmp_path_factory.mktemp("mesos")))
    try:
        yield started
    finally:
        stop_cluster(started)


def subscribed(cluster: Cluster, recorder: Recorder, name: str, **settings: Any) -> SchedulerClient:
    client = cluster.client(recorder, name, **settings).start()
    assert client.wait_subscribed(15), f"no SUBSCRIBED from {cluster.master}: {client.failure}"
    return client


def offers_from_both(recorder: Recorder) -> dict[str, dict[str, Any]]:
    """The first offer of each agent, by hostname."""
    both = lambda: recorder.offers_from("agent1") and recorder.offers_from("agent2")  # noqa: E731
    recorder.wait(both, 15, "offers from both agents")
    return {host: recorder.offers_from(host)[0] for host in ("agent1", "agent2")}


def finish(client: SchedulerClient) -> None:
    if client.subscribed:
        client.teardown()
    client.stop()


class RaisingRecorder(Recorder):
    """Records, then raises: the client must log it, keep the framework and still acknowledge."""

    def on_update(self, status: dict[str, Any]) -> None:
        super().on_update(status)
        raise RuntimeError("a bug in the framework's update handler")


def test_launch_is_acknowledged_and_finishes_despite_a_raising_handler(cluster: Cluster) -> None:
    recorder = RaisingRecorder()
    persisted: list[str] = []
    client = cluster.client(recorder, "launch", on_framework_id=persisted.append).start()
    try:
        assert client.wait_subscribed(15), client.failure
        assert persisted == [client.framework_id]
        offers = offers_from_both(recorder)
        offer, other = offers["agent1"], offers["agent2"]
        task = command_task("t-finish", offer["agent_id"]["value"], "sleep 0.5")
        client.accept([offer["id"]["value"]], [calls.launch([task])], refuse_seconds=1)
        client.decline([other["id"]["value"]], refuse_seconds=1)
        recorder.wait(lambda: "TASK_FINISHED" in recorder.states("t-finish"), 30, "TASK_FINISHED")
        assert recorder.states("t-finish") == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
        assert client.handler_errors >= 3

        # The master drops a terminal task from `tasks` only once its terminal update is acknowledged.
        fid = client.framework_id or ""
        done = lambda: (f := cluster.framework(fid)) and f["completed_tasks"] and f  # noqa: E731
        framework = wait_until(done, 10, "the task to complete on the master")
        assert framework["active"] is True
        assert framework["tasks"] == [], f"unacknowledged tasks left: {framework['tasks']}"
        assert [t["state"] for t in framework["completed_tasks"]] == ["TASK_FINISHED"]
        assert cluster.metric("launch", fid, "calls/acknowledge") == 3
    finally:
        finish(client)


def test_declined_offer_stays_away_for_its_refuse_filter(cluster: Cluster) -> None:
    recorder = Recorder()
    client = subscribed(cluster, recorder, "decline")
    try:
        offers = offers_from_both(recorder)
        client.decline([offers["agent1"]["id"]["value"]], refuse_seconds=60)
        declined_at = time.monotonic()
        client.decline([offers["agent2"]["id"]["value"]], refuse_seconds=0.5)
        # agent2 comes back each time its short filter lapses (allocation runs every second); agent1 must not.
        for count in (2, 3):
            recorder.wait(lambda: len(recorder.offers_from("agent2")) >= count, 15, f"agent2 offered {count} times")  # noqa: B023
            client.decline([recorder.offers_from("agent2")[-1]["id"]["value"]], refuse_seconds=0.5)
        assert time.monotonic() - declined_at < 60
        assert len(recorder.offers_from("agent1")) == 1
        fid = client.framework_id or ""
        assert cluster.metric("decline", fid, "calls/decline") >= 2
        assert cluster.metric("decline", fid, "offers/declined") >= 2
        sent = cluster.metric("decline", fid, "offers/sent")
        assert sent == len(recorder.offers), "the master's count of offers sent matches what the client received"
    finally:
        finish(client)


def test_message_to_the_executor_then_kill_the_running_task(cluster: Cluster) -> None:
    recorder = Recorder()
    client = subscribed(cluster, recorder, "kill")
    try:
        offer = offers_from_both(recorder)["agent2"]
        agent = offer["agent_id"]["value"]
        client.accept([offer["id"]["value"]], [calls.launch([command_task("t-kill", agent, "sleep 120")])])
        recorder.wait(lambda: "TASK_RUNNING" in recorder.states("t-kill"), 30, "TASK_RUNNING")
        # A framework message is accepted (202) and relayed to the agent (the command executor id is the task id).
        client.message(agent, "t-kill", b'{"cpu_quota": 0.5}')
        relayed = lambda: cluster.get("/metrics/snapshot")["master/valid_framework_to_executor_messages"] >= 1  # noqa: E731
        wait_until(relayed, 10, "the master to relay the framework message")
        client.kill("t-kill", agent)
        recorder.wait(lambda: "TASK_KILLED" in recorder.states("t-kill"), 30, "TASK_KILLED")
        assert recorder.states("t-kill")[-1] == "TASK_KILLED"
    finally:
        finish(client)


def test_resubscribing_with_the_framework_id_keeps_the_running_task(cluster: Cluster) -> None:
    first = Recorder()
    client = subscribed(cluster, first, "failover")
    second_client: SchedulerClient | None = None
    try:
        offer = offers_from_both(first)["agent1"]
        agent = offer["agent_id"]["value"]
        client.accept([offer["id"]["value"]], [calls.launch([command_task("t-keep", agent, "sleep 120")])])
        first.wait(lambda: "TASK_RUNNING" in first.states("t-keep"), 30, "TASK_RUNNING")
        fid = client.framework_id or ""
        # Once STARTING and RUNNING are acknowledged, only reconciliation can tell the next client about the task
        # (an update left unacknowledged would simply be sent again).
        wait_until(lambda: cluster.metric("failover", fid, "calls/acknowledge") >= 2, 10, "two acknowledgements")
        client.stop()  # leaves without TEARDOWN, as a crashed daemon would
        assert client.wait_stopped(5)
        with pytest.raises(NotSubscribed):
            client.revive()

        inactive = lambda: (f := cluster.framework(fid)) and not f["active"] and f  # noqa: E731
        framework = wait_until(inactive, 10, "the master to see the framework gone")
        assert [t["state"] for t in framework["tasks"]] == ["TASK_RUNNING"]

        second = Recorder()
        second_client = subscribed(cluster, second, "failover", framework_id=fid)
        assert second_client.framework_id == fid and second.subscribed == [fid]
        # The client reconciles on subscription: the master answers with the task's state.
        second.wait(lambda: "TASK_RUNNING" in second.states("t-keep"), 15, "reconciled TASK_RUNNING")
        reconciled = next(u for u in second.updates if u["task_id"]["value"] == "t-keep")
        assert reconciled["reason"] == "REASON_RECONCILIATION" and "uuid" not in reconciled
        assert cluster.framework(fid)["active"] is True
    finally:
        client.stop()
        if second_client is not None:
            finish(second_client)


def test_suppress_stops_offers_and_revive_brings_them_back(cluster: Cluster) -> None:
    recorder = Recorder()
    client = subscribed(cluster, recorder, "suppress")
    try:
        offers = offers_from_both(recorder)
        client.suppress()
        client.decline([o["id"]["value"] for o in offers.values()], refuse_seconds=0.2)
        time.sleep(3)  # three allocation rounds, each past the 0.2 s filter
        assert len(recorder.offers) == 2, "no offer while suppressed"
        client.revive()
        recorder.wait(lambda: len(recorder.offers) >= 4, 15, "offers from both agents after REVIVE")
        fid = client.framework_id or ""
        assert cluster.metric("suppress", fid, "calls/suppress") == 1
        assert cluster.metric("suppress", fid, "calls/revive") == 1
    finally:
        finish(client)


def test_error_event_from_the_master_stops_the_client_with_one_line(cluster: Cluster) -> None:
    removed = subscribed(cluster, Recorder(), "removed")
    fid = removed.framework_id
    removed.teardown()

    recorder = Recorder()
    client = cluster.client(recorder, "removed", framework_id=fid).start()
    try:
        assert client.wait_stopped(15), "the client keeps running after ERROR"
        assert recorder.errors == ["Framework has been removed"]
        assert client.failure is not None and "\n" not in client.failure
        assert "Framework has been removed" in client.failure
        assert not client.subscribed and recorder.subscribed == []
    finally:
        client.stop()


def test_a_restarted_master_gets_the_framework_back_with_its_task(zk_cluster: Cluster) -> None:
    """With ZooKeeper and the replicated-log registry, the master restarts; the client re-subscribes by itself."""
    recorder = Recorder()
    client = subscribed(zk_cluster, recorder, "restart", backoff_base=0.2, backoff_cap=1.0)
    try:
        offer = offers_from_both(recorder)["agent1"]
        agent = offer["agent_id"]["value"]
        client.accept([offer["id"]["value"]], [calls.launch([command_task("t-survive", agent, "sleep 120")])])
        recorder.wait(lambda: "TASK_RUNNING" in recorder.states("t-survive"), 30, "TASK_RUNNING")
        fid = client.framework_id or ""
        wait_until(lambda: zk_cluster.metric("restart", fid, "calls/acknowledge") >= 2, 10, "acknowledgements")

        zk_cluster.restart_master()
        recorder.wait(lambda: len(recorder.subscribed) >= 2, 60, "re-subscription to the restarted master")
        assert recorder.subscribed == [fid, fid] and recorder.disconnects
        # Once the agent re-registered, the master knows the task RUNNING again, and says so when asked.
        wait_until(lambda: zk_cluster.task_states(fid) == ["TASK_RUNNING"], 60, "the task on the restarted master")
        seen = len(recorder.updates)
        client.reconcile()
        reconciled = lambda: recorder.updates_since(seen, "t-survive", "REASON_RECONCILIATION")  # noqa: E731
        # The client's own reconciliation after re-subscribing may answer in the same window: every answer counts.
        answers = recorder.wait(reconciled, 15, "the reconciliation answer")
        assert [a["state"] for a in answers] == ["TASK_RUNNING"] * len(answers)
    finally:
        finish(client)


def test_a_group_behind_a_digest_acl_is_read_with_its_credentials_only(zk_cluster: Cluster) -> None:
    """A site whose ZooKeeper guards the masters' group with a digest ACL: a copy of the cluster's
    group under such an ACL is read with `zk://user:password@.../path`, refused without credentials or
    with a wrong password (one line, no password in it), and a client subscribes through it."""
    from kazoo.client import KazooClient
    from kazoo.security import make_digest_acl

    hosts = zk_cluster.zookeeper.removeprefix("zk://").split("/")[0]
    secured = f"/secured-{uuid.uuid4().hex[:8]}"
    admin = KazooClient(hosts=hosts, auth_data=[("digest", "cosched:s3cret-pw")])
    admin.start(timeout=10)
    try:
        [leader] = sorted(n for n in admin.get_children("/mesos") if n.startswith("json.info_"))[:1]
        admin.create(secured, acl=[make_digest_acl("cosched", "s3cret-pw", all=True)])
        admin.create(f"{secured}/{leader}", admin.get(f"/mesos/{leader}")[0])
    finally:
        admin.stop()
        admin.close()
    group = parse_zookeeper(f"zk://cosched:s3cret-pw@{hosts}{secured}")
    assert group is not None and "s3cret" not in f"{group} {group!r}"
    assert [str(m) for m in zookeeper_masters(group, timeout=10)] == [f"http://{zk_cluster.master}"]
    for given, words in (("", "refuses no credentials"), ("cosched:wrong@", "refuses the credentials given")):
        wrong = parse_zookeeper(f"zk://{given}{hosts}{secured}")
        assert wrong is not None
        with pytest.raises(DiscoveryFailed, match=f"ZooKeeper zk://{re.escape(hosts + secured)}: its ACL {words}"):
            zookeeper_masters(wrong, timeout=10)
    recorder = Recorder()
    client = SchedulerClient(
        SchedulerConfig(masters=f"zk://cosched:s3cret-pw@{hosts}{secured}", name="zk-acl", user="root"), recorder
    ).start()
    try:
        assert client.wait_subscribed(30), client.failure
    finally:
        client.teardown()

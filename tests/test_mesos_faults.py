"""Faults a real master cannot show on demand, against the strict stand-in of tests/mesos_standin.py.

A silent stream (watchdog), a 307 to the leader, 503 and refused connections (backoff), a RecordIO record
cut across HTTP chunks, and bad framing. Every wait is bounded.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mesos_standin import Stream, stand_in, subscribed_event
from mesos_support import Recorder, free_port_run

from cosched.mesos import SchedulerClient, SchedulerConfig
from cosched.mesos.backoff import Backoff
from cosched.mesos.recordio import encode

OFFER = {
    "id": {"value": "O1"},
    "framework_id": {"value": "F1"},
    "agent_id": {"value": "S1"},
    "hostname": "agent1",
    "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 4.0}}],
}
UPDATE = {
    "task_id": {"value": "t1"},
    "agent_id": {"value": "S1"},
    "state": "TASK_RUNNING",
    "source": "SOURCE_EXECUTOR",
    "uuid": "AAECAwQFBgcICQoLDA0ODw==",
}


@contextmanager
def running(masters: list[str], recorder: Recorder, **settings: Any) -> Iterator[SchedulerClient]:
    persisted: list[str] = []
    config = SchedulerConfig(masters=masters, user="tester", **settings)
    client = SchedulerClient(
        config, recorder, on_framework_id=persisted.append, backoff=Backoff(0.2, 2.0, random.Random(7))
    )
    client.persisted = persisted  # type: ignore[attr-defined]
    client.start()
    try:
        yield client
    finally:
        client.stop()
        assert client.wait_stopped(5), "the client did not stop"


def test_watchdog_drops_a_silent_stream_and_resubscribes_with_the_framework_id() -> None:
    recorder = Recorder()
    plan = [Stream(heartbeat=0.2), Stream(heartbeat=0.2, heartbeats=True)]
    with stand_in(plan) as master, running([master.address], recorder, watchdog_heartbeats=3) as client:
        first, second = master.wait_for("SUBSCRIBE", 2, 10)
        recorder.wait(lambda: len(recorder.subscribed) == 2, 5, "the second SUBSCRIBED")
        assert "watchdog" in recorder.disconnects[0]
        assert 0.55 <= second.at - first.at < 3, "dropped after 3 silent heartbeat intervals of 0.2 s"
        assert "framework_id" not in first.body
        assert second.body["framework_id"] == {"value": "F1"}
        assert second.body["subscribe"]["framework_info"]["id"] == {"value": "F1"}
        assert client.persisted == ["F1"]  # type: ignore[attr-defined]
        # Implicit reconciliation after each subscription, each on its own stream.
        reconciles = master.wait_for("RECONCILE", 2, 5)
        assert [r.stream_id for r in reconciles] == master.stream_ids
        assert all(r.body["reconcile"] == {"tasks": []} for r in reconciles)
        time.sleep(1)  # heartbeats every 0.2 s keep the second stream alive
        assert len(master.calls("SUBSCRIBE")) == 2


def test_a_307_is_followed_to_the_leader_which_then_gets_the_calls() -> None:
    recorder = Recorder()
    with stand_in([]) as leader:
        redirect = Stream(kind="redirect", location=f"//{leader.address}/api/v1/scheduler")
        with stand_in([redirect]) as follower, running([follower.address], recorder) as client:
            assert client.wait_subscribed(5)
            assert client.master.port == leader.server_address[1]
            client.revive()
            assert [r.type for r in follower.requests] == ["SUBSCRIBE"]
            assert [r.type for r in leader.wait_for("REVIVE", 1, 5)] == ["REVIVE"]
            assert leader.calls("REVIVE")[0].stream_id == leader.stream_ids[0]


def test_503_and_refused_connections_are_retried_with_growing_backoff() -> None:
    recorder = Recorder()
    dead = f"127.0.0.1:{free_port_run(1)}"  # nothing listens there: connection refused
    plan = [Stream(kind="503"), Stream(kind="503"), Stream(heartbeats=True)]
    with stand_in(plan) as master, running([dead, master.address], recorder) as client:
        assert client.wait_subscribed(15)
        attempts = master.calls("SUBSCRIBE")
        assert len(attempts) == 3
        gaps = [b.at - a.at for a, b in itertools.pairwise(attempts)]
        # Backoff(0.2, cap 2): retry n waits at least half of min(2, 0.2 * 2**n); the dead master in between
        # costs a retry too, so the 503s are 2 retries apart: >= 0.2 + 0.4, then >= 0.8 + 1.0.
        assert gaps[0] >= 0.6 and gaps[1] >= 1.8, gaps
        assert client.master.port == master.server_address[1]


def test_a_404_from_a_master_that_is_starting_is_retried() -> None:
    """A restarted master listens before it serves the scheduler API, and answers 404 meanwhile
    (seen on the real master in CI): the client retries, it does not stop for good."""
    recorder, plan = Recorder(), [Stream(kind="404"), Stream(heartbeats=True)]
    with stand_in(plan) as master, running([master.address], recorder) as client:
        assert client.wait_subscribed(15), client.failure
        assert len(master.calls("SUBSCRIBE")) == 2 and client.failure is None


def test_a_record_cut_across_http_chunks_is_decoded_and_its_update_acknowledged() -> None:
    events = [{"type": "OFFERS", "offers": {"offers": [OFFER]}}, {"type": "UPDATE", "update": {"status": UPDATE}}]
    subscribed, offers, _ = (len(encode(json.dumps(e).encode())) for e in [subscribed_event("F1", 0.2), *events])
    # Cuts inside the SUBSCRIBED length prefix and JSON, the OFFERS length prefix and JSON, and the UPDATE.
    cuts = [1, 10, subscribed + 1, subscribed + 30, subscribed + offers + 25]
    stream = Stream(events=events, split_at=cuts)
    recorder = Recorder()
    with stand_in([stream]) as master, running([master.address], recorder):
        recorder.wait(lambda: recorder.updates, 5, "the UPDATE")
        assert recorder.offers == [OFFER]
        assert recorder.updates == [UPDATE]
        (ack,) = master.wait_for("ACKNOWLEDGE", 1, 5)
        assert ack.body["acknowledge"] == {
            "agent_id": {"value": "S1"},
            "task_id": {"value": "t1"},
            "uuid": UPDATE["uuid"],
        }
        assert ack.stream_id == master.stream_ids[0]


def test_bad_framing_drops_the_stream_with_one_line_and_resubscribes() -> None:
    bad = Stream(raw=b"12x\n{}")
    recorder = Recorder()
    with stand_in([bad, Stream(heartbeats=True)]) as master, running([master.address], recorder) as client:
        assert client.wait_subscribed(10)
        assert len(recorder.disconnects) == 1
        reason = recorder.disconnects[0]
        assert reason.startswith("RecordIO:") and "\n" not in reason
        assert len(master.calls("SUBSCRIBE")) == 2


def test_stop_wakes_a_reader_blocked_on_a_quiet_stream() -> None:
    recorder = Recorder()
    with stand_in([Stream(heartbeat=15.0)]) as master:
        client = SchedulerClient(SchedulerConfig(masters=[master.address], user="tester"), recorder).start()
        assert client.wait_subscribed(5)
        started = time.monotonic()
        client.stop()
        assert client.wait_stopped(2) and time.monotonic() - started < 2
        assert master.calls("TEARDOWN") == [], "stop() must never tear the framework down"


def test_the_stand_in_master_is_strict() -> None:
    """The stand-in refuses what a real master refuses, or the tests above would prove little."""
    with stand_in([Stream(heartbeats=True)]) as master:
        connection = http.client.HTTPConnection("127.0.0.1", master.server_address[1], timeout=5)
        json_type = {"Content-Type": "application/json"}
        connection.request("POST", "/api/v1/scheduler", b'{"type":"REVIVE"}', json_type)
        assert connection.getresponse().read() == b"Framework is not subscribed"
        loose = {"type": "SUBSCRIBE", "subscribe": {"framework_info": {"user": "u", "name": "n"}}}
        connection.request("POST", "/api/v1/scheduler", json.dumps(loose).encode(), json_type)
        assert connection.getresponse().status == 400
        assert len(master.errors) == 2
        master.errors.clear()


def test_reconciles_periodically_and_calls_from_many_threads_carry_the_stream_id() -> None:
    recorder = Recorder()
    with (
        stand_in([Stream(heartbeat=0.1, heartbeats=True)]) as master,
        running([master.address], recorder, reconcile_interval=0.3) as client,
    ):
        assert client.wait_subscribed(5)
        errors: list[BaseException] = []

        def revive_many() -> None:
            try:
                for _ in range(10):
                    client.revive()
            except BaseException as exc:  # collected for the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=revive_many) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert errors == []
        revives = master.wait_for("REVIVE", 40, 5)
        assert {r.stream_id for r in revives} == {master.stream_ids[0]}
        reconciles = master.wait_for("RECONCILE", 3, 5)  # at subscription, then every 0.3 s
        assert reconciles[2].at - reconciles[0].at >= 0.5

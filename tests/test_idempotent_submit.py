"""A submission sent again after its answer was lost makes no second job (`Idempotency-Key`).

A client that times out, or whose connection is cut, or whose daemon was killed after the
commit and before the answer, cannot tell whether its job was accepted: sending it again ran it
twice. With the same key, the daemon answers what it accepted the first time; `cosched submit`
sends one key per submission and retries only where the answer may have been lost.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fake_engine import Clock, FakeEngine, clocked_daemon
from fastapi.testclient import TestClient

from cosched.daemon import client as client_module
from cosched.daemon.api import create_app
from cosched.daemon.client import ApiError, Client
from cosched.daemon.service import Daemon
from cosched.daemon.store import REQUESTS_KEPT

JOB = {"image": "x", "command": ["true"], "cores": 1, "memory_mib": 64, "walltime": 100}
WORKFLOW = {**JOB, "name": "wf", "stages": [{"name": "a"}, {"name": "b", "depends": ["a"]}]}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Clock]]:
    clock = Clock()
    daemon = clocked_daemon(tmp_path, clock, FakeEngine(clock), cores=2)
    yield daemon, clock
    daemon.close()


def _jobs(daemon: Daemon) -> int:
    return len(daemon.store.jobs())


def test_a_submission_sent_again_with_its_key_gets_the_first_answer(daemon: tuple[Daemon, Clock]) -> None:
    live, clock = daemon
    with TestClient(create_app(live)) as api:
        first = api.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k-1"})
        again = api.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 201 and first.json() == again.json()
        assert _jobs(live) == 1
        flow = [api.post("/v1/workflows", json=WORKFLOW, headers={"Idempotency-Key": "k-2"}) for _ in range(2)]
        assert flow[0].json() == flow[1].json() == {"id": 1, "jobs": [2]} and _jobs(live) == 2
        # without a key, or with another one, each is a submission of its own
        api.post("/v1/jobs", json=JOB)
        api.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k-3"})
        assert _jobs(live) == 4
        # the same key with another body is the client's mistake, not a retry
        other = api.post("/v1/jobs", json={**JOB, "cores": 2}, headers={"Idempotency-Key": "k-1"})
        assert other.status_code == 422
        assert (
            other.json()["error"]
            == "Idempotency-Key: 'k-1' was sent with another submission; a new one needs a new key"
        )
        # a key is kept a day: later it is a new submission
        clock.t += REQUESTS_KEPT + 1
        later = api.post("/v1/jobs", json={**JOB, "cores": 2}, headers={"Idempotency-Key": "k-1"})
        assert later.status_code == 201 and _jobs(live) == 5
    live.store.close()


@pytest.mark.parametrize("key", ["", "a b", "é", "x" * 256])
def test_a_key_a_header_cannot_carry_plainly_is_refused(daemon: tuple[Daemon, Clock], key: str) -> None:
    live, _ = daemon
    with TestClient(create_app(live)) as api:
        answer = api.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": key.encode()})
    assert answer.status_code == 422 and answer.json()["fields"] == ["header.Idempotency-Key"], answer.text
    assert _jobs(live) == 0
    live.store.close()


class _LosesFirstAnswers(http.server.BaseHTTPRequestHandler):
    """A daemon whose first `lost` answers never come back: the connection is cut after the request."""

    lost = 1
    keys: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).keys.append(self.headers.get("Idempotency-Key"))
        if len(self.keys) <= self.lost:
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        body = json.dumps({"id": 7}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None: ...


TRIES = len(client_module.SUBMIT_WAITS) + 1


def _serve(handler: type[http.server.BaseHTTPRequestHandler], port: int = 0) -> http.server.HTTPServer:
    server = http.server.HTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stop(server: http.server.HTTPServer) -> None:
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("lost", [1, TRIES])
def test_the_client_sends_a_lost_submission_again_under_the_same_key(
    monkeypatch: pytest.MonkeyPatch, lost: int
) -> None:
    monkeypatch.setattr(client_module.time, "sleep", lambda seconds: None)
    handler = type("Handler", (_LosesFirstAnswers,), {"lost": lost, "keys": []})
    server = _serve(handler)
    try:
        client = Client(f"http://127.0.0.1:{server.server_port}")
        if lost < TRIES:
            assert client.submit("/v1/jobs", JOB) == {"id": 7}
        else:
            with pytest.raises(client_module.AnswerLost, match=r"may have been accepted .* see `cosched queue`"):
                client.submit("/v1/jobs", JOB)
        assert len(handler.keys) == min(lost + 1, TRIES)
        assert len(set(handler.keys)) == 1 and handler.keys[0] is not None
    finally:
        _stop(server)


def test_a_daemon_killed_after_the_commit_is_waited_for_until_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer is lost, then the daemon cannot be reached for a while (killed, restarting): the
    client said `cannot reach` at the first refused retry, of a job that was accepted."""
    handler = type("Handler", (_LosesFirstAnswers,), {"lost": 1, "keys": []})
    servers = [_serve(handler)]
    port = servers[0].server_port
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the daemon dies after the first try, and is back after the third
        waits.append(seconds)
        if len(waits) == 1:
            _stop(servers[0])
        elif len(waits) == 3:
            servers.append(_serve(handler, port))

    monkeypatch.setattr(client_module.time, "sleep", sleep)
    try:
        assert Client(f"http://127.0.0.1:{port}").submit("/v1/jobs", JOB) == {"id": 7}
        assert len(waits) == 3 and len(handler.keys) == 2 and len(set(handler.keys)) == 1
    finally:
        _stop(servers[-1])


def test_a_daemon_that_is_not_there_is_said_at_once_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ApiError, match="cannot reach the cosched daemon") as refused:
        Client(f"http://127.0.0.1:{port}").submit("/v1/jobs", JOB)
    assert not isinstance(refused.value, client_module.AnswerLost) and slept == []

"""The API of a real daemon process against hostile or stuck clients, over raw sockets.

Why: the API is the daemon's only door, and one slow client or one held lock
must not close it for everyone. Slow sockets (headers never finished) are
closed after `api.header_timeout`, connections beyond `api.max_connections`
at once, a body not sent within `api.body_timeout` gets 408; with a token,
nothing (docs included) answers without it, and bad JSON is 401, not 422;
and `/v1/health` answers from memory while SQLite's lock is held by another
process and a submission waits on it.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine

from cosched.daemon.client import ApiError, Client
from workloads.images import busybox_image

TOKEN = "limits-token"
RESET = -1


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[DaemonProcess]:
    require_engine()
    api = f'token = "{TOKEN}"\nmax_connections = 16\nheader_timeout = 1.0\nbody_timeout = 1.0'
    daemon = DaemonProcess(tmp_path, api=api, token=TOKEN)
    daemon.start()
    yield daemon
    daemon.cleanup(require_engine())


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def exchange(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    """Send `request` and read until the daemon closes the connection."""
    with connect(port) as sock:
        sock.settimeout(timeout)
        sock.sendall(request)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def get(path: str, authorization: str | None = None) -> bytes:
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    return f"GET {path} HTTP/1.1\r\nHost: cosched\r\n{auth}Connection: close\r\n\r\n".encode()


def test_slow_and_surplus_connections_are_closed(guarded: DaemonProcess) -> None:
    port = guarded.port
    sockets = [connect(port) for _ in range(50)]
    try:
        for k, sock in enumerate(sockets):
            if k % 2:  # half start a request and never finish its headers; half send nothing
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: cosched\r\n")
        opened = time.monotonic()
        answers: dict[int, tuple[int, float]] = {}
        for k, sock in enumerate(sockets):
            sock.settimeout(max(10.0 - (time.monotonic() - opened), 0.1))
            try:
                status = status_of(read_to_close(sock))
            except TimeoutError:
                continue  # still open after 10 s: counted as not closed below
            except ConnectionResetError:
                status = RESET  # closed with the client's bytes unread: the kernel resets, the answer may be lost
            answers[k] = (status, time.monotonic() - opened)
    finally:
        for sock in sockets:
            sock.close()
    assert len(answers) == 50, f"{50 - len(answers)} of 50 slow sockets still open after 10 s"
    statuses = [status for status, _ in answers.values()]
    # 16 are kept (max_connections) until their headers time out (408); the others are refused at once (503).
    refused = [seconds for status, seconds in answers.values() if status in (503, RESET)]
    assert len(refused) >= 50 - 16, statuses
    assert statuses.count(408) >= 1, statuses
    assert set(statuses) <= {408, 503, RESET}, statuses
    assert max(seconds for _, seconds in answers.values()) < 5.0, answers
    # and the door is open again for a well-behaved client
    assert status_of(exchange(port, get("/v1/health", f"Bearer {TOKEN}"))) == 200


def test_oversized_headers_are_431(guarded: DaemonProcess) -> None:
    """84 KB of headers, never finished: refused for their size at once, not left to time out."""
    padding = "x" * 7000
    headers = "".join(f"X-Pad-{k}: {padding}\r\n" for k in range(12))
    started = time.monotonic()
    answer = exchange(guarded.port, f"GET /v1/health HTTP/1.1\r\nHost: cosched\r\n{headers}".encode())
    assert status_of(answer) == 431, answer[:200]
    assert time.monotonic() - started < 0.9  # before header_timeout (1 s) could have closed it
    assert status_of(exchange(guarded.port, get("/v1/health", f"Bearer {TOKEN}"))) == 200


def test_a_body_sent_too_slowly_is_408(guarded: DaemonProcess) -> None:
    request = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: cosched\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    ).encode()
    started = time.monotonic()
    answer = exchange(guarded.port, request)
    assert status_of(answer) == 408, answer
    assert b"not received within 1 s" in answer, answer
    assert time.monotonic() - started < 5.0
    assert guarded.client.call("GET", "/v1/queue") == []


def test_the_token_guards_every_path_over_the_wire(guarded: DaemonProcess) -> None:
    port = guarded.port
    for path in ("/docs", "/redoc", "/openapi.json", "/v1/health", "/metrics", "/v1/queue"):
        answer = exchange(port, get(path))
        assert status_of(answer) == 401, (path, answer)
        assert b"missing or wrong bearer token" in answer
    bad_json = b"POST /v1/jobs HTTP/1.1\r\nHost: cosched\r\nContent-Length: 9\r\nConnection: close\r\n\r\n{not json"
    assert status_of(exchange(port, bad_json)) == 401  # refused before the body is parsed: not 422
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert status_of(exchange(port, get("/v1/health", f"{scheme} {TOKEN}"))) == 200, scheme
    assert status_of(exchange(port, get("/v1/health", "bearer wrong"))) == 401
    assert status_of(exchange(port, get("/docs", f"bearer {TOKEN}"))) == 200


def test_health_answers_while_the_store_is_locked(tmp_path: Path) -> None:
    """Another process holds SQLite's write lock for 6 s while a submission waits on it: health stays fast."""
    image = busybox_image(require_engine())
    daemon = DaemonProcess(tmp_path)
    daemon.start()
    try:
        holder = sqlite3.connect(daemon.state / "state.sqlite", timeout=30, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        outcome: list[object] = []

        def submit() -> None:
            slow = Client(f"http://127.0.0.1:{daemon.port}", "", timeout=60)
            try:
                outcome.append(
                    slow.call("POST", "/v1/jobs", {"image": image, "command": ["true"], "cores": 1, "walltime": 30})
                )
            except ApiError as exc:
                outcome.append(exc)

        submitter = threading.Thread(target=submit)
        submitter.start()
        seconds = []
        try:
            time.sleep(0.5)  # the submission is now waiting on the lock
            for _ in range(10):
                started = time.monotonic()
                health = daemon.client.call("GET", "/v1/health")
                seconds.append(time.monotonic() - started)
                assert health["instance"] and "queued" in health["jobs"]
                time.sleep(0.5)
            assert submitter.is_alive(), f"the submission did not wait on the lock: {outcome}"
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            submitter.join(60)
        assert max(seconds) < 0.5, f"/v1/health took up to {max(seconds):.2f} s while the store was locked"
        assert len(outcome) == 1 and isinstance(outcome[0], dict), outcome  # accepted once the lock was free
    finally:
        daemon.cleanup(require_engine())

"""The API's HTTP protocol alone (no daemon, no engine): header timeout, header size cap, connection cap.

Why: these limits live below FastAPI, in the protocol uvicorn runs
(`cosched/daemon/http_protocol.py`), so they are checked here with uvicorn
serving a trivial app on a real socket; `test_daemon_api_limits.py` checks
them again through a real daemon.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from cosched.daemon.http_protocol import guarded_protocol


async def hello(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def reads_body(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """As the API does: the whole body first (`BodyLimit` gives it `api.body_timeout`), then the answer."""
    while (await receive()).get("more_body"):
        pass
    await hello(scope, receive, send)


@pytest.fixture
def port() -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(reads_body, http=guarded_protocol(0.5, 8), log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    sock.close()


def answer_of(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        return answer or b"reset"
    return answer


def test_complete_requests_are_served(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer_of(sock).startswith(b"HTTP/1.1 200")


def test_unfinished_headers_get_408(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as silent, socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert answer_of(silent).startswith(b"HTTP/1.1 408")
        assert answer_of(slow).startswith(b"HTTP/1.1 408")
        assert 0.3 < time.monotonic() - started < 3.0


def test_a_keep_alive_next_request_must_finish_its_headers_too(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\nHo")  # the next request, never finished
        assert answer_of(sock).startswith(b"HTTP/1.1 408")


def test_oversized_headers_get_431(port: int) -> None:
    headers = b"".join(b"X-Pad-%d: %s\r\n" % (k, b"x" * 7000) for k in range(12))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + headers)
        assert answer_of(sock, 0.4).startswith(b"HTTP/1.1 431")  # at once, not at the header timeout


def test_connections_beyond_the_cap_close_those_that_waited_longest(port: int) -> None:
    """Of 20 silent connections to a cap of 8, each newcomer closes the one that waited longest
    (503): the last 8 stay until their headers time out (408)."""
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        answers = [answer_of(sock) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    statuses = [a[9:12] for a in answers]
    assert statuses == [b"503"] * (20 - 8) + [b"408"] * 8, statuses


def test_silent_connections_holding_every_place_do_not_keep_a_request_out(port: int) -> None:
    """Any local user could hold all `max_connections` places with sockets that send nothing,
    reopened as each closed: every request of the operator got 503. A newcomer now takes the place
    of the connection that waited longest without a request; one serving a request keeps its own."""
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    try:
        time.sleep(0.1)
        a_newcomer_takes_the_place_of_the_longest_waiting(port, silent)
    finally:
        for sock in silent:
            sock.close()


def test_requests_whose_body_never_comes_do_not_keep_a_request_out(port: int) -> None:
    """Headers complete, then no body: such a request counted as served, held its place for the
    body timeout (30 s in the daemon), and one client reopening each as it closed kept every request
    out with 503, `/v1/health` included (a helper's audit). It waits, as one still sending headers does."""
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    try:
        for sock in stalled:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        time.sleep(0.2)
        a_newcomer_takes_the_place_of_the_longest_waiting(port, stalled)
    finally:
        for sock in stalled:
            sock.close()


def a_newcomer_takes_the_place_of_the_longest_waiting(port: int, waiting: list[socket.socket]) -> None:
    """With every place held by `waiting`, oldest first: a new request is served, the oldest gets 503."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer_of(sock).startswith(b"HTTP/1.1 200")
    assert answer_of(waiting[0], 1.0).startswith(b"HTTP/1.1 503")

"""HTTP for the v1 scheduler and executor APIs on the standard library's `http.client`.

Why not `requests` or `httpx`: the event stream's watchdog must bound every socket read by the time left
before the next expected heartbeat, which changes once SUBSCRIBED announces the interval; `http.client`
exposes the socket (`settimeout`, and `shutdown` to wake a blocked reader on stop) where both libraries
hide it behind their pools. Redirects must not be followed blindly (the 307's target is the new leader,
and a stream id belongs to one master). Calls are rare (offers, acks), so one short connection per call
keeps them thread-safe without a pool. See docs/mesos.md.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from cosched.mesos.errors import CallError, MesosError
from cosched.mesos.masters import SCHEDULER_PATH, Master


class Unavailable(MesosError):
    """A retryable failure: connection refused or reset, a timeout, or 503 (no leader elected yet)."""


class Redirected(MesosError):
    """The master is not the leader; `location` is the `Location` header it answered with."""

    def __init__(self, master: Master, location: str) -> None:
        super().__init__(f"master {master} is not the leader, it redirects to {location}")
        self.master = master
        self.location = location


@dataclass
class Reply:
    status: int
    text: str


def _connection(master: Master, timeout: float) -> http.client.HTTPConnection:
    if master.scheme == "https":
        return http.client.HTTPSConnection(
            master.host, master.port, timeout=timeout, context=ssl.create_default_context()
        )
    return http.client.HTTPConnection(master.host, master.port, timeout=timeout)


def basic_auth(principal: str, secret: str) -> str:
    """The `Authorization` value of HTTP basic authentication, as a master started with
    `--authenticate_http_frameworks --http_framework_authenticators=basic` checks it."""
    return "Basic " + base64.b64encode(f"{principal}:{secret}".encode()).decode()


def _headers(stream_id: str | None, auth: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if stream_id:
        headers["Mesos-Stream-Id"] = stream_id
    if auth:
        headers["Authorization"] = auth
    return headers


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _check(master: Master, call_type: str, response: http.client.HTTPResponse, ok: tuple[int, ...]) -> None:
    """Raise for anything but an `ok` status: 307 -> Redirected, 503 -> Unavailable, else CallError."""
    if response.status in ok:
        return
    if response.status == 307:
        raise Redirected(master, response.getheader("Location") or "")
    body = _one_line(response.read(4096).decode("utf-8", "replace"))
    if response.status == 503:
        raise Unavailable(f"master {master} answered {call_type} with 503 {body}")
    if response.status == 404:  # libprocess listens before the master serves its API: a master starting
        raise Unavailable(f"master {master} answered {call_type} with 404 (no API there yet: starting?) {body}")
    raise CallError(f"master {master} refused {call_type}: {response.status} {response.reason}: {body}")


def post_call(
    master: Master,
    call: dict[str, Any],
    stream_id: str | None,
    timeout: float,
    path: str = SCHEDULER_PATH,
    auth: str | None = None,
) -> Reply:
    """POST one call and read the whole answer; raises Unavailable, Redirected or CallError unless 2xx."""
    connection = _connection(master, timeout)
    try:
        connection.request("POST", path, json.dumps(call).encode(), _headers(stream_id, auth))
        response = connection.getresponse()
        _check(master, call["type"], response, (200, 202))
        return Reply(response.status, response.read().decode("utf-8", "replace"))
    except (OSError, http.client.HTTPException) as exc:
        raise Unavailable(f"master {master}: {call['type']} failed: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()


class EventStream:
    """The open answer to SUBSCRIBE: raw bytes in arbitrary chunks, each read bounded by a timeout."""

    def __init__(
        self,
        master: Master,
        connection: http.client.HTTPConnection,
        sock: socket.socket,
        response: http.client.HTTPResponse,
    ) -> None:
        self.master = master
        self.stream_id = response.getheader("Mesos-Stream-Id") or ""
        self._connection = connection
        self._sock = sock
        self._response = response

    def read(self, timeout: float) -> bytes:
        """Up to 64 KiB as soon as any arrive; b"" when the master closed the stream.

        Raises TimeoutError after `timeout` seconds of silence (the stream is unusable afterwards) and
        OSError / http.client.HTTPException when the connection breaks.
        """
        self._sock.settimeout(max(timeout, 0.001))
        return self._response.read1(65536)

    def interrupt(self) -> None:
        """From any thread: shut the socket down, so that a reader blocked in `read` returns at once."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """From the reading thread only (http.client objects are not thread-safe)."""
        self.interrupt()
        self._connection.close()


def open_stream(
    master: Master, call: dict[str, Any], connect_timeout: float, path: str = SCHEDULER_PATH, auth: str | None = None
) -> EventStream:
    """POST SUBSCRIBE and return the event stream; raises Unavailable, Redirected or CallError otherwise.

    A master's stream must carry a `Mesos-Stream-Id`; an agent's (the executor API) has none.
    """
    connection = _connection(master, connect_timeout)
    try:
        connection.request("POST", path, json.dumps(call).encode(), _headers(None, auth))
        sock = connection.sock
        response = connection.getresponse()
        _check(master, "SUBSCRIBE", response, (200,))
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise Unavailable(f"master {master}: SUBSCRIBE failed: {type(exc).__name__}: {exc}") from None
    except MesosError:
        connection.close()
        raise
    if sock is None or (path == SCHEDULER_PATH and not response.getheader("Mesos-Stream-Id")):
        connection.close()
        raise CallError(f"master {master} answered SUBSCRIBE without a Mesos-Stream-Id header")
    return EventStream(master, connection, sock, response)

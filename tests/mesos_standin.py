"""A strict stand-in for a Mesos master, ONLY for faults a real master cannot show on demand.

A silent stream (to fire the watchdog), a 307 to another master, 503 before success, and a RecordIO
record cut across HTTP chunks. Everything else is tested against the real master (test_mesos_master.py).
It is strict where the real master is: POST /api/v1/scheduler with a JSON body, SUBSCRIBE with a
checkpointing framework and matching ids, every other call with the current `Mesos-Stream-Id` and the
framework id (400 otherwise, 403 when no stream is open), and it records every request for assertions.
"""

from __future__ import annotations

import itertools
import json
import select
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cosched.mesos.recordio import encode


@dataclass
class Request:
    type: str
    body: dict[str, Any]
    stream_id: str | None
    at: float


@dataclass
class Stream:
    """How to answer one SUBSCRIBE: `events` are sent as `chunks` (byte slices of the framed events)."""

    kind: str = "stream"  # "stream", "redirect", "503", "404" (a master starting: no API route yet)
    heartbeat: float = 0.2
    events: list[dict[str, Any]] = field(default_factory=list)
    split_at: list[int] = field(default_factory=list)
    """Byte offsets in the framed events where a new HTTP chunk starts (after a short pause)."""
    raw: bytes | None = None
    """Bytes to send instead of the framed events (bad framing)."""
    heartbeats: bool = False
    """Keep sending HEARTBEAT events every `heartbeat` seconds after the events (else: silence)."""
    location: str = ""


class StandInMaster(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, plan: list[Stream], framework_id: str = "F1") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.plan = list(plan)
        self.framework_id = framework_id
        self.requests: list[Request] = []
        self.stream_ids: list[str] = []
        self.current_stream: str | None = None
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-answer (the tests' clients stop at will) is not an error here."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def calls(self, kind: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.type == kind]

    def wait_for(self, kind: str, count: int, timeout: float) -> list[Request]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.calls(kind)
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(f"stand-in master got {len(self.calls(kind))} {kind} calls, expected {count}")


@contextmanager
def stand_in(plan: list[Stream], framework_id: str = "F1") -> Iterator[StandInMaster]:
    server = StandInMaster(plan, framework_id)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert not server.errors, f"the stand-in master rejected requests: {server.errors}"


def subscribed_event(framework_id: str, heartbeat: float) -> dict[str, Any]:
    return {
        "type": "SUBSCRIBED",
        "subscribed": {"framework_id": {"value": framework_id}, "heartbeat_interval_seconds": heartbeat},
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandInMaster

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        if self.path != "/api/v1/scheduler":
            return self._refuse(404, f"unknown path {self.path}")
        if self.headers.get("Content-Type") != "application/json":
            return self._refuse(415, f"Content-Type {self.headers.get('Content-Type')!r}")
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(length))
            kind = body["type"]
        except (ValueError, KeyError, TypeError):
            return self._refuse(400, "body is not a JSON call with a type")
        stream_id = self.headers.get("Mesos-Stream-Id")
        with self.server.lock:
            self.server.requests.append(Request(kind, body, stream_id, time.monotonic()))
        if kind == "SUBSCRIBE":
            return self._subscribe(body, stream_id)
        with self.server.lock:
            current = self.server.current_stream
        if current is None:
            return self._refuse(403, "Framework is not subscribed")
        if stream_id != current:
            return self._refuse(400, f"{kind}: Mesos-Stream-Id {stream_id!r} is not the current {current!r}")
        if body.get("framework_id") != {"value": self.server.framework_id}:
            return self._refuse(400, f"{kind}: framework_id {body.get('framework_id')!r}")
        self._answer(202)

    def _subscribe(self, body: dict[str, Any], stream_id: str | None) -> None:
        info = body.get("subscribe", {}).get("framework_info", {})
        problems = []
        if stream_id:
            problems.append("SUBSCRIBE must not carry Mesos-Stream-Id")
        if info.get("checkpoint") is not True or not info.get("failover_timeout", 0) > 0:
            problems.append("framework_info must checkpoint with a failover_timeout")
        if not info.get("user") or not info.get("name"):
            problems.append("framework_info needs user and name")
        if body.get("framework_id") != info.get("id"):
            problems.append("framework_id and framework_info.id differ")
        if "id" in info and info["id"] != {"value": self.server.framework_id}:
            problems.append(f"unknown framework id {info['id']!r}")
        if problems:
            return self._refuse(400, "; ".join(problems))
        with self.server.lock:
            step = self.server.plan.pop(0) if self.server.plan else Stream(heartbeats=True)
        if step.kind == "redirect":
            return self._answer(307, headers={"Location": step.location})
        if step.kind == "503":
            return self._answer(503, b"No leading master")
        if step.kind == "404":
            return self._answer(404)
        self._stream(step)

    def _stream(self, step: Stream) -> None:
        stream_id = str(uuid.uuid4())
        with self.server.lock:
            self.server.stream_ids.append(stream_id)
            self.server.current_stream = stream_id
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Mesos-Stream-Id", stream_id)
        self.end_headers()
        events = [subscribed_event(self.server.framework_id, step.heartbeat), *step.events]
        data = step.raw if step.raw is not None else b"".join(encode(json.dumps(e).encode()) for e in events)
        cuts = [0, *step.split_at, len(data)]
        try:
            for start, end in itertools.pairwise(cuts):
                self._chunk(data[start:end])
                time.sleep(0.05)
            while not self.server.closing.is_set() and not self._peer_closed(step.heartbeat):
                if step.heartbeats:
                    self._chunk(encode(b'{"type":"HEARTBEAT"}'))
        except OSError:
            pass
        with self.server.lock:
            if self.server.current_stream == stream_id:
                self.server.current_stream = None
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _peer_closed(self, wait: float) -> bool:
        readable, _, _ = select.select([self.connection], [], [], wait)
        return bool(readable) and not self.connection.recv(1, 0)

    def _refuse(self, status: int, message: str) -> None:
        with self.server.lock:
            self.server.errors.append(f"{status} {message}")
        self._answer(status, message.encode())

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

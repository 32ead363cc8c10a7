"""uvicorn's HTTP/1.1 protocol with the limits it lacks: header read time and size, and a connection cap.

uvicorn closes an idle keep-alive connection, but a client that opens a socket
and sends its headers a byte at a time (or never) holds a connection and its
memory forever; fifty of them stayed open in a probe. Here a request whose
headers are not complete within `header_timeout` seconds (from the
connection's opening, or from the first byte of a keep-alive's next request)
gets 408 and its connection is closed; headers over `MAX_HEADER_BYTES` get 431
(httptools, unlike h11, sets no bound); and a connection beyond
`max_connections` open ones gets 503 and is closed at once, before it costs
more than a file descriptor. uvicorn's own `limit_concurrency` would answer
such a connection only once its headers came, that is never.

Built on uvicorn's httptools protocol, the fast one the submission benchmark
needs (docs/daemon.md, "Daemon speed"); its parser callbacks mark where a
request's headers begin and end.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024


def _status(code: int, reason: str) -> bytes:
    return f"HTTP/1.1 {code} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()


class GuardedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with `header_timeout` and `max_connections`; made per daemon by `guarded_protocol`."""

    header_timeout = 10.0
    max_connections = 64
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse(_status(503, "Service Unavailable"))
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._refused:  # the rest of a refused connection's bytes are dropped unparsed
            super().data_received(data)

    # httptools parser callbacks; after a refusal, those still due for the bytes at hand do nothing
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._arm()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(_status(431, "Request Header Fields Too Large"))
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        if not self._refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        self._refuse(_status(408, "Request Timeout"))

    def _refuse(self, answer: bytes) -> None:
        """Answer and close, unless a pipelined earlier request's response is still being written."""
        self._disarm()
        if self._refused or self.transport.is_closing():
            return
        self._refused = True
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(answer)
        self.transport.close()


def guarded_protocol(header_timeout: float, max_connections: int) -> type[GuardedProtocol]:
    """The protocol class uvicorn is given (`uvicorn.Config(http=...)`), with this daemon's limits."""
    return type(
        "GuardedProtocol",
        (GuardedProtocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )

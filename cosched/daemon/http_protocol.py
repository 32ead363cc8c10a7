"""uvicorn's HTTP/1.1 protocol with the two limits it lacks: a header read timeout and a connection cap.

uvicorn closes an idle keep-alive connection, but a client that opens a socket
and sends its headers a byte at a time (or never) holds a connection and its
memory forever; fifty of them stayed open in a probe. Here a connection whose
request headers are not complete within `header_timeout` seconds of its
opening (or of its first byte of a next request) gets 408 and is closed, and
a connection beyond `max_connections` open ones gets 503 and is closed at once,
before it costs more than a file descriptor. uvicorn's own `limit_concurrency`
would answer such a connection only once its headers came, that is never.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_FULL = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with `header_timeout` and `max_connections`; made per daemon by `guarded_protocol`."""

    header_timeout = 10.0
    max_connections = 64
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(_FULL)
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # IDLE: the request's headers (this connection's first, or a keep-alive's next) are still incomplete.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.write(_TIMEOUT)
            self.transport.close()


def guarded_protocol(header_timeout: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn is given (`uvicorn.Config(http=...)`), with this daemon's limits."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )

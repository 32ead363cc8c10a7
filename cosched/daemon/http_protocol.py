"""uvicorn's HTTP/1.1 protocol with the limits it lacks: header read time and size, and a connection cap.

uvicorn closes an idle keep-alive connection, but a client that opens a socket
and sends its headers a byte at a time (or never) holds a connection and its
memory forever; fifty of them stayed open in a probe. Here a request whose
headers are not complete within `header_timeout` seconds (from the
connection's opening, or from the first byte of a keep-alive's next request)
gets 408 and its connection is closed; headers over `MAX_HEADER_BYTES` get 431
(httptools, unlike h11, sets no bound); and at `max_connections` open ones, a new
connection takes the place of the one that has waited longest without a request
in progress (still sending its headers or its body, idle between keep-alive requests, or in
its TLS handshake), which gets 503 and is closed; only when every one is serving a
request is the newcomer refused (503) at once, before it costs more than a file
descriptor. Refusing the newcomer instead let any local user, with no token, hold
every slot with sockets that sent nothing and reopen each as it closed: the
operator's own requests all got 503 (a helper's audit: 100 of 100 over 20 s).
uvicorn's own `limit_concurrency` would answer such a connection only once its
headers came, that is never.

Over HTTPS the handshake is done here too (`loop.start_tls`), not by the server's `ssl=`:
asyncio hands a TLS connection to its protocol only once the handshake is over, and gives
a client that sends nothing 60 s for it. Fifty such connections to a cap of 16 were all
still open 8 s later. A connection is counted from its accept, one over the cap is closed
at once (no TLS yet to answer 503 in), and its handshake must end within `header_timeout`.

Built on uvicorn's httptools protocol, the fast one the submission benchmark
needs (docs/daemon.md, "Daemon speed"); its parser callbacks mark where a
request's headers begin and end.
"""

from __future__ import annotations

import asyncio
import ssl
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024


def _status(code: int, reason: str) -> bytes:
    return f"HTTP/1.1 {code} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()


class GuardedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with `header_timeout` and `max_connections`; made per daemon by `guarded_protocol`."""

    header_timeout = 10.0
    max_connections = 64
    tls: ssl.SSLContext | None = None
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _refused = False
    _early = b""
    _tls_begun = False
    _tcp: asyncio.Transport | None = None
    _handshake_task: asyncio.Task[None] | None = None
    _idle_since = 0.0
    """When it last began to wait for a request (its accept, or its last request's start)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.tls is not None and not self._tls_begun:
            self._tls_begun = True
            self._handshake(transport)
            return
        super().connection_made(transport)
        if self.tls is None:  # over TLS it took its place at its accept (`_handshake`)
            self._idle_since = time.monotonic()
            if not self._room():
                self._refuse(_status(503, "Service Unavailable"))
                return
        self._arm()

    def _room(self) -> bool:
        """Whether this connection may stay: under the cap, or once the longest-waiting connection
        without a request in progress is closed for it (False: every other one serves a request)."""
        counted = [c for c in self.connections if isinstance(c, GuardedProtocol) and not c._refused]  # not closing
        if len(counted) <= self.max_connections:
            return True
        waiting = [c for c in counted if c is not self and c._waiting()]
        if not waiting:
            return False
        min(waiting, key=lambda c: c._idle_since)._make_way()
        return True

    def _waiting(self) -> bool:
        if self._refused:  # closing already
            return False
        if self.transport is None:  # in its TLS handshake
            return self._tcp is not None and not self._tcp.is_closing()
        # A request still sending its body waits too: counted as served, 66 that sent headers and
        # no body (reopened as each got its 408) held every place for good (a helper's audit).
        cycle = self.cycle
        return not self.transport.is_closing() and (cycle is None or cycle.response_complete or cycle.more_body)

    def _make_way(self) -> None:
        if self.transport is None and self._tcp is not None:  # mid-handshake: no TLS to answer in
            self._refused = True
            self._tcp.abort()
            self.connections.discard(self)
        else:
            self._refuse(_status(503, "Service Unavailable"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # a TLS connection that never got past its handshake
            self.connections.discard(self)
            return
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:  # a request in the same read as the handshake's end: read once made
            self._early += data
        elif not self._refused:  # the rest of a refused connection's bytes are dropped unparsed
            super().data_received(data)

    def shutdown(self) -> None:
        if self.transport is not None:
            super().shutdown()
        elif self._tcp is not None:  # mid-handshake: nothing to finish, and uvicorn waits for every connection
            self._tcp.abort()

    def _handshake(self, tcp: asyncio.Transport) -> None:
        """Count a TLS connection from its accept and give its handshake `header_timeout`."""
        self.connections.add(self)
        self._tcp = tcp
        self._idle_since = time.monotonic()
        if not self._room():
            tcp.abort()
            self.connections.discard(self)
            return
        tcp.pause_reading()  # the ClientHello is for start_tls, which resumes reading, not for data_received
        self._handshake_task = self.loop.create_task(self._secure(tcp))  # kept: the loop holds tasks weakly

    async def _secure(self, tcp: asyncio.Transport) -> None:
        assert self.tls is not None
        try:
            secure = await self.loop.start_tls(
                tcp, self, self.tls, server_side=True, ssl_handshake_timeout=self.header_timeout
            )
        except (TimeoutError, OSError):  # too slow, not TLS, or gone: start_tls closed it
            self.connections.discard(self)
            return
        if secure is None or secure.is_closing():
            self.connections.discard(self)
            return
        self.connection_made(secure)  # type: ignore[arg-type]
        early, self._early = self._early, b""
        if early:
            self.data_received(early)

    # httptools parser callbacks; after a refusal, those still due for the bytes at hand do nothing
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._idle_since = time.monotonic()
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
        cycle = self.cycle  # (a request still sending its body has no answer begun: it gets this one)
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(answer)
        self.transport.close()


def guarded_protocol(
    header_timeout: float, max_connections: int, tls: ssl.SSLContext | None = None
) -> type[GuardedProtocol]:
    """The protocol class uvicorn is given (`uvicorn.Config(http=...)`), with this daemon's limits
    and its TLS context (None: plain HTTP)."""
    return type(
        "GuardedProtocol",
        (GuardedProtocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections, "tls": tls},
    )

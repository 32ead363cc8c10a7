"""ASGI guards in front of the API: the bearer token, then the body's size and read time.

Pure ASGI rather than FastAPI dependencies so that they cover every path,
the generated `/docs`, `/redoc` and `/openapi.json` included, and so that a
request without the token is refused (401) before its body is read or parsed:
an anonymous client learns nothing, not even that its JSON was bad.
"""

from __future__ import annotations

import asyncio
import hmac

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNAUTHORISED = "missing or wrong bearer token"


class BearerAuth:
    """Every HTTP request must carry `Authorization: Bearer <token>` (scheme in any case, RFC 9110 11.1)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.authorised(scope):
            response = JSONResponse({"error": UNAUTHORISED}, status_code=401, headers={"www-authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def authorised(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                given = credentials.strip() if scheme.lower() == b"bearer" else b""
        # compare_digest on every path (even without a header) so that timing tells nothing about the token
        return hmac.compare_digest(given, self.token) and bool(given)


class BodyLimit:
    """Refuse a body over `limit` bytes (413) before it is read into memory, or not sent within `timeout` s (408)."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _refuse(_TooLarge(self.limit), scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        seen, complete = 0, False

        async def limited() -> Message:
            nonlocal seen, complete
            if complete:  # after the body, receive only waits for a disconnect: no deadline then
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):  # cheaper than wait_for: no task per message
                    message = await receive()
            except TimeoutError:
                raise _TooSlow(self.timeout) from None
            seen += len(message.get("body", b""))
            complete = not message.get("more_body", False)
            if seen > self.limit:
                raise _TooLarge(self.limit)
            return message

        try:
            await self.app(scope, limited, send)
        except (_TooLarge, _TooSlow) as exc:
            await _refuse(exc, scope, receive, send)


class _TooLarge(HTTPException):
    """Raised while the app reads the body; an HTTPException so FastAPI passes it on rather than making it a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body: larger than the limit of {limit} bytes")


class _TooSlow(HTTPException):
    def __init__(self, timeout: float) -> None:
        super().__init__(408, f"request body: not received within {timeout:g} s", headers={"connection": "close"})


async def _refuse(exc: HTTPException, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    await response(scope, receive, send)

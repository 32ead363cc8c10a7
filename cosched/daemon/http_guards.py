"""ASGI guards in front of the API: who is calling (bearer tokens), then the body's size and read time.

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

from cosched.daemon.identity import ANONYMOUS, BadToken, Caller, Revocations, user_of

UNAUTHORISED = "missing or wrong bearer token"


class Authenticate:
    """Who sent each request, as `scope["state"]["caller"]`; refused (401) if a credential is needed and wrong.

    With neither the shared `token` nor a signing `key`, every caller is
    `ANONYMOUS`. Otherwise every HTTP request must carry `Authorization: Bearer
    <credential>` (scheme in any case, RFC 9110 11.1): the shared token makes
    the caller an operator, a JWT signed with `key` makes them its user, an
    operator if named in `operators`.
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        key: bytes | None,
        operators: frozenset[str],
        revocations: Revocations | None = None,
    ) -> None:
        self.app, self.token, self.key, self.operators = app, token.encode(), key, operators
        self.revocations = revocations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                scope.setdefault("state", {})["caller"] = self.caller(scope)
            except BadToken as exc:
                response = JSONResponse({"error": str(exc)}, status_code=401, headers={"www-authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def caller(self, scope: Scope) -> Caller:
        if not self.token and self.key is None:
            return ANONYMOUS
        given = b""
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                given = credentials.strip() if scheme.lower() == b"bearer" else b""
        # compare_digest on every path (even without a header) so that timing tells nothing about the token
        if hmac.compare_digest(given, self.token) and self.token:
            return Caller("", operator=True)
        if self.key is None or not given:
            raise BadToken(UNAUTHORISED)
        user = user_of(self.key, given.decode("latin-1"), self.revocations)
        return Caller(user, operator=user in self.operators)


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

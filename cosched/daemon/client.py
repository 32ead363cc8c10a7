"""A small client for the daemon's API: what the `cosched submit/queue/...` commands use.

The standard library's urllib suffices for a handful of JSON calls, and keeps
the CLI free of an HTTP dependency of its own.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

from cosched.errors import CoschedError

DEFAULT_URL = "http://127.0.0.1:6817"
LOG_LINES = 10_000
"""The most lines of a job's output one request reads (and at most `LIVE_LOG_BYTES` of them): the
API refuses more, and `cosched logs -n` says so before asking."""


SUBMIT_WAITS = (1.0, 2.0, 4.0, 8.0, 16.0)
"""Seconds `Client.submit` waits before sending again a submission whose answer was lost: half a
minute in all, about what a daemon killed after the commit takes to be restarted and recover."""


class ApiError(CoschedError):
    """The daemon refused a request (`status`, its HTTP code), or could not be reached (None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AnswerLost(ApiError):
    """The request may have reached the daemon, but its answer did not come back (a timeout, a
    connection cut): unlike a refused connection, whether it was carried out is not known."""


class Client:
    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30.0, ca_file: str | None = None
    ) -> None:
        """`ca_file` (or $COSCHED_CA_FILE): the certificates an https daemon's is checked against, for
        a site's own CA or a self-signed one; without it, the system's."""
        self.url = _checked_url((url or os.environ.get("COSCHED_URL") or DEFAULT_URL).rstrip("/"))
        self.token = token if token is not None else os.environ.get("COSCHED_TOKEN", "")
        if not _TOKEN.fullmatch(self.token):
            raise ApiError("the token ($COSCHED_TOKEN) has characters an HTTP header cannot carry")
        self.timeout = timeout
        ca_file = ca_file or os.environ.get("COSCHED_CA_FILE") or None
        try:
            self.context = ssl.create_default_context(cafile=ca_file) if self.url.startswith("https:") else None
        except (OSError, ssl.SSLError) as exc:
            raise ApiError(f"cannot use the CA file {ca_file}: {getattr(exc, 'strerror', None) or exc}") from None
        self._opener = urllib.request.build_opener(_NoRedirects, urllib.request.HTTPSHandler(context=self.context))

    def submit(self, path: str, body: Any) -> Any:
        """POST a submission under an `Idempotency-Key` of its own, sent again (after each of
        `SUBMIT_WAITS`) while its answer is lost or the daemon answers 503: a retry of one the
        daemon accepted gets that first answer, never a second job. Once an answer was lost, a
        daemon that cannot be reached (killed after the commit, restarting) is waited for too; before
        that, it is said at once (nothing was sent). If no answer ever comes, AnswerLost says the
        submission may have been accepted, so that it is not simply sent again by hand."""
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        lost: AnswerLost | None = None
        for wait in (*SUBMIT_WAITS, None):
            try:
                return self.call("POST", path, body, headers)
            except AnswerLost as exc:
                lost = exc
            except ApiError as exc:  # an answer (a refusal holds for the first try too: see `answered`)
                if exc.status != 503 and not (lost is not None and exc.status is None):
                    raise
                if wait is None and lost is None:
                    raise
            if wait is None:
                break
            time.sleep(wait)
        raise AnswerLost(
            f"{lost}; the submission may have been accepted before its answer was lost:"
            " see `cosched queue` before submitting it again"
        )

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                answer = response.read()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise ApiError(
                    f"{self.url} answered {path} with a redirect (HTTP {exc.code}) to {exc.headers.get('location')!r}:"
                    " the token is never sent on; give the daemon's own URL"
                ) from None
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                message = exc.reason
            if exc.code == 401:  # the CLI's token comes from the environment: say where
                message = f"{message}: give the token in $COSCHED_TOKEN" if not self.token else message
            raise ApiError(f"{message} (HTTP {exc.code})", exc.code) from None
        except urllib.error.URLError as exc:  # connecting or sending: the daemon has no whole request
            raise ApiError(f"cannot reach the cosched daemon at {self.url}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:  # the request sent, its answer cut short or late
            if self.context is None and isinstance(exc, _CLOSED_UNREAD) and _speaks_tls(self.url, self.timeout):
                raise ApiError(
                    f"{self.url} serves HTTPS (the plain request was never read): give https:// in its URL"
                ) from None
            raise AnswerLost(f"no answer from the cosched daemon at {self.url}: {exc!r}") from None
        try:
            return json.loads(answer or b"null")
        except ValueError:
            raise ApiError(f"{self.url} answered {path} with other than JSON: is it the cosched daemon?") from None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error, not followed: urllib sends the Authorization header on to wherever
    it leads, another host or plain HTTP (a helper's audit: the token reached a second server)."""

    def redirect_request(self, *args: Any) -> None:
        return None


_TOKEN = re.compile(r"[\x21-\x7e]*")
"""What a bearer token may hold: visible ASCII (a header value cannot carry a newline or UTF-8)."""


_CLOSED_UNREAD = (http.client.BadStatusLine, ConnectionResetError)
"""How an https daemon answers a plain request: the connection closed (or a TLS alert read as a
status line), never silence; a timeout is not probed (it would add the probe's wait to each try)."""


def _speaks_tls(url: str, timeout: float) -> bool:
    """Whether `url`'s port completes a TLS handshake: an https daemon given a plain request closes the
    connection unread, which would otherwise read as an answer lost and be retried for half a minute.
    Only whether it speaks TLS is asked, so its certificate is not checked here."""
    parts = urllib.parse.urlsplit(url)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        raw = socket.create_connection((parts.hostname, parts.port or 80), timeout=min(timeout, 5.0))
        with raw, context.wrap_socket(raw, server_hostname=parts.hostname):
            return True
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False


def _checked_url(url: str) -> str:
    """`url` if it can name a daemon (http or https, a host, ASCII), else ApiError naming it."""
    try:
        parts = urllib.parse.urlsplit(url)
        usable = url.isascii() and parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a bad IPv6 literal, a port out of range
        usable = False
    if not usable:
        raise ApiError(f"{url!r} is not the URL of a cosched daemon (http[s]://HOST:PORT)")
    return url

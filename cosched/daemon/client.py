"""A small client for the daemon's API: what the `cosched submit/queue/...` commands use.

The standard library's urllib suffices for a handful of JSON calls, and keeps
the CLI free of an HTTP dependency of its own.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from typing import Any

from cosched.errors import CoschedError

DEFAULT_URL = "http://127.0.0.1:6817"


class ApiError(CoschedError):
    """The daemon refused a request, or could not be reached."""


class Client:
    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30.0, ca_file: str | None = None
    ) -> None:
        """`ca_file` (or $COSCHED_CA_FILE): the certificates an https daemon's is checked against, for
        a site's own CA or a self-signed one; without it, the system's."""
        self.url = (url or os.environ.get("COSCHED_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("COSCHED_TOKEN", "")
        self.timeout = timeout
        ca_file = ca_file or os.environ.get("COSCHED_CA_FILE") or None
        try:
            self.context = ssl.create_default_context(cafile=ca_file) if self.url.startswith("https:") else None
        except (OSError, ssl.SSLError) as exc:
            raise ApiError(f"cannot use the CA file {ca_file}: {getattr(exc, 'strerror', None) or exc}") from None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                message = exc.reason
            raise ApiError(f"{message} (HTTP {exc.code})") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(f"cannot reach the cosched daemon at {self.url}: {reason}") from None

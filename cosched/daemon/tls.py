"""HTTPS for the API (`api.tls_cert`, `api.tls_key`): checked before the daemon starts anything.

Why in the daemon and not only behind a proxy: tokens travel in every request, and a cluster's
users submit from other hosts; a certificate the site already has is two config keys away. The
key is refused if others may read it, as the signing key is. The context is made once up front,
so a wrong path, a key that does not match the certificate or a file that is not PEM stops the
daemon with one line instead of failing at the first request; the API's protocol does the
handshake with it (`http_protocol`), counting a connection from its accept.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from cosched.daemon.config import ApiSection
from cosched.daemon.identity import refuse_shared
from cosched.errors import ConfigError


def server_context(api: ApiSection) -> ssl.SSLContext | None:
    """The API's TLS context (None: plain HTTP); ConfigError naming the key when its files cannot serve it."""
    if not api.tls_cert:
        return None
    cert, key = Path(api.tls_cert).expanduser(), Path(api.tls_key).expanduser()
    try:
        refuse_shared(os.stat(key), key, "api.tls_key")
    except OSError as exc:
        raise ConfigError(f"config key api.tls_key: cannot read {key}: {exc.strerror}") from None
    if not cert.is_file():
        raise ConfigError(f"config key api.tls_cert: {cert} is not a file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        detail = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ConfigError(
            f"config keys api.tls_cert and api.tls_key: cannot serve with {cert} and {key}: {detail}"
        ) from None
    return context

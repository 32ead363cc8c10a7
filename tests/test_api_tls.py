"""HTTPS for the API (`api.tls_cert`, `api.tls_key`): the daemon serves it, the CLI checks the
certificate against `--ca-file`, and bad files stop the daemon with one line before it binds.

The certificates are made here (a CA and a certificate for 127.0.0.1 it signed), with
`cryptography`, a test dependency.
"""

from __future__ import annotations

import datetime
import ipaddress
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require_module
from daemon_support import DaemonProcess, require_engine

from cosched.daemon.client import AnswerLost, ApiError, Client
from cosched.daemon.config import ApiSection, from_dict, validate
from cosched.daemon.tls import server_context
from cosched.errors import ConfigError


def make_pki(root: Path) -> tuple[Path, Path, Path]:
    """A CA (ca.pem) and a key and certificate for 127.0.0.1 it signed (key.pem, cert.pem)."""
    require_module("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey, ca: bool
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cosched test CA")])
    ca_cert = certificate("cosched test CA", ca_key, ca_name, ca_key, ca=True)
    cert = certificate("127.0.0.1", key, ca_name, ca_key, ca=False)
    paths = root / "ca.pem", root / "cert.pem", root / "key.pem"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    paths[2].chmod(0o600)
    return paths


def https_daemon(root: Path, api: str = "") -> tuple[DaemonProcess, Path]:
    """A started daemon serving HTTPS with a certificate for 127.0.0.1 (more `[api]` keys in `api`),
    its client checking that certificate, and the CA file that signed it."""
    ca, cert, key = make_pki(root)
    daemon = DaemonProcess(root, api=f'tls_cert = "{cert}"\ntls_key = "{key}"\n{api}')
    daemon.client = Client(daemon.client.url.replace("http:", "https:"), "", timeout=10, ca_file=str(ca))
    daemon.start()
    return daemon, ca


def test_bad_tls_files_are_one_line_errors(tmp_path: Path) -> None:
    ca, cert, key = make_pki(tmp_path)
    with pytest.raises(ConfigError, match=r"^config keys api\.tls_cert and api\.tls_key: give both"):
        validate(from_dict({"api": {"tls_cert": str(cert)}}))
    assert server_context(ApiSection(tls_cert=str(cert), tls_key=str(key))) is not None
    assert server_context(ApiSection()) is None
    with pytest.raises(ConfigError, match=r"^config key api\.tls_cert: .*absent\.pem is not a file$"):
        server_context(ApiSection(tls_cert=str(tmp_path / "absent.pem"), tls_key=str(key)))
    with pytest.raises(ConfigError, match=r"^config key api\.tls_key: cannot read .*: No such file"):
        server_context(ApiSection(tls_cert=str(cert), tls_key=str(tmp_path / "absent.pem")))
    not_a_key = tmp_path / "not-a-key.pem"
    not_a_key.write_bytes(ca.read_bytes())
    not_a_key.chmod(0o600)
    with pytest.raises(ConfigError, match=r"^config keys api\.tls_cert and api\.tls_key: cannot serve with"):
        server_context(ApiSection(tls_cert=str(cert), tls_key=str(not_a_key)))
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^config key api\.tls_key: .* readable or writable by others .*chmod 600"):
        server_context(ApiSection(tls_cert=str(cert), tls_key=str(key)))


def test_the_daemon_serves_https_and_the_cli_checks_its_certificate(tmp_path: Path) -> None:
    """With a certificate its CA signed, `cosched queue --ca-file` reaches the daemon over HTTPS. The
    same without the CA (the system's trust) is refused as an unverified certificate, and plain HTTP
    to the HTTPS port is told to use https (a submission is not retried as if its answer were lost)."""
    engine = require_engine()
    daemon, ca = https_daemon(tmp_path)
    try:
        assert daemon.client.call("GET", "/v1/health")["engine_up"] is True
        shown = subprocess.run(
            [sys.executable, "-m", "cosched.cli", "queue", "--url", daemon.client.url, "--ca-file", str(ca)],
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0 and shown.stdout.strip() == "no jobs", shown.stderr
        with pytest.raises(ApiError, match="CERTIFICATE_VERIFY_FAILED"):
            Client(daemon.client.url, "", timeout=10).call("GET", "/v1/health")
        # plain HTTP: the server closes the connection unread; the client finds the port speaks TLS and
        # says so at once, never an answer lost that `submit` would wait on for half a minute
        plain = Client(daemon.client.url.replace("https:", "http:"), "", timeout=10)
        with pytest.raises(ApiError, match=r"serves HTTPS .* give https://") as refused:
            plain.submit("/v1/jobs", {"image": "none", "command": ["true"], "cores": 1, "walltime": 60})
        assert not isinstance(refused.value, AnswerLost)
        assert "API on https://127.0.0.1:" in daemon.log.read_text()
    finally:
        daemon.cleanup(engine)


def test_connections_that_never_finish_the_handshake_are_counted_and_closed(tmp_path: Path) -> None:
    """A client that opens a TLS port and sends nothing (or half a ClientHello) must not hold a
    file descriptor for asyncio's 60 s handshake timeout beyond `api.max_connections`: such
    connections count from their accept, those over the cap are closed at once and the others
    after `api.header_timeout`; a real client is served meanwhile, and after."""
    engine = require_engine()
    daemon, _ = https_daemon(tmp_path, "max_connections = 16\nheader_timeout = 1.0")
    sockets = [socket.create_connection(("127.0.0.1", daemon.port), timeout=10) for _ in range(50)]
    try:
        for k, sock in enumerate(sockets):
            if k % 2:  # the first bytes of a ClientHello's record header, never the rest
                sock.sendall(b"\x16\x03\x01\x02")
        # while they hold every place, a real client takes the place of the one that waited longest
        assert daemon.client.call("GET", "/v1/health")["engine_up"] is True
        closed = closing_times(sockets, 8.0)
        assert len(closed) == 50, f"{50 - len(closed)} of 50 sockets mid-handshake still open after 8 s"
        assert sorted(closed)[50 - 16 - 1] < 0.5, closed  # those beyond max_connections at once
        assert max(closed) < 3.0, closed  # the others after header_timeout, not asyncio's 60 s
        assert daemon.client.call("GET", "/v1/health")["engine_up"] is True
    finally:
        for sock in sockets:
            sock.close()
        daemon.cleanup(engine)


def test_a_connection_mid_handshake_does_not_hold_up_a_stop(tmp_path: Path) -> None:
    """SIGTERM stops the daemon at once though a client sits in its handshake: uvicorn waits for
    every counted connection to close, and this one would close only at `header_timeout`."""
    engine = require_engine()
    daemon, _ = https_daemon(tmp_path, "header_timeout = 60.0")
    try:
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=10):
            time.sleep(0.2)
            started = time.monotonic()
            daemon.signal(signal.SIGTERM)
            assert time.monotonic() - started < 10.0
        assert daemon.process is not None and daemon.process.returncode == 0
    finally:
        daemon.cleanup(engine)


def closing_times(sockets: list[socket.socket], within: float) -> list[float]:
    """Seconds from now until each socket the daemon closes is closed (end of stream or reset);
    those still open after `within` seconds are left out."""
    started = time.monotonic()
    closed: list[float] = []
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map() and (left := within - (time.monotonic() - started)) > 0:
            for key, _ in selector.select(left):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    if sock.recv(4096):
                        continue  # an answer: read on until the close
                except ConnectionResetError:
                    pass
                selector.unregister(sock)
                closed.append(time.monotonic() - started)
    return closed

"""A dockerd of the test's own, for tests that stop or restart the engine.

Tests never stop the machine's engine: a user's containers, logs and images
live there. A `PrivateEngine` is a second dockerd with everything its own:
data root, exec root (its containerd runs under it), pid file, a unix socket
in a temporary directory, no bridge and no iptables rules (jobs have no
network anyway), live-restore as `deploy/docker-daemon.json` sets it. Its
images are imported into it, never pulled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
from conftest import missing


class PrivateEngine:
    def __init__(self, root: Path) -> None:
        binary = shutil.which("dockerd")
        if binary is None:
            missing("dockerd is not installed (deploy/docker-setup.sh installs it)")
        if os.geteuid() != 0:
            missing("a private dockerd needs root")
        self.binary = str(binary)
        self.root = root
        # Unix socket paths are limited to 108 bytes: the socket and exec root live in a short /tmp dir.
        self.short = Path(tempfile.mkdtemp(prefix="cosched-dockerd-", dir="/tmp"))
        self.socket = self.short / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.log = root / "dockerd.log"
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            self.binary,
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.short / 'exec'}",
            f"--pidfile={self.short / 'dockerd.pid'}",
            f"--host={self.url}",
            f"--config-file={self._config()}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
            "--live-restore",
        ]

    def _config(self) -> Path:
        """An empty config file of its own, so that /etc/docker/daemon.json is not read twice over flags."""
        path = self.short / "daemon.json"
        path.write_text("{}\n")
        return path

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while self.client() is None:
            if self.process.poll() is not None:
                raise AssertionError(f"private dockerd exited {self.process.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"private dockerd did not answer in {timeout} s:\n{self.tail()}")
            time.sleep(0.2)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM and wait: with live-restore its containers keep running."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def client(self) -> Any:
        """A client of this engine, or None while it does not answer."""
        try:
            client = docker.DockerClient(base_url=self.url, timeout=10)
            client.ping()
            return client
        except Exception:
            return None

    def close(self) -> None:
        """Remove every container, stop the engine and its containerd, and delete its files."""
        client = self.client()
        if client is not None:
            for container in client.containers.list(all=True):
                container.remove(force=True)
        self.stop()
        data = str(self.root / "data")
        if any(line.split()[1] == data for line in Path("/proc/mounts").read_text().splitlines()):
            subprocess.run(["umount", data], check=True)  # dockerd bind-mounts its data root on itself, and leaves it
        shutil.rmtree(self.short, ignore_errors=True)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

"""Running real daemons against the real Docker engine, for the end-to-end tests.

Without an engine these tests skip, except under CI (CI=true), where `.ci/run`
starts one: there a missing engine fails them, so a broken set-up cannot pass
by skipping.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cosched.daemon.cgroups import CgroupFiles
from cosched.daemon.client import ApiError, Client


def engine() -> Any:
    try:
        import docker

        client = docker.from_env()
        client.ping()
        return client
    except Exception:
        return None


def require_engine() -> Any:
    client = engine()
    if client is None:
        if os.environ.get("CI"):
            pytest.fail("no Docker engine under CI: .ci/run should have started dockerd")
        pytest.skip("no Docker engine running (CI starts one)")
    return client


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `predicate` until it is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


FAST = {"schedule": 0.2, "sample": 0.3, "review": 0.5, "reconcile": 2.0}


class DaemonProcess:
    """`cosched daemon` in a subprocess, with its own state directory, port and instance."""

    def __init__(
        self,
        root: Path,
        *,
        cores: int = 2,
        extra: str = "",
        api: str = "",
        docker: str = "",
        cluster: str = "",
        token: str = "",
        data_roots: bool = True,
        env: dict[str, str] | None = None,
        intervals: dict[str, float] | None = None,
    ) -> None:
        """`extra` is appended to the config; `api`, `cluster` and `docker` add keys to those tables;
        `token` is the client's; `data_roots` makes `root` the jobs' data root; `env` is the
        daemon's environment (default: the tests'); `intervals` replace those of `FAST`."""
        self.env = env
        self.root = root
        self.port = free_port()
        self.state = root / "state"
        self.config = root / "cosched.toml"
        periods = "\n".join(f"{k} = {v}" for k, v in {**FAST, **(intervals or {})}.items())
        roots = f'data_roots = ["{root}"]\n' if data_roots else ""
        self.config.write_text(
            f'[daemon]\nstate_dir = "{self.state}"\n'
            f"[api]\nport = {self.port}\n{api}\n"
            f"[cluster]\ncores = {cores}\n{cluster}\n"
            f"[docker]\n{roots}{docker}\n"
            f"[intervals]\n{periods}\n{extra}"
        )
        self.config.chmod(0o600)  # it may hold `api.token`, which others must not read
        self.client = Client(f"http://127.0.0.1:{self.port}", token, timeout=10)
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "daemon.log"
        self.image = ""
        """An image the tests submit (set by the fixture that built it)."""

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cosched.cli", "daemon", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                self.client.call("GET", "/v1/health")
                return
            except ApiError:
                time.sleep(0.1)
        raise AssertionError("daemon did not answer in time:\n" + self.log.read_text()[-3000:])

    def signal(self, sig: int = signal.SIGKILL) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGTERM)

    def instance(self) -> str:
        with sqlite3.connect(self.state / "state.sqlite") as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()
        return str(row[0]).strip('"')

    def db(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.state / "state.sqlite", timeout=30)
        conn.row_factory = sqlite3.Row
        return conn

    def cleanup(self, client: Any) -> None:
        """Stop the daemon and remove every container it made."""
        self.stop()
        if (self.state / "state.sqlite").exists():
            ours = {"label": f"cosched.instance={self.instance()}"}
            for container in client.containers.list(all=True, filters=ours, ignore_removed=True):
                container.remove(force=True)

    def cli(self, *args: str, token: str | None = None) -> str:
        """What `cosched ARGS --url` (this daemon's) prints, with `token` in $COSCHED_TOKEN; it must succeed."""
        env = {**os.environ, "COSCHED_TOKEN": token} if token is not None else None
        done = subprocess.run(
            [sys.executable, "-m", "cosched.cli", *args, "--url", self.client.url],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def submit(self, **spec: Any) -> int:
        return int(self.client.call("POST", "/v1/jobs", spec)["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.client.call("GET", f"/v1/jobs/{job_id}"))

    def wait_running(self, job_id: int, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id))["state"] != "running":
            assert time.monotonic() < deadline, f"job {job_id} not running after {timeout} s: {job['state']}"
            time.sleep(0.1)
        return job

    def wait_final(self, ids: list[int], timeout: float) -> dict[int, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            jobs = {job_id: self.job(job_id) for job_id in ids}
            if all(j["state"] in ("done", "failed", "cancelled") for j in jobs.values()):
                return jobs
            if time.monotonic() > deadline:
                states = {i: j["state"] for i, j in jobs.items()}
                raise AssertionError(f"jobs not finished in {timeout} s: {states}\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)


def cgroup_quota(client: Any, container_name: str) -> float | None:
    """The CPU quota the kernel enforces on a container, in CPUs, read by the test itself."""
    container = client.containers.get(container_name)
    files = CgroupFiles.of_pid(int(container.attrs["State"]["Pid"]))
    if files is None:
        return None
    quota, period = files.quota()
    return quota / period


def workflow_image() -> str:
    """The Debian workflow image, built once per machine (needs root and Debian's archive).

    Only CI must be able to build it; elsewhere a machine that cannot skips.
    """
    from workloads.images import workflow_image as build

    client = require_engine()
    try:
        return build(client)
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot build the workflow image here: {exc}")

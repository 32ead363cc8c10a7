"""The Docker engine restarts under a running daemon: it reports it, waits, reconciles, goes on.

The engine runs with live-restore (as `.ci/run` and `deploy/docker-daemon.json`
set it up), so containers outlive the engine; jobs that finish while it is down
are collected when it is back. A submission made while the engine is down is
accepted (its image was seen before) and runs afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, engine, require_engine

from workloads.images import busybox_image


def dockerd() -> tuple[int, list[str]] | None:
    """The running dockerd's pid and command line, if this process may restart it."""
    if os.geteuid() != 0:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode()).name == "dockerd":
            return int(entry.name), [a.decode() for a in argv if a]
    return None


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_engine_restart_mid_run(tmp_path: Path) -> None:
    client = require_engine()
    image = busybox_image(client)
    found = dockerd()
    if found is None or not client.info().get("LiveRestoreEnabled"):
        if os.environ.get("CI"):
            pytest.fail("CI must run dockerd as root with live-restore (see .ci/run)")
        pytest.skip("needs a root-owned dockerd with live-restore to restart")
    pid, argv = found
    daemon = DaemonProcess(tmp_path)
    daemon.start()
    try:
        short = [daemon.submit(image=image, command=["sleep", "2"], cores=1, walltime=60) for _ in range(2)]
        long = [daemon.submit(image=image, command=["sleep", "6"], cores=1, walltime=60) for _ in range(2)]
        running = lambda: sum(r["state"] == "running" for r in daemon.client.call("GET", "/v1/queue"))  # noqa: E731
        wait_for(lambda: running() == 2, 30, "two jobs to start")

        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 60, "dockerd to stop")
        wait_for(lambda: daemon.client.call("GET", "/v1/health")["engine_up"] is False, 10, "the daemon to notice")
        during = daemon.submit(image=image, command=["sleep", "1"], cores=1, walltime=60)
        time.sleep(2.5)  # the short jobs finish while the engine is down

        with open(tmp_path / "dockerd.log", "ab") as log:
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: engine() is not None, 60, "dockerd to come back")
        wait_for(lambda: daemon.client.call("GET", "/v1/health")["engine_up"] is True, 30, "the daemon to reconcile")
        jobs = daemon.wait_final([*short, *long, during], 90)
    finally:
        daemon.cleanup(require_engine())
    assert {j["state"] for j in jobs.values()} == {"done"}, jobs
    text = daemon.log.read_text()
    assert "Docker engine unreachable" in text and "Docker engine is back" in text

"""The Docker engine stalls and restarts under a running daemon: it reports it, waits, reconciles, goes on.

The engine is a dockerd of the test's own (`private_engine.PrivateEngine`: own
socket, data root, exec root and containerd), never the machine's: stopping a
user's engine would stop their work. It runs with live-restore, as
`deploy/docker-daemon.json` sets it up, so containers outlive the engine;
jobs that finish while it is down are collected when it is back. A submission
made while the engine is down is accepted (its image was seen before) and runs
afterwards. While the engine is frozen (SIGSTOP: every call to it hangs),
`/v1/health` still answers at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import DaemonProcess
from private_engine import PrivateEngine

from workloads.images import busybox_image


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[PrivateEngine]:
    engine = PrivateEngine(tmp_path / "engine")
    engine.root.mkdir()
    engine.start()
    try:
        assert engine.client().info()["LiveRestoreEnabled"], "the private engine must keep containers across restarts"
        yield engine
    finally:
        engine.close()


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def health_seconds(daemon: DaemonProcess) -> float:
    started = time.monotonic()
    daemon.client.call("GET", "/v1/health")
    return time.monotonic() - started


def test_engine_stall_and_restart_mid_run(tmp_path: Path, engine: PrivateEngine) -> None:
    image = busybox_image(engine.client())  # imported into the private engine, not pulled
    (tmp_path / "daemon").mkdir()
    daemon = DaemonProcess(tmp_path / "daemon", docker=f'base_url = "{engine.url}"')
    daemon.start()
    try:
        short = [daemon.submit(image=image, command=["sleep", "2"], cores=1, walltime=60) for _ in range(2)]
        long = [daemon.submit(image=image, command=["sleep", "6"], cores=1, walltime=60) for _ in range(2)]
        running = lambda: sum(r["state"] == "running" for r in daemon.client.call("GET", "/v1/queue"))  # noqa: E731
        wait_for(lambda: running() == 2, 30, "two jobs to start")

        assert engine.process is not None
        os.kill(engine.process.pid, signal.SIGSTOP)  # a stalled engine: calls to it hang
        try:
            time.sleep(1.0)  # a pass or a sample is now waiting on it
            stalled = [health_seconds(daemon) for _ in range(5)]
        finally:
            os.kill(engine.process.pid, signal.SIGCONT)
        assert max(stalled) < 0.5, f"/v1/health took up to {max(stalled):.2f} s with the engine stalled"

        engine.stop()
        wait_for(lambda: daemon.client.call("GET", "/v1/health")["engine_up"] is False, 10, "the daemon to notice")
        during = daemon.submit(image=image, command=["sleep", "1"], cores=1, walltime=60)
        time.sleep(2.5)  # the short jobs finish while the engine is down

        engine.start()
        wait_for(lambda: daemon.client.call("GET", "/v1/health")["engine_up"] is True, 30, "the daemon to reconcile")
        jobs = daemon.wait_final([*short, *long, during], 90)
    finally:
        daemon.stop()
    assert {j["state"] for j in jobs.values()} == {"done"}, jobs
    text = daemon.log.read_text()
    assert "Docker engine unreachable" in text and "Docker engine is back" in text

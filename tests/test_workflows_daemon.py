"""The four real workflows, and broken ones, run through a real daemon in the workflow image.

Acceptance of the real-workflow issue: a small instance of each workflow runs
stage by stage as containers and its outputs are checked (mosaic, planted BLAST
hits, statistics against NumPy, synthetic checksum); a workflow naming an
unknown stage, missing its input or with a stage exiting non-zero fails, shows
the stage's log tail in `cosched status --workflow`, and leaves no container.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_support import DaemonProcess, require_engine, workflow_image
from workloads.real import make_data_dir, real_workflow, verify

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def image() -> str:
    return workflow_image()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, image: str) -> Iterator[DaemonProcess]:
    process = DaemonProcess(tmp_path_factory.mktemp("workflows"), cores=2)
    process.image = image
    process.start()
    yield process
    process.cleanup(require_engine())


def submit(daemon: DaemonProcess, spec: dict[str, Any]) -> int:
    return int(daemon.client.call("POST", "/v1/workflows", spec)["id"])


def wait_workflows(daemon: DaemonProcess, ids: list[int], timeout: float) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        states = {i: daemon.client.call("GET", f"/v1/workflows/{i}") for i in ids}
        if all(s["state"] in ("done", "failed") for s in states.values()):
            return states
        if time.monotonic() > deadline:
            summary = {i: (s["state"], s["stages"]) for i, s in states.items()}
            raise AssertionError(f"workflows not finished in {timeout} s: {summary}\n{daemon.log.read_text()[-3000:]}")
        time.sleep(0.5)


def status_text(daemon: DaemonProcess, workflow_id: int) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "status", "--workflow", str(workflow_id), "--url", daemon.client.url],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def leftover_containers(daemon: DaemonProcess) -> list[str]:
    client = require_engine()
    label = f"cosched.instance={daemon.instance()}"
    return [c.name for c in client.containers.list(all=True, filters={"label": label})]


def test_each_workflow_runs_and_its_outputs_are_right(daemon: DaemonProcess) -> None:
    cores = {"montage": 2, "blast": 2, "statistics": 1, "synthetic": 1}
    data = {app: daemon.root / app for app in cores}
    for path in data.values():
        make_data_dir(path)
    ids = {
        app: submit(daemon, real_workflow(app, cores=n, data_dir=data[app], image=daemon.image))
        for app, n in cores.items()
    }
    final = wait_workflows(daemon, list(ids.values()), timeout=600)
    for app, workflow_id in ids.items():
        status = final[workflow_id]
        assert status["state"] == "done", (app, status, status_text(daemon, workflow_id))
        assert all(stage["state"] == "done" for stage in status["stages"].values())
        assert verify(app, data[app]) == [], app
    assert (data["montage"] / "mosaic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert leftover_containers(daemon) == []


def _broken(daemon: DaemonProcess, name: str, stages: list[dict[str, Any]]) -> dict[str, Any]:
    data = make_data_dir(daemon.root / name)
    return {
        "name": name,
        "app": "montage",
        "cores": 1,
        "image": daemon.image,
        "walltime": 120,
        "data_dirs": [str(data)],
        "stages": stages,
    }


def _stage(name: str, command: list[str], depends: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"name": name, "command": command, "depends": list(depends)}


def test_broken_workflows_fail_with_the_log_tail_and_leave_no_container(daemon: DaemonProcess) -> None:
    run = ["python3", "-m", "workloads.stages", "montage"]
    cases = {
        "unknown-stage": (
            [_stage("reproject", [*run, "reproject", "--dir", str(daemon.root / "unknown-stage")])],
            "reproject",
            "unknown stage 'reproject' of montage",
        ),
        "missing-input": (
            [_stage("project", [*run, "project", "--dir", str(daemon.root / "missing-input")])],
            "project",
            "missing input",
        ),
        "exits-non-zero": (
            [
                _stage("prepare", ["sh", "-c", "echo preparing; echo 'disk quota exceeded' >&2; exit 3"]),
                _stage("after", ["true"], ("prepare",)),
            ],
            "prepare",
            "disk quota exceeded",
        ),
    }
    ids = {name: submit(daemon, _broken(daemon, name, stages)) for name, (stages, _, _) in cases.items()}
    final = wait_workflows(daemon, list(ids.values()), timeout=120)
    for name, (_, stage, message) in cases.items():
        status = final[ids[name]]
        assert status["state"] == "failed", (name, status)
        assert status["failed_stage"] == stage
        assert status["failure"]["exit_code"] != 0
        assert message in status["failure"]["log_tail"], (name, status["failure"])
        shown = status_text(daemon, ids[name])
        assert "failed" in shown and message in shown, shown
    assert final[ids["exits-non-zero"]]["failure"]["exit_code"] == 3
    assert final[ids["exits-non-zero"]]["stages"]["after"]["state"] == "cancelled"
    assert leftover_containers(daemon) == []

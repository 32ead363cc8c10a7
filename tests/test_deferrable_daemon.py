"""Deferrable jobs in the daemon: `begin` and `latest_start` through the API, the store and a restart.

Why: a window is a promise about when a job may run, so the API must refuse one that cannot be
kept (a 422 naming the field, nothing stored), resolve `+SECONDS` once on the daemon's clock and
store it absolute, show a held job as pending until its begin, record a job that missed its
latest start as failed with the reason, and keep held jobs held across a restart. The in-process
tests drive a real `Daemon` (SQLite under tmp_path, the local engine for image lookups) with a
clock of their own and launch nothing; the last one runs `cosched daemon`, SIGKILLs it while a
job is held, and checks that the job runs once, after its begin.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_support import DaemonProcess, require_engine
from fastapi.testclient import TestClient

from cosched.daemon import views
from cosched.daemon.api import create_app
from cosched.daemon.config import from_dict, validate
from cosched.daemon.service import Daemon
from workloads.images import busybox_image

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image(require_engine())


def make_daemon(root: Path, clock: Clock) -> Daemon:
    config = validate(
        from_dict(
            {
                "daemon": {"state_dir": str(root / "state"), "instance": "deftest"},
                "cluster": {"nodes": 1, "cores": 2, "memory_mib": 4096},
                "docker": {"data_roots": [str(root)]},
            }
        )
    )
    return Daemon(config, clock=clock)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def daemon(tmp_path: Path, image: str, clock: Clock) -> Iterator[Daemon]:
    daemon = make_daemon(tmp_path, clock)
    yield daemon
    daemon.store.close()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[TestClient]:
    with TestClient(create_app(daemon)) as client:
        yield client


def job(image: str, /, **changes: Any) -> dict[str, Any]:
    return {"image": image, "command": ["sleep", "1"], "cores": 1, "walltime": 30, **changes}


def stored(daemon: Daemon) -> int:
    with sqlite3.connect(daemon.config.state_dir / "state.sqlite") as db:
        return int(db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]) + int(
            db.execute("SELECT COUNT(*) FROM workflows").fetchone()[0]
        )


@pytest.mark.parametrize(
    ("begin", "latest", "expected"),
    [("+600", "now+900", (T0 + 600, T0 + 900)), (T0 + 10, None, (T0 + 10, None)), ("now", None, (T0, None))],
)
def test_relative_and_absolute_times_are_stored_absolute(
    client: TestClient, daemon: Daemon, image: str, begin: Any, latest: Any, expected: tuple[Any, Any]
) -> None:
    body = job(image, begin=begin, **({"latest_start": latest} if latest is not None else {}))
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    spec = daemon.store.job(response.json()["id"])["spec"]
    assert (spec["begin"], spec["latest_start"]) == expected


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"begin": "tomorrow"}, "begin", "neither epoch seconds nor +SECONDS"),
        ({"begin": True}, "begin", "not a boolean"),
        ({"latest_start": -5}, "latest_start", "negative"),
        ({"begin": T0 - 3600}, "begin", "in the past"),
        ({"latest_start": T0 - 1}, "latest_start", "has passed"),
        ({"begin": "+600", "latest_start": "+300"}, "latest_start", "before begin"),
        ({"begin": 1e300}, "begin", "days ahead"),  # past the platform's time_t: broke every queue view
        ({"begin": "+9223372036854775807"}, "begin", "days ahead"),
        ({"latest_start": "now+1e12"}, "latest_start", "neither epoch seconds"),
        ({"latest_start": T0 + 3654 * 86400}, "latest_start", "days ahead"),
    ],
)
def test_a_bad_window_is_a_422_naming_the_field_and_nothing_is_stored(
    client: TestClient, daemon: Daemon, image: str, changes: dict[str, Any], field: str, words: str
) -> None:
    response = client.post("/v1/jobs", json=job(image, **changes))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error.startswith(f"{field}: ") and words in error and "\n" not in error
    assert stored(daemon) == 0


def test_a_workflow_may_begin_later_but_its_stages_take_no_window(
    client: TestClient, daemon: Daemon, image: str
) -> None:
    base = {"name": "wf", "image": image, "command": "true", "cores": 1, "walltime": 30}
    stages = [{"name": "a"}, {"name": "b", "depends": ["a"]}]
    for bad, field in (
        ({"latest_start": "+60"}, "latest_start"),
        ({"stages": [{"name": "a", "begin": "+5"}]}, "stages"),
    ):
        response = client.post("/v1/workflows", json={**base, "stages": stages, **bad})
        assert response.status_code == 422 and response.json()["error"].startswith(field), response.text
    assert stored(daemon) == 0
    response = client.post("/v1/workflows", json={**base, "stages": stages, "begin": "+120"})
    assert response.status_code == 201, response.text
    [first] = response.json()["jobs"]
    assert daemon.store.job(first)["spec"]["begin"] == T0 + 120


def test_a_held_job_is_shown_pending_until_its_begin_and_a_missed_latest_start_is_recorded(
    client: TestClient, daemon: Daemon, image: str, clock: Clock
) -> None:
    held = client.post("/v1/jobs", json=job(image, begin="+600", latest_start="+700")).json()["id"]
    daemon.schedule()
    assert daemon.core.queue == [] and held in daemon.core.windows.held
    [row] = views.queue(daemon)
    assert row["id"] == held and row["state"] == "pending" and row["reason"].startswith("begins at ")
    assert client.get(f"/v1/jobs/{held}").json()["reason"].startswith("begins at ")
    # Never started, this daemon offered the core no node: the job cannot start in its window.
    clock.now = T0 + 650
    daemon.schedule()
    assert daemon.core.queue and daemon.core.queue[0].id == held
    clock.now = T0 + 701
    daemon.schedule()
    record = daemon.store.job(held)
    assert (
        record["state"] == "failed"
        and record["reason"] == f"job {held} did not start by its latest start, 700 s after its submission"
    )


def test_a_restart_keeps_a_held_job_held(tmp_path: Path, image: str, clock: Clock) -> None:
    first = make_daemon(tmp_path, clock)
    with TestClient(create_app(first)) as client:
        held = client.post("/v1/jobs", json=job(image, begin="+600")).json()["id"]
    first.schedule()
    first.store.close()
    clock.now = T0 + 60
    again = make_daemon(tmp_path, clock)
    try:
        again.start()
        again.schedule()
        assert held in again.core.windows.held and again.core.windows.held[held].begin == T0 + 600
        assert [row["reason"][:10] for row in views.queue(again)] == ["begins at "]
    finally:
        again.store.close()


def test_a_held_job_survives_sigkill_and_runs_once_after_its_begin(tmp_path: Path, image: str) -> None:
    engine = require_engine()
    daemon = DaemonProcess(tmp_path)
    daemon.start()
    try:
        submitted = time.time()
        job_id = daemon.submit(image=image, command=["true"], cores=1, walltime=30, begin="+4", latest_start="+60")
        [row] = daemon.client.call("GET", "/v1/queue")
        assert row["reason"].startswith("begins at ") or row["reason"] == "Submitted"
        daemon.signal(signal.SIGKILL)
        daemon.start()
        assert daemon.job(job_id)["state"] == "pending"
        final = daemon.wait_final([job_id], timeout=60)[job_id]
        assert final["state"] == "done" and final["start"] >= submitted + 4
        containers = engine.containers.list(all=True, filters={"label": f"cosched.instance={daemon.instance()}"})
        assert len([c for c in containers if c.labels.get("cosched.job") == str(job_id)]) <= 1
    finally:
        daemon.cleanup(engine)

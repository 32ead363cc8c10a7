"""The history of ended jobs (`cosched history`, GET /v1/history), as Slurm's sacct and sreport:
the API over a state file written here, and the CLI against a daemon on the real engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine
from fastapi.testclient import TestClient

from cosched.daemon.api import create_app
from cosched.daemon.commands import _hms, _totals
from cosched.daemon.config import from_dict, validate
from cosched.daemon.service import Daemon
from workloads.images import busybox_image

NOW = 1_800_000_000.0


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon (never started) whose state file holds six ended jobs and a running one."""
    daemon = Daemon(validate(from_dict({"daemon": {"state_dir": str(tmp_path / "state")}})))
    daemon.clock = lambda: NOW  # type: ignore[method-assign]
    store = daemon.store
    spec = {"name": "blastn", "image": "x", "command": ["true"], "walltime": 600}
    ended = [  # user, cores, submit, start, end, state, exit code
        ("alice", 2, NOW - 5000, NOW - 4000, NOW - 1000, "done", 0),
        ("alice", 1, NOW - 3000, NOW - 2000, NOW - 1900, "failed", 3),
        ("bob", 4, NOW - 2500, NOW - 2400, NOW - 400, "done", 0),
        ("bob", 1, NOW - 800, None, NOW - 300, "cancelled", None),  # cancelled while pending
        ("carol", 1, NOW - 3 * 86400, NOW - 3 * 86400, NOW - 2 * 86400, "done", 0),  # before the last day
        ("alice", 2, NOW - 200, NOW - 150, NOW - 100, "done", 0),
    ]
    with store.transaction() as db:
        for user, cores, submit, start, end, state, code in ended:
            job_id = store.add_job(db, {**spec, "cores": cores}, submit, user=user)
            store.update_job(db, job_id, state=state, start=start, end=end, exit_code=code)
        store.update_job(db, 1, cpu_seconds=1500.0, slots=[[0, 2]])  # a quarter of its 2 cores for 3000 s
        running = store.add_job(db, {**spec, "cores": 1}, NOW - 50, user="carol")
        store.update_job(db, running, state="running", start=NOW - 40)
    yield daemon
    daemon.store.close()


def _get(client: TestClient, query: str = "") -> list[dict]:  # type: ignore[type-arg]
    answer = client.get("/v1/history" + query)
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def test_the_last_day_oldest_end_first_with_core_seconds_and_waits(daemon: Daemon) -> None:
    with TestClient(create_app(daemon)) as client:
        rows = _get(client)
        assert [r["id"] for r in rows] == [2, 1, 3, 4, 6]  # carol's is older than a day; job 7 runs
        first, cancelled = rows[0], rows[3]
        assert (first["state"], first["exit_code"], first["elapsed"], first["core_seconds"]) == ("failed", 3, 100, 100)
        assert first["wait"] == 1000
        assert rows[1]["core_seconds"] == 2 * 3000
        assert (rows[1]["name"], rows[1]["nodes"], first["nodes"]) == ("blastn", "node0:2", "")  # as sacct's
        assert (rows[1]["cpu_seconds"], rows[1]["cpu_efficiency"]) == (1500.0, 0.25)
        assert (first["cpu_seconds"], first["cpu_efficiency"]) == (None, None)  # never sampled
        # Never started: no run, no core-seconds; it waited from submission to its cancel.
        assert (cancelled["start"], cancelled["elapsed"], cancelled["core_seconds"]) == (None, 0, 0)
        assert cancelled["wait"] == 500
        assert [r["id"] for r in _get(client, "?user=alice")] == [2, 1, 6]
        assert [r["id"] for r in _get(client, "?state=done&limit=2")] == [1, 3]
        assert [r["id"] for r in _get(client, f"?since={NOW - 4 * 86400}&until={NOW - 1500}")] == [5, 2]


@pytest.mark.parametrize(
    ("query", "field"),
    [("?state=running", "state"), ("?limit=0", "limit"), ("?limit=100001", "limit"), ("?since=nan", "since")],
)
def test_bad_queries_are_one_line_refusals(daemon: Daemon, query: str, field: str) -> None:
    with TestClient(create_app(daemon)) as client:
        answer = client.get("/v1/history" + query)
        assert answer.status_code == 422
        assert answer.json()["fields"][0] == f"query.{field}" and "\n" not in answer.json()["error"]


def test_totals_per_user_or_class_most_core_hours_first() -> None:
    fields = ("user", "app_class", "state", "core_seconds", "cpu_seconds", "wait")
    rows = [
        dict(zip(fields, values, strict=True))
        for values in [
            ("a", "blast", "done", 100.0, 40.0, 10.0),
            ("b", "blast", "failed", 500.0, None, 0.0),
            ("a", "montage", "cancelled", 0.0, None, 30.0),
        ]
    ]
    ends = {"done": 0, "failed": 0, "cancelled": 0}
    # CPU efficiency over the jobs sampled only: b's unsampled 500 core-seconds do not dilute a's 40%.
    assert _totals(rows) == [
        {"user": "b", "jobs": 1, **ends, "failed": 1, "core_seconds": 500.0, "cpu_seconds": 0.0}
        | {"cpu_efficiency": None, "mean_wait": 0.0},
        {"user": "a", "jobs": 2, **ends, "done": 1, "cancelled": 1, "core_seconds": 100.0, "cpu_seconds": 40.0}
        | {"cpu_efficiency": 0.4, "mean_wait": 20.0},
    ]
    by_class = _totals(rows, "app_class")
    assert [(t["app_class"], t["jobs"], t["core_seconds"], t["cpu_efficiency"]) for t in by_class] == [
        ("blast", 2, 600.0, 0.4),
        ("montage", 1, 0.0, None),
    ]
    assert (_hms(59.6), _hms(3 * 3600 + 61), _hms(2 * 86400 + 5)) == ("00:01:00", "03:01:01", "2-00:00:05")


def test_the_cli_lists_what_ran_on_the_real_engine(tmp_path: Path) -> None:
    """Jobs end on the real engine: one sleeps 3 s, one spins a core 3 s, one exits 3. `cosched
    history` lists each with its exit code and the CPU it used, read from its cgroup: the
    spinning job near its core-seconds, the sleeping one near none; `--state failed` the one
    that failed; `--totals` one row of 3 jobs."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=1)
    daemon.start()
    try:
        ok = daemon.submit(image=image, command=["sleep", "3"], cores=1, walltime=60)
        spinning = "timeout 3 sh -c 'while :; do :; done'; exit 0"  # not as PID 1, which SIGTERM does not end
        spin = daemon.submit(image=image, command=["sh", "-c", spinning], cores=1, walltime=60)
        bad = daemon.submit(image=image, command=["sh", "-c", "exit 3"], cores=1, walltime=60)
        daemon.wait_final([ok, spin, bad], 60)
        lines = daemon.cli("history").splitlines()
        assert lines[0].split()[:6] == ["JOBID", "NAME", "USER", "STATE", "CORES", "NODELIST"]
        by_id = {line.split()[0]: line.split() for line in lines[2:]}
        assert by_id[str(ok)][3] == "DONE" and by_id[str(bad)][3] == "FAILED"
        assert by_id[str(ok)][5] == "node0:1"
        assert "3" in by_id[str(bad)][11:]  # EXIT, then the reason
        [failed] = json.loads(daemon.cli("history", "--state", "failed", "--json"))
        assert (failed["id"], failed["exit_code"]) == (bad, 3)
        assert failed["elapsed"] < 10 and failed["core_seconds"] == pytest.approx(failed["elapsed"])
        rows = {row["id"]: row for row in json.loads(daemon.cli("history", "--json"))}
        # The last sample is up to 0.3 s before the end, and the core is shared with the machine's
        # other work: 0.94 alone here, 0.5 while another test suite ran beside it.
        assert rows[spin]["cpu_efficiency"] > 0.3, rows[spin]
        assert rows[ok]["cpu_efficiency"] < 0.03, rows[ok]
        [total] = json.loads(daemon.cli("history", "--totals", "--json"))
        assert (total["jobs"], total["done"], total["failed"]) == (3, 2, 1)
        assert total["cpu_seconds"] == pytest.approx(sum(row["cpu_seconds"] or 0.0 for row in rows.values()))
        assert daemon.cli("history", "--until", "1h").strip() == "no jobs ended then"
    finally:
        daemon.cleanup(engine)

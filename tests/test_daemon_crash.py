"""Crash safety: SIGKILL the daemon at random moments, restart it, and nothing is lost or run twice.

Every job appends its id to a `starts` file when its container starts and to an
`ends` file when it finishes (a declared data directory), so the test counts
real executions, not what the daemon believes. Between kills it checks that
every running container's kernel quota equals the quota the daemon reports
(quotas re-applied after adoption) and that persisted learning never goes back.
"""

from __future__ import annotations

import itertools
import json
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, cgroup_quota, require_engine

from workloads.images import busybox_image
from workloads.real import make_data_dir

TRIALS = 10


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image(require_engine())


def job_command(runs: Path, seconds: float, busy: bool) -> list[str]:
    work = "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done" if busy else f"sleep {seconds}"
    script = f"echo $COSCHED_JOB_ID >> {runs}/starts; echo 1/2 > $COSCHED_PROGRESS; {work}"
    return ["sh", "-c", f"{script}; echo $COSCHED_JOB_ID >> {runs}/ends"]


def check_quotas(daemon: DaemonProcess, client: object) -> int:
    """Kernel quota == reported quota for every running job; returns how many were compared.

    The daemon records a quota change before it applies it (the plan is durable
    first), so for a few milliseconds a live daemon reports a quota the kernel
    does not enforce yet. A job whose quota is changing is read again a moment
    later; a mismatch that lasts is the failure this looks for.
    """
    instance = daemon.instance()
    compared = 0
    for row in daemon.client.call("GET", "/v1/queue"):
        if row["state"] != "running":
            continue
        for attempt in range(5):
            try:
                enforced = cgroup_quota(client, f"cosched-{instance}-{row['id']}")
            except Exception:
                break  # ended meanwhile
            status = daemon.job(row["id"])
            if enforced is None or status["state"] != "running":
                break
            if enforced == pytest.approx(status["quota"], abs=1e-3) or attempt == 4:
                assert enforced == pytest.approx(status["quota"], abs=1e-3), (row, status)
                compared += 1
                break
            time.sleep(0.2)
    return compared


def learning(daemon: DaemonProcess) -> tuple[int, dict]:
    with daemon.db() as db:
        decisions = db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0]
        row = db.execute("SELECT value FROM meta WHERE key = 'weights'").fetchone()
    return int(decisions), json.loads(row[0]) if row else {}


def test_sigkill_at_random_moments_loses_nothing_and_runs_nothing_twice(tmp_path: Path, image: str) -> None:
    client = require_engine()
    runs = make_data_dir(tmp_path / "runs")
    daemon = DaemonProcess(tmp_path, extra="[policies]\nseed = 3\n")
    rng = random.Random(2026)
    accepted: list[int] = []
    compared = 0
    last_decisions, last_weights = 0, {}
    try:
        for _ in range(TRIALS):
            daemon.start()
            compared += check_quotas(daemon, client)
            decisions, weights = learning(daemon)
            assert decisions >= last_decisions
            for app_class, state in last_weights.get("classes", {}).items():  # learning never goes back
                assert weights["classes"][app_class]["t"] >= state["t"]
            for _ in range(rng.randint(2, 4)):
                accepted.append(
                    daemon.submit(
                        image=image,
                        command=job_command(runs, rng.choice([0.5, 1.0, 2.0]), rng.random() < 0.4),
                        cores=rng.choice([1, 2]),
                        walltime=60,
                        app_class=rng.choice(["crash.idle", "crash.mixed"]),
                        tasks=2,
                        data_dirs=[str(runs)],
                    )
                )
            time.sleep(rng.uniform(0.05, 2.5))
            daemon.signal(signal.SIGKILL)
            last_decisions, last_weights = learning(daemon)
        daemon.start()
        compared += check_quotas(daemon, client)
        jobs = daemon.wait_final(accepted, 180)
    finally:
        daemon.cleanup(client)
    assert {j["state"] for j in jobs.values()} == {"done"}, {i: (j["state"], j["reason"]) for i, j in jobs.items()}
    starts = Counter(int(line) for line in (runs / "starts").read_text().split())
    ends = Counter(int(line) for line in (runs / "ends").read_text().split())
    assert set(starts) == set(accepted) and set(ends) == set(accepted)
    assert max(starts.values()) == 1, {job: n for job, n in starts.items() if n > 1}
    assert max(ends.values()) == 1
    assert compared >= 1, "no running job was found to compare its quota after a restart"


def test_dependency_chains_keep_their_order_through_sigkills(tmp_path: Path, image: str) -> None:
    """Two chains (afterok on the job before) and a job after the failed end of a third, while the
    daemon is SIGKILLed at random moments: each job runs once, a chain's job starts only after
    the one before it ended, the job after a failure runs, and the jobs after that failure are
    cancelled with Slurm's reason, once, whatever the kills interrupted."""
    client = require_engine()
    runs = make_data_dir(tmp_path / "runs")
    daemon = DaemonProcess(tmp_path, extra='[policies]\ncosched = "none"\n')
    rng = random.Random(7)
    base = {"image": image, "cores": 1, "walltime": 60, "data_dirs": [str(runs)]}
    try:
        daemon.start()
        chains: list[list[int]] = [[], []]
        for link in range(5):
            for chain in chains:
                after = [{"kind": "afterok", "job": chain[-1]}] if chain else []
                chain.append(daemon.submit(**base, command=job_command(runs, 0.5 + link % 2, False), after=after))
        failing = daemon.submit(**base, command=["sh", "-c", "sleep 1; exit 4"])
        rescue, doomed = (
            daemon.submit(**base, command=job_command(runs, 0.5, False), after=[{"kind": kind, "job": failing}])
            for kind in ("afternotok", "afterok")
        )
        for _ in range(4):
            time.sleep(rng.uniform(0.5, 2.5))
            daemon.signal(signal.SIGKILL)
            daemon.start()
        ran = [*chains[0], *chains[1], rescue]
        jobs = daemon.wait_final([*ran, failing, doomed], 120)
    finally:
        daemon.cleanup(client)
    assert {jobs[i]["state"] for i in ran} == {"done"}, {i: (jobs[i]["state"], jobs[i]["reason"]) for i in ran}
    for chain in chains:
        for before, after in itertools.pairwise(chain):
            assert jobs[after]["start"] >= jobs[before]["end"] - 0.5, (before, after)
    assert jobs[failing]["state"] == "failed" and jobs[doomed]["state"] == "cancelled"
    assert jobs[doomed]["reason"] == f"DependencyNeverSatisfied: afterok on job {failing}, which failed"
    starts = Counter(int(line) for line in (runs / "starts").read_text().split())
    assert set(starts) == set(ran) and max(starts.values()) == 1, starts

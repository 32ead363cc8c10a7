"""A trained policy schedules in the daemon on the real engine, with torch unimportable.

The daemon runs with a `torch` package first on its path that raises on import: if
anything it loads (the plugin, its NumPy network, the model registry) imported torch,
it could not start. Inference of trained policies needs NumPy only.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine

from workloads.images import busybox_image


def _without_torch(root: Path) -> dict[str, str]:
    blocker = root / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("the daemon must not import torch")\n')
    path = os.pathsep.join(p for p in (str(blocker.parent), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def test_the_torch_blocker_blocks(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", "import torch"], env=_without_torch(tmp_path), capture_output=True)
    assert run.returncode != 0 and b"must not import torch" in run.stderr


@pytest.mark.parametrize(
    "policies",
    ['queue = "fcfs"\nbackfill = "rlbf:lublin-1"', 'queue = "dbf"\nbackfill = "none"', 'queue = "osdec"'],
    ids=["rlbf", "dbf", "osdec"],
)
def test_a_trained_policy_runs_jobs_in_the_daemon_without_torch(tmp_path: Path, policies: str) -> None:
    client = require_engine()
    image = busybox_image(client)
    daemon = DaemonProcess(
        tmp_path, cores=2, extra=f'[policies]\n{policies}\ncosched = "none"\n', env=_without_torch(tmp_path)
    )
    daemon.start()
    try:
        first = daemon.submit(image=image, command=["sleep", "3"], cores=1, walltime=60)
        daemon.wait_running(first)
        head = daemon.submit(image=image, command=["true"], cores=2, walltime=60)  # waits for both cores
        small = [daemon.submit(image=image, command=["sleep", "1"], cores=1, walltime=30) for _ in range(2)]
        jobs = daemon.wait_final([first, head, *small], timeout=90)
        assert all(job["state"] == "done" for job in jobs.values()), jobs
        if "rlbf" in policies:  # a job behind the blocked head started before it: backfilled
            assert min(jobs[j]["start"] for j in small) < jobs[head]["start"]
    finally:
        daemon.cleanup(client)


def test_an_unknown_model_stops_the_daemon_with_one_line(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, extra='[policies]\nbackfill = "rlbf:no-such-model"\ncosched = "none"\n')
    run = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "daemon", "--config", str(daemon.config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "unknown rlbf model 'no-such-model'" in run.stderr and run.stderr.count("\n") == 1


def test_topology_aware_joint_placement_runs_jobs_in_the_daemon_without_torch(tmp_path: Path) -> None:
    """`nsa` (the learned repair, NumPy only) places on a fat-tree of the host's virtual nodes,
    and the daemon serves its queue only at the window's boundaries."""
    client = require_engine()
    image = busybox_image(client)
    period = 5.0
    daemon = DaemonProcess(
        tmp_path,
        cores=2,
        cluster="nodes = 2\nnodes_per_switch = 1\nswitches_per_pod = 1\n",
        extra=f'[policies]\nplacement = "nsa:period={period:g}"\ncosched = "none"\n',
        env=_without_torch(tmp_path),
    )
    daemon.start()
    try:
        ids = []
        for cores in (1, 1, 2):  # submitted at three phases of the window
            ids.append(daemon.submit(image=image, command=["sleep", "1"], cores=cores, walltime=30))
            time.sleep(1.7)
        done = daemon.wait_final(ids, timeout=90)
        assert all(job["state"] == "done" for job in done.values()), done
        for job in done.values():
            boundary = math.ceil(job["submit"] / period) * period
            # Started at the first pass (1 s apart at most) after a boundary, never before one.
            assert boundary - 0.05 <= job["start"] and (job["start"] % period) < 1.5, job
    finally:
        daemon.cleanup(client)

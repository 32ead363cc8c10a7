"""Job arrays (`cosched submit --array`, as sbatch --array): the indices' syntax, and on the real
engine an array's tasks each run once with their index, as one workflow."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine

from cosched.daemon.commands import _indices
from workloads.images import busybox_image


def test_indices_as_sbatch_writes_them() -> None:
    assert _indices("0-4") == [0, 1, 2, 3, 4]
    assert _indices("1,3,5-7") == [1, 3, 5, 6, 7]
    assert _indices("0-20:5,3") == [0, 3, 5, 10, 15, 20]
    assert _indices("2,2,1-2") == [1, 2]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0-9%2", "a throttle (%N) is not supported"),
        ("a-b", "expected indices such as 0-99, 1,3,5-7 or 0-20:2"),
        ("5-1", "need 0 <= first <= last"),
        ("0-10:0", "a step > 0"),
        ("0-2000", "more than 1024 tasks"),
    ],
)
def test_bad_indices_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        _indices(text)


def submit(daemon: DaemonProcess, *args: str, ok: bool = True) -> str:
    """`cosched submit ARGS` against the daemon (its URL in the environment: `--` ends the options);
    what it prints, or with `ok=False` what it said on failing."""
    env = {**os.environ, "COSCHED_URL": daemon.client.url}
    done = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "submit", *args], capture_output=True, text=True, env=env
    )
    assert (done.returncode == 0) == ok, done.stderr
    return done.stdout if ok else done.stderr


def test_an_arrays_tasks_run_once_each_with_their_index(tmp_path: Path) -> None:
    """Three tasks (0, 2, 4) on two cores: each runs once and prints its index, all of the array's
    class; task 2 fails and the workflow with it, and task 4, queued with the others, still runs.
    A latest start, which a workflow has not, is refused by the command with one line."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2)
    daemon.start()
    try:
        said = submit(
            daemon, "--array", "0-4:2", "--image", image, "--cores", "1", "--walltime", "60", "--app-class", "sweep",
            "--", "sh", "-c", "echo task $COSCHED_ARRAY_INDEX; [ $COSCHED_ARRAY_INDEX != 2 ]",
        )  # fmt: skip
        found = re.fullmatch(r"Submitted array (\d+) \(3 jobs (\d+)-(\d+)\)\n", said)
        assert found, said
        workflow, first, last = map(int, found.groups())
        jobs = daemon.wait_final(list(range(first, last + 1)), 60)
        # Task 2 fails; the others run on all the same: no task depends on another.
        assert sorted(job["state"] for job in jobs.values()) == ["done", "done", "failed"]
        assert sorted(job["log_tail"].strip() for job in jobs.values()) == ["task 0", "task 2", "task 4"]
        assert {job["app_class"] for job in jobs.values()} == {"sweep"}  # one class for ASAx, not one per task
        status = daemon.client.call("GET", f"/v1/workflows/{workflow}")
        assert status["state"] == "failed" and sorted(status["stages"]) == ["0", "2", "4"]
        refused = submit(daemon, "--array", "1-2", "--image", image, "--latest-start", "+60", "--", "true", ok=False)
        assert refused == "cosched: error: --array: a workflow's stages take no --latest-start\n"
    finally:
        daemon.cleanup(engine)

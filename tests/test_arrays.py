"""Job arrays (`cosched submit --array`, as sbatch --array): the indices' syntax, and on the real
engine an array's tasks each run once with their index, as one workflow, at most %N at once."""

from __future__ import annotations

import argparse
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine

from cosched.daemon.commands import _array, _indices
from workloads.images import busybox_image


def test_indices_as_sbatch_writes_them() -> None:
    assert _indices("0-4") == [0, 1, 2, 3, 4]
    assert _indices("1,3,5-7") == [1, 3, 5, 6, 7]
    assert _indices("0-20:5,3") == [0, 3, 5, 10, 15, 20]
    assert _indices("2,2,1-2") == [1, 2]
    assert _array("0-3%2") == ([0, 1, 2, 3], 2) and _array("5") == ([5], None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0-9%0", "after %, the most tasks running at once (1 to 1024)"),
        ("0-9%x", "after %, the most tasks running at once"),
        ("a-b", "expected indices such as 0-99, 1,3,5-7 or 0-20:2"),
        ("5-1", "need 0 <= first <= last"),
        ("0-10:0", "a step > 0"),
        ("0-2000", "more than 1024 tasks"),
    ],
)
def test_bad_indices_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        _array(text)


def submit(daemon: DaemonProcess, *args: str, ok: bool = True) -> str:
    """`cosched submit ARGS` against the daemon (its URL in the environment: `--` ends the options);
    what it prints, or with `ok=False` what it said on failing."""
    env = {**os.environ, "COSCHED_URL": daemon.client.url}
    done = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "submit", *args], capture_output=True, text=True, env=env
    )
    assert (done.returncode == 0) == ok, done.stderr
    return done.stdout if ok else done.stderr


def submitted(said: str, count: int) -> tuple[int, list[int]]:
    """The array's workflow id and its tasks' job ids, from what `cosched submit --array` printed."""
    found = re.fullmatch(rf"Submitted array (\d+) \({count} jobs (\d+)-(\d+)\)\n", said)
    assert found, said
    return int(found[1]), list(range(int(found[2]), int(found[3]) + 1))


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
        workflow, tasks = submitted(said, 3)
        jobs = daemon.wait_final(tasks, 60)
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


def test_a_throttled_arrays_tasks_run_one_at_a_time_across_a_restart(tmp_path: Path) -> None:
    """`--array 0-2%1` on two cores: one task runs, the others wait `JobArrayTaskLimit` though a core
    is free, and another job goes by them. The daemon is SIGKILLed while the first task runs and
    started again: it adopts the running task and still runs the others one at a time."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=2)
    daemon.start()
    try:
        said = submit(
            daemon, "--array", "0-2%1", "--image", image, "--cores", "1", "--walltime", "60", "--", "sleep", "2"
        )
        _, tasks = submitted(said, 3)
        daemon.wait_running(tasks[0])
        other = daemon.submit(image=image, command=["true"], cores=1, walltime=60)
        assert daemon.wait_final([other], 30)[other]["state"] == "done"
        assert daemon.cli("queue").count("JobArrayTaskLimit") == 2
        daemon.signal(signal.SIGKILL)
        daemon.start()
        time.sleep(0.5)
        ended = daemon.wait_final(tasks, 60)
        runs = sorted((job["start"], job["end"]) for job in ended.values())
        assert all(job["state"] == "done" for job in ended.values()), ended
        assert all(later[0] >= earlier[1] - 0.5 for earlier, later in itertools.pairwise(runs)), runs
    finally:
        daemon.cleanup(engine)

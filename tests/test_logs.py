"""A job's output (`cosched logs JOB -n N`, `GET /v1/jobs/ID/log`): read live from the engine while
the job runs, as `tail` of a Slurm job's output file, then the tail kept at its end; a job's
own escape sequences never reach the terminal raw."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, require_engine

from cosched.daemon.client import ApiError
from workloads.images import busybox_image

SCRIPT = r"for i in $(seq 1 30); do echo line $i; done; printf '\033]0;retitled\007\n'; sleep 600"


def test_a_running_jobs_output_is_read_live_then_its_kept_tail(tmp_path: Path) -> None:
    engine = require_engine()
    image = busybox_image(engine)
    daemon = DaemonProcess(tmp_path, cores=1)
    daemon.start()
    try:
        job_id = daemon.submit(image=image, command=["sh", "-c", SCRIPT], cores=1, walltime=600)
        daemon.wait_running(job_id)
        deadline = time.monotonic() + 20
        while "retitled" not in (said := daemon.cli("logs", str(job_id), "-n", "3")):
            assert time.monotonic() < deadline, said
            time.sleep(0.2)
        assert said == "line 29\nline 30\n\\x1b]0;retitled\\x07\n"
        answer = daemon.client.call("GET", f"/v1/jobs/{job_id}/log?lines=25")
        assert answer["live"] is True and answer["log"].splitlines()[0] == "line 7"
        daemon.client.call("DELETE", f"/v1/jobs/{job_id}")
        daemon.wait_final([job_id], 30)
        answer = daemon.client.call("GET", f"/v1/jobs/{job_id}/log?lines=2")
        assert answer["live"] is False and answer["log"] == "line 30\n\x1b]0;retitled\x07\n"
        for path, status in ((f"/v1/jobs/{job_id}/log?lines=0", 422), ("/v1/jobs/999/log", 404)):
            with pytest.raises(ApiError, match=f"HTTP {status}"):
                daemon.client.call("GET", path)
    finally:
        daemon.cleanup(engine)

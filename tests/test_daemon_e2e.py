"""The daemon on the real Docker engine: ASAx lends from idle jobs to CPU-hungry ones.

On this 2-core machine an idle 2-core job holds every core while 1-core
CPU-hungry jobs wait; ASAx lends part of the idle job's quota. The test reads
the quotas from the kernel's cgroup files itself and compares them with what
the daemon says it decided. Then lenders that turn CPU-hungry after an idle
start are slowed by lending: with the default live loss their losses are their
slowdowns against their kind's runtime alone, the weights of their application
move during the run and are persisted, and `cosched explain` shows each loss.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from daemon_support import DaemonProcess, cgroup_quota, require_engine

from experts.loss import degradation_loss
from experts.weights import WeightBook
from workloads.images import busybox_image

LOOP = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done"


def idle(seconds: int) -> list[str]:
    return ["sh", "-c", f"for i in $(seq 1 {seconds}); do echo $i/{seconds} > $COSCHED_PROGRESS; sleep 1; done"]


def hungry(n: int) -> list[str]:
    return ["sh", "-c", LOOP.format(n=n)]


def idle_then_parallel(n: int) -> list[str]:
    loop = LOOP.format(n=n)
    script = f"echo 2/4 > $COSCHED_PROGRESS; sleep 1.2; ( {loop} ) & ( {loop} ) & wait; echo 4/4 > $COSCHED_PROGRESS"
    return ["sh", "-c", script]


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image(require_engine())


@pytest.fixture
def daemon(tmp_path: Path, image: str, request: pytest.FixtureRequest):
    """A daemon on 2 cores; a test may set ASAx's `min_guest_share` and `loss` with
    `@pytest.mark.parametrize(indirect)` and a dict."""
    client = require_engine()
    settings = {"share": 0.5, "loss": "live", **getattr(request, "param", {})}
    process = DaemonProcess(
        tmp_path,
        extra=f'[policies]\nseed = 7\nmin_guest_share = {settings["share"]}\nloss = "{settings["loss"]}"\n',
    )
    process.start()
    process.image = image
    yield process
    process.cleanup(client)


def _runtime(daemon: DaemonProcess, command: list[str], cores: int) -> float:
    """How long a command takes alone here (this machine's speed sets the walltimes)."""
    job_id = daemon.submit(image=daemon.image, command=command, cores=cores, walltime=120, app_class="calibrate")
    job = daemon.wait_final([job_id], 120)[job_id]
    assert job["state"] == "done", job
    return float(job["runtime"])


def test_asax_lends_idle_quota(daemon: DaemonProcess, image: str) -> None:
    client = require_engine()
    instance = daemon.instance()

    # The live loss compares a lender with the runtime alone of its kind: one runs alone first.
    alone = daemon.submit(image=image, command=idle(10), cores=2, walltime=60, app_class="idle.sleep", tasks=10)
    assert daemon.wait_final([alone], 60)[alone]["state"] == "done"
    assert not daemon.client.call("GET", f"/v1/jobs/{alone}/explain")

    # Lending: an idle 2-core job holds the machine; three 1-core CPU-hungry jobs wait.
    host = daemon.submit(image=image, command=idle(10), cores=2, walltime=60, app_class="idle.sleep", tasks=10)
    guests = [
        daemon.submit(image=image, command=hungry(300000), cores=1, walltime=60, app_class="cpu.loop") for _ in range(3)
    ]
    checked = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and checked < 3:
        for row in daemon.client.call("GET", "/v1/queue"):
            if row["state"] != "running" or not row["reason"].endswith(f"(guest of {host})"):
                continue
            guest = daemon.job(row["id"])
            host_status = daemon.job(host)
            try:
                guest_quota = cgroup_quota(client, f"cosched-{instance}-{guest['id']}")
                host_quota = cgroup_quota(client, f"cosched-{instance}-{host}")
            except Exception:
                continue  # it ended between the two reads
            if guest_quota is None or host_quota is None or guest["state"] != "running":
                continue
            assert guest_quota == pytest.approx(guest["quota"], abs=1e-3)
            assert host_quota == pytest.approx(host_status["quota"], abs=1e-3)
            assert guest_quota + host_quota == pytest.approx(2.0, abs=1e-3)  # lent, never created
            checked += 1
        time.sleep(0.05)
    jobs = daemon.wait_final([host, *guests], 90)
    assert all(j["state"] == "done" for j in jobs.values()), jobs
    lent = [d for d in daemon.client.call("GET", f"/v1/jobs/{host}/explain") if d["executed"] and d["fraction"] > 0]
    assert lent, "ASAx lent nothing from an idle job"
    assert checked >= 1, "no guest was seen running to compare its cgroup quota"
    # Sleeping, the lender lost nothing to its guests: its runtime is its kind's runtime alone.
    assert all(d["loss"] is not None and d["loss"] < 0.2 for d in lent), lent
    with daemon.db() as db:
        baselines = json.loads(db.execute("SELECT value FROM meta WHERE key = 'baselines'").fetchone()[0])
    assert ["idle.sleep", 2] in [row[:2] for row in baselines["runtimes"]]
    assert all(daemon.job(d["guest"])["host"] == host for d in lent)


@pytest.mark.parametrize("daemon", [{"share": 0.9}], indirect=True)
def test_asax_learns_from_lendings_that_hurt(daemon: DaemonProcess, image: str) -> None:
    """Lenders idle at first, then CPU-hungry on both cores, with the default live loss. Only
    lendings of 50% or more are carried out (min_guest_share 0.9 of a 1-core guest), and the
    guest outlasts the lender's compute phase, so a carried-out lending slows the lender. One
    lender runs alone first: its runtime is its kind's runtime alone, which every later lender
    is held against. The weights of its learner move during the run, and `cosched explain`
    shows a loss for every lending carried out."""
    n = 500000
    walltime = 4 * _runtime(daemon, idle_then_parallel(n), cores=2)
    alone = daemon.submit(image=image, command=idle_then_parallel(n), cores=2, walltime=walltime, app_class="phased")
    assert daemon.wait_final([alone], 60)[alone]["state"] == "done"
    lenders = []
    for _ in range(8):
        lender = daemon.submit(
            image=image, command=idle_then_parallel(n), cores=2, walltime=walltime, app_class="phased", tasks=4
        )
        guest = daemon.submit(image=image, command=hungry(3 * n), cores=1, walltime=60, app_class="cpu.loop")
        daemon.wait_final([lender, guest], 60)
        lenders.append(lender)
    decisions = [d for lender in lenders for d in daemon.client.call("GET", f"/v1/jobs/{lender}/explain")]
    lent = [d for d in decisions if d["executed"] and d["fraction"] > 0]
    summary = [(d["host"], d["fraction"], d["executed"], d["loss"], d["note"]) for d in decisions]
    assert lent, f"nothing was lent: the learning phase tested nothing: {summary}"
    for d in lent:  # the slowdown against the first lender's runtime alone, 1 at 50%
        lender = daemon.job(d["host"])
        assert d["note"] == "runtime alone of its kind", summary
        assert d["loss"] == pytest.approx(degradation_loss(lender["runtime"], d["baseline"]), abs=1e-6), (d, lender)
    assert max(d["loss"] for d in lent) > 0, f"no lending hurt a lender: {summary}"
    assert all(d["loss"] == 0.0 for d in decisions if d["executed"] and d["fraction"] == 0)
    with daemon.db() as db:
        state = json.loads(db.execute("SELECT value FROM meta WHERE key = 'weights'").fetchone()[0])
    weights = WeightBook.from_state(state).get("phased")  # one learner per application: "phased"
    assert weights.t > 0, f"the weights never moved: {weights.to_state()}"
    assert max(weights.alpha) - min(weights.alpha) > 1e-6, weights.to_state()
    url = f"http://127.0.0.1:{daemon.port}"
    for host in sorted({d["host"] for d in lent}):  # what an operator reads: a number for each lending
        explained = subprocess.run(
            [sys.executable, "-m", "cosched.cli", "explain", str(host), "--url", url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        carried = [line for line in explained.splitlines() if ", carried out; loss " in line]
        assert carried, explained
        for line in carried:
            float(line.split(", carried out; loss ", 1)[1].split()[0])  # a loss, not "pending"


def test_every_released_workflow_stage_counts_as_submitted(daemon: DaemonProcess, image: str) -> None:
    """A stage released by its predecessor's end is a submission too: /metrics counts all three."""
    stages = [{"name": "a"}, {"name": "b", "depends": ["a"]}, {"name": "c", "depends": ["b"]}]
    spec = {"name": "chain", "cores": 1, "walltime": 60, "image": image, "command": ["true"], "stages": stages}
    workflow_id = daemon.client.call("POST", "/v1/workflows", spec)["id"]
    deadline = time.monotonic() + 60
    while daemon.client.call("GET", f"/v1/workflows/{workflow_id}")["state"] == "running":
        assert time.monotonic() < deadline, "workflow not finished in 60 s"
        time.sleep(0.2)
    metrics = urllib.request.urlopen(daemon.client.url + "/metrics").read().decode()
    assert "cosched_jobs_submitted_total 3.0" in metrics


def test_job_lifecycle_and_refusals_are_logged_one_grep_able_line_each(daemon: DaemonProcess, image: str) -> None:
    ok = daemon.submit(image=image, command=["true"], cores=1, walltime=60, app_class="ok")
    bad = daemon.submit(image=image, command=["sh", "-c", "exit 3"], cores=1, walltime=60)
    refused = daemon.submit(image=image, command=["/no/such/program"], cores=1, walltime=60)
    with pytest.raises(Exception, match="99 cores asked"):
        daemon.submit(image=image, command=["true"], cores=99, walltime=60)
    daemon.wait_final([ok, bad, refused], 60)
    time.sleep(0.5)  # the lines are written after the pass's commit
    lines = daemon.log.read_text().splitlines()

    def story(job_id: int) -> list[str]:
        return [line.split(f"job={job_id} ", 1)[1] for line in lines if f" job={job_id} " in line]

    events = ["event=accepted", "event=launching", "event=running", "event=ended"]
    assert [entry.split()[0] for entry in story(ok)] == events
    assert "app_class=ok" in story(ok)[0] and "quota=1.00" in story(ok)[1]
    assert re.fullmatch(r"event=running container=[0-9a-f]{12}", story(ok)[2])
    assert story(ok)[3].startswith("event=ended state=done exit_code=0")
    assert story(bad)[-1].startswith("event=ended state=failed exit_code=3")
    # the engine refused its launch: it never ran, and the journal does not say it did
    assert [entry.split()[0] for entry in story(refused)] == ["event=accepted", "event=launching", "event=ended"]
    assert 'reason="could not start:' in story(refused)[2]
    assert any('submission=refused path=/v1/jobs reason="cores: 99 cores asked' in line for line in lines)


def test_sigterm_stops_gracefully_with_exit_0_and_leaves_jobs_running(daemon: DaemonProcess, image: str) -> None:
    client = require_engine()
    job_id = daemon.submit(image=image, command=["sleep", "30"], cores=1, walltime=60)
    daemon.wait_running(job_id)
    daemon.signal(signal.SIGTERM)
    assert daemon.process is not None and daemon.process.returncode == 0
    log = daemon.log.read_text()
    assert "stopping (SIGTERM)" in log and "cosched daemon stopped; running containers keep running" in log
    labels = [f"cosched.instance={daemon.instance()}", f"cosched.job={job_id}"]
    assert [c.status for c in client.containers.list(all=True, filters={"label": labels})] == ["running"]
    daemon.start()  # the next start adopts it
    assert daemon.job(job_id)["state"] == "running"

"""`cosched daemon` with `[backend] kind = "mesos"` on a REAL master with two agents.

The same daemon as on Docker (API, core, state file), its jobs run as tasks of the
cosched executor on the agents: a job per agent, an exit code and log tail back from
an agent, a job too large for one agent refused, and a daemon SIGKILLed mid-job that
restarts as the same framework, adopts the job and sees it finish once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import require_engine
from mesos_support import (
    Cluster,
    ContainerEvents,
    assert_ran_once,
    finish,
    framework_id_of,
    mesos_daemon,
    nodes_shown,
    start_cluster,
    stop_cluster,
    wait_until,
)

from cosched.daemon.cgroups import CgroupFiles
from cosched.daemon.client import ApiError, Client
from cosched.mesos.executor import instance_of
from experts.loss import degradation_loss
from experts.weights import WeightBook
from workloads.images import busybox_image

NAME = "cosched-daemon-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(Path(tmp_path_factory.mktemp("mesos-daemon")), cpus=2, mem=2048)
    try:
        yield started
    finally:
        stop_cluster(started)


def _framework_tasks(cluster: Cluster, framework_id: str) -> list[dict]:
    framework = cluster.framework(framework_id) or {"tasks": [], "completed_tasks": []}
    return list(framework["tasks"]) + list(framework["completed_tasks"])


def test_the_daemon_runs_jobs_on_mesos_agents_and_survives_a_sigkill(cluster: Cluster, tmp_path: Path) -> None:
    engine = require_engine()
    image = busybox_image(engine)
    daemon = mesos_daemon(cluster, tmp_path, NAME)
    try:
        done = daemon.submit(image=image, command=["sleep", "2"], cores=1, memory_mib=128, walltime=60)
        boom = daemon.submit(
            image=image, command=["sh", "-c", "echo boom; exit 3"], cores=1, memory_mib=128, walltime=60
        )
        with pytest.raises(ApiError, match="3 cores asked, the cluster has 2"):
            daemon.submit(image=image, command=["true"], cores=3, walltime=60)
        with pytest.raises(ApiError, match=r"2 cores asked, a Mesos agent has 1 \(span = true spreads it\)"):
            daemon.submit(image=image, command=["true"], cores=2, walltime=60)
        jobs = daemon.wait_final([done, boom], 90)
        assert jobs[done]["state"] == "done", jobs[done]
        assert (jobs[boom]["state"], jobs[boom]["exit_code"]) == ("failed", 3)
        assert "boom" in jobs[boom]["log_tail"]
        framework_id = framework_id_of(daemon)
        tasks = _framework_tasks(cluster, framework_id)
        assert {t["name"] for t in tasks} == {f"cosched job {done}", f"cosched job {boom}"}
        assert len({t["slave_id"] for t in tasks}) == 2  # first fit: one job per agent

        # The operator's view: the nodes are the agents; /metrics counts launches and offers.
        nodes = nodes_shown(daemon)
        for agent in cluster.state()["slaves"]:
            assert f"{agent['hostname']} " in nodes and agent["id"] in nodes
        metrics = urllib.request.urlopen(f"{daemon.client.url}/metrics", timeout=10).read().decode()
        declined = cluster.metric(NAME, framework_id, "offers/declined")
        assert f"cosched_offers_declined_total {declined}" in metrics
        assert "cosched_launch_seconds_count 2.0" in metrics and "cosched_offer_to_launch_seconds_count 2.0" in metrics

        # SIGKILL mid-job: the restarted daemon subscribes as the same framework and adopts the task.
        long = daemon.submit(image=image, command=["sleep", "8"], cores=1, memory_mib=128, walltime=60)
        daemon.wait_running(long, 60)
        daemon.signal()
        daemon.start(timeout=60)
        assert daemon.job(long)["state"] == "running"
        assert daemon.wait_final([long], 60)[long]["state"] == "done"
        runs = [t for t in _framework_tasks(cluster, framework_id) if t["name"] == f"cosched job {long}"]
        assert [t["state"] for t in runs] == ["TASK_FINISHED"]  # ran once
        assert [f["id"] for f in cluster.state()["frameworks"] if f["name"] == NAME] == [framework_id]
    finally:
        finish(cluster, daemon)


def test_lending_on_an_agent_reaches_both_cgroups(cluster: Cluster, tmp_path: Path) -> None:
    """Static lending through the daemon on Mesos: two sleeping 1-core hosts fill both agents; a
    queued job is placed on a host's core with half its CPU, and the executor's cgroups say so.
    Every container on the agents has the daemon's job user and limits, not the executor's defaults."""
    engine = require_engine()
    image = busybox_image(engine)
    limits = 'job_user = "4321:4321"\npids_limit = 77\nlog_max_mib = 3\nnofile = 333'
    daemon = mesos_daemon(cluster, tmp_path, f"{NAME}-lending", cosched="static", docker=limits)
    try:
        hosts = [
            daemon.submit(image=image, command=["sleep", "30"], cores=1, memory_mib=128, walltime=60) for _ in range(2)
        ]
        for host_id in hosts:
            daemon.wait_running(host_id, 60)
        guest = daemon.submit(image=image, command=["sleep", "30"], cores=1, memory_mib=128, walltime=60)
        status = wait_until(lambda: (j := daemon.job(guest))["state"] == "running" and j, 60, "the guest running")
        host = status["host"]
        assert host in hosts and status["quota"] == pytest.approx(0.5)
        assert daemon.job(host)["quota"] == pytest.approx(0.5)
        framework_id = framework_id_of(daemon)

        def cgroup(job_id: int) -> tuple[int, int]:
            labels = {"label": [f"cosched.instance={instance_of(framework_id)}", f"cosched.job={job_id}"]}
            [container] = engine.containers.list(filters=labels)
            config = container.attrs["HostConfig"]
            assert container.attrs["Config"]["User"] == "4321:4321" and config["PidsLimit"] == 77
            assert config["LogConfig"]["Config"]["max-size"] == "3m"
            assert ("nofile", 333, 333) in [(u["Name"], u["Soft"], u["Hard"]) for u in config["Ulimits"]]
            files = CgroupFiles.of_pid(int(container.attrs["State"]["Pid"]))
            assert files is not None
            return files.quota()

        assert wait_until(lambda: cgroup(host) == (50_000, 100_000), 30, "the host's cgroup at 0.5 CPU")
        assert cgroup(guest) == (50_000, 100_000)
        for job_id in (*hosts, guest):
            daemon.client.call("DELETE", f"/v1/jobs/{job_id}")
        daemon.wait_final([*hosts, guest], 60)
    finally:
        finish(cluster, daemon)


def test_a_job_larger_than_an_agent_runs_as_a_gang_whole_or_not_at_all(
    cluster: Cluster, tmp_path: Path, container_events: ContainerEvents
) -> None:
    """2 cores on agents of 1 core each: one task per agent, each told its part; a gang whose part
    fails has its other part killed at once (never left half-running) and ends as that part."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = mesos_daemon(cluster, tmp_path, f"{NAME}-gang")
    try:
        framework_id = framework_id_of(daemon)
        whole = daemon.submit(
            image=image,
            command=["sh", "-c", 'echo "part $COSCHED_PART of $COSCHED_PARTS"'],
            cores=2,
            span=True,
            walltime=60,
            memory_mib=128,
        )
        assert daemon.wait_final([whole], 60)[whole]["state"] == "done"
        log_tail = daemon.job(whole)["log_tail"]
        assert "[part 0] part 0 of 2" in log_tail and "[part 1] part 1 of 2" in log_tail
        tasks = [t for t in _framework_tasks(cluster, framework_id) if t["name"].startswith(f"cosched job {whole} ")]
        assert len({t["slave_id"] for t in tasks}) == 2 and {t["state"] for t in tasks} == {"TASK_FINISHED"}

        script = 'if [ "$COSCHED_PART" = 1 ]; then sleep 1; echo broken; exit 3; fi; sleep 60'
        broken = daemon.submit(
            image=image, command=["sh", "-c", script], cores=2, span=True, memory_mib=128, walltime=120
        )
        status = daemon.wait_final([broken], 60)[broken]
        assert (status["state"], status["exit_code"]) == ("failed", 3) and "broken" in status["log_tail"]
        ran = container_events.containers(framework_id)
        [part0] = [c for c in ran[broken] if c.task.endswith("-0of2-1c")]
        assert part0.exit_code == 137 and part0.ended is not None and part0.ended - part0.started < 30
        assert_ran_once(ran[whole])
    finally:
        finish(cluster, daemon)


def test_a_running_jobs_output_is_read_from_its_agents_executors(cluster: Cluster, tmp_path: Path) -> None:
    """`cosched logs` of a gang running on two agents: each part's executor reads its own engine and
    answers the framework's message; the parts are marked, as in the tail kept at the end."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon = mesos_daemon(cluster, tmp_path, f"{NAME}-logs")
    try:
        script = 'echo "part $COSCHED_PART up"; sleep 60'
        job = daemon.submit(image=image, command=["sh", "-c", script], cores=2, span=True, walltime=120, memory_mib=128)
        daemon.wait_running(job, 60)

        def output() -> dict | None:
            answer = daemon.client.call("GET", f"/v1/jobs/{job}/log?lines=5")
            return answer if "part 1 up" in answer["log"] else None

        answer = wait_until(output, 30, "the output of both parts")
        assert answer["live"] is True
        assert answer["log"] == "[part 0] part 0 up\n[part 1] part 1 up\n"
    finally:
        finish(cluster, daemon)


def test_a_data_dir_swapped_for_a_symlink_is_refused_by_the_agents_executor(cluster: Cluster, tmp_path: Path) -> None:
    """The hostile job of tests/test_sandbox.py on Mesos: a data dir accepted by the daemon, then
    swapped for a symlink to a host directory while the job waits, is refused where the job would
    start (the executor opens it from its root without following links); the host file is untouched
    and the next job runs."""
    from workloads.real import make_data_dir

    engine = require_engine()
    image = busybox_image(engine)
    daemon = mesos_daemon(cluster, tmp_path, f"{NAME}-swap", data_roots=True)
    try:
        data = make_data_dir(tmp_path / "swap")
        host = tmp_path.parent / f"{tmp_path.name}-host-secret"  # outside every data root
        host.mkdir()
        (host / "passwd").write_text("root:x:0:0\n")
        blockers = [
            daemon.submit(image=image, command=["sleep", "4"], cores=1, memory_mib=64, walltime=60) for _ in "ab"
        ]
        for job_id in blockers:
            daemon.wait_running(job_id, 60)
        hostile = daemon.submit(
            image=image,
            command=["sh", "-c", f"echo owned > {data}/passwd"],
            cores=1,
            memory_mib=64,
            walltime=60,
            data_dirs=[str(data)],
        )
        assert daemon.job(hostile)["state"] == "pending"
        data.rmdir()
        data.symlink_to(host)
        jobs = daemon.wait_final([*blockers, hostile], 90)
        assert jobs[hostile]["state"] == "failed", jobs[hostile]
        assert "changed since the job was accepted" in jobs[hostile]["reason"], jobs[hostile]
        assert (host / "passwd").read_text() == "root:x:0:0\n"
        after = daemon.submit(image=image, command=["true"], cores=1, memory_mib=64, walltime=60)
        assert daemon.wait_final([after], 60)[after]["state"] == "done"
    finally:
        finish(cluster, daemon)


def test_a_job_runs_as_its_submitter_on_an_agent(cluster: Cluster, tmp_path: Path, open_data_root: Path) -> None:
    """`docker.run_as = "submitter"` on Mesos: the account the daemon looked up (the system user
    `daemon`, uid 1) travels in the task, and the agent's executor runs the job as it, so it writes
    to that user's 0700 data dir and what it writes is that user's."""
    from cosched.daemon.identity import create_key, load_key, mint
    from workloads.real import make_data_dir

    image = busybox_image(require_engine())
    key = tmp_path / "api.key"
    create_key(key)
    daemon = mesos_daemon(
        cluster,
        tmp_path,
        f"{NAME}-submitter",
        docker=f'run_as = "submitter"\ndata_roots = ["{open_data_root}"]',
        api=f'key_file = "{key}"',
        token=mint(load_key(key), "root", 600),
    )
    try:
        data = make_data_dir(open_data_root / "ids", owner="1:1")
        data.chmod(0o700)
        as_daemon = Client(daemon.client.url, mint(load_key(key), "daemon", 600), timeout=10)
        spec = {"image": image, "command": ["sh", "-c", f"id > {data}/id"], "cores": 1, "memory_mib": 64}
        job_id = as_daemon.call("POST", "/v1/jobs", {**spec, "walltime": 60, "data_dirs": [str(data)]})["id"]
        job = daemon.wait_final([job_id], 90)[job_id]
        assert (job["state"], job["user"]) == ("done", "daemon"), job
        assert (data / "id").read_text().split()[:2] == ["uid=1", "gid=1"]
        assert (data / "id").stat().st_uid == 1
    finally:
        finish(cluster, daemon)


def test_a_montage_workflow_runs_on_the_agents(cluster: Cluster, tmp_path: Path) -> None:
    """The real Montage workflow (its test size) in the workflow image: stages are jobs placed on
    both agents, their data directory shared (the agents see the daemon's paths, as a cluster's
    shared storage), and the mosaic comes out right."""
    from daemon_support import workflow_image

    from workloads.real import make_data_dir, real_workflow, verify

    image = workflow_image()
    daemon = mesos_daemon(cluster, tmp_path, f"{NAME}-montage", data_roots=True)
    try:
        framework_id = framework_id_of(daemon)
        data = make_data_dir(tmp_path / "montage")
        spec = real_workflow("montage", cores=1, data_dir=data, image=image, memory_mib=256)
        workflow_id = int(daemon.client.call("POST", "/v1/workflows", spec)["id"])
        status = wait_until(
            lambda: (s := daemon.client.call("GET", f"/v1/workflows/{workflow_id}"))["state"] != "running" and s,
            300,
            "the workflow's end",
        )
        assert status["state"] == "done", status
        assert verify("montage", data) == []
        tasks = _framework_tasks(cluster, framework_id)
        assert len({t["slave_id"] for t in tasks}) == 2 and {t["state"] for t in tasks} == {"TASK_FINISHED"}
    finally:
        finish(cluster, daemon)


def test_asax_lends_between_tasks_on_an_agent(cluster: Cluster, tmp_path: Path) -> None:
    """ASAx on Mesos, as on Docker (tests/test_daemon_e2e.py): an idle job of a kind first runs
    alone (the live loss's baseline); then two idle 1-core lenders fill both agents and CPU-hungry
    1-core jobs queue. ASAx lends: each guest's cgroup, read on its agent, shows the quota decided,
    and host and guest add up to the host's one core; the lenders' losses are scored (near 0: they
    slept) against the baseline, and the learning is in the state file."""
    engine = require_engine()
    image = busybox_image(engine)
    idle = ["sh", "-c", "for i in $(seq 1 8); do echo $i/8 > $COSCHED_PROGRESS; sleep 1; done"]
    hungry = ["sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"]
    # With 1-core nodes a guest keeps its host's only core past the host's end, where EASY's promise
    # to the queue's head counts on it: without keep_promises ASAx may lend there (as in its paper).
    daemon = mesos_daemon(cluster, tmp_path, f"{NAME}-asax", cosched="asax", policies="keep_promises = false")
    try:
        framework_id = framework_id_of(daemon)
        alone = daemon.submit(image=image, command=idle, cores=1, memory_mib=64, walltime=60, app_class="idle", tasks=8)
        assert daemon.wait_final([alone], 60)[alone]["state"] == "done"
        hosts = [
            daemon.submit(image=image, command=idle, cores=1, memory_mib=64, walltime=60, app_class="idle", tasks=8)
            for _ in range(2)
        ]
        guests = [
            daemon.submit(image=image, command=hungry, cores=1, memory_mib=64, walltime=60, app_class="cpu")
            for _ in range(3)
        ]

        def quota(job_id: int) -> float | None:
            labels = {"label": [f"cosched.instance={instance_of(framework_id)}", f"cosched.job={job_id}"]}
            found = engine.containers.list(filters=labels)
            files = CgroupFiles.of_pid(int(found[0].attrs["State"]["Pid"])) if found else None
            if files is None:
                return None
            used, period = files.quota()
            return used / period

        checked = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and checked < 2:
            for row in daemon.client.call("GET", "/v1/queue"):
                if row["state"] != "running" or "(guest of" not in row["reason"]:
                    continue
                guest, host = daemon.job(row["id"]), daemon.job(row["reason"].rsplit(" ", 1)[1].rstrip(")"))
                try:
                    shown = (quota(guest["id"]), quota(host["id"]))
                except Exception:
                    continue  # it ended between the reads
                if (
                    None in shown
                    or guest["state"] != "running"
                    or (guest["quota"], host["quota"])
                    != (
                        daemon.job(guest["id"])["quota"],
                        daemon.job(host["id"])["quota"],
                    )
                ):
                    continue
                assert shown == (pytest.approx(guest["quota"], abs=1e-3), pytest.approx(host["quota"], abs=1e-3))
                assert sum(shown) == pytest.approx(1.0, abs=1e-3)  # lent, never created
                checked += 1
            time.sleep(0.1)
        jobs = daemon.wait_final([*hosts, *guests], 120)
        assert {j["state"] for j in jobs.values()} == {"done"}, jobs
        lent = [
            d
            for host in hosts
            for d in daemon.client.call("GET", f"/v1/jobs/{host}/explain")
            if d["executed"] and d["fraction"] > 0
        ]
        assert lent and checked >= 1, (lent, checked)
        assert all(d["loss"] is not None and d["loss"] < 0.2 for d in lent), lent
        with daemon.db() as db:
            baselines = json.loads(db.execute("SELECT value FROM meta WHERE key = 'baselines'").fetchone()[0])
            weights = db.execute("SELECT value FROM meta WHERE key = 'weights'").fetchone()
        assert ["idle", 1] in [row[:2] for row in baselines["runtimes"]] and weights is not None
    finally:
        finish(cluster, daemon)


def test_asax_learns_on_mesos_from_lendings_that_hurt(cluster: Cluster, tmp_path: Path) -> None:
    """As on Docker (tests/test_daemon_e2e.py, `test_asax_learns_from_lendings_that_hurt`): lenders
    idle for 2 s, then CPU-bound, fill both agents' cores, and CPU-hungry guests queue. Only
    lendings of 50% or more are carried out (`min_guest_share` 0.5 of a 1-core guest) and the guests
    outlast the lenders' compute, so a lending slows its lender. One lender runs alone first, so
    every lending carried out is scored, when its lender ends, against the runtime alone of its kind
    (`cosched explain` shows the loss), and the weights of the lenders' learner move."""
    engine = require_engine()
    image = busybox_image(engine)
    loop = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done"  # 1,000,000 turns: 1.5 to 3 s of a CPU here
    phased = [
        "sh",
        "-c",
        f"echo 1/4 > $COSCHED_PROGRESS; sleep 2; {loop.format(n=1_000_000)}; echo 4/4 > $COSCHED_PROGRESS",
    ]
    hungry = ["sh", "-c", loop.format(n=1_500_000)]  # at half a CPU, it outlasts a lender's compute
    daemon = mesos_daemon(
        cluster,
        tmp_path,
        f"{NAME}-learns",
        cosched="asax",
        policies="keep_promises = false\nmin_guest_share = 0.5",  # 1-core nodes: see the test above
    )
    try:
        spec = {"image": image, "cores": 1, "memory_mib": 64, "walltime": 60}
        alone = daemon.submit(**spec, command=phased, app_class="phased", tasks=4)
        assert daemon.wait_final([alone], 60)[alone]["state"] == "done"
        # Its executor's last sample of the CPU it used (every 2 s) reached the framework with its end.
        ended = daemon.job(alone)
        assert 0 < (ended["cpu_seconds"] or 0.0) <= ended["runtime"], ended
        lenders = []
        for _ in range(3):
            pair = [daemon.submit(**spec, command=phased, app_class="phased", tasks=4) for _ in range(2)]
            guests = [daemon.submit(**spec, command=hungry, app_class="cpu") for _ in range(2)]
            jobs = daemon.wait_final([*pair, *guests], 90)
            assert {j["state"] for j in jobs.values()} == {"done"}, jobs
            lenders += pair
        decisions = [d for lender in lenders for d in daemon.client.call("GET", f"/v1/jobs/{lender}/explain")]
        decisions = [d for d in decisions if d["host"] in lenders]
        lent = [d for d in decisions if d["executed"] and d["fraction"] > 0]
        summary = [(d["host"], d["fraction"], d["executed"], d["loss"], d["note"]) for d in decisions]
        assert lent, f"nothing was lent: the learning tested nothing: {summary}"
        for d in lent:
            lender = daemon.job(d["host"])
            assert d["note"] == "runtime alone of its kind", summary
            assert d["loss"] == pytest.approx(degradation_loss(lender["runtime"], d["baseline"]), abs=1e-6), d
        assert max(d["loss"] for d in lent) > 0, f"no lending slowed its lender: {summary}"
        with daemon.db() as db:
            state = json.loads(db.execute("SELECT value FROM meta WHERE key = 'weights'").fetchone()[0])
        weights = WeightBook.from_state(state).get("phased")
        assert weights.t > 0, f"the weights never moved: {weights.to_state()}"
        assert max(weights.alpha) - min(weights.alpha) > 1e-6, weights.to_state()
        for host in sorted({d["host"] for d in lent}):  # what an operator reads: a number for each lending
            explained = subprocess.run(
                [sys.executable, "-m", "cosched.cli", "explain", str(host), "--url", daemon.client.url],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            carried = [line for line in explained.splitlines() if ", carried out; loss " in line]
            assert len(carried) == sum(d["host"] == host for d in lent), explained
            for line in carried:
                float(line.split(", carried out; loss ", 1)[1].split()[0])  # a loss, not "pending"
    finally:
        finish(cluster, daemon)

"""A pass's engine calls: side by side, bounded, and never under the lock that sampling needs.

The engine here is a stand-in whose calls take a fixed time: how many run at once, and
whether the lock is free meanwhile, cannot be observed on a real engine on demand.
The real engine's throughput is `benchmarks/daemon.py --only launch`.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_engine import Clock, FakeEngine, clocked_daemon

from cosched.daemon import views
from cosched.daemon.config import from_dict
from cosched.daemon.dependencies import settle
from cosched.daemon.docker_backend import ContainerInfo, EngineUnavailable, Exit, RunLost
from cosched.daemon.ends import MAX_LOST_RUNS
from cosched.daemon.identity import ANONYMOUS
from cosched.daemon.service import Daemon
from cosched.daemon.specs import JobSpec, WorkflowSpec

DELAY = 0.3


class _SlowEngine(FakeEngine):
    """Every launch takes DELAY seconds; records the most launches in flight at once. Its containers
    run until the test says otherwise: a kill or a removal is not seen."""

    def __init__(self, refuse: dict[int, Exception] | None = None) -> None:
        super().__init__(Clock())
        self.refuse = refuse or {}
        self.in_flight = 0
        self.most = 0
        self.guard = threading.Lock()
        self.launching = threading.Event()

    def launch(
        self, job_id: int, spec: dict[str, Any], cpuset: str, quota: float, memory: int, **placement: object
    ) -> tuple[str, float]:
        with self.guard:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        self.launching.set()
        time.sleep(DELAY)
        with self.guard:
            self.in_flight -= 1
        if job_id in self.refuse:
            raise self.refuse[job_id]
        self.running[job_id] = f"c{job_id}"
        return f"c{job_id}", 0.0

    def kill(self, container: str) -> None:
        pass

    def remove(self, container: str) -> None:
        pass


def _daemon(tmp_path: Path, engine: _SlowEngine, workers: int) -> Daemon:
    config = from_dict(
        {
            "daemon": {"state_dir": str(tmp_path)},
            "cluster": {"cores": 8, "memory_mib": 8192},
            "docker": {"engine_calls": workers},
            "policies": {"cosched": "none"},
        }
    )
    daemon = Daemon(config, backend=engine)  # type: ignore[arg-type]
    daemon.start()  # recovery of an empty store: the cluster's cores offered to the core
    return daemon


def _submit(daemon: Daemon, jobs: int) -> list[int]:
    spec = JobSpec(image="x", command=["true"], cores=1, memory_mib=64, walltime=600)
    return [daemon.submit_job(spec) for _ in range(jobs)]


def test_launches_run_side_by_side_bounded_and_off_the_lock(tmp_path: Path) -> None:
    engine = _SlowEngine()
    daemon = _daemon(tmp_path, engine, workers=4)
    ids = _submit(daemon, 8)
    started = time.perf_counter()
    passing = threading.Thread(target=daemon.schedule)
    passing.start()
    assert engine.launching.wait(5)
    lock_free = daemon.lock.acquire(timeout=DELAY / 3)  # what `sample` and recovery need
    if lock_free:
        daemon.lock.release()
    passing.join(10)
    elapsed = time.perf_counter() - started
    assert lock_free, "the pass held the daemon's lock across its engine calls"
    assert engine.most == 4, f"{engine.most} launches at once, expected the bound of 4"
    assert elapsed < 8 * DELAY * 0.6, f"8 launches of {DELAY} s took {elapsed:.2f} s"
    assert {daemon.store.job(i)["state"] for i in ids} == {"running"}
    assert set(daemon.containers) == set(ids)
    daemon.close()


def test_one_at_a_time_when_engine_calls_is_1(tmp_path: Path) -> None:
    engine = _SlowEngine()
    daemon = _daemon(tmp_path, engine, workers=1)
    _submit(daemon, 3)
    daemon.schedule()
    assert engine.most == 1
    daemon.close()


def test_what_started_is_recorded_when_the_engine_is_lost_or_refuses_mid_step(tmp_path: Path) -> None:
    """Job 2's launch finds the engine gone and job 3's is refused: jobs 1 and 4 run and are
    recorded, job 2 stays launching for the reconciliation, job 3 fails at the next pass."""
    engine = _SlowEngine(refuse={2: EngineUnavailable("engine gone"), 3: RuntimeError("no such command\nmore")})
    daemon = _daemon(tmp_path, engine, workers=4)
    ids = _submit(daemon, 4)
    daemon.schedule()
    states = {i: daemon.store.job(i)["state"] for i in ids}
    assert states == {1: "running", 2: "launching", 3: "launching", 4: "running"}
    assert not daemon.engine_up
    assert daemon.failed_launches == {3: "could not start: no such command"}
    del engine.refuse[2]
    daemon.schedule()  # the engine answers again: job 2 is launched again, job 3's refusal is its end
    assert daemon.store.job(3)["state"] == "failed"
    assert daemon.store.job(3)["reason"] == "could not start: no such command"
    assert daemon.store.job(2)["state"] == "running"
    assert daemon.store.job(2)["launches"] == 1
    daemon.close()


class _StuckEngine(_SlowEngine):
    """The launch of job `stuck` waits until `release` is set (a Mesos launch waiting for offers of
    an agent with no room); every other launch takes DELAY. Killed containers stop at once."""

    def __init__(self, stuck: int) -> None:
        super().__init__()
        self.stuck = stuck
        self.release = threading.Event()
        self.launched: list[int] = []
        self.killed: list[str] = []

    def launch(
        self, job_id: int, spec: dict[str, Any], cpuset: str, quota: float, memory: int, **placement: object
    ) -> tuple[str, float]:
        self.launched.append(job_id)
        if job_id == self.stuck:
            assert self.release.wait(30)
        return super().launch(job_id, spec, cpuset, quota, memory, **placement)

    def kill(self, container: str) -> None:
        self.killed.append(container)
        self.running = {j: c for j, c in self.running.items() if c != container}


def _waiting_half_a_second(tmp_path: Path, engine: _StuckEngine) -> Daemon:
    """A started daemon of 8 cores on `engine` whose passes wait 0.5 s for their launches."""
    config = from_dict(
        {
            "daemon": {"state_dir": str(tmp_path)},
            "cluster": {"cores": 8, "memory_mib": 8192},
            "intervals": {"launch_wait": 0.5},
            "policies": {"cosched": "none"},
        }
    )
    daemon = Daemon(config, backend=engine)  # type: ignore[arg-type]
    daemon.start()
    return daemon


def test_a_launch_that_waits_long_holds_no_pass_and_a_cancel_meanwhile_kills_it_once_it_runs(
    tmp_path: Path,
) -> None:
    """Job 1's launch hangs. The pass waits `launch_wait` (0.5 s) for it, then goes on: job 1 is
    `launching`, job 2 submitted next starts and runs at the next pass, and the reconciliation does
    not launch job 1 again. Job 1 is cancelled while its launch hangs (the core's kill finds no
    container); once the launch finishes, the next pass records it and kills it, and it ends
    cancelled. With the launches waited for whole (the code before), the first pass would have
    hung until the launch finished."""
    engine = _StuckEngine(stuck=1)
    daemon = _waiting_half_a_second(tmp_path, engine)
    try:
        [stuck] = _submit(daemon, 1)
        started = time.perf_counter()
        daemon.schedule()
        assert time.perf_counter() - started < 3.0
        assert daemon.store.job(stuck)["state"] == "launching" and stuck in daemon.launching
        assert daemon.metrics.registry.get_sample_value("cosched_launches_waiting") == 1
        [other] = _submit(daemon, 1)
        daemon.schedule()
        assert daemon.store.job(other)["state"] == "running"
        daemon.reconcile()
        assert engine.launched == [stuck, other]  # not launched a second time
        assert daemon.cancel(stuck) == "launching"
        daemon.schedule()  # the core asks for the kill: no container yet
        assert engine.killed == [] and daemon.store.job(stuck)["state"] == "launching"
        engine.release.set()
        deadline = time.monotonic() + 10
        while daemon.launching[stuck].future.done() is False:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        daemon.schedule()  # records the launch and kills what it started
        assert engine.killed == [f"c{stuck}"]
        daemon.schedule()  # its container is gone: the end
        assert daemon.store.job(stuck)["state"] == "cancelled" and not daemon.launching
        assert daemon.metrics.registry.get_sample_value("cosched_launches_waiting") == 0
        assert engine.launched == [stuck, other]
    finally:
        engine.release.set()
        daemon.close()


class _WithdrawingEngine(_StuckEngine):
    """A launch that can be given up while it waits (a Mesos gang at its start barrier): `withdraw`
    ends the stuck launch with its run lost, nothing of it started."""

    def __init__(self, stuck: int) -> None:
        super().__init__(stuck)
        self.withdrawn: list[int] = []

    def withdraw(self, job_id: int) -> None:
        self.withdrawn.append(job_id)
        self.release.set()

    def launch(
        self, job_id: int, spec: dict[str, Any], cpuset: str, quota: float, memory: int, **placement: object
    ) -> tuple[str, float]:
        if job_id == self.stuck:
            self.launched.append(job_id)
            assert self.release.wait(30)
            if job_id in self.withdrawn:
                raise RunLost("its job was cancelled")
        return super().launch(job_id, spec, cpuset, quota, memory, **placement)


def test_a_job_cancelled_while_its_launch_waits_is_withdrawn_and_never_runs(tmp_path: Path) -> None:
    """A gang cancelled at its start barrier was told to start, then killed 2 s later (a helper's
    Mesos walkthrough). The pass that carries out the cancel now gives the launch up: it ends with
    its run lost, nothing was started or killed, and the job ends cancelled."""
    engine = _WithdrawingEngine(stuck=1)
    daemon = _waiting_half_a_second(tmp_path, engine)
    try:
        [stuck] = _submit(daemon, 1)
        daemon.schedule()
        assert daemon.store.job(stuck)["state"] == "launching"
        assert daemon.cancel(stuck) == "launching"
        daemon.schedule()  # the core asks for the kill: the launch is withdrawn
        assert engine.withdrawn == [stuck]
        deadline = time.monotonic() + 10
        while daemon.launching[stuck].future.done() is False:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(3):
            daemon.schedule()
        assert daemon.store.job(stuck)["state"] == "cancelled" and not daemon.launching
        assert engine.killed == [] and stuck not in engine.running  # never started
    finally:
        engine.release.set()
        daemon.close()


def test_a_quota_the_core_changed_while_the_launch_hung_is_applied_once_it_runs(tmp_path: Path) -> None:
    """Static lending: job 1 (8 cores, the whole cluster) hangs in its launch; job 2 queues behind
    it and is co-scheduled on it at once, the core halving job 1's quota. The quota change finds no
    container, so when job 1's launch finishes, it runs with the quota it was launched with until
    the pass that records it applies the core's."""
    engine = _StuckEngine(stuck=1)
    config = from_dict(
        {
            "daemon": {"state_dir": str(tmp_path)},
            "cluster": {"cores": 8, "memory_mib": 8192},
            "intervals": {"launch_wait": 0.3},
            "policies": {"cosched": "static", "keep_promises": False},
        }
    )
    daemon = Daemon(config, backend=engine)  # type: ignore[arg-type]
    daemon.start()
    try:
        spec = JobSpec(image="x", command=["true"], cores=8, memory_mib=64, walltime=600)
        host = daemon.submit_job(spec)
        daemon.schedule()
        guest = daemon.submit_job(JobSpec(image="x", command=["true"], cores=4, memory_mib=64, walltime=60))
        daemon.schedule()
        deadline = time.monotonic() + 10  # the guest's launch is quick, but may outlast launch_wait under load
        while daemon.store.job(guest)["state"] == "launching" and time.monotonic() < deadline:
            time.sleep(0.05)
            daemon.schedule()
        assert daemon.store.job(guest)["state"] == "running" and daemon.store.job(guest)["host"] == host
        assert daemon.core.jobs[host].quota == 4.0 and engine.quotas == []
        engine.release.set()
        deadline = time.monotonic() + 10
        while not daemon.launching[host].future.done():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        daemon.schedule()
        assert engine.quotas == [(f"c{host}", 4.0)]
        assert daemon.store.job(host)["state"] == "running"
    finally:
        engine.release.set()
        daemon.close()


def test_a_job_accepted_after_a_pass_read_its_clock_never_starts_before_its_submission(tmp_path: Path) -> None:
    """A pass reads its clock, then collects ends (engine calls, seconds under load) before it
    takes the inbox: a job accepted meanwhile is stamped later than the pass's clock. The pass
    is then as late as that stamp, so the job never enters the core before its submission (a
    placement window counted it in the window before its own: seen in CI, a start before its
    boundary)."""
    engine = _SlowEngine()
    daemon = _daemon(tmp_path, engine, workers=2)
    clock = [100.0]
    daemon.clock = lambda: clock[0]  # type: ignore[method-assign]
    [job_id] = _submit(daemon, 1)  # stamped 100
    clock[0] = 99.5  # the pass read its clock before the job was accepted
    daemon.schedule()
    job = daemon.store.job(job_id)
    assert job["state"] == "running" and job["start"] == job["submit"] == 100.0
    daemon.close()


def test_runs_lost_before_a_restart_count_toward_the_jobs_failure(tmp_path: Path) -> None:
    """Every launch of job 1 is lost to its machine (`RunLost`, as a Mesos agent gone or an engine's
    5xx). Two lost runs, a restart, and the third fails it, `ends.MAX_LOST_RUNS`: the count is in the
    state file, or a daemon restarted often enough would requeue that job for ever."""
    assert MAX_LOST_RUNS == 3
    engine = _SlowEngine(refuse={1: RunLost("agent1 is gone")})
    tried: list[int] = []
    launch = engine.launch
    engine.launch = lambda job_id, *args, **kwargs: tried.append(job_id) or launch(job_id, *args, **kwargs)  # type: ignore[method-assign]
    daemon = _daemon(tmp_path, engine, workers=1)
    [job] = _submit(daemon, 1)
    for _ in range(20):
        if daemon.lost_runs.get(job) == 2:
            break
        daemon.schedule()
    assert daemon.store.job(job)["lost_runs"] == 2
    assert daemon.store.job(job)["state"] in ("pending", "launching")
    daemon.close()

    daemon = _daemon(tmp_path, engine, workers=1)
    for _ in range(20):
        if daemon.store.job(job)["state"] == "failed":
            break
        daemon.schedule()
    record = daemon.store.job(job)
    assert record["state"] == "failed", record
    assert record["reason"].endswith("(3 runs lost to their machines)"), record["reason"]
    # Two runs lost and counted, a third started by the pass that queued the second again (its loss
    # went with the first daemon, never collected), and one after the restart: not three more.
    assert tried == [job] * 4
    assert job not in daemon.lost_runs  # forgotten with the job's end
    daemon.close()


class _QuickEngine(_SlowEngine):
    """Containers that have exited by the next pass, their end stamped a little before their start,
    as Docker stamps a `true`: StartedAt once runc's start returned, FinishedAt from the exit event."""

    def launch(
        self, job_id: int, spec: dict[str, Any], cpuset: str, quota: float, memory: int, **placement: object
    ) -> tuple[str, float]:
        self.running[job_id] = f"c{job_id}"
        return f"c{job_id}", 1000.0

    def containers(self) -> dict[int, ContainerInfo]:
        return {job_id: ContainerInfo(c, job_id, "exited") for job_id, c in self.running.items()}

    def exit_of(self, container: str) -> Exit:
        return Exit(code=0, started=1000.0, finished=999.992, oom=False, cpu_seconds=None)


def test_a_job_that_exits_at_once_never_ends_before_it_started(tmp_path: Path) -> None:
    """A job's end is never before its start: history showed `elapsed` -0.0078 s (and negative
    core-seconds, summed into its user's totals) for a `true` that Docker stamped so."""
    daemon = _daemon(tmp_path, _QuickEngine(), workers=1)
    daemon.clock = lambda: 1001.0  # type: ignore[method-assign]
    [job_id] = _submit(daemon, 1)
    for _ in range(5):
        daemon.schedule()
    job = daemon.store.job(job_id)
    assert job["state"] == "done" and job["start"] == 1000.0
    assert job["end"] >= job["start"], job
    daemon.close()


class _EndingEngine(_SlowEngine):
    """Containers exit 0 once `finish` names them (a stage that ran and succeeded)."""

    def __init__(self) -> None:
        super().__init__()
        self.finished: set[int] = set()

    def containers(self) -> dict[int, ContainerInfo]:
        return {j: ContainerInfo(c, j, "exited" if j in self.finished else "running") for j, c in self.running.items()}

    def exit_of(self, container: str) -> Exit:
        return Exit(0, 0.0, time.time(), False)


def test_every_stage_of_a_users_workflow_is_journaled_with_its_user(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal (`cosched.jobs`) names the submitter on each stage's `accepted` line, the stages
    released after others ended too, so `grep user=alice` finds all of her work."""
    engine = _EndingEngine()
    daemon = _daemon(tmp_path, engine, workers=1)
    stage = {"image": "x", "command": ["true"], "walltime": 60}
    spec = WorkflowSpec(name="w", cores=1, stages=[{"name": "a", **stage}, {"name": "b", "depends": ["a"], **stage}])
    with caplog.at_level(logging.INFO, logger="cosched.jobs"):
        _, [first] = daemon.submit_workflow(spec, user="alice")
        daemon.schedule()
        engine.finished.add(first)
        for _ in range(5):
            daemon.schedule()
    accepted = [r.getMessage() for r in caplog.records if "event=accepted" in r.getMessage()]
    assert len(accepted) == 2, accepted
    assert all("user=alice" in line for line in accepted), accepted
    daemon.close()


def test_a_job_its_dependency_just_released_is_not_shown_held_by_its_user(tmp_path: Path) -> None:
    """Between the pass that releases a job whose dependency was met and the next pass, which takes
    the release (after the first one's launches, up to `launch_wait`), the core still holds it:
    `cosched queue` showed `JobHeldUser`, a hold nobody made; it is `Submitted`, as a job its user
    released. A job its user holds still shows it; released, it is `Submitted` too (it showed
    `Dependency`, which were met)."""
    daemon = _daemon(tmp_path, _SlowEngine(), workers=1)

    def job(**more: Any) -> int:
        return daemon.submit_job(JobSpec(image="x", command=["true"], cores=1, memory_mib=64, walltime=600, **more))

    first = job()
    released, held = (job(after=[{"kind": "afterok", "job": first}]) for _ in "ab")
    daemon.hold(held, ANONYMOUS, True)
    daemon.schedule()
    with daemon.lock, daemon.store.transaction() as db:  # first ended: its dependants are settled
        daemon.store.update_job(db, first, state="done")
        assert settle(daemon, db, changed=True) == 2
    reasons = {row["id"]: row["reason"] for row in views.queue(daemon)}
    assert (reasons[released], reasons[held]) == ("Submitted", "JobHeldUser")
    assert views.job_status(daemon, released)["reason"] is None  # `cosched status`: no hold, as a job just submitted
    daemon.schedule()  # takes the release
    assert daemon.store.job(released)["state"] == "running"
    assert {row["id"]: row["reason"] for row in views.queue(daemon)}[held] == "JobHeldUser"
    daemon.hold(held, ANONYMOUS, False)
    assert {row["id"]: row["reason"] for row in views.queue(daemon)}[held] == "Submitted"
    daemon.close()


def test_a_hold_or_release_shows_in_the_queue_before_the_pass_that_takes_it(tmp_path: Path) -> None:
    """`cosched queue` showed a hold, or a release, only once the next pass took it (a walkthrough):
    a held job kept its place at the head, and `cosched status` said JobHeldUser meanwhile."""
    daemon = _daemon(tmp_path, _SlowEngine(), workers=1)

    def job(cores: int) -> int:
        return daemon.submit_job(JobSpec(image="x", command=["true"], cores=cores, memory_mib=64, walltime=600))

    job(8)  # fills the cluster
    waiting, behind = job(1), job(1)
    daemon.schedule()

    def reasons() -> dict[int, str]:
        return {row["id"]: row["reason"] for row in views.queue(daemon) if row["state"] == "pending"}

    assert reasons() == {waiting: "Resources", behind: "Priority"}
    daemon.hold(waiting, ANONYMOUS, True)
    arriving = job(1)
    daemon.hold(arriving, ANONYMOUS, True)  # held before any pass saw it
    shown = reasons()
    assert (shown[waiting], shown[arriving], shown[behind]) == ("JobHeldUser", "JobHeldUser", "Resources")
    daemon.schedule()
    assert reasons() == shown
    daemon.hold(waiting, ANONYMOUS, False)
    assert reasons()[waiting] == "Submitted"  # back in the queue at the next pass
    daemon.schedule()
    assert reasons() == {waiting: "Resources", behind: "Priority", arriving: "JobHeldUser"}  # first come again
    daemon.close()


def test_a_host_whose_guest_hands_over_in_one_pass_gets_only_the_last_quota(tmp_path: Path) -> None:
    """Guest A ends and guest B is placed on the same host in one step: the host's quota goes back
    to its 4 cores and is lent again, two changes. Applied side by side, either could land last: on
    Mesos the host ran on at 4 CPUs beside B, in 6 of 7 hand-overs (a helper's walkthrough). Only the
    last is applied; both stay in the quota log."""
    clock = Clock()
    engine = FakeEngine(clock)
    daemon = clocked_daemon(tmp_path, clock, engine, cores=4, cosched="static")
    spec = {"image": "x", "command": ["true"], "memory_mib": 64, "walltime": 100}
    host = daemon.submit_job(JobSpec(**spec, cores=4))
    daemon.schedule()
    first, second = (daemon.submit_job(JobSpec(**spec, cores=2)) for _ in range(2))
    clock.t += 1
    daemon.schedule()
    assert daemon.store.job(first)["state"] == "running" and engine.quotas == [(f"c{host}", 2.0)]
    engine.finish(first)
    engine.quotas.clear()
    clock.t += 1
    daemon.schedule()
    assert daemon.store.job(second)["state"] == "running"
    assert engine.quotas == [(f"c{host}", 2.0)]
    assert [change["cpus"] for change in daemon.store.quota_changes(host)] == [2.0, 4.0, 2.0]
    daemon.close()


def test_a_kill_the_engine_could_not_carry_out_in_time_is_asked_again_until_the_job_ends(tmp_path: Path) -> None:
    """Docker answers 500 (`did not receive an exit event`) when a killed job's processes take the
    kernel long to end (a job closing a million files took hours: a helper's audit). That is no
    engine lost, and the kill was asked once only: the job ran on past its walltime, holding its
    cores. It is now asked again at each review until the job's end is collected."""
    from cosched.daemon.docker_backend import NotKilled

    clock = Clock()
    engine = FakeEngine(clock)
    refusals = 2
    kill = engine.kill

    def stubborn(container: str) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise NotKilled(f"killing {container}: tried to kill container, but did not receive an exit event")
        kill(container)

    engine.kill = stubborn  # type: ignore[method-assign]
    daemon = clocked_daemon(tmp_path, clock, engine, cores=2)
    job = daemon.submit_job(JobSpec(image="x", command=["true"], cores=1, memory_mib=64, walltime=60))
    daemon.schedule()
    clock.t += 61
    for _ in range(2):
        daemon.review()
        assert daemon.engine_up and job not in engine.exits and job in daemon.not_killed
    daemon.review()
    assert engine.exits[job].code == 137
    daemon.schedule()
    record = daemon.store.job(job) or {}
    assert (record["state"], record["reason"]) == ("failed", "walltime exceeded") and not daemon.not_killed
    daemon.close()


def test_a_run_whose_container_never_started_is_lost_not_held_for_ever(tmp_path: Path) -> None:
    """A run the daemon holds as running whose container never started (a Mesos gang adopted by a
    restarted daemon whose held parts gave up before its `go`) was passed over by every pass: the job
    held its cores for good (a review). Its run is lost: the job is queued again."""
    clock = Clock()
    engine = FakeEngine(clock)
    daemon = clocked_daemon(tmp_path, clock, engine, cores=2)
    job = daemon.submit_job(JobSpec(image="x", command=["true"], cores=2, memory_mib=64, walltime=60))
    daemon.schedule()
    listed = engine.containers
    engine.containers = lambda: {  # type: ignore[method-assign]
        j: ContainerInfo(info.id, j, "created", "its gang never started whole") for j, info in listed().items()
    }
    daemon.schedule()
    record = daemon.store.job(job) or {}
    assert record["lost_runs"] == 1 and record["reason"] == "requeued: its gang never started whole", record
    daemon.close()

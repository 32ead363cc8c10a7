"""Fair-share (`fairshare`, Slurm's multifactor priority): the decayed usage ledger, the order
it gives, the same schedule as FCFS when there is one user, a real trace's users, and on the
real engine a daemon that counts what users ran, across a SIGKILL and restart."""

from __future__ import annotations

import math
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import real_trace
from daemon_support import DaemonProcess, require_engine, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from cosched.core.events import Colocate, JobEnded, JobRequeued, JobSubmitted, Launch, Offer
from cosched.core.scheduler import Scheduler
from cosched.daemon.client import Client
from cosched.daemon.identity import create_key, load_key, mint
from cosched.errors import ConfigError
from cosched.model import Cluster, Job
from cosched.policies.fairshare import DecayedUsage, FairShare, fairshare_factors
from cosched.policies.registry import create
from cosched.replay.driver import PolicySet, replay
from cosched.reporting.metrics import summarize
from workloads.images import busybox_image

HOUR = 3600.0
BACKFILL_ESTIMATE_PLACEMENT = (("backfill", "easy"), ("estimate", "requested"), ("placement", "first-fit"))


def test_usage_halves_every_half_life_and_survives_rebasing() -> None:
    usage = DecayedUsage(HOUR)
    usage.add(7, 4, 0.0, 10.0)  # 40 core-seconds, all but undecayed
    assert usage.at(10.0)[7] == pytest.approx(40.0, rel=1e-3)
    assert usage.at(10.0 + HOUR)[7] == pytest.approx(20.0, rel=1e-3)
    # A run 100 half-lives later moves the reference (2^100 would be near overflow soon after);
    # the first run is then worth 40 * 2^-100, the second its own 40.
    later = 100 * HOUR
    usage.add(8, 4, later, later + 10.0)
    now = usage.at(later + 10.0)
    assert now[8] == pytest.approx(40.0, rel=1e-3)
    assert now[7] == pytest.approx(40.0 * 2.0**-100, rel=1e-2)
    assert usage.running(4, later, later + 10.0) == pytest.approx(40.0, rel=1e-3)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 64), st.floats(0, 1e6), st.floats(1, 1e5)),
        min_size=1,
        max_size=12,
    ),
    st.randoms(use_true_random=False),
)
def test_usage_does_not_depend_on_the_order_runs_are_told(runs: list, rng) -> None:  # type: ignore[no-untyped-def]
    """A restart tells old runs in the state file's order, the core in end order: same ledger."""
    now = max(start + length for _, _, start, length in runs)
    told, shuffled = DecayedUsage(HOUR * 24), DecayedUsage(HOUR * 24)
    for user, cores, start, length in runs:
        told.add(user, cores, start, start + length)
    rng.shuffle(runs)
    for user, cores, start, length in runs:
        shuffled.add(user, cores, start, start + length)
    a, b = told.at(now), shuffled.at(now)
    assert a.keys() == b.keys()
    for user in a:
        assert a[user] == pytest.approx(b[user], rel=1e-9, abs=1e-9)


def test_factors_follow_slurms_classic_formula() -> None:
    assert fairshare_factors({1: 0.0, 2: 0.0}) == {1: 1.0, 2: 1.0}
    # Two users, one used all: 2^-2 and 2^0. Four users, one used exactly its quarter: 1/2.
    assert fairshare_factors({1: 100.0, 2: 0.0}) == {1: 0.25, 2: 1.0}
    assert fairshare_factors({1: 25.0, 2: 25.0, 3: 25.0, 4: 25.0})[1] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fairshare:halflife=3", "unknown option 'halflife'"),
        ("fairshare:half_life=0", "half_life must be a positive number"),
        ("fairshare:max_age=0", "max_age must be > 0"),
        ("fairshare:age=-1", "option age must be a finite number >= 0"),
        ("fairshare:period=soon", "option period='soon' is not a float"),
    ],
)
def test_bad_options_are_one_line_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create("queue", spec)


def _three_jobs() -> list[Job]:
    """One node of 4 cores. Alice runs 4 cores for 1000 s, then queues another 4-core job;
    Bob queues one 10 s after hers."""
    return [
        Job(1, 0.0, 4, 1000.0, 1000.0, user=1),
        Job(2, 10.0, 4, 100.0, 100.0, user=1),
        Job(3, 20.0, 4, 100.0, 100.0, user=2),
    ]


def _starts(queue: str) -> dict[int, float]:
    result = replay(_three_jobs(), Cluster(1, 4), PolicySet(queue, "easy"), validate=True)
    return {job.id: job.start for job in result.jobs}


def test_the_user_who_used_the_machine_waits_behind_one_who_did_not() -> None:
    assert _starts("fcfs") == {1: 0.0, 2: 1000.0, 3: 1100.0}
    assert _starts("fairshare") == {1: 0.0, 3: 1000.0, 2: 1100.0}
    # With the fair-share weight at 0 only age is left: first come, first served again.
    assert _starts("fairshare:fairshare=0") == {1: 0.0, 2: 1000.0, 3: 1100.0}


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 5000), st.integers(1, 8), st.floats(1, 3000), st.floats(0.05, 1.0)),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(["easy", "conservative", "none"]),
)
def test_with_one_user_it_is_fcfs(specs: list, backfill: str) -> None:  # type: ignore[no-untyped-def]
    """One user: every job has the same fair-share factor and age orders them as arrival does,
    so the schedule is FCFS's, start for start, under every backfill policy."""

    def jobs() -> list[Job]:
        made = [
            Job(i + 1, submit, cores, walltime, walltime * used, user=5)
            for i, (submit, cores, walltime, used) in enumerate(sorted(specs))
        ]
        return made

    cluster = Cluster(2, 4)
    fcfs = replay(jobs(), cluster, PolicySet("fcfs", backfill), validate=True)
    fair = replay(jobs(), cluster, PolicySet("fairshare:period=0", backfill), validate=True)
    assert [(j.id, j.start) for j in fair.jobs] == [(j.id, j.start) for j in fcfs.jobs]


def fair_core(policy: FairShare, cosched: str) -> Scheduler:
    """One node of 4 cores ordered by `policy`, with EASY and the `cosched` co-scheduling policy."""
    backfill, estimate, placement = (create(kind, name) for kind, name in BACKFILL_ESTIMATE_PLACEMENT)
    return Scheduler(Cluster(1, 4), policy, backfill, estimate, placement, create("cosched", cosched))


def test_a_requeued_run_is_counted() -> None:
    """A run lost with its machine used its cores all the same (Slurm charges it)."""
    policy = FairShare("period=0")
    core = fair_core(policy, "none")
    job = Job(1, 0.0, 2, 500.0, user=3)
    decision = core.step(0.0, [Offer(((0, 4),), (0,)), JobSubmitted(job)])
    assert [a.job.id for a in decision.actions if isinstance(a, Launch)] == [1]
    core.step(50.0, [JobRequeued(1)])
    assert policy.usage.at(50.0)[3] == pytest.approx(100.0, rel=1e-3)


def test_a_lent_core_is_charged_once_to_whoever_had_it() -> None:
    """Static lending on 4 cores: Alice's 4-core job runs 0-100; Bob's 2-core guest gets q of her
    CPUs from 10 to 60. Alice is charged 4 CPUs but for the lent q from 10 to 60, Bob q for 50 s:
    400 CPU-seconds in all, what the allocation held, not 400 + 100 for both jobs' cores."""
    policy = FairShare("period=0,half_life=1e8")
    core = fair_core(policy, "static")
    core.step(0.0, [Offer(((0, 4),), (0,)), JobSubmitted(Job(1, 0.0, 4, 100.0, user=1))])
    decision = core.step(10.0, [JobSubmitted(Job(2, 10.0, 2, 100.0, user=2))])
    [lent] = [a.quota for a in decision.actions if isinstance(a, Colocate)]
    core.step(60.0, [JobEnded(2)])
    core.step(100.0, [JobEnded(1), Offer(((0, 4),), (0,))])
    used = policy.usage.at(100.0)
    assert used[1] == pytest.approx(400.0 - 50.0 * lent, rel=1e-5)
    assert used[2] == pytest.approx(50.0 * lent, rel=1e-5)


def test_on_a_real_trace_users_wait_less_on_average() -> None:
    """SDSC-SP2's first 5000 jobs (428 users in the whole trace): against FCFS, with EASY both,
    fair-share lowers the mean over users of each user's mean wait; the heaviest users pay."""
    from cosched.traces.swf import read_swf

    trace = read_swf(real_trace("SDSC-SP2-1998-4.2-cln.swf.gz"))
    window = trace.jobs()[:5000]
    cluster = trace.cluster()
    summaries = {}
    for queue in ("fcfs", "fairshare"):
        jobs = [Job(j.id, j.submit, j.cores, j.walltime, j.runtime, user=j.user) for j in window]
        result = replay(jobs, cluster, PolicySet(queue, "easy"), validate=True)
        summaries[queue] = summarize(result.jobs, cluster.cores)
    fcfs, fair = summaries["fcfs"], summaries["fairshare"]
    assert fcfs.users == fair.users > 50
    assert fair.user_mean_wait < 0.8 * fcfs.user_mean_wait
    assert math.isclose(fair.utilization, fcfs.utilization, rel_tol=0.02)


def metrics(daemon: DaemonProcess) -> dict[str, float]:
    """The daemon's /metrics samples, by name with labels."""
    request = urllib.request.Request(daemon.client.url + "/metrics", headers={"Authorization": "Bearer operator-token"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


def fairshare_daemon(root: Path, cores: int, cosched: str, names: tuple[str, ...]) -> tuple[DaemonProcess, dict]:  # type: ignore[type-arg]
    """A daemon ordering by fair-share (recomputed at every pass), and an API client per user."""
    key = root / "api.key"
    assert create_key(key)
    daemon = DaemonProcess(
        root,
        cores=cores,
        api=f'key_file = "{key}"\ntoken = "operator-token"',
        extra=f'[policies]\nqueue = "fairshare:period=0"\ncosched = "{cosched}"\n',
        token="operator-token",
    )
    return daemon, {name: Client(daemon.client.url, mint(load_key(key), name, 600), timeout=10) for name in names}


def test_a_restarted_daemon_still_counts_what_users_ran(tmp_path: Path) -> None:
    """One core. Alice runs 6 s; the daemon is SIGKILLed and started again. Carol then runs 4 s
    while Alice and then Bob queue a job each. When Carol's ends, Bob's starts first: Alice's
    run before the restart still counts (rebuilt from the state file). A daemon that had
    forgotten it starts Alice's, queued first (checked, with the rebuild left out)."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon, users = fairshare_daemon(tmp_path, 1, "none", ("alice", "bob", "carol"))

    def submit(user: str, seconds: int) -> int:
        spec = {"image": image, "command": ["sleep", str(seconds)], "cores": 1, "walltime": 120}
        return int(users[user].call("POST", "/v1/jobs", spec)["id"])

    daemon.start()
    try:
        first = submit("alice", 6)
        assert daemon.wait_final([first], 60)[first]["state"] == "done"
        daemon.signal(signal.SIGKILL)
        daemon.start()
        blocker = submit("carol", 4)
        daemon.wait_running(blocker)
        alices = submit("alice", 1)
        time.sleep(0.3)
        bobs = submit("bob", 1)
        # `cosched queue` meanwhile, as sprio: Bob's job first, with the higher priority.
        header, _, *queued = [line.split() for line in daemon.cli("queue", token="operator-token").splitlines()]
        assert header[:5] == ["JOBID", "NAME", "USER", "STATE", "PRIORITY"]  # every job is named "job"
        pending = [(int(row[0]), int(row[4])) for row in queued if row[3] == "PENDING"]
        assert [job for job, _ in pending] == [bobs, alices] and pending[0][1] > pending[1][1], queued
        # /metrics, per user: Carol's running core, and the factors the queue was last ordered by
        # (Alice's the lowest; Bob's once a pass has ordered the queue with his job in it).
        series = metrics(daemon)
        assert series['cosched_user_cores{user="carol"}'] == 1.0, series
        factors = {user: series.get(f'cosched_user_fairshare{{user="{user}"}}') for user in ("alice", "bob", "carol")}
        assert factors["alice"] < factors["carol"] <= 1.0 and factors["bob"] in (None, 1.0), factors
        ended = daemon.wait_final([blocker, alices, bobs], 60)
        assert {job["state"] for job in ended.values()} == {"done"}
        assert ended[bobs]["start"] < ended[alices]["start"], ended
        # `cosched shares` (sshare): Alice used 7 s, Carol 4, Bob 1, the least factor the most used.
        rows = daemon.client.call("GET", "/v1/shares")
        assert [r["user"] for r in rows] == ["alice", "carol", "bob"]
        assert rows[0]["fairshare"] < rows[1]["fairshare"] < rows[2]["fairshare"] < 1
        assert sum(r["effective_usage"] for r in rows) == pytest.approx(1.0)
        # nothing runs: as of the pass that recorded those ends, whose metrics come at its end (after
        # its engine calls), so a read between the two still showed Carol's core (seen in CI)
        wait_until(
            lambda: not any(name.startswith("cosched_user_cores") for name in metrics(daemon)), 10, "no core held"
        )
        header = daemon.cli("shares", token="operator-token").splitlines()[0].split()
        assert header[:4] == ["USER", "USAGE_CORE_H", "EFFECTV_USAGE", "FAIRSHARE"]
    finally:
        daemon.cleanup(engine)


def test_a_restart_charges_a_lending_as_the_live_daemon_did(tmp_path: Path) -> None:
    """Two cores, static lending: Alice's 2-core job lends one core to Bob's 2-core guest. Once both
    ended, `cosched shares` says what each was charged; the daemon is SIGKILLed and started again,
    and the usage it rebuilds from the state file's ended jobs and quota log is the same, not both
    jobs' cores: Bob is charged his guest's lent core only, Alice her cores less it while it was
    lent. Both count from the containers' starts and finishes, not from the passes that saw them
    (a launch's or an end's latency apart, seconds under load)."""
    engine = require_engine()
    image = busybox_image(engine)
    daemon, users = fairshare_daemon(tmp_path, 2, "static", ("alice", "bob"))
    daemon.start()
    try:
        spec = {"image": image, "walltime": 120}
        host = users["alice"].call("POST", "/v1/jobs", {**spec, "command": ["sleep", "6"], "cores": 2})["id"]
        daemon.wait_running(host)
        guest = users["bob"].call("POST", "/v1/jobs", {**spec, "command": ["sleep", "3"], "cores": 2})["id"]
        lent = daemon.wait_running(guest)["quota"]
        ended = daemon.wait_final([host, guest], 60)
        changes = [(c["at"], c["cpus"]) for c in daemon.client.call("GET", f"/v1/jobs/{host}")["quota_changes"]]
        live = {row["user"]: row["usage"] for row in daemon.client.call("GET", "/v1/shares")}
        daemon.signal(signal.SIGKILL)
        daemon.start()
        rebuilt = {row["user"]: row["usage"] for row in daemon.client.call("GET", "/v1/shares")}
    finally:
        daemon.cleanup(engine)
    start, end = ended[host]["start"], ended[host]["end"]
    assert lent == 1.0 and [cpus for _, cpus in changes] == [1.0, 2.0]
    (lent_at, _), (back_at, _) = changes
    assert start < lent_at < ended[guest]["start"] and back_at == ended[guest]["end"] < end
    alice = 2 * (lent_at - start) + 1 * (back_at - lent_at) + 2 * (end - back_at)
    # A week's half-life takes under 1e-5 of these off; the bounds are far under the 3 core-seconds
    # Bob's guest would add to either of them were the lending charged twice or not at all.
    bob = lent * (ended[guest]["end"] - ended[guest]["start"])
    assert live == pytest.approx({"alice": alice, "bob": bob}, abs=0.01)
    assert rebuilt == pytest.approx(live, abs=0.01)


def test_purging_ended_jobs_sooner_than_fair_share_forgets_them_is_refused(tmp_path: Path) -> None:
    """The counts are rebuilt from ended jobs at a restart: a state file that drops them after a
    day would lose six weeks of a 7-day half-life's usage. One line names both keys."""
    from cosched.daemon.config import from_dict, validate
    from cosched.daemon.service import Daemon

    def config(days: float) -> object:
        return validate(
            from_dict(
                {
                    "daemon": {"state_dir": str(tmp_path / f"s{days}"), "keep_ended_days": days},
                    "policies": {"queue": "fairshare"},
                }
            )
        )

    with pytest.raises(
        ConfigError, match=r"daemon.keep_ended_days: 1 days forgets runs .*'fairshare' still counts \(70 days\)"
    ):
        Daemon(config(1))  # type: ignore[arg-type]
    Daemon(config(70)).store.close()  # type: ignore[arg-type]


def test_shares_of_a_daemon_that_counts_no_usage_is_a_one_line_refusal(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from cosched.daemon.api import create_app
    from cosched.daemon.config import from_dict, validate
    from cosched.daemon.service import Daemon

    daemon = Daemon(validate(from_dict({"daemon": {"state_dir": str(tmp_path / "state")}})))
    try:
        with TestClient(create_app(daemon)) as client:
            refused = client.get("/v1/shares")
            assert refused.status_code == 409
            assert refused.json()["error"] == (
                "queue policy 'fcfs' counts no usage (shares need policies.queue = fairshare)"
            )
    finally:
        daemon.store.close()


def test_the_experiment_reports_the_heaviest_users_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace of 8 processors where user 1 submits a stream of 8-processor hour-long jobs and
    users 2..9 one 4-processor job each, after hers. Fair-share serves the small users first."""
    from swf_lines import job_line, write_text

    from cosched.cli import main
    from cosched.experiments.fairshare import heavy_users

    lines = ["; MaxProcs: 8", "; MaxNodes: 8"]
    lines += [
        job_line(i, submit=i, user=1, req_procs=8, alloc_procs=8, runtime=3600, req_time=3600) for i in range(1, 6)
    ]
    lines += [job_line(10 + u, submit=100 + u, user=u, runtime=600, req_time=600) for u in range(2, 10)]
    trace = write_text(tmp_path / "users.swf", lines)
    jobs = [Job(i, 0.0, 8 if i == 1 else 1, 10.0, 10.0, user=i) for i in range(1, 21)]
    assert heavy_users(jobs) == {1, 2}  # a tenth of 20 users: the heaviest, then the lowest id

    assert main(["experiment", "fairshare", str(trace), "--policies", "fcfs:easy,fairshare:easy"]) == 0
    about, *lines = capsys.readouterr().out.splitlines()
    assert about == "the heaviest 1 users: 38% of the jobs, mean runtime 3,600 s (other users' jobs 600 s)"
    rows = [line.split() for line in lines[2:]]
    by_policy = {row[0]: [float(value) for value in row[3:]] for row in rows}
    fcfs, fair = by_policy["fcfs:easy"], by_policy["fairshare:easy"]
    # columns: mean wait, users' mean wait, the heaviest user's jobs, the others' jobs, mean bsld
    assert fair[3] < fcfs[3] and fair[2] > fcfs[2]
    assert fair[1] < fcfs[1]

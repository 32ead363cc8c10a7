"""Learned policies: hidden runtimes, the environments over the replay core, NumPy inference,
the plugins (names, models, bad models) and their replays.

Training itself is exercised by tests/test_train.py (torch); everything here needs NumPy and
Gymnasium only, and the stored check batches hold the shipped models' NumPy forward pass to
what torch computed when they were exported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from cosched.core.view import SchedulerView
from cosched.errors import ConfigError
from cosched.learn.features import dbf_window, scaled_time
from cosched.learn.models import load_model, model_path, shipped
from cosched.learn.network import PolicyNetwork
from cosched.model import Cluster, Job, JobState
from cosched.policies.backfill import EASY
from cosched.policies.base import BackfillPlan, BackfillPolicy, QueuePolicy
from cosched.policies.learned import DBF, RLBackfill
from cosched.policies.queue import FCFS
from cosched.policies.registry import create
from cosched.replay.driver import PolicySet, replay
from cosched.replay.study import load_workload, parse_policy_sets
from cosched.traces.trace import Trace

TRACE = "lublin:1500:64:0.9"


def workload(jobs: int = 1500, procs: int = 64) -> Trace:
    return load_workload(f"lublin:{jobs}:{procs}:0.9", seed=3)


def starts(result) -> dict[int, float]:
    return {job.id: job.start for job in result.jobs}


# -- the true runtime is out of the policies' reach ------------------------------------------


class _Spy:
    """Records, at every call a policy gets, every runtime it could read from its view."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen: set[object] = set()

    def look(self, view: SchedulerView) -> None:
        self.calls += 1
        for job in (*view.queue, *view.running, *view._jobs.values()):
            self.seen.add(job.runtime)


class SpyQueue(FCFS):
    spy = _Spy()

    def order(self, queue, view):
        self.spy.look(view)
        return super().order(queue, view)


class SpyBackfill(EASY):
    spy = _Spy()

    def plan(self, view, head) -> BackfillPlan:
        self.spy.look(view)
        return super().plan(view, head)


def test_policies_never_see_a_runtime_and_jobs_get_theirs_back() -> None:
    trace = workload()
    jobs = trace.jobs()
    truth = {job.id: job.runtime for job in jobs}
    queue, backfill = SpyQueue(), SpyBackfill()
    queue.spy.__init__()
    backfill.spy.__init__()
    result = replay(jobs, Cluster(64), PolicySet(queue, backfill), validate=True)
    assert queue.spy.calls > 100 and backfill.spy.calls > 100
    assert queue.spy.seen == {None} and backfill.spy.seen == {None}
    assert {job.id: job.runtime for job in result.jobs} == truth  # given back when the replay ends
    assert all(job.end - job.start == min(job.runtime, job.walltime) for job in result.jobs)


def test_easy_ar_still_plans_with_the_true_runtime() -> None:
    """The oracle estimator is handed the truth explicitly; with it EASY-AR backfills a job that
    EASY, which reads walltimes only, cannot."""

    def jobs() -> list[Job]:
        return [
            Job(id=1, submit=0, cores=2, walltime=100, runtime=10),
            Job(id=2, submit=1, cores=3, walltime=100, runtime=10),  # the blocked head
            Job(id=3, submit=2, cores=1, walltime=200, runtime=5),  # ends by the shadow by its runtime only
        ]

    requested = replay(jobs(), Cluster(3), PolicySet("fcfs", "easy", "requested"))
    actual = replay(jobs(), Cluster(3), PolicySet("fcfs", "easy", "actual"))
    assert starts(actual) == {1: 0.0, 2: 10.0, 3: 2.0}
    assert starts(requested) == {1: 0.0, 2: 10.0, 3: 20.0}
    assert {j.id: j.estimate for j in actual.jobs} == {1: 10.0, 2: 10.0, 3: 5.0}


def vars_of(job: Job) -> dict:
    return {"id": job.id, "submit": job.submit, "cores": job.cores, "walltime": job.walltime, "runtime": job.runtime}


# -- the plugins, by name ---------------------------------------------------------------------


def test_shipped_models_are_registered_and_named_by_argument() -> None:
    assert {"sdsc-sp2", "hpc2n", "lublin-1", "lublin-2"} <= set(shipped("rlbf"))
    assert shipped("dbf")
    assert isinstance(create("backfill", "rlbf"), RLBackfill)
    assert isinstance(create("backfill", "rlbf:hpc2n"), RLBackfill)
    assert isinstance(create("queue", f"dbf:{shipped('dbf')[0]}"), DBF)
    assert isinstance(create("backfill", f"rlbf:{model_path('rlbf', 'lublin-1')}"), RLBackfill)
    (policy_set,) = parse_policy_sets("fcfs:[rlbf:hpc2n]")
    assert policy_set.backfill == "rlbf:hpc2n" and policy_set.label == "fcfs+rlbf[hpc2n]"


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("backfill", "rlbf:no-such-model", "unknown rlbf model 'no-such-model': not a shipped model (hpc2n,"),
        ("queue", "dbf:/no/such/file.npz", "unknown dbf model '/no/such/file.npz'"),
        ("backfill", "easy:hpc2n", "backfill policy 'easy' takes no argument"),
        ("backfill", "rlbf:", "backfill policy 'rlbf:': nothing after the ':'"),  # it ran the default model
        ("queue", "dbf: ", "queue policy 'dbf: ': nothing after the ':'"),
        ("placement", "nsa:", "placement policy 'nsa:': nothing after the ':'"),
    ],
)
def test_a_bad_model_name_is_one_clear_error(kind: str, spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        create(kind, spec)


def test_a_file_that_is_not_a_model_or_of_the_other_kind_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.npz"
    for content in (b"not a zip", b"\x80\x04 random bytes numpy reads as a pickle", b""):
        junk.write_bytes(content)  # numpy's word for the second: load it unsafely with allow_pickle
        with pytest.raises(ConfigError, match=r"is not a cosched model file: not an \.npz \(zip\) archive$"):
            create("backfill", f"rlbf:{junk}")
    with pytest.raises(ConfigError, match="is a dbf model, not a rlbf one"):
        create("backfill", f"rlbf:{model_path('dbf', shipped('dbf')[0])}")


def test_cli_refuses_an_unknown_model_before_reading_the_trace(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cosched.cli", "replay", str(tmp_path / "absent.swf"), "--compare", "fcfs:[rlbf:nope]"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "unknown rlbf model 'nope'" in run.stderr


# -- NumPy inference against torch's stored outputs -------------------------------------------


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in ("rlbf", "dbf") for n in shipped(k)])
def test_numpy_forward_pass_equals_what_torch_computed_at_export(kind: str, name: str) -> None:
    path = model_path(kind, name)
    network, check = PolicyNetwork.load(path), PolicyNetwork.check_batch(path)
    assert len(check["obs"]) >= 16
    logits = network.logits(check["obs"])
    np.testing.assert_allclose(logits, check["logits"], rtol=1e-4, atol=1e-4)
    masked = np.where(check["mask"], check["logits"], -np.inf).argmax(axis=1)
    assert [network.act(o, m) for o, m in zip(check["obs"], check["mask"], strict=True)] == masked.tolist()
    assert path.stat().st_size < 200_000  # small enough to ship
    assert path.with_suffix(".json").is_file()  # its training record


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in ("rlbf", "dbf") for n in shipped(k)])
def test_logits_do_not_depend_on_how_many_observations_go_together(kind: str, name: str) -> None:
    """Through BLAS, a batch and a single row are summed in different orders (and a threaded BLAS
    sums in an order that depends on the machine's load), which flips near-ties and with them whole
    replays. The forward pass gives the same bits either way."""
    path = model_path(kind, name)
    network, check = PolicyNetwork.load(path), PolicyNetwork.check_batch(path)
    together = network.logits(check["obs"])
    alone = np.stack([network.logits(observation) for observation in check["obs"]])
    assert np.array_equal(together, alone)


def test_time_features_on_a_log_scale() -> None:
    seconds = np.array([0.0, 60.0, 3600.0, 8_640_000.0])
    linear, log = scaled_time(seconds, 8_640_000.0, False), scaled_time(seconds, 8_640_000.0, True)
    assert linear[2] < 0.001 and log[2] > 0.5  # an hour, against HPC2N's longest request of 100 days
    assert linear[3] == log[3] == 1.0 and linear[0] == log[0] == 0.0
    assert np.all(np.diff(log) > 0)
    # A model says which scale it was trained on, and its plugin observes on that scale.
    for name in shipped("rlbf"):
        config = load_model("rlbf", name).config
        assert RLBackfill(name).log_time is bool(config.get("log_time", False))
    assert RLBackfill("hpc2n").log_time and not RLBackfill("sdsc-sp2").log_time


# -- replays with the learned plugins ---------------------------------------------------------


@pytest.mark.parametrize(("queue", "backfill"), [("fcfs", "rlbf"), ("sjf", "rlbf:lublin-2"), ("dbf", "none")])
def test_learned_policies_replay_validly_and_deterministically(queue: str, backfill: str) -> None:
    trace = workload()
    first = replay(trace.jobs(), Cluster(64), PolicySet(queue, backfill), validate=True)
    again = replay(trace.jobs(), Cluster(64), PolicySet(queue, backfill))
    assert len(first.jobs) == len(trace)
    assert starts(first) == starts(again)


class _Counting(BackfillPolicy):
    """Starts every job that fits, one per plan: the core must ask again after each start."""

    name = "counting"
    one_by_one = True
    plans = 0

    def plan(self, view, head) -> BackfillPlan:
        type(self).plans += 1
        fits = [job for job in view.queue[head + 1 :] if job.need <= view.free_units]
        return BackfillPlan(fits[:1], {})


def test_a_one_by_one_backfill_is_asked_again_after_each_start() -> None:
    _Counting.plans = 0
    jobs = [Job(id=1, submit=0, cores=3, walltime=10, runtime=10)]
    jobs += [Job(id=2, submit=1, cores=5, walltime=10, runtime=10)]  # the blocked head
    jobs += [Job(id=i, submit=1, cores=1, walltime=50, runtime=50) for i in (3, 4, 5)]
    result = replay(jobs, Cluster(5), PolicySet("fcfs", _Counting()), validate=True)
    assert starts(result)[3] == starts(result)[4] == 1.0  # two free cores: two plans, one start each
    assert starts(result)[5] > 1.0
    assert _Counting.plans >= 2


class _PickLast(QueuePolicy):
    """A one-by-one queue policy that serves the newest job that fits, and waits otherwise."""

    name = "pick-last"
    static = False
    one_by_one = True

    def score(self, job, now):
        return job.submit

    def order(self, queue, view):
        fits = [job for job in queue if job.need <= view.free_units]
        return fits[-1:]


def test_a_one_by_one_queue_policy_chooses_every_start() -> None:
    jobs = [Job(id=i, submit=0, cores=1, walltime=10, runtime=10) for i in (1, 2, 3)]
    result = replay(jobs, Cluster(2), PolicySet(_PickLast(), "none"), validate=True)
    assert starts(result) == {3: 0.0, 2: 0.0, 1: 10.0}


def test_dbf_window_is_head_then_tail() -> None:
    queue = [Job(id=i, submit=i, cores=1, walltime=1) for i in range(10)]
    assert [j.id for j in dbf_window(queue, 3, 2)] == [0, 1, 2, 8, 9]
    assert [j.id for j in dbf_window(queue, 5, 0)] == [0, 1, 2, 3, 4]
    assert [j.id for j in dbf_window(queue[:4], 3, 2)] == [0, 1, 2, 3]


def test_the_split_window_sees_the_queue_tail_a_head_only_window_does_not() -> None:
    """With the head of the queue full of jobs too large to start, only a split window has a job to pick."""

    def first_allowed(observation: np.ndarray, mask: np.ndarray) -> int:
        return int(np.argmax(mask))

    def jobs() -> list[Job]:
        big = [Job(id=i, submit=1, cores=4, walltime=100, runtime=100) for i in (1, 2, 3)]
        return [Job(id=0, submit=0, cores=3, walltime=100, runtime=100), *big, Job(id=9, submit=2, cores=1, walltime=5)]

    head_only = replay(jobs(), Cluster(4), PolicySet(DBF(decide=first_allowed, head=2, tail=0), "none"))
    split = replay(jobs(), Cluster(4), PolicySet(DBF(decide=first_allowed, head=1, tail=1), "none"))
    assert starts(split)[9] == 2.0
    assert starts(head_only)[9] > 2.0


def test_a_forward_holds_until_the_next_arrival_or_end_as_in_training() -> None:
    """Training's replay runs on to the next event after a forward; the daemon passes every second
    and replay passes for samples and deadlines. Asked again in those, the agent saw waits a second
    longer each time (never seen in training) and started jobs the replay did not (an audit found
    7 of 30 starts apart). Now passes with no arrival or end do not ask it."""
    from cosched.core.events import JobSubmitted, Offer
    from cosched.core.scheduler import Scheduler

    asked: list[float] = []

    def forwards(observation: np.ndarray, mask: np.ndarray) -> int:
        asked.append(now)
        return len(mask) - 1

    core = Scheduler(
        Cluster(1, 4),
        DBF(decide=forwards, head=2),
        create("backfill", "none"),
        create("estimate", "requested"),
        create("placement", "first-fit"),
    )
    now = 1.0
    core.step(now, [Offer(((0, 4),)), JobSubmitted(Job(id=1, submit=1, cores=1, walltime=10))])
    for now in (2.0, 3.0, 4.0):
        core.step(now, [])
    now = 5.0
    core.step(now, [JobSubmitted(Job(id=2, submit=5, cores=1, walltime=10))])
    now = 6.0
    core.step(now, [])
    assert asked == [1.0, 5.0]


# -- the environments --------------------------------------------------------------------------


def _envs():
    require_module("gymnasium")
    from cosched.learn.envs import BackfillEnv, JobSelectionEnv

    trace = workload(1500, 64)
    return [
        BackfillEnv(trace, Cluster(64), length=200, window=32),
        JobSelectionEnv(trace, Cluster(64), head=6, tail=2, length=100),
    ]


def test_environments_pass_gymnasiums_checker() -> None:
    from gymnasium.utils.env_checker import check_env

    for env in _envs():
        check_env(env, skip_render_check=True)


def _episode(env, seed: int, policy) -> tuple[list[np.ndarray], list[float], dict]:
    obs, _ = env.reset(seed=seed)
    observations, rewards = [obs], []
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs, env.action_masks()))
        rewards.append(reward)
        if terminated or truncated:
            return observations, rewards, info
        observations.append(obs)


def _last_allowed(observation: np.ndarray, mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[-1])


def _same(first: list[np.ndarray], second: list[np.ndarray]) -> bool:
    return len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_episodes_are_seeded_and_reproducible() -> None:
    for env in _envs():
        first, again, other = (_episode(env, seed, _last_allowed) for seed in (5, 5, 6))
        assert _same(first[0], again[0]) and first[1] == again[1]
        assert not _same(first[0], other[0])


def test_what_an_agent_is_handed_holds_no_runtime() -> None:
    for env in _envs():
        env.reset(seed=2)
        core = env._run.core
        waiting = [*core.queue, *core.running]
        assert waiting and all(job.runtime is None for job in waiting)


def test_an_environment_episode_decides_as_the_plugin_replays() -> None:
    """The agent's episode in an environment and the plugin's replay of the same window, with the
    same network, start every job at the same time: one loop, one set of decision points (for a
    model on the linear time scale and one on the log scale)."""
    require_module("gymnasium")
    from cosched.learn.envs import BackfillEnv, JobSelectionEnv

    trace = workload(1500, 64)
    for name in ("lublin-1", "hpc2n"):
        rlbf = load_model("rlbf", name)
        scale, log_time = float(rlbf.config["time_scale"]), bool(rlbf.config.get("log_time", False))
        window = int(rlbf.config["window"])
        env = BackfillEnv(trace, Cluster(64), length=300, window=window, time_scale=scale, log_time=log_time)
        _episode(env, 3, rlbf.act)
        plugin = replay(env.episode.jobs(), Cluster(64), PolicySet("fcfs", f"rlbf:{name}"))
        assert starts(env._run.result()) == starts(plugin)
    dbf = load_model("dbf", None)  # the default: a kernel actor that also sees when jobs would fit, log times
    assert dbf.config["actor"] == "kernel" and dbf.config["expected_start"] and dbf.config["log_time"]
    env = JobSelectionEnv(
        trace,
        Cluster(64),
        head=int(dbf.config["head"]),
        tail=int(dbf.config["tail"]),
        length=150,
        time_scale=float(dbf.config["time_scale"]),
        log_time=True,
        expected_start=True,
    )
    _episode(env, 3, dbf.act)
    started = {job.id: job.start for job in env._run.pending if job.start >= 0}
    plugin = starts(replay(env.episode.jobs(), Cluster(64), PolicySet("dbf", "none")))
    assert len(started) >= 150 and started == {i: plugin[i] for i in started}


def test_dbf_bsld_reward_sums_to_the_slowdown_the_jobs_accrued() -> None:
    """With `reward="bsld"` an episode's return is minus the sum, over every job that arrived, of
    its wait so far over max(runtime, 10 s) (in `BSLD_SCALE` units): the bounded slowdown the
    heuristics are compared on, paid as it accrues."""
    require_module("gymnasium")
    from cosched.learn.envs import BSLD_SCALE, JobSelectionEnv

    env = JobSelectionEnv(workload(1500, 64), Cluster(64), head=6, tail=2, length=100, reward="bsld")
    _, rewards, _ = _episode(env, 4, _last_allowed)
    now = env._accrued_at
    columns = env.episode.columns
    runtime = dict(zip(columns["job_id"].tolist(), columns["runtime"].tolist(), strict=True))
    waited = 0.0
    for job in env._run.pending:
        if job.submit <= now:
            end = job.start if job.state is not JobState.PENDING and job.start <= now else now
            waited += (end - job.submit) / max(runtime[job.id], 10.0)
    assert waited > 0 and all(r <= 0 for r in rewards)
    assert -sum(rewards) * BSLD_SCALE == pytest.approx(waited, rel=1e-9)
    with pytest.raises(ConfigError, match="unknown dbf reward"):
        JobSelectionEnv(workload(1500, 64), Cluster(64), reward="trace")


def test_rlbf_trace_reward_is_the_gain_over_easy_against_the_traces_mean() -> None:
    """`reward="trace"` divides a window's bsld gain over EASY by the mean EASY bsld of seeded
    windows of the trace (the same for every episode), where the paper's divides by the window's."""
    require_module("gymnasium")
    from cosched.learn.envs import BackfillEnv

    trace = workload(1500, 64)
    paper = BackfillEnv(trace, Cluster(64), length=200, window=32)
    scaled = BackfillEnv(trace, Cluster(64), length=200, window=32, reward="trace")
    assert paper._scale is None and scaled._scale > 1.0
    assert BackfillEnv(trace, Cluster(64), length=200, window=32, reward="trace")._scale == scaled._scale
    for env in (paper, scaled):
        _, rewards, info = _episode(env, 7, _last_allowed)
        scale = info["baseline_bsld"] if env is paper else scaled._scale
        assert rewards[-1] == pytest.approx((info["baseline_bsld"] - info["bsld"]) / scale)
        assert rewards[-1] != 0.0

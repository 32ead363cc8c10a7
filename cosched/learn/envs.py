"""Gymnasium environments over the replay core: RLBackfilling's, DBF's and the learned OSDEC's.

There is no second simulator here. An episode is a replay (`cosched.replay.driver.Replay`)
of a window of the trace, with the learned plugin in the core; the plugin's `decide`
is the environment's, which records the observation and answers nothing, so the core
stops asking and the replay pauses after that pass. `step(action)` hands the action
to the plugin and runs one more pass at the same time (`Replay.again`), in which the
core starts the job and asks again; when nothing is asked, the replay runs on to the
next pass where something is. Replay, the daemon and training therefore decide at the
same points from the same observations (`cosched.learn.features`).

Windows of `length` consecutive jobs start at seeded random positions
(`reset(seed=...)`), each on an empty cluster, so episodes are reproducible.
Jobs enter the core without their runtime (`SimulatedBackend.admit`): nothing an
agent is handed holds it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import gymnasium as gym
import numpy as np

from cosched.errors import ConfigError
from cosched.learn import REWARDS
from cosched.learn.features import CLUSTER_QUANTILES, OSDEC_FEATURES, RLBF_FEATURES, dbf_row_features
from cosched.model import Cluster, Job, JobState
from cosched.policies.learned import DBF, RLBackfill
from cosched.replay.driver import PolicySet, Replay, replay
from cosched.reporting.metrics import summarize
from cosched.traces.trace import Trace

MAX_RESETS = 1000
"""Windows drawn in a row without a single decision before `reset` gives up."""
TRACE_BASELINE_WINDOWS = 64
TRACE_BASELINE_SEED = 12345
BSLD_SCALE = 100.0
"""DBF's `bsld` reward: accrued slowdown in units of 100 (a step's cost is then mostly below 1)."""


def time_scale_of(trace: Trace) -> float:
    """What requested times are divided by: the trace's longest request (a trace constant,
    stored in the model, so inference normalises as training did)."""
    return float(np.max(trace.columns["req_time"]))


class _ReplayEnv(gym.Env):  # type: ignore[misc]
    """What both environments share: windows, the paused replay, the pending decision."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gym.Env types it an instance variable
    observation_space: gym.spaces.Box
    action_space: gym.spaces.Discrete

    def __init__(self, trace: Trace, cluster: Cluster, length: int) -> None:
        if length < 2 or length > len(trace):
            raise ConfigError(f"episode length must be in 2..{len(trace)} jobs, got {length}")
        self.trace = trace
        self.cluster = cluster
        self.length = length
        self._answer: int | None = None
        self._pending: tuple[np.ndarray, np.ndarray] | None = None
        self._run: Replay | None = None
        self._passes: Generator[float, None, None] | None = None
        self._now = 0.0
        self.episode: Trace | None = None
        """The window of the trace the current episode replays."""

    # -- the plugin's decide ---------------------------------------------------
    def _decide(self, observation: np.ndarray, mask: np.ndarray) -> int | None:
        if self._answer is not None:
            answer, self._answer = self._answer, None
            return answer
        self._pending = (observation, mask)
        return None

    def action_masks(self) -> np.ndarray:
        """The actions allowed now (sb3-contrib's MaskablePPO asks for them)."""
        if self._pending is None:
            return np.ones(self.action_space.n, dtype=bool)
        return self._pending[1].copy()

    # -- episodes ----------------------------------------------------------------
    def _window(self, length: int) -> Trace:
        start = int(self.np_random.integers(0, len(self.trace) - length + 1))
        return self.trace.slice(start, length)

    def _start(self, policies: PolicySet, window: Trace) -> bool:
        """Replay `window` until the first decision; False if it has none."""
        self._close_run()
        self._answer = self._pending = None
        self.episode = window
        self._run = Replay(window.jobs(), self.cluster, policies, keep_slots=False)
        passes = self._run.passes(pause=self._pause)
        assert isinstance(passes, Generator)  # its close() gives an abandoned replay's jobs their runtimes back
        self._passes = passes
        return self._advance()

    def _pause(self, now: float) -> bool:
        return self._pending is not None

    def _advance(self) -> bool:
        """Run on to the next pass that asks for a decision; False when the replay is over."""
        assert self._passes is not None
        self._pending = None
        try:
            self._now = next(self._passes)
        except StopIteration:
            return False
        return True

    def _answer_now(self, action: int) -> None:
        """Give the pending decision its action and take the pass that carries it out.
        A masked action starts nothing (the plugins refuse it), as in the papers' simulators."""
        assert self._run is not None and self._pending is not None
        self._answer, self._pending = int(action), None
        self._run.again(self._now)
        self._answer = None

    def _observation(self) -> np.ndarray:
        if self._pending is None:
            return np.zeros(self.observation_space.shape, dtype=np.float32)
        return self._pending[0].astype(np.float32)

    def _close_run(self) -> None:
        if self._passes is not None:
            self._passes.close()  # an abandoned replay gives its jobs their runtimes back
        self._passes = None

    def close(self) -> None:
        self._close_run()


class BackfillEnv(_ReplayEnv):
    """RLBackfilling: which of the jobs that fit now to backfill while the head is blocked.

    Observation: `window` rows of `RLBF_FEATURES` (`features.rlbf_observation`), flattened.
    Action: a row; rows without a job are masked. Reward: 0 until the window is replayed,
    then the bounded-slowdown improvement over the same window under `queue` + EASY,
    (baseline - bsld) / baseline, as the paper's reward against its heuristic.
    """

    def __init__(
        self,
        trace: Trace,
        cluster: Cluster,
        *,
        queue: str = "fcfs",
        length: int = 256,
        window: int = 128,
        time_scale: float | None = None,
        log_time: bool = False,
        reward: str = "paper",
    ) -> None:
        super().__init__(trace, cluster, length)
        if reward not in REWARDS["rlbf"]:
            raise ConfigError(f"unknown rlbf reward {reward!r}; known: {', '.join(REWARDS['rlbf'])}")
        self.reward = reward
        self.queue = queue
        self.window = window
        self.time_scale = time_scale or time_scale_of(trace)
        self.log_time = log_time
        self.observation_space = gym.spaces.Box(0.0, 1.0, (window * RLBF_FEATURES,), np.float32)
        self.action_space = gym.spaces.Discrete(window)
        self.policy = RLBackfill(decide=self._decide, window=window, time_scale=self.time_scale, log_time=log_time)
        self._baseline = 1.0
        self._scale = self._trace_baseline() if reward == "trace" else None

    def _trace_baseline(self, windows: int = TRACE_BASELINE_WINDOWS) -> float:
        """The mean bsld of `queue` + EASY over seeded windows of the trace: the `trace` reward's
        scale, so a window weighs in with the bsld it gains, as in the mean the policies are
        compared on, instead of the fraction (which weighs a light window's 1.1 against 1.0 as
        much as a heavy one's 330 against 300)."""
        rng = np.random.default_rng(TRACE_BASELINE_SEED)
        starts = rng.integers(0, len(self.trace) - self.length + 1, size=windows)
        easy = PolicySet(self.queue, "easy")
        values = [
            summarize(
                replay(self.trace.slice(int(s), self.length).jobs(), self.cluster, easy, keep_slots=False).jobs,
                self.cluster.cores,
            )
            for s in starts
        ]
        return float(np.mean([v.mean_bsld for v in values]))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        for _ in range(MAX_RESETS):
            window = self._window(self.length)
            if self._start(PolicySet(self.queue, self.policy), window):
                base = replay(window.jobs(), self.cluster, PolicySet(self.queue, "easy"), keep_slots=False)
                self._baseline = summarize(base.jobs, self.cluster.cores).mean_bsld
                return self._observation(), {}
        raise ConfigError(
            f"no backfilling decision in {MAX_RESETS} windows of {self.length} jobs: train on another trace"
        )

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._answer_now(int(action))
        if self._pending is not None or self._advance():
            return self._observation(), 0.0, False, False, {}
        assert self._run is not None
        bsld = summarize(self._run.result().jobs, self.cluster.cores).mean_bsld
        reward = (self._baseline - bsld) / (self._scale or self._baseline)
        return self._observation(), float(reward), True, False, {"bsld": bsld, "baseline_bsld": self._baseline}


class JobSelectionEnv(_ReplayEnv):
    """DBF: pick the next job to start from a (split) window of the queue, or forward.

    Observation: the cluster summary and `head + tail` job rows (`features.dbf_observation`).
    Actions: a window slot (masked unless it holds a job that fits) or forward, the last.
    Reward `paper` (schedule cycling): 0 for a start; every cycle that ends with jobs waiting
    (the agent forwards, or nothing in its window fits) costs
    w1 (1 - utilization) + w2 L / Lmax + w3 W / Wmax, with L the queue length, W its total
    wait and the maxima over the episode so far. Reward `bsld`: each step costs the bounded
    slowdown the queued jobs accrued since the last one, sum of waited / max(runtime, 10 s)
    over `BSLD_SCALE`, so an episode's return is its jobs' summed bsld excess, the metric
    the heuristics are compared on (the paper's reward is not, docs/learned-policies.md);
    the environment reads runtimes from the trace, never the agent. An episode ends after
    `length` starts (the paper: 1,000), truncated, so the queue never drains for the want
    of arrivals.
    """

    def __init__(
        self,
        trace: Trace,
        cluster: Cluster,
        *,
        head: int = 10,
        tail: int = 0,
        length: int = 256,
        time_scale: float | None = None,
        weights: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3),
        log_time: bool = False,
        reward: str = "paper",
        expected_start: bool = False,
    ) -> None:
        super().__init__(trace, cluster, length)
        if 2 * length > len(trace):
            raise ConfigError(f"a DBF episode replays 2 x {length} jobs; the trace has {len(trace)}")
        if reward not in REWARDS["dbf"]:
            raise ConfigError(f"unknown dbf reward {reward!r}; known: {', '.join(REWARDS['dbf'])}")
        self.head, self.tail = head, tail
        self.size = head + tail
        self.time_scale = time_scale or time_scale_of(trace)
        self.weights = weights
        self.log_time = log_time
        self.reward = reward
        self._runtime: dict[int, float] = {}
        self._queued: dict[int, Job] = {}
        self._accrued_at = 0.0
        self.expected_start = expected_start
        rows = self.size * dbf_row_features(expected_start)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (CLUSTER_QUANTILES + rows,), np.float32)
        self.action_space = gym.spaces.Discrete(self.size + 1)
        self.policy = DBF(
            decide=self._decide,
            head=head,
            tail=tail,
            time_scale=self.time_scale,
            log_time=log_time,
            expected_start=expected_start,
        )
        self._penalty = 0.0
        self._started = 0
        self._max_queue = self._max_wait = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        for _ in range(MAX_RESETS):
            self._penalty, self._started = 0.0, 0
            self._max_queue = self._max_wait = 0.0
            window = self._window(2 * self.length)
            if self._start(PolicySet(self.policy, "none"), window):
                self._penalty = 0.0  # cycles before the first decision are no action's doing
                if self.reward == "bsld":
                    columns = window.columns
                    self._runtime = dict(zip(columns["job_id"].tolist(), columns["runtime"].tolist(), strict=True))
                    self._queued, self._accrued_at = {}, self._now
                    self._accrue_bsld(self._now)
                return self._observation(), {}
        raise ConfigError(f"no scheduling decision in {MAX_RESETS} windows: train on another trace")

    def _cost(self, now: float) -> float:
        """DBF's reward, negated: what a cycle that ends with `queue` waiting costs."""
        assert self._run is not None
        core = self._run.core
        queue = core.queue
        length = float(len(queue))
        wait = sum(now - job.submit for job in queue)
        self._max_queue = max(self._max_queue, length)
        self._max_wait = max(self._max_wait, wait)
        w1, w2, w3 = self.weights
        idle = core.pool.free_units / self.cluster.capacity_units
        return (
            w1 * idle
            + (w2 * length / self._max_queue if self._max_queue else 0.0)
            + (w3 * wait / self._max_wait if self._max_wait else 0.0)
        )

    def _accrue_bsld(self, now: float) -> float:
        """The bounded slowdown queued jobs accrued since the last call, and a new account.

        Between two decisions the queue only grows (DBF starts jobs only when asked): a job
        queued then and now accrued the whole interval, one queued then and started since
        until its start, one that arrived since from its submission."""
        assert self._run is not None
        since, runtime = self._accrued_at, self._runtime
        queued = {job.id: job for job in self._run.core.queue}
        accrued = 0.0
        for job_id, job in self._queued.items():
            end = now if job_id in queued else job.start
            accrued += (end - max(since, job.submit)) / max(runtime[job_id], 10.0)
        for job_id, job in queued.items():
            if job_id not in self._queued:
                accrued += (now - job.submit) / max(runtime[job_id], 10.0)
        self._queued, self._accrued_at = queued, now
        return accrued / BSLD_SCALE

    def _pause(self, now: float) -> bool:
        if self._pending is not None:
            return True
        if self.reward == "paper" and self._run is not None and self._run.core.queue:
            self._penalty += self._cost(now)  # a cycle in which nothing in the window fit
        return False

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = int(action)
        assert self._pending is not None
        paper = self.reward == "paper"
        if action >= self.size or not self._pending[1][action]:  # forward, or an invalid pick: forwarded
            if paper:
                self._penalty += self._cost(self._now)
            self._answer_now(action)
        else:
            self._answer_now(action)
            self._started += 1
            if paper and self._pending is None and self._run is not None and self._run.core.queue:
                self._penalty += self._cost(self._now)  # the cycle ends: nothing else fits
        truncated = self._started >= self.length
        alive = not truncated and (self._pending is not None or self._advance())
        if not paper and self._run is not None:
            self._penalty = self._accrue_bsld(self._now)
        reward, self._penalty = -self._penalty, 0.0
        if alive:
            return self._observation(), reward, False, False, {}
        info = self._episode_info()
        self._close_run()
        return self._observation(), reward, not truncated, truncated, info

    def _episode_info(self) -> dict[str, float]:
        """Mean wait of the jobs started so far (for the training log)."""
        assert self._run is not None
        started = [job for job in self._run.pending if job.state is not JobState.PENDING]
        waits = np.array([job.start - job.submit for job in started])
        return {"mean_wait": float(waits.mean()) if started else 0.0, "started": float(len(started))}


REWARD_HOURS = 3600.0


class DeferrableEnv(_ReplayEnv):
    """The learned OSDEC policy (`cosched.policies.osdec_learned`): which deferrable job of B_cur
    starts next, on windows of the trace given start windows as the study gives them
    (`cosched.replay.deferrable.Windows`, drawn afresh for every episode).

    Observation: `window` rows of `OSDEC_FEATURES` (`features.osdec_observation`), the
    deferrable jobs that may start. Action: a row; padding rows are masked. The agent is asked
    whenever two or more deferrable jobs may start (the policy's rule: they fit, and delay no
    blocked on-demand job). Reward, OSDEC's eq. 6 without its violation term (0 here): at each
    step, for every deferrable job started since the last one (by the agent's pick or around
    it), r_i - w1 p_i, with r_i = c_i d_i in core-hours (d_i its true runtime, which the
    environment reads from the trace, never the agent) and p_i = t_i - e_i in hours, divided
    by the cluster's cores (cluster-hours). An episode replays the whole window, so its return
    is the window's eq. 6 reward (after the first decision) over the capacity.
    """

    def __init__(
        self,
        trace: Trace,
        cluster: Cluster,
        *,
        length: int = 256,
        window: int = 32,
        time_scale: float | None = None,
        log_time: bool = True,
        fraction: float = 0.5,
        width: tuple[float, float] = (3600.0, 4 * 3600.0),
        lead: tuple[float, float] = (0.0, 0.0),
        backfill: str = "easy",
        w1: float = 2.0,
    ) -> None:
        from cosched.policies.osdec_learned import LearnedOSDEC
        from cosched.replay.deferrable import Windows

        super().__init__(trace, cluster, length)
        Windows(fraction, width, lead)  # ConfigError for a bad fraction, width or lead
        self.window = window
        self.time_scale = time_scale or time_scale_of(trace)
        self.log_time = log_time
        self.fraction, self.width, self.lead = fraction, width, lead
        self.backfill = backfill
        self.w1 = w1
        self.observation_space = gym.spaces.Box(0.0, 1.0, (window * OSDEC_FEATURES,), np.float32)
        self.action_space = gym.spaces.Discrete(window)
        self.policy = LearnedOSDEC(decide=self._decide, window=window, time_scale=self.time_scale, log_time=log_time)
        self._runtime: dict[int, float] = {}
        self._waiting: list[Job] = []
        self._return = 0.0
        self._expired = 0

    def _start_jobs(self, jobs: list[Job]) -> bool:
        """`_start` for jobs already given windows."""
        self._close_run()
        self._answer = self._pending = None
        self._run = Replay(jobs, self.cluster, PolicySet(self.policy, self.backfill), keep_slots=False)
        passes = self._run.passes(pause=self._pause)
        assert isinstance(passes, Generator)
        self._passes = passes
        return self._advance()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        from cosched.replay.deferrable import Windows

        super().reset(seed=seed)
        for _ in range(MAX_RESETS):
            window = self._window(self.length)
            drawn = Windows(self.fraction, self.width, self.lead, seed=int(self.np_random.integers(1 << 31)))
            jobs = drawn.apply(window.jobs())
            self.episode = window
            self._runtime = {job.id: float(job.runtime or 0.0) for job in jobs}
            self._waiting = [job for job in jobs if job.deferrable]
            if self._start_jobs(jobs):
                self._reward()  # starts before the first decision are no action's doing
                self._return, self._expired = 0.0, 0
                return self._observation(), {}
        raise ConfigError(f"no choice between deferrable jobs in {MAX_RESETS} windows of {self.length} jobs")

    def _reward(self) -> float:
        """Eq. 6 (over the capacity) of the deferrable jobs started since the last call."""
        reward, still = 0.0, []
        for job in self._waiting:
            if job.state is JobState.PENDING:
                still.append(job)
            elif job.state is JobState.RUNNING or job.state is JobState.DONE:
                r = job.cores * self._runtime[job.id] / REWARD_HOURS
                reward += r - self.w1 * (job.start - job.eligible) / REWARD_HOURS
            elif job.state is JobState.FAILED:
                self._expired += 1
        self._waiting = still
        value = reward / self.cluster.capacity_units
        self._return += value
        return value

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._answer_now(int(action))
        alive = self._pending is not None or self._advance()
        reward = self._reward()
        if alive:
            return self._observation(), reward, False, False, {}
        info = {"reward": self._return * self.cluster.capacity_units, "expired": float(self._expired)}
        self._close_run()
        return self._observation(), reward, True, False, info

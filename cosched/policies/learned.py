"""Learned policies as ordinary plugins: RLBackfilling (`rlbf`) and DBF (`dbf`).

Each reads the scheduler view into a fixed-size observation (`cosched.learn.features`)
and asks a `decide(observation, mask)` function for an action. Loaded by name, that
function is a trained network run in NumPy (`rlbf:hpc2n`, `dbf:/srv/m.npz`; no torch);
the training environments give it one that waits for the agent instead. Both choose one
job at a time (`one_by_one`), so the core asks again after every start with the view
as it then is: the decision points of training, replay and the daemon are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cosched.core.view import SchedulerView
from cosched.errors import ConfigError
from cosched.learn.features import dbf_observation, dbf_window, rlbf_candidates, rlbf_observation
from cosched.learn.models import load_model
from cosched.model import Job
from cosched.policies.backfill import EASY, shadow_time
from cosched.policies.base import NO_BACKFILL, BackfillPlan, BackfillPolicy, QueuePolicy

Decide = Callable[[np.ndarray, np.ndarray], "int | None"]
"""(observation, mask of allowed actions) -> the action, or None to take none now."""


def kernel_settings(
    kind: str, model: str | None, decide: Decide | None, window: int, time_scale: float, log_time: bool
) -> tuple[Decide, int, float, bool, str]:
    """What a policy scoring each job of a window with one network decides with: a trained
    model's actor, the window, time scale and time encoding it was trained with, and its
    digest, or, for a training environment, its own `decide` and the settings given (no digest)."""
    digest = ""
    if decide is None:
        network = load_model(kind, model)
        decide, digest = network.act, network.digest
        window, time_scale = int(network.config["window"]), float(network.config["time_scale"])
        log_time = bool(network.config.get("log_time", log_time))
    if window < 2 or time_scale <= 0:
        raise ConfigError(f"{kind} needs a window >= 2 and a positive time scale, got {window}, {time_scale}")
    return decide, window, time_scale, log_time, digest


class RLBackfill(BackfillPolicy):
    """RLBackfilling (Kolker-Hicks, Zhang and Dai): an agent picks which job to backfill.

    While the head is blocked and two or more queued jobs fit the free capacity, the
    agent picks one of them (the first `window` in submission order), which starts at
    once, reservation or not; then it is asked again. With a single job that fits, EASY
    decides, as in the paper's simulator (`act_size` 1). The reward it was trained on is
    the episode's bounded slowdown against the base policy with EASY.
    """

    name = "rlbf"
    one_by_one = True

    def __init__(
        self,
        model: str | None = None,
        *,
        decide: Decide | None = None,
        window: int = 128,
        time_scale: float = 12 * 3600.0,
        log_time: bool = False,
    ) -> None:
        self.decide, self.window, self.time_scale, self.log_time, self.model_digest = kernel_settings(
            "rlbf", model, decide, window, time_scale, log_time
        )
        self._easy = EASY()

    def plan(self, view: SchedulerView, head: int) -> BackfillPlan:
        jobs = rlbf_candidates(view, head)
        if len(jobs) < 2:
            return self._easy.plan(view, head) if jobs else NO_BACKFILL
        blocked = view.queue[head]
        shadow, _ = shadow_time(view, blocked.need)
        observation, mask = rlbf_observation(jobs, view, shadow, self.window, self.time_scale, self.log_time)
        choice = self.decide(observation, mask)
        if choice is None or not mask[choice]:
            return NO_BACKFILL
        return BackfillPlan([jobs[choice]], {blocked.id: shadow})

    def reserved_start(self, view: SchedulerView, job: Job) -> float | None:
        return shadow_time(view, job.need)[0]

    def forget(self, job: Job) -> None:
        self._easy.forget(job)


class DBF(QueuePolicy):
    """Deep Back-Filling (Wang, Harwood and Rodriguez): an agent picks the next job to start.

    It sees a split window of the queue, the first `head` jobs and the last `tail` in
    arrival order (`tail = 0`: the usual head-only window), and the cluster's busy
    units; with `expected_start`, also when each job would fit. It picks a job that
    fits, which starts, and is asked again; or it forwards, and nothing more starts
    until the next arrival or end (schedule cycling). It needs no backfill policy:
    picking jobs behind a blocked one is its backfilling.
    """

    name = "dbf"
    static = False
    one_by_one = True

    def __init__(
        self,
        model: str | None = None,
        *,
        decide: Decide | None = None,
        head: int = 10,
        tail: int = 0,
        time_scale: float = 12 * 3600.0,
        log_time: bool = False,
        expected_start: bool = False,
    ) -> None:
        self.model_digest = ""
        if decide is None:
            network = load_model("dbf", model)
            decide, self.model_digest = network.act, network.digest
            head, tail = int(network.config["head"]), int(network.config["tail"])
            time_scale = float(network.config["time_scale"])
            log_time = bool(network.config.get("log_time", False))
            expected_start = bool(network.config.get("expected_start", False))
        if head < 0 or tail < 0 or head + tail < 1 or time_scale <= 0:
            raise ConfigError(f"dbf needs a window of head + tail >= 1 jobs, got {head} + {tail}")
        self.decide = decide
        self.head = head
        self.tail = tail
        self.time_scale = time_scale
        self.log_time = log_time
        self.expected_start = expected_start
        self._forwarded: tuple[object, ...] | None = None
        """What the queue and the cluster were when the agent last forwarded."""

    def score(self, job: Job, now: float) -> float:
        return job.submit

    def order(self, queue: Sequence[Job], view: SchedulerView) -> Sequence[Job]:
        """The one job the agent starts now, or nothing (forward).

        A forward holds until the next arrival or end, as in training, where the replay runs on to
        the next event: a pass with neither (the daemon's, each second; replay's for a sample or a
        deadline) does not ask again. Asked again at each, the agent saw waits a second longer
        each time, which it never saw in training, and started jobs the replay did not."""
        if not queue:
            return ()
        state = (tuple(job.id for job in queue), view.free_units, len(view.running))
        if state == self._forwarded:
            return ()
        jobs = dbf_window(queue, self.head, self.tail)
        observation, mask = dbf_observation(
            jobs, view, self.head + self.tail, self.time_scale, self.log_time, self.expected_start
        )
        if not mask[:-1].any():
            return ()  # nothing in the window fits: forwarding is the only action
        choice = self.decide(observation, mask)
        if choice is None:
            return ()  # (training's: the answer comes in another pass at the same time)
        if choice >= len(jobs) or not mask[choice]:
            self._forwarded = state
            return ()  # forward (an invalid pick forwards too, as in the paper)
        return (jobs[choice],)

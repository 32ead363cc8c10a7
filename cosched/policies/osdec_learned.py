"""The learned OSDEC policy (`osdec[:MODEL]`): a network picks the next deferrable job to start.

OSDEC (its sections 3-4) scores the jobs of the current window B_cur and starts them in score
order while they fit, trained with PPO on eq. 6 (Σ r_i - w1 p_i). Here a network picks one
job at a time: on-demand jobs come first, in submission order, as in the paper's heuristics
(`cosched.policies.deferrable`). The deferrable jobs of B_cur that may start are those that
fit, and, while an on-demand job is blocked, that do not delay its start (EASY's rule: they
end by its shadow time by their estimates, or use only the cores it will leave unused). A
kernel network (one small MLP scoring each job, RLBackfilling's) scores the first `window` of
them by eligibility, and the best-scored one starts; then the next pick, with that one's
cores taken, and so on. With a single such job there is nothing to choose: it starts without
the network.

The picks are worked out in `order`, as Tetris packs (`osdec-tetris`): they come first, then
the on-demand jobs by submission and the deferrable ones by eligibility, so the core's
in-order serving starts the picks and any backfill policy (conservative too) follows. The
policy backfills around a blocked on-demand head itself only while deferrable jobs are
queued; with none queued it is FCFS, and the backfill policy behind it decides alone. So
pair it with `easy`: under `none`, a blocked on-demand head with no deferrable job queued
holds every job behind it.

Why on-demand first rather than a flag the network sees: eq. 6 counts deferrable jobs only,
so a network rewarded by it would learn to pass on-demand jobs over; and the heuristics it is
compared with all serve them first, so the comparison is about the order of the deferrable
jobs alone.

Training (`cosched.learn.envs.DeferrableEnv`) gives a `decide` that answers None while the
agent has not chosen: `order` then returns the picks so far alone, the pass starts them, and
the environment runs the pass again with the agent's answer, so every decision is taken on
the view as it then is.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from cosched.core.frees import shadow as shadow_of
from cosched.core.view import SchedulerView
from cosched.learn.features import osdec_observation
from cosched.model import Job
from cosched.policies.base import QueuePolicy
from cosched.policies.learned import Decide, kernel_settings


class LearnedOSDEC(QueuePolicy):
    """OSDEC's learned scoring of B_cur, one pick at a time (see the module)."""

    name = "osdec"
    static = False

    def __init__(
        self,
        model: str | None = None,
        *,
        decide: Decide | None = None,
        window: int = 32,
        time_scale: float = 12 * 3600.0,
        log_time: bool = True,
    ) -> None:
        self.decide, self.window, self.time_scale, self.log_time, self.model_digest = kernel_settings(
            "osdec", model, decide, window, time_scale, log_time
        )

    def score(self, job: Job, now: float) -> float:
        return job.submit

    def order(self, queue: Sequence[Job], view: SchedulerView) -> Sequence[Job]:
        """The picks, then on-demand jobs by submission, then deferrable ones by e_i."""
        ordinary = sorted((j for j in queue if not j.deferrable), key=lambda j: (j.submit, j.id))
        if len(ordinary) == len(queue):
            return ordinary
        deferrable = sorted((j for j in queue if j.deferrable), key=lambda j: (j.eligible, j.id))
        free, now = view.free_units, view.now
        releases = list(view.releases())
        picks: list[Job] = []
        while free > 0:
            job = self._next(ordinary, deferrable, free, now, releases, view)
            if job is None:
                break
            if job is _UNDECIDED:
                return picks  # the training environment decides: these start, then it asks again
            picks.append(job)
            (ordinary if not job.deferrable else deferrable).remove(job)
            free -= job.need
            bisect.insort(releases, (now + job.estimate, job.need), key=lambda r: r[0])
        return picks + ordinary + deferrable

    def _next(
        self,
        ordinary: list[Job],
        deferrable: list[Job],
        free: int,
        now: float,
        releases: list[tuple[float, int]],
        view: SchedulerView,
    ) -> Job | None:
        """The next job to start with `free` units left, None if none may, `_UNDECIDED` if the
        decision is left open."""
        if ordinary and ordinary[0].need <= free:
            return ordinary[0]
        if ordinary:  # a blocked on-demand head: nothing may delay its start (EASY's rule)
            shadow, extra = shadow_of(free, releases, ordinary[0].need)

            def allowed(job: Job) -> bool:
                return job.need <= free and (now + job.estimate <= shadow or job.need <= extra)

            behind = next((j for j in ordinary[1:] if allowed(j)), None)
            if behind is not None:  # on-demand jobs first, here too
                return behind
            candidates = [j for j in deferrable if allowed(j)]
        else:
            candidates = [j for j in deferrable if j.need <= free]
        if len(candidates) < 2:
            return candidates[0] if candidates else None
        shown = candidates[: self.window]
        observation, mask = osdec_observation(shown, view, self.window, self.time_scale, self.log_time, free)
        choice = self.decide(observation, mask)
        if choice is None:
            return _UNDECIDED
        if choice >= len(shown) or not mask[choice]:
            return None  # an invalid pick starts nothing more
        return shown[choice]


_UNDECIDED = Job(id=-1, submit=0.0, cores=0, walltime=0.0)
"""`_next`'s answer while the training environment has not decided."""

"""What lending can gain in the paper's experiment at a given cost: `cosched experiment asax --ceiling`.

An oracle lends with what no live scheduler knows: both stages' profiles in the
interference model. For a queued guest it tries every host that could hold it and
every fraction from 90% down, and lends the largest fraction that keeps the host at
least 1 - `host_loss` of its speed alone and gives the guest at least `guest_speed`
of its own (the host whose guest runs fastest wins). Sweeping the two bounds
traces how far waits can fall for each degradation; the best wait and response at
5% degradation or less, with no failed workflow, are the ceiling a learner that
only sees its lenders' CPU, memory and progress can be held against.

The oracle is greedy (one guest at a time, no look-ahead), so the ceiling is what
this family of lending rules reaches, not a proven optimum.

The same rule run on what a live scheduler measures (`LiveCpuModel`) says how much of
that ceiling is within reach without the profiles: it sees each lender's busy CPUs and
each guest kind's busy CPUs alone, the guest's side too (which ASAx, like the paper,
does not look at), but neither I/O contention nor a stage's throttling penalty.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cosched.core.view import SchedulerView
from cosched.experiments.asax import Experiment, Run, run_once
from cosched.model import Job, JobState
from cosched.policies.asax import busy_cpus, measured_now
from cosched.policies.base import CoschedulePolicy, Lending
from cosched.workflows.interference import StageProfile, shipped_profiles, speed

HOST_LOSSES = (0.02, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2)
GUEST_SPEEDS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.95)
DEGRADATION_BUDGET = 0.05


class GreedyLender(CoschedulePolicy):
    """The rule of both: for each host that could hold the guest, the largest tenth of it that keeps
    the host at least 1 - `host_loss` of its speed alone and gives the guest at least `guest_speed`
    of its own; the host where the guest runs fastest wins. `speeds` says how fast each would run."""

    def __init__(self, host_loss: float, guest_speed: float) -> None:
        self.host_loss = host_loss
        self.guest_speed = guest_speed

    def speeds(self, guest: Job, host: Job, lent: float) -> tuple[float, float] | None:
        """(host's speed, guest's speed) with `lent` of the host's cores lent; None: not a host to judge."""
        raise NotImplementedError

    def chose(self, host: Job, guest: Job) -> None:
        """A lending was decided."""

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        best: tuple[float, Job, float] | None = None
        for host in hosts:
            for tenths in range(9, 0, -1):
                judged = self.speeds(guest, host, min(tenths / 10 * host.cores, guest.cores))
                if judged is None:
                    break
                host_speed, fast = judged
                if host_speed < 1 - self.host_loss:
                    continue
                if fast >= self.guest_speed:
                    if best is None or fast > best[0]:
                        best = (fast, host, tenths / 10)
                    break
        if best is None:
            return None
        self.chose(best[1], guest)
        return Lending(best[1], best[2])


class Oracle(GreedyLender):
    """Lends as the interference model says is cheap enough (see the module docstring)."""

    name = "oracle"

    def __init__(self, host_loss: float, guest_speed: float, profiles: dict[str, StageProfile] | None = None) -> None:
        super().__init__(host_loss, guest_speed)
        self.profiles = profiles or shipped_profiles()

    def speeds(self, guest: Job, host: Job, lent: float) -> tuple[float, float]:
        mine, theirs = self.profiles[guest.stage or ""], self.profiles[host.stage or ""]
        kept = host.cores - lent
        return speed(theirs, host.cores, kept, mine, lent), speed(mine, guest.cores, lent, theirs, kept)


class LiveCpuModel(GreedyLender):
    """The oracle's rule on measured CPU alone: a host keeps `kept / busy` of its speed, a guest runs
    at `lent / demand`, where `busy` is the host's measured busy CPUs and `demand` the guest kind's
    busy CPUs when one last ran alone at full quota (its requested cores before)."""

    name = "live-model"

    def __init__(self, host_loss: float, guest_speed: float) -> None:
        super().__init__(host_loss, guest_speed)
        self.demands: dict[tuple[str, int], float] = {}
        self.shared: set[int] = set()

    def speeds(self, guest: Job, host: Job, lent: float) -> tuple[float, float] | None:
        if not measured_now(host):
            return None
        demand = self.demands.get((guest.stage or "", guest.cores), float(guest.cores))
        return min(1.0, (host.cores - lent) / max(busy_cpus(host), 1e-9)), min(1.0, lent / demand)

    def chose(self, host: Job, guest: Job) -> None:
        self.shared.update((host.id, guest.id))

    def observe(self, job: Job, now: float) -> None:
        alone = job.id not in self.shared and job.usage is not None and job.usage.quota >= job.cores
        if alone and job.state is JobState.DONE:
            self.demands[(job.stage or "", job.cores)] = busy_cpus(job)
        self.shared.discard(job.id)


RULES: dict[str, Callable[[float, float], CoschedulePolicy]] = {"oracle": Oracle, "live CPU model": LiveCpuModel}
"""What `--ceiling` sweeps: the oracle, and its rule on what a live scheduler measures."""


@dataclass(frozen=True, slots=True)
class Point:
    """One oracle setting on one cluster size, against space sharing on the same mix."""

    host_loss: float
    guest_speed: float
    run: Run
    degradation: float
    wait_change: float
    response_change: float


def sweep(size: int, base: Run, rule: str = "oracle") -> list[Point]:
    points = []
    for host_loss, guest_speed in itertools.product(HOST_LOSSES, GUEST_SPEEDS):
        run = run_once(size, "oracle", base.seed, policy=RULES[rule](host_loss, guest_speed))
        overall, ref = run.overall(), base.overall()
        points.append(
            Point(
                host_loss,
                guest_speed,
                run,
                Experiment([base, run]).degradation(size, "oracle"),
                overall["wait_h"] / ref["wait_h"] - 1,
                overall["response_h"] / ref["response_h"] - 1,
            )
        )
    return points


def ceiling(points: Sequence[Point], key: str) -> Point | None:
    """The point with the lowest `key` change among those within the degradation budget, none failed."""
    fine = [p for p in points if p.degradation <= DEGRADATION_BUDGET and not p.run.overall()["failed"]]
    return min(fine, key=lambda p: getattr(p, key), default=None)


def format_ceiling(experiment: Experiment, sweeps: dict[int, dict[str, list[Point]]]) -> str:
    """Per size: Static and ASAx as measured, and each rule's best wait and response within 5%."""
    from cosched.reporting.report import format_table

    rows = []
    for size, by_rule in sorted(sweeps.items()):
        base = experiment.select(size, "slurm")
        ref_wait = sum(r.overall()["wait_h"] for r in base) / len(base)
        ref_resp = sum(r.overall()["response_h"] for r in base) / len(base)
        for strategy, label in (("static", "Static 50%"), ("asax", "ASAx")):
            runs = experiment.select(size, strategy)
            if not runs:
                continue
            wait = sum(r.overall()["wait_h"] for r in runs) / len(runs)
            resp = sum(r.overall()["response_h"] for r in runs) / len(runs)
            rows.append(
                _row(size, label, wait / ref_wait - 1, resp / ref_resp - 1, experiment.degradation(size, strategy))
            )
        for rule, points in by_rule.items():
            for key, goal in (("wait_change", "best wait"), ("response_change", "best response")):
                best = ceiling(points, key)
                if best is None:
                    rows.append({"size": size, "strategy": f"{rule}, {goal}: none within 5%"})
                    continue
                named = f"{rule}, {goal} (host loss <= {best.host_loss:g}, guest speed >= {best.guest_speed:g})"
                rows.append(_row(size, named, best.wait_change, best.response_change, best.degradation))
    return format_table(
        rows,
        title="What lending can gain at <= 5% degradation: an oracle that knows every stage's interference "
        "profile, and its rule on measured CPU alone; best of "
        f"{len(HOST_LOSSES) * len(GUEST_SPEEDS)} settings each (seed of the first run)",
    )


def _row(size: int, strategy: str, wait: float, response: float, degradation: float) -> dict[str, object]:
    return {
        "size": size,
        "strategy": strategy,
        "wait vs space sharing": f"{100 * wait:+.0f}%",
        "response vs space sharing": f"{100 * response:+.0f}%",
        "degradation %": f"{100 * degradation:.1f}",
    }

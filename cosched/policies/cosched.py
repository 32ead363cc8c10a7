"""Co-scheduling baselines: space sharing (never lend) and Static (always lend half)."""

from __future__ import annotations

from collections.abc import Sequence

from cosched.core.view import SchedulerView
from cosched.errors import ConfigError
from cosched.model import Job
from cosched.policies.base import CoschedulePolicy, Lending


class SpaceSharing(CoschedulePolicy):
    """Each job has its cores to itself: the Slurm-like EASY baseline."""

    name = "none"
    active = False

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        return None


class Static(CoschedulePolicy):
    """Always lend a fixed fraction (50%, the ASAx paper's section 4.4) of the first
    running job that can hold the guest, whatever either job does with its CPU."""

    name = "static"

    def __init__(self, fraction: float = 0.5) -> None:
        if not 0.0 < fraction < 1.0:
            raise ConfigError(f"static lending fraction must be in (0, 1), got {fraction}")
        self.fraction = fraction

    def lend(self, view: SchedulerView, guest: Job, hosts: Sequence[Job]) -> Lending | None:
        return Lending(hosts[0], self.fraction)

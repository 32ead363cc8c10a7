"""Placement policies: which held offers a job's gang is built from."""

from __future__ import annotations

from cosched.core.events import Slots
from cosched.core.pool import ResourcePool
from cosched.model import Job
from cosched.policies.base import PlacementPolicy


class FirstFit(PlacementPolicy):
    """Lowest-numbered nodes first; the gang launches only when it fits whole."""

    name = "first-fit"

    def place(self, job: Job, pool: ResourcePool) -> Slots | None:
        return pool.first_fit(job)

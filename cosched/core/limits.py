"""A cap on the cores each user's running jobs hold (Slurm's QOS `MaxTRESPerUser=cpu=N`).

Why in the core: a limit decides which jobs may start, so it must hold in replay and in the
daemon alike, whatever the queue, backfill and co-scheduling policies choose. A job whose
start would take its user past the cap is out of the policies' sight for the pass, as a held
job is: it holds no reservation and blocks no one (Slurm reports it `QOSMaxCpuPerUserLimit`).
A co-scheduled guest counts its cores as any job does: it holds them, lent or not.
"""

from __future__ import annotations

from cosched.model import Job


class CoreLimit:
    """Each user's cores held by running jobs, against `max_cores`."""

    def __init__(self, max_cores: int) -> None:
        self.max_cores = max_cores
        self.held: dict[int, int] = {}

    def admits(self, job: Job) -> bool:
        """Whether `job` may start now without taking its user past the cap."""
        return self.held.get(job.user, 0) + job.cores <= self.max_cores

    def refusal(self, job: Job) -> str:
        """Why `job` can never start under the cap ('' if it can)."""
        if job.cores <= self.max_cores:
            return ""
        return f"job {job.id} asks for {job.cores} cores, a user may hold at most {self.max_cores} (max_cores_per_user)"

    def took(self, job: Job) -> None:
        self.held[job.user] = self.held.get(job.user, 0) + job.cores

    def gave_back(self, job: Job) -> None:
        left = self.held.get(job.user, 0) - job.cores
        if left > 0:
            self.held[job.user] = left
        else:
            self.held.pop(job.user, None)

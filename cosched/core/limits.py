"""Caps no start may break: each user's running cores and jobs (Slurm's QOS `MaxTRESPerUser=cpu=N`
and `MaxJobsPerUser=N`), and each workflow's running jobs (a job array's throttle, sbatch's
`--array 0-99%N`).

Why in the core: a limit decides which jobs may start, so it must hold in replay and in the
daemon alike, whatever the queue, backfill and co-scheduling policies choose. A job whose
start would break a cap is out of the policies' sight for the pass, as a held job is: it holds
no reservation and blocks no one (Slurm reports it `QOSMaxCpuPerUserLimit`,
`QOSMaxJobsPerUserLimit` or `JobArrayTaskLimit`). A co-scheduled guest counts as any job does:
it holds its cores, lent or not.
"""

from __future__ import annotations

from cosched.model import Job

USER_CORES = "QOSMaxCpuPerUserLimit"
USER_JOBS = "QOSMaxJobsPerUserLimit"
WORKFLOW_JOBS = "JobArrayTaskLimit"


class Limits:
    """Each user's cores held by running jobs and their count, against `max_cores` and `max_jobs`
    (0: no cap), and each throttled workflow's running jobs, against its jobs' `throttle`."""

    def __init__(self, max_cores: int = 0, max_jobs: int = 0) -> None:
        self.max_cores = max_cores
        self.max_jobs = max_jobs
        self.held: dict[int, int] = {}
        self.jobs: dict[int, int] = {}
        """Running jobs of each user (with `max_jobs`)."""
        self.running: dict[str, int] = {}
        """Running jobs of each workflow whose jobs have a throttle."""

    def admits(self, job: Job) -> bool:
        """Whether `job` may start now without breaking a cap."""
        return not self.blocking(job)

    def blocking(self, job: Job) -> str:
        """The cap `job`'s start would break now, in Slurm's words ('' if none)."""
        if self.max_cores and self.held.get(job.user, 0) + job.cores > self.max_cores:
            return USER_CORES
        if self.max_jobs and self.jobs.get(job.user, 0) >= self.max_jobs:
            return USER_JOBS
        if job.throttle and self.running.get(job.workflow or "", 0) >= job.throttle:
            return WORKFLOW_JOBS
        return ""

    def refusal(self, job: Job) -> str:
        """Why `job` can never start under the caps ('' if it can)."""
        if not self.max_cores or job.cores <= self.max_cores:
            return ""
        return f"job {job.id} asks for {job.cores} cores, a user may hold at most {self.max_cores} (max_cores_per_user)"

    def took(self, job: Job) -> None:
        if self.max_cores:
            self.held[job.user] = self.held.get(job.user, 0) + job.cores
        if self.max_jobs:
            self.jobs[job.user] = self.jobs.get(job.user, 0) + 1
        if job.throttle:
            workflow = job.workflow or ""
            self.running[workflow] = self.running.get(workflow, 0) + 1

    def gave_back(self, job: Job) -> None:
        if self.max_cores:
            _less(self.held, job.user, job.cores)
        if self.max_jobs:
            _less(self.jobs, job.user, 1)
        if job.throttle:
            _less(self.running, job.workflow or "", 1)


def _less(counts: dict, key: object, amount: int) -> None:  # type: ignore[type-arg]
    left = counts.get(key, 0) - amount
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)

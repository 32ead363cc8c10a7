"""Workflows in flight: each stage becomes a job when its predecessors succeed.

This is the paper's model (and Slurm's with job dependencies): a workflow is
not one job but a chain of stage jobs, each queued only once it can run. A
failed stage fails its workflow, and the stages that depended on it are never
submitted. Replay and the daemon both keep their workflows here; what a stage
job asks for (walltime, and in replay its runtime) comes from a `StageSizer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count

from cosched.core.events import Event, JobEnded, JobSubmitted
from cosched.model import Job
from workloads.workflows import Stage, Workflow

StageSizer = Callable[[Workflow, Stage], tuple[float, float | None]]
"""(walltime, runtime or None) for one stage of one workflow."""


@dataclass(slots=True)
class WorkflowRun:
    """One submitted workflow and how far it got."""

    id: str
    workflow: Workflow
    submitted: float
    jobs: dict[str, Job] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    failed_stage: str | None = None

    @property
    def finished(self) -> bool:
        return self.failed_stage is not None or len(self.done) == len(self.workflow.stages)

    @property
    def runtime(self) -> float:
        """Sum of its stages' run times: the paper's "total runtime" of a workflow."""
        return sum(j.end - j.start for j in self.jobs.values() if j.end >= 0)

    @property
    def response(self) -> float:
        """From submission to the end of its last stage."""
        return max((j.end for j in self.jobs.values()), default=self.submitted) - self.submitted


class WorkflowRuns:
    """Every workflow submitted, and the stage jobs they produced."""

    def __init__(self, sizer: StageSizer, first_job_id: int = 1) -> None:
        self.sizer = sizer
        self.runs: dict[str, WorkflowRun] = {}
        self._ids: Iterator[int] = count(first_job_id)
        self._stage_of: dict[int, tuple[WorkflowRun, str]] = {}

    def submit(self, workflow: Workflow, now: float) -> list[Job]:
        """Start a workflow: its first ready stages, as jobs submitted at `now`."""
        run = WorkflowRun(f"{workflow.name}#{len(self.runs) + 1}", workflow, now)
        self.runs[run.id] = run
        return self._release(run, now)

    def react(self, now: float, events: list[Event]) -> list[Event]:
        """The submissions that stage ends make possible (the replay driver's hook)."""
        submitted: list[Event] = []
        for event in events:
            if not isinstance(event, JobEnded) or event.job_id not in self._stage_of:
                continue
            run, stage = self._stage_of.pop(event.job_id)
            if event.failed:
                run.failed_stage = stage
                continue
            run.done.add(stage)
            submitted += [JobSubmitted(job) for job in self._release(run, now)]
        return submitted

    def _release(self, run: WorkflowRun, now: float) -> list[Job]:
        jobs = []
        for stage in run.workflow.to_release(run.done, run.jobs, run.failed_stage is not None):
            walltime, runtime = self.sizer(run.workflow, stage)
            job = Job(
                id=next(self._ids),
                submit=now,
                cores=run.workflow.cores,
                walltime=walltime,
                runtime=runtime,
                memory=run.workflow.memory_per_core,
                workflow=run.id,
                stage=stage.app_class,
                tasks=stage.tasks,
                parallel=stage.parallel,
            )
            run.jobs[stage.name] = job
            self._stage_of[job.id] = (run, stage.name)
            jobs.append(job)
        return jobs

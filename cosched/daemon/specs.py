"""What a user may submit: a job or a workflow, checked field by field.

Pydantic models, so the API rejects a bad field with a message naming it and
the OpenAPI description is generated from the same definitions. Checks that
need the running daemon (is the image there, does the cluster have that many
cores) are in `Daemon.check_*`, not here.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from cosched.daemon import image_names, start_window
from cosched.errors import ConfigError
from workloads.workflows import Stage, Workflow


def _image_reference(name: str) -> str:
    if problem := image_names.problem(name):
        raise ValueError(problem)
    return name


NAME_LENGTH = 128
"""The longest name of a job, workflow, stage or application class."""
MAX_ENV = 128
"""The most environment variables a job may set."""
MAX_DATA_DIRS = 16
"""The most data directories a job may mount."""
MAX_COMMAND_STRING = 16 * 1024
"""The longest command taken as one string, split as a shell would; longer ones come as a list.

Why: shlex copies a token for each character it adds, so past some KiB splitting grows with the
square of a token's length, and the API validates a body on its event loop: a 1 MiB command held
every request for 13 s. 16 KiB (four of the longest arguments) is more than anyone types as one
line and splits in about 10 ms at worst; a list may still carry 256 arguments of 4096 characters."""
MAX_WORKFLOW_COMMAND_STRINGS = 64 * 1024
"""The most characters of commands given as strings in one workflow, its stages' and its own.

Why: even under `MAX_COMMAND_STRING` shlex splits only about 2.5 MB a second: 64 stages of 16 KiB
strings (a 1 MiB body) held the event loop for half a second per request. 64 KiB of them split in
30 ms."""
Name = Annotated[str, Field(min_length=1, max_length=NAME_LENGTH, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")]
AppClass = Annotated[str, Field(min_length=1, max_length=NAME_LENGTH, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")]
Image = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_image_reference)]
MAX_WALLTIME = 366 * 86400.0
MIN_MEMORY_MIB = 6
"""The least memory limit Docker sets: a job asking less would be refused at its launch."""
MAX_ID = (1 << 63) - 1
"""The largest job or workflow id SQLite can hold: a dependency naming a larger one was a 500."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    @field_validator(
        "cores", "memory_mib", "walltime", "tasks", "job", "workflow", "max_running", mode="before", check_fields=False
    )
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        """Lax mode takes `true` for 1 (`walltime = true` ran a job for one second): numbers are
        otherwise taken as written (4.0 cores, "4"), booleans refused."""
        if isinstance(value, bool):
            raise ValueError("must be a number, not a boolean")
        return value


def _command(value: Any) -> Any:
    """A command given as one string, split as a shell would (`sh -c 'exit 3'`); a list as it is."""
    if isinstance(value, str):
        if len(value) > MAX_COMMAND_STRING:  # refused before shlex sees it: see MAX_COMMAND_STRING
            raise ValueError(
                f"{len(value)} characters in one string, at most {MAX_COMMAND_STRING}: send a longer command as a list"
            )
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split command: {exc}") from None
    return value


class Container(_Strict):
    """What runs: an image from the local engine, a command, environment, data directories."""

    image: Image | None = None
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(None, max_length=256)
    env: dict[
        Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
        Annotated[str, Field(max_length=4096)],
    ] = Field(default_factory=dict, max_length=MAX_ENV)
    data_dirs: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        default_factory=list, max_length=MAX_DATA_DIRS
    )

    _split = field_validator("command", mode="before")(_command)

    @field_validator("command")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        """A command with no program (`[]`, or `[""]`) would only fail at launch, in runc's words."""
        if value is not None and not (value and value[0]):
            raise ValueError("must not be empty" if not value else "its first word, the program, must not be empty")
        return value

    @field_validator("command", "data_dirs", "env")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        """A NUL cannot reach a process (execve ends each string there) nor a path: refused here, not
        by the engine at the launch."""
        texts = value.values() if isinstance(value, dict) else value or ()
        if any("\0" in text for text in texts):
            raise ValueError("must not contain a NUL character")
        return value

    @field_validator("data_dirs")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        """A directory named twice ('/d' and '/d/') would be two mounts on one place."""
        if len(once(value)) < len(value):
            raise ValueError("names a directory twice")
        return value


def once(paths: Iterable[str]) -> list[str]:
    """`paths` in their order, each directory once however it is written ('/d', '/d/', '/d/.')."""
    first: dict[str, str] = {}
    for path in paths:
        first.setdefault(os.path.normpath(path), path)
    return list(first.values())


class Dependency(_Strict):
    """Start only once another job, or a whole workflow, has ended so (sbatch's --dependency):
    `afterok` after it succeeded, `afternotok` after it failed or was cancelled, `afterany`
    after either. A workflow has ended once no stage of it is queued or running. `singleton`
    names nothing: once no earlier job of its user with its name is queued or running."""

    kind: Literal["afterok", "afternotok", "afterany", "singleton"]
    job: int | None = Field(None, gt=0, le=MAX_ID)
    workflow: int | None = Field(None, gt=0, le=MAX_ID)

    @model_validator(mode="after")
    def _one_target(self) -> Dependency:
        targets = (self.job is not None) + (self.workflow is not None)
        if targets != (self.kind != "singleton"):
            if self.kind == "singleton":
                raise ValueError("singleton names no job or workflow")
            raise ValueError(f"{self.kind} names one job or one workflow")
        return self


Dependencies = Annotated[list[Dependency], Field(default_factory=list, max_length=64)]


class JobSpec(Container):
    """One rigid job: `cores` CPUs (its gang), `memory_mib` in all, killed at `walltime` seconds."""

    name: Name = "job"
    image: Image  # type: ignore[assignment]
    command: list[Annotated[str, Field(max_length=4096)]] = Field(min_length=1, max_length=256)  # type: ignore[assignment]
    cores: int = Field(gt=0, le=1 << 16)
    memory_mib: int | None = Field(None, ge=MIN_MEMORY_MIB, le=1 << 30)
    walltime: float = Field(gt=0, le=MAX_WALLTIME, allow_inf_nan=False)
    app_class: AppClass = "unknown"
    tasks: int = Field(1, ge=1, le=1 << 30)
    parallel: bool = True
    span: bool | None = None
    """May its cores come from several nodes: on one host (virtual nodes) yes unless false; on
    Mesos only if true, and it then runs as one task per agent, each given its part (COSCHED_PART
    of COSCHED_PARTS): a job made to be spread, such as an MPI rank per agent."""
    begin: float | str | None = None
    """Earliest start (Slurm's --begin): epoch seconds, or `+SECONDS` / `now+SECONDS` after
    acceptance; stored absolute. Held (pending, `begins at ...`) until then."""
    latest_start: float | str | None = None
    """Latest start, same forms: still pending then, the job fails with that reason."""
    coschedule: bool = True
    """False: co-scheduling leaves it alone (its cores never lent, never a guest on another's): a
    job whose timing must be its own, a benchmark, a latency-bound MPI run."""
    after: Dependencies
    """Held (pending, `Dependency`) until every one is met; cancelled once one never can be."""

    _window = field_validator("begin", "latest_start", mode="before")(start_window.parse)


class JobUpdate(_Strict):
    """What may change of a queued or running job (Slurm's `scontrol update`): its walltime."""

    walltime: float = Field(gt=0, le=MAX_WALLTIME, allow_inf_nan=False)


class StageSpec(Container):
    """A workflow stage: its own job once `depends` have succeeded."""

    name: Name
    app_class: AppClass | None = None
    walltime: float | None = Field(None, gt=0, le=MAX_WALLTIME, allow_inf_nan=False)
    parallel: bool = True
    tasks: int = Field(1, ge=1, le=1 << 30)
    depends: list[Name] = Field(default_factory=list, max_length=256)


class WorkflowSpec(Container):
    """Stages sharing `cores` and `memory_mib`; image, command, walltime default to the workflow's."""

    name: Name
    app: Name = "custom"
    cores: int = Field(gt=0, le=1 << 16)
    memory_mib: int | None = Field(None, ge=MIN_MEMORY_MIB, le=1 << 30)
    walltime: float | None = Field(None, gt=0, le=MAX_WALLTIME, allow_inf_nan=False)
    stages: list[StageSpec] = Field(min_length=1, max_length=1024)
    begin: float | str | None = None
    """No stage starts before it (as a job's `begin`); stages released after it start at once.
    A workflow has no latest start: a stage expiring midway would strand the ones after it."""
    after: Dependencies
    """Every stage waits for them, as a job's `after`."""
    coschedule: bool = True
    """Every stage's, as a job's `coschedule`."""
    max_running: int | None = Field(None, ge=1, le=1024)
    """At most this many of its stages run at once (a job array's throttle, sbatch's `%N`); the
    others wait in the queue, `JobArrayTaskLimit`."""

    _window = field_validator("begin", mode="before")(start_window.parse)

    @model_validator(mode="before")
    @classmethod
    def _commands_in_all(cls, data: Any) -> Any:
        """Before any stage's command is split: see MAX_WORKFLOW_COMMAND_STRINGS."""
        if isinstance(data, dict):
            stages = data["stages"] if isinstance(data.get("stages"), list) else []
            commands = [data.get("command"), *(s.get("command") for s in stages if isinstance(s, dict))]
            total = sum(len(command) for command in commands if isinstance(command, str))
            if total > MAX_WORKFLOW_COMMAND_STRINGS:
                raise ValueError(
                    f"command: {total} characters of commands as strings in the workflow, at most"
                    f" {MAX_WORKFLOW_COMMAND_STRINGS}: send them as lists"
                )
        return data

    @model_validator(mode="after")
    def _complete(self) -> WorkflowSpec:
        for stage in self.stages:
            for field in ("image", "command", "walltime"):
                if getattr(stage, field) is None and getattr(self, field) is None:
                    raise ValueError(f"stages.{stage.name}.{field}: missing (and no workflow default)")
            # Each within its own limit, the workflow's and the stage's together may pass a job's: the
            # stage's job was then refused at submission by an error no handler knew (a 500).
            merged = self._merged(stage)
            for field, most, made_of in _MERGED_LIMITS:
                size = len(merged[field])
                if size > most:
                    raise ValueError(
                        f"stages.{stage.name}.{field}: its job would have {size} {made_of}, at most {most}"
                    )
        try:
            self.dag()
        except ConfigError as exc:
            # The DAG's own message names the workflow and may say "stages:" itself; the API's
            # error names the field once: "stages: dependency cycle a -> b -> a".
            problem = str(exc).removeprefix(f"workflow {self.name!r}: ").removeprefix("stages: ")
            raise ValueError(f"stages: {problem}") from None
        return self

    def dag(self) -> Workflow:
        """The stages as a validated DAG (unique names, known dependencies, no cycle)."""
        stages = tuple(
            Stage(s.name, s.app_class or f"{self.app}.{s.name}", s.parallel, s.tasks, tuple(s.depends))
            for s in self.stages
        )
        return Workflow(self.name, self.app, self.cores, 0, stages)

    def path_of(self, stage_name: str, field: str) -> str:
        """Where a stage's job got `field` from: the stage's own key, or the workflow's shared one."""
        stage = next(s for s in self.stages if s.name == stage_name)
        return f"stages.{stage_name}.{field}" if getattr(stage, field, None) else field

    def _merged(self, stage: StageSpec) -> dict[str, Any]:
        """The fields of a stage's job made of the workflow's and the stage's (`_MERGED_LIMITS`)."""
        return {
            "name": f"{self.name}.{stage.name}",
            "app_class": stage.app_class or f"{self.app}.{stage.name}",
            "env": {**self.env, **stage.env},
            "data_dirs": once([*self.data_dirs, *stage.data_dirs]),
        }

    def job_spec(self, stage_name: str) -> JobSpec:
        """The job one stage is submitted as."""
        stage = next(s for s in self.stages if s.name == stage_name)
        return JobSpec.model_validate(
            dict(
                image=stage.image or self.image,
                command=stage.command or self.command,
                cores=self.cores,
                memory_mib=self.memory_mib,
                walltime=stage.walltime or self.walltime,
                tasks=stage.tasks,
                parallel=stage.parallel,
                begin=self.begin,
                after=[dependency.model_dump() for dependency in self.after],
                coschedule=self.coschedule,
                **self._merged(stage),
            )
        )


_MERGED_LIMITS = (
    ("name", NAME_LENGTH, "characters (the workflow's name, a dot, the stage's)"),
    ("app_class", NAME_LENGTH, "characters (app, a dot, the stage's name)"),
    ("env", MAX_ENV, "variables (the workflow's and the stage's)"),
    ("data_dirs", MAX_DATA_DIRS, "directories (the workflow's and the stage's)"),
)
"""The job limits a stage's job can pass while the workflow and the stage each keep theirs:
(field, most, what its size counts)."""

"""Scientific workflows as DAGs of stages: the four of the ASAx paper, and TOML files.

Why a workflow is a DAG of stages
---------------------------------
The ASAx evaluation (Souza et al., section 4.2) submits every workflow stage as its
own rigid job, all stages asking for the workflow's core count, and a stage is
submitted when the stages it depends on have finished. A co-scheduler learns per
*application class* (a stage type within its application, "montage.project"), so a
`Stage` carries that class: the replay's interference model and the ASAx experts key
their profiles and weights on it. `parallel` says whether the stage uses every core
it is given or one of them (what makes lending its idle quota cheap), and `tasks` is
the stage's unit of progress (tasks done / total feeds the happiness metric).

Both the trace replay and the live daemon use these definitions, so nothing here
knows about either: a `Workflow` is plain, frozen, validated data.

Workflow TOML format (`load_workflow`)
--------------------------------------
::

    [workflow]
    name = "blast-16"            # unique name of this submission (Job.workflow)
    app = "blast"                # the application (APPS: the paper's four)
    cores = 16                   # every stage's job asks for this many cores
    memory_per_core = 3840       # MiB per core, optional (0 = not tracked)

    [[stage]]
    name = "split"               # unique within the workflow
    app_class = "blast.split"    # the class profiles and expert weights are kept for
    parallel = false             # true: uses all cores; false: one core
    tasks = 1                    # optional, default 1
    depends = []                 # optional: names of stages that must finish first

    [[stage]]
    name = "blastn"
    app_class = "blast.blastn"
    parallel = true
    tasks = 128
    depends = ["split"]

`workflow_to_toml` writes this format, so any workflow (the paper's included) can be
exported, edited and loaded back.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from cosched.errors import ConfigError, SchedulingError

__all__ = [
    "APPS",
    "MIX_CORES",
    "PAPER_MEMORY_PER_CORE",
    "Stage",
    "Workflow",
    "load_workflow",
    "paper_mix",
    "paper_workflows",
    "workflow_to_toml",
]

APPS: Final[tuple[str, ...]] = ("montage", "blast", "statistics", "synthetic")
"""The applications the paper evaluates; `Workflow.app` must be one of them."""

MIX_CORES: Final[Mapping[str, tuple[int, ...]]] = {
    "montage": (8, 16, 32, 64),
    "blast": (8, 16, 32, 64),
    "statistics": (8, 16, 32, 64),
    "synthetic": (16, 32, 64),
}
"""Core counts of the section 4.4 mix: 15 workflows per repetition."""

PAPER_MEMORY_PER_CORE: Final = 3840
"""MiB per core: the paper's NumaScale machine has 1.11 TB for 288 cores (~3.9 GiB each).

Table 2 reports memory use as a share of the allocation, so every paper workflow asks
for a fair per-core share of the machine and the profiles say how much of it is used.
"""


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a workflow, submitted as its own job once `depends` have finished.

    Checked by the `Workflow` holding it, so that errors can name the workflow.
    `depends` may be given as any iterable of names; it is stored as a tuple.
    """

    name: str
    app_class: str
    parallel: bool
    tasks: int = 1
    depends: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.depends, tuple):
            object.__setattr__(self, "depends", tuple(self.depends))


@dataclass(frozen=True, slots=True)
class Workflow:
    """A named submission of one application: stages, each a job of `cores` cores.

    Construction validates (ConfigError, one line naming the workflow and field):
    a non-empty app, cores > 0, memory_per_core >= 0, at least one stage, unique stage
    names, known dependencies, no dependency cycle, tasks >= 1.
    """

    name: str
    app: str
    cores: int
    memory_per_core: int
    stages: tuple[Stage, ...]
    _order: tuple[Stage, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.stages, tuple):
            object.__setattr__(self, "stages", tuple(self.stages))
        self._validate_fields()
        object.__setattr__(self, "_order", self._toposort())

    # -- validation ---------------------------------------------------------------

    def _error(self, message: str) -> ConfigError:
        return ConfigError(f"workflow {self.name!r}: {message}")

    def _validate_fields(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"workflow {self.name!r}: name must be a non-empty string")
        if not isinstance(self.app, str) or not self.app:
            raise self._error(f"app must be a non-empty string, got {self.app!r}")
        if not _is_int(self.cores) or self.cores <= 0:
            raise self._error(f"cores must be a positive integer, got {self.cores!r}")
        if not _is_int(self.memory_per_core) or self.memory_per_core < 0:
            raise self._error(f"memory_per_core must be an integer >= 0 (MiB), got {self.memory_per_core!r}")
        if not self.stages:
            raise self._error("stages: a workflow needs at least one stage")
        seen: set[str] = set()
        for stage in self.stages:
            self._validate_stage(stage)
            if stage.name in seen:
                raise self._error(f"stages: duplicate stage name {stage.name!r}")
            seen.add(stage.name)
        for stage in self.stages:
            for dep in stage.depends:
                if dep not in seen:
                    raise self._error(f"stage {stage.name!r}: depends on unknown stage {dep!r}")

    def _validate_stage(self, stage: Stage) -> None:
        if not isinstance(stage, Stage):
            raise self._error(f"stages: expected Stage objects, got {type(stage).__name__}")
        if not isinstance(stage.name, str) or not stage.name:
            raise self._error(f"stage {stage.name!r}: name must be a non-empty string")
        if not isinstance(stage.app_class, str) or not stage.app_class:
            raise self._error(f"stage {stage.name!r}: app_class must be a non-empty string")
        if not isinstance(stage.parallel, bool):
            raise self._error(f"stage {stage.name!r}: parallel must be true or false, got {stage.parallel!r}")
        if not _is_int(stage.tasks) or stage.tasks < 1:
            raise self._error(f"stage {stage.name!r}: tasks must be an integer >= 1, got {stage.tasks!r}")
        if not all(isinstance(dep, str) for dep in stage.depends):
            raise self._error(f"stage {stage.name!r}: depends must be stage names")

    def _toposort(self) -> tuple[Stage, ...]:
        """Kahn's algorithm by rounds: each round takes every stage whose dependencies all came in
        the rounds before, in declaration order (deterministic). Linear in the stages and their
        dependencies: scanning every stage at each round took 150 ms for a chain of 1,024,
        at submission (on the API's event loop) and at each stage's end (in the pass)."""
        position = {stage.name: index for index, stage in enumerate(self.stages)}
        waiting = {stage.name: len(set(stage.depends)) for stage in self.stages}
        dependants: dict[str, list[Stage]] = {}
        for stage in self.stages:
            for dep in set(stage.depends):
                dependants.setdefault(dep, []).append(stage)
        order: list[Stage] = []
        batch = [stage for stage in self.stages if not waiting[stage.name]]
        while batch:
            order += batch
            freed = []
            for stage in batch:
                for dependant in dependants.get(stage.name, ()):
                    waiting[dependant.name] -= 1
                    if not waiting[dependant.name]:
                        freed.append(dependant)
            batch = sorted(freed, key=lambda stage: position[stage.name])
        if len(order) < len(self.stages):
            placed = {stage.name for stage in order}
            left = {stage.name: set(stage.depends) - placed for stage in self.stages if stage.name not in placed}
            raise self._error(f"stages: dependency cycle {' -> '.join(_find_cycle(left))}")
        return tuple(order)

    # -- queries ----------------------------------------------------------------------

    def stage(self, name: str) -> Stage:
        """The stage called `name` (SchedulingError if there is none: a caller's bug)."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise SchedulingError(f"workflow {self.name!r} has no stage {name!r}")

    def topological_order(self) -> tuple[Stage, ...]:
        """Stages so that each comes after everything it depends on."""
        return self._order

    def ready(self, done: Iterable[str]) -> list[Stage]:
        """Stages not yet done whose dependencies have all succeeded, in topological order.

        `done` is the set of stage names that finished successfully; a stage whose
        predecessor failed never becomes ready. Unknown names are a caller's bug and
        raise SchedulingError rather than being silently ignored.
        """
        finished = set(done)
        unknown = finished.difference(s.name for s in self.stages)
        if unknown:
            raise SchedulingError(f"workflow {self.name!r} has no stage(s) {', '.join(sorted(unknown))}")
        return [s for s in self._order if s.name not in finished and finished.issuperset(s.depends)]

    def to_release(self, done: Iterable[str], submitted: Iterable[str], failed: bool) -> list[Stage]:
        """The stages to submit now: ready and not submitted yet; none once a stage failed.

        The one release rule: replay's `WorkflowRuns` (in memory) and the
        daemon's `workflow_stages` (in the store) both ask it, so a stage is
        released at the same moment in both worlds.
        """
        if failed:
            return []
        already = set(submitted)
        return [stage for stage in self.ready(done) if stage.name not in already]


def _is_int(value: object) -> bool:
    """An integer that is not a bool (TOML and Python both let True pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _find_cycle(graph: Mapping[str, set[str]]) -> list[str]:
    """One cycle of a graph in which every node has an outgoing edge, as a closed path.

    Kahn's algorithm leaves exactly such a graph behind when there is a cycle, so
    following any edge from any node must revisit a node.
    """
    node = next(iter(graph))
    path: list[str] = []
    index: dict[str, int] = {}
    while node not in index:
        index[node] = len(path)
        path.append(node)
        node = min(graph[node])  # a dependency, itself still in the leftover graph
    return [*path[index[node] :], node]


# -- TOML --------------------------------------------------------------------------

_WORKFLOW_KEYS: Final = {"name": str, "app": str, "cores": int, "memory_per_core": int}
_WORKFLOW_REQUIRED: Final = ("name", "app", "cores")
_STAGE_KEYS: Final = {"name": str, "app_class": str, "parallel": bool, "tasks": int, "depends": list}
_STAGE_REQUIRED: Final = ("name", "app_class", "parallel")


def _check_table(table: Any, keys: Mapping[str, type], required: Iterable[str], where: str) -> None:
    """Missing, unknown and mistyped keys of one TOML table, as one-line ConfigErrors."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    for key in required:
        if key not in table:
            raise ConfigError(f"{where} is missing {key!r}")
    for key, value in table.items():
        if key not in keys:
            raise ConfigError(f"{where} has unknown key {key!r} (known: {', '.join(keys)})")
        expected = keys[key]
        wrong_int = expected is int and isinstance(value, bool)
        if wrong_int or not isinstance(value, expected):
            raise ConfigError(f"{where}: {key} must be {expected.__name__}, got {value!r}")


def _stage_from_toml(table: Any, index: int) -> Stage:
    where = f"[[stage]] #{index + 1}"
    if isinstance(table, dict) and isinstance(table.get("name"), str):
        where = f"stage {table['name']!r}"
    _check_table(table, _STAGE_KEYS, _STAGE_REQUIRED, where)
    depends = table.get("depends", [])
    if not all(isinstance(dep, str) for dep in depends):
        raise ConfigError(f"{where}: depends must be a list of stage names")
    return Stage(
        name=table["name"],
        app_class=table["app_class"],
        parallel=table["parallel"],
        tasks=table.get("tasks", 1),
        depends=tuple(depends),
    )


def workflow_from_dict(document: Mapping[str, Any]) -> Workflow:
    """A workflow from a parsed TOML document (see the module docstring for the format)."""
    unknown = set(document) - {"workflow", "stage"}
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {', '.join(sorted(unknown))}; expected [workflow] and [[stage]]")
    if "workflow" not in document:
        raise ConfigError("missing the [workflow] table")
    head = document["workflow"]
    _check_table(head, _WORKFLOW_KEYS, _WORKFLOW_REQUIRED, "[workflow]")
    stages = document.get("stage", [])
    if not isinstance(stages, list):
        raise ConfigError("stages must be written as [[stage]] tables")
    return Workflow(
        name=head["name"],
        app=head["app"],
        cores=head["cores"],
        memory_per_core=head.get("memory_per_core", 0),
        stages=tuple(_stage_from_toml(table, i) for i, table in enumerate(stages)),
    )


def load_workflow(path: str | Path) -> Workflow:
    """Read and validate a workflow TOML file; any problem is one line naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read workflow file: {reason}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return workflow_from_dict(document)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _toml_value(value: str | int | bool | tuple[str, ...]) -> str:
    # JSON strings (ASCII, escaped) are valid TOML basic strings; booleans are lower case.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


def workflow_to_toml(workflow: Workflow) -> str:
    """The workflow in the format `load_workflow` reads (loading it gives an equal workflow)."""
    lines = ["[workflow]"]
    for key in ("name", "app", "cores", "memory_per_core"):
        lines.append(f"{key} = {_toml_value(getattr(workflow, key))}")
    for stage in workflow.stages:
        lines += ["", "[[stage]]"]
        for key in ("name", "app_class", "parallel", "tasks", "depends"):
            lines.append(f"{key} = {_toml_value(getattr(stage, key))}")
    return "\n".join(lines) + "\n"


# -- The paper's workflows (section 4.2) --------------------------------------------


def _stages(app: str, *specs: tuple[str, bool, int, tuple[str, ...]]) -> tuple[Stage, ...]:
    return tuple(Stage(name, f"{app}.{name}", parallel, tasks, depends) for name, parallel, tasks, depends in specs)


_P, _S = True, False

# Montage: nine stages in two sequential groups and two parallel groups.
#   sequential "metadata":            imgtbl (image table), overlaps (overlap pairs)
#   parallel "reproject and fit":     project (mProjExec), diff (mDiffExec), fit (mFitExec)
#   sequential "background model":    concat (mConcatFit), bgmodel (mBgModel)
#   parallel "correct and co-add":    background (mBgExec), add (mAddMPI)
# overlaps works from the image table, so it runs while project reprojects. Task counts are
# those of a 2MASS mosaic of 96 input images with 264 overlapping pairs, cut in 16 tiles.
_MONTAGE = _stages(
    "montage",
    ("imgtbl", _S, 1, ()),
    ("project", _P, 96, ("imgtbl",)),
    ("overlaps", _S, 1, ("imgtbl",)),
    ("diff", _P, 264, ("project", "overlaps")),
    ("fit", _P, 264, ("diff",)),
    ("concat", _S, 1, ("fit",)),
    ("bgmodel", _S, 1, ("concat",)),
    ("background", _P, 96, ("bgmodel",)),
    ("add", _P, 16, ("background",)),
)

# BLAST: map the query into chunks, search them against the database in parallel, reduce.
_BLAST = _stages(
    "blast",
    ("split", _S, 1, ()),
    ("blastn", _P, 128, ("split",)),
    ("merge", _S, 1, ("blastn",)),
)

# Statistics: two stages, each a sequential sub-stage then a parallel one. The dataset
# (household power, one-minute samples) covers 47 months, one parallel task per month.
_STATISTICS = _stages(
    "statistics",
    ("read", _S, 1, ()),
    ("moments", _P, 47, ("read",)),
    ("regroup", _S, 1, ("moments",)),
    ("correlations", _P, 47, ("regroup",)),
)

# Synthetic: fill memory with over a billion floats on one core, then add and multiply
# them in parallel (100 chunks).
_SYNTHETIC = _stages(
    "synthetic",
    ("fill", _S, 1, ()),
    ("compute", _P, 100, ("fill",)),
)

_PAPER_STAGES: Final[Mapping[str, tuple[Stage, ...]]] = {
    "montage": _MONTAGE,
    "blast": _BLAST,
    "statistics": _STATISTICS,
    "synthetic": _SYNTHETIC,
}


def paper_workflows(cores: int, memory_per_core: int = PAPER_MEMORY_PER_CORE) -> dict[str, Workflow]:
    """The four section 4.2 workflows at `cores` cores, keyed by app, named "<app>-<cores>"."""
    return {
        app: Workflow(f"{app}-{cores}", app, cores, memory_per_core, stages) for app, stages in _PAPER_STAGES.items()
    }


def paper_mix(repeats: int = 3, memory_per_core: int = PAPER_MEMORY_PER_CORE) -> list[Workflow]:
    """The section 4.4 workload: the 15-workflow mix (MIX_CORES) `repeats` times.

    With the paper's 3 repetitions that is 45 submissions. Names are unique per
    submission ("blast-16-r2"), since a workflow's name identifies its jobs.
    """
    if not _is_int(repeats) or repeats < 1:
        raise ConfigError(f"repeats must be a positive integer, got {repeats!r}")
    mix: list[Workflow] = []
    for run in range(1, repeats + 1):
        for app in APPS:
            for cores in MIX_CORES[app]:
                base = paper_workflows(cores, memory_per_core)[app]
                mix.append(replace(base, name=f"{base.name}-r{run}"))
    return mix

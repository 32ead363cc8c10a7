"""The four workflows as the daemon runs them: stage programs in the workflow image.

The replay's DAGs (`workloads.workflows`) say which stages exist and how they
depend on each other; this module turns one into a workflow submission whose
stages are real programs (`workloads.stages`) sharing one data directory. A
first stage, `generate`, makes the workflow's input data: the paper's runs read
existing data sets, and generating them inside the workflow keeps every run
self-contained and its cost visible (it is profiled like any other stage).

The result is the API's JSON body (`WorkflowSpec`), or TOML for
``cosched submit --workflow`` (`spec_to_toml`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from cosched.errors import ConfigError
from workloads.workflows import APPS, paper_workflows

GENERATE = "generate"
STAGE_WALLTIME = 3600.0
"""Default per-stage walltime (s): generous, since real stage times depend on the host."""


JOB_USER = "65534:65534"
"""The daemon's default `docker.job_user`: jobs run as nobody, so their data dir must be its."""


def make_data_dir(path: str | Path, owner: str = JOB_USER) -> Path:
    """Create a job's data directory, owned by the uid:gid jobs run as, so the job can write there.

    Only root can give a directory away; another user gets the directory as
    is and must make it writable for the jobs' user (the daemon that mounts it
    runs as root anyway).
    """
    uid, gid = parse_owner(owner)  # before the directory is made: a bad owner leaves nothing behind
    path = Path(path)
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # Made and given away one component at a time, following no link (as the daemon's own walk to
        # a data dir): `mkdir -p` and `chown` as root followed a link a job had left in its data dir,
        # and gave a host directory to the jobs' user (a helper's audit).
        walked = Path("/")
        for part in Path(os.path.abspath(path)).parts[1:]:
            walked /= part
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise ConfigError(
                    f"data directory {path}: {walked} is a link or not a directory ({exc.strerror})"
                ) from None
            os.close(fd)
            fd = inner
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)
    return path


MAX_ID = 2**32 - 2
"""The largest uid or gid: ids are 32-bit, and 2^32 - 1 is chown's "leave unchanged"."""


def parse_owner(owner: str) -> tuple[int, int]:
    """`uid:gid` (or `uid`, its gid the same number) as numbers; ConfigError naming the text."""
    match = re.fullmatch(r"([0-9]+)(?::([0-9]+))?", owner)
    if match is None or max(int(n) for n in match.groups("0")) > MAX_ID:
        raise ConfigError(f"owner must be UID:GID, whole numbers up to {MAX_ID}, got {owner!r}")
    uid = int(match.group(1))
    return uid, int(match.group(2) or uid)


def stage_module(app: str) -> ModuleType:
    """The stage programs of one application (ConfigError naming the known ones)."""
    if app not in APPS:
        raise ConfigError(f"unknown application {app!r} (known: {', '.join(APPS)})")
    return importlib.import_module(f"workloads.stages.{app}")


def size_params(app: str, size: str = "test", overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A named size's parameters (`SIZES` of the app's module), with overrides applied and checked."""
    module = stage_module(app)
    if size not in module.SIZES:
        raise ConfigError(f"unknown size {size!r} for {app} (known: {', '.join(module.SIZES)})")
    params = dict(module.SIZES[size])
    for key, value in (overrides or {}).items():
        if key not in params:
            raise ConfigError(f"unknown {app} parameter {key!r} (known: {', '.join(params)})")
        params[key] = type(params[key])(value)
    return params


def stage_dag(app: str) -> list[tuple[str, bool, tuple[str, ...]]]:
    """(stage, parallel, depends) in order: `generate`, then the paper's stages after it."""
    stages = paper_workflows(1)[app].stages
    dag: list[tuple[str, bool, tuple[str, ...]]] = [(GENERATE, False, ())]
    for stage in stages:
        dag.append((stage.name, stage.parallel, stage.depends or (GENERATE,)))
    return dag


def real_workflow(
    app: str,
    *,
    cores: int,
    data_dir: str | Path,
    image: str,
    size: str = "test",
    overrides: dict[str, Any] | None = None,
    name: str | None = None,
    walltime: float = STAGE_WALLTIME,
    stage_walltimes: dict[str, float] | None = None,
    memory_mib: int | None = None,
) -> dict[str, Any]:
    """The submission (API JSON) of one workflow at `cores` cores, its data in `data_dir`.

    Every stage gets `walltime` seconds unless `stage_walltimes` names it.
    """
    params = size_params(app, size, overrides)
    tasks = stage_module(app).tasks(params)
    data_dir = str(data_dir)
    if not Path(data_dir).is_absolute():
        raise ConfigError(f"data directory must be an absolute path, got {data_dir!r}")
    settings = [arg for key, value in params.items() for arg in ("--set", f"{key}={value}")]
    stages = []
    for stage, parallel, depends in stage_dag(app):
        stages.append(
            {
                "name": stage,
                "app_class": f"{app}.{stage}",
                "parallel": parallel,
                "tasks": int(tasks[stage]),
                "depends": list(depends),
                "command": ["python3", "-m", "workloads.stages", app, stage, "--dir", data_dir, *settings],
            }
        )
        if stage_walltimes and stage in stage_walltimes:
            stages[-1]["walltime"] = float(stage_walltimes[stage])
    spec: dict[str, Any] = {
        "name": name or f"{app}-{cores}",
        "app": app,
        "cores": cores,
        "image": image,
        "walltime": walltime,
        "data_dirs": [data_dir],
        "stages": stages,
    }
    if memory_mib is not None:
        spec["memory_mib"] = memory_mib
    return spec


def verify(app: str, data_dir: str | Path, size: str = "test", overrides: dict[str, Any] | None = None) -> list[str]:
    """Problems in a finished workflow's outputs (empty: the outputs are right)."""
    return list(stage_module(app).verify(Path(data_dir), size_params(app, size, overrides)))


def spec_to_toml(spec: dict[str, Any]) -> str:
    """A submission as the TOML `cosched submit --workflow` reads: [workflow] and [[stage]] tables."""
    lines = ["[workflow]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in spec.items() if key != "stages"]
    for stage in spec["stages"]:
        lines += ["", "[[stage]]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in stage.items()]
    return "\n".join(lines) + "\n"

"""`cosched calibrate`: measure the real stages and fit the replay's interference model.

Why measure this way
--------------------
The replay's model (`cosched.workflows.interference`) has, per application class, a CPU
share, a memory share, an I/O share, an amount of work and a serial fraction,
and two contention strengths for co-located pairs. Each is fitted from runs
chosen so that it alone explains a difference:

- alone on all ``C`` host cores at full quota: the runtime, the busy CPUs (the
  container's cgroup CPU seconds over its runtime) and the peak memory;
- parallel stages alone on one core: with the run on ``C`` cores, Amdahl's
  serial fraction, and the busy share of one core (``cpu_one_core``);
- alone under a quota of half its measured CPU demand, and under half its
  allocation next to a CPU-bound neighbour on the same cores (what Static
  lending does to a host): together, how much of the stage slows with its CPU
  (the compute share, ``1 - io``: a stage waiting on files or messages barely
  notices a smaller quota), or how much more than its CPU (``throttle_penalty``:
  a stage of short bursts waits out the rest of each period it is throttled in),
  and how bursty its demand is (the stage's throttle sharpness: CFS enforces
  quotas per 100 ms period, so a stage of short bursts is throttled even under a
  quota above its mean). The neighbour matters: on
  an otherwise idle machine a throttled, fsync-bound stage waits far longer
  for its wake-ups than next to a busy neighbour, and lending always has one;
- pairs of stages from different workflows (and two copies of one) on the same
  cores, each under half of them, as Static lending runs them: what remains of
  their slowdown after the quota is contention (``beta_io``, ``beta_mem``).

Every run is a container of the workflow image with a cpuset, a CFS quota and a
memory limit, as the daemon starts them; runtimes come from the engine's start
and finish times, CPU and memory from the container's cgroup (`workloads.stages.usage`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from itertools import combinations_with_replacement
from pathlib import Path
from typing import Any

from cosched.daemon.docker_backend import PROGRESS_PATH, scratch_mounts
from cosched.errors import ConfigError
from cosched.workflows.interference import (
    MAX_THROTTLE_PENALTY,
    InterferenceParams,
    StageProfile,
    cpu_rate,
    runtime_alone,
    shipped_params,
    speed,
)
from workloads.real import size_params, stage_dag, stage_module
from workloads.workflows import APPS

MEMORY_PER_CORE_MIB = 1024
"""Memory per allocated core, as the daemon grants by default (`cluster.default_memory_per_core`)."""
LABEL = "cosched.calibrate"
BURNER = (
    "import os\nfrom multiprocessing import Process\n"
    "def spin():\n    while True: pass\n"
    "ps = [Process(target=spin) for _ in range(int(os.environ['COSCHED_CORES']))]\n"
    "[p.start() for p in ps]; [p.join() for p in ps]\n"
)
"""A CPU-bound guest: one spinning process per core."""


@dataclass(frozen=True, slots=True)
class Measured:
    """One container run: seconds from start to finish, cgroup CPU seconds, peak anonymous memory."""

    wall: float
    cpu_seconds: float
    peak_bytes: int
    cores: int
    quota: float

    @property
    def busy(self) -> float:
        """CPUs kept busy on average."""
        return self.cpu_seconds / self.wall if self.wall > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StageMeasurements:
    app_class: str
    parallel: bool
    tasks: int
    full: Measured
    one_core: Measured | None
    throttled: Measured
    half: Measured


@dataclass(frozen=True, slots=True)
class PairMeasurement:
    """Two stages started together on the same cores, each under `quota` CPUs."""

    first: str
    second: str
    quota: float
    first_wall: float
    second_wall: float


# -- Fitting (pure) ---------------------------------------------------------------------


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


SHARPNESS_GRID = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
"""Throttle sharpness values tried per stage (k of the soft min; large = a hard min)."""


def fit_profile(m: StageMeasurements, host_cores: int, memory_per_core: int = MEMORY_PER_CORE_MIB) -> StageProfile:
    """A stage's profile from its runs alone (see the module docstring for which run gives what)."""
    usable = host_cores if m.parallel else 1
    cpu = _clamp(m.full.busy / usable, 0.01, 1.0)
    mem = _clamp(m.full.peak_bytes / (memory_per_core * host_cores * 2**20), 0.0, 1.0)
    work, serial, cpu_one_core = m.full.wall, 1.0, None
    if m.parallel and m.one_core is not None and host_cores > 1:
        work = m.one_core.wall
        serial = _clamp((host_cores * m.full.wall / work - 1) / (host_cores - 1), -1.0, 1.0)
        cpu_one_core = _clamp(m.one_core.busy, 0.01, 1.0)
    base = StageProfile(
        m.app_class, m.parallel, cpu, mem, 0.0, work, m.tasks, serial if m.parallel else 1.0, None, cpu_one_core
    )
    fits = [_fit_throttling(base, m, host_cores, k) for k in SHARPNESS_GRID]
    _, k, io, penalty = min(fits)
    return replace(base, io=io, throttle_sharpness=k, throttle_penalty=penalty)


def _fit_throttling(
    base: StageProfile, m: StageMeasurements, cores: int, k: float
) -> tuple[float, float, float, float]:
    """(squared log error of both throttled runs, k, io, penalty): io or penalty solved from the
    run at half the demand, whichever side of the quota's own slowdown `1 / r` it landed on."""
    rate = cpu_rate(base, cores, m.throttled.quota, k)
    ratio = m.throttled.wall / m.full.wall
    io = penalty = 0.0
    if rate <= 0.98:  # with r near 1 the run says nothing, so count the stage as compute
        if ratio < 1 / rate:
            # t = (1 - io) / r + io. A stage cannot wait on I/O longer than its CPU sat idle: its
            # cgroup's CPU time (kernel time in syscalls included) is throttled like any other, so
            # io <= 1 - cpu. Without this bound a throttled run that happened to beat the run alone
            # (a cold first run, page cache to reclaim) read as a stage bound wholly on I/O, and the
            # contention term made it crawl next to any neighbour.
            io = _clamp((ratio - 1 / rate) / (1 - 1 / rate), 0.0, 1.0 - base.cpu)
        else:  # t = 1 + (1 + p) (1/r - 1): slower than the quota cut, see `cosched.workflows.interference`
            penalty = _clamp((ratio - 1) / (1 / rate - 1) - 1, 0.0, MAX_THROTTLE_PENALTY)
    fitted = replace(base, io=io, throttle_penalty=penalty, throttle_sharpness=k)
    error = 0.0
    for run in (m.throttled, m.half):
        progress = speed(fitted, cores, run.quota)
        predicted = 1 / progress if progress > 0 else math.inf
        error += math.log(predicted / (run.wall / m.full.wall)) ** 2
    return error, k, io, penalty


def predicted_pair(
    first: StageProfile,
    second: StageProfile,
    cores: int,
    quota: float,
    params: InterferenceParams,
) -> tuple[float, float]:
    """Runtimes of two stages started together on `cores` cores, each under `quota` CPUs.

    Together until the first ends, each at its co-located speed; the other then
    finishes alone under its quota. Runtimes alone at full quota are the profiles'.
    """
    alone = [runtime_alone(first, cores), runtime_alone(second, cores)]
    together = [
        speed(first, cores, quota, second, quota, params=params),
        speed(second, cores, quota, first, quota, params=params),
    ]
    solo = [speed(first, cores, quota, params=params), speed(second, cores, quota, params=params)]
    finish = [alone[i] / together[i] for i in range(2)]
    early = 0 if finish[0] <= finish[1] else 1
    late = 1 - early
    done = finish[early] * together[late] / alone[late]  # share of the late one's work done meanwhile
    times = [0.0, 0.0]
    times[early] = finish[early]
    times[late] = finish[early] + (1 - done) * alone[late] / solo[late]
    return times[0], times[1]


def fit_interference(
    pairs: Sequence[PairMeasurement],
    profiles: dict[str, StageProfile],
    cores: int,
    base: InterferenceParams | None = None,
) -> InterferenceParams:
    """beta_io and beta_mem minimising the squared log error of the pairs' runtimes (grid search)."""
    base = base or shipped_params()
    if not pairs:
        return base
    grid = [i * 0.1 for i in range(0, 81)]  # 0 .. 8

    def error(beta_io: float, beta_mem: float) -> float:
        params = replace(base, beta_io=beta_io, beta_mem=beta_mem)
        total = 0.0
        for pair in pairs:
            a, b = predicted_pair(profiles[pair.first], profiles[pair.second], cores, pair.quota, params)
            total += math.log(a / pair.first_wall) ** 2 + math.log(b / pair.second_wall) ** 2
        return total

    best = min(((error(bi, bm), bi, bm) for bi in grid for bm in grid), key=lambda item: item[0])
    return replace(base, beta_io=round(best[1], 2), beta_mem=round(best[2], 2))


def profiles_toml(profiles: dict[str, StageProfile], params: InterferenceParams, header: Sequence[str]) -> str:
    """The profiles file `cosched.workflows.interference.load_profiles` reads, with a comment header."""
    lines = [f"# {line}" if line else "#" for line in header]
    lines += ["", "[interference]"]
    lines += [f"{key} = {value!r}" for key, value in asdict(params).items()]
    for app_class, p in sorted(profiles.items()):
        lines += ["", f'[profile."{app_class}"]', f"parallel = {'true' if p.parallel else 'false'}"]
        lines += [f"cpu = {p.cpu:.4g}", f"mem = {p.mem:.4g}", f"io = {p.io:.4g}", f"work = {p.work:.4g}"]
        if p.parallel:
            lines.append(f"serial_fraction = {p.serial_fraction:.4g}")
        if p.throttle_sharpness is not None:
            lines.append(f"throttle_sharpness = {p.throttle_sharpness:g}")
        if p.cpu_one_core is not None:
            lines.append(f"cpu_one_core = {p.cpu_one_core:.4g}")
        if p.throttle_penalty > 0:
            lines.append(f"throttle_penalty = {p.throttle_penalty:.4g}")
        lines.append(f"tasks = {p.tasks}")
    return "\n".join(lines) + "\n"


# -- Running (the engine) ---------------------------------------------------------------


class StageRunner:
    """Runs stages of the workflow image as the daemon would: cpuset, CFS quota, memory limit, a
    read-only image with scratch in memory."""

    def __init__(self, client: Any, image: str, size: str, cpu_period: int = 100_000) -> None:
        self.client = client
        self.image = image
        self.size = size
        self.cpu_period = cpu_period

    def start(self, app: str, stage: str, data_dir: Path, cpus: Sequence[int], cores: int, quota: float) -> Any:
        params = size_params(app, self.size)
        settings = [arg for key, value in params.items() for arg in ("--set", f"{key}={value}")]
        command = ["python3", "-m", "workloads.stages", app, stage, "--dir", str(data_dir), *settings]
        return self.client.containers.run(
            self.image,
            command,
            name=f"cosched-calibrate-{uuid.uuid4().hex[:10]}",
            labels={LABEL: "1"},
            environment={"COSCHED_CORES": str(cores), "COSCHED_PROGRESS": PROGRESS_PATH},
            cpuset_cpus=",".join(map(str, cpus)),
            cpu_period=self.cpu_period,
            cpu_quota=max(1000, int(quota * self.cpu_period)),
            mem_limit=MEMORY_PER_CORE_MIB * cores * 2**20,
            volumes={str(data_dir): {"bind": str(data_dir), "mode": "rw"}},
            network_mode="none",
            read_only=True,
            tmpfs=scratch_mounts(MEMORY_PER_CORE_MIB * cores),
            detach=True,
        )

    def finish(self, container: Any, data_dir: Path, stage: str, cores: int, quota: float) -> Measured:
        try:
            status = container.wait()
            container.reload()
            if status.get("StatusCode") != 0:
                tail = container.logs(tail=5).decode("utf-8", "replace").strip()
                raise ConfigError(f"calibration run of {stage} failed: {tail.splitlines()[-1] if tail else status}")
            state = container.attrs["State"]
            wall = _seconds(state["FinishedAt"]) - _seconds(state["StartedAt"])
        finally:
            container.remove(force=True)
        usage = json.loads((data_dir / ".usage" / f"{stage}.json").read_text())
        return Measured(wall, float(usage["cpu_seconds"]), int(usage["peak_bytes"]), cores, quota)

    def run(self, app: str, stage: str, data_dir: Path, cpus: Sequence[int], cores: int, quota: float) -> Measured:
        container = self.start(app, stage, data_dir, cpus, cores, quota)
        return self.finish(container, data_dir, stage, cores, quota)

    def run_beside_burner(
        self, app: str, stage: str, data_dir: Path, cpus: Sequence[int], cores: int, quota: float
    ) -> Measured:
        """The stage under `quota`, sharing its cores with a CPU-bound guest that has the rest."""
        burner = self.client.containers.run(
            self.image,
            ["python3", "-c", BURNER],
            name=f"cosched-calibrate-{uuid.uuid4().hex[:10]}",
            labels={LABEL: "1"},
            environment={"COSCHED_CORES": str(cores)},
            cpuset_cpus=",".join(map(str, cpus)),
            cpu_period=self.cpu_period,
            cpu_quota=max(1000, int((cores - quota) * self.cpu_period)),
            network_mode="none",
            detach=True,
        )
        try:
            return self.run(app, stage, data_dir, cpus, cores, quota)
        finally:
            burner.remove(force=True)


def _seconds(stamp: str) -> float:
    """Docker's RFC 3339 time with nanoseconds, as epoch seconds."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(head + "+00:00").timestamp()
    return whole + (float("0." + fraction[:9]) if fraction else 0.0)


def main_stage(app: str) -> str:
    """The stage a pair runs: the app's parallel stage with the most work in the test-size DAG."""
    parallel = [name for name, is_parallel, _ in stage_dag(app) if is_parallel]
    tasks = stage_module(app).tasks(size_params(app))
    return max(parallel, key=lambda name: tasks[name])


@dataclass(slots=True)
class Calibration:
    stages: list[StageMeasurements]
    pairs: list[PairMeasurement]
    profiles: dict[str, StageProfile]
    params: InterferenceParams
    host_cores: int
    seconds: float


def calibrate(
    client: Any,
    image: str,
    root: Path,
    cpus: Sequence[int],
    *,
    size: str = "small",
    apps: Sequence[str] = APPS,
    pairs: bool = True,
    log: Callable[[str], None] = lambda _: None,
) -> Calibration:
    """Run every stage of `apps` alone three ways, then pairs; fit the profiles and parameters."""
    began = time.monotonic()
    runner = StageRunner(client, image, size)
    host = len(cpus)
    measured: list[StageMeasurements] = []
    inputs: dict[str, Path] = {}  # each app's data as its main stage found it, for the pairs
    for app in apps:
        data = root / app
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        tasks = stage_module(app).tasks(size_params(app, size))
        for stage, parallel, _ in stage_dag(app):
            before = _snapshot(data, stage)
            full = runner.run(app, stage, _restore(before, data), cpus, host, float(host))
            one = runner.run(app, stage, _restore(before, data), cpus[:1], 1, 1.0) if parallel and host > 1 else None
            quota = max(0.05, round(full.busy / 2, 3))
            throttled = runner.run(app, stage, _restore(before, data), cpus, host, quota)
            half = runner.run_beside_burner(app, stage, _restore(before, data), cpus, host, host / 2)
            if stage == main_stage(app):
                inputs[app] = before
            else:
                shutil.rmtree(before)
            measured.append(StageMeasurements(f"{app}.{stage}", parallel, tasks[stage], full, one, throttled, half))
            log(
                f"{app}.{stage}: {full.wall:.2f} s alone, {full.busy:.2f} CPUs busy, "
                f"{throttled.wall:.2f} s at {quota}, {half.wall:.2f} s at {host / 2}"
            )
    profiles = {m.app_class: fit_profile(m, host) for m in measured}
    observed: list[PairMeasurement] = []
    if pairs and host > 1:
        for first, second in combinations_with_replacement(apps, 2):
            observed.append(_pair(runner, root, inputs, first, second, cpus))
            log(f"pair {first}+{second}: {observed[-1].first_wall:.2f} s and {observed[-1].second_wall:.2f} s")
    for before in inputs.values():
        shutil.rmtree(before)
    params = fit_interference(observed, profiles, host)
    return Calibration(measured, observed, profiles, params, host, time.monotonic() - began)


def _snapshot(data: Path, stage: str) -> Path:
    """A hard-linked copy of `data` as `stage` is about to find it: cheap even for gigabytes."""
    before = data.with_name(f"{data.name}.before-{stage}")
    shutil.rmtree(before, ignore_errors=True)
    shutil.copytree(data, before, copy_function=os.link)
    return before


def _restore(before: Path, data: Path) -> Path:
    """`data` as it was in the snapshot, written to disk: every timed run of a stage starts as its first did.

    Why: a rerun on the data its previous run left finds that run's outputs, and
    removing them is part of its time (Statistics' moments spends more on deleting
    the last run's 35,000 messages than on its own work), or finds its inputs
    already consumed by that run (correlations removes the moments' spool). Stages
    write new files or rename into place, never into an input, so hard links keep
    the snapshot intact. The sync keeps one run's write-back out of the next.
    """
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(before, data, copy_function=os.link)
    os.sync()
    return data


def _pair(
    runner: StageRunner, root: Path, inputs: dict[str, Path], first: str, second: str, cpus: Sequence[int]
) -> PairMeasurement:
    quota = len(cpus) / 2
    dirs = [root / first, root / f"{second}-copy" if first == second else root / second]
    for app, data in zip((first, second), dirs, strict=True):
        _restore(inputs[app], data)
    stages = [main_stage(first), main_stage(second)]
    started = [
        runner.start(app, stage, data, cpus, len(cpus), quota)
        for app, stage, data in zip((first, second), stages, dirs, strict=True)
    ]
    walls = [
        runner.finish(container, data, stage, len(cpus), quota).wall
        for container, data, stage in zip(started, dirs, stages, strict=True)
    ]
    return PairMeasurement(f"{first}.{stages[0]}", f"{second}.{stages[1]}", quota, walls[0], walls[1])


def machine_description(cpus: Sequence[int]) -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cgroup = "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1"
    return f"{model}, {len(cpus)} CPUs ({','.join(map(str, cpus))}), Linux {platform.release()}, cgroup {cgroup}"


def refit(document: dict[str, Any], host_cores: int) -> Calibration:
    """The fit again from saved raw measurements (``<profiles>.measurements.json``), without runs."""

    def measured(item: dict[str, Any] | None) -> Measured | None:
        return None if item is None else Measured(**item)

    try:
        stages = [
            StageMeasurements(
                m["app_class"],
                m["parallel"],
                m["tasks"],
                *(measured(m[key]) for key in ("full", "one_core", "throttled", "half")),  # type: ignore[arg-type]
            )
            for m in document["stages"]
        ]
        pairs = [PairMeasurement(**pair) for pair in document["pairs"]]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"not a calibration measurements file: {exc}") from None
    profiles = {m.app_class: fit_profile(m, host_cores) for m in stages}
    return Calibration(stages, pairs, profiles, fit_interference(pairs, profiles, host_cores), host_cores, 0.0)

"""The ASAx paper's experiment on real containers: `cosched experiment asax --real`.

The section 4.4 mix, scaled to this host, is submitted at once to a daemon on
the local Docker engine, once per strategy (space sharing + EASY, Static 50%)
and once per seed for ASAx, which samples (`sampled_seeds`). Each run gets a
daemon of its own, started here with that strategy's ``[policies]`` and a fresh
state directory, so ASAx starts from uniform weights as in the paper and no
strategy inherits another's queue; a co-scheduling policy is a daemon's
configuration, not something to switch under queued jobs.

What is measured, per stage job: runtime from the container's start and end
(the daemon's record), CPU seconds from the container's cgroup
(`workloads.stages.usage`), the CPU quota over time from the daemon's quota log.
The replay of the same mix, with the calibrated profiles of this host
(`cosched calibrate`), is run beside it, so every measured number has its
prediction next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosched.daemon.client import ApiError, Client
from cosched.daemon.store import Store
from cosched.errors import ConfigError
from cosched.model import Cluster
from cosched.replay.driver import PolicySet, replay
from cosched.replay.rates import StageRates
from cosched.replay.workflow_runs import WorkflowRuns
from cosched.workflows.interference import InterferenceParams, StageProfile, runtime_alone
from experts.weights import WeightBook
from workloads.real import make_data_dir, real_workflow, size_params, stage_dag, stage_module, verify
from workloads.workflows import APPS, MIX_CORES, Stage, Workflow

STRATEGIES = {"slurm": "none", "static": "static", "asax": "asax"}
"""The paper's strategies and the daemon's co-scheduling policy for each."""
MEMORY_PER_CORE = 1024
INTERVALS = {"schedule": 0.5, "sample": 1.0, "review": 2.0, "reconcile": 10.0}
WALLTIME_FACTOR = 3.0
MIN_WALLTIME = 60.0
"""Each stage asks for three times its calibrated runtime alone, at least a minute: the
headroom a user gives a job whose runtime they know roughly, so lendings that slow a
stage badly cost ASAx a loss (or the stage its life), in replay and for real alike."""
PAPER_LARGEST = 64
"""The paper's largest workflow (64 cores) is scaled to the whole host."""


def stage_walltime(profiles: dict[str, StageProfile], app_class: str, cores: int) -> float:
    return max(MIN_WALLTIME, round(WALLTIME_FACTOR * runtime_alone(profiles[app_class], cores)))


def check_profiles(profiles: dict[str, StageProfile], mix: Sequence[MixEntry]) -> None:
    missing = sorted({f"{e.app}.{name}" for e in mix for name, _, _ in stage_dag(e.app)} - set(profiles))
    if missing:
        raise ConfigError(f"the profiles have no {', '.join(missing)}: run `cosched calibrate` for them")


@dataclass(frozen=True, slots=True)
class MixEntry:
    name: str
    app: str
    cores: int


def scaled_mix(host_cores: int, repeats: int = 1) -> list[MixEntry]:
    """The 15-workflow mix with core counts scaled by host/64 (at least 1), `repeats` times."""
    mix = []
    for run in range(1, repeats + 1):
        for app in APPS:
            for cores in MIX_CORES[app]:
                scaled = max(1, min(host_cores, round(cores * host_cores / PAPER_LARGEST)))
                mix.append(MixEntry(f"{app}-{cores}-r{run}", app, scaled))
    return mix


@dataclass(slots=True)
class WorkflowResult:
    """One workflow of one run: seconds, CPU seconds, granted CPU-seconds, peak memory share."""

    name: str
    app: str
    cores: int
    runtime: float
    response: float
    cpu_seconds: float
    quota_seconds: float
    mem_share: float
    ok: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def wait(self) -> float:
        return self.response - self.runtime


@dataclass(slots=True)
class StrategyRun:
    strategy: str
    workflows: list[WorkflowResult]
    makespan: float
    host_cores: int
    weight_updates: float = 0.0
    """ASAx's rounds ended (weight updates), over all its learners: whether it learned in the run."""

    def per_app(self, app: str) -> dict[str, float]:
        runs = [w for w in self.workflows if w.app == app]
        runtimes = [w.runtime for w in runs]
        mean = statistics.fmean(runtimes)
        return {
            "runtime": mean,
            "spread_pct": 100 * statistics.pstdev(runtimes) / mean if mean else 0.0,
            "cpu_pct": 100 * sum(w.cpu_seconds for w in runs) / max(1e-9, sum(w.quota_seconds for w in runs)),
            "mem_pct": 100 * sum(w.mem_share * w.runtime for w in runs) / max(1e-9, sum(runtimes)),
        }

    def overall(self) -> dict[str, float]:
        cpu = sum(w.cpu_seconds for w in self.workflows)
        return {
            "wait": statistics.fmean(w.wait for w in self.workflows),
            "response": statistics.fmean(w.response for w in self.workflows),
            "cpu_pct": 100 * cpu / max(1e-9, sum(w.quota_seconds for w in self.workflows)),
            "cluster_cpu_pct": 100 * cpu / max(1e-9, self.host_cores * self.makespan),
            "makespan": self.makespan,
            "failed": float(sum(1 for w in self.workflows if not w.ok)),
        }


# -- The real run --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalDaemon:
    """`cosched daemon` in a subprocess with one strategy's policies, its own state and port."""

    def __init__(self, root: Path, strategy: str, host_cores: int, seed: int) -> None:
        self.root = root
        self.data = root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        intervals = "\n".join(f"{key} = {value}" for key, value in INTERVALS.items())
        config = root / "cosched.toml"
        config.write_text(
            f'[daemon]\nstate_dir = "{root / "state"}"\n'
            f"[api]\nport = {port}\n"
            f"[cluster]\ncores = {host_cores}\nmemory_mib = {2 * host_cores * MEMORY_PER_CORE}\n"
            f"default_memory_per_core = {MEMORY_PER_CORE}\n"
            f'[docker]\ndata_roots = ["{self.data}"]\n'
            f"[intervals]\n{intervals}\n"
            f'[policies]\ncosched = "{STRATEGIES[strategy]}"\nseed = {seed}\n'
        )
        self.client = Client(f"http://127.0.0.1:{port}", "", timeout=30)
        self.log = root / "daemon.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cosched.cli", "daemon", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise ConfigError(f"the daemon for {strategy} exited: {self._last_line()}")
            try:
                self.client.call("GET", "/v1/health")
                return
            except ApiError:
                if time.monotonic() > deadline:
                    raise ConfigError(f"the daemon for {strategy} did not answer: {self._last_line()}") from None
                time.sleep(0.2)

    def _last_line(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no output"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)

    def weight_updates(self) -> int:
        """ASAx's weight updates, read from the state file the daemon keeps them in (none without ASAx)."""
        state = Store(self.root / "state" / "state.sqlite").get_meta("weights")
        return 0 if state is None else WeightBook.from_state(state).updates


def _quota_seconds(job: dict[str, Any]) -> float:
    """CPU-seconds granted to a job: its cores, or the quotas of its log, over its run."""
    start, end = float(job["start"]), float(job["end"])
    quota, at, granted = float(job["cores"]), start, 0.0
    for change in job.get("quota_changes") or []:
        when = min(max(float(change["at"]), start), end)
        granted += quota * (when - at)
        quota, at = float(change["cpus"]), when
    return granted + quota * (end - at)


def _usage(data_dir: Path, stage: str) -> dict[str, Any]:
    path = data_dir / ".usage" / f"{stage}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {"cpu_seconds": 0.0, "peak_bytes": 0}


def run_real(
    strategy: str,
    mix: Sequence[MixEntry],
    image: str,
    root: Path,
    host_cores: int,
    profiles: dict[str, StageProfile],
    *,
    size: str = "small",
    seed: int = 0,
    timeout: float = 4 * 3600,
    log: Callable[[str], None] = lambda _: None,
) -> StrategyRun:
    """Submit the mix at once to a fresh daemon running `strategy`; wait; measure every stage."""
    check_profiles(profiles, mix)
    daemon = LocalDaemon(root, strategy, host_cores, seed)
    try:
        ids = {}
        for entry in mix:
            data = make_data_dir(daemon.data / entry.name)
            spec = real_workflow(
                entry.app,
                cores=entry.cores,
                data_dir=data,
                image=image,
                size=size,
                name=entry.name,
                stage_walltimes={
                    name: stage_walltime(profiles, f"{entry.app}.{name}", entry.cores)
                    for name, _, _ in stage_dag(entry.app)
                },
            )
            ids[entry.name] = int(daemon.client.call("POST", "/v1/workflows", spec)["id"])
        statuses = _wait(daemon, ids, timeout, log)
        results = [_measure(daemon, entry, statuses[entry.name], size) for entry in mix]
        for entry, result in zip(mix, results, strict=True):
            if result.ok:  # Montage's small size alone is 2.6 GB; failed runs stay for a look
                shutil.rmtree(daemon.data / entry.name, ignore_errors=True)
    finally:
        daemon.stop()
    first = min(w["submitted"] for w in statuses.values())
    last = max(w["_end"] for w in statuses.values())
    return StrategyRun(strategy, results, last - first, host_cores, daemon.weight_updates())


def _wait(
    daemon: LocalDaemon, ids: dict[str, int], timeout: float, log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    reported = -1
    while True:
        statuses = {name: daemon.client.call("GET", f"/v1/workflows/{i}") for name, i in ids.items()}
        finished = sum(1 for s in statuses.values() if s["state"] in ("done", "failed"))
        if finished != reported:
            log(f"{finished}/{len(ids)} workflows finished")
            reported = finished
        if finished == len(ids):
            break
        if time.monotonic() > deadline:
            raise ConfigError(f"workflows not finished after {timeout:.0f} s; the daemon log is {daemon.log}")
        time.sleep(1.0)
    for status in statuses.values():
        jobs = [daemon.client.call("GET", f"/v1/jobs/{s['job']}") for s in status["stages"].values() if s["job"]]
        status["_jobs"] = {job["stage"]: job for job in jobs}
        status["_end"] = max((job["end"] or 0.0) for job in jobs)
    return statuses


def _measure(daemon: LocalDaemon, entry: MixEntry, status: dict[str, Any], size: str) -> WorkflowResult:
    data = daemon.data / entry.name
    jobs = [job for job in status["_jobs"].values() if job["start"] and job["end"]]
    runtime = sum(job["end"] - job["start"] for job in jobs)
    cpu = mem = 0.0
    for job in jobs:
        used = _usage(data, job["stage"])
        cpu += float(used["cpu_seconds"])
        share = int(used["peak_bytes"]) / (entry.cores * MEMORY_PER_CORE * 2**20)
        mem += share * (job["end"] - job["start"])
    problems = [] if status["state"] == "done" else [f"workflow {status['state']} at {status['failed_stage']}"]
    if not problems:
        problems = verify(entry.app, data, size)
    return WorkflowResult(
        entry.name,
        entry.app,
        entry.cores,
        runtime,
        status["_end"] - status["submitted"],
        cpu,
        sum(_quota_seconds(job) for job in jobs),
        mem / runtime if runtime else 0.0,
        ok=not problems,
        problems=problems,
    )


# -- The replay's prediction --------------------------------------------------------------


def replay_workflow(entry: MixEntry, size: str) -> Workflow:
    """The same workflow as the daemon runs, as the replay's DAG (generate stage included)."""
    tasks = stage_module(entry.app).tasks(size_params(entry.app, size))
    stages = tuple(
        Stage(name, f"{entry.app}.{name}", parallel, int(tasks[name]), depends)
        for name, parallel, depends in stage_dag(entry.app)
    )
    return Workflow(entry.name, entry.app, entry.cores, MEMORY_PER_CORE, stages)


def predict(
    strategy: str,
    mix: Sequence[MixEntry],
    profiles: dict[str, StageProfile],
    params: InterferenceParams,
    host_cores: int,
    *,
    size: str = "small",
    seeds: Sequence[int] = (0,),
) -> StrategyRun:
    """Replay the mix on one node of this host's cores with the calibrated profiles.

    The mean over `sampled_seeds` (see there).
    """
    runs = [_predict_once(strategy, mix, profiles, params, host_cores, size, s) for s in sampled_seeds(strategy, seeds)]
    return mean_run(runs)


def sampled_seeds(strategy: str, seeds: Sequence[int]) -> Sequence[int]:
    """The seeds a strategy is run with, live and in replay: all of them for ASAx, one otherwise.

    ASAx samples its lendings, so one run is one draw of the policy, and with three
    workflows of a type one draw's few lendings decide that type's mean: four live runs
    of the same mix measured BLAST under ASAx at 35 to 53 s. Its figures are the mean
    over the seeds, live and in replay alike. The other strategies do not sample.
    """
    return seeds if strategy == "asax" else seeds[:1]


def mean_run(runs: Sequence[StrategyRun]) -> StrategyRun:
    """Each workflow's figures and the makespan averaged over runs of the same mix."""
    if len(runs) == 1:
        return runs[0]
    workflows = []
    for same in zip(*(run.workflows for run in runs), strict=True):
        first = same[0]

        def mean(key: str, same: tuple[WorkflowResult, ...] = same) -> float:
            return statistics.fmean(getattr(w, key) for w in same)

        workflows.append(
            WorkflowResult(
                first.name,
                first.app,
                first.cores,
                mean("runtime"),
                mean("response"),
                mean("cpu_seconds"),
                mean("quota_seconds"),
                mean("mem_share"),
                ok=all(w.ok for w in same),
                problems=[problem for w in same for problem in w.problems],
            )
        )
    makespan = statistics.fmean(run.makespan for run in runs)
    learned = statistics.fmean(run.weight_updates for run in runs)
    return StrategyRun(runs[0].strategy, workflows, makespan, runs[0].host_cores, learned)


def _predict_once(
    strategy: str,
    mix: Sequence[MixEntry],
    profiles: dict[str, StageProfile],
    params: InterferenceParams,
    host_cores: int,
    size: str,
    seed: int,
) -> StrategyRun:
    from cosched.daemon.config import PolicySection
    from cosched.policies.asax import ASAx
    from cosched.policies.registry import create
    from experts.weights import Schedule

    defaults = PolicySection()
    check_profiles(profiles, mix)

    def sizer(workflow: Workflow, stage: Stage) -> tuple[float, float]:
        alone = runtime_alone(profiles[stage.app_class], workflow.cores)
        return stage_walltime(profiles, stage.app_class, workflow.cores), alone

    if strategy == "asax":
        policy: Any = ASAx(
            seed=seed,
            loss=defaults.loss,
            min_guest_share=defaults.min_guest_share,
            schedule=Schedule(horizon=defaults.horizon, threshold=defaults.round_threshold),
            learner=defaults.learner,
        )
    else:
        policy = create("cosched", STRATEGIES[strategy])
    runs = WorkflowRuns(sizer)
    first = [job for entry in mix for job in runs.submit(replay_workflow(entry, size), 0.0)]
    cluster = Cluster(1, host_cores, 2 * host_cores * MEMORY_PER_CORE, name="host")
    result = replay(
        first,
        cluster,
        PolicySet(
            "fcfs",
            "easy",
            cosched=policy,
            sharing=defaults.sharing,
            window=defaults.window,
            keep_promises=defaults.keep_promises,
        ),
        rates=StageRates(profiles, params),
        react=runs.react,
        account=True,
        sample_every=INTERVALS["sample"],
    )
    workflows = []
    by_name = {run.workflow.name: run for run in runs.runs.values()}
    for entry in mix:
        run = by_name[entry.name]
        ids = {job.id for job in run.jobs.values()}
        accounts = [a for job_id, a in result.accounts.items() if job_id in ids]
        workflows.append(
            WorkflowResult(
                entry.name,
                entry.app,
                entry.cores,
                run.runtime,
                run.response,
                sum(a.cpu_seconds for a in accounts),
                sum(a.quota_seconds for a in accounts),
                sum(a.mem_seconds for a in accounts) / max(1e-9, run.runtime),
                ok=run.failed_stage is None,
            )
        )
    makespan = max(j.end for j in result.jobs) - min(j.submit for j in result.jobs)
    learned = policy.book.updates if strategy == "asax" else 0
    return StrategyRun(strategy, workflows, makespan, host_cores, learned)


def host_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))

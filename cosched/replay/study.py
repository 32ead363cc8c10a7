"""What a replay study runs on, and how it is cut: whole trace, window, samples.

The RL scheduling papers evaluate on K random sequences of L consecutive jobs,
each replayed on an empty cluster; operators replay a whole trace or a window.
Every policy set of a comparison sees exactly the same job sequences.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cosched.errors import ConfigError
from cosched.model import MAX_REPLAY_PROCS, Allocation, Cluster
from cosched.replay.deferrable import Windows
from cosched.replay.driver import PolicySet, ReplayResult, replay
from cosched.reporting.metrics import Summary, aggregate, summarize
from cosched.traces.swf import read_swf
from cosched.traces.trace import Trace

DEFAULT_WORKLOAD = "lublin:10000:256"
"""The embedded default: a Lublin-Feitelson workload of 10,000 jobs on 256 processors."""


def load_workload(
    spec: str | None,
    *,
    seed: int = 1,
    lenient: bool = False,
    drop_cancelled: bool = False,
    procs: int | None = None,
    cleaning: str = "standard",
) -> Trace:
    """An SWF file path, or `lublin[:JOBS[:PROCS[:LOAD]]]` for a generated workload; None: the default."""
    if spec is not None and not spec.strip():  # '' is a mistake (an unset variable), not a request
        raise ConfigError("the workload is empty: give an SWF file or lublin[:JOBS[:PROCS[:LOAD]]]")
    spec = spec or DEFAULT_WORKLOAD
    if spec == "lublin" or spec.startswith("lublin:"):
        from workloads.lublin import generate

        parts = spec.split(":")[1:]
        if len(parts) > 3:
            raise ConfigError(f"bad generated workload {spec!r}; expected lublin:JOBS:PROCS[:LOAD]")
        try:
            jobs = int(parts[0]) if parts else 10000
            size = int(parts[1]) if len(parts) > 1 else (procs or 256)
            load = float(parts[2]) if len(parts) > 2 else None
        except ValueError:
            raise ConfigError(f"bad generated workload {spec!r}; expected lublin:JOBS:PROCS[:LOAD]") from None
        try:  # its checks name the field (JOBS above 10^7, PROCS above the largest cluster, ...)
            return generate(jobs, size, seed=seed, load=load)
        except ConfigError as exc:
            raise ConfigError(f"bad generated workload {spec!r}: {exc}") from None
    return read_swf(Path(spec), lenient=lenient, max_procs=procs, drop_cancelled=drop_cancelled, cleaning=cleaning)


POLICY_SETS_SYNTAX = (
    "comma-separated queue:backfill[:estimate] sets; each field is an alias (fcfs, easy, actual, rlbf, ...), "
    "an alias with its argument or a plugin class in brackets, [rlbf:hpc2n] or [module:Class]: "
    "fcfs:easy,fcfs:[rlbf:model.npz],[mylab.queues:Fair]:easy"
)
_FIELD = r"\[[^\[\],]+\]|[\w-]+"  # [alias:ARG] or [module:Class], or an alias (a word: no dot, no colon)
_POLICY_SET = re.compile(rf"({_FIELD}):({_FIELD})(?::({_FIELD}))?")


def parse_policy_sets(text: str) -> list[PolicySet]:
    """Policy sets as `--compare` writes them (see `POLICY_SETS_SYNTAX`).

    A plugin class needs brackets because `module:Class` has the colon that
    separates fields: `[m:Q]:easy` is queue `m:Q`, where `m:Q:easy` could be
    read two ways. Aliases never contain a colon, so brackets make it unambiguous;
    so does an alias with its argument (`fcfs:[rlbf:hpc2n]`).
    """
    sets = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _POLICY_SET.fullmatch(item)
        if match is None:
            raise ConfigError(f"bad policy set {item!r}; expected {POLICY_SETS_SYNTAX}")
        queue, backfill, estimate = (field.strip("[]") if field else None for field in match.groups())
        sets.append(PolicySet(queue, backfill, estimate or "requested"))
    if not sets:
        raise ConfigError("no policy sets given")
    return sets


def split_pair(pair: str) -> tuple[str, str]:
    """`queue:backfill` (backfill `easy` when left out); a queue with an argument is written in
    brackets, `[osdec:/srv/m.npz]:easy`, as in `cosched replay --compare`."""
    if pair.startswith("["):
        queue, _, rest = pair[1:].partition("]")
        return queue, rest.removeprefix(":") or "easy"
    queue, _, backfill = pair.partition(":")
    return queue, backfill or "easy"


def cut(
    trace: Trace,
    *,
    start: int = 0,
    length: int | None = None,
    samples: int | None = None,
    seed: int = 1,
    notes: list[str] | None = None,
) -> list[Trace]:
    """The job sequences to replay: the trace, a window of it, or K random windows.

    A window that runs past the trace's end is shortened to it, and `notes`
    (when given) gets a line saying so. Samples start at uniformly drawn positions (seeded) and keep the trace's own
    submit times: policies such as F1 read absolute submit times.
    """
    if length is not None and length <= 0:
        raise ConfigError(f"--length must be positive, got {length}")
    if start < 0:
        raise ConfigError(f"--start must be >= 0, got {start}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    if samples is None:
        if length is not None and start + length > len(trace) and notes is not None:
            notes.append(
                f"the window --start {start} --length {length} runs past the trace's end: "
                f"replaying its last {max(0, len(trace) - start)} jobs"
            )
        return [trace.slice(start, length)] if start or length else [trace]
    if samples <= 0:
        raise ConfigError(f"--samples must be positive, got {samples}")
    if start:
        raise ConfigError("--start picks one window; --samples draws their starts at random: use one")
    if length is None:
        raise ConfigError("--samples needs --length")
    n = len(trace)
    if length > n:
        raise ConfigError(f"--length {length} is longer than the trace's {n} jobs")
    starts = np.random.default_rng(seed).integers(0, n - length + 1, size=samples)
    return [trace.slice(int(s), length) for s in starts]


@dataclass(slots=True)
class StudyResult:
    """One policy set over every job sequence of a study."""

    policies: PolicySet
    runs: list[ReplayResult] = field(default_factory=list)
    summaries: list[Summary] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.policies.label

    def aggregate(self) -> dict[str, dict[str, float]]:
        return aggregate(self.summaries)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)

    @property
    def jobs(self) -> int:
        return sum(len(r.jobs) for r in self.runs)


def run_study(
    sequences: Sequence[Trace],
    cluster: Cluster,
    policy_sets: Sequence[PolicySet],
    *,
    validate: bool = False,
    progress: Callable[[int], None] | None = None,
    windows: Windows | None = None,
) -> list[StudyResult]:
    """Replay every sequence under every policy set (fresh jobs each time; with `windows`, the
    same drawn fraction of them deferrable under every set)."""
    results = []
    for policies in policy_sets:
        study = StudyResult(policies)
        for sequence in sequences:
            jobs = sequence.jobs()
            run = replay(
                windows.apply(jobs) if windows is not None else jobs,
                cluster,
                policies,
                validate=validate,
                progress=progress,
                keep_slots=cluster.topology is not None,
            )
            study.runs.append(run)
            study.summaries.append(summarize(run.jobs, cluster.cores))
        results.append(study)
    return results


def cluster_for(trace: Trace, allocation: str = "core", procs: int | None = None) -> Cluster:
    """The cluster a trace is replayed on; `allocation` is `core` or `node`."""
    try:
        mode = Allocation(allocation)
    except ValueError:
        raise ConfigError(f"unknown allocation {allocation!r}; known: core, node") from None
    cluster = trace.cluster(mode, procs)
    if cluster.cores > MAX_REPLAY_PROCS:  # a header up to the 10^8 an SWF field may hold
        raise ConfigError(
            f"{trace.name}: a machine of {cluster.cores} processors is larger than the {MAX_REPLAY_PROCS:,} "
            f"cosched replays; give a smaller one with --procs N"
        )
    return cluster

"""A workload held as columns, and the report of how it was cleaned.

Traces are kept as NumPy columns rather than `Job` objects: loading, windowing
and sampling stay vectorised, and `Job` objects (which the core mutates) are
made fresh for each replay so two replays of one trace never share state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from cosched.errors import TraceError
from cosched.model import Allocation, Cluster, Job

# The 18 Standard Workload Format fields, in file order, under the names used here.
SWF_FIELDS: tuple[str, ...] = (
    "job_id",
    "submit",
    "wait",
    "runtime",
    "alloc_procs",
    "avg_cpu",
    "used_memory",
    "req_procs",
    "req_time",
    "req_memory",
    "status",
    "user",
    "group",
    "app",
    "queue",
    "partition",
    "preceding_job",
    "think_time",
)


@dataclass(slots=True)
class SwfHeader:
    """Header comments of an SWF file; the numeric ones cosched relies on, parsed."""

    max_nodes: int | None = None
    max_procs: int | None = None
    unix_start_time: int | None = None
    fields: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class LoadReport:
    """What loading did to the raw lines; every cleaning rule has its counter."""

    lines: int = 0
    comments: int = 0
    read: int = 0
    malformed_skipped: int = 0
    dropped_duplicate_id: int = 0
    dropped_submit_unknown: int = 0
    runtime_unknown_as_10s: int = 0
    procs_cut_to_max: int = 0
    dropped_runtime: int = 0
    dropped_cancelled: int = 0
    cancelled_kept: int = 0
    dropped_procs_unknown: int = 0
    dropped_procs_above_max: int = 0
    req_time_from_runtime: int = 0
    req_time_raised_to_runtime: int = 0
    submit_out_of_order: int = 0
    kept: int = 0
    offered_load: float | None = None
    """Processor-seconds asked for / (machine processors x submission span); None for one instant."""
    inferred_procs: int | None = None
    """The machine size taken from the largest job, when no header or argument gave one."""
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Problems that make results doubtful (printed as warnings, even with --json)."""

    def lines_out(self) -> list[str]:
        """Human-readable lines, one per non-zero counter, for the terminal (warnings apart)."""
        labels = {
            "read": "job lines read",
            "malformed_skipped": "malformed lines skipped (--lenient)",
            "dropped_duplicate_id": "dropped: job id already used on an earlier line (--lenient)",
            "dropped_submit_unknown": "dropped: submit time negative (unknown)",
            "runtime_unknown_as_10s": "runtime -1 kept as a 10 s job (--cleaning dirlab)",
            "procs_cut_to_max": "processors above MaxProcs cut to it (--cleaning dirlab)",
            "dropped_runtime": "dropped: runtime -1 or 0",
            "dropped_cancelled": "dropped: cancelled (status 5, --drop-cancelled)",
            "cancelled_kept": "kept: cancelled after starting (ran until cancelled)",
            "dropped_procs_unknown": "dropped: processors -1 or 0",
            "dropped_procs_above_max": "dropped: processors above MaxProcs",
            "req_time_from_runtime": "requested time -1: set to runtime",
            "req_time_raised_to_runtime": "requested time below runtime: raised to runtime",
            "submit_out_of_order": "submitted before the line above: sorted by submit time",
            "kept": "jobs kept",
        }
        out = [f"{label}: {getattr(self, key)}" for key, label in labels.items() if getattr(self, key)]
        if self.offered_load is not None:
            out.append(f"offered load: {self.offered_load:.2f}")
        return out + self.notes

    def as_dict(self) -> dict[str, object]:
        """Every counter, note and warning, for `--json` and summary.json."""
        return asdict(self)


@dataclass(slots=True)
class Trace:
    """A cleaned workload: one NumPy array per SWF field, sorted by submit time.

    `procs` is the processor count cosched schedules (see the cleaning rules in
    `cosched.traces.swf`), `req_time` is always >= `runtime` after cleaning.
    """

    name: str
    columns: dict[str, np.ndarray]
    header: SwfHeader = field(default_factory=SwfHeader)
    report: LoadReport = field(default_factory=LoadReport)

    def __len__(self) -> int:
        return int(self.columns["submit"].shape[0])

    @property
    def max_procs(self) -> int:
        """Processors of the machine: header MaxProcs, else the largest job (noted)."""
        if self.header.max_procs:
            return self.header.max_procs
        if self.header.max_nodes:
            return self.header.max_nodes
        return int(self.columns["procs"].max()) if len(self) else 1

    def cluster(self, allocation: Allocation = Allocation.CORE, procs: int | None = None) -> Cluster:
        """The machine the trace ran on, as a `Cluster`.

        With MaxNodes and MaxProcs both known and MaxProcs a multiple of MaxNodes,
        nodes get MaxProcs / MaxNodes cores (SDSC-BLUE: 144 x 8); otherwise each
        processor is a one-core node, which is how the RL backfilling papers
        simulate these traces.
        """
        total = procs or self.max_procs
        nodes, per_node = total, 1
        h = self.header
        if procs is None and h.max_nodes and h.max_procs and h.max_procs % h.max_nodes == 0:
            nodes, per_node = h.max_nodes, h.max_procs // h.max_nodes
        return Cluster(nodes=nodes, cores_per_node=per_node, allocation=allocation, name=self.name)

    def slice(self, start: int, length: int | None = None) -> Trace:
        """Jobs [start, start + length) as a new trace (columns are views)."""
        n = len(self)
        if start < 0 or start >= max(n, 1):
            raise TraceError(f"{self.name}: start {start} is outside the trace's {n} jobs")
        if length is not None and length <= 0:
            raise TraceError(f"{self.name}: length must be positive, got {length}")
        stop = n if length is None else min(n, start + length)
        cols = {k: v[start:stop] for k, v in self.columns.items()}
        return Trace(f"{self.name}[{start}:{stop}]", cols, self.header, self.report)

    def jobs(self, rebase: bool = False) -> list[Job]:
        """Fresh `Job` objects; with `rebase`, submit times start at 0."""
        c = self.columns
        submit = c["submit"]
        if rebase and len(self):
            submit = submit - submit[0]
        return [
            Job(
                id=int(jid),
                submit=float(sub),
                cores=int(procs),
                walltime=float(req),
                runtime=float(run),
                memory=int(mem) if mem > 0 else 0,
                user=int(user),
                group=int(group),
                app=int(app),
                queue=int(queue),
                partition=int(part),
                status=int(status),
                depends=int(prec),
                think_time=float(think),
            )
            for jid, sub, procs, req, run, mem, user, group, app, queue, part, status, prec, think in zip(
                c["job_id"].tolist(),
                submit.tolist(),
                c["procs"].tolist(),
                c["req_time"].tolist(),
                c["runtime"].tolist(),
                (c["req_memory"] // 1024).tolist(),
                c["user"].tolist(),
                c["group"].tolist(),
                c["app"].tolist(),
                c["queue"].tolist(),
                c["partition"].tolist(),
                c["status"].tolist(),
                c["preceding_job"].tolist(),
                c["think_time"].tolist(),
                strict=True,
            )
        ]

    @classmethod
    def from_columns(
        cls,
        name: str,
        *,
        submit: np.ndarray,
        runtime: np.ndarray,
        procs: np.ndarray,
        req_time: np.ndarray | None = None,
        header: SwfHeader | None = None,
        report: LoadReport | None = None,
        **extra: np.ndarray,
    ) -> Trace:
        """Build a trace from the essential columns; other SWF fields default to -1."""
        n = int(np.asarray(submit).shape[0])
        cols: dict[str, np.ndarray] = {f: np.full(n, -1, dtype=np.int64) for f in SWF_FIELDS}
        cols["job_id"] = np.arange(1, n + 1, dtype=np.int64)
        cols["submit"] = np.asarray(submit, dtype=np.float64)
        cols["runtime"] = np.asarray(runtime, dtype=np.float64)
        cols["req_time"] = np.asarray(runtime if req_time is None else req_time, dtype=np.float64)
        cols["procs"] = np.asarray(procs, dtype=np.int64)
        cols["req_procs"] = cols["procs"]
        cols["alloc_procs"] = cols["procs"]
        cols["status"] = np.ones(n, dtype=np.int64)
        cols["wait"] = np.full(n, -1.0)
        cols["think_time"] = np.full(n, -1.0)
        for key, value in extra.items():
            if key not in cols:
                raise TraceError(f"{name}: unknown column {key!r}")
            cols[key] = np.asarray(value)
        report = report or LoadReport(read=n, kept=n)
        return cls(name, cols, header or SwfHeader(), report)

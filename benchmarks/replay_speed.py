"""Replay throughput and peak memory of every queue x backfill policy pair.

What is measured
----------------
For each workload and each policy set, one fresh Python subprocess loads the
trace, then replays it ``--repeat`` times (each time on fresh ``trace.jobs()``)
with :func:`cosched.replay.driver.replay`, and reports:

* ``load s``: loading the trace (``read_swf`` for an archive log, the
  Lublin-Feitelson generator for the synthetic ones; ``lublin50k`` is the first
  50,000 jobs of the 500,000-job trace, so its load time includes generating
  all 500,000 jobs).
* ``replay s``: the best of the repeats of ``ReplayResult.seconds``, the time
  inside the replay loop (it excludes building the ``Job`` objects and sorting
  them by submit time). ``jobs/s`` and ``us/job`` are derived from it, with
  ``jobs`` the number of jobs in the trace.
* ``start s``: a replay of one 1-second job on the same machine: the fixed cost
  of offering every node once (a million tuples on 1,000,000 cores), paid once
  per replay, not per job. The wide* ratios below are of ``(replay s - start s)
  / jobs``, the cost per job.
* ``RSS after load MiB``: the resident set size right after loading (from
  ``/proc/self/statm``; the process's peak so far where that file is missing),
  after a garbage collection and glibc's ``malloc_trim(0)``, so heap freed by
  the loader (the generator's temporaries above all) is not counted.
* ``peak RSS MiB``: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at the end of
  the run. On Linux the high-water mark is reset after loading (writing 5 to
  ``/proc/self/clear_refs``), so the peak is that of the replay phase alone
  (``Job`` objects, the core's state, the result), and ``peak - after load`` is
  what replaying costs; where the reset is refused the peak covers the whole
  process, loading included, and is marked with ``+``.

The time comes from the same run as the RSS: no ``tracemalloc``, which slows
Python allocation-heavy code several-fold and would distort the timing; RSS is
what an operator sizing a machine needs anyway. One subprocess per run, one at
a time (never in parallel, so runs do not compete for cores or memory), so every
peak belongs to one run. A run that takes longer than ``--timeout`` seconds
(loading and all repeats together) is killed and shown as ``timeout``.

Workloads (``--workloads``, comma-separated, default all)
--------------------------------------------------------
``sp2``        SDSC-SP2-1998-4.2-cln.swf.gz, whole trace
``hpc2n``      HPC2N-2002-2.2-cln.swf.gz, whole trace
``lublin50k``  first 50,000 jobs of ``lublin500k``
``lublin500k`` Lublin-Feitelson, 500,000 jobs, 256 processors, load 0.9, seed 1
``wide256``    Lublin-Feitelson, 20,000 jobs for 256 processors (load 0.9, seed 1), replayed on 256
``wide93k``    the same jobs on 93,312 processors (CEA-Curie's size)
``wide1m``     the same jobs on 1,000,000 processors

Archive logs are read from ``--traces`` (default ``<repo>/../shared/traces``);
a missing file is shown as ``skipped (absent)``. The 50k/500k pair shows whether
time per job stays flat as the trace grows 10x: the ratio of their FCFS+EASY
us/job is printed under the table. The wide* trio shows whether time and memory
per job stay flat as the machine grows (`cosched replay lublin:20000:256 --procs N`):
the same 20,000 jobs on 256, 93,312 and 1,000,000 one-core nodes; their us/job
ratio is printed too. Replays clear a finished job's slots (``keep_slots=False``),
as the CLI's do.

Policy sets: every registered queue policy x every registered backfill policy
with the ``requested`` estimator, plus FCFS+EASY with the ``actual`` estimator;
``--only-pairs fcfs:easy,sjf:easy:actual`` limits them.

A peer, measured in the same run (``--peer DIR``)
-------------------------------------------------
``--peer`` names a checkout of DIR-LAB's RLBackfilling
(``git clone https://github.com/DIR-LAB/RLBackfilling``), the simulator that computed
the RL backfilling paper's tables. For each archive trace, its FCFS + EASY loop runs
in a fresh process as ours do, and is shown as ``dirlab fcfs+easy``
(``benchmarks/dirlab_peer.py`` says how). Its ``replay s`` is its scheduling loop
alone; its ``jobs`` are those its loader keeps (it turns runtime -1 into 10 s where
we drop those jobs), so compare ``jobs/s``. The schedules differ in details (its EASY
has no "extra nodes" rule, and it allocates whole nodes); the work per job is the same kind.

Running
-------
    python benchmarks/replay_speed.py                          # everything
    python benchmarks/replay_speed.py --workloads sp2 --only-pairs fcfs:easy --repeat 3
    python benchmarks/replay_speed.py --timeout 120             # cut slow pairs short
    python benchmarks/replay_speed.py --workloads sp2,hpc2n --only-pairs fcfs:easy --peer ../RLBackfilling

Rows are printed as their runs finish, so a long run shows progress.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
ARCHIVE_TRACES: dict[str, str] = {
    "sp2": "SDSC-SP2-1998-4.2-cln.swf.gz",
    "hpc2n": "HPC2N-2002-2.2-cln.swf.gz",
}
LUBLIN_JOBS, LUBLIN_PROCS, LUBLIN_LOAD, LUBLIN_SEED = 500_000, 256, 0.9, 1
LUBLIN_SMALL = 50_000
WIDE_JOBS = 20_000
WIDE_PROCS: dict[str, int] = {"wide256": 256, "wide93k": 93_312, "wide1m": 1_000_000}
WORKLOADS: tuple[str, ...] = ("sp2", "hpc2n", "lublin50k", "lublin500k", *WIDE_PROCS)
GOAL_JOBS_PER_S = 100_000
RESULT_TAG = "REPLAY_SPEED_RESULT "
PEER = "dirlab"
PEER_LABEL = "dirlab fcfs+easy"
MIB = 1024 * 1024

COLUMNS: tuple[tuple[str, int], ...] = (
    ("workload", 11),
    ("jobs", 8),
    ("policies", 26),
    ("load s", 7),
    ("replay s", 9),
    ("jobs/s", 9),
    ("\u00b5s/job", 8),
    ("start s", 7),
    ("peak RSS MiB", 12),
    ("RSS after load MiB", 18),
)


# --------------------------------------------------------------------------- one run (child)


def _maxrss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _current_rss_bytes() -> int:
    """Resident set size now, from /proc/self/statm; the peak so far where that is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _maxrss_bytes()


def _trim_heap() -> None:
    """Give freed heap back to the OS (glibc `malloc_trim`), so RSS counts live data only."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux >= 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _load(workload: str, traces: Path) -> Any:
    """The workload's `Trace`."""
    if workload in ARCHIVE_TRACES:
        from cosched.traces.swf import read_swf

        return read_swf(traces / ARCHIVE_TRACES[workload])
    from workloads.lublin import generate

    if workload in WIDE_PROCS:
        return generate(WIDE_JOBS, LUBLIN_PROCS, seed=LUBLIN_SEED, load=LUBLIN_LOAD)
    trace = generate(LUBLIN_JOBS, LUBLIN_PROCS, seed=LUBLIN_SEED, load=LUBLIN_LOAD)
    if workload == "lublin50k":
        # Copies, not views: the 500k columns are freed, so RSS is that of a 50k trace.
        trace = trace.slice(0, LUBLIN_SMALL)
        trace.columns = {name: column.copy() for name, column in trace.columns.items()}
    elif workload != "lublin500k":
        raise SystemExit(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    return trace


def run_peer(workload: str, peer: Path, traces: Path, repeat: int) -> dict[str, Any]:
    """DIR-LAB's FCFS + EASY on an archive trace (`dirlab_peer`), measured as `run_one` measures ours."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dirlab_peer

    started = time.perf_counter()
    env = dirlab_peer.prepare(peer, traces / ARCHIVE_TRACES[workload])
    load_seconds = time.perf_counter() - started
    gc.collect()
    _trim_heap()
    rss_after_load = _current_rss_bytes()
    load_peak = _maxrss_bytes()
    peak_reset = _reset_peak_rss()
    seconds = dirlab_peer.schedule(env, repeat)
    jobs = env.loads.size()
    return {
        "workload": workload,
        "policies": PEER_LABEL,
        "start_s": 0.0,
        "jobs": jobs,
        "finished": jobs,
        "rejected": 0,
        "load_s": load_seconds,
        "replay_s": seconds,
        "peak_rss": _maxrss_bytes(),
        "peak_reset": peak_reset,
        "load_peak_rss": load_peak,
        "rss_after_load": rss_after_load,
    }


def run_one(workload: str, policy: str, traces: Path, repeat: int) -> dict[str, Any]:
    """Load `workload`, replay it `repeat` times under `policy` (queue:backfill:estimate)."""
    from cosched.model import Job
    from cosched.replay.driver import PolicySet, replay

    queue, backfill, estimate = policy.split(":")
    started = time.perf_counter()
    trace = _load(workload, traces)
    load_seconds = time.perf_counter() - started
    cluster = trace.cluster(procs=WIDE_PROCS.get(workload))
    gc.collect()
    _trim_heap()
    rss_after_load = _current_rss_bytes()
    load_peak = _maxrss_bytes()
    peak_reset = _reset_peak_rss()

    policies = PolicySet(queue, backfill, estimate)
    best = float("inf")
    finished = rejected = 0
    for _ in range(repeat):
        result = replay(trace.jobs(), cluster, policies, keep_slots=False)
        best = min(best, result.seconds)
        finished, rejected = len(result.jobs), len(result.rejected)
        del result
        gc.collect()
    start = min(
        replay([Job(id=1, submit=0.0, cores=1, walltime=1.0, runtime=1.0)], cluster, policies).seconds
        for _ in range(repeat)
    )
    return {
        "workload": workload,
        "policies": policies.label,
        "start_s": start,
        "jobs": len(trace),
        "finished": finished,
        "rejected": rejected,
        "load_s": load_seconds,
        "replay_s": best,
        "peak_rss": _maxrss_bytes(),
        "peak_reset": peak_reset,
        "load_peak_rss": load_peak,
        "rss_after_load": rss_after_load,
    }


# --------------------------------------------------------------------------- driver (parent)


@dataclass(slots=True)
class Row:
    """One line of the table: a finished run, or why there is none."""

    workload: str
    policies: str
    result: dict[str, Any] | None = None
    problem: str = ""

    def cells(self) -> list[str]:
        r = self.result
        if r is None:
            return [self.workload, "-", self.policies, self.problem]
        jobs, seconds = r["jobs"], r["replay_s"]
        peak = f"{r['peak_rss'] / MIB:.0f}" + ("" if r["peak_reset"] else "+")
        return [
            self.workload,
            f"{jobs}",
            self.policies,
            f"{r['load_s']:.2f}",
            f"{seconds:.2f}",
            f"{jobs / seconds:,.0f}" if seconds > 0 else "-",
            f"{seconds / jobs * 1e6:.1f}" if jobs else "-",
            f"{r['start_s']:.2f}",
            peak,
            f"{r['rss_after_load'] / MIB:.0f}",
        ]


def _format(cells: Sequence[str]) -> str:
    """Cells under the columns; a short row's last cell (a problem) runs on to the right."""
    parts = []
    for i, (cell, (_, width)) in enumerate(zip(cells, COLUMNS, strict=False)):
        short_tail = len(cells) < len(COLUMNS) and i == len(cells) - 1
        parts.append(cell if short_tail else cell.ljust(width) if i in (0, 2) else cell.rjust(width))
    return "  ".join(parts).rstrip()


def _header() -> str:
    return _format([name for name, _ in COLUMNS]) + "\n" + "  ".join("-" * w for _, w in COLUMNS)


def policy_sets(only: str | None) -> list[str]:
    """`queue:backfill:estimate` strings: the registry's pairs, or those of `--only-pairs`."""
    if only:
        sets = []
        for item in filter(None, (p.strip() for p in only.split(","))):
            fields = item.split(":")
            if not 2 <= len(fields) <= 3 or not all(fields):
                raise SystemExit(f"bad pair {item!r}; expected queue:backfill[:estimate]")
            sets.append(":".join([*fields, "requested"][:3]))
        return sets
    from cosched.policies.registry import available

    pairs = [f"{q}:{b}:requested" for q in available("queue") for b in available("backfill")]
    return [*pairs, "fcfs:easy:actual"]


def _label(policy: str) -> str:
    if policy == PEER:
        return PEER_LABEL
    queue, backfill, estimate = policy.split(":")
    return f"{queue}+{backfill}" + ("" if estimate == "requested" else f"-{estimate}")


def _spawn(workload: str, policy: str, traces: Path, repeat: int, timeout: float, peer: Path | None = None) -> Row:
    """Run one (workload, policy set) in a fresh interpreter and parse its result line."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        f"{workload}:{policy}",
        "--traces",
        str(traces),
        "--repeat",
        str(repeat),
        *(["--peer", str(peer)] if peer else []),
    ]
    label = _label(policy)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Row(workload, label, problem=f"timeout (>{timeout:g} s)")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return Row(workload, label, json.loads(line[len(RESULT_TAG) :]))
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return Row(workload, label, problem=f"error: {last[:160]}")


def _peer_version(peer: Path) -> str:
    """The peer checkout's commit, where git can tell."""
    try:
        done = subprocess.run(["git", "-C", str(peer), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return "commit unknown"
    return f"commit {done.stdout.strip()}" if done.returncode == 0 else "commit unknown"


def _machine() -> str:
    return (
        f"machine: {os.cpu_count()} CPUs, {platform.platform()}, {platform.machine()}; "
        f"Python {platform.python_version()} ({platform.python_implementation()})"
    )


def _find(rows: Sequence[Row], workload: str, label: str) -> dict[str, Any] | None:
    for row in rows:
        if row.workload == workload and row.policies == label and row.result is not None:
            return row.result
    return None


def _per_job(result: dict[str, Any], *, net: bool = False) -> float:
    seconds = result["replay_s"] - (result["start_s"] if net else 0.0)
    return seconds / result["jobs"] * 1e6


def _notes(rows: Sequence[Row]) -> list[str]:
    notes = []
    small, big = _find(rows, "lublin50k", "fcfs+easy"), _find(rows, "lublin500k", "fcfs+easy")
    if small and big:
        notes.append(
            f"FCFS+EASY \u00b5s/job, lublin500k / lublin50k: {_per_job(big):.1f} / {_per_job(small):.1f} "
            f"= {_per_job(big) / _per_job(small):.2f} (1.00 = time per job flat as the trace grows 10x)"
        )
    base = _find(rows, "wide256", "fcfs+easy")
    for wide in ("wide93k", "wide1m"):
        found = _find(rows, wide, "fcfs+easy")
        if base and found:
            big, small = _per_job(found, net=True), _per_job(base, net=True)
            notes.append(
                f"FCFS+EASY \u00b5s/job net of start, {wide} / wide256: {big:.1f} / {small:.1f} "
                f"= {big / small:.2f} (1.00 = time per job flat as the machine grows)"
            )
    for workload in ARCHIVE_TRACES:
        ours, theirs = _find(rows, workload, "fcfs+easy"), _find(rows, workload, PEER_LABEL)
        if ours and theirs:
            mine, peer = ours["jobs"] / ours["replay_s"], theirs["jobs"] / theirs["replay_s"]
            notes.append(
                f"FCFS+EASY on {workload}: cosched {mine:,.0f} jobs/s, DIR-LAB's simulator {peer:,.0f} jobs/s "
                f"in the same run: {mine / peer:.1f} times as fast"
            )
    for workload in WORKLOADS:
        easy = _find(rows, workload, "fcfs+easy")
        ratios = [
            f"{row.policies.removesuffix('+conservative')} {row.result['replay_s'] / easy['replay_s']:.1f}"
            for row in rows
            if easy and row.workload == workload and row.result and row.policies.endswith("+conservative")
        ]
        if ratios:
            notes.append(f"conservative's time / fcfs+easy's on {workload}: {', '.join(ratios)}")
    sp2 = _find(rows, "sp2", "fcfs+easy")
    if sp2 is None:
        verdict = "not measured"
    else:
        rate = sp2["jobs"] / sp2["replay_s"]
        verdict = f"{'met' if rate >= GOAL_JOBS_PER_S else 'NOT met'} ({rate:,.0f} jobs/s)"
    notes.append(f"goal: FCFS+EASY on SDSC-SP2 >= {GOAL_JOBS_PER_S:,} jobs/s: {verdict}")
    if any(r.result and not r.result["peak_reset"] for r in rows):
        notes.append("+ peak RSS of the whole process, loading included (high-water mark reset refused)")
    for r in rows:
        res = r.result
        if res is None or res["finished"] + res["rejected"] == res["jobs"]:
            continue
        notes.append(
            f"! {r.workload} {r.policies}: {res['finished']} finished + {res['rejected']} rejected "
            f"of {res['jobs']} jobs"
        )
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder of the SWF archive logs")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of: {', '.join(WORKLOADS)} (default all)"
    )
    parser.add_argument("--only-pairs", help="comma-separated queue:backfill[:estimate] (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="replays per run; the best time is kept")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed")
    parser.add_argument(
        "--peer", type=Path, help="a checkout of DIR-LAB/RLBackfilling: its FCFS+EASY runs on each archive trace too"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child mode: workload:queue:backfill:estimate
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")

    if args.one:
        workload, _, policy = args.one.partition(":")
        if policy == PEER:
            result = run_peer(workload, args.peer, args.traces, args.repeat)
        else:
            result = run_one(workload, policy, args.traces, args.repeat)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0
    if args.peer is not None and not (args.peer / "rlbackfill.py").is_file():
        parser.error(f"--peer {args.peer}: no rlbackfill.py there (a checkout of DIR-LAB/RLBackfilling is expected)")

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        parser.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    sets = policy_sets(args.only_pairs)

    print(_machine())
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"traces: {args.traces}; repeat {args.repeat} (best kept); timeout {args.timeout:g} s per run")
    if args.peer is not None:
        print(f"peer: DIR-LAB's simulator from {args.peer} ({_peer_version(args.peer)})")
    print()
    print(_header(), flush=True)
    rows: list[Row] = []
    for workload in workloads:
        name = ARCHIVE_TRACES.get(workload)
        if name is not None and not (args.traces / name).is_file():
            row = Row(workload, "all", problem="skipped (absent)")
            rows.append(row)
            print(_format(row.cells()), flush=True)
            continue
        for policy in sets:
            row = _spawn(workload, policy, args.traces, args.repeat, args.timeout)
            rows.append(row)
            print(_format(row.cells()), flush=True)
        if args.peer is not None and name is not None:
            row = _spawn(workload, PEER, args.traces, args.repeat, args.timeout, args.peer)
            rows.append(row)
            print(_format(row.cells()), flush=True)
    print()
    for note in _notes(rows):
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The daemon on a real Mesos cluster of many agents on this host, measured and printed as one table.

    python benchmarks/mesos.py [--agents 24] [--queued 10000] [--passes 20]

One `cosched daemon` (in this process, its real scheduling pass) on a real master with
`--agents` agents of 1.1 CPUs and 256 MiB each (one core per node, the rest for the executor):

- burst launch: every node gets a 1-core job at once, submitted while offers are suppressed
  (the queue was empty): per job, from the launch decided to its task running, and from the
  offer it used arriving to its task running (offer-to-launch).
- single launch: one job into an idle, suppressed cluster, 5 times: the same two latencies.
- gang launch: a job of 2 cores spread over 2 agents, the same way: its parts are held, made and
  not started, until both are, then told to start (the start barrier).
- pass: with `--queued` jobs waiting (gangs of every core, which start only on an idle cluster),
  a running job is cancelled and, once its end is reported, one scheduling pass is timed:
  collecting the end from the Mesos backend, the core's step over the whole queue (EASY),
  the pass's SQLite transaction, acknowledging the end. Median and p95 of `--passes`.
- offers: the master's own counters for the framework over the whole run (sent, accepted,
  declined, rescinded) and the offers it still held at the end: unused offers are declined.

Needs ../shared/mesos (installed to /opt/mesos when absent, as root) and a Docker engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from daemon_support import require_engine
from mesos_support import EXECUTOR, Cluster, start_cluster, stop_cluster, wait_until

from cosched.daemon.config import from_dict
from cosched.daemon.service import Daemon
from cosched.daemon.specs import JobSpec
from cosched.mesos.backend import MesosBackend
from cosched.reporting.report import format_table
from workloads.images import busybox_image

NAME = "cosched-bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.0f} ms, p95 {percentile(values, 0.95) * 1000:.0f} ms"


def daemon_on(cluster: Cluster, state: Path, agents: int) -> Daemon:
    config = from_dict(
        {
            "daemon": {"state_dir": str(state)},
            "cluster": {"nodes": agents, "cores": agents, "memory_mib": agents * 128},
            "backend": {"kind": "mesos"},
            "mesos": {"masters": cluster.master, "name": NAME, "executor_command": EXECUTOR},
            "policies": {"cosched": "none"},
        }
    )
    daemon = Daemon(config)
    daemon.start()
    return daemon


def run_until(daemon: Daemon, done: object, timeout: float) -> None:
    """Scheduling passes, as the daemon's timer makes them, until `done()`."""
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done in {timeout:.0f} s")
        daemon.schedule()
        time.sleep(0.05)


def states(daemon: Daemon, ids: list[int]) -> list[str]:
    return [str((daemon.store.job(i) or {}).get("state")) for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=24)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    image = busybox_image(require_engine())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        cluster = start_cluster(Path(tmp) / "mesos", cpus=1.1, mem=256, agents=args.agents)
        print(f"{args.agents} agents up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        daemon = None
        try:
            daemon = daemon_on(cluster, Path(tmp) / "state", args.agents)
            backend = daemon.backend
            assert isinstance(backend, MesosBackend)
            fid = backend.framework_id or ""
            sleeper = {"image": image, "command": ["sleep", "3600"], "cores": 1, "memory_mib": 32, "walltime": 7200}

            # single launches into an idle cluster (offers suppressed)
            singles = []
            suppressed = lambda: cluster.metric(NAME, fid, "calls/suppress")  # noqa: E731
            run_until(daemon, lambda: suppressed() >= 1, 30)
            for _ in range(5):
                count = suppressed()
                job = daemon.submit_job(JobSpec(**{**sleeper, "command": ["true"]}))
                run_until(daemon, lambda job=job: states(daemon, [job]) == ["done"], 60)
                singles.append(backend.latencies[-1])
                run_until(daemon, lambda count=count: suppressed() > count, 30)  # idle again: offers suppressed
            rows.append(
                {
                    "measure": "single launch, from suppressed",
                    "latency": ms([s[0] for s in singles]),
                    "offer-to-launch": ms([s[1] for s in singles]),
                }
            )

            # gangs of two agents, the same way: each part held, made and not started, until both are
            gangs = []
            pair = {**sleeper, "command": ["true"], "cores": 2, "span": True, "memory_mib": 64}
            for _ in range(5):
                count = suppressed()
                job = daemon.submit_job(JobSpec(**pair))
                run_until(daemon, lambda job=job: states(daemon, [job]) == ["done"], 60)
                gangs.append(backend.latencies[-1])
                run_until(daemon, lambda count=count: suppressed() > count, 30)
            rows.append(
                {
                    "measure": "gang of 2 agents, from suppressed",
                    "latency": ms([g[0] for g in gangs]),
                    "offer-to-launch": ms([g[1] for g in gangs]),
                }
            )

            # a burst: one job per node at once
            before = len(backend.latencies)
            burst = [daemon.submit_job(JobSpec(**sleeper)) for _ in range(args.agents)]
            run_until(daemon, lambda: set(states(daemon, burst)) == {"running"}, 300)
            latencies = list(backend.latencies)[before:]
            rows.append(
                {
                    "measure": f"burst of {args.agents} launches",
                    "latency": ms([x[0] for x in latencies]),
                    "offer-to-launch": ms([x[1] for x in latencies]),
                }
            )

            # passes with a long queue
            # Each queued job needs every core: none starts while any runs, so no pass below launches.
            gang = {**sleeper, "cores": args.agents, "span": True, "memory_mib": 32 * args.agents}
            spec = JobSpec(**gang)
            for _ in range(args.queued):
                daemon.submit_job(spec)
            daemon.schedule()  # the core takes the queue in
            assert len(daemon.core.queue) == args.queued, len(daemon.core.queue)
            passes = []
            for victim in burst[: args.passes]:
                daemon.cancel(victim)
                daemon.schedule()  # the kill
                wait_until(lambda v=victim: backend.containers()[v].state == "exited", 60, "the end reported")
                begin = time.perf_counter()
                daemon.schedule()
                passes.append(time.perf_counter() - begin)
                assert states(daemon, [victim]) == ["cancelled"]
            rows.append(
                {
                    "measure": f"pass, {args.queued:,} queued, {args.agents} agents",
                    "latency": ms(passes),
                    "offer-to-launch": "-",
                }
            )

            time.sleep(backend.settings.hold_timeout / 10)
            counts = {
                k: cluster.metric(NAME, fid, f"offers/{k}") for k in ("sent", "accepted", "declined", "rescinded")
            }
            held = len((cluster.framework(fid) or {}).get("offers", []))
            rows.append(
                {
                    "measure": "offers (master's counters)",
                    "latency": ", ".join(f"{k} {v:.0f}" for k, v in counts.items()),
                    "offer-to-launch": f"held now {held}; declined {counts['declined'] / counts['sent']:.0%} of sent",
                }
            )
        finally:
            if daemon is not None:
                daemon.close()
            stop_cluster(cluster)
    print(format_table(rows, ["measure", "latency", "offer-to-launch"]))


if __name__ == "__main__":
    main()

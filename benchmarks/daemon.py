"""The daemon's four speed goals, measured and printed as one table.

    python benchmarks/daemon.py [--only pass,submit,quota,launch,monitor] [--monitor-seconds 60]

- pass: one scheduling pass (a job ends, one arrives; core step with EASY and ASAx,
  then the pass's SQLite transaction) with 10,000 queued jobs on 1,000 nodes of 32
  cores, every node busy. Goal: median under 10 ms. No Docker call is in it: the
  engine's own latency per container is measured by `quota` below.
- submit: jobs POSTed to a running daemon's API by 8 client threads; every answered
  id is then looked up in the state file. Goal: 1,000/s, none lost.
- quota: a running container's CPU quota changed through Docker and read back from
  its cgroup (what the daemon does for every lending). Goal: under 1 s.
- launch: end-to-end launch throughput on the real engine: 48 one-core jobs submitted
  at once to a daemon with 48 cores, timed until the store says every one runs in its
  container. Beside it, in the same run, the engine's own rate (48 containers created
  and started by 8 threads calling it directly) and the daemon with its engine calls
  made one at a time (engine_calls = 1, what it did before). Goal: the daemon reaches
  80% of the engine's own rate.
- monitor: the daemon's CPU time while it watches 50 running containers with its
  default intervals (50 one-core jobs on a cluster oversubscribing this host's CPUs).
  Goal: under 2% of one core.
The last four need a Docker engine (`bash deploy/docker-setup.sh`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cosched.core.events import JobEnded, JobSubmitted, Offer, UsageReported
from cosched.daemon import ends, plan, submissions
from cosched.daemon.config import DockerSection, from_dict
from cosched.daemon.service import Daemon
from cosched.model import Usage
from cosched.reporting.report import format_table


def bench_pass(queued: int = 10_000, nodes: int = 1_000, cores: int = 32, passes: int = 300) -> dict:
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        config = from_dict(
            {
                "daemon": {"state_dir": tmp},
                "cluster": {"nodes": nodes, "cores": nodes * cores, "memory_mib": nodes * 256 * 1024},
            }
        )
        daemon = Daemon(config)
        core = daemon.core
        spec = {"image": "x", "command": ["true"], "cores": cores, "walltime": 3600.0, "app_class": "bench"}
        now = time.time()
        with daemon.store.transaction() as db:
            ids = [daemon.store.add_job(db, spec, now) for _ in range(nodes + queued + passes)]
        running = [submissions.job_from(daemon, i, spec, now, "") for i in ids[:nodes]]
        for job in running:
            job.walltime = rng.uniform(600, 7200)
        waiting = [
            submissions.job_from(daemon, i, {**spec, "cores": rng.choice([1, 4, 16, 32, 64])}, now, "")
            for i in ids[nodes:]
        ]
        daemon.specs.update({i: spec for i in ids})
        offer = Offer(tuple((n, cores) for n in range(nodes)), (config.memory_mib() // nodes,) * nodes)
        decision = core.step(now, [offer, *(JobSubmitted(j) for j in running)])
        with daemon.store.transaction() as db:
            plan.record(daemon, db, now, [], [], decision.actions)
        core.step(now, [UsageReported(j.id, Usage(0.9, 0.3, 1, now)) for j in running])
        core.step(now, [JobSubmitted(j) for j in waiting[:queued]])
        arrivals = waiting[queued:]
        times = []
        for k in range(passes):
            now += 1.0
            victim = min(core.running, key=lambda j: j.expected_end)
            started = time.perf_counter()
            events = [JobEnded(victim.id, at=now), ends.freed(daemon, victim, set()), JobSubmitted(arrivals[k])]
            decision = core.step(now, events)
            with daemon.store.transaction() as db:  # the pass's own: all it decides, before doing any
                plan.record(daemon, db, now, [], [], decision.actions)
            times.append(time.perf_counter() - started)
        daemon.store.close()
    times.sort()
    return {
        "goal": "pass: median < 10 ms",
        "measured": f"median {statistics.median(times) * 1e3:.2f} ms, p99 {times[int(len(times) * 0.99)] * 1e3:.2f} ms",
        "setting": f"{len(core.queue)} queued, {nodes} nodes x {cores} cores, EASY + ASAx, {passes} passes",
        "met": statistics.median(times) < 0.010,
    }


def bench_submit(total: int = 4000, threads: int = 8) -> dict:
    import http.client
    import json

    from daemon_support import DaemonProcess, require_engine

    from workloads.images import busybox_image

    client = require_engine()
    image = busybox_image(client)
    with tempfile.TemporaryDirectory() as tmp:
        daemon = DaemonProcess(Path(tmp))
        daemon.config.write_text(daemon.config.read_text().split("[intervals]")[0])  # the default intervals
        daemon.start()
        accepted: list[int] = []
        refused = [0]
        lock = threading.Lock()
        body = {"image": image, "command": ["sleep", "3600"], "cores": 1, "walltime": 3600}

        payload = json.dumps(body)

        def worker(count: int) -> None:
            connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
            headers = {"Content-Type": "application/json"}
            for _ in range(count):
                connection.request("POST", "/v1/jobs", payload, headers)
                response = connection.getresponse()
                answer = response.read()
                with lock:
                    if response.status == 201:
                        accepted.append(json.loads(answer)["id"])
                    else:
                        refused[0] += 1
            connection.close()

        pool = [threading.Thread(target=worker, args=(total // threads,)) for _ in range(threads)]
        started = time.perf_counter()
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - started
        daemon.signal()  # SIGKILL: whatever was answered must already be on disk
        with daemon.db() as db:
            stored = {row[0] for row in db.execute("SELECT id FROM jobs")}
        daemon.cleanup(client)
    lost = len(set(accepted) - stored)
    rate = len(accepted) / elapsed
    return {
        "goal": "submit: 1,000/s, none lost",
        "measured": f"{rate:,.0f}/s; {len(accepted)} accepted, {refused[0]} refused, {lost} lost after SIGKILL",
        "setting": f"{threads} client threads (http.client, keep-alive), {total} jobs, default intervals",
        "met": rate >= 1000 and lost == 0 and refused[0] == 0,
    }


def bench_quota(changes: int = 200) -> dict:
    from daemon_support import require_engine

    from cosched.daemon.docker_backend import DockerBackend
    from workloads.images import busybox_image

    client = require_engine()
    image = busybox_image(client)
    backend = DockerBackend("bench-quota", DockerSection())
    backend.connect()
    spec = {"image": image, "command": ["sleep", "600"], "cores": 1}
    container, _ = backend.launch(0, spec, [0], 1.0, 64)
    times = []
    try:
        for k in range(changes):
            cpus = 0.1 + 0.8 * ((k * 37) % 100) / 100
            started = time.perf_counter()
            backend.set_quota(container, cpus)  # returns once the cgroup shows it (QuotaMismatch otherwise)
            times.append(time.perf_counter() - started)
    finally:
        backend.remove(container)
    times.sort()
    return {
        "goal": "quota decision -> cgroup: < 1 s",
        "measured": f"median {statistics.median(times) * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms",
        "setting": f"{changes} changes, docker update + cgroup read-back",
        "met": times[-1] < 1.0,
    }


def bench_launch(jobs: int = 48, workers: int = 8) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from daemon_support import DaemonProcess, require_engine

    from cosched.daemon.docker_backend import DockerBackend
    from workloads.images import busybox_image

    client = require_engine()
    image = busybox_image(client)
    spec = {"image": image, "command": ["sleep", "3600"], "cores": 1}
    backend = DockerBackend("bench-launch", DockerSection())
    backend.connect()
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        made = list(pool.map(lambda k: backend.launch(k, spec, "0", 1.0, 16)[0], range(jobs)))
    engine_rate = jobs / (time.perf_counter() - started)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(backend.remove, made))
    rates = {}
    for calls in (1, workers):
        with tempfile.TemporaryDirectory() as tmp:
            daemon = DaemonProcess(Path(tmp), cores=jobs, docker=f"engine_calls = {calls}")
            daemon.start()
            try:
                started = time.perf_counter()
                for _ in range(jobs):
                    daemon.submit(image=image, command=["sleep", "3600"], cores=1, memory_mib=16, walltime=7200)
                deadline = time.monotonic() + 300
                while True:
                    with daemon.db() as db:
                        running = db.execute("SELECT count(*) FROM jobs WHERE state = 'running'").fetchone()[0]
                    if running == jobs:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"only {running} of {jobs} jobs running after 300 s")
                    time.sleep(0.05)
                rates[calls] = jobs / (time.perf_counter() - started)
            finally:
                daemon.cleanup(client)
    share = rates[workers] / engine_rate
    return {
        "goal": "launch: >= 80% of the engine's own rate",
        "measured": (
            f"{rates[workers]:.1f} jobs/s ({share:.0%} of the engine's {engine_rate:.1f}/s); "
            f"one call at a time {rates[1]:.1f}/s"
        ),
        "setting": f"{jobs} one-core jobs submitted at once until all run; engine: {workers} threads creating directly",
        "met": share >= 0.8,
    }


def bench_monitor(containers: int = 50, seconds: float = 60.0) -> dict:
    import psutil
    from daemon_support import DaemonProcess, require_engine

    from workloads.images import busybox_image

    client = require_engine()
    image = busybox_image(client)
    with tempfile.TemporaryDirectory() as tmp:
        daemon = DaemonProcess(Path(tmp), cores=containers)
        daemon.config.write_text(daemon.config.read_text().split("[intervals]")[0])  # the default intervals
        daemon.start()
        try:
            ids = [
                daemon.submit(image=image, command=["sleep", "3600"], cores=1, memory_mib=64, walltime=7200)
                for _ in range(containers)
            ]
            deadline = time.monotonic() + 120
            while sum(daemon.job(i)["state"] == "running" for i in ids) < containers:
                if time.monotonic() > deadline:
                    raise RuntimeError("containers did not all start")
                time.sleep(1)
            assert daemon.process is not None
            process = psutil.Process(daemon.process.pid)
            before = process.cpu_times()
            time.sleep(seconds)
            after = process.cpu_times()
        finally:
            daemon.cleanup(client)
    used = (after.user + after.system) - (before.user + before.system)
    share = used / seconds
    return {
        "goal": "monitor 50 containers: < 2% of a core",
        "measured": f"{share:.2%} of one core",
        "setting": f"{containers} running containers, default intervals, {seconds:.0f} s",
        "met": share < 0.02,
    }


BENCHES = {
    "pass": bench_pass,
    "submit": bench_submit,
    "quota": bench_quota,
    "launch": bench_launch,
    "monitor": bench_monitor,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated: " + ", ".join(BENCHES))
    parser.add_argument("--monitor-seconds", type=float, default=60.0)
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        if name not in BENCHES:
            parser.error(f"unknown benchmark {name!r}; known: {', '.join(BENCHES)}")
        result = BENCHES[name](seconds=args.monitor_seconds) if name == "monitor" else BENCHES[name]()
        result["met"] = "yes" if result["met"] else "NO"
        rows.append(result)
        print(f"{result['goal']}: {result['measured']}", file=sys.stderr)
    print(format_table(rows, ["goal", "measured", "met", "setting"]))


if __name__ == "__main__":
    main()

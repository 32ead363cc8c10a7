"""A stage's own cgroup accounting, written as it exits: CPU seconds and peak memory.

Why the stage writes it: a container's cgroup disappears with the container,
so nobody outside can read its final counters. The stage program is the
container's first process, so everything the container ran is in its cgroup
and the counters read just before exit are the container's totals (cgroup v1:
cpuacct.usage, memory.max_usage_in_bytes; v2: cpu.stat usage_usec, memory.peak).
Utilization is then measured CPU, not requested cores. Outside a container
(stage tests on the host) the files would be the host's, so nothing is written.

Memory is the peak of the cgroup's anonymous memory (v1 total_rss, v2 anon),
sampled every 0.1 s by a thread: the cgroup's own peak counter also counts the
page cache, which for file-heavy stages (Montage, Statistics) is most of it
and is not memory the stage needs.
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from pathlib import Path

_CPU = (("/sys/fs/cgroup/cpuacct/cpuacct.usage", 1e-9), ("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage", 1e-9))
_MEMORY_STAT = (("/sys/fs/cgroup/memory/memory.stat", "total_rss"), ("/sys/fs/cgroup/memory.stat", "anon"))


def in_container() -> bool:
    return Path("/.dockerenv").exists() or "COSCHED_JOB_ID" in os.environ


def cgroup_cpu_seconds() -> float | None:
    for path, scale in _CPU:
        try:
            return int(Path(path).read_text()) * scale
        except (OSError, ValueError):
            continue
    try:
        for line in Path("/sys/fs/cgroup/cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1e-6
    except (OSError, ValueError):
        pass
    return None


def cgroup_anon_bytes() -> int | None:
    for path, key in _MEMORY_STAT:
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


class PeakMemory:
    """The largest anonymous memory of this container seen while the stage runs."""

    def __init__(self, interval: float = 0.1) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._interval = interval

    def start(self) -> PeakMemory:
        if in_container() and cgroup_anon_bytes() is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, cgroup_anon_bytes() or 0)

    def stop(self) -> int | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        return max(self.peak, cgroup_anon_bytes() or 0)


def record(work_dir: Path, name: str, started: float, peak: int | None) -> None:
    """Write DIR/.usage/<name>.json: wall seconds, CPU seconds and peak bytes of this container."""
    if not in_container():
        return
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cgroup_cpu_seconds()
    document = {
        "wall_seconds": time.time() - started,
        "cpu_seconds": cpu if cpu is not None else own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
        "cpu_source": "cgroup" if cpu is not None else "rusage",
        "peak_bytes": peak if peak is not None else max(own.ru_maxrss, children.ru_maxrss) * 1024,
        "memory_source": "cgroup" if peak is not None else "rusage",
        "cores": int(os.environ.get("COSCHED_CORES", "0") or 0),
    }
    folder = work_dir / ".usage"
    folder.mkdir(exist_ok=True)
    temporary = folder / f".{name}.json.tmp"
    temporary.write_text(json.dumps(document))
    os.replace(temporary, folder / f"{name}.json")

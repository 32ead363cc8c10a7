"""A container's cgroup files, read straight from the kernel (cgroup v1 or v2).

Why not `docker stats`: one stats call blocks for about a second per container
(it waits for two samples), so monitoring fifty containers that way would be
the daemon's main cost. The cgroup files cost microseconds. They are also the
ground truth for quotas: after Docker is asked for a quota, the value the
kernel enforces is read back from here, and a mismatch is an error.

Paths come from `/proc/<pid>/cgroup` of the container's first process and the
cgroup mounts in `/proc/self/mountinfo`, so they work whatever cgroup driver
or nesting the engine uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class CgroupFiles:
    """Where one process's CPU, CPU accounting and memory controllers live."""

    version: int
    cpu: Path
    cpuacct: Path
    memory: Path

    @classmethod
    def of_pid(cls, pid: int, proc: Path = PROC) -> CgroupFiles | None:
        """The cgroup directories of `pid`, or None if they cannot be found (process gone, or exiting)."""
        try:
            membership = (proc / str(pid) / "cgroup").read_text()
            mounts = (proc / "self" / "mountinfo").read_text()
        except OSError:
            return None
        if _exiting(proc, pid):  # read after the membership: not exiting now, it was not then either
            return None
        v1: dict[str, str] = {}
        v2 = None
        for line in membership.splitlines():
            number, controllers, path = line.split(":", 2)
            if number == "0" and not controllers:
                v2 = path
            for controller in controllers.split(","):
                v1[controller] = path
        v1_mounts, v2_mount = _mounts(mounts)
        if "cpu" in v1 and "cpu" in v1_mounts:

            def where(controller: str) -> Path:
                mount, root = v1_mounts[controller]
                return Path(mount) / _relative(v1[controller], root)

            return cls(1, where("cpu"), where("cpuacct"), where("memory"))
        if v2 is not None and v2_mount is not None:
            mount, root = v2_mount
            directory = Path(mount) / _relative(v2, root)
            return cls(2, directory, directory, directory)
        return None

    def quota(self) -> tuple[int, int]:
        """(quota, period) in microseconds as the kernel enforces them; quota -1 = unlimited."""
        if self.version == 1:
            quota = int((self.cpu / "cpu.cfs_quota_us").read_text())
            period = int((self.cpu / "cpu.cfs_period_us").read_text())
            return quota, period
        quota_text, period_text = (self.cpu / "cpu.max").read_text().split()
        return (-1 if quota_text == "max" else int(quota_text)), int(period_text)

    def cpu_seconds(self) -> float:
        """CPU time used by every process in the group since it was made."""
        if self.version == 1:
            return int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9
        for line in (self.cpu / "cpu.stat").read_text().splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"no usage_usec in {self.cpu / 'cpu.stat'}")

    def memory_bytes(self) -> tuple[int, int]:
        """(in use without reclaimable page cache, limit), as `docker stats` counts them."""
        if self.version == 1:
            usage = int((self.memory / "memory.usage_in_bytes").read_text())
            limit = int((self.memory / "memory.limit_in_bytes").read_text())
            inactive = _stat(self.memory / "memory.stat", "total_inactive_file")
        else:
            usage = int((self.memory / "memory.current").read_text())
            text = (self.memory / "memory.max").read_text().strip()
            limit = -1 if text == "max" else int(text)
            inactive = _stat(self.memory / "memory.stat", "inactive_file")
        return max(0, usage - inactive), limit


def _mounts(mountinfo: str) -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """v1 controller -> (mount point, root), and the v2 (mount point, root) if mounted."""
    v1: dict[str, tuple[str, str]] = {}
    v2 = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        parts, tail = left.split(), right.split()
        if len(parts) < 5 or len(tail) < 3:
            continue
        root, mount_point = parts[3], parts[4]
        fstype, options = tail[0], tail[2]
        if fstype == "cgroup2":
            v2 = (mount_point, root)
        elif fstype == "cgroup":
            for option in options.split(","):
                v1.setdefault(option, (mount_point, root))
    return v1, v2


PF_EXITING = 0x4
"""The kernel's flag of a task that has begun to exit (`/proc/PID/stat`'s ninth field); never cleared."""


def _exiting(proc: Path, pid: int) -> bool:
    """Whether `pid` has begun to exit, zombies included (or is gone). On cgroup v1 the kernel shows
    such a task in the root cgroup of every hierarchy, so a container whose process had just exited
    was read as the host's own group: its quota 'unlimited' (a mismatch, applied again) and its
    CPU seconds those of the whole host since boot, kept as the job's in its history."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return True
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    try:
        return fields[0] in ("Z", "X") or bool(int(fields[6]) & PF_EXITING)
    except (IndexError, ValueError):
        return True


def _relative(path: str, root: str) -> str:
    if root != "/" and path.startswith(root):
        path = path[len(root) :]
    return path.lstrip("/")


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except OSError:
        pass
    return 0

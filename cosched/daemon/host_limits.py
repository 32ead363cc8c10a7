"""What jobs can take of the host's kernel tables that no cgroup bounds.

A job's memory, CPU and processes are its cgroup's; some kernel tables are the host's, and one
job filling one fails every other job, and host users too (a helper's audit):
- open files: Docker 20.10 bounds a job only by `nofile` per process times `pids_limit` processes
  (16.7 million at the defaults), and Debian's default `fs.file-max` is about a tenth of the host's
  memory in KiB (2.5 million on 24 GiB): one job opening `/dev/null` in 500 processes left none
  for any other process not root;
- ptys: every container's share is `kernel.pty.max` less the 1,024 kept for the host's own
  (3,072 by default): one job took them all, and every other job's pty and an operator's
  `docker run -t` failed;
- processes: `pids_limit` bounds one job, and `kernel.pid_max` (32,768 on a host without
  systemd) is eight jobs' worth at the default 4,096; `kernel.threads-max` (an eighth of the
  host's memory in kernel stacks: 192,730 on 24 GiB) bounds the threads of all, 47 jobs' worth;
- per uid: `fs.inotify.max_user_instances` (128) and `fs.epoll.max_user_watches` (5,491,511 on
  24 GiB, about 1.1 GB of jobs' memory at 210 bytes each), and every job of `docker.job_user` is
  one uid: one job took all 128 inotify instances, and no other job, nor a host process of that
  uid, could make one (`tail -f`); with the epoll table lowered to 200,000 to try it, one job's
  registrations left the next job none (ENOSPC: asyncio, libuv, Java's NIO); and
  `fs.pipe-user-pages-soft` (16,384 pages): past it a uid's new pipes hold 2 pages, and one job's
  64 pipes of 1 MiB left every other job's new pipe 8 KiB, not 64.
The kernel charges each file (`filp`), pty (about 3 KiB), process (its kernel stack), inotify instance
(about 1 KiB with a watch) and epoll watch to its job's memory cgroup,
so with each table at its largest a job's memory bounds what it takes (unless the host was booted
with `cgroup.memory=nokmem`, which the daemon says). `deploy/docker-setup.sh`
sets them; the daemon, and each Mesos executor, says at start which are not.
"""

from __future__ import annotations

from pathlib import Path

FILE_MAX_UNBOUNDED = 9223372036854775807
"""The largest `fs.file-max`, as systemd sets it."""
PTY_MAX_LARGEST = 1 << 20
"""The largest `kernel.pty.max` (the kernel's `NR_UNIX98_PTY_MAX`)."""
PID_MAX_LARGEST = 1 << 22
"""The largest `kernel.pid_max` on 64-bit hosts, as systemd sets it."""
INOTIFY_INSTANCES_LARGEST = (1 << 31) - 1
"""The largest `fs.inotify.max_user_instances`."""
EPOLL_WATCHES_LARGEST = FILE_MAX_UNBOUNDED
"""The largest `fs.epoll.max_user_watches` (a long, as `fs.file-max`)."""
PER_UID = (
    ("inotify/max_user_instances", "inotify instances", "none", INOTIFY_INSTANCES_LARGEST),
    ("epoll/max_user_watches", "epoll watches", "none", EPOLL_WATCHES_LARGEST),
    ("pipe-user-pages-soft", "pipe buffer pages", "pipes of 2 pages, not 16", 0),
)
"""Tables of `fs` the kernel keeps per uid, each entry charged to its job's memory: (sysctl, what, what
the others are left, the value that closes it: the largest, or 0 for no limit)."""
JOBS_PER_CPU = 2
"""Jobs one CPU may run at once: its owner and a guest it lends to."""


def read_sysctl(sysctl: Path) -> int | None:
    try:
        return int(sysctl.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None  # a host that does not say


def exposures(
    nofile: int, pids_limit: int, cpus: int, sys: Path = Path("/proc/sys"), *, ptys: bool = True
) -> list[str]:
    """One line per host table a job, or this host's jobs together, can fill, each naming what
    closes it; none where every table is at its largest (or the host does not say). `ptys`
    False: jobs open none (`docker.ptys`)."""
    lines = []
    try:
        booted = (sys.parent / "cmdline").read_text().split()
    except OSError:
        booted = []
    if "cgroup.memory=nokmem" in booted:
        lines.append(
            "the kernel charges no kernel memory to jobs (booted with cgroup.memory=nokmem): the files, ptys, "
            "processes, inotify instances, epoll watches and pipe buffers a job makes are bounded by the host's "
            "tables alone, not by its memory; boot without it"
        )
    file_max = read_sysctl(sys / "fs" / "file-max")
    if file_max is not None and nofile * pids_limit >= file_max:
        lines.append(
            f"one job may open {nofile * pids_limit:,} files (docker.nofile x docker.pids_limit), and the host's "
            f"whole file table is {file_max:,} (fs.file-max): a job can leave none for any other process but "
            f"root's; set sysctl fs.file-max={FILE_MAX_UNBOUNDED} (a job's files are charged to its memory), "
            "or lower docker.nofile"
        )
    pty_max, reserve = read_sysctl(sys / "kernel" / "pty" / "max"), read_sysctl(sys / "kernel" / "pty" / "reserve")
    if ptys and pty_max is not None and pty_max < PTY_MAX_LARGEST:
        shared = max(0, pty_max - (reserve or 0))
        lines.append(
            f"every job takes its ptys from the same {shared:,} (kernel.pty.max less kernel.pty.reserve): one job "
            f"can leave none for any other; set sysctl kernel.pty.max={PTY_MAX_LARGEST} (a job's ptys are "
            "charged to its memory), or docker.ptys = false"
        )
    for name, what, left, closed in PER_UID:
        table = read_sysctl(sys / "fs" / name)
        if table is not None and table != closed:
            key = f"fs.{name.replace('/', '.')}"
            lines.append(
                f"every job of one uid takes its {what} from the same {table:,} ({key}): one job can leave "
                f"{left} to the others, and to the host's processes of its uid; set sysctl {key}={closed} (each "
                "is charged to its job's memory)"
            )
    for name, key, what in (("pid_max", "kernel.pid_max", "pid"), ("threads-max", "kernel.threads-max", "thread")):
        table = read_sysctl(sys / "kernel" / name)
        if table is not None and table < PID_MAX_LARGEST and pids_limit * JOBS_PER_CPU * cpus >= table:
            lines.append(
                f"the host's {table:,} {what}s ({key}) are {table // pids_limit:,} jobs' worth at "
                f"docker.pids_limit {pids_limit:,}, and its {cpus} CPUs may run {JOBS_PER_CPU * cpus} jobs at once: "
                f"they can leave no {what} for the host; set sysctl {key}={PID_MAX_LARGEST}, "
                "or lower docker.pids_limit"
            )
    return lines

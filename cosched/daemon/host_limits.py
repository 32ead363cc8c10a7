"""What one job can take of the host's kernel tables that no cgroup bounds.

A job's memory, CPU and processes are its cgroup's; the kernel's table of open files is the
host's. Docker 20.10 bounds a job only by `nofile` per process times `pids_limit` processes
(16.7 million files at the defaults), and Debian's default `fs.file-max` is about a tenth of the
host's memory in KiB (2.5 million on 24 GiB): one job opening `/dev/null` in 500 processes left
none for any other process not root, every other job and every user of the host included (a
helper's audit). With `fs.file-max` at its largest, the files a job opens are bounded by its
memory, to which the kernel charges each (`filp`, 256 bytes). `deploy/docker-setup.sh` sets it.
"""

from __future__ import annotations

from pathlib import Path

FILE_MAX_UNBOUNDED = 9223372036854775807
"""The largest `fs.file-max`, as systemd sets it."""


def file_table_exposure(nofile: int, pids_limit: int, fs: Path = Path("/proc/sys/fs")) -> str:
    """'' when one job cannot fill the host's file table (or this host does not say), else a line
    saying how many files one job may open against `fs.file-max`, and what closes it."""
    try:
        file_max = int((fs / "file-max").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return ""
    one_job = nofile * pids_limit
    if one_job < file_max:
        return ""
    return (
        f"one job may open {one_job:,} files (docker.nofile x docker.pids_limit), and the host's whole file "
        f"table is {file_max:,} (fs.file-max): a job can leave none for any other process but root's; set sysctl "
        f"fs.file-max={FILE_MAX_UNBOUNDED} (a job's files are charged to its memory), or lower docker.nofile"
    )

"""Hostile jobs on the real engine: each exploit of the security issue is run, and must fail.

A job is arbitrary code from any local user. These tests run what such a user
would: swap a data dir for a symlink after acceptance, try to make a host file
setuid or a device node, point the progress file at a host file, a FIFO or a
huge file, fork without end, flood stdout, and use an image removed after
acceptance. Each asserts the attack failed and that scheduling went on.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tarfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker.errors
import psutil
import pytest
from conftest import missing
from daemon_support import DaemonProcess, require_engine, workflow_image

from cosched.daemon.client import ApiError, Client
from cosched.daemon.config import DockerSection, from_dict, validate
from cosched.daemon.docker_backend import LABEL_INSTANCE, LABEL_JOB, DockerBackend
from cosched.daemon.identity import create_key, load_key, mint
from cosched.daemon.seccomp import (
    CLONE_NAMESPACES,
    DEBIAN_PROFILE,
    FLOOR,
    IO_URING,
    NOT_ALLOWED,
    NOT_THERE,
    huge_pages_exposure,
    io_uring_exposure,
    load_profile,
    with_floor,
)
from cosched.daemon.service import Daemon
from cosched.errors import ConfigError
from workloads.images import busybox_image
from workloads.real import make_data_dir

PROXY = "http://svc-cosched:S3cret@proxy.example:3128"
"""The daemon's engine client's proxy: its credentials are the site's, never a job's."""


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image(require_engine())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, image: str):
    """No co-scheduling, so a queued job stays queued until the cores are free."""
    client = require_engine()
    root = tmp_path_factory.mktemp("sandbox")
    (root / "docker-client").mkdir()  # the engine client's own config, with a proxy, as on many sites
    (root / "docker-client" / "config.json").write_text(f'{{"proxies": {{"default": {{"httpProxy": "{PROXY}"}}}}}}')
    process = DaemonProcess(
        root,
        docker="pids_limit = 64\nlog_max_mib = 1",
        extra='[policies]\ncosched = "none"\n',
        env={**os.environ, "DOCKER_CONFIG": str(root / "docker-client")},
    )
    process.start()
    process.image = image
    yield process
    process.cleanup(client)


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def run(daemon: DaemonProcess, script: str, cores: int = 1, walltime: float = 60, **spec: Any) -> dict[str, Any]:
    job_id = daemon.submit(
        image=spec.pop("image", daemon.image), command=sh(script), cores=cores, walltime=walltime, **spec
    )
    return daemon.wait_final([job_id], 120)[job_id]


def blocker(daemon: DaemonProcess, seconds: float) -> int:
    """A job holding every core for `seconds`, so the next one waits in the queue."""
    job_id = daemon.submit(image=daemon.image, command=sh(f"sleep {seconds}"), cores=2, walltime=60)
    daemon.wait_running(job_id)
    return job_id


def test_jobs_run_as_nobody_without_capabilities_and_data_dirs_are_nosuid_nodev(daemon: DaemonProcess) -> None:
    data = make_data_dir(daemon.root / "ids")
    script = (
        f"id -u > {data}/uid; grep ' {data} ' /proc/self/mountinfo > {data}/mount; "
        f"grep CapEff /proc/self/status > {data}/caps; cat /proc/self/cgroup > {data}/cgroup"
    )
    job = run(daemon, script, data_dirs=[str(data)])
    assert job["state"] == "done", job
    assert (data / "uid").read_text().split() == ["65534"]
    options = (data / "mount").read_text().split()[5].split(",")
    assert "nosuid" in options and "nodev" in options
    assert (data / "caps").read_text().split()[1] == "0000000000000000"
    # its own cgroup namespace: every hierarchy's path is its root, no container id (cgroup v1 showed it)
    assert {line.rpartition(":")[2] for line in (data / "cgroup").read_text().splitlines()} == {"/"}


def test_a_data_dir_on_a_read_only_noexec_mount_stays_so_in_the_job(daemon: DaemonProcess) -> None:
    """The staging remount sets every per-mount flag anew: it must keep the host's `ro` and
    `noexec`, or a job could overwrite reference data the operator mounted read-only and run
    programs from where the host allows none."""
    data = make_data_dir(daemon.root / "reference")
    (data / "genome.txt").write_text("ACGT\n")
    shutil.copy(shutil.which("busybox") or "/bin/busybox", data / "busybox")  # static: runs in the job as it is
    subprocess.run(["mount", "--bind", str(data), str(data)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro,noexec,nosuid,nodev", str(data)], check=True)
        script = (
            f"grep ' {data} ' /proc/self/mountinfo | cut -d' ' -f6; echo x > {data}/genome.txt; "
            f"{data}/busybox true && echo ran; true"
        )
        job_id = daemon.submit(image=daemon.image, command=sh(script), cores=1, walltime=30, data_dirs=[str(data)])
        job = daemon.wait_final([job_id], 60)[job_id]
        shown = daemon.cli("logs", str(job_id))
    finally:
        subprocess.run(["umount", str(data)], check=True)
    assert job["state"] == "done", job
    mount = next((line for line in shown.splitlines() if "nosuid" in line), "")  # stderr's lines interleave
    assert {"ro", "noexec"} <= set(mount.split(",")), shown
    assert "ran" not in shown.split(), shown
    assert (data / "genome.txt").read_text() == "ACGT\n"


def test_a_job_cannot_make_a_host_file_setuid_or_a_device_node(daemon: DaemonProcess) -> None:
    data = make_data_dir(daemon.root / "escalate")
    victim = data / "victim"
    victim.write_text("#!/bin/sh\n")
    os.chown(victim, 1234, 1234)  # another user's file in a shared data dir
    victim.chmod(0o755)
    script = f"chmod u+s {victim}; chown 0 {victim}; mknod {data}/disk b 8 0; chmod 666 {data}/disk; true"
    job = run(daemon, script, data_dirs=[str(data)])
    assert job["state"] == "done", job
    info = victim.stat()
    assert not info.st_mode & stat.S_ISUID and info.st_uid == 1234
    assert not (data / "disk").exists()


def test_a_data_dir_swapped_for_a_symlink_after_acceptance_is_refused_at_launch(daemon: DaemonProcess) -> None:
    data = make_data_dir(daemon.root / "swap")
    host = daemon.root.parent / f"{daemon.root.name}-host-secret"  # outside every data root
    host.mkdir()
    (host / "passwd").write_text("root:x:0:0\n")
    blocked = blocker(daemon, 2)
    job_id = daemon.submit(
        image=daemon.image, command=sh(f"echo owned > {data}/passwd"), cores=1, walltime=30, data_dirs=[str(data)]
    )
    assert daemon.job(job_id)["state"] == "pending"
    data.rmdir()
    data.symlink_to(host)  # what the host, or an earlier job in a shared root, can do
    jobs = daemon.wait_final([blocked, job_id], 60)
    assert jobs[job_id]["state"] == "failed"
    assert "changed since the job was accepted" in jobs[job_id]["reason"]
    assert (host / "passwd").read_text() == "root:x:0:0\n"
    assert run(daemon, "true")["state"] == "done"  # the others are still scheduled


def test_a_path_through_a_symlink_is_refused_at_submission_without_saying_where_it_leads(
    daemon: DaemonProcess,
) -> None:
    """Where a link leads may be inside a directory its submitter may not pass (a helper's audit
    read a name in another user's 0700 home that way): the refusal does not say."""
    real = make_data_dir(daemon.root / "real")
    link = daemon.root / "link"
    link.symlink_to(real)
    with pytest.raises(ApiError, match=re.escape(f"'{link}' leads through a symlink; give its real path")) as refused:
        daemon.submit(image=daemon.image, command=["true"], cores=1, walltime=10, data_dirs=[str(link)])
    assert str(real) not in str(refused.value)


def test_a_data_dir_with_dot_dot_parts_or_nested_in_another_is_refused_at_submission(daemon: DaemonProcess) -> None:
    """A `..` climbs wherever the launch walk is (a job renaming its own directory between two
    steps got host `/etc` mounted); a nested data dir's mount target resolves through the job's
    own files. Both are refused by the API, before anything runs."""
    outer = make_data_dir(daemon.root / "outer")
    inner = make_data_dir(outer / "inner")
    climbing = f"{inner}/../inner"
    for data_dirs, refusal in (
        ([climbing], f"'{climbing}' is not a plain absolute path"),
        ([str(outer), str(inner)], f"data dir '{inner}' is inside '{outer}': give data dirs that do not nest"),
    ):
        with pytest.raises(ApiError, match=re.escape(refusal)):
            daemon.submit(image=daemon.image, command=["true"], cores=1, walltime=10, data_dirs=data_dirs)


def _progress_seen(daemon: DaemonProcess, job_id: int, seconds: float) -> set[tuple[int, int]]:
    seen = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        usage = daemon.job(job_id).get("usage")
        if usage:
            seen.add((usage["tasks_done"], usage["tasks"]))
        time.sleep(0.2)
    return seen


def test_the_progress_file_never_leads_to_a_host_file(daemon: DaemonProcess) -> None:
    host = daemon.root / "host-progress"
    host.write_text("7/9\n")
    host.chmod(0o600)
    job_id = daemon.submit(
        image=daemon.image,
        command=sh(f"ln -sf {host} $COSCHED_PROGRESS; sleep 3"),
        cores=1,
        walltime=30,
        tasks=3,
    )
    seen = _progress_seen(daemon, job_id, 2.5)
    assert seen and (7, 9) not in seen, seen
    assert daemon.wait_final([job_id], 30)[job_id]["state"] == "done"


def test_a_fifo_progress_file_does_not_stop_scheduling(daemon: DaemonProcess) -> None:
    fifo = daemon.submit(image=daemon.image, command=sh("mkfifo $COSCHED_PROGRESS; sleep 6"), cores=1, walltime=60)
    time.sleep(1.5)  # the daemon has sampled the FIFO a few times by now
    started = time.monotonic()
    other = run(daemon, "true")
    assert other["state"] == "done" and time.monotonic() - started < 10
    assert daemon.wait_final([fifo], 30)[fifo]["state"] == "done"


def test_a_huge_progress_file_does_not_swell_the_daemon(daemon: DaemonProcess) -> None:
    assert daemon.process is not None
    before = psutil.Process(daemon.process.pid).memory_info().rss
    job_id = daemon.submit(
        image=daemon.image,
        command=sh("dd if=/dev/zero of=$COSCHED_PROGRESS bs=1M count=200 2>/dev/null; sleep 3"),
        cores=1,
        walltime=60,
        memory_mib=512,
    )
    assert daemon.wait_final([job_id], 60)[job_id]["state"] == "done"
    after = psutil.Process(daemon.process.pid).memory_info().rss
    assert after - before < 50 << 20, (before, after)


def test_a_fork_bomb_stops_at_the_pids_limit(daemon: DaemonProcess) -> None:
    data = make_data_dir(daemon.root / "forks")
    # The subshell forks until it cannot; the counting and the clean-up use builtins only (no fork left).
    script = (
        "(n=0; while [ $n -lt 300 ]; do sleep 20 & n=$((n+1)); done) 2>/dev/null; "
        f"set -- /proc/[0-9]*; echo $# > {data}/procs; kill -9 -1; true"
    )
    job = run(daemon, script, data_dirs=[str(data)])
    assert job["state"] == "done", job
    assert int((data / "procs").read_text()) <= 64


def test_a_job_flooding_stdout_keeps_its_log_under_the_cap(daemon: DaemonProcess) -> None:
    """20 MB to stdout leave at most the 1 MiB cap in the engine's log file. The job waits for the
    test's word before it ends, so its container (and log file) is still there when it is measured."""
    client = require_engine()
    data = make_data_dir(daemon.root / "flood")
    script = (
        f"yes 0123456789abcdef | head -c 20000000; touch {data}/flooded; "
        f"i=0; while [ ! -e {data}/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
    )
    job_id = daemon.submit(image=daemon.image, command=sh(script), cores=1, walltime=120, data_dirs=[str(data)])
    deadline = time.monotonic() + 90
    while not (data / "flooded").exists():
        assert time.monotonic() < deadline, "the flood did not end"
        time.sleep(0.1)
    labels = [f"cosched.instance={daemon.instance()}", f"cosched.job={job_id}"]
    (container,) = client.containers.list(all=True, filters={"label": labels})
    config = container.attrs["HostConfig"]
    assert config["LogConfig"]["Config"]["max-size"] == "1m" and config["PidsLimit"] == 64
    log_path = Path(container.attrs["LogPath"])
    sizes = []
    while len(sizes) < 5:  # the engine may be rotating the file at the moment it is read
        assert time.monotonic() < deadline, "the log file was never there"
        with contextlib.suppress(FileNotFoundError):
            sizes.append(log_path.stat().st_size)
        time.sleep(0.1)
    assert 0 < max(sizes) <= 1.2 * (1 << 20), sizes
    (data / "go").touch()
    assert daemon.wait_final([job_id], 60)[job_id]["state"] == "done"


def test_an_image_removed_after_acceptance_fails_its_job_and_nothing_else(daemon: DaemonProcess) -> None:
    client = require_engine()
    removable = "cosched/removable:sandbox-test"
    client.images.get(daemon.image).tag(removable)
    blocked = blocker(daemon, 2)
    job_id = daemon.submit(image=removable, command=["true"], cores=1, walltime=30)
    client.images.remove(removable)
    jobs = daemon.wait_final([blocked, job_id], 60)
    assert jobs[job_id]["state"] == "failed"
    assert "no longer in the engine" in jobs[job_id]["reason"]
    with pytest.raises(ApiError, match="is not in the local Docker engine"):  # no stale cache
        daemon.submit(image=removable, command=["true"], cores=1, walltime=30)
    assert run(daemon, "true")["state"] == "done"
    assert daemon.client.call("GET", "/v1/health")["engine_up"] is True


def test_a_command_the_engine_refuses_fails_its_job_and_nothing_else(daemon: DaemonProcess) -> None:
    """The engine answers the start of a command that is not in the image with an error: that job
    fails with the engine's reason, its container is removed, and the engine is not taken for
    gone. Taken for gone, the daemon retried that launch forever and started nothing else, and the
    ends of running jobs were not collected."""
    client = require_engine()
    running = daemon.submit(image=daemon.image, command=sh("sleep 2"), cores=1, walltime=30)
    daemon.wait_running(running)
    refused = daemon.submit(image=daemon.image, command=["/no/such/binary"], cores=1, walltime=30)
    after = daemon.submit(image=daemon.image, command=["true"], cores=1, walltime=30)
    jobs = daemon.wait_final([running, refused, after], 60)
    assert jobs[refused]["state"] == "failed"
    assert "the Docker engine refused job" in jobs[refused]["reason"], jobs[refused]
    # the engine's own words, with the cause the runtime names at their end (the SDK's began
    # with the request's URL and were cut before it, at `exec: "/`)
    assert "/no/such/binary" in jobs[refused]["reason"] and "http+docker" not in jobs[refused]["reason"]
    assert jobs[running]["state"] == "done" and jobs[after]["state"] == "done", jobs
    assert daemon.client.call("GET", "/v1/health")["engine_up"] is True
    labels = [f"{LABEL_INSTANCE}={daemon.instance()}", f"{LABEL_JOB}={refused}"]
    assert client.containers.list(all=True, filters={"label": labels}) == []


def test_a_data_dir_with_a_colon_in_its_name_is_mounted(daemon: DaemonProcess) -> None:
    """Binds are "source:target:mode" strings, which a ':' in a path breaks (the engine refused
    the launch); mounts name each part."""
    data = make_data_dir(daemon.root / "run:1")
    job = run(daemon, f"echo written > {data}/out", data_dirs=[str(data)])
    assert job["state"] == "done", job
    assert (data / "out").read_text() == "written\n"


def test_a_daemon_that_is_not_root_cannot_have_data_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning data dirs needs mount(2): a non-root daemon with data roots is refused in one line."""
    config = from_dict({"daemon": {"state_dir": str(tmp_path)}, "docker": {"data_roots": [str(tmp_path)]}})
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="needs the daemon to run as root"):
        Daemon._staging(config)


def test_workloads_write_gives_the_data_dir_to_the_jobs_user(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from cosched.cli import main

    if os.geteuid() != 0:
        pytest.skip("only root can give a directory away")
    data = tmp_path / "m1"
    main(["workloads", "write", "synthetic", "--dir", str(data), "--image", "x:y", "--owner", "4321:4322"])
    assert (data.stat().st_uid, data.stat().st_gid) == (4321, 4322)
    assert str(data) in capsys.readouterr().out


def test_workloads_write_follows_no_link_a_job_left_in_its_data_dir(tmp_path: Path) -> None:
    """An operator prepares the next run beside the last (`workloads write --dir DATA/run2`, as root)
    where the last run's job left links: `mkdir -p` and `chown` followed them, gave a host directory
    to the jobs' user, and made directories anywhere on the host (a helper's audit). Now the path is
    made one component at a time, following none."""
    from cosched.errors import ConfigError

    data, host_dir = tmp_path / "data", tmp_path / "host"
    data.mkdir()
    host_dir.mkdir()
    (data / "run2").symlink_to(host_dir)  # what the job left, in its own data dir
    for target in (data / "run2", data / "run2" / "new"):
        with pytest.raises(ConfigError, match=r"run2 is a link or not a directory"):
            make_data_dir(target, "4321:4322")
    assert host_dir.stat().st_uid == os.geteuid() and not (host_dir / "new").exists()
    made = make_data_dir(data / "run3" / "inputs", "4321:4322")
    assert made.is_dir()
    if os.geteuid() == 0:
        assert (made.stat().st_uid, made.stat().st_gid) == (4321, 4322)


def test_a_data_root_on_a_mount_that_allows_setuid_is_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Jobs see their data dirs nosuid, but the host's own mount of a data root is the operator's:
    on one that allows setuid, a job left a setuid copy of a program, and any host user ran it as the
    jobs' user, outside every sandbox (a helper's audit). The daemon says so at start."""
    import subprocess

    from cosched.daemon.config import from_dict, validate
    from cosched.daemon.sandbox import suid_warning
    from cosched.daemon.service import Daemon

    if os.geteuid() != 0:
        pytest.skip("data roots need a root daemon, and a nosuid mount root")
    plain, guarded = tmp_path / "plain", tmp_path / "guarded"
    plain.mkdir()
    guarded.mkdir()
    if os.statvfs(plain).f_flag & os.ST_NOSUID:
        pytest.skip(f"{tmp_path} is on a nosuid mount already")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nosuid,size=1m", "tmpfs", str(guarded)], check=True)
    try:
        assert suid_warning(str(guarded)) == ""
        config = validate(
            from_dict(
                {"daemon": {"state_dir": str(tmp_path / "state")}, "docker": {"data_roots": [str(plain), str(guarded)]}}
            )
        )
        with caplog.at_level("WARNING", logger="cosched.daemon"):
            Daemon(config).store.close()  # (not started: the engine is not asked)
        warned = [r.getMessage() for r in caplog.records if "nosuid" in r.getMessage()]
        assert warned == [
            f"data root {plain} is not on a nosuid mount: a job can leave a setuid program there that "
            "any host user may run as the job's user (mount it nosuid: docs/security.md)"
        ]
    finally:
        subprocess.run(["umount", str(guarded)], check=True)


def test_progress_is_read_only_from_the_process_it_was_remembered_for(tmp_path: Path) -> None:
    """A container's pid is remembered with its start time: once that process is gone, a
    process the kernel gives the same pid (a host one) is never read through /proc."""
    import subprocess

    from cosched.daemon.sandbox import process_start, read_progress

    progress = tmp_path / "progress"
    progress.write_text("3/7")
    child = subprocess.Popen(["sleep", "30"])
    try:
        start = process_start(child.pid)
        assert start > 0
        assert read_progress(child.pid, start, str(progress)) == (3, 7)
        # the same pid, another start time: another process, as after pid reuse
        assert read_progress(child.pid, start + 1, str(progress)) == (0, 0)
    finally:
        child.kill()
        child.wait()
    assert process_start(child.pid) == 0 or process_start(child.pid) != start
    assert read_progress(child.pid, start, str(progress)) == (0, 0)
    assert read_progress(os.getpid(), process_start(os.getpid()), str(progress)) == (3, 7)
    for said in ("5/3", "-1/3", "2/-4", "1/0"):  # no progress: more done than there are, or negative
        progress.write_text(said)
        assert read_progress(os.getpid(), process_start(os.getpid()), str(progress)) == (0, 0), said


def test_a_job_writes_to_memory_not_to_the_engines_disk(daemon: DaemonProcess) -> None:
    """The image is read-only and `/tmp`, `/var/tmp` are tmpfs charged to the job's memory: 100 MB
    written there show in its memory use, not in the container's layer on the engine's disk, and
    scripts written there still run."""
    client = require_engine()
    data = make_data_dir(daemon.root / "scratch")
    script = (
        f"touch /etc/written 2> {data}/image; "
        "printf '#!/bin/sh\\necho ran\\n' > /var/tmp/job.sh && chmod +x /var/tmp/job.sh && "
        f"/var/tmp/job.sh > {data}/exec; "
        f"dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>/dev/null && touch {data}/filled; "
        f"i=0; while [ ! -e {data}/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
    )
    job_id = daemon.submit(
        image=daemon.image, command=sh(script), cores=1, walltime=120, memory_mib=256, data_dirs=[str(data)]
    )
    deadline = time.monotonic() + 90
    while not (data / "filled").exists():
        assert time.monotonic() < deadline, f"the job never wrote its 100 MB: {daemon.job(job_id)}"
        time.sleep(0.1)
    labels = [f"cosched.instance={daemon.instance()}", f"cosched.job={job_id}"]
    (listed,) = client.api.containers(all=True, size=True, filters={"label": labels})
    assert "SizeRootFs" in listed and listed.get("SizeRw", 0) < 1 << 20, listed  # the engine omits a 0
    container = client.containers.get(listed["Id"])
    assert container.stats(stream=False)["memory_stats"]["usage"] >= 100 << 20
    assert "Read-only file system" in (data / "image").read_text()
    assert (data / "exec").read_text() == "ran\n"
    (data / "go").touch()
    assert daemon.wait_final([job_id], 60)[job_id]["state"] == "done"


def test_run_as_submitter_keeps_each_users_data_dir_theirs(tmp_path: Path, image: str, open_data_root: Path) -> None:
    """With per-user tokens and `docker.run_as = "submitter"`, a job runs as its submitter's account
    (here the system users `daemon`, uid 1, and `bin`, uid 2): one user's job cannot write
    another's data dir, though the daemon (root) mounts whatever a submission names, and what a
    job writes belongs to its submitter. Nor can it name a directory inside another user's private
    one: the job is given the mount itself, so the kernel would not check the parents the
    submitter's own `cd` must pass; that is checked at submission and again at the launch. Root
    and users with no account are refused at submission."""
    client = require_engine()
    key = tmp_path / "api.key"
    create_key(key)
    shared = open_data_root
    process = DaemonProcess(
        tmp_path,
        api=f'key_file = "{key}"',
        docker=f'run_as = "submitter"\ndata_roots = ["{shared}"]',
        extra='[policies]\ncosched = "none"\n',
        token=mint(load_key(key), "root", 600),  # an operator's, for the harness's health checks
        data_roots=False,
    )
    try:
        process.start()
        users = {name: Client(process.client.url, mint(load_key(key), name, 600), timeout=10) for name in USERS}
        mine = make_data_dir(shared / "daemons", owner="1:1")
        mine.chmod(0o700)
        write = ["sh", "-c", f"id > {mine}/id"]
        spec = {"image": image, "command": write, "cores": 1, "walltime": 60, "data_dirs": [str(mine)]}
        intruder = users["bin"].call("POST", "/v1/jobs", spec)["id"]
        owner = users["daemon"].call("POST", "/v1/jobs", spec)["id"]
        jobs = process.wait_final([intruder, owner], 120)
        assert (jobs[intruder]["state"], jobs[intruder]["user"]) == ("failed", "bin"), jobs[intruder]
        assert "Permission denied" in jobs[intruder]["log_tail"]
        assert jobs[owner]["state"] == "done", jobs[owner]
        assert (mine / "id").read_text().split()[:2] == ["uid=1", "gid=1"]
        assert ((mine / "id").stat().st_uid, (mine / "id").stat().st_gid) == (1, 1)

        results = make_data_dir(mine / "results", owner="1:1")  # open to all, inside daemon's private dir
        results.chmod(0o755)
        (results / "secret").write_text("daemon's\n")
        peek = {**spec, "command": ["cat", f"{results}/secret"], "data_dirs": [str(results)]}
        closed = f"{str(mine)!r} above it does not let uid 2 (its submitter) pass"
        with pytest.raises(ApiError, match=re.escape(closed)):
            users["bin"].call("POST", "/v1/jobs", peek)
        mine.chmod(0o755)  # open when the job is accepted, closed again before it launches
        blocker = users["daemon"].call("POST", "/v1/jobs", {**spec, "command": ["sleep", "2"], "cores": 2})["id"]
        process.wait_running(blocker)
        late = users["bin"].call("POST", "/v1/jobs", peek)["id"]
        mine.chmod(0o700)
        jobs = process.wait_final([blocker, late], 60)
        assert jobs[late]["state"] == "failed" and closed in jobs[late]["reason"], jobs[late]
        assert "daemon's" not in (jobs[late]["log_tail"] or "")

        for name, problem in (("root", "root: jobs never run as root"), ("nosuchuser7", "nosuchuser7 has no account")):
            asker = Client(process.client.url, mint(load_key(key), name, 600), timeout=10)
            with pytest.raises(ApiError, match=f"user: {problem}"):
                asker.call("POST", "/v1/jobs", spec)
    finally:
        process.cleanup(client)


USERS = ("daemon", "bin")


def test_an_images_own_volumes_are_memory_not_the_engines_disk(daemon: DaemonProcess) -> None:
    """An image may declare VOLUMEs: Docker makes each an anonymous volume on the engine's disk,
    writable despite the read-only image (here a world-writable one) and left there when the
    container is removed. A job writing 50 MB there must write to memory, and leave no volume."""
    client = require_engine()
    image = _image_with_a_volume(client, daemon.image, "/spill")
    data = make_data_dir(daemon.root / "spill")
    before = {volume.name for volume in client.volumes.list()}
    script = f"dd if=/dev/zero of=/spill/fill bs=1M count=50 2>/dev/null; grep ' /spill ' /proc/mounts > {data}/mount"
    job = run(daemon, script, image=image, memory_mib=256, data_dirs=[str(data)])
    assert job["state"] == "done", job
    assert (data / "mount").read_text().split()[2] == "tmpfs"
    assert {volume.name for volume in client.volumes.list()} == before


def test_the_engine_clients_proxy_and_an_images_healthcheck_stay_out_of_the_job(daemon: DaemonProcess) -> None:
    """The SDK copied the daemon's own Docker client proxies (credentials and all) into every job's
    environment; and an image's HEALTHCHECK, every millisecond, had the engine run probes outside
    the job's cgroup, slowing every launch (a helper's audit: 4 such jobs, launches 0.3 s to 0.9 s)."""
    client = require_engine()
    probe = {"Test": ["CMD", "true"], "Interval": 10_000_000}  # nanoseconds
    image = _image_with(client, daemon.image, "cosched/healthcheck-test", conf={"Healthcheck": probe})
    data = make_data_dir(daemon.root / "proxy")
    job_id = daemon.submit(
        image=image, command=sh(f"env > {data}/env; sleep 3"), cores=1, walltime=60, data_dirs=[str(data)]
    )
    daemon.wait_running(job_id)
    (container,) = client.containers.list(filters={"label": f"{LABEL_JOB}={job_id}"})
    time.sleep(0.5)
    container.reload()
    assert container.attrs["Config"]["Healthcheck"]["Test"] == ["NONE"]
    assert "Health" not in container.attrs["State"] or container.attrs["State"]["Health"] is None
    assert daemon.wait_final([job_id], 60)[job_id]["state"] == "done"
    environment = (data / "env").read_text()
    assert "S3cret" not in environment and "proxy" not in environment.lower(), environment


def test_an_images_workdir_inside_a_data_dir_is_refused_and_nothing_is_made_there(daemon: DaemonProcess) -> None:
    """runc makes a missing WORKDIR as root after the mounts: a job's link in its data dir
    (`work -> ../bob/results`) had root-owned directories made in another user's data dir."""
    client = require_engine()
    data = make_data_dir(daemon.root / "workdir")
    image = f"cosched/workdir-test:{daemon.root.name}"
    container = client.containers.create(daemon.image, ["true"])
    try:
        container.commit(*image.split(":"), conf={"WorkingDir": f"{data}/work/sub"})
    finally:
        container.remove(force=True)
    try:
        job = run(daemon, "pwd", image=image, data_dirs=[str(data)])
    finally:
        client.images.remove(image, force=True)
    assert job["state"] == "failed" and f"has WORKDIR '{data}/work/sub' inside data dir '{data}'" in job["reason"]
    assert not (data / "work").exists()


def _image_with_a_volume(client: Any, base: str, path: str) -> str:
    """`base` with a world-writable directory `path` declared a VOLUME (as many images declare one)."""
    return _image_with(client, base, "cosched/volume-test", dirs=[path], conf={"Volumes": {path: {}}})


def _image_with(
    client: Any,
    base: str,
    repository: str,
    dirs: Sequence[str] = (),
    files: Mapping[str, str] | None = None,
    conf: Mapping[str, Any] | None = None,
) -> str:
    """`base` with world-writable `dirs`, `files` (path: text) and image `conf` added: a hostile image."""
    tag = f"{repository}:{base.rpartition(':')[2]}"
    with contextlib.suppress(docker.errors.ImageNotFound):
        return str(client.images.get(tag).tags[0])
    container = client.containers.create(base, ["true"])
    try:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for path in dirs:
                info = tarfile.TarInfo(path.lstrip("/"))
                info.type, info.mode = tarfile.DIRTYPE, 0o1777
                tar.addfile(info)
            for path, text in (files or {}).items():
                info = tarfile.TarInfo(path)
                info.size = len(text.encode())
                tar.addfile(info, io.BytesIO(text.encode()))
        container.put_archive("/", archive.getvalue())
        container.commit(*tag.split(":"), conf=dict(conf or {}))
    finally:
        container.remove(force=True, v=True)
    return tag


def test_a_job_that_never_ends_a_line_keeps_a_short_log_tail(daemon: DaemonProcess) -> None:
    """The engine cuts an endless line every 16 KiB, so a job's last 20 lines could be 320 KiB,
    kept in the state file for every job: the tail keeps its last 8 KiB."""
    job = run(daemon, "head -c 600000 /dev/zero | tr '\\0' a; echo; echo the end")
    assert job["state"] == "done", job
    tail = job["log_tail"]
    assert tail.startswith("[...]") and tail.rstrip().endswith("the end")
    assert len(tail.encode()) <= 8192 + len("[...]")


def test_an_images_own_group_file_gives_a_job_no_group(daemon: DaemonProcess) -> None:
    """A hostile image may list the job's uid in groups root and disk in its /etc/group: Docker adds
    those to a user given by uid alone, never to one given as uid:gid, as cosched gives it."""
    client = require_engine()
    files = {"etc/passwd": "nobody:x:65534:65534::/:/bin/sh\n", "etc/group": "root:x:0:nobody\ndisk:x:6:nobody\n"}
    image = _image_with(client, daemon.image, "cosched/group-test", files=files)
    data = make_data_dir(daemon.root / "groups")
    job = run(daemon, f"id -G > {data}/groups", image=image, data_dirs=[str(data)])
    assert job["state"] == "done", job
    assert (data / "groups").read_text().split() == ["65534"]


SYSCALL_PROBE = """
import ctypes, json, os, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long  # an address, from mmap
buffer = ctypes.create_string_buffer(256)
def call(number, *args):
    result = libc.syscall(number, *args)
    return result if result >= 0 else -ctypes.get_errno()
answers = {
    "io_uring_setup": call(425, 4, buffer),
    "clone3": call(435, buffer, 88),
    "keyctl": call(250, 0, 0, 0, 0, 0),
    "unshare": call(272, 0x10000000),
    "io_setup": call(206, 4096, buffer),
}
child = call(56, 0x10000000 | 17, 0, 0, 0, 0)
if child == 0:
    os._exit(0)
answers["clone_newuser"] = min(child, 1)
answers["memfd_hugetlb"] = min(call(319, buffer, 4), 1)
answers["mmap_hugetlb"] = min(call(9, 0, 2 << 20, 3, 0x40022, -1, 0), 1)
answers["memfd"] = min(call(319, buffer, 0), 1)
answers["mmap"] = min(call(9, 0, 2 << 20, 3, 0x22, -1, 0), 1)
thread = threading.Thread(target=print, args=("a thread",))
thread.start()
thread.join()
print(json.dumps(answers))
"""
"""What a job gets from the calls cosched's floor refuses (x86-64 numbers; clone(CLONE_NEWUSER|SIGCHLD)
is a namespace; huge pages asked of memfd_create and mmap), and a thread, an ordinary memfd and mmap,
which must still work (glibc makes a thread with clone3, then clone). A memfd of huge pages is made
where the host reserves none, so only the floor refuses it; such an mmap fails there anyway."""
FLOORED = {
    "io_uring_setup": -errno.ENOSYS,
    "clone3": -errno.ENOSYS,
    "keyctl": -errno.EPERM,
    "unshare": -errno.EPERM,
    "clone_newuser": -errno.EPERM,
    "io_setup": -errno.ENOSYS,
    "memfd_hugetlb": -errno.ENOMEM,
    "mmap_hugetlb": -errno.ENOMEM,
    "memfd": 1,
    "mmap": 1,
}


def _calls_in_a_job(daemon: DaemonProcess, name: str) -> dict[str, int]:
    """What `SYSCALL_PROBE` got in a job: a descriptor or pid, or minus the errno, per call."""
    data = make_data_dir(daemon.root / name)
    (data / "probe.py").write_text(SYSCALL_PROBE)
    job = run(
        daemon,
        f"python3 {data}/probe.py > {data}/answer",
        image=workflow_image(),
        memory_mib=256,
        data_dirs=[str(data)],
    )
    assert job["state"] == "done", job
    lines = (data / "answer").read_text().splitlines()
    assert lines[0] == "a thread", lines
    return dict(json.loads(lines[1]))


def test_a_job_cannot_reach_the_hosts_pressure_files(daemon: DaemonProcess) -> None:
    """`/proc/pressure` is the host's, and any process may write a PSI trigger there: a job holding
    hundreds of thousands of them could not be killed for hours (SIGKILL failed, `did not receive an
    exit event`), its walltime passed, the host's CPU spent in its teardown (a helper's audit). A job
    finds it empty and read-only."""
    if not os.path.isdir("/proc/pressure"):
        pytest.skip("this kernel has no pressure stall information (/proc/pressure)")
    data = make_data_dir(daemon.root / "pressure")
    trigger = "echo 'some 150000 2000000' > /proc/pressure/cpu"
    job = run(
        daemon,
        f"ls -A /proc/pressure > {data}/listed; {trigger} 2> {data}/err; echo $? > {data}/code",
        data_dirs=[str(data)],
    )
    assert job["state"] == "done", job
    assert (data / "listed").read_text() == "" and (data / "code").read_text().strip() != "0"


@pytest.mark.parametrize("ptys", [True, False])
def test_with_ptys_off_a_job_opens_none(image: str, ptys: bool) -> None:
    """The host's ptys are shared by every container, and one job took them all (a helper's audit):
    `docker.ptys = false` masks `/dev/pts`, so `/dev/ptmx`, its link, leads nowhere."""
    engine = require_engine()
    backend = DockerBackend(f"pty{uuid.uuid4().hex[:8]}", DockerSection(ptys=ptys, seccomp_profile=""))
    try:
        script = "[ -e /dev/ptmx ] && echo ptmx; ls -A /dev/pts | wc -l"
        container, _ = backend.launch(7, {"image": image, "command": ["sh", "-c", script], "cores": 1}, [0], 1.0, 64)
        engine.containers.get(container).wait(timeout=30)
        assert backend.exit_of(container).code == 0
        assert backend.logs(container).split() == (["ptmx", "1"] if ptys else ["0"])  # (the ptmx node alone)
    finally:
        for info in backend.containers().values():
            backend.remove(info.id)


def test_by_default_jobs_run_under_debians_profile_on_cosched_s_floor(daemon: DaemonProcess) -> None:
    """`seccomp_profile = "auto"`: Debian's container profile, which deploy/docker-setup.sh installs,
    with io_uring closed. That profile is Podman's and allows user namespaces, mounts and keyrings:
    under it as is, a job ran `unshare -Ur` and mounted a tmpfs. The floor refuses them. The
    sandbox's other jobs run under it too (busybox here, Montage and BLAST in their tests)."""
    if not os.path.exists(DEBIAN_PROFILE):
        missing(f"{DEBIAN_PROFILE} is absent (deploy/docker-setup.sh installs golang-github-containers-common)")
    assert _calls_in_a_job(daemon, "floor-default") == FLOORED
    assert "jobs can use io_uring" not in daemon.log.read_text()
    data = make_data_dir(daemon.root / "floor-unshare")
    job = run(
        daemon, f"unshare -Ur sh -c 'mount -t tmpfs x /tmp' 2> {data}/err; echo $? > {data}/code", data_dirs=[str(data)]
    )
    assert job["state"] == "done" and (data / "code").read_text().strip() != "0", (data / "err").read_text()


def test_under_the_engines_own_profile_the_daemon_says_whether_jobs_can_reach_io_uring(tmp_path: Path) -> None:
    """`seccomp_profile = ""`: the engine's profile, and the start-up line about io_uring must say
    what a job finds (Docker 20.10's profile opens it, 25's closes it; so does the sysctl)."""
    client = require_engine()
    process = DaemonProcess(tmp_path, docker='seccomp_profile = ""')
    process.start()
    try:
        answer = _calls_in_a_job(process, "uring-engine")["io_uring_setup"]
        exposure = io_uring_exposure(str(client.version()["Version"]))
        assert (answer >= 0) == bool(exposure), (answer, exposure)
        assert (exposure in process.log.read_text()) == bool(exposure)
    finally:
        process.cleanup(client)


def test_the_floor_holds_even_where_the_operators_profile_allows_everything(tmp_path: Path) -> None:
    """A profile that allows every call, io_uring, unshare and keyctl by name: cosched's floor still
    refuses them, and jobs still run under it."""
    client = require_engine()
    profile = tmp_path / "seccomp.json"
    opened = [
        {
            "names": ["io_uring_setup", "unshare", "keyctl", "clone", "clone3", "io_setup", "memfd_create", "mmap"],
            "action": "SCMP_ACT_ALLOW",
        }
    ]
    profile.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": opened}))
    process = DaemonProcess(tmp_path, docker=f'seccomp_profile = "{profile}"')
    process.start()
    try:
        assert _calls_in_a_job(process, "floor-allow-all") == FLOORED
        assert "jobs can use io_uring" not in process.log.read_text()  # no warning: a profile is given
    finally:
        process.cleanup(client)


def test_without_a_profile_the_daemon_says_when_the_host_keeps_huge_pages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the floor refuses huge pages, which no memory cgroup is charged for: under the engine's
    own profile a host that keeps any is said at start, with what closes it; none kept, nothing."""
    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / "nr_hugepages").write_text("16\n")
    (vm / "nr_overcommit_hugepages").write_text("0\n")
    line = huge_pages_exposure(vm)
    assert "jobs can take the host's huge pages (16 reserved" in line and "seccomp_profile" in line
    (vm / "nr_hugepages").write_text("0\n")
    assert huge_pages_exposure(vm) == "" and huge_pages_exposure(tmp_path / "absent") == ""
    (vm / "nr_overcommit_hugepages").write_text("8\n")
    assert "8 more on demand" in huge_pages_exposure(vm)
    monkeypatch.setattr("cosched.daemon.docker_backend.huge_pages_exposure", lambda: huge_pages_exposure(vm))
    profile = tmp_path / "seccomp.json"
    profile.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}))
    with caplog.at_level(logging.WARNING, logger="cosched.docker"):
        DockerBackend("x", DockerSection(seccomp_profile=str(profile)))
        assert "huge pages" not in caplog.text
        DockerBackend("x", DockerSection(seccomp_profile=""))
        assert "jobs can take the host's huge pages (0 reserved, vm.nr_hugepages; 8 more" in caplog.text


def test_a_seccomp_profile_anyone_could_edit_or_that_is_no_profile_is_refused(tmp_path: Path) -> None:
    profile = tmp_path / "seccomp.json"
    profile.write_text(json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}))
    assert "SCMP_ACT_ERRNO" in load_profile(str(profile))
    profile.chmod(0o666)
    with pytest.raises(ConfigError, match=r"docker.seccomp_profile: .* could be changed by a user other than root"):
        load_profile(str(profile))
    profile.chmod(0o644)
    link = tmp_path / "link.json"
    link.symlink_to(profile)
    with pytest.raises(ConfigError, match="link-free"):
        load_profile(str(link))
    for text, problem in (("{", "not a JSON seccomp profile"), ('{"syscalls": []}', "not a Docker seccomp profile")):
        profile.write_text(text)
        with pytest.raises(ConfigError, match=problem):
            validate(from_dict({"docker": {"seccomp_profile": str(profile)}}))


def test_the_floors_calls_are_taken_out_of_every_rule_and_refused_by_cosched_s_own() -> None:
    rules = [
        {"names": ["read", "io_uring_setup", "unshare"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["io_uring_enter", "keyctl", "clone"], "action": "SCMP_ACT_ALLOW", "args": []},
        {"name": "mount", "action": "SCMP_ACT_ALLOW"},
    ]
    floored = with_floor({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules})
    own = [rule for rule in floored["syscalls"] if set(rule.get("names", ())) & FLOOR]
    assert floored["syscalls"][0] == {"names": ["read"], "action": "SCMP_ACT_ALLOW"}
    assert len(floored["syscalls"]) == 1 + len(own)  # every other rule was the floor's own
    refused = {
        name for rule in own if rule["action"] == "SCMP_ACT_ERRNO" and not rule.get("args") for name in rule["names"]
    }
    assert refused == set(NOT_THERE) | set(NOT_ALLOWED) and set(IO_URING) <= refused
    (clone,) = [rule for rule in own if rule["names"] == ["clone"] and rule["action"] == "SCMP_ACT_ALLOW"]
    assert clone["args"] == [{"index": 0, "value": CLONE_NAMESPACES, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    # Docker's decoder reads keys in any case: a rule the transform would pass over is refused
    for spelt in ({"Names": ["io_uring_setup"], "action": "SCMP_ACT_ALLOW"}, {"NAME": "io_uring_enter"}):
        with pytest.raises(ConfigError, match="spelt"):
            with_floor({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [spelt]})
    long_s = "\u017f"  # Go folds it to "s": a second `syscalls`, the last one, read by the engine (a helper's find)
    for table in ({"Syscalls": []}, {long_s + "yscalls": []}, {"syscalls": [{"name" + long_s: ["unshare"]}]}):
        with pytest.raises(ConfigError, match="spelt otherwise"):
            with_floor({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [], **table})
    for rule in ({"name": ["unshare"]}, {"names": [1]}, "unshare"):
        with pytest.raises(ConfigError, match="has a rule"):
            with_floor({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [rule]})

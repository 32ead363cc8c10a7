"""Jobs as Docker containers: launch, re-quota, sample, collect; nothing else.

The backend is deliberately thin and stateless about scheduling: it does what
the daemon tells it and reports what the engine and the kernel say. Every
container it makes carries labels naming the daemon instance and the job, so
a restarted daemon finds its own containers (and only its own) by label.

Safety rules the operator can rely on (docs/security.md): a job runs as the
configured unprivileged uid:gid with every capability dropped and
`no-new-privileges`, a seccomp profile never below cosched's floor (`cosched.daemon.seccomp`)
and a cgroup namespace of its own, under a pids limit, a log size cap and file ulimits, with
no network and a read-only image: its scratch space (`/tmp`, `/var/tmp`) is
memory, so a job cannot fill the engine's disk; the only host paths mounted are
its declared data directories,
under the configured `data_roots`, re-checked link by link at launch and
mounted `nosuid,nodev` (`cosched.daemon.sandbox`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import requests.exceptions

from cosched.daemon import image_names
from cosched.daemon.accounts import Account, account_in, job_user_account
from cosched.daemon.cgroups import CgroupFiles
from cosched.daemon.config import DockerSection
from cosched.daemon.host_limits import exposures
from cosched.daemon.sandbox import (
    SandboxRefused,
    StagingMounts,
    data_dir_problem,
    nesting_problem,
    open_data_dir,
    process_start,
    read_progress,
)
from cosched.daemon.seccomp import huge_pages_exposure, io_uring_exposure, load_profile, profile_path
from cosched.errors import CoschedError

if TYPE_CHECKING:
    from cosched.daemon.backend import NodeStatus

log = logging.getLogger("cosched.docker")

LABEL_INSTANCE = "cosched.instance"
LABEL_JOB = "cosched.job"
LABEL_RUN = "cosched.run"
PROGRESS_PATH = "/tmp/cosched-progress"
"""Inside the container: a job writes `done/total` here; the daemon reads it through /proc."""
SCRATCH_DIRS = ("/tmp", "/var/tmp")
"""Where a job may write besides its data dirs (`scratch_mounts`)."""


def scratch_mounts(memory_mib: int, volumes: Iterable[str] = ()) -> dict[str, str]:
    """Where a job may write besides its data dirs: tmpfs, because the image is mounted
    read-only (as Apptainer does). A writable layer lives on the engine's disk, so one job
    writing without end would fill it for every other job and for the daemon's state; tmpfs
    pages are charged to the job's memory cgroup, so scratch space is bounded by the memory it
    was given (the `size` only makes `df` say so). `exec` because jobs run what they write
    there (Docker's tmpfs default is `noexec`); `nosuid,nodev` stay.

    The image's own VOLUMEs (`volumes`) get tmpfs too: Docker would make each an anonymous
    volume on the engine's disk, writable despite the read-only image, and left there when
    the container is removed."""
    return {path: f"rw,exec,nosuid,nodev,mode=1777,size={memory_mib}m" for path in (*SCRATCH_DIRS, *volumes)}


MASKED_PROC = ("/proc/pressure",)
"""Host-wide /proc directories a job gets an empty read-only tmpfs over, besides what Docker masks.
`/proc/pressure`: any process may write a PSI trigger there, at a kernel cost its memory cgroup is
not charged, and closing N of them takes time growing as N squared, under a lock: a job holding
hundreds of thousands could not be killed (`did not receive an exit event`) and ran on for hours
past its walltime, the host's CPU spent in its teardown (a helper's audit). It also shows the
host's load. Docker 20.10 does not mask it, and its SDK cannot ask it to (`MaskedPaths`); a tmpfs
is what runc masks a directory with."""


MASK_OPTIONS = "ro,nosuid,nodev,noexec,size=4k"
"""An empty read-only tmpfs over a directory: what runc masks one with. Over `/dev/pts` (`docker.ptys
= false`), `/dev/ptmx`, its link, leads nowhere: a job opens no pty."""


def masked_proc(proc: Path = Path("/proc")) -> dict[str, str]:
    """The tmpfs mounts that mask `MASKED_PROC`, those this host's kernel has (a mount onto a missing
    /proc directory fails the container's start)."""
    return {path: MASK_OPTIONS for path in MASKED_PROC if (proc / Path(path).relative_to("/proc")).is_dir()}


LOG_TAIL_BYTES = 8192
LIVE_LOG_BYTES = 1 << 20
"""The most of a running job's output one `cosched logs` reads: a job that prints megabytes a
second must not make the daemon hold them all."""
"""The most of a finished job's output kept (its last bytes)."""

IMAGE_RECHECK = 5.0
"""Seconds an image the engine confirmed is taken as there without asking again."""

_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, ConnectionError)


class EngineUnavailable(CoschedError):
    """The Docker engine cannot be reached (not running, restarting, no permission)."""


class LaunchRefused(CoschedError):
    """This one job cannot start (its image was removed, its data dir changed); the engine is fine."""


class RunLost(CoschedError):
    """A job's run was lost, not ended by the job: its machine went away, or it could not get
    the resources the core gave it in time (no Mesos offer), or a gang could not start whole, or
    the engine failed on its side (a 5xx) to start it. The daemon queues the job again."""

    def __init__(self, message: str, faulty_nodes: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.faulty_nodes = faulty_nodes
        """Nodes whose machine could not start it at all (a Mesos agent whose engine cannot be
        reached): the daemon drains them, as Slurm drains a node a launch failed on."""


class Withheld(CoschedError):
    """The launch's gate said no: its container was made and never started (a Mesos gang's part
    its framework did not tell to start). The container is left for the caller to remove, by name."""


class NotKilled(CoschedError):
    """The engine answered a kill, and the container had not ended when it stopped waiting (a job
    whose processes the kernel takes long to end: a job closing millions of files). The engine is
    up; the job is killed again at each review until it ends (`carry_out.kill`)."""


class QuotaMismatch(CoschedError):
    """The kernel enforces a different CPU quota than the one Docker was asked for."""


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """What the engine reports of one of our containers."""

    id: str
    job_id: int
    state: str
    """created, running, paused, restarting, exited, dead, removing; or `lost` (a Mesos job's
    run ended by its machine going away, not by the job: the daemon queues the job again)."""
    note: str = ""
    """Why it is `lost`, in a few words."""
    run: int | None = None
    """The job's run it was started for (`Store.begin_run`); None: started before runs were numbered."""

    def is_run(self, run: int) -> bool:
        """Whether it is of `run`, the one the store began last: only that one may be adopted, what an
        earlier run left is removed (one from before runs were numbered is taken to be of it)."""
        return self.run is None or self.run == run

    @property
    def shown(self) -> str:
        return shown_id(self.id)


def shown_id(container: str) -> str:
    """A run's id as logs show it: a Docker id's first 12 characters, a Mesos run's handle whole."""
    return container[:12] if len(container) == 64 and container.isalnum() else container


@dataclass(frozen=True, slots=True)
class Exit:
    """How a container ended."""

    code: int
    started: float
    finished: float
    oom: bool
    cpu_seconds: float | None = None
    """CPU seconds its processes used, by the last sample taken while it ran (None: never sampled).
    Its cgroup is gone once it stopped, so up to one sampling interval of use is missing."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement: CPU used over CPU granted, memory used over limit, progress."""

    cpu: float
    mem: float
    done: int
    total: int


class DockerBackend:
    """The daemon's hands on one Docker engine."""

    def __init__(self, instance: str, settings: DockerSection, staging: StagingMounts | None = None) -> None:
        self.instance = instance
        self.settings = settings
        self.cpu_period = settings.cpu_period
        self.log_tail = settings.log_tail
        self.staging = staging
        self._base_url = settings.base_url
        self._client: docker.DockerClient | None = None
        self._profile = profile_path(settings.seccomp_profile)
        self._security = ["no-new-privileges"]
        if self._profile:
            self._security.append(f"seccomp={load_profile(self._profile)}")
        self._exposure_told = False
        if not self._profile and (huge := huge_pages_exposure()):
            log.warning("%s", huge)
        for exposure in exposures(settings.nofile, settings.pids_limit, os.cpu_count() or 1, ptys=settings.ptys):
            log.warning("%s", exposure)
        self._masked = masked_proc() | ({} if settings.ptys else {"/dev/pts": MASK_OPTIONS})
        self._images: dict[str, float] = {}
        """Image name -> when the engine last said it has it (monotonic)."""
        self._pids: dict[str, int] = {}
        self._starts: dict[str, int] = {}
        """Container -> its process's start time, which with the pid names that process (`process_start`)."""
        self._cgroups: dict[str, CgroupFiles] = {}
        self._last_cpu: dict[str, tuple[float, float, float]] = {}
        """Container -> (when, cgroup CPU seconds, quota) at its last sample."""

    # -- connection ---------------------------------------------------------
    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self.connect()
        assert self._client is not None
        return self._client

    def connect(self) -> None:
        """Reach the engine; EngineUnavailable with the address and reason if it does not answer."""
        where = self._base_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            client = docker.DockerClient(base_url=self._base_url) if self._base_url else docker.from_env()
            client.ping()
        except _ENGINE_ERRORS as exc:
            self._client = None
            raise EngineUnavailable(f"cannot reach the Docker engine at {where}: {_reason(exc)}") from None
        self._client = client
        if not self._exposure_told and not self._profile:
            with suppress(*_ENGINE_ERRORS):  # told at a later connection
                exposure = io_uring_exposure(str(client.version().get("Version", "")))
                self._exposure_told = True
                if exposure:
                    log.warning("%s", exposure)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def ping(self) -> bool:
        try:
            self.client.ping()
            return True
        except (EngineUnavailable, *_ENGINE_ERRORS):
            self._client = None
            return False

    # -- images -------------------------------------------------------------
    def has_image(self, name: str) -> bool:
        """Whether the engine has `name` locally (no registry is ever asked).

        An image the engine confirmed less than `IMAGE_RECHECK` seconds ago is
        taken as there: asking on every submission halved the API's rate. An
        image removed meanwhile fails its job at launch (`LaunchRefused`), which
        also forgets it, so the next submission asks again. While the engine is
        down, images seen before are trusted.
        """
        if image_names.problem(name):  # its name would reach other endpoints than an image's
            return False
        seen = self._images.get(name)
        if seen is not None and time.monotonic() - seen < IMAGE_RECHECK:
            return True
        try:
            self.client.images.get(name)
        except docker.errors.ImageNotFound:
            self._images.pop(name, None)
            return False
        except docker.errors.APIError as exc:
            if exc.status_code in (400, 404):
                self._images.pop(name, None)
                return False
            if name in self._images:
                return True
            raise EngineUnavailable(f"Docker engine error looking up image {name!r}: {_reason(exc)}") from None
        except (EngineUnavailable, *_ENGINE_ERRORS) as exc:
            if name in self._images:
                return True
            raise EngineUnavailable(f"cannot reach the Docker engine: {_reason(exc)}") from None
        self._images[name] = time.monotonic()
        return True

    # -- containers ---------------------------------------------------------
    def name_of(self, job_id: int) -> str:
        return f"cosched-{self.instance}-{job_id}"

    def launch(
        self,
        job_id: int,
        spec: dict[str, Any],
        cpus: list[int],
        quota: float,
        memory_mib: int,
        *,
        slots: tuple[tuple[int, int], ...] = (),
        guest: bool = False,
        name: str = "",
        labels: Mapping[str, str] | None = None,
        run: int = 0,
        gate: Callable[[], bool] | None = None,
    ) -> tuple[str, float]:
        """Create and start a job's container; returns its id and when it started (epoch s).
        (One host: `slots` and `guest` are already in `cpus` and `quota`.) `name` and `labels`
        replace and add to the job's own (the Mesos executor names a container by its task).
        `gate`, if given, is asked between the create and the start, its data dirs still pinned:
        False raises `Withheld` (the Mesos executor holds a gang's part there until every part is
        placed; made first, most of a bad spec is refused before any part runs).

        A container with the job's name may already exist: this `run`'s, if the daemon died
        between creating it and recording that (then it is that container), or an earlier run's
        (`_create`).
        """
        if problem := image_names.problem(spec["image"]):  # one accepted before the grammar was checked
            raise LaunchRefused(f"image {spec['image']!r} {problem}")
        env = dict(spec.get("env") or {})
        env.update(
            COSCHED_JOB_ID=str(job_id),
            COSCHED_CORES=str(spec["cores"]),
            COSCHED_PROGRESS=PROGRESS_PATH,
        )
        data_dirs = list(spec.get("data_dirs") or ())
        account = account_in(spec)
        fds: list[int] = []
        try:
            if nested := nesting_problem(data_dirs):  # accepted before nesting was refused
                raise SandboxRefused(nested)
            for path in data_dirs:
                fds.append(open_data_dir(path, self.settings.data_roots, *runs_as_for(account, self.settings.job_user)))
            staged = self.staging.pin(job_id, fds) if self.staging and fds else data_dirs
            # Mounts, not binds: a bind is one "source:target:mode" string, which a ':' in a path breaks.
            mounts = [
                docker.types.Mount(target=path, source=source, type="bind")
                for source, path in zip(staged, data_dirs, strict=True)
            ]
            own = {LABEL_INSTANCE: self.instance, LABEL_JOB: str(job_id), LABEL_RUN: str(run), **(labels or {})}
            named = name or self.name_of(job_id)
            container = self._create_and_start(job_id, spec, env, mounts, cpus, quota, memory_mib, named, own, gate)
        finally:
            for fd in fds:
                os.close(fd)
            if self.staging and fds:
                self.staging.release(job_id)  # the started container holds its own copy of the mounts
        self._remember(container.id, int(container.attrs["State"].get("Pid") or 0))
        return str(container.id), _timestamp(container.attrs["State"].get("StartedAt"))

    def _create_and_start(
        self,
        job_id: int,
        spec: dict[str, Any],
        env: dict[str, str],
        mounts: list[docker.types.Mount],
        cpus: list[int],
        quota: float,
        memory_mib: int,
        name: str,
        labels: dict[str, str],
        gate: Callable[[], bool] | None = None,
    ) -> Any:
        limits = self.settings
        account = account_in(spec)
        bound = {mount["Target"] for mount in mounts}
        try:
            try:
                image = self.client.api.inspect_image(spec["image"])["Config"]
                declared = image.get("Volumes") or {}
                _refuse_volumes_in_data_dirs(spec["image"], declared, bound)
                workdir = _workdir_outside_data_dirs(spec["image"], image.get("WorkingDir") or "/", bound)
                options: dict[str, Any] = dict(
                    name=name,
                    labels=labels,
                    environment=env,
                    cpu_period=self.cpu_period,
                    cpu_quota=self._quota_us(quota),
                    cpuset_cpus=",".join(map(str, cpus)),
                    mem_limit=memory_mib * (1 << 20),
                    memswap_limit=memory_mib * (1 << 20),
                    mounts=mounts,
                    user=f"{account.uid}:{account.gid}" if account else limits.job_user,
                    group_add=[str(group) for group in account.groups] if account and account.groups else None,
                    cap_drop=["ALL"],
                    security_opt=self._security,
                    pids_limit=limits.pids_limit,
                    ulimits=[
                        docker.types.Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
                        docker.types.Ulimit(name="core", soft=0, hard=0),
                    ],
                    log_config=docker.types.LogConfig(
                        type="json-file", config={"max-size": f"{limits.log_max_mib}m", "max-file": "1"}
                    ),
                    privileged=False,
                    network_mode="none",
                    cgroupns="private",  # its own cgroup as its root: on cgroup v1 the host's showed its container id
                    read_only=True,
                    tmpfs={
                        **scratch_mounts(memory_mib, {os.path.normpath(path) for path in declared} - bound),
                        **self._masked,
                    },
                    working_dir=workdir,  # the one checked, whatever the image is by the create
                    healthcheck={"test": ["NONE"]},  # an image's probe every millisecond loads the engine, not the job
                    use_config_proxy=False,  # the SDK copies the engine client's proxies, credentials and all, into env
                    detach=True,
                )
                container = self._create(job_id, spec, options)
            except docker.errors.ImageNotFound:
                self._images.pop(spec["image"], None)
                raise LaunchRefused(
                    f"image {spec['image']!r} is no longer in the engine (removed after the job was accepted)"
                ) from None
            except docker.errors.APIError as exc:
                raise _refused(job_id, exc) from None
            _refuse_volumes(container, spec["image"])
            if container.status == "created" and gate is not None and not gate():
                raise Withheld(f"job {job_id}: its container {name} was made and not started")
            if container.status == "created":
                try:
                    container.start()
                except docker.errors.APIError as exc:
                    with suppress(*_ENGINE_ERRORS):  # else the next reconciliation removes it
                        container.remove(force=True, v=True)
                    raise _refused(job_id, exc) from None
            container.reload()
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"launching job {job_id}: {_reason(exc)}") from None
        return container

    def _create(self, job_id: int, spec: dict[str, Any], options: dict[str, Any]) -> Any:
        """Create the container of this run (its `LABEL_RUN`). The name may be taken: by this run's,
        which an earlier call made before its answer was lost (then it is that one), or by what an
        earlier run of the same job left, its end recorded but its removal cut short (removed, then
        made anew). Never by another instance's or job's (a Mesos framework id whose label is
        another's prefix): that one is refused, not taken nor removed."""
        name, labels = options["name"], options["labels"]
        ours = {key: value for key, value in labels.items() if key != LABEL_RUN}  # instance, job (Mesos: task)
        for _ in range(2):
            try:
                return self.client.containers.create(spec["image"], spec["command"], **options)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:
                    raise
            try:
                taken = self.client.containers.get(name)
            except docker.errors.NotFound:
                continue  # removed meanwhile: the name is free
            if any(taken.labels.get(key) != value for key, value in ours.items()):
                raise LaunchRefused(f"job {job_id}: its container name {name} is another's ({taken.id[:12]})")
            if taken.labels.get(LABEL_RUN) == labels[LABEL_RUN]:
                return taken
            left = taken.labels.get(LABEL_RUN)
            log.info("removing container %s that run %s of job %d left", taken.id[:12], left, job_id)
            try:
                taken.remove(force=True, v=True)
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # its removal under way: the run is lost, the job queued again
                    raise RunLost(f"container {taken.id[:12]} an earlier run left is still being removed") from None
                raise _refused(job_id, exc) from None  # the engine answers: not waited for (`_refused`)
        raise RunLost(f"container name {name} still taken after its earlier run's container was removed")

    def expect(self, handle: str, job_id: int, slots: tuple[tuple[int, int], ...]) -> None:
        """Nothing to learn: the engine lists every container it has (`Backend.expect`)."""

    def expect_launch(self, job_id: int, run: int, slots: tuple[tuple[int, int], ...]) -> None:
        """Nothing to learn: the engine lists every container it has (`Backend.expect_launch`)."""

    def containers(self) -> dict[int, ContainerInfo]:
        """Every container of this instance, by job id."""
        return {info.job_id: info for info in self.labelled()}

    def labelled(self, **labels: str) -> list[ContainerInfo]:
        """Every container of this instance that also carries `labels`."""
        wanted = [f"{LABEL_INSTANCE}={self.instance}", *(f"{key}={value}" for key, value in labels.items())]
        try:
            listed = self.client.api.containers(all=True, filters={"label": wanted})
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"listing containers: {_reason(exc)}") from None
        found = []
        for item in listed:
            try:
                job_id = int(item["Labels"][LABEL_JOB])
            except (KeyError, ValueError):
                continue
            run = item["Labels"].get(LABEL_RUN, "")
            found.append(
                ContainerInfo(item["Id"], job_id, item.get("State", ""), run=int(run) if run.isdigit() else None)
            )
        return found

    def adopt(self, container_id: str) -> None:
        """Learn a running container's process (after a daemon restart)."""
        attrs = self._inspect(container_id)
        self._remember(container_id, int(attrs["State"].get("Pid") or 0))

    def exit_of(self, container_id: str) -> Exit:
        state = self._inspect(container_id)["State"]
        return Exit(
            code=int(state.get("ExitCode", -1)),
            started=_timestamp(state.get("StartedAt")),
            finished=_timestamp(state.get("FinishedAt")),
            oom=bool(state.get("OOMKilled")),
            cpu_seconds=self._last_cpu.get(container_id, (0.0, None))[1],
        )

    def logs(self, container_id: str) -> str:
        """The last `log_tail` lines of a job's output, and at most `LOG_TAIL_BYTES` of them: the
        engine cuts a line every 16 KiB, so 20 lines of a job that never ends one are 320 KiB, kept
        in the state file for every job and sent in its status."""
        return self._tail(container_id, self.log_tail, LOG_TAIL_BYTES)

    def live_log(self, container_id: str, lines: int) -> str | None:
        return self._tail(container_id, lines, LIVE_LOG_BYTES)

    def _tail(self, container_id: str, lines: int, most: int) -> str:
        try:
            raw = self.client.api.logs(container_id, stdout=True, stderr=True, tail=lines)
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"reading logs of {container_id[:12]}: {_reason(exc)}") from None
        raw = raw if isinstance(raw, bytes) else str(raw).encode()
        if len(raw) > most:
            raw = b"[...]" + raw[-most:]
        return raw.decode("utf-8", "replace")

    def withdraw(self, job_id: int) -> None:
        """A launch here is one create and start: nothing to give up midway (`Backend.withdraw`)."""

    def kill(self, container_id: str) -> None:
        try:
            self.client.api.kill(container_id)
        except docker.errors.APIError as exc:
            if exc.status_code in (404, 409):  # gone, or not running: already what we want
                return
            if exc.status_code is not None and exc.status_code >= 500:  # it answered: not an engine lost
                raise NotKilled(f"killing {container_id[:12]}: {_reason(exc)}") from None
            raise EngineUnavailable(f"killing {container_id[:12]}: {_reason(exc)}") from None
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"killing {container_id[:12]}: {_reason(exc)}") from None

    def kill_without_engine(self, container_id: str) -> bool:
        """SIGKILL the container's first process by the pid remembered at launch, for when the engine
        cannot be asked (the Mesos executor's fence with its engine down: containerd runs containers
        on without dockerd). It is PID 1 of the job's pid namespace, whose end takes every process
        there with it. False when that process is gone (or its pid is another's now): a pidfd holds
        the process while its start time is checked, so no other one is ever signalled. OSError
        (EPERM) when this process may not signal it (not root)."""
        pid, start = self._pids.get(container_id, 0), self._starts.get(container_id, 0)
        if pid <= 0 or not start:
            return False
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        try:
            if process_start(pid) != start:
                return False
            signal.pidfd_send_signal(handle, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(handle)

    def remove(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True, v=True)  # v: anonymous volumes too
        except docker.errors.NotFound:
            pass
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"removing {container_id[:12]}: {_reason(exc)}") from None
        self._forget(container_id)

    # -- quotas -------------------------------------------------------------
    def set_quota(self, container_id: str, cpus: float) -> None:
        """Change a running container's CFS quota, then check the kernel enforces it."""
        try:
            self.client.api.update_container(container_id, cpu_quota=self._quota_us(cpus), cpu_period=self.cpu_period)
        except docker.errors.APIError as exc:
            if exc.status_code in (404, 409) or "is not running" in str(exc) or not self._running(container_id):
                return  # it ended meanwhile (runc fails with a 500 mid-exit); the next pass collects its end
            raise EngineUnavailable(f"updating the quota of {container_id[:12]}: {_reason(exc)}") from None
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"updating the quota of {container_id[:12]}: {_reason(exc)}") from None
        self.verify_quota(container_id, cpus)

    def verify_quota(self, container_id: str, cpus: float) -> bool:
        """True if the cgroup shows `cpus`; QuotaMismatch if it shows something else;
        False if the cgroup cannot be read (the container ended)."""
        files = self._files(container_id)
        if files is None:
            return False
        try:
            quota, period = files.quota()
        except OSError:
            return False
        expected = self._quota_us(cpus)
        if quota != expected or period != self.cpu_period:
            raise QuotaMismatch(
                f"container {container_id[:12]}: cgroup shows quota {quota}/{period} us, "
                f"expected {expected}/{self.cpu_period}"
            )
        return True

    def applied_quota(self, container_id: str) -> float | None:
        """The quota the kernel enforces, in CPUs (None if unlimited or unreadable)."""
        files = self._files(container_id)
        try:
            quota, period = files.quota() if files else (-1, 1)
        except OSError:
            return None
        return None if quota < 0 else quota / period

    def _quota_us(self, cpus: float) -> int:
        return max(1000, round(cpus * self.cpu_period))

    # -- what a cluster has and one host has not -------------------------------
    def queued(self, jobs: int) -> None:
        """One engine: no offers to stop or to ask for again."""

    def nodes_changed(self) -> list[tuple[int, bool]]:
        return []  # the nodes are parts of this host: they come and go with the daemon

    def node_status(self) -> list[NodeStatus]:
        return []

    def waiting(self) -> dict[int, str]:
        return {}  # a launch waits for nothing but the engine

    def others_hold(self, cores: int, memory: int) -> dict[int, tuple[int, int]]:
        return {}  # the host's CPUs and memory are the daemon's

    def unsized(self) -> list[tuple[str, int]]:
        return []  # an adopted container's size is in its own settings

    def size(self, handle: str, memory_mib: int, guest: bool) -> None:
        pass

    # -- monitoring ---------------------------------------------------------
    def sample(self, container_id: str, quota: float, now: float) -> Sample | None:
        """CPU used over the quota granted since the last sample, memory over limit, progress.

        None at a container's first sample, and for one since which its quota changed: CPU is a
        rate between two readings, and one of a busy job's first interval would read 0 (idle, the
        first to lend), one across a lending's start or end a share of neither quota. Replay's
        samples are a rate under the quota of the moment; the next one here is again.
        """
        files = self._files(container_id)
        if files is None:
            return None
        try:
            used = files.cpu_seconds()
            memory, limit = files.memory_bytes()
        except OSError:
            return None
        previous = self._last_cpu.get(container_id)
        if container_id in self._pids:  # sampled off the daemon's lock: not after the pass forgot it
            self._last_cpu[container_id] = (now, used, quota)
        if previous is None or not now > previous[0] or previous[2] != quota or quota <= 0:
            return None
        cpu = (used - previous[1]) / ((now - previous[0]) * quota)
        mem = memory / limit if limit > 0 else 0.0
        done, total = self._progress(container_id)
        return Sample(max(0.0, cpu), min(1.0, mem), done, total)

    def _progress(self, container_id: str) -> tuple[int, int]:
        """`done/total` from the job's progress file, read link-free through its root in /proc."""
        pid = self._pids.get(container_id, 0)
        return read_progress(pid, self._starts.get(container_id, 0), PROGRESS_PATH)

    # -- internals ----------------------------------------------------------
    def _inspect(self, container_id: str) -> dict[str, Any]:
        try:
            return dict(self.client.api.inspect_container(container_id))
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"inspecting {container_id[:12]}: {_reason(exc)}") from None

    def _running(self, container_id: str) -> bool:
        """Whether the engine still reports the container running (False if it is gone)."""
        try:
            return bool(self.client.api.inspect_container(container_id)["State"].get("Running"))
        except docker.errors.NotFound:
            return False
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"inspecting {container_id[:12]}: {_reason(exc)}") from None

    def _remember(self, container_id: str, pid: int) -> None:
        self._pids[container_id] = pid
        self._starts[container_id] = process_start(pid) if pid > 0 else 0
        files = CgroupFiles.of_pid(pid) if pid > 0 else None
        if files is not None:
            self._cgroups[container_id] = files

    def _forget(self, container_id: str) -> None:
        self._pids.pop(container_id, None)
        self._starts.pop(container_id, None)
        self._cgroups.pop(container_id, None)
        self._last_cpu.pop(container_id, None)

    def _files(self, container_id: str) -> CgroupFiles | None:
        files = self._cgroups.get(container_id)
        if files is None:
            pid = self._pids.get(container_id, 0)
            files = CgroupFiles.of_pid(pid) if pid > 0 else None
            if files is not None:
                self._cgroups[container_id] = files
        return files if files is not None and files.cpu.exists() else None


def _timestamp(text: str | None) -> float:
    """Docker's RFC 3339 times (nanoseconds, Z) as epoch seconds; 0 for the zero time."""
    if not text or text.startswith("0001-"):
        return 0.0
    head, _, frac = text.rstrip("Z").partition(".")
    if "+" in frac or "-" in frac:
        frac = frac.split("+")[0].split("-")[0]
    stamp = datetime.fromisoformat(head + "+00:00").timestamp()
    return stamp + (float("0." + frac) if frac else 0.0)


def _refused(job_id: int, exc: docker.errors.APIError) -> Exception:
    """What an engine that answered a launch with an error means. It is up, so waiting for it to
    come back would retry this job forever and start no other: one job's command that is not in
    its image once held every launch and every end behind it. A 4xx is this job's own (a
    command, a limit or an environment the engine will not take): it fails. A 5xx may be the
    engine's own trouble (containerd gone): the run counts as lost and the job is queued again,
    up to `ends.MAX_LOST_RUNS` times."""
    why = f"the Docker engine refused job {job_id}: {_reason(exc)}"
    if exc.is_server_error():
        return RunLost(why)
    return LaunchRefused(why)


def _reason(exc: BaseException) -> str:
    """An engine error in one line of at most 300 characters. An API error is told in the engine's
    own words, not the SDK's (which begin with the request's URL and container id, and were cut
    before the cause: `exec: "n`); a longer one keeps its end, where the runtime names the cause."""
    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        text = f"{exc.status_code} {exc.explanation}"
    else:
        text = str(exc).strip() or type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= 300 else "..." + text[-297:]


def data_dirs_allowed(
    paths: list[str], roots: tuple[str, ...], account: Account | None = None, job_user: str = DockerSection.job_user
) -> str:
    """'' if every path is an existing directory under one of `roots`, reached through no link and
    through directories the job may pass (`runs_as`), and none nests in another, else the problem."""
    runs_as, whole = runs_as_for(account, job_user)
    problem = next((problem for path in paths if (problem := data_dir_problem(path, roots, runs_as, whole))), "")
    return problem or nesting_problem(paths)


def runs_as_for(account: Account | None, job_user: str) -> tuple[Account, bool]:
    """The account a job's data dirs must let pass, and whether from `/` (`sandbox._walk`): its
    submitter's, every directory; else `docker.job_user`'s, those below the data root."""
    return (account, True) if account is not None else (job_user_account(job_user), False)


def _refuse_volumes_in_data_dirs(image: str, declared: Iterable[str], bound: set[str]) -> None:
    """A VOLUME of the image inside a data dir gets a tmpfs whose target the runtime resolves
    through that data dir, files the job's user can change while it sets the container up (the
    redirect `sandbox.nesting_problem` keeps data dirs from): refused, with both named."""
    for volume in declared:
        if (inside := _data_dir_holding(volume, bound)) is not None:
            raise LaunchRefused(
                f"image {image!r} declares VOLUME {os.path.normpath(volume)!r} inside data dir {inside!r}: "
                "give a data dir that does not hold it"
            )


def _workdir_outside_data_dirs(image: str, workdir: str, bound: set[str]) -> str:
    """The image's WORKDIR, refused inside a data dir: runc makes a missing one, as root with every
    capability, after the mounts, so a job's link in its data dir (`work -> ../bob/results`) had
    root-owned directories made in another user's data dir."""
    if (inside := _data_dir_holding(workdir, bound)) is not None:
        raise LaunchRefused(
            f"image {image!r} has WORKDIR {os.path.normpath(workdir)!r} inside data dir {inside!r}: "
            "give a data dir that does not hold it"
        )
    return workdir


def _data_dir_holding(path: str, bound: set[str]) -> str | None:
    """The data dir (a mount target) strictly above `path` in the container, if any."""
    parents = Path(os.path.normpath(path)).parents
    return next((data for data in bound if Path(data) in parents), None)


def _refuse_volumes(container: Any, image: str) -> None:
    """LaunchRefused (the container removed) if Docker gave it a volume on the engine's disk after
    all: the image was replaced by one with other VOLUMEs between its inspection and the create."""
    anonymous = [m.get("Destination", "") for m in container.attrs.get("Mounts") or () if m.get("Type") == "volume"]
    if anonymous:
        container.remove(force=True, v=True)
        raise LaunchRefused(f"image {image!r} changed while the job launched: volumes {', '.join(anonymous)} on disk")

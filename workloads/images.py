"""Container images built without a registry: a root filesystem fed to `docker import`.

No registry is reachable from the machines cosched is tested on, so images are
made from what the host has or can fetch from Debian's archive:

- `busybox_image` packs the static busybox binary (Debian's `busybox-static`)
  with one link per applet: a ~2 MB image with a shell, `sleep`, `dd`, `seq` and
  friends, enough for the daemon's end-to-end tests and for idle or busy jobs.
- `workflow_image` is the image the four ASAx workflows run in: a Debian
  minbase root filesystem made by `debootstrap` with `DEBIAN_PACKAGES` (the
  Montage toolkit, BLAST+, Python with NumPy), imported once as a base, plus
  the stage programs (`workloads/stages`) committed on top. `workloads/Dockerfile`
  makes the same image for users who have a registry.

Every tag carries a hash of what went into it (the busybox binary; the suite
and package list; the stage programs), so a rebuild happens only when one of
them changed, and changing a stage program costs a second, not a debootstrap.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors

from cosched.errors import ConfigError

BUSYBOX_REPOSITORY = "cosched/busybox"
DEBIAN_REPOSITORY = "cosched/debian-workflows"
WORKFLOW_REPOSITORY = "cosched/workflows"
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("montage", "ncbi-blast+", "python3-numpy")
"""What the workflows need from Debian; workloads/Dockerfile installs the same list (tested)."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"
STAGE_ROOT = "/opt/cosched"
"""Where the stage programs live in the image (on PYTHONPATH there)."""
IMAGE_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"PYTHONPATH={STAGE_ROOT}",
    "PYTHONDONTWRITEBYTECODE=1",
)
_STAGES_DIR = Path(__file__).parent / "stages"
# Trimmed from the root filesystem: not needed to run anything, a third of its size.
_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")


def busybox_path() -> Path:
    """The busybox binary; it must be static to run alone in an image."""
    found = shutil.which("busybox") or "/bin/busybox"
    path = Path(found)
    if not path.is_file():
        raise ConfigError("busybox not found: install Debian's busybox-static")
    return path


def busybox_image(client: docker.DockerClient | None = None) -> str:
    """Import (once) and return the tag of the busybox image."""
    client = client or docker.from_env()
    binary = busybox_path()
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:12]
    tag = f"{BUSYBOX_REPOSITORY}:{digest}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    client.api.import_image_from_data(_busybox_rootfs(binary), repository=BUSYBOX_REPOSITORY, tag=digest)
    return tag


def _busybox_rootfs(binary: Path) -> bytes:
    applets = subprocess.run([str(binary), "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("bin", "tmp", "proc", "sys", "dev", "etc", "data"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(binary), arcname="bin/busybox")
        for applet in applets:
            if applet == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buffer.getvalue()


def workflow_image(
    client: docker.DockerClient | None = None,
    *,
    mirror: str | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> str:
    """Build (once) and return the tag of the workflows' image: Debian base + stage programs."""
    client = client or docker.from_env()
    tag = f"{WORKFLOW_REPOSITORY}:{_stages_digest()}"
    if _have(client, tag):
        return tag
    with one_builder():
        if _have(client, tag):  # another process built it while this one waited
            return tag
        return _add_stages(client, tag, _debian_base(client, mirror, log), log)


def _add_stages(client: docker.DockerClient, tag: str, base: str, log: Callable[[str], None]) -> str:
    log(f"adding the stage programs to {base}")
    container = client.containers.create(base, ["true"], network_disabled=True)
    try:
        container.put_archive("/opt", _stages_tar())
        repository, _, version = tag.partition(":")
        container.commit(repository, version, conf={"Env": list(IMAGE_ENV), "WorkingDir": "/"})
    finally:
        container.remove(force=True)
    return tag


def _debian_base(client: docker.DockerClient, mirror: str | None, log: Callable[[str], None]) -> str:
    """Import (once) a Debian minbase root filesystem with DEBIAN_PACKAGES; returns its tag. The
    caller holds `one_builder`."""
    digest = hashlib.sha256(f"{DEBIAN_SUITE} {' '.join(DEBIAN_PACKAGES)}".encode()).hexdigest()[:12]
    tag = f"{DEBIAN_REPOSITORY}:{digest}"
    if _have(client, tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise ConfigError("debootstrap not found: install it (deploy/docker-setup.sh does) to build the workflow image")
    mirror = mirror or os.environ.get("COSCHED_DEBIAN_MIRROR") or DEFAULT_MIRROR
    with tempfile.TemporaryDirectory(prefix="cosched-rootfs-") as scratch:
        root = Path(scratch) / "root"
        log(f"debootstrap {DEBIAN_SUITE} from {mirror} with {', '.join(DEBIAN_PACKAGES)} (about 80 s)")
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            DEBIAN_SUITE,
            str(root),
            mirror,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines() or [f"exit status {done.returncode}"]
            raise ConfigError(f"debootstrap failed (needs root and {mirror}): {lines[-1]}")
        for part in _TRIM:
            shutil.rmtree(root / part, ignore_errors=True)
        archive = Path(scratch) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(archive), "."], check=True)
        log(f"importing {archive.stat().st_size >> 20} MiB as {tag}")
        client.api.import_image_from_file(str(archive), repository=DEBIAN_REPOSITORY, tag=digest)
    return tag


BUILD_LOCK = Path(tempfile.gettempdir()) / "cosched-image-build.lock"


@contextlib.contextmanager
def one_builder() -> Iterator[None]:
    """Held while an image is built: one build at a time on this machine.

    Why: two processes needing the workflow image at once (two pytest workers, two
    `cosched workloads image`) would each run an 80 s debootstrap on the same cores.
    The second waits here, then finds the image the first built. A lock of the kernel
    (flock), so a builder that dies releases it.
    """
    fd = os.open(BUILD_LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _have(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _stage_files() -> list[Path]:
    return sorted(p for p in _STAGES_DIR.glob("*.py"))


def _stages_digest() -> str:
    """A hash of the stage programs and of the base they run on."""
    digest = hashlib.sha256(f"{DEBIAN_SUITE} {' '.join(DEBIAN_PACKAGES)} {' '.join(IMAGE_ENV)}".encode())
    for path in _stage_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _stages_tar() -> bytes:
    """cosched/workloads/{__init__.py, stages/*.py}, to be unpacked under /opt."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("cosched", "cosched/workloads", "cosched/workloads/stages"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        package_init = tarfile.TarInfo("cosched/workloads/__init__.py")
        tar.addfile(package_init, io.BytesIO(b""))
        for path in _stage_files():
            tar.add(str(path), arcname=f"cosched/workloads/stages/{path.name}")
    return buffer.getvalue()

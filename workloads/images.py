"""Container images built without a registry: a root filesystem fed to `docker import`.

No registry is reachable from the machines cosched is tested on, so images are
made from files this host already has. `busybox_image` packs the static
busybox binary (Debian's `busybox-static`) with one link per applet: a ~2 MB
image with a shell, `sleep`, `dd`, `seq` and friends, enough for the daemon's
end-to-end tests and for synthetic CPU-bound or idle jobs. The tag carries a
hash of the binary, so a rebuild happens only when busybox changed.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import docker
import docker.errors

from cosched.errors import ConfigError

BUSYBOX_REPOSITORY = "cosched/busybox"


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

"""What a job's container may touch on the host, checked when it starts, not only when it was accepted.

A job is arbitrary code from any local user who can reach the API, and its
data directories are host paths. Checking them at submission is not enough:
a directory can be replaced by a symlink later (by the host, or by an earlier
job writing into a shared data root), and Docker would follow it when it
mounts. So at launch each accepted directory is opened again, one path
component at a time, without following any link; a path that changed since
it was accepted is refused. The directory actually opened is what the job
gets: it is bind-mounted by file descriptor onto a private staging point
(`<state_dir>/mounts`, root only) with `nosuid,nodev`, and Docker mounts that
staging point, whose flags its bind mount inherits. Once the container has
started, its mount namespace holds its own copy, and the staging mount is
released.

The progress file is read with the same care: it lives inside the container,
whose root and `/tmp` the job controls, so it is opened component by
component without following links, non-blocking, only if it is a regular file,
and at most a few hundred bytes are read.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from collections.abc import Iterable
from pathlib import Path

from cosched.daemon.accounts import Account
from cosched.errors import ConfigError, CoschedError

PROGRESS_MAX_BYTES = 256
"""`done/total` needs a few bytes; more is never read."""

_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_NOSYMFOLLOW = 0x100
_MS_NOATIME = 0x400
_MS_NODIRATIME = 0x800
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_STRICTATIME = 0x1000000
_MNT_DETACH = 0x2
_ST_NOSYMFOLLOW = 0x2000
_KEPT_FLAGS = (
    (os.ST_RDONLY, _MS_RDONLY),
    (os.ST_NOEXEC, _MS_NOEXEC),
    (_ST_NOSYMFOLLOW, _MS_NOSYMFOLLOW),
    (os.ST_NOATIME, _MS_NOATIME),
    (os.ST_NODIRATIME, _MS_NODIRATIME),
)
"""statvfs flags of a data dir's own mount and the mount flags that keep them on its staging mount."""

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxRefused(CoschedError):
    """A job's data directory is not what was accepted (replaced by a link, moved out of the roots)."""


def data_dir_problem(path: str, roots: tuple[str, ...], account: Account | None = None, whole: bool = True) -> str:
    """'' if `path` is a plain path to an existing directory under a data root, reached through
    no link (and, with `account`, through directories that let it pass: every one if `whole`,
    those below its data root if not, see `_walk`), else the problem.

    It is walked as `open_data_dir` walks it at launch, each directory's permission checked
    before anything in it is looked at, so a refusal says nothing about what lies past a
    directory the submitter may not pass; a path through a symlink is refused without saying
    where the link leads (it may lead into a directory the submitter may not pass).
    """
    try:
        os.close(_walk(path, roots, account, whole))
    except _Stopped as stop:
        return stop.submitted
    except ValueError as exc:  # a NUL byte
        return f"{path!r} is not a usable path: {str(exc).splitlines()[0][:200]}"
    return ""


def nesting_problem(paths: list[str]) -> str:
    """'' if no data dir is another or inside another, else the pair.

    Why: only a mount's source is opened link-free; its target is the path itself, which the
    container's runtime resolves inside the container, through the mounts made before it. With
    `/d` and `/d/x`, a job whose `/d/x` was swapped for a symlink after the walk (its own files,
    from a running job) had its data mounted over its own `/etc`: nothing of the host, but a
    hand on its container while the runtime still sets it up, which runtime escapes have used.
    """
    plain = sorted((Path(os.path.normpath(p)) for p in paths), key=lambda p: len(p.parts))
    for i, outer in enumerate(plain):
        for inner in plain[i + 1 :]:
            if inner == outer or outer in inner.parents:
                where = "given twice" if inner == outer else f"inside {str(outer)!r}"
                return f"data dir {str(inner)!r} is {where}: give data dirs that do not nest"
    return ""


def _under(path: str, roots: tuple[str, ...]) -> bool:
    """Whether `path` is a root or inside one, as written: the walk then passes through the root's
    own components, link-free (`root_problem` refused roots that are, or go through, links)."""
    plain = Path(path)
    return any(plain == root or root in plain.parents for root in map(Path, roots))


def check_data_roots(roots: Iterable[str], key: str) -> list[str]:
    """The daemon's and each Mesos executor's check of their data roots at start: ConfigError (under
    `key`) for one that cannot serve (`root_problem`); what the operator should know of the others
    (`suid_warning`), to log."""
    warnings = []
    for root in roots:
        if problem := root_problem(root):
            raise ConfigError(f"{key}: {problem}")
        if warning := suid_warning(root):
            warnings.append(warning)
    return warnings


def suid_warning(root: str) -> str:
    """'' if `root` is on a nosuid mount, else what the operator should know: jobs see their data
    dirs nosuid, but a setuid program a job leaves there runs as the job's user for any host user
    who runs it from the host's own mount, which is the operator's to make nosuid."""
    if os.statvfs(root).f_flag & os.ST_NOSUID:
        return ""
    return (
        f"data root {root} is not on a nosuid mount: a job can leave a setuid program there that any host "
        "user may run as the job's user (mount it nosuid: docs/security.md)"
    )


def root_problem(root: str) -> str:
    """'' if `root` can serve as a data root, else why not, for the operator.

    A data root must be an existing directory reached through no link, and no one but root may
    replace it or a directory above it: a data dir is judged by its path under the root, so a
    user who made a root (or its parent) a link to `/` made every host directory a data dir.
    """
    if problem := _link_problem(root):
        return problem
    if root in _HOST_TREES:
        return f"{root!r} would make the host's own files data dirs"
    return replaceable_problem(root, frozenset({0}))


def _link_problem(path: str) -> str:
    if not os.path.isabs(path) or path != os.path.normpath(path) or path.startswith("//"):
        return f"{path!r} is not a plain absolute path"
    if os.path.realpath(path) != path:
        return f"{path!r} is or goes through a symlink: give its real path {os.path.realpath(path)!r}"
    if not os.path.isdir(path):
        return f"{path!r} is not an existing directory"
    return ""


def state_dir_problem(path: str) -> str:
    """'' if no one but the daemon's own user (or root) can replace the state directory or what
    it holds, else why not. The daemon, root, writes its state file, locks and staging mounts
    there: a directory another user made (`/tmp/cosched`) let them link those names to host files,
    which the daemon then chmodded or mounted over, or hand it a state file of their own."""
    return _link_problem(path) or replaceable_problem(path, frozenset({0, os.geteuid()}))


def replaceable_problem(path: str, owners: frozenset[int]) -> str:
    """'' if only `owners` can replace the directory `path` or one above it, else why not.

    A directory above it writable by others must be sticky (as /tmp) with the next one an owner's.
    """
    parts = Path(path).parts
    for depth in range(1, len(parts) + 1):
        here, below = Path(*parts[:depth]), Path(*parts[: depth + 1])
        info = os.stat(here)
        where = "it" if depth == len(parts) else f"{str(here)!r} above it"
        if info.st_uid not in owners:  # its owner could replace it, or mount something of theirs over it
            return f"{path!r}: {where} is owned by uid {info.st_uid}, who could replace it"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (
            info.st_mode & stat.S_ISVTX and (depth == len(parts) or os.lstat(below).st_uid in owners)
        ):
            return f"{path!r}: {where} is writable by others, who could replace what lies in it"
    return ""


_HOST_TREES = frozenset({"/", "/proc", "/sys", "/dev", "/etc", "/boot", "/run", "/usr", "/var"})
"""Roots that would hand jobs the host itself, refused whatever their owner and mode."""


def open_data_dir(path: str, roots: tuple[str, ...], account: Account | None = None, whole: bool = True) -> int:
    """An O_DIRECTORY descriptor of `path`, reached without following any link.

    `path` was accepted link-free under a data root (`data_dir_problem`); if
    any component of it is now a symlink or not a directory, the job is
    refused rather than given what the path now points at. With `account` (the
    job runs as its submitter), each directory above `path` must let it pass:
    the daemon, root, opens the path and the job is given the mount itself, so
    the kernel never checks the parents the submitter's own `cd` would have to
    pass (another user's 0700 home) unless this does.
    """
    try:
        return _walk(path, roots, account, whole)
    except _Stopped as stop:
        raise SandboxRefused(stop.launched) from None


class _Stopped(Exception):
    """Why a walk to a data dir stopped (`why`), worded for a submission and for a launch."""

    def __init__(self, path: str, why: str, detail: str = "") -> None:
        self.submitted = {
            "relative": f"{path!r} is not an absolute path",
            "plain": f"{path!r} is not a plain absolute path: give it without '.' or '..' parts and"
            " without repeated or trailing '/'",
            "root": f"{path!r} is not under a configured data root ({detail})",
            "pass": detail,
            "link": f"{path!r} leads through a symlink; give its real path",
            "missing": f"{path!r} is not an existing directory",
            "other": f"{path!r} is not a usable path: {detail}",
        }[why]
        self.launched = {
            "relative": f"data dir {path!r} is not an absolute path",
            "plain": f"data dir {path!r} is not a plain absolute path",
            "root": f"data dir {path!r} is no longer under a configured data root",
            "pass": f"data dir {detail}",
            "link": f"data dir {path!r} changed since the job was accepted ({detail!r} is now a symlink)",
            "missing": f"data dir {path!r} changed since the job was accepted ({detail!r} is now missing)",
            "other": f"data dir {path!r} changed since the job was accepted ({detail})",
        }[why]


def _walk(path: str, roots: tuple[str, ...], account: Account | None, whole: bool = True) -> int:
    """Open `path` from `/` one component at a time, never following a link, never going up.

    Why no '.' or '..': a '..' is not a link, so O_NOFOLLOW lets it through, and it climbs from
    wherever the walk is: a job renaming a directory of its own between two steps walked the
    daemon past `/` to any host directory, mounted read-write. Only a plain path is walked, and
    downwards only, each step from the descriptor of the directory before it.

    With `account`, the job's, each directory passed must let it pass: the daemon, root, opens
    the path and the job gets the mount, so the kernel never checks them. `whole` (a submitter's
    account): every one from `/`. Not `whole` (`docker.job_user`, which every job runs as): those
    below the data root, which users make (a user's 0700 directory there kept out only that
    user's own processes, not another's job); the root and what lies above it are the operator's.
    """
    if not os.path.isabs(path):
        raise _Stopped(path, "relative")
    if path != os.path.normpath(path) or path.startswith("//"):
        raise _Stopped(path, "plain")
    if not _under(path, roots):
        raise _Stopped(path, "root", ", ".join(roots) or "none configured")
    root_depth = max(len(Path(root).parts) for root in roots if _under(path, (root,)))
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walked = "/"
        for part in Path(path).parts[1:]:
            below_root = len(Path(walked).parts) > root_depth
            if account is not None and (whole or below_root) and not may_search(fd, account):
                raise _Stopped(path, "pass", _unreachable(path, walked, account, whole))
            walked = os.path.join(walked, part)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # what it is, asked of the directory held
                    link = _is_link(part, fd)
                    raise _Stopped(path, "link" if link else "missing", part) from None
                if exc.errno == errno.ENOENT:
                    raise _Stopped(path, "missing", part) from None
                raise _Stopped(path, "other", os.strerror(exc.errno or 0)) from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(name: str, directory: int) -> bool:
    """Whether `name` in the open `directory` is a symlink, looked at through the descriptor: a
    path would be resolved again, through whatever a race swapped in above it."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        return False


def may_search(directory: int, account: Account) -> bool:
    """Whether `account`'s processes may pass through the open `directory`, as the kernel decides:
    by its access ACL when it has one (POSIX.1e, `posix_acl_permission`), else by its mode bits
    (owner, else group, else others). Why the ACL: with one, the mode's group bits are its mask,
    and a named entry (`user:65534:---`) refuses what the mode bits would let pass."""
    info = os.fstat(directory)
    acl = _access_acl(directory)
    if acl is None or not info.st_mode & stat.S_IRWXG:  # Linux reads no ACL whose mask is empty
        if info.st_uid == account.uid:
            return bool(info.st_mode & stat.S_IXUSR)
        if info.st_gid == account.gid or info.st_gid in account.groups:
            return bool(info.st_mode & stat.S_IXGRP)
        return bool(info.st_mode & stat.S_IXOTH)
    perms = {tag: perm for tag, perm, _ in acl if tag in (_ACL_USER_OBJ, _ACL_MASK, _ACL_OTHER)}
    mask = perms.get(_ACL_MASK, 0o7)
    if info.st_uid == account.uid:
        return bool(perms.get(_ACL_USER_OBJ, 0) & _SEARCH)
    named = [perm for tag, perm, who in acl if tag == _ACL_USER and who == account.uid]
    if named:
        return bool(named[0] & mask & _SEARCH)
    groups = {account.gid, *account.groups}
    matched = [
        perm
        for tag, perm, who in acl
        if (tag == _ACL_GROUP_OBJ and info.st_gid in groups) or (tag == _ACL_GROUP and who in groups)
    ]
    if matched:
        return any(perm & mask & _SEARCH for perm in matched)
    return bool(perms.get(_ACL_OTHER, 0) & _SEARCH)


_ACL_XATTR = "system.posix_acl_access"
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_SEARCH = 0o1


def _access_acl(directory: int) -> list[tuple[int, int, int]] | None:
    """The (tag, permissions, id) entries of the open `directory`'s access ACL; None if it has none.
    One that cannot be read is an ACL that lets nobody pass (only the owner's entry, empty)."""
    try:
        raw = os.getxattr(directory, _ACL_XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        return [(_ACL_USER_OBJ, 0, 0)]
    body = raw[4:]
    if raw[:4] != struct.pack("<I", 2) or len(body) % 8:
        return [(_ACL_USER_OBJ, 0, 0)]
    return [struct.unpack_from("<HHI", body, offset) for offset in range(0, len(body), 8)]


def _unreachable(path: str, parent: str, account: Account, submitter: bool) -> str:
    who = "its submitter" if submitter else "docker.job_user, as which jobs run"
    return f"{path!r}: {parent!r} above it does not let uid {account.uid} ({who}) pass"


class StagingMounts:
    """Private `nosuid,nodev` bind mounts of the directories a launch opened, one folder per job,
    keeping what their own mounts forbid (read-only, noexec)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pin(self, job_id: int, fds: list[int]) -> list[str]:
        """Mount each opened directory on `<root>/<job>/<n>`; the paths Docker should mount."""
        self.release(job_id)
        folder = self.root / str(job_id)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(self.root)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():  # mounts never land elsewhere
            raise OSError(errno.EPERM, f"{self.root} is not a directory of the daemon's own")
        os.chmod(self.root, 0o700)
        folder.mkdir(mode=0o700)
        staged = []
        try:
            for n, fd in enumerate(fds):
                target = folder / str(n)
                target.mkdir(mode=0o700)
                _mount(f"/proc/self/fd/{fd}", str(target), _MS_BIND)
                _mount("", str(target), _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | _kept_flags(fd))
                staged.append(str(target))
        except BaseException:
            self.release(job_id)
            raise
        return staged

    def release(self, job_id: int) -> None:
        """Unmount and remove a job's staging folder (its container keeps its own copy of the mounts)."""
        folder = self.root / str(job_id)
        if not folder.is_dir():
            return
        for target in folder.iterdir():
            # A bind mount on the same filesystem is invisible to os.path.ismount: unmount
            # unconditionally, then rmdir, which refuses a directory that still shows data.
            _umount(str(target))
            target.rmdir()
        folder.rmdir()

    def release_all(self) -> None:
        """Leftovers of a daemon killed mid-launch."""
        if self.root.is_dir():
            for folder in self.root.iterdir():
                if folder.name.isdigit():
                    self.release(int(folder.name))


def _kept_flags(fd: int) -> int:
    """The mount flags of the directory's own mount that a bind remount would drop: it sets every
    per-mount flag anew, so a data root the host mounted read-only or noexec became writable and
    executable in the job."""
    flags = os.fstatvfs(fd).f_flag
    kept = 0
    for statvfs_flag, mount_flag in _KEPT_FLAGS:
        if flags & statvfs_flag:
            kept |= mount_flag
    if not flags & (os.ST_NOATIME | os.ST_RELATIME):
        kept |= _MS_STRICTATIME  # a remount defaults to relatime
    return kept


def _mount(source: str, target: str, flags: int) -> None:
    if _libc.mount(source.encode() or None, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        code = ctypes.get_errno()
        raise SandboxRefused(f"cannot bind-mount a data dir on {target}: {os.strerror(code)}")


def _umount(target: str) -> None:
    if _libc.umount2(target.encode(), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):
            raise OSError(code, os.strerror(code), target)


def process_start(pid: int) -> int:
    """When process `pid` started (clock ticks since boot), 0 if there is none: with the pid,
    it names one process, where a pid alone may name the next one the kernel gives it to."""
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        return _start_of(proc)
    finally:
        os.close(proc)


def _start_of(proc: int) -> int:
    """Field 22 of `stat` in an open /proc/<pid> directory; 0 if unreadable (process gone)."""
    try:
        fd = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        try:
            text = os.read(fd, 4096).decode("ascii", "replace")
        finally:
            os.close(fd)
        return int(text.rpartition(")")[2].split()[19])  # after the command, which may hold spaces
    except (OSError, ValueError, IndexError):
        return 0


def read_progress(pid: int, start: int, path: str) -> tuple[int, int]:
    """`done/total` from the file at `path` inside the root of process `pid` started at `start`
    (`process_start`); (0, 0) if absent, not plain, if that process is gone, or if it is not a
    progress (`0 <= done <= total`): the file is the job's word, and ASAx's features refuse
    more tasks done than there are (a job writing `5/3` stopped every scheduling pass).

    Every component is opened with O_NOFOLLOW from the container's root, so
    a link (absolute links would resolve against the host's root), a FIFO, a
    device or a huge file yields nothing instead of a host file, a blocked
    daemon or a swollen one. The root is opened through the /proc directory whose
    start time was checked, which keeps naming that process: once a container's
    process has exited, a host process given its pid is never read.
    """
    if pid <= 0 or start <= 0:
        return 0, 0
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0, 0
    try:
        if _start_of(proc) != start:
            return 0, 0
        fd = os.open("root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    except OSError:
        return 0, 0
    finally:
        os.close(proc)
    try:
        parts = Path(path).parts[1:]
        for part in parts[:-1]:
            child = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        child = os.open(parts[-1], flags, dir_fd=fd)
        os.close(fd)
        fd = child
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0, 0
        text = os.read(fd, PROGRESS_MAX_BYTES).decode("ascii", "replace")
        done, total = (int(count) for count in text.strip().split("/", 1))
        return (done, total) if 0 <= done <= total else (0, 0)
    except (OSError, ValueError):
        return 0, 0
    finally:
        os.close(fd)

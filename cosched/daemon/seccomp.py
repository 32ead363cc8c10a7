"""The seccomp profile jobs run under: the operator's, never below cosched's floor.

io_uring lets a process run I/O system calls from a ring the kernel drains, past
seccomp's view, and it was the path of several container escapes. Docker 25 and
containerd closed it in their default profiles; Docker 20.10 (Debian 12's `docker.io`)
still opens it, and cosched cannot amend the engine's built-in profile, only replace it.
So `[docker] seccomp_profile` names a whole profile in Docker's format: by default (`auto`)
Debian's container profile, `/usr/share/containers/seccomp.json` from
`golang-github-containers-common` (which deploy/docker-setup.sh installs). That one is
Podman's, which leaves user namespaces, mounts and keyrings to the runtime: under it as is, a
job ran `unshare -Ur` and mounted a tmpfs as root of its own namespace, which Docker's profile
refuses. So whatever the file says, the calls in `FLOOR` are refused (jobs hold no capability,
and only a namespace of their own would give them one), `clone` may not make namespaces, and no
call may ask for the host's huge pages (`HUGE_PAGES`).
Without a profile, the daemon says at its start whether jobs can reach io_uring
(`io_uring_exposure`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from cosched.daemon.host_limits import read_sysctl
from cosched.daemon.sandbox import replaceable_problem
from cosched.errors import ConfigError

IO_URING = ("io_uring_setup", "io_uring_enter", "io_uring_register")

KEY = "config key docker.seccomp_profile"
"""How every refusal of a profile begins: the config key that named it."""
AUTO = "auto"
DEBIAN_PROFILE = "/usr/share/containers/seccomp.json"

CLOSED_BY_ENGINE = 25
"""The first Docker major release whose default profile refuses io_uring (moby #46762)."""

PROFILE_KEYS = ("defaultAction", "defaultErrnoRet", "architectures", "archMap", "syscalls")
RULE_KEYS = ("name", "names", "action", "errnoRet", "args", "comment", "includes", "excludes")
"""Docker's own field names, which a profile must spell exactly (`_refuse_other_spellings`)."""
MAX_PROFILE_BYTES = 1 << 20

NOT_THERE = (*IO_URING, "clone3", "io_setup")
"""Refused with ENOSYS, as on a kernel without them: liburing's users fall back to epoll, glibc's
threads to `clone` (whose flags, unlike `clone3`'s, a filter can read). `io_setup`: the kernel's
AIO contexts are one pool for the whole host (`fs.aio-max-nr`), which one job took whole in 16
calls, after which the host's own databases and every other job got EAGAIN (a helper's audit);
without it libaio's users fall back (POSIX AIO in glibc is threads, not this)."""
NOT_ALLOWED = (
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "mount_setattr",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "syslog",
)  # fmt: skip
"""Refused with EPERM, as Docker's own profile refuses them to a process without capabilities:
namespaces and mounts, the kernel's keyrings (not namespaced), BPF, perf events, userfaultfd, the
host's kernel log (read by anyone where `kernel.dmesg_restrict` is 0)."""
CLONE_NAMESPACES = 0x7E020000
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: `clone` with none of these is a
thread or a fork; with one, a namespace. Its first argument on x86-64 and arm64 (s390x, which
swaps them, is not supported)."""
HUGE_PAGES = {"mmap": (3, 0x40000), "mmap2": (3, 0x40000), "memfd_create": (1, 0x4), "shmget": (2, 0x800)}
"""Call -> (argument, flag) asking for huge pages: MAP_HUGETLB, MFD_HUGETLB, SHM_HUGETLB. The host's
reserved huge pages are one pool, and on cgroup v1 (and v2 without `memory_hugetlb_accounting`) no
memory cgroup is charged for them, nor does Docker set a hugetlb limit: a job of 24 MiB took all 32
MiB reserved, uncharged, and the next job asking one page failed (a helper's audit). Refused with
ENOMEM, what the kernel answers when none is free, so a program that tries them falls back to
ordinary pages (transparent huge pages, charged, stay open)."""
FLOOR = frozenset({*NOT_THERE, *NOT_ALLOWED, "clone", *HUGE_PAGES})


def _floor_rules() -> list[dict[str, object]]:
    """After the profile's own rules: what `FLOOR` says (an explicit refusal, whatever the default)."""

    def masked(bits: int, equals: int, index: int = 0) -> list[dict[str, object]]:
        return [{"index": index, "value": bits, "valueTwo": equals, "op": "SCMP_CMP_MASKED_EQ"}]

    namespaces = [1 << bit for bit in range(32) if CLONE_NAMESPACES >> bit & 1]
    small_pages: list[dict[str, object]] = [
        {"names": [call], "action": "SCMP_ACT_ALLOW", "args": masked(flag, 0, index)}
        for call, (index, flag) in HUGE_PAGES.items()
    ]
    return [
        {"names": list(NOT_THERE), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        {"names": list(NOT_ALLOWED), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": masked(CLONE_NAMESPACES, 0)},
        *({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM, "args": masked(flag, flag)}
          for flag in namespaces),
        *small_pages,
        *({"names": [call], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOMEM, "args": masked(flag, flag, index)}
          for call, (index, flag) in HUGE_PAGES.items()),
    ]  # fmt: skip


def profile_path(setting: str) -> str:
    """The file `docker.seccomp_profile` names, '' for the engine's own: `auto` is Debian's
    container profile where it is installed (on each Mesos agent, its own)."""
    if setting == AUTO:
        return DEBIAN_PROFILE if os.path.exists(DEBIAN_PROFILE) else ""
    return setting


def load_profile(path: str) -> str:
    """The profile at `path` on cosched's floor, as the JSON the engine takes in
    `security_opt=["seccomp=..."]`; a ConfigError naming the key and the problem otherwise.

    The file decides every job's system calls, so no one but root (or the daemon's user) may be
    able to change it: a profile another user could edit would let them open everything."""
    if not os.path.isabs(path) or os.path.realpath(path) != path:
        raise ConfigError(f"{KEY}: {path!r} is not a link-free absolute path")
    owners = frozenset({0, os.geteuid()})
    try:
        problem = replaceable_problem(str(Path(path).parent), owners)
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{KEY}: cannot read {path!r}: {exc.strerror}") from None
    with os.fdopen(handle, "rb") as file:  # what is checked is what is read
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            problem = f"{path!r} is not a regular file"
        elif info.st_uid not in owners or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            mode = f"{info.st_mode & 0o777:o}"
            problem = f"{path!r} could be changed by a user other than root (owner uid {info.st_uid}, mode {mode})"
        if problem:
            raise ConfigError(f"{KEY}: {problem}")
        try:
            profile = json.loads(file.read(MAX_PROFILE_BYTES))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{KEY}: {path!r} is not a JSON seccomp profile: {exc}") from None
    return json.dumps(with_floor(profile, path))


def with_floor(profile: object, where: str = "the profile") -> dict[str, object]:
    """`profile` with the calls of `FLOOR` taken out of every rule and given cosched's own:
    taken out first, because libseccomp refuses two actions for one call."""
    rules = profile.get("syscalls") if isinstance(profile, dict) else None
    if not (isinstance(profile, dict) and isinstance(profile.get("defaultAction"), str) and isinstance(rules, list)):
        raise ConfigError(f"{KEY}: {where!r} is not a Docker seccomp profile (`defaultAction` and a `syscalls` list)")
    _refuse_other_spellings(profile, PROFILE_KEYS, where)
    kept = []
    for rule in rules:
        names = rule.get("names", []) if isinstance(rule, dict) else None
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise ConfigError(f"{KEY}: {where!r} has a rule that is not an object with a `names` list of calls")
        if not isinstance(rule.get("name", ""), str):
            raise ConfigError(f"{KEY}: {where!r} has a rule whose `name` is not one call")
        _refuse_other_spellings(rule, RULE_KEYS, where)
        if rule.get("name") in FLOOR:  # the older one-call form
            continue
        names = [name for name in rule.get("names", []) if name not in FLOOR]
        if names or "names" not in rule:
            kept.append({**rule, "names": names} if "names" in rule else rule)
    return {**profile, "syscalls": [*kept, *_floor_rules()]}


def _refuse_other_spellings(table: dict[str, object], keys: tuple[str, ...], where: str) -> None:
    """Go's decoder matches field names with case folding (`Names`, and `syscalls` spelt with a long
    s, U+017F, are read as `names` and `syscalls`; the last of two wins): a key the transform would pass over
    while the engine reads it, refused, and so is any key that is not ASCII."""
    folded = {known.casefold(): known for known in keys}
    for name in table:
        known = folded.get(name.casefold())
        if not name.isascii() or (known is not None and name != known):
            raise ConfigError(
                f"{KEY}: {where!r} has the key {name!r}: "
                f"{'spelt otherwise than ' + repr(known) if known else 'not ASCII'}, the engine may read it "
                "as one of its own and the floor could be passed over"
            )


def huge_pages_exposure(vm: Path = Path("/proc/sys/vm")) -> str:
    """'' unless the host keeps huge pages that jobs under the engine's own profile can take (only
    the floor refuses them: `HUGE_PAGES`), else a line saying so and what closes it."""
    counts = [read_sysctl(vm / name) or 0 for name in ("nr_hugepages", "nr_overcommit_hugepages")]
    if not any(counts):
        return ""
    return (
        f"jobs can take the host's huge pages ({counts[0]:,} reserved, vm.nr_hugepages; {counts[1]:,} more on "
        "demand, vm.nr_overcommit_hugepages), which no memory cgroup is charged for on cgroup v1 (or v2 without "
        "memory_hugetlb_accounting): set [docker] seccomp_profile, whose floor refuses them"
    )


def io_uring_exposure(engine_version: str, sysctls: Path = Path("/proc/sys/kernel")) -> str:
    """'' if jobs under the engine's own profile cannot reach io_uring, else a line saying why they
    can and what closes it. The kernel closes it to processes without CAP_SYS_ADMIN (jobs have
    none) when `kernel.io_uring_disabled` is 2, or 1 with no `kernel.io_uring_group` (Linux 6.6
    and later; a job in that group could)."""
    try:
        disabled = (sysctls / "io_uring_disabled").read_text().strip()
        group = (sysctls / "io_uring_group").read_text().strip() if disabled == "1" else "-1"
        if disabled == "2" or (disabled == "1" and group == "-1"):
            return ""
    except OSError:
        pass  # an older kernel: only the profile can close it
    major = engine_version.split(".", 1)[0]
    if major.isdigit() and int(major) >= CLOSED_BY_ENGINE:
        return ""
    return (
        f"jobs can use io_uring (Docker {engine_version or '?'}'s default seccomp profile allows it): set "
        "[docker] seccomp_profile (e.g. /usr/share/containers/seccomp.json) or sysctl kernel.io_uring_disabled=1"
    )

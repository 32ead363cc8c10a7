"""Whom a job runs as: the daemon's `docker.job_user`, or its submitter's own account.

Why the submitter's account (`docker.run_as = "submitter"`): with per-user tokens a
job is a user's work, and data dirs are users' files. Run as one shared uid, any
user's job could read and write every other user's data dirs under the data roots,
since the daemon (root) mounts whatever a submission names. Run as its submitter,
the kernel's own permission checks keep each user's files theirs, as under Slurm,
and what a job writes belongs to whoever submitted it. The account comes from this
host's user database (NSS: /etc/passwd, LDAP), as slurmd looks it up; on Mesos the
agents must share those uids. A job with no user (shared token, no token) runs as
`docker.job_user`. Never as root: uid 0, gid 0 and group 0 are refused.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cosched.errors import CoschedError

RUN_AS = ("job_user", "submitter")


class NoAccount(CoschedError):
    """A user who cannot run jobs on this host: no account, or root's uid or groups."""


@dataclass(frozen=True)
class Account:
    """The ids a job's processes get: `uid:gid`, and the user's other groups."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    def as_spec(self) -> dict[str, Any]:
        """How it rides in a launched job's spec (to a Mesos agent's executor, too)."""
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups)}


def job_user_account(job_user: str) -> Account:
    """`docker.job_user` ('uid:gid', checked with the config) as the account jobs run as."""
    uid, _, gid = job_user.partition(":")
    return Account(int(uid), int(gid))


def account_of(user: str) -> Account:
    """`user`'s account in this host's user database; NoAccount naming why it cannot run jobs."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise NoAccount(f"{user} has no account on this host (jobs run as their submitter)") from None
    groups = tuple(sorted(set(os.getgrouplist(user, entry.pw_gid)) - {entry.pw_gid}))
    if entry.pw_uid == 0 or entry.pw_gid == 0 or 0 in groups:
        raise NoAccount(f"{user}: jobs never run as root (uid 0, gid 0 or group 0); submit as another user")
    return Account(entry.pw_uid, entry.pw_gid, groups)


def account_in(spec: Mapping[str, Any]) -> Account | None:
    """The account a launched job's spec carries, checked again where it is used (an agent's
    executor trusts no one to have refused root); None if it carries none."""
    given = spec.get("run_as")
    if given is None:
        return None
    try:
        account = Account(int(given["uid"]), int(given["gid"]), tuple(int(g) for g in given.get("groups", ())))
    except (TypeError, KeyError, ValueError):
        raise NoAccount(f"run_as: expected uid, gid and groups, got {given!r}") from None
    if min((account.uid, account.gid, *account.groups)) <= 0:
        raise NoAccount(f"run_as: jobs never run as root or a negative id, got {given!r}")
    return account

"""Who is calling the API: users with signed tokens, as Slurm's `auth/jwt` names them.

Why signed tokens rather than a table of users: the daemon keeps one secret key
(`api.key_file`, readable by root alone) and a token is a JWT (HS256) naming its
user in Slurm's `sun` claim, with an expiry. The operator mints one per user
(`cosched token USER`, which needs to read the key); the daemon checks the
signature and the expiry and stores nothing per user, so adding a user touches
no configuration and no restart. What a user may do depends on who they are: any
user submits and reads, but cancels only their own jobs; an operator (a name in
`api.operators`, or the holder of the shared `api.token`) cancels any.

A token cannot be taken back, so a leaked one would be good until it expires. The operator
revokes a user's tokens (`cosched token USER --revoke`): the time goes into a list beside the
key (`<key_file>.revoked`, one `USER EPOCH` line each), and a token of that user issued before
it is refused, the daemon re-reading the list whenever it changes; the user's next token works.
As Keycloak's not-before policy, this needs no record of the tokens handed out.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import NamedTuple

import jwt

from cosched.errors import ConfigError, CoschedError

ALGORITHM = "HS256"
KEY_BYTES = 32  # HS256's own size: a shorter key weakens the signature (RFC 7518 3.2)
USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
"""POSIX-portable user names, as `useradd` takes them: no spaces, no markup, no path."""


class Caller(NamedTuple):
    """Who sent a request: `user` owns what they submit ('' for no one), `operator` may cancel any job."""

    user: str
    operator: bool


ANONYMOUS = Caller("", operator=True)
"""Where no token is configured, whoever reaches the API may do anything, as before users existed."""


class BadToken(CoschedError):
    """A bearer credential that names no one: forged, for another key, expired or malformed."""


def check_user_name(name: str) -> str:
    if not USER_NAME.fullmatch(name):
        raise ConfigError(f"user name {name!r}: expected a POSIX user name (a-z, 0-9, '_', '.', '-'; up to 32)")
    return name


def load_key(path: Path) -> bytes:
    """The signing key, refused if anyone but its owner could read it (a leaked key mints any user)."""
    hint = " (make it with `cosched token USER --key-file FILE`)"
    key = read_secret_file(path, "api.key_file", missing_hint=hint)
    if len(key) < KEY_BYTES:
        raise ConfigError(f"config key api.key_file: {path} holds {len(key)} bytes, at least {KEY_BYTES} are needed")
    return key


def read_secret_file(path: Path, key: str, missing_hint: str = "") -> bytes:
    """A secret file's first 4 KiB, read through no link and refused as `refuse_shared` says."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        hint = missing_hint if isinstance(exc, FileNotFoundError) else ""
        raise ConfigError(f"config key {key}: cannot open {path}: {exc.strerror}{hint}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen, which refuses a directory naming only the descriptor
        os.close(fd)
        raise ConfigError(f"config key {key}: {path} is not a regular file")
    with os.fdopen(fd, "rb") as file:
        refuse_shared(info, path, key)
        return file.read(4096)


def refuse_shared(info: os.stat_result, path: Path, key: str) -> None:
    """A secret file (a signing key, a TLS private key, the Mesos framework's secret) anyone but
    the daemon's user may read or write, or that another user owns (and so may read, or chmod), is
    refused: whoever reads it can pass for the daemon or mint any user."""
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"config key {key}: {path} is owned by uid {info.st_uid}, who can read it; "
            f"chown {os.geteuid()} it, chmod 600 it"
        )
    if info.st_mode & 0o077:
        raise ConfigError(
            f"config key {key}: {path} is readable or writable by others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
        )


def create_key(path: Path) -> bool:
    """Make a fresh random key at `path` (mode 0600) unless one is there; whether one was made."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        raise ConfigError(f"key file {path}: cannot create it: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as file:
        file.write(secrets.token_bytes(KEY_BYTES))
    return True


def mint(key: bytes, user: str, lifetime: float, now: float | None = None) -> str:
    """A token for `user` that the daemon holding `key` accepts for `lifetime` seconds.

    Its issue time keeps microseconds (JWT allows a non-integer NumericDate), so that a token
    minted in the same second as a revocation, but after it, is not taken for an older one."""
    issued = round(time.time() if now is None else now, 6)
    claims = {"sun": check_user_name(user), "iat": issued, "exp": int(issued + lifetime)}
    return jwt.encode(claims, key, algorithm=ALGORITHM)


def revocations_path(key_file: Path) -> Path:
    """Where the revocations of the tokens signed with `key_file` are listed."""
    return key_file.with_name(key_file.name + ".revoked")


def revoke(key_file: Path, user: str, now: float | None = None) -> float:
    """Refuse every token of `user` issued before now; the time written."""
    at = round(time.time() if now is None else now, 6)
    path = revocations_path(key_file)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ConfigError(f"revocation list {path}: cannot write it: {exc.strerror}") from None
    with os.fdopen(fd, "a") as file:
        file.write(f"{check_user_name(user)} {at:.6f}\n")
    return at


class Revocations:
    """The list `revoke` writes, read again whenever the file changes (a `stat` per request).

    Fail closed: a list that cannot be read or parsed refuses every user token (the shared
    operator token still works) until it is mended, rather than letting revoked tokens back in."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._before: dict[str, float] = {}
        self._problem = ""
        self._read()

    def issued_before(self, user: str) -> float:
        """The time before which `user`'s tokens are refused (-inf: none)."""
        self._read()
        if self._problem:
            raise BadToken(f"the daemon's token revocation list is unusable ({self._problem}): tell the operator")
        return self._before.get(user, -math.inf)

    def _read(self) -> None:
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            self._seen, self._before, self._problem = None, {}, ""
            return
        except OSError as exc:
            self._seen, self._problem = None, f"{self.path}: {exc.strerror}"
            return
        seen = (info.st_ino, info.st_size, info.st_mtime_ns)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            before, problem = _parse_revocations(self.path.read_text(encoding="utf-8")), ""
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            before, problem = {}, f"{self.path}: {exc}"
        self._before, self._problem = before, problem


def _parse_revocations(text: str) -> dict[str, float]:
    before: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        user, _, at = line.partition(" ")
        if not USER_NAME.fullmatch(user):
            raise ValueError(f"line {number}: {user!r} is not a user name")
        when = float(at)  # ValueError names the text
        if not math.isfinite(when):
            raise ValueError(f"line {number}: {at!r} is not a time")
        before[user] = max(before.get(user, -math.inf), when)
    return before


def user_of(key: bytes, token: str, revocations: Revocations | None = None) -> str:
    """The user a token names; BadToken if this key did not sign it, it expired, or its user's
    tokens were revoked after it was issued."""
    try:
        claims = jwt.decode(token, key, algorithms=[ALGORITHM], options={"require": ["exp", "sun"]})
    except jwt.ExpiredSignatureError:
        raise BadToken("bearer token expired: ask the operator for a new one (cosched token USER)") from None
    except jwt.PyJWTError:
        raise BadToken("missing or wrong bearer token") from None
    user = claims["sun"]
    if not isinstance(user, str) or not USER_NAME.fullmatch(user):
        raise BadToken("missing or wrong bearer token")
    if revocations is not None:
        issued = claims.get("iat")
        if not isinstance(issued, int | float) or issued < revocations.issued_before(user):
            raise BadToken(f"bearer token revoked: {user}'s tokens were revoked after it was issued; ask for a new one")
    return user

"""Who is calling the API: users with signed tokens, as Slurm's `auth/jwt` names them.

Why signed tokens rather than a table of users: the daemon keeps one secret key
(`api.key_file`, readable by root alone) and a token is a JWT (HS256) naming its
user in Slurm's `sun` claim, with an expiry. The operator mints one per user
(`cosched token USER`, which needs to read the key); the daemon checks the
signature and the expiry and stores nothing per user, so adding a user touches
no configuration and no restart. What a user may do depends on who they are: any
user submits and reads, but cancels only their own jobs; an operator (a name in
`api.operators`, or the holder of the shared `api.token`) cancels any.
"""

from __future__ import annotations

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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        hint = " (make it with `cosched token USER --key-file FILE`)" if isinstance(exc, FileNotFoundError) else ""
        raise ConfigError(f"config key api.key_file: cannot open {path}: {exc.strerror}{hint}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"config key api.key_file: {path} is not a regular file")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"config key api.key_file: {path} is readable or writable by others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
            )
        key = file.read(4096)
    if len(key) < KEY_BYTES:
        raise ConfigError(f"config key api.key_file: {path} holds {len(key)} bytes, at least {KEY_BYTES} are needed")
    return key


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
    """A token for `user` that the daemon holding `key` accepts for `lifetime` seconds."""
    issued = int(time.time() if now is None else now)
    claims = {"sun": check_user_name(user), "iat": issued, "exp": issued + int(lifetime)}
    return jwt.encode(claims, key, algorithm=ALGORITHM)


def user_of(key: bytes, token: str) -> str:
    """The user a token names; BadToken if this key did not sign it or it expired."""
    try:
        claims = jwt.decode(token, key, algorithms=[ALGORITHM], options={"require": ["exp", "sun"]})
    except jwt.ExpiredSignatureError:
        raise BadToken("bearer token expired: ask the operator for a new one (cosched token USER)") from None
    except jwt.PyJWTError:
        raise BadToken("missing or wrong bearer token") from None
    user = claims["sun"]
    if not isinstance(user, str) or not USER_NAME.fullmatch(user):
        raise BadToken("missing or wrong bearer token")
    return user

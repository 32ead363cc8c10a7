"""Which image names a job may give: Docker's reference grammar, nothing more.

Why: the docker SDK puts an image's name into the engine API's URL path as written (`/images/NAME/json`),
and the engine cleans the path before routing it. A name with `..` segments
(`a/../../distribution/HOST:PORT/x`) reached other endpoints: the root engine contacted a host the
submitter chose, answered for images it did not have, and held the API's and the scheduler's threads
while that host was slow (a helper's audit). A reference as the engine's own grammar defines it
(distribution's `reference` package: lowercase path components joined by `.`, `_`, `__` or dashes,
an optional registry host and port, tag and digest; a content id is one too) has no such segment.
"""

from __future__ import annotations

import re

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"{_NAME}(?::{_TAG})?(?:@{_DIGEST})?")
"""`name[:tag][@digest]`, a content id (`sha256:HEX`, or its hex alone) included."""


def problem(name: str) -> str:
    """Why `name` is no image reference, '' if it is one."""
    if REFERENCE.fullmatch(name):
        return ""
    return (
        "is not a Docker image reference: [host[:port]/]path[:tag][@digest], its path lowercase "
        "components joined by '/' (none '.' or '..')"
    )

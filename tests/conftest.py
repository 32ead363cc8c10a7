"""Shared test settings: CI replays hypothesis examples deterministically, and fails where a laptop skips."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def missing(reason: str) -> NoReturn:
    """Skip a test that needs something absent; under CI (CI=true) fail instead.

    CI provides the real traces and scikit-learn, so a skip there would hide a
    broken setup behind a green run, as `require_engine` does for Docker.
    """
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason, allow_module_level=True)


def real_trace(name: str) -> Path:
    """A Parallel Workloads Archive trace from ../shared/traces (never committed), or `missing`."""
    from swf_lines import TRACES

    path = TRACES / name
    if not path.exists():
        missing(f"real trace {path} not available")
    return path


def require_module(name: str) -> ModuleType:
    """An optional dependency (e.g. sklearn), imported, or `missing`."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"{name} is not installed")


@pytest.fixture
def open_data_root() -> Iterator[Path]:
    """A data root every user may pass through (0755, under /tmp), removed after: with
    `run_as = "submitter"` each directory above a data dir must let the submitter pass, and
    pytest's own temporary directories are root's, 0700."""
    root = Path(tempfile.mkdtemp(prefix="cosched-data-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def zk_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Mesos master and two agents with ZooKeeper and the replicated-log registry, so the master
    can be restarted under a framework (tests/mesos_support.py); shared by the tests that do."""
    from mesos_support import start_cluster, stop_cluster

    started = start_cluster(Path(tmp_path_factory.mktemp("mesos-zk")), zookeeper=True, cpus=2, mem=2048)
    try:
        yield started
    finally:
        stop_cluster(started)


@pytest.fixture
def container_events() -> Iterator[Any]:
    """cosched's container events on the Docker engine from the test's start (mesos_support)."""
    from daemon_support import require_engine
    from mesos_support import ContainerEvents

    events = ContainerEvents(require_engine())
    yield events
    events.close()

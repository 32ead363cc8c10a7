"""The code stays `ruff` clean and `mypy` clean: checked here so that CI, which runs the tests, refuses a
change that breaks either (the test extra installs both). Without a tool they skip, except under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    if find_spec(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"under CI {tool} must be installed (pip install -e '.[test]')")
        pytest.skip(f"{tool} is not installed")
    return subprocess.run(
        [sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["lint", "format"])
def test_ruff_finds_nothing(args: tuple[str, ...]) -> None:
    done = _run("ruff", *args)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_package() -> None:
    done = _run("mypy", "cosched")
    assert done.returncode == 0, done.stdout + done.stderr

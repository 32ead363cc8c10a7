"""Run one workflow stage program as the daemon would, on this host or in the workflow image.

The stage programs need Debian's Montage and BLAST+ binaries, which CI hosts do
not have but the workflow image does. Where the host has what an application
needs, a stage runs here (quick to debug); otherwise it runs in a throwaway
container of the image with the work directory mounted at the same path, so the
stage-level tests (verifiers catching tampering, missing inputs named) run in CI
too instead of skipping. Without binaries or an engine they skip, except under
CI, where `workflow_image` fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.daemon_support import workflow_image

ROOT = Path(__file__).resolve().parents[1]
BINARIES = {"montage": ("mImgtbl", "mProjectPP", "mAdd"), "blast": ("makeblastdb", "blastn")}
"""What each application needs beyond Python and NumPy."""


def on_host(app: str) -> bool:
    return all(shutil.which(binary) for binary in BINARIES.get(app, ()))


def run_stage(
    app: str, stage: str, work_dir: Path, progress: Path, *extra: str, cores: int = 2
) -> subprocess.CompletedProcess[str]:
    """`python3 -m workloads.stages APP STAGE --dir WORK_DIR EXTRA...` with the runner's environment."""
    env = {"COSCHED_PROGRESS": str(progress), "COSCHED_CORES": str(cores)}
    arguments = ["-m", "workloads.stages", app, stage, "--dir", str(work_dir), *extra]
    if on_host(app):
        command = [sys.executable, *arguments]
        return subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    shared = os.path.commonpath([work_dir.parent, progress.parent])
    command = ["docker", "run", "--rm", "--network", "none", "-v", f"{shared}:{shared}"]
    command += [f"--env={key}={value}" for key, value in env.items()]
    command += [workflow_image(), "python3", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)

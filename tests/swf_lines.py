"""Hand-written SWF lines and trace files for tests, and where the real traces live."""

from __future__ import annotations

from pathlib import Path

from cosched.traces.trace import SWF_FIELDS

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
"""Real Parallel Workloads Archive traces, beside the checkout (absent: tests skip)."""


def job_line(job_id: int, **fields: float | str) -> str:
    """One SWF job line: a finished 4-processor job submitted at 10 * job_id, overridable by field."""
    values: dict[str, float | str] = {name: -1 for name in SWF_FIELDS}
    values.update(job_id=job_id, submit=10 * job_id, wait=0, runtime=50)
    values.update(alloc_procs=4, req_procs=4, req_time=100, status=1)
    values.update(fields)
    return " ".join(str(values[name]) for name in SWF_FIELDS)


def write_text(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path

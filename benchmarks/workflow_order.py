"""How long a workflow's check takes at its largest (1,024 stages), against scanning each round.

A workflow's stages are checked and ordered (`Workflow._toposort`) when it is submitted, on the
API's event loop, and again at each of its stages' ends, in the scheduling pass, where the
stored spec is read back (`workflow_stages.release`). Ordering by rounds that each scan every
stage left is quadratic in a chain; the order is now found in time linear in the stages and
their dependencies. Both are timed side by side here, on the same shapes.

    python benchmarks/workflow_order.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from cosched.daemon.specs import WorkflowSpec
from workloads.workflows import Stage

STAGES = 1024


def scanned_rounds(stages: tuple[Stage, ...]) -> list[Stage]:
    """The order as it was found before: each round scans every stage left for those now ready."""
    remaining = {s.name: set(s.depends) for s in stages}
    order: list[Stage] = []
    while remaining:
        batch = [s for s in stages if s.name in remaining and not remaining[s.name]]
        for stage in batch:
            del remaining[stage.name]
            order.append(stage)
        for deps in remaining.values():
            deps.difference_update(s.name for s in batch)
    return order


def shapes() -> dict[str, list[dict[str, Any]]]:
    """A chain (each stage after the one before), a fan (all after the first) and a ladder of 32 wide."""
    names = [f"s{i}" for i in range(STAGES)]
    return {
        "chain": [{"name": n, "depends": [names[i - 1]] if i else []} for i, n in enumerate(names)],
        "fan": [{"name": n, "depends": [names[0]] if i else []} for i, n in enumerate(names)],
        "ladder of 32": [{"name": n, "depends": [names[i - 32]] if i >= 32 else []} for i, n in enumerate(names)],
    }


def best_ms(work: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return 1000 * min(times)


def main() -> None:
    print(f"{'shape':<14}{'stages':>8}{'check (ms)':>12}{'order (ms)':>12}{'scanned rounds (ms)':>21}{'ratio':>8}")
    for shape, stages in shapes().items():
        document = {"name": "w", "image": "x", "command": ["true"], "cores": 1, "memory_mib": 64, "walltime": 60}
        document["stages"] = stages
        dag = WorkflowSpec.model_validate(document).dag()
        order = dag.topological_order()
        assert [s.name for s in scanned_rounds(dag.stages)] == [s.name for s in order]
        check = best_ms(partial(WorkflowSpec.model_validate, document))
        ordered = best_ms(dag._toposort)
        scanned = best_ms(partial(scanned_rounds, dag.stages))
        print(f"{shape:<14}{len(order):>8}{check:>12.1f}{ordered:>12.2f}{scanned:>21.1f}{scanned / ordered:>8.0f}")


if __name__ == "__main__":
    main()

"""The NSA paper's Table III in replay: SA against NSA on the windows a joint placement meets.

Section VI-C compares, on the same instances, the sequential initial solution ("Seq."),
SA with 500 and 1,000 iterations and NSA with 500, by mean CH cost and solving time, and
NSA-500's improvement on SA-1000 ("Impr."). Here the instances are windows recorded by
`cosched.experiments.topology.record_windows` from a replay of the paper's workload with
an evaluation seed the model never trained on (`EVAL_SEED`; `table` refuses the model's own
training seed), and "Seq." is the placement that replay gave: each job alone at its
cheapest contiguous run (`contiguous`), in start order. Every search starts from it, with
the window's index as its seed. The paper's epochs of 100 instances become groups of
`per_epoch` windows.

    from cosched.experiments.nsa_search import table, format_table
    print(format_table(table()))

`extra` adds diagnostic columns: `greedy-500` is SA whose repair puts each job at its
cheapest start (`run_costs`' least), `sa-q-500` SA whose random starts are limited to the first
q positions of Q, as NSA's are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cosched.core.topology import FatTree, run_costs
from cosched.errors import ConfigError
from cosched.experiments.topology import HOP_COST, PERIOD, Window, record_windows
from cosched.learn.models import load_model
from cosched.learn.nsa import Q
from cosched.policies.nsa import DEFAULT_MODEL, NeuralAnnealing
from cosched.policies.topology import Annealing

EVAL_SEED = 7
JOBS = 1200
WINDOWS = 200
PER_EPOCH = 20
METHODS = ("SA-500", "SA-1000", "NSA-500")


class _Greedy(Annealing):
    """SA whose repair is the greedy one: each job at its cheapest contiguous run."""

    def choose_start(self, tree: FatTree, queue: Sequence[int], n: int, later: Sequence[int]) -> int:
        costs = run_costs(tree, queue, n)
        return min(range(len(costs)), key=costs.__getitem__)


class _FirstQ(Annealing):
    """SA whose random starts are limited to NSA's action space, the first q positions."""

    def choose_start(self, tree: FatTree, queue: Sequence[int], n: int, later: Sequence[int]) -> int:
        return self.rng.randrange(min(len(queue), Q))


@dataclass(frozen=True, slots=True)
class Row:
    """One window: its jobs, and each method's cost and solving time (s)."""

    window: int
    jobs: int
    free: int
    initial: float
    cost: dict[str, float]
    time: dict[str, float]


def _searches(model: str) -> dict[str, Callable[[int], Annealing]]:
    network = load_model("nsa", model)
    return {
        "SA-500": lambda seed: Annealing(iterations=500, seed=seed, hop_cost=HOP_COST),
        "SA-1000": lambda seed: Annealing(iterations=1000, seed=seed, hop_cost=HOP_COST),
        "NSA-500": lambda seed: NeuralAnnealing(network=network, iterations=500, seed=seed, hop_cost=HOP_COST),
        "NSA-1000": lambda seed: NeuralAnnealing(network=network, iterations=1000, seed=seed, hop_cost=HOP_COST),
        "greedy-500": lambda seed: _Greedy(iterations=500, seed=seed, hop_cost=HOP_COST),
        "sa-q-500": lambda seed: _FirstQ(iterations=500, seed=seed, hop_cost=HOP_COST),
    }


def evenly(windows: Sequence[Window], count: int) -> list[Window]:
    """`count` windows spread evenly over a replay (all of them if there are fewer)."""
    if count >= len(windows):
        return list(windows)
    return [windows[int(i)] for i in np.linspace(0, len(windows) - 1, count)]


def table(
    *,
    jobs: int = JOBS,
    windows: int = WINDOWS,
    seed: int = EVAL_SEED,
    model: str = DEFAULT_MODEL,
    extra: Sequence[str] = (),
    period: float = PERIOD,
) -> list[Row]:
    """Each method's cost and time on `windows` windows of a replay of `jobs` paper jobs."""
    network = load_model("nsa", model)
    trained = network.config.get("seed")
    if trained is not None and int(trained) == seed and network.config.get("jobs") is not None:
        raise ConfigError(f"seed {seed} recorded the windows {model} trained on: evaluate on another")
    searches = _searches(model)
    names = [*METHODS, *extra]
    unknown = [name for name in names if name not in searches]
    if unknown:
        raise ConfigError(f"unknown methods {unknown}; known: {', '.join(searches)}")
    tree, recorded = record_windows(jobs, seed, period=period)
    rows = []
    for index, window in enumerate(evenly(recorded, windows)):
        initial = [list(nodes) for nodes in window.initial]
        start = sum(tree.cost(nodes, HOP_COST) for nodes in initial)
        cost, took = {}, {}
        for name in names:
            search = searches[name](index)
            began = time.perf_counter()
            best = search.search(tree, window.free, window.sizes, initial)
            took[name] = time.perf_counter() - began
            cost[name] = start if best is None else sum(tree.cost(nodes, HOP_COST) for nodes in best)
        rows.append(Row(index, len(window.sizes), len(window.free), start, cost, took))
    return rows


def format_table(rows: Sequence[Row], per_epoch: int = PER_EPOCH) -> str:
    """Table III's layout: per group of windows the mean cost of Seq. and of each method, the
    searches' mean time, and NSA-500's improvement on SA-1000; then their averages."""
    if not rows:
        return "no windows"
    names = list(rows[0].cost)
    header = ["Epoch", "Seq."] + [f"{name} {col}" for name in names for col in ("Cost", "Time/s")] + ["Impr."]
    lines = []

    def line(label: str, group: Sequence[Row]) -> list[str]:
        cells = [label, f"{np.mean([r.initial for r in group]):.0f}"]
        for name in names:
            cells += [f"{np.mean([r.cost[name] for r in group]):.0f}", f"{np.mean([r.time[name] for r in group]):.3f}"]
        sa, nsa = np.mean([r.cost["SA-1000"] for r in group]), np.mean([r.cost["NSA-500"] for r in group])
        cells.append(f"{100 * (sa - nsa) / sa:.2f}%" if sa else "-")
        return cells

    groups = [rows[i : i + per_epoch] for i in range(0, len(rows), per_epoch)]
    lines = [line(str(k + 1), group) for k, group in enumerate(groups)]
    lines.append(line("Avg.", rows))
    widths = [max(len(row[c]) for row in [header, *lines]) for c in range(len(header))]
    text = [" ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *lines]]
    wins = sum(r.cost["NSA-500"] < r.cost["SA-1000"] - 1e-6 for r in rows)
    losses = sum(r.cost["NSA-500"] > r.cost["SA-1000"] + 1e-6 for r in rows)
    text.append(f"{len(rows)} windows; NSA-500 below SA-1000 in {wins}, above in {losses}, equal in the rest")
    return "\n".join(text)


if __name__ == "__main__":  # pragma: no cover
    import sys

    chosen = [arg for arg in sys.argv[1:] if not arg.startswith("model=")]
    given = [arg[6:] for arg in sys.argv[1:] if arg.startswith("model=")]
    print(format_table(table(model=given[0] if given else DEFAULT_MODEL, extra=chosen)))

"""What the learned policies' action spaces give: fixed rules beside the heuristics and trained models.

RLBackfilling's agent, while the head is blocked and two or more queued jobs fit, must start one
of them (the papers' action space: there is no "wait"); it chooses only which. A fixed rule in
that action space (`rlbf` with a scoring `decide`) shows what the agent can reach by ordering
alone, and many windows show how much a mean over 10 of them can move by chance:

* ``mean bsld``: over every window (``--seeds`` x ``--samples`` windows of ``--length`` jobs,
  drawn as `cosched replay --samples --seed` draws them, each on an empty cluster).
* ``gain``: the mean, over windows, of (EASY - policy) / EASY, the paper's training reward.
* ``vs EASY``: the mean paired difference in bsld against FCFS+EASY, +- its standard error.
* ``top window``: the share of the policy's summed bsld that its worst window carries.

Rules (`cosched.learn.rules`): ``first`` (submission order), ``shortest`` (requested time),
``fewest`` (cores), ``area`` (cores x requested time), ``f1`` (F1's log10(requested time) x cores;
its submit-time term is near constant within a window). With ``--dirlab-windows``, the windows are those
DIR-LAB's test script draws (``np.random.seed(SEED)``, then ``randint(L, n - L - 1)`` per window).

With ``--dbf HEAD TAIL`` the same for DBF: the rules pick among the jobs of its (split) window
that fit and forward only when none does, beside FCFS, SJF and F1 with EASY and ``dbf`` models.
A ``-reserving`` rule also forwards to hold cores, as EASY does, from what the observation shows
(`dbf_observation(expected_start=True)`): the first job of the window in the rule's order gets a
reservation at the time it would fit; another job starts only if it ends by then.

Running
-------
    python benchmarks/learned_ceiling.py ../shared/traces/HPC2N-2002-2.2-cln.swf.gz --models hpc2n
    python benchmarks/learned_ceiling.py ../shared/traces/lublin_256.swf --seeds 1 --models lublin-1 out/m.npz
    python benchmarks/learned_ceiling.py ../shared/traces/lublin_256.swf --dbf 15 5 --models lublin-1-m20-split
"""

from __future__ import annotations

import argparse

import numpy as np

from cosched.learn.envs import time_scale_of
from cosched.learn.rules import rule
from cosched.policies.learned import DBF, RLBackfill
from cosched.replay.driver import PolicySet
from cosched.replay.study import cluster_for, cut, load_workload, run_study
from cosched.reporting.report import format_table
from cosched.traces.trace import Trace

RULES = {"rlbf": ("first", "shortest", "fewest", "area"), "dbf": ("first", "shortest", "f1")}
RESERVING = ("first-reserving", "shortest-reserving", "f1-reserving")
"""DBF rules that hold cores for a blocked job (`cosched.learn.rules`)."""


def windows(trace: Trace, seeds: list[int], samples: int, length: int, dirlab: bool) -> list[Trace]:
    if not dirlab:
        return [w for seed in seeds for w in cut(trace, length=length, samples=samples, seed=seed)]
    found = []
    for seed in seeds:
        draw = np.random.RandomState(seed)
        found += [trace.slice(draw.randint(length, len(trace) - length - 1), length) for _ in range(samples)]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--cleaning", default="standard", choices=("standard", "dirlab"))
    parser.add_argument("--models", nargs="*", default=[], help="rlbf models: shipped names or .npz files")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 4, 5])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--dirlab-windows", action="store_true")
    parser.add_argument("--dbf", type=int, nargs=2, metavar=("HEAD", "TAIL"), help="DBF's action space instead")
    args = parser.parse_args()

    trace = load_workload(args.trace, cleaning=args.cleaning)
    cluster = cluster_for(trace)
    sequences = windows(trace, args.seeds, args.samples, args.length, args.dirlab_windows)
    scale, capacity = time_scale_of(trace), cluster.capacity_units
    if args.dbf is None:
        sets = [("FCFS+EASY", PolicySet("fcfs", "easy")), ("FCFS+EASY-AR", PolicySet("fcfs", "easy", "actual"))]
        for name in RULES["rlbf"]:
            backfill = RLBackfill(decide=rule(name, "rlbf", time_scale=scale, capacity=capacity), time_scale=scale)
            sets.append((f"rule: {name}", PolicySet("fcfs", backfill)))
        sets += [(f"rlbf:{model}", PolicySet("fcfs", f"rlbf:{model}")) for model in args.models]
    else:
        head, tail = args.dbf
        sets = [(f"{q.upper()}+EASY", PolicySet(q, "easy")) for q in ("fcfs", "sjf", "smallest", "f1")]
        for name in RULES["dbf"] + RESERVING:
            decide = rule(name, "dbf", time_scale=scale, capacity=capacity, expected_start=True)
            queue = DBF(decide=decide, head=head, tail=tail, time_scale=scale, expected_start=True)
            sets.append((f"rule: {name}, window {head} + {tail}", PolicySet(queue, "none")))
        sets += [(f"dbf:{model}", PolicySet(f"dbf:{model}", "none")) for model in args.models]

    rows, easy = [], None
    for label, policies in sets:
        bsld = np.array([s.mean_bsld for s in run_study(sequences, cluster, [policies])[0].summaries])
        easy = bsld if easy is None else easy
        difference = bsld - easy
        error = difference.std(ddof=1) / np.sqrt(len(bsld)) if len(bsld) > 1 else 0.0
        rows.append(
            {
                "policy": label,
                "mean bsld": f"{bsld.mean():.2f}",
                "gain": f"{np.mean((easy - bsld) / easy):+.3f}",
                "vs EASY": f"{difference.mean():+.2f} +- {error:.2f}",
                "top window": f"{bsld.max() / bsld.sum():.2f}",
            }
        )
    where = "DIR-LAB's test windows" if args.dirlab_windows else "windows"
    print(f"{trace.name} ({args.cleaning}): {len(sequences)} {where} of {args.length} jobs, seeds {args.seeds}")
    print(format_table(rows))


if __name__ == "__main__":
    main()

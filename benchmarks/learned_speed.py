"""How fast the learned policies' environments step and their plugins replay, beside the classic policies.

What is measured, in one process, one after the other, on the same trace:

* ``env steps/s``: decisions per second of `BackfillEnv` (RLBackfilling) and `JobSelectionEnv`
  (DBF) driven by a random agent over allowed actions, resets included (an RLBackfilling reset
  also replays the window under the base policy + EASY for the reward's baseline). This is
  the environment alone: PPO's own cost per step comes on top when training.
* ``jobs/s``: jobs per second of `cosched replay`-style samples (``--samples --length``) under
  FCFS + EASY, FCFS + RLBF and DBF with the shipped models (NumPy inference), the same windows
  for every policy set: what the learned plugins cost against the classic policies' replay.

Running
-------
    python benchmarks/learned_speed.py                                   # Lublin-1, 10 x 1024 jobs
    python benchmarks/learned_speed.py --trace ../shared/traces/SDSC-SP2-1998-4.2-cln.swf.gz --steps 5000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from cosched.learn.envs import BackfillEnv, JobSelectionEnv
from cosched.learn.models import load_model
from cosched.replay.driver import PolicySet
from cosched.replay.study import cluster_for, cut, load_workload, run_study
from cosched.reporting.report import format_table

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "lublin_256.swf"


def env_speed(env, steps: int, seed: int) -> tuple[float, int]:
    """(decisions per second, episodes) of a random agent over allowed actions."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    episodes = 0
    started = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        if terminated or truncated:
            episodes += 1
            env.reset()
    return steps / (time.perf_counter() - started), episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--steps", type=int, default=3000, help="environment steps timed per environment")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    trace = load_workload(args.trace)
    cluster = cluster_for(trace)
    dbf = load_model("dbf", None)
    rows: list[dict[str, object]] = []
    for name, env in (
        ("BackfillEnv (rlbf), 256-job windows", BackfillEnv(trace, cluster)),
        (
            f"JobSelectionEnv (dbf {dbf.config['head']}+{dbf.config['tail']}), 256 starts",
            JobSelectionEnv(
                trace,
                cluster,
                head=int(dbf.config["head"]),
                tail=int(dbf.config["tail"]),
                log_time=bool(dbf.config.get("log_time", False)),
                expected_start=bool(dbf.config.get("expected_start", False)),
            ),
        ),
    ):
        rate, episodes = env_speed(env, args.steps, args.seed)
        rows.append({"what": name, "env steps/s": round(rate), "episodes": episodes, "jobs/s": "-"})

    sequences = cut(trace, samples=args.samples, length=args.length, seed=args.seed)
    sets = [PolicySet("fcfs", "easy"), PolicySet("sjf", "easy"), PolicySet("fcfs", "rlbf"), PolicySet("dbf", "none")]
    for result in run_study(sequences, cluster, sets):
        rate = round(result.jobs / result.seconds)
        rows.append({"what": f"replay {result.label}", "env steps/s": "-", "episodes": "-", "jobs/s": rate})
    print(f"{trace.name}: {len(trace)} jobs; replays: {args.samples} samples of {args.length} jobs, seed {args.seed}")
    print(format_table(rows))


if __name__ == "__main__":
    main()

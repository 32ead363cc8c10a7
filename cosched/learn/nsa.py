"""NSA's learned repair (the NSA paper, Section V-B): what the network sees, and its environment.

The repair operator of the paper's simulated annealing re-inserts the jobs a move removed,
largest first, each at a start position of the free-node sequence Q (DCAS: a job's nodes
leave Q before the next one is placed, `cosched.core.topology.contiguous`). NSA learns
that choice:

- the observation (V-B1) is a q x 4 matrix, one row for each of the first q nodes of Q:
  the node's leaf switch and pod, normalised (`(id + 1) / count`, so that no real node
  reads as the zero rows of padding), then n_j / n_max for the job being placed and the
  mean size of the removed jobs still to place after it / n_max (0 when none); rows past
  |Q| are zeros;
- the action (V-B2) is the start position, 0..q-1; the mask allows the positions < |Q|;
- the reward (V-B3) is 0 until the last re-inserted job, then minus the re-inserted jobs'
  CH cost. Here it is that cost's *improvement* on what the same jobs cost before removal,
  in units of `hop_cost * n_max`: what the jobs cost before removal does not depend on the
  policy, so subtracting it leaves the gradient's direction as the paper's and removes most
  of its variance (a pair of 40-node jobs costs some 10^5, a pair of 3-node ones 10^3);
  the unit puts a step's reward at a few units at most.

`RepairEnv` is the Gymnasium environment PPO trains on, over windows recorded from the
replay core (`cosched.experiments.topology.record_windows`), never a simulator of its own.
Torch is not imported here: the policy plugin (`cosched.policies.nsa`) builds the same
observation for the exported network, run in NumPy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cosched.core.topology import FatTree, contiguous
from cosched.errors import ConfigError

try:  # the environment is for training (the train extra); the plugin needs only the observation
    import gymnasium as gym

    _Env: Any = gym.Env
except ImportError:  # pragma: no cover - CI installs it
    gym = None  # type: ignore[assignment]
    _Env = object

Q = 100
"""Rows of the observation and actions: the first q nodes of the free sequence (Table I)."""
FEATURES = 4
N_MAX = 40
"""The largest job of the paper's workload, which sizes are divided by."""
REMOVE = 2
"""n_D: a move removes 1..n_D jobs (Table I)."""
T_MAX = 2500.0
WARMUP = 20
"""At most this many SA moves (random repair, Metropolis at T_max) lead from a window's
initial placement to the one an episode destroys and repairs (`RepairEnv`)."""


def observation(
    tree: FatTree, queue: Sequence[int], n: int, later: Sequence[int], *, q: int = Q, n_max: int = N_MAX
) -> np.ndarray:
    """The (q, 4) state of V-B1 for placing a job of `n` nodes in the free sequence `queue`
    before jobs of sizes `later`."""
    obs = np.zeros((q, FEATURES), dtype=np.float32)
    nodes = np.asarray(queue[:q], dtype=np.int64)
    if not len(nodes):
        return obs
    switches = -(-tree.nodes // tree.per_switch)
    pods = -(-tree.nodes // tree.per_pod)
    rows = len(nodes)
    obs[:rows, 0] = (nodes // tree.per_switch + 1) / switches
    obs[:rows, 1] = (nodes // tree.per_pod + 1) / pods
    obs[:rows, 2] = n / n_max
    obs[:rows, 3] = (sum(later) / (len(later) * n_max)) if later else 0.0
    return obs


def action_mask(queue: Sequence[int], q: int = Q) -> np.ndarray:
    """V-B2: the start positions that exist, the first min(|Q|, q)."""
    mask = np.zeros(q, dtype=bool)
    mask[: min(len(queue), q)] = True
    return mask


class RepairEnv(_Env):  # type: ignore[misc]
    """One SA move's repair as an episode, on recorded windows.

    `reset` picks a window (seeded) with at least two multi-node jobs, starts from the
    placement the replay gave it and walks up to `warmup` SA moves from there (random
    repair, Metropolis at `t_max`), so the placements destroyed are those a search meets
    in its first iterations, not only the greedy one; then it removes 1..`remove` random
    jobs. Each step re-inserts the next removed job (largest first) at the chosen start (a
    masked one, past |Q|, counted on from Q's head: MaskablePPO never picks one, Gymnasium's
    checker does).
    The last step's reward is the improvement in CH cost (see the module), and its info
    the same for one uniformly random repair of the same removal (SA's), for the curve.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gym.Env types it an instance variable

    def __init__(
        self,
        tree: FatTree,
        windows: Sequence[Any],
        *,
        remove: int = REMOVE,
        q: int = Q,
        n_max: int = N_MAX,
        hop_cost: float = 1000.0,
        warmup: int = WARMUP,
        t_max: float = T_MAX,
    ) -> None:
        if gym is None:
            raise ConfigError("the repair environment needs gymnasium: pip install 'cosched[train]'")
        self.windows = [w for w in windows if len(w.sizes) >= 2]
        if not self.windows:
            raise ConfigError("the repair environment needs windows of two or more multi-node jobs")
        if remove < 1 or q < 1 or n_max < 1 or warmup < 0:
            raise ConfigError(f"need remove, q, n_max >= 1 and warmup >= 0, got {remove}, {q}, {n_max}, {warmup}")
        self.tree, self.remove, self.q, self.n_max = tree, remove, q, n_max
        self.hop_cost, self.warmup, self.t_max = hop_cost, warmup, t_max
        self.scale = hop_cost * n_max
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(q, FEATURES), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(q)
        self._queue: list[int] = []
        self._sizes: list[int] = []
        self._placed: list[list[int]] = []
        self._before = 0.0
        self._free: list[int] = []
        self._held: set[int] = set()

    # -- a placement and a move -------------------------------------------------
    def _cost(self, nodes: Sequence[int]) -> float:
        return self.tree.cost(nodes, self.hop_cost)

    def _destroy(self, current: list[list[int]], free: Sequence[int]) -> tuple[list[int], list[int]]:
        """Removed job indices (largest first) and the free sequence without the others' nodes."""
        rng, k = self.np_random, len(current)
        count = int(rng.integers(1, min(self.remove, k) + 1))
        removed = sorted(rng.choice(k, size=count, replace=False).tolist(), key=lambda j: -len(current[j]))
        held = {node for j in range(k) if j not in removed for node in current[j]}
        return removed, [node for node in free if node not in held]

    def _random_repair(self, queue: list[int], sizes: Sequence[int]) -> list[list[int]]:
        placed = []
        for n in sizes:
            nodes = contiguous(queue, int(self.np_random.integers(len(queue))), n)
            taken = set(nodes)
            queue = [node for node in queue if node not in taken]
            placed.append(nodes)
        return placed

    # -- Gymnasium --------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        rng = self.np_random
        window = self.windows[int(rng.integers(len(self.windows)))]
        free = list(window.free)
        current = [list(nodes) for nodes in window.initial]
        for _ in range(int(rng.integers(self.warmup + 1))):
            removed, queue = self._destroy(current, free)
            repaired = self._random_repair(queue, [len(current[j]) for j in removed])
            delta = sum(self._cost(n) for n in repaired) - sum(self._cost(current[j]) for j in removed)
            if delta < 0 or rng.random() < math.exp(-delta / self.t_max):
                for j, nodes in zip(removed, repaired, strict=True):
                    current[j] = nodes
        removed, self._queue = self._destroy(current, free)
        self._sizes = [len(current[j]) for j in removed]
        self._before = sum(self._cost(current[j]) for j in removed)
        self._placed = []
        return self._observation(), {}

    def _observation(self) -> np.ndarray:
        i = len(self._placed)
        return observation(self.tree, self._queue, self._sizes[i], self._sizes[i + 1 :], q=self.q, n_max=self.n_max)

    def action_masks(self) -> np.ndarray:
        return action_mask(self._queue, self.q)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not 0 <= int(action) < self.q:
            raise ValueError(f"start position {action} is not an action (0..{self.q - 1})")
        action = int(action) % len(self._queue)  # a masked position (past |Q|) wraps, as the runs do
        n = self._sizes[len(self._placed)]
        nodes = contiguous(self._queue, action, n)
        taken = set(nodes)
        self._queue = [node for node in self._queue if node not in taken]
        self._placed.append(nodes)
        if len(self._placed) < len(self._sizes):
            return self._observation(), 0.0, False, False, {}
        improvement = self._before - sum(self._cost(p) for p in self._placed)
        info = {"improvement": improvement, "random_improvement": self._random_baseline()}
        return np.zeros_like(self.observation_space.low), improvement / self.scale, True, False, info

    def _random_baseline(self) -> float:
        """SA's repair of the same removal: one uniformly random start per job."""
        queue = sorted(set(self._queue).union(*self._placed))
        return self._before - sum(self._cost(p) for p in self._random_repair(queue, self._sizes))

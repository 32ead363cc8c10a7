"""Neural simulated annealing (`nsa`): the paper's SA with a learned repair operator.

The NSA paper (`nsa-topology-aware-allocation.txt`, Section V) keeps Algorithm 1 as SA runs
it and learns only the repair: each removed job's start position in the free sequence Q is
drawn from a policy network's softmax over the first q positions (those past |Q| masked),
instead of uniformly. The network is trained by `cosched train nsa` (`cosched.learn.nsa`,
`cosched.learn.train`) and run here in NumPy: this module never imports torch.

`nsa`, `nsa:MODEL` or `nsa:model=NAME,iterations=500,period=60,remove=2,seed=0`; the model is
a shipped one (`paper`, the default) or an `.npz` file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from cosched.core.topology import FatTree
from cosched.errors import ConfigError
from cosched.learn.models import load_model
from cosched.learn.network import PolicyNetwork
from cosched.learn.nsa import action_mask, observation
from cosched.policies.options import parse_options
from cosched.policies.topology import Annealing

DEFAULT_MODEL = "paper"


class NeuralAnnealing(Annealing):
    """`sa` whose repair samples each start from a trained network's masked softmax."""

    name = "nsa"
    OPTIONS: ClassVar[dict[str, type]] = {**Annealing.OPTIONS, "model": str}

    def __init__(
        self,
        argument: str | None = None,
        *,
        model: str | None = None,
        network: PolicyNetwork | None = None,
        **kw: float,
    ) -> None:
        given = parse_options(argument, self.OPTIONS, "model")
        model = str(given.pop("model", model or DEFAULT_MODEL))
        super().__init__(None, **{**kw, **given})  # type: ignore[arg-type]
        self.network = network if network is not None else load_model("nsa", model)
        self.model_digest = self.network.digest
        if self.network.kind != "nsa":
            raise ConfigError(f"nsa needs an nsa model, not a {self.network.kind} one")
        self.q = int(self.network.config["q"])
        self.n_max = int(self.network.config["n_max"])

    def choose_start(self, tree: FatTree, queue: Sequence[int], n: int, later: Sequence[int]) -> int:
        """A start among the first q positions of `queue`, drawn from the network's softmax."""
        obs = observation(tree, queue, n, later, q=self.q, n_max=self.n_max)
        mask = action_mask(queue, self.q)
        logits = np.where(mask, self.network.logits(obs).astype(np.float64), -np.inf)
        weights = np.exp(logits - logits.max())
        cumulative = np.cumsum(weights)
        pick = int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right"))
        return min(pick, int(mask.sum()) - 1)

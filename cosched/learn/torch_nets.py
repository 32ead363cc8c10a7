"""The actor-critic networks PPO trains (torch; `cosched.learn.network` runs the actors in NumPy).

RLBackfilling's actor is the paper's kernel network: one small MLP scores every job row.
DBF's is, by default, the paper's MLP over the whole observation (`MlpPolicy`), or with
`actor="kernel"` the same idea for its window (`WindowKernelExtractor`): a flat MLP must
learn the same comparison of jobs once for each of the window's slots. Fitted to imitate the
rule f1-reserving (window 24 + 8), the MLP scored 67 mean bsld on the test windows, the kernel
actor 27, the rule itself 23 (docs/learned-policies.md, round three).
NSA's repair is the paper's CNN-3 (`NsaConvExtractor`) or its FCN-1 (an MLP, tanh).
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from cosched.learn.features import CLUSTER_QUANTILES, RLBF_FEATURES
from cosched.learn.network import NEGLIGIBLE

WINDOW_KEYS = (32,)
"""Hidden layers of the net that gives each job of DBF's window a key and a value."""
WINDOW_VALUES = 16
WINDOW_HIDDEN = (64, 32)
"""Hidden layers of the nets that score a job and forward."""


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers of `sizes` with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for k in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[k], sizes[k + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class KernelExtractor(nn.Module):
    """RLBackfilling's networks: the actor scores every job row with one small MLP (the
    paper's kernel network, 5-32-16-8-1); the critic reads the flattened rows (32-16-8)."""

    def __init__(self, window: int, features: int = RLBF_FEATURES) -> None:
        super().__init__()
        self.window = window
        self.features = features
        self.latent_dim_pi = window
        self.latent_dim_vf = 8
        self.kernel = nn.Sequential(
            nn.Linear(features, 32),
            nn.ReLU(),
            nn.Linear(32, 16),
            nn.ReLU(),
            nn.Linear(16, 8),
            nn.ReLU(),
            nn.Linear(8, 1),
        )
        self.value = nn.Sequential(
            nn.Linear(window * features, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU()
        )

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        rows = features.view(features.shape[0], self.window, self.features)
        return self.kernel(rows).squeeze(-1)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return self.value(features)


class WindowKernelExtractor(nn.Module):
    """DBF's kernel actor: every job of the window is scored by one shared MLP, from its own
    features and a context, and forward by another MLP from the context alone. The context is
    the cluster summary and an attention average over the window's jobs (each job's weight and
    value from a third MLP), through which a job's score can depend on another job, e.g. on
    when the job it should not delay would fit. The critic is an MLP over the whole observation."""

    def __init__(self, size: int, features: int) -> None:
        super().__init__()
        self.size, self.features = size, features
        self.latent_dim_pi = size + 1
        self.latent_dim_vf = 64
        context = WINDOW_VALUES + CLUSTER_QUANTILES
        self.keys = mlp([features, *WINDOW_KEYS, 1 + WINDOW_VALUES])
        self.rows = mlp([features + context, *WINDOW_HIDDEN, 1])
        self.forward_score = mlp([context, *WINDOW_HIDDEN, 1])
        self.value = nn.Sequential(mlp([CLUSTER_QUANTILES + size * features, 128, 64]), nn.ReLU())

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, observation: torch.Tensor) -> torch.Tensor:
        batch = observation.shape[0]
        cluster = observation[:, :CLUSTER_QUANTILES]
        rows = observation[:, CLUSTER_QUANTILES:].reshape(batch, self.size, self.features)
        keyed = self.keys(rows)
        key = keyed[..., 0].masked_fill(rows[..., 3] <= 0, NEGLIGIBLE)  # column 3: the slot holds a job
        pooled = (torch.softmax(key, dim=-1).unsqueeze(-1) * keyed[..., 1:]).sum(dim=-2)
        context = torch.cat((pooled, cluster), dim=-1)
        each = torch.cat((rows, context.unsqueeze(1).expand(batch, self.size, context.shape[-1])), dim=-1)
        return torch.cat((self.rows(each).squeeze(-1), self.forward_score(context)), dim=-1)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return self.value(features)

    def exported(self) -> tuple[list[nn.Linear], dict[str, Any]]:
        """The actor's linear layers in `network.PolicyNetwork`'s order, and its config."""
        parts = (self.keys, self.rows, self.forward_score)
        layers = [[m for m in part if isinstance(m, nn.Linear)] for part in parts]
        config = {"actor": "kernel", "features": self.features, "layers": [len(part) for part in layers]}
        return [layer for part in layers for layer in part], config


NSA_CONV = ((16, 10, 1), (8, 5, 2))
"""NSA's convolutions (the paper's CNN-3, Table II): (out channels, kernel, stride) each."""
NSA_HIDDEN = 256
"""The hidden linear layer after them (CNN-3's Linear(352, 256)); the action layer follows."""


class NsaConvExtractor(BaseFeaturesExtractor):  # type: ignore[misc]
    """The convolutional part of the NSA paper's CNN-3: the (q, 4) observation read as 4
    channels along Q, Conv1d(4, 16, 10) Tanh Conv1d(16, 8, 5, stride 2) Tanh, flattened
    (channel by channel, as torch's Flatten). Actor and critic share it; each has its own
    Linear(., 256) Tanh after it, the actor then Linear(256, q), the critic Linear(256, 1)."""

    def __init__(self, observation_space: spaces.Box) -> None:
        length, channels = observation_space.shape
        layers: list[nn.Module] = []
        for out, kernel, stride in NSA_CONV:
            layers += [nn.Conv1d(channels, out, kernel, stride), nn.Tanh()]
            length, channels = (length - kernel) // stride + 1, out
        super().__init__(observation_space, features_dim=length * channels)
        self.conv = nn.Sequential(*layers, nn.Flatten())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.conv(observations.transpose(1, 2))  # type: ignore[no-any-return]

    def exported(self) -> tuple[list[nn.Conv1d], list[list[int]]]:
        """The convolutions, and (kernel, stride) of each for `network.PolicyNetwork`."""
        convs = [m for m in self.conv if isinstance(m, nn.Conv1d)]
        return convs, [[int(c.kernel_size[0]), int(c.stride[0])] for c in convs]


class _ScoresPolicy(MaskableActorCriticPolicy):  # type: ignore[misc]
    """MaskablePPO's policy whose extractor's actor output already is the logits."""

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        self.action_net = nn.Identity()
        # SB3 types optimizer_class as type[Optimizer], whose __init__ takes no lr (SB3 ignores it too)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)  # type: ignore[call-arg]


class KernelPolicy(_ScoresPolicy):
    """RLBackfilling's kernel actor: its per-row scores are the logits."""

    def __init__(self, *args: Any, window: int = 128, features: int = RLBF_FEATURES, **kwargs: Any) -> None:
        self.window, self.features = window, features
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        # SB3 types it MlpExtractor, but takes any module with its latent dims and forward_actor/critic
        self.mlp_extractor = KernelExtractor(self.window, self.features)  # type: ignore[assignment]

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), "window": self.window, "features": self.features}


class WindowKernelPolicy(_ScoresPolicy):
    """DBF's kernel actor (`WindowKernelExtractor`)."""

    def __init__(self, *args: Any, size: int = 10, features: int = 4, **kwargs: Any) -> None:
        self.size, self.features = size, features
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        # SB3 types it MlpExtractor, but takes any module with its latent dims and forward_actor/critic
        self.mlp_extractor = WindowKernelExtractor(self.size, self.features)  # type: ignore[assignment]

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), "size": self.size, "features": self.features}

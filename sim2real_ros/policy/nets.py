"""Torch modules of the policy: the ensemble used in training and the benchmark's plain MLP.

Only training, fine-tuning and benchmarks import this (and torch). Running a policy does not:
`EnsemblePolicy.evaluate` is plain NumPy over the same weights (see model.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from sim2real_ros.policy.model import ModelSpec


class EnsembleMLP(nn.Module):
    """N independent MLPs (tanh hidden layers, tanh output in [-1, 1]) evaluated in one pass."""

    def __init__(self, spec: ModelSpec, seed: int = 0) -> None:
        super().__init__()
        self.spec = spec
        gen = torch.Generator().manual_seed(seed)
        sizes = [spec.obs_dim, *spec.hidden, spec.act_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            # Orthogonal-ish scale as in PPO practice; the output layer starts small so an
            # untrained policy commands small moves.
            gain = 0.01 if i == len(sizes) - 2 else math.sqrt(2.0)
            w = torch.randn(spec.members, fan_in, fan_out, generator=gen) * (
                gain / math.sqrt(fan_in)
            )
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(spec.members, 1, fan_out)))
        # Plain references to the same Parameter objects: indexing a ParameterList costs more
        # than the matrix products at batch 1 (load_state_dict copies in place, so they stay).
        self._hidden_wb = tuple(zip(list(self.weights)[:-1], list(self.biases)[:-1], strict=True))
        self._out_wb = (self.weights[-1], self.biases[-1])

    @property
    def n_layers(self) -> int:
        """Number of linear layers per member."""
        return len(self.weights)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Return the last hidden layer's activations, shape (N, B, hidden[-1]).

        `x` is (B, obs_dim) shared by all members, or (N, B, obs_dim) one batch per member.
        """
        h = x.unsqueeze(0).expand(self.spec.members, -1, -1) if x.dim() == 2 else x
        for w, b in self._hidden_wb:
            h = torch.tanh(torch.baddbmm(b, h, w))
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Return pre-tanh outputs of the last layer, shape (N, B, act_dim)."""
        w, b = self._out_wb
        return torch.baddbmm(b, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return every member's action in [-1, 1], shape (N, B, act_dim)."""
        return torch.tanh(self.head(self.features(x)))

    def last_layer_parameters(self) -> list[nn.Parameter]:
        """The parameters fine-tuning may change."""
        return [self.weights[-1], self.biases[-1]]

    def load_layers(self, layers: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Copy (weight (N, in, out), bias (N, 1, out)) arrays into the parameters."""
        if len(layers) != self.n_layers:
            raise ValueError(f"expected {self.n_layers} layers, got {len(layers)}")
        with torch.no_grad():
            for (w, b), pw, pb in zip(layers, self.weights, self.biases, strict=True):
                pw.copy_(torch.as_tensor(w))
                pb.copy_(torch.as_tensor(b))

    def layers_numpy(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Views of the parameters as NumPy arrays (no copy)."""
        return [(w.detach().numpy(), b.detach().numpy())
                for w, b in zip(self.weights, self.biases, strict=True)]


class PlainMLP(nn.Module):
    """One MLP of the same width (the benchmark's baseline)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        sizes = [spec.obs_dim, *spec.hidden, spec.act_dim]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            layers.append(nn.Tanh())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the action in [-1, 1]."""
        return self.net(x)

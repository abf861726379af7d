"""The policy network: an ensemble of small MLPs with a disagreement and an OOD score.

- Members are evaluated together as batched matrix products (one `baddbmm` per layer), so an
  ensemble of N costs little more than one MLP at batch 1 (see bench/bench_policy_inference.py).
- Disagreement (confidence x): max over joints of the members' standard deviation of the joint
  target, in rad. All members answer the same observation with the same previous target, so
  that std is the std of the members' joint-target steps (`max_step_rad * a|a|`).
- OOD score (confidence y): RMS z-score of the raw observation against the mean and standard
  deviation of the training observations saved with the policy,
  `sqrt(mean_i(((o_i - mu_i) / sigma_i)^2))`. About 1 on training data, larger away from it.
  We use the RMS z-score rather than a Mahalanobis distance because several observation
  components are (near-)collinear (the error is target - fk(q)), which makes a full
  covariance ill-conditioned; the diagonal score is stable and easy to threshold.
- The normalized observation fed to the network is clipped to +-`obs_clip` so a wild input
  cannot drive the activations anywhere the training never went.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

FORMAT = "sim2real_policy/1"


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the ensemble."""

    obs_dim: int
    act_dim: int
    hidden: tuple[int, ...] = (128, 128)
    members: int = 5
    obs_clip: float = 8.0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict."""
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """Inverse of to_dict."""
        return cls(
            obs_dim=int(d["obs_dim"]),
            act_dim=int(d["act_dim"]),
            hidden=tuple(int(h) for h in d["hidden"]),
            members=int(d["members"]),
            obs_clip=float(d["obs_clip"]),
        )


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


@dataclass
class ObsStats:
    """Mean and standard deviation of the training observations (raw units)."""

    mean: np.ndarray
    std: np.ndarray
    count: int

    @classmethod
    def from_data(cls, obs: np.ndarray, min_std: float = 1e-3) -> ObsStats:
        """Compute statistics over rows; a near-constant column gets std `min_std`."""
        obs = np.asarray(obs, dtype=np.float64)
        return cls(
            obs.mean(axis=0),
            np.maximum(obs.std(axis=0), min_std),
            int(obs.shape[0]),
        )

    def z(self, obs: np.ndarray) -> np.ndarray:
        """Return z-scores of raw observations."""
        return (np.asarray(obs, dtype=np.float64) - self.mean) / self.std

    def ood_score(self, obs: np.ndarray) -> np.ndarray:
        """RMS z-score per observation row (dimensionless)."""
        z = self.z(obs)
        return np.sqrt(np.mean(np.square(z), axis=-1))


@dataclass
class EnsembleOutput:
    """What one evaluation returns (batch B, N members, A joints)."""

    action: np.ndarray  # (B, A) mean of the members' normalized actions, in [-1, 1]
    member_actions: np.ndarray  # (N, B, A)
    disagreement_rad: np.ndarray  # (B,) max over joints of the members' std, rad
    ood: np.ndarray  # (B,) RMS z-score


class EnsemblePolicy:
    """An ensemble network with its observation statistics and the task it was trained on."""

    def __init__(
        self,
        spec: ModelSpec,
        stats: ObsStats,
        task: dict[str, Any],
        joint_names: list[str],
        metadata: dict[str, Any] | None = None,
        net: EnsembleMLP | None = None,
        seed: int = 0,
    ) -> None:
        if stats.mean.shape != (spec.obs_dim,):
            raise ValueError(
                f"observation statistics have shape {stats.mean.shape}, expected ({spec.obs_dim},)"
            )
        self.spec = spec
        self.stats = stats
        self.task = dict(task)
        self.joint_names = list(joint_names)
        self.metadata = dict(metadata or {})
        self.net = net if net is not None else EnsembleMLP(spec, seed=seed)
        self._mean_t = torch.as_tensor(stats.mean, dtype=torch.float32)
        self._std_t = torch.as_tensor(stats.std, dtype=torch.float32)

    @property
    def max_step_rad(self) -> float:
        """Largest joint-target move per control step, rad."""
        return float(self.task["max_step_rad"])

    def set_stats(self, stats: ObsStats) -> None:
        """Replace the observation statistics (training updates them from new data)."""
        self.stats = stats
        self._mean_t = torch.as_tensor(stats.mean, dtype=torch.float32)
        self._std_t = torch.as_tensor(stats.std, dtype=torch.float32)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Return clipped z-scored observations as the network input."""
        c = self.spec.obs_clip
        return torch.clamp((obs - self._mean_t) / self._std_t, -c, c)

    def members_torch(self, obs: torch.Tensor) -> torch.Tensor:
        """Every member's action for raw observations (differentiable), shape (N, B, A)."""
        return self.net(self.normalize(obs))

    def evaluate(self, obs: np.ndarray) -> EnsembleOutput:
        """Evaluate raw observations, shape (B, obs_dim) or (obs_dim,) (treated as B = 1)."""
        o = np.asarray(obs, dtype=np.float32)
        if o.ndim == 1:
            o = o[None, :]
        if o.ndim != 2 or o.shape[1] != self.spec.obs_dim:
            raise ValueError(
                f"expected observations of shape (B, {self.spec.obs_dim}), got {np.shape(obs)}"
            )
        with torch.inference_mode():
            members = self.members_torch(torch.from_numpy(o)).numpy()
        action = members.mean(axis=0)
        # Joint-target steps of each member (signed square, see task.action_to_step).
        steps = self.max_step_rad * members * np.abs(members)
        dis = steps.std(axis=0).max(axis=-1)
        return EnsembleOutput(action, members, dis, self.stats.ood_score(o))

    # --- persistence -------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Serialize to the policy file format (a torch archive of tensors and JSON strings)."""
        payload = {
            "format": FORMAT,
            "spec": json.dumps(self.spec.to_dict(), sort_keys=True),
            "task": json.dumps(self.task, sort_keys=True),
            "joint_names": json.dumps(self.joint_names),
            "metadata": json.dumps(self.metadata, sort_keys=True),
            "obs_mean": torch.as_tensor(self.stats.mean, dtype=torch.float64),
            "obs_std": torch.as_tensor(self.stats.std, dtype=torch.float64),
            "obs_count": int(self.stats.count),
            "state_dict": {k: v.detach().clone() for k, v in self.net.state_dict().items()},
        }
        buf = io.BytesIO()
        torch.save(payload, buf)
        return buf.getvalue()

    def save(self, path: str | Path) -> Path:
        """Write the policy file; return its path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self.to_bytes())
        return p

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> EnsemblePolicy:
        """Load a policy file's bytes (tensors only: weights_only, no code is unpickled)."""
        try:
            payload = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - any decode failure means "not a policy file"
            raise ValueError(f"{source}: not a readable policy file ({exc})") from exc
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"{source}: not a {FORMAT} file")
        spec = ModelSpec.from_dict(json.loads(payload["spec"]))
        stats = ObsStats(
            payload["obs_mean"].numpy().astype(np.float64),
            payload["obs_std"].numpy().astype(np.float64),
            int(payload["obs_count"]),
        )
        net = EnsembleMLP(spec)
        net.load_state_dict(payload["state_dict"])
        return cls(
            spec,
            stats,
            json.loads(payload["task"]),
            json.loads(payload["joint_names"]),
            json.loads(payload["metadata"]),
            net=net,
        )

    @classmethod
    def load(cls, path: str | Path) -> EnsemblePolicy:
        """Load a policy file without any integrity check (use the registry for that)."""
        p = Path(path)
        return cls.from_bytes(p.read_bytes(), str(p))

"""The policy network: an ensemble of small MLPs with a disagreement and an OOD score.

- Members are evaluated together as batched matrix products (one per layer), so an ensemble
  of N costs little more than one MLP at batch 1 (see bench/bench_policy_inference.py).
- Running a policy needs NumPy only: `evaluate` is a NumPy forward pass, and the policy file is
  a NumPy archive. Torch is imported only to train or fine-tune (`.net`, `members_torch`), so a
  robot computer runs `policy_node` without torch and the node starts in about a second.
- Disagreement (confidence x): max over joints of the members' standard deviation of the joint
  target, in rad. All members answer the same observation with the same previous target, so
  that std is the std of the members' joint-target steps (`max_step_rad * a|a|`).
- OOD score (confidence y): RMS z-score of the raw observation against the mean and standard
  deviation of the training observations saved with the policy,
  `sqrt(mean_i(((o_i - mu_i) / sigma_i)^2))`. About 1 on training data, larger away from it.
  Training floors each sigma at what that column can vary by on a real unit
  (policy/obs_floor.py), so a column constant in simulation does not turn a few mrad of
  encoder bias into a fallback; the saved sigma is the floored one.
  We use the RMS z-score rather than a Mahalanobis distance because several observation
  components are (near-)collinear (the error is target - fk(q)), which makes a full
  covariance ill-conditioned; the diagonal score is stable and easy to threshold.
- The normalized observation fed to the network is clipped to +-`obs_clip` so a wild input
  cannot drive the activations anywhere the training never went.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from sim2real_ros.policy.nets import EnsembleMLP

FORMAT = "sim2real_policy/2"  # NumPy .npz; /1 was a torch archive (still readable with torch)
LEGACY_FORMAT = "sim2real_policy/1"

Layers = list[tuple[np.ndarray, np.ndarray]]  # (weight (N, in, out), bias (N, 1, out)) per layer


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


@dataclass
class ObsStats:
    """Mean and standard deviation of the training observations (raw units)."""

    mean: np.ndarray
    std: np.ndarray
    count: int

    @classmethod
    def from_data(
        cls, obs: np.ndarray, min_std: float = 1e-3, floor: np.ndarray | None = None
    ) -> ObsStats:
        """Compute statistics over rows; each column's std is at least its floor.

        `floor` (one value per column, > 0; policy.obs_floor.observation_std_floor gives what a
        real unit's sensors and commands vary by) replaces the flat `min_std` when given.
        """
        obs = np.asarray(obs, dtype=np.float64)
        if floor is None:
            lo = np.full(obs.shape[-1], float(min_std))
        else:
            lo = np.asarray(floor, dtype=np.float64)
            if lo.shape != (obs.shape[-1],) or not np.all(np.isfinite(lo) & (lo > 0)):
                raise ValueError(f"std floor: expected {obs.shape[-1]} finite values > 0, got "
                                 f"shape {lo.shape}")
        return cls(
            obs.mean(axis=0),
            np.maximum(obs.std(axis=0), lo),
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
    """An ensemble network with its observation statistics and the task it was trained on.

    The weights live in NumPy arrays until something asks for the torch module (`.net`, for
    training); from then on the module is the source of truth and `evaluate` reads its
    parameters as NumPy views, so both always agree.
    """

    def __init__(
        self,
        spec: ModelSpec,
        stats: ObsStats,
        task: dict[str, Any],
        joint_names: list[str],
        metadata: dict[str, Any] | None = None,
        net: EnsembleMLP | None = None,
        seed: int = 0,
        layers: Layers | None = None,
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
        self._net = net
        self._layers = None if layers is None else _check_layers(spec, layers)
        if self._net is None and self._layers is None:
            from sim2real_ros.policy.nets import EnsembleMLP

            self._net = EnsembleMLP(spec, seed=seed)
        self._set_norm()
        from sim2real_ros.policy.task import TaskConfig, step_scale_rad

        cfg = TaskConfig.from_dict(self.task, "policy task config", strict=False)
        if cfg.jerk_limited and len(cfg.max_velocity_rad_s) != spec.act_dim:
            raise ValueError(
                f"policy task config: action_interface 'jerk_limited' needs "
                f"max_velocity_rad_s/max_acceleration_rad_s2/max_jerk_rad_s3 with "
                f"{spec.act_dim} values each, got {len(cfg.max_velocity_rad_s)}; build the "
                f"task with resolve_rate_limits(TaskConfig(...), arm)"
            )
        self._step_scale = step_scale_rad(cfg, spec.act_dim)

    def _set_norm(self) -> None:
        self._mean32 = self.stats.mean.astype(np.float32)
        self._inv_std32 = (1.0 / self.stats.std).astype(np.float32)

    @property
    def max_step_rad(self) -> np.ndarray:
        """Largest joint-target move per control step, rad, per joint (task.step_scale_rad)."""
        return self._step_scale

    @property
    def net(self) -> EnsembleMLP:
        """The torch module (imports torch; built from the NumPy weights on first use)."""
        if self._net is None:
            from sim2real_ros.policy.nets import EnsembleMLP

            net = EnsembleMLP(self.spec)
            assert self._layers is not None
            net.load_layers(self._layers)
            self._net, self._layers = net, None
        return self._net

    def layers(self) -> Layers:
        """The weights as NumPy arrays (views of the torch parameters once `.net` exists)."""
        if self._net is not None:
            return self._net.layers_numpy()
        assert self._layers is not None
        return self._layers

    def set_stats(self, stats: ObsStats) -> None:
        """Replace the observation statistics (training updates them from new data)."""
        self.stats = stats
        self._set_norm()

    # --- torch (training) --------------------------------------------------------------------

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Return clipped z-scored observations as the network input (torch)."""
        import torch

        c = self.spec.obs_clip
        mean = torch.as_tensor(self._mean32)
        inv = torch.as_tensor(self._inv_std32)
        return torch.clamp((obs - mean) * inv, -c, c)

    def members_torch(self, obs: torch.Tensor) -> torch.Tensor:
        """Every member's action for raw observations (differentiable), shape (N, B, A)."""
        return self.net(self.normalize(obs))

    # --- NumPy (running) ---------------------------------------------------------------------

    def normalize_np(self, obs: np.ndarray) -> np.ndarray:
        """Return clipped z-scored observations (float32)."""
        c = self.spec.obs_clip
        return np.clip((np.asarray(obs, dtype=np.float32) - self._mean32) * self._inv_std32,
                       -c, c)

    def members_np(self, obs: np.ndarray) -> np.ndarray:
        """Every member's action for raw observations (B, D), shape (N, B, A); NumPy only."""
        h = self.normalize_np(obs)
        layers = self.layers()
        for w, b in layers[:-1]:
            h = np.tanh(h @ w + b)  # (B, in) @ (N, in, out) broadcasts to (N, B, out)
        w, b = layers[-1]
        return np.tanh(h @ w + b)

    def evaluate(self, obs: np.ndarray) -> EnsembleOutput:
        """Evaluate raw observations, shape (B, obs_dim) or (obs_dim,) (treated as B = 1)."""
        o = np.asarray(obs, dtype=np.float32)
        if o.ndim == 1:
            o = o[None, :]
        if o.ndim != 2 or o.shape[1] != self.spec.obs_dim:
            raise ValueError(
                f"expected observations of shape (B, {self.spec.obs_dim}), got {np.shape(obs)}"
            )
        members = self.members_np(o)
        action = members.mean(axis=0)
        # Joint-target steps of each member (signed square, see task.action_to_step).
        steps = self.max_step_rad * members * np.abs(members)
        dis = steps.std(axis=0).max(axis=-1)
        return EnsembleOutput(action, members, dis, self.stats.ood_score(o))

    # --- persistence -------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Serialize to the policy file format: a NumPy .npz of arrays and one JSON header."""
        header = {
            "format": FORMAT,
            "spec": self.spec.to_dict(),
            "task": self.task,
            "joint_names": self.joint_names,
            "metadata": self.metadata,
            "obs_count": int(self.stats.count),
        }
        arrays: dict[str, np.ndarray] = {
            "header": np.array(json.dumps(header, sort_keys=True)),
            "obs_mean": np.asarray(self.stats.mean, dtype=np.float64),
            "obs_std": np.asarray(self.stats.std, dtype=np.float64),
        }
        for i, (w, b) in enumerate(self.layers()):
            arrays[f"w{i}"] = np.array(w, dtype=np.float32)
            arrays[f"b{i}"] = np.array(b, dtype=np.float32)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    def save(self, path: str | Path) -> Path:
        """Write the policy file; return its path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self.to_bytes())
        return p

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> EnsemblePolicy:
        """Load a policy file's bytes (arrays and JSON only: nothing is unpickled)."""
        try:
            names = zipfile.ZipFile(io.BytesIO(data)).namelist()
        except zipfile.BadZipFile as exc:
            raise ValueError(f"{source}: not a readable policy file ({exc})") from exc
        if any(n.endswith("data.pkl") for n in names):
            return cls._from_torch_archive(data, source)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                header = json.loads(str(z["header"]))
                if header.get("format") != FORMAT:
                    raise ValueError(f"format {header.get('format')!r}")
                spec = ModelSpec.from_dict(header["spec"])
                n_layers = len(spec.hidden) + 1
                layers = [(z[f"w{i}"].astype(np.float32), z[f"b{i}"].astype(np.float32))
                          for i in range(n_layers)]
                stats = ObsStats(z["obs_mean"].astype(np.float64),
                                 z["obs_std"].astype(np.float64), int(header["obs_count"]))
        except (KeyError, ValueError, OSError) as exc:
            raise ValueError(f"{source}: not a readable {FORMAT} policy file ({exc})") from exc
        return cls(spec, stats, header["task"], header["joint_names"], header["metadata"],
                   layers=layers)

    @classmethod
    def _from_torch_archive(cls, data: bytes, source: str) -> EnsemblePolicy:
        """Read a sim2real_policy/1 file (torch archive, weights_only: no code unpickled)."""
        import torch

        try:
            payload = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - any decode failure means "not a policy file"
            raise ValueError(f"{source}: not a readable policy file ({exc})") from exc
        if not isinstance(payload, dict) or payload.get("format") != LEGACY_FORMAT:
            raise ValueError(f"{source}: not a {LEGACY_FORMAT} file")
        spec = ModelSpec.from_dict(json.loads(payload["spec"]))
        sd = payload["state_dict"]
        layers = [(sd[f"weights.{i}"].numpy().astype(np.float32),
                   sd[f"biases.{i}"].numpy().astype(np.float32))
                  for i in range(len(spec.hidden) + 1)]
        stats = ObsStats(payload["obs_mean"].numpy().astype(np.float64),
                         payload["obs_std"].numpy().astype(np.float64), int(payload["obs_count"]))
        return cls(spec, stats, json.loads(payload["task"]), json.loads(payload["joint_names"]),
                   json.loads(payload["metadata"]), layers=layers)

    @classmethod
    def load(cls, path: str | Path) -> EnsemblePolicy:
        """Load a policy file without any integrity check (use the registry for that)."""
        p = Path(path)
        return cls.from_bytes(p.read_bytes(), str(p))


def _check_layers(spec: ModelSpec, layers: Layers) -> Layers:
    sizes = [spec.obs_dim, *spec.hidden, spec.act_dim]
    if len(layers) != len(sizes) - 1:
        raise ValueError(f"expected {len(sizes) - 1} layers for {spec}, got {len(layers)}")
    for i, (w, b) in enumerate(layers):
        want_w = (spec.members, sizes[i], sizes[i + 1])
        want_b = (spec.members, 1, sizes[i + 1])
        if w.shape != want_w or b.shape != want_b:
            raise ValueError(f"layer {i}: weight {w.shape} / bias {b.shape}, expected "
                             f"{want_w} / {want_b}")
    return layers

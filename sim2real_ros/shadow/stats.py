"""The policy's training observation statistics, reduced to what the comparator measures itself.

The policy's observation is `[q, qd, target, target - tool(q), cmd - q, wrench?]`
(sim2real_ros.policy.task.build_observation) and its file stores the training mean and standard
deviation of that vector. The comparator checks coverage on the measured-state block `[q, qd]`
from joint_states, independently of the policy's own OOD score (which covers the whole vector and
arrives on policy/confidence): a policy that misjudges its inputs cannot hide it here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sim2real_ros.config import ConfigError, load_yaml
from sim2real_ros.shadow.divergence import TrainingStats


def state_block_names(joint_names: Sequence[str]) -> tuple[str, ...]:
    """Return the names of the [q, qd] observation block."""
    return tuple([f"q[{j}]" for j in joint_names] + [f"qd[{j}]" for j in joint_names])


def state_block(mean: np.ndarray, std: np.ndarray, joint_names: Sequence[str],
                source: str) -> TrainingStats:
    """Return the [q, qd] block of full-observation statistics."""
    n = 2 * len(joint_names)
    mean = np.asarray(mean, dtype=float).ravel()
    std = np.asarray(std, dtype=float).ravel()
    if mean.shape != std.shape or mean.size < n:
        raise ConfigError(source, "obs_mean/obs_std", f"{mean.size}/{std.size} values",
                          f"equal lengths of at least {n} (q and qd of {len(joint_names)} joints)")
    if not np.all(np.isfinite(mean[:n])) or not np.all(std[:n] > 0):
        raise ConfigError(source, "obs_std", std[:n].tolist(), "finite means and stds > 0")
    return TrainingStats(mean[:n].copy(), std[:n].copy(), state_block_names(joint_names))


def load_training_stats(path: str | Path, joint_names: Sequence[str]) -> TrainingStats:
    """Load the [q, qd] training statistics from a stats file (.json/.yaml) or a policy file.

    A stats file holds `{"mean": [...], "std": [...]}` over the policy's full observation (or
    just its [q, qd] block). Anything else is read as a policy file, which needs torch.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(p, "<file>", None, "a training statistics or policy file")
    if p.suffix in (".json", ".yaml", ".yml"):
        data: dict[str, Any]
        if p.suffix == ".json":
            try:
                data = json.loads(p.read_text())
            except json.JSONDecodeError as exc:
                raise ConfigError(p, "<file>", None, f"valid JSON ({exc})") from exc
        else:
            data = load_yaml(p)
        for key in ("mean", "std"):
            if not isinstance(data.get(key), list):
                raise ConfigError(p, key, data.get(key), "a list of numbers")
        return state_block(np.array(data["mean"]), np.array(data["std"]), joint_names, str(p))
    # Imported here: torch is only needed when statistics come from a policy file.
    from sim2real_ros.policy.model import EnsemblePolicy

    try:
        policy = EnsemblePolicy.load(p)
    except ValueError as exc:
        raise ConfigError(p, "<file>", None, f"a policy file ({exc})") from exc
    return _from_policy(policy, joint_names, str(p))


def load_registry_stats(
    version: int, joint_names: Sequence[str], root: str | Path | None = None
) -> TrainingStats:
    """Load the [q, qd] training statistics of a verified registry version."""
    from sim2real_ros.policy.registry import PolicyRegistry, default_root

    r = Path(root).expanduser() if root not in (None, "") else default_root()
    # Never create a registry as a side effect of observing one.
    if not (r / "index.json").is_file():
        raise ConfigError(r / "index.json", "<file>", None,
                          "an existing policy registry (the policy node's registry_path)")
    reg = PolicyRegistry(r, init_from_default=False)
    policy, rec = reg.load(int(version))
    return _from_policy(policy, joint_names, f"{reg.root / rec.file}")


def _from_policy(policy: Any, joint_names: Sequence[str], source: str) -> TrainingStats:
    if list(policy.joint_names) != list(joint_names):
        raise ConfigError(source, "joint_names", policy.joint_names, f"{list(joint_names)}")
    return state_block(policy.stats.mean, policy.stats.std, joint_names, source)


def save_training_stats(stats: TrainingStats, path: str | Path) -> Path:
    """Write statistics as the JSON stats file `load_training_stats` reads."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"mean": stats.mean.tolist(), "std": stats.std.tolist(),
                             "names": list(stats.names)}, indent=1))
    return p

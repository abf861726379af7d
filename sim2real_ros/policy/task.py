"""The default arm task: fast point-to-point reaching of a tool-frame (tool0) target.

Control: at `control_rate_hz` the policy moves the joint position target by a bounded delta,
`cmd <- clip(cmd + max_step_rad * a|a|, q - max_offset_rad, q + max_offset_rad)`, a in [-1, 1]^n.
Moving the previous target (not the measured position) gives the loop integral action, so the
tool reaches the target exactly even though the joint servo sags under gravity and payload;
the offset clip keeps that integrator from winding up when the arm is blocked or a safety
filter holds it.

Observation (float32 vector, normalized by the policy with its saved statistics):
`[q (n), qd (n), target (3), target - tool(q) (3), cmd - q (n), wrench (6, optional)]`.

Success: the tool is within `tolerance_m` of the target and every joint slower than
`rest_speed_rad_s`, before `episode_s` elapses. The episode ends there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.config import ConfigError
from sim2real_ros.robot.model import ArmModel


def _tuple(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class TaskConfig:
    """Parameters of the reaching task (SI units)."""

    control_rate_hz: float = 100.0
    episode_s: float = 2.0
    max_step_rad: float = 0.02
    max_offset_rad: float = 0.25
    tolerance_m: float = 0.02
    rest_speed_rad_s: float = 0.05
    min_distance_m: float = 0.10
    workspace_min_m: tuple[float, ...] = (0.30, -0.40, 0.15)
    workspace_max_m: tuple[float, ...] = (0.70, 0.40, 0.60)
    home_rad: tuple[float, ...] = (0.0, 0.0, 1.6, 0.0, 1.5, 0.0)
    spread_rad: tuple[float, ...] = (0.8, 0.5, 0.6, 0.5, 0.4, 0.0)
    include_wrench: bool = False
    # reward weights (documented in docs/policy.md)
    reward_success: float = 10.0
    reward_action_l2: float = 0.002
    reward_speed: float = 0.01
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dt_s(self) -> float:
        """Control period, s."""
        return 1.0 / self.control_rate_hz

    @property
    def max_steps(self) -> int:
        """Control steps per episode."""
        return int(round(self.episode_s * self.control_rate_hz))

    def obs_dim(self, n_joints: int) -> int:
        """Length of the observation vector for an arm with n joints."""
        return 3 * n_joints + 6 + (6 if self.include_wrench else 0)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], source: str | Path = "<task config>", strict: bool = True
    ) -> TaskConfig:
        """Build and validate a config; bad values (and, if strict, unknown keys) raise.

        Policy files are read with strict=False: a file written by another version may carry
        keys (reward weights, say) that do not change how the policy acts.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown and strict:
            raise ConfigError(source, unknown[0], data[unknown[0]], f"one of {sorted(known)}")
        kw: dict[str, Any] = {}
        for k, v in data.items():
            if k not in known:
                continue
            kw[k] = _tuple(v) if isinstance(v, (list, tuple)) else v
        cfg = cls(**kw)
        cfg.validate(source)
        return cfg

    def validate(self, source: str | Path = "<task config>", n_joints: int | None = None) -> None:
        """Raise ConfigError naming the key, value and range of the first bad setting."""
        bounds = {
            "control_rate_hz": (10.0, 1000.0, "Hz"),
            "episode_s": (0.1, 60.0, "s"),
            "max_step_rad": (1e-4, 0.5, "rad"),
            "max_offset_rad": (1e-3, 2.0, "rad"),
            "tolerance_m": (1e-4, 0.5, "m"),
            "rest_speed_rad_s": (1e-4, 5.0, "rad/s"),
            "min_distance_m": (0.0, 2.0, "m"),
        }
        for key, (lo, hi, unit) in bounds.items():
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
                raise ConfigError(source, key, v, f"a number in [{lo}, {hi}] {unit}")
        for key in ("workspace_min_m", "workspace_max_m"):
            if len(getattr(self, key)) != 3:
                raise ConfigError(source, key, getattr(self, key), "three numbers (x, y, z), m")
        lo_b, hi_b = np.array(self.workspace_min_m), np.array(self.workspace_max_m)
        if np.any(lo_b >= hi_b):
            raise ConfigError(source, "workspace_max_m", self.workspace_max_m,
                              f"each component > workspace_min_m {self.workspace_min_m}")
        if n_joints is not None:
            for key in ("home_rad", "spread_rad"):
                if len(getattr(self, key)) != n_joints:
                    raise ConfigError(source, key, getattr(self, key), f"{n_joints} numbers, rad")


def in_box(p: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """True when a point lies inside an axis-aligned box."""
    return bool(np.all(p >= lo) and np.all(p <= hi))


def sample_configuration(rng: np.random.Generator, cfg: TaskConfig, arm: ArmModel) -> np.ndarray:
    """Draw a joint vector uniformly around the home pose, inside the joint limits."""
    home, spread = np.array(cfg.home_rad), np.array(cfg.spread_rad)
    q = home + rng.uniform(-1.0, 1.0, size=home.shape) * spread
    return np.clip(q, arm.lower_rad, arm.upper_rad)


def sample_reachable_target(
    rng: np.random.Generator,
    cfg: TaskConfig,
    arm: ArmModel,
    box_min_m: np.ndarray | None = None,
    box_max_m: np.ndarray | None = None,
    max_tries: int = 2_000,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (target_xyz_m, q_reaching_it): a forward-kinematics point inside the workspace box.

    Drawing joint vectors and keeping the tool positions that fall in the box makes every
    target reachable by construction (no IK failure can hide in the task distribution).
    """
    lo = np.array(cfg.workspace_min_m if box_min_m is None else box_min_m, dtype=float)
    hi = np.array(cfg.workspace_max_m if box_max_m is None else box_max_m, dtype=float)
    for _ in range(max_tries):
        q = sample_configuration(rng, cfg, arm)
        p = arm.tool_position(q)
        if in_box(p, lo, hi):
            return p, q
    raise ConfigError("<task config>", "workspace box", (lo.tolist(), hi.tolist()),
                      "a box that contains reachable tool positions around home_rad ± spread_rad")


def sample_episode(
    rng: np.random.Generator, cfg: TaskConfig, arm: ArmModel
) -> tuple[np.ndarray, np.ndarray]:
    """Return (q_start, target_xyz_m) at least `min_distance_m` apart."""
    target, _ = sample_reachable_target(rng, cfg, arm)
    for _ in range(1000):
        q0 = sample_configuration(rng, cfg, arm)
        if np.linalg.norm(arm.tool_position(q0) - target) >= cfg.min_distance_m:
            return q0, target
    return q0, target


def reachable_targets(
    seed: int,
    count: int,
    arm: ArmModel,
    box_min_m: np.ndarray | None = None,
    box_max_m: np.ndarray | None = None,
    cfg: TaskConfig | None = None,
) -> np.ndarray:
    """Return `count` seeded reachable targets (count x 3, m) inside the box."""
    cfg = cfg or TaskConfig()
    rng = np.random.default_rng(seed)
    return np.array(
        [sample_reachable_target(rng, cfg, arm, box_min_m, box_max_m)[0] for _ in range(count)]
    )


def build_observation(
    cfg: TaskConfig,
    q: np.ndarray,
    qd: np.ndarray,
    target_m: np.ndarray,
    tool_m: np.ndarray,
    cmd: np.ndarray,
    wrench: np.ndarray | None = None,
) -> np.ndarray:
    """Assemble the raw (unnormalized) observation vector; batch dims are allowed in front."""
    parts = [q, qd, target_m, target_m - tool_m, cmd - q]
    if cfg.include_wrench:
        if wrench is None:
            raise ValueError("this task observes the wrist wrench; none was given")
        parts.append(wrench)
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts], axis=-1).astype(
        np.float32
    )


def action_to_step(cfg: TaskConfig, action: np.ndarray) -> np.ndarray:
    """Map normalized actions in [-1, 1] to joint-target steps, rad: `max_step * a * |a|`.

    The signed square gives fine resolution near zero: a network's small output bias
    (0.03, say) moves the target by 0.1 % of the largest step instead of 3 %, so a learned
    policy can come to rest instead of creeping along the arm's redundant directions.
    """
    a = np.clip(np.asarray(action, dtype=float), -1.0, 1.0)
    return cfg.max_step_rad * a * np.abs(a)


def step_to_action(cfg: TaskConfig, step_rad: np.ndarray) -> np.ndarray:
    """Inverse of `action_to_step` (steps beyond max_step map to +-1)."""
    x = np.clip(np.asarray(step_rad, dtype=float) / cfg.max_step_rad, -1.0, 1.0)
    return np.sign(x) * np.sqrt(np.abs(x))


def apply_action(
    cfg: TaskConfig, arm: ArmModel, cmd: np.ndarray, q: np.ndarray, action: np.ndarray
) -> np.ndarray:
    """Return the next joint target from a normalized action in [-1, 1]^n."""
    nxt = cmd + action_to_step(cfg, action)
    nxt = np.clip(nxt, q - cfg.max_offset_rad, q + cfg.max_offset_rad)
    return np.clip(nxt, arm.lower_rad, arm.upper_rad)


def reward(
    cfg: TaskConfig, distance_m: float, action: np.ndarray, success: bool, qd: np.ndarray
) -> float:
    """Per-step reward: -distance (m), small action and joint-speed costs, a success bonus.

    Every term but the bonus is negative, so the best an agent can do is to finish early by
    reaching the target and coming to rest (a per-step bonus for being near the target would
    instead pay for hovering there without stopping).
    """
    r = (
        -distance_m
        - cfg.reward_action_l2 * float(np.sum(np.square(action)))
        - cfg.reward_speed * float(np.max(np.abs(qd)))
    )
    if success:
        r += cfg.reward_success
    return r


def is_success(cfg: TaskConfig, distance_m: float, qd: np.ndarray) -> bool:
    """Within tolerance and at rest."""
    return distance_m < cfg.tolerance_m and float(np.max(np.abs(qd))) < cfg.rest_speed_rad_s

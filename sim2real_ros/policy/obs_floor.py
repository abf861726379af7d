"""Per-column floor on the observation std: how much each column can vary on a real unit.

A column that never varies in training (the wrist_3 position, its cmd - q and its command
rates, say) would otherwise get a tiny std, and the few mrad of encoder bias every real unit
has would make an OOD score of 50+ that sends the safety filter to its fallback. The floor of a
column is the scale of what the column's sensor or command plausibly does on a real unit
(each term is the largest magnitude the shipped config/randomization.yaml gives it):

- q: encoder error, root-sum-square of the bias (|mean| + std of its gaussian), the random-walk
  drift over `drift_horizon_s` of running, the white noise and the quantization step.
- qd: velocity noise and velocity quantization (root-sum-square).
- target, target - tool: the task's success tolerance `tolerance_m`: targets closer than that
  are the same target to the task (training always varies these columns far more).
- cmd - q: the encoder error plus the drive's deadband and backlash, by which a real drive at
  rest sits off its set-point (root-sum-square).
- cmd velocity (jerk-limited interface): `COMMAND_RATE_FLOOR_FRACTION` of the resolved
  per-joint velocity limit V. 1 % is what a policy output of 0.1 requests through the
  signed-square action map (a|a|), the level below which the interface reads as at rest.
- cmd acceleration: the acceleration the jerk-limited generator reaches in its first period
  when that 1 % request starts from rest, min(A, J dt, 0.01 V / dt) (task.advance_command): a
  small correction of a real unit's sensor error moves the command at least that hard.
- wrench: F/T bias (|mean| + std) and noise, per force and torque axis (root-sum-square).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.policy.task import RATE_LIMIT_KEYS, TaskConfig

COMMAND_RATE_FLOOR_FRACTION = 0.01


@dataclass(frozen=True)
class SensorTolerance:
    """Largest sensor and drive errors of a real unit (SI units).

    The defaults are the largest magnitudes in the shipped config/randomization.yaml (a test
    keeps them equal); `from_randomization` reads another spec file.
    """

    position_bias_rad: float = 0.002
    position_drift_rad_per_sqrt_s: float = 0.0002
    position_noise_rad: float = 0.0005
    position_quantization_rad: float = 0.0001
    velocity_noise_rad_s: float = 0.01
    velocity_quantization_rad_s: float = 0.001
    deadband_rad: float = 0.0005
    backlash_rad: float = 0.001
    force_bias_n: float = 1.0
    force_noise_n: float = 0.5
    torque_bias_nm: float = 0.05
    torque_noise_nm: float = 0.02
    drift_horizon_s: float = 60.0

    @classmethod
    def from_randomization(cls, path: str | Path | None = None) -> SensorTolerance:
        """Read the terms from a randomization spec (None = the shipped one).

        A term the spec leaves out or switches off keeps its default: the floor is about the
        real unit, which has these errors whether or not a training run randomized them.
        """
        from sim2real_ros.paths import share_path
        from sim2real_ros.sim.randomization import RandomizationSpec

        spec = RandomizationSpec.from_yaml(
            share_path("config", "randomization.yaml") if path is None else path)
        term_of = {
            "position_bias_rad": "joint_position_bias",
            "position_drift_rad_per_sqrt_s": "joint_position_drift",
            "position_noise_rad": "joint_position_noise",
            "position_quantization_rad": "joint_position_quantization",
            "velocity_noise_rad_s": "joint_velocity_noise",
            "velocity_quantization_rad_s": "joint_velocity_quantization",
            "deadband_rad": "deadband",
            "backlash_rad": "backlash",
            "force_bias_n": "ft_force_bias",
            "force_noise_n": "ft_force_noise",
            "torque_bias_nm": "ft_torque_bias",
            "torque_noise_nm": "ft_torque_noise",
        }
        kw: dict[str, Any] = {}
        for key, name in term_of.items():
            term = spec.terms.get(name)
            if term is None:
                continue
            a, b = term.range
            kw[key] = abs(a) + b if term.distribution == "gaussian" else max(abs(a), abs(b))
        return cls(**kw)

    def validate(self) -> None:
        """Raise ValueError for a negative or non-finite tolerance."""
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"sensor tolerance {f.name} = {v!r}: expected a finite "
                                 f"number >= 0")

    @property
    def position_rad(self) -> float:
        """Scale of the encoder's position error, rad (root-sum-square of its terms)."""
        return math.sqrt(self.position_bias_rad ** 2
                         + self.position_drift_rad_per_sqrt_s ** 2 * self.drift_horizon_s
                         + self.position_noise_rad ** 2 + self.position_quantization_rad ** 2)

    @property
    def velocity_rad_s(self) -> float:
        """Scale of the joint velocity error, rad/s."""
        return math.hypot(self.velocity_noise_rad_s, self.velocity_quantization_rad_s)

    @property
    def command_offset_rad(self) -> float:
        """Scale of cmd - q at rest on a real drive, rad (encoder error, deadband, backlash)."""
        return math.sqrt(self.position_rad ** 2 + self.deadband_rad ** 2
                         + self.backlash_rad ** 2)

    @property
    def force_n(self) -> float:
        """Scale of the F/T force error, N."""
        return math.hypot(self.force_bias_n, self.force_noise_n)

    @property
    def torque_nm(self) -> float:
        """Scale of the F/T torque error, N·m."""
        return math.hypot(self.torque_bias_nm, self.torque_noise_nm)


def observation_column_kinds(cfg: TaskConfig, n_joints: int) -> list[str]:
    """Name of each observation column's kind, in the order of task.build_observation."""
    kinds = ["q"] * n_joints + ["qd"] * n_joints + ["target"] * 3 + ["target_minus_tool"] * 3
    kinds += ["cmd_minus_q"] * n_joints
    if cfg.jerk_limited:
        kinds += ["cmd_velocity"] * n_joints + ["cmd_acceleration"] * n_joints
    if cfg.include_wrench:
        kinds += ["force"] * 3 + ["torque"] * 3
    return kinds


def observation_std_floor(
    cfg: TaskConfig, n_joints: int, tolerance: SensorTolerance | None = None
) -> np.ndarray:
    """Return the std floor of every observation column (obs_dim,), in the column's units.

    A jerk-limited task must have its rate limits resolved (task.resolve_rate_limits).
    """
    tol = SensorTolerance() if tolerance is None else tolerance
    tol.validate()
    n = n_joints
    parts = [
        np.full(n, tol.position_rad),
        np.full(n, tol.velocity_rad_s),
        np.full(3, cfg.tolerance_m),
        np.full(3, cfg.tolerance_m),
        np.full(n, tol.command_offset_rad),
    ]
    if cfg.jerk_limited:
        if any(len(getattr(cfg, k)) != n for k in RATE_LIMIT_KEYS):
            raise ValueError(f"jerk-limited task without resolved limits for {n} joints: call "
                             f"resolve_rate_limits(cfg, arm) first")
        dt = cfg.dt_s
        v_floor = COMMAND_RATE_FLOOR_FRACTION * np.asarray(cfg.max_velocity_rad_s, dtype=float)
        a_first = np.minimum(np.asarray(cfg.max_acceleration_rad_s2, dtype=float),
                             np.asarray(cfg.max_jerk_rad_s3, dtype=float) * dt)
        parts.append(v_floor)
        parts.append(np.minimum(a_first, v_floor / dt))
    if cfg.include_wrench:
        parts += [np.full(3, tol.force_n), np.full(3, tol.torque_nm)]
    floor = np.concatenate(parts)
    kinds = observation_column_kinds(cfg, n)
    bad = [i for i, v in enumerate(floor) if not (math.isfinite(v) and v > 0)]
    if bad:
        i = bad[0]
        raise ValueError(f"observation std floor of column {i} ({kinds[i]}) = {floor[i]!r}: "
                         f"expected > 0; give the sensor tolerance a non-zero error scale")
    assert floor.shape == (cfg.obs_dim(n),)
    return floor

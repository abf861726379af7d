"""A proxy "unit": the hidden perturbations that make one proxy arm differ from the nominal URDF.

A unit file (`config/proxy/unit_*.yaml`) plays the part of the physical unit on the bench: its
actual link masses and payload, its joint damping, Coulomb friction and gearbox backlash, its
bus latency and jitter, its drives' torque limits, its encoders' bias, drift and resolution and
its wrist F/T sensor's offset. Only the proxy_arm node reads it; the transfer experiment must
discover these values through the ROS topics, as it would on a real cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.config import ConfigError, file_sha256, load_yaml
from sim2real_ros.robot.model import ArmModel

# Top-level sections and the keys each may hold; anything else is a typo and is refused.
SCHEMA: dict[str, tuple[str, ...]] = {
    "unit_id": (),
    "seed": (),
    "description": (),
    "physics": ("timestep_s", "integrator"),
    "servo": ("bandwidth_hz", "damping_ratio", "integral_time_s", "reference_pose_rad"),
    "mass": ("link_mass_scale", "payload_kg", "payload_offset_m"),
    "joints": (
        "armature_kgm2",
        "damping_nms",
        "friction_nm",
        "backlash_rad",
        "torque_limit_nm",
        "torque_limit_scale",
    ),
    "latency": ("action_latency_s", "action_jitter_s"),
    "encoder": ("bias_rad", "drift_rad_s", "resolution_rad", "noise_std_rad"),
    "ft_sensor": ("bias", "noise_std"),
}
INTEGRATORS = ("implicitfast", "implicit", "rk4", "euler")


@dataclass(frozen=True)
class ProxyUnit:
    """Every hidden property of one proxy unit; per-joint arrays are in URDF joint order."""

    unit_id: str
    seed: int
    joint_names: tuple[str, ...]
    physics_dt_s: float
    integrator: str
    servo_bandwidth_hz: float
    servo_damping_ratio: float
    servo_integral_time_s: float  # 0 disables the drive's integral action
    servo_reference_pose_rad: np.ndarray
    link_mass_scale: float
    payload_kg: float
    payload_offset_m: np.ndarray  # from the tip frame (tool0), in that frame
    armature_kgm2: np.ndarray
    joint_damping_nms: np.ndarray
    joint_friction_nm: np.ndarray
    backlash_rad: np.ndarray
    torque_limit_nm: np.ndarray
    action_latency_s: float
    action_jitter_s: float
    encoder_bias_rad: np.ndarray
    encoder_drift_rad_s: np.ndarray
    encoder_resolution_rad: np.ndarray  # 0 = no quantization
    encoder_noise_std_rad: np.ndarray
    ft_bias: np.ndarray  # (6,) N, N·m
    ft_noise_std: np.ndarray  # (6,)
    source: str = "<nominal>"
    sha256: str = ""
    description: str = field(default="", compare=False)

    @classmethod
    def nominal(cls, arm: ArmModel, unit_id: str = "nominal", seed: int = 0) -> ProxyUnit:
        """Return a unit with the URDF's values and no perturbation (still a real drive loop)."""
        n = arm.n_joints
        urdf_damping = np.array([arm.all_joints[j].damping for j in arm.joint_names])
        urdf_friction = np.array([arm.all_joints[j].friction for j in arm.joint_names])
        return cls(
            unit_id=unit_id,
            seed=seed,
            joint_names=tuple(arm.joint_names),
            physics_dt_s=1e-3,
            integrator="implicitfast",
            servo_bandwidth_hz=6.0,
            servo_damping_ratio=1.0,
            servo_integral_time_s=0.3,
            servo_reference_pose_rad=np.zeros(n),
            link_mass_scale=1.0,
            payload_kg=0.0,
            payload_offset_m=np.zeros(3),
            armature_kgm2=np.zeros(n),
            joint_damping_nms=urdf_damping,
            joint_friction_nm=urdf_friction,
            backlash_rad=np.zeros(n),
            torque_limit_nm=arm.max_effort_nm.copy(),
            action_latency_s=0.0,
            action_jitter_s=0.0,
            encoder_bias_rad=np.zeros(n),
            encoder_drift_rad_s=np.zeros(n),
            encoder_resolution_rad=np.zeros(n),
            encoder_noise_std_rad=np.zeros(n),
            ft_bias=np.zeros(6),
            ft_noise_std=np.zeros(6),
        )

    @classmethod
    def from_yaml(cls, path: str | Path, arm: ArmModel) -> ProxyUnit:
        """Load a unit file; raise ConfigError naming the file, key, value and allowed range."""
        p = Path(path)
        data = load_yaml(p)
        for key, value in data.items():
            if key not in SCHEMA:
                raise ConfigError(p, key, value, f"one of the sections {sorted(SCHEMA)}")
            if SCHEMA[key]:
                if not isinstance(value, dict):
                    raise ConfigError(p, key, value, "a mapping")
                for sub in value:
                    if sub not in SCHEMA[key]:
                        raise ConfigError(p, f"{key}.{sub}", value[sub], f"one of {SCHEMA[key]}")
        base = cls.nominal(arm)
        n = arm.n_joints
        names = arm.joint_names

        def section(name: str) -> dict[str, Any]:
            return dict(data.get(name) or {})

        def num(sec: str, key: str, default: float, low: float, high: float, unit: str) -> float:
            d = section(sec)
            if key not in d:
                return default
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(p, f"{sec}.{key}", v, f"a number in [{low}, {high}] {unit}")
            if not low <= float(v) <= high:
                raise ConfigError(p, f"{sec}.{key}", v, f"a number in [{low}, {high}] {unit}")
            return float(v)

        def per_joint(
            sec: str, key: str, default: np.ndarray, low: float, high: float, unit: str
        ) -> np.ndarray:
            d = section(sec)
            if key not in d:
                return np.array(default, dtype=float)
            v = d[key]
            allowed = (
                f"a number in [{low}, {high}] {unit}, a list of {n} such numbers, "
                f"or a mapping from joint names {names} to such numbers"
            )
            if isinstance(v, dict):
                unknown = [k for k in v if k not in names]
                if unknown:
                    raise ConfigError(p, f"{sec}.{key}.{unknown[0]}", v[unknown[0]], allowed)
                out = np.array(default, dtype=float)
                for j, val in v.items():
                    out[names.index(j)] = _finite(p, f"{sec}.{key}.{j}", val, low, high, allowed)
                return out
            if isinstance(v, list):
                if len(v) != n:
                    raise ConfigError(p, f"{sec}.{key}", v, allowed)
                return np.array(
                    [_finite(p, f"{sec}.{key}[{i}]", x, low, high, allowed)
                     for i, x in enumerate(v)]
                )
            return np.full(n, _finite(p, f"{sec}.{key}", v, low, high, allowed))

        def vector(sec: str, key: str, size: int, default: np.ndarray, bound: float) -> np.ndarray:
            d = section(sec)
            if key not in d:
                return np.array(default, dtype=float)
            v = d[key]
            allowed = f"a list of {size} numbers in [{-bound}, {bound}]"
            if not isinstance(v, list) or len(v) != size:
                raise ConfigError(p, f"{sec}.{key}", v, allowed)
            return np.array(
                [_finite(p, f"{sec}.{key}[{i}]", x, -bound, bound, allowed)
                 for i, x in enumerate(v)]
            )

        unit_id = data.get("unit_id", p.stem)
        if not isinstance(unit_id, str) or not unit_id.strip():
            raise ConfigError(p, "unit_id", unit_id, "a non-empty string")
        seed = data.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(p, "seed", seed, "a non-negative integer")
        integrator = section("physics").get("integrator", base.integrator)
        if integrator not in INTEGRATORS:
            raise ConfigError(p, "physics.integrator", integrator, f"one of {INTEGRATORS}")
        torque = per_joint("joints", "torque_limit_nm", base.torque_limit_nm, 0.1, 1e4, "N·m")
        if "torque_limit_scale" in section("joints"):
            if "torque_limit_nm" in section("joints"):
                raise ConfigError(
                    p, "joints.torque_limit_scale", section("joints")["torque_limit_scale"],
                    "absent when joints.torque_limit_nm is given (one or the other)",
                )
            torque = base.torque_limit_nm * per_joint(
                "joints", "torque_limit_scale", np.ones(n), 0.05, 2.0, ""
            )
        ref = per_joint(
            "servo", "reference_pose_rad", base.servo_reference_pose_rad, -3.2, 3.2, "rad"
        )
        return cls(
            unit_id=unit_id.strip(),
            seed=int(seed),
            joint_names=tuple(names),
            physics_dt_s=num("physics", "timestep_s", base.physics_dt_s, 1e-4, 5e-3, "s"),
            integrator=str(integrator),
            servo_bandwidth_hz=num(
                "servo", "bandwidth_hz", base.servo_bandwidth_hz, 0.5, 30, "Hz"
            ),
            servo_damping_ratio=num(
                "servo", "damping_ratio", base.servo_damping_ratio, 0.2, 3, ""
            ),
            servo_integral_time_s=num(
                "servo", "integral_time_s", base.servo_integral_time_s, 0.0, 100.0, "s"
            ),
            servo_reference_pose_rad=ref,
            link_mass_scale=num("mass", "link_mass_scale", 1.0, 0.3, 3.0, ""),
            payload_kg=num("mass", "payload_kg", 0.0, 0.0, 20.0, "kg"),
            payload_offset_m=vector("mass", "payload_offset_m", 3, np.zeros(3), 0.5),
            armature_kgm2=per_joint(
                "joints", "armature_kgm2", base.armature_kgm2, 0, 10, "kg·m²"
            ),
            joint_damping_nms=per_joint(
                "joints", "damping_nms", base.joint_damping_nms, 0.0, 100.0, "N·m·s/rad"
            ),
            joint_friction_nm=per_joint(
                "joints", "friction_nm", base.joint_friction_nm, 0.0, 100.0, "N·m"
            ),
            backlash_rad=per_joint("joints", "backlash_rad", base.backlash_rad, 0.0, 0.1, "rad"),
            torque_limit_nm=torque,
            action_latency_s=num("latency", "action_latency_s", 0.0, 0.0, 0.5, "s"),
            action_jitter_s=num("latency", "action_jitter_s", 0.0, 0.0, 0.2, "s"),
            encoder_bias_rad=per_joint("encoder", "bias_rad", np.zeros(n), -0.2, 0.2, "rad"),
            encoder_drift_rad_s=per_joint(
                "encoder", "drift_rad_s", np.zeros(n), -1e-2, 1e-2, "rad/s"
            ),
            encoder_resolution_rad=per_joint(
                "encoder", "resolution_rad", np.zeros(n), 0.0, 0.01, "rad"
            ),
            encoder_noise_std_rad=per_joint(
                "encoder", "noise_std_rad", np.zeros(n), 0.0, 0.01, "rad"
            ),
            ft_bias=vector("ft_sensor", "bias", 6, np.zeros(6), 200.0),
            ft_noise_std=np.abs(vector("ft_sensor", "noise_std", 6, np.zeros(6), 50.0)),
            source=str(p),
            sha256=file_sha256(p),
            description=str(data.get("description", "")),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the unit as plain data (the hidden truth, for reports written after a run)."""
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = v.tolist() if isinstance(v, np.ndarray) else (
                list(v) if isinstance(v, tuple) else v
            )
        return out


def _finite(path: Path, key: str, value: Any, low: float, high: float, allowed: str) -> float:
    """Return value as float if it is a finite number in [low, high], else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, key, value, allowed)
    v = float(value)
    if not math.isfinite(v) or not low <= v <= high:
        raise ConfigError(path, key, value, allowed)
    return v

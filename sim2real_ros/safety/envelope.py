"""The safety envelope: operations' limits for one arm, versioned, hashed, checked vs the URDF.

The envelope is its own YAML file (config/safety_envelope.yaml), owned by operations and never by
the training team. Every limit in it must be at least as tight as the URDF's hard limit; a file
that is not refuses to load with an error that names the file, the key, the value and the allowed
range. Each kind of invalid file raises its own ConfigError subclass so tools (and tests) can tell
them apart. The file's SHA-256 travels with every safety event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim2real_ros.config import ConfigError, file_sha256, load_yaml
from sim2real_ros.robot.model import ArmModel

SUPPORTED_VERSIONS = (1,)

# Margins used to derive a default envelope from a URDF (operations tighten from there).
DEFAULT_POSITION_MARGIN_RAD = 0.1
DEFAULT_POSITION_MARGIN_FRACTION = 0.05
DEFAULT_VELOCITY_FRACTION = 0.9
DEFAULT_EFFORT_FRACTION = 0.9
# Time to reach the velocity limit at the acceleration limit, and the acceleration limit at
# the jerk limit: typical of collaborative arms' default motion profiles.
DEFAULT_RAMP_TO_VELOCITY_S = 0.25
DEFAULT_RAMP_TO_ACCELERATION_S = 0.1
DEFAULT_TOOL_SPEED_M_S = 1.0
DEFAULT_LIMITED_SCALE = 0.5
# ISO/TS 15066 puts transient contact limits for the hand around 140 N; the wrist sensor trips
# the e-stop there. The commanded wrench a policy may ask for is far below.
DEFAULT_MEASURED_FORCE_N = 140.0
DEFAULT_MEASURED_TORQUE_NM = 15.0
DEFAULT_COMMANDED_FORCE_N = 50.0
DEFAULT_COMMANDED_TORQUE_NM = 5.0

JOINT_KEYS = (
    "position_rad",
    "velocity_rad_s",
    "acceleration_rad_s2",
    "jerk_rad_s3",
    "effort_nm",
)
TOP_KEYS = ("version", "name", "robot", "joints", "workspace", "force", "stages")
WORKSPACE_KEYS = ("tool_link", "box_min_m", "box_max_m", "max_tool_speed_m_s")
FORCE_KEYS = ("measured", "commanded")
FORCE_GROUP_KEYS = ("max_force_n", "max_torque_nm", "max_force_per_axis_n",
                    "max_torque_per_axis_nm")
STAGE_KEYS = ("limited_scale",)


class EnvelopeError(ConfigError):
    """Base of every invalid-envelope error (each kind below has its own class)."""


class EnvelopeVersionError(EnvelopeError):
    """The version field is missing or not a version this code understands."""


class EnvelopeMissingKeyError(EnvelopeError):
    """A required section or limit is absent."""


class EnvelopeMissingJointError(EnvelopeError):
    """A joint of the arm has no limits in the envelope."""


class EnvelopeUnknownKeyError(EnvelopeError):
    """A key (or joint name) the envelope format does not know: a typo must not pass silently."""


class EnvelopeShapeError(EnvelopeError):
    """A value has the wrong type or length (a scalar for a range, 2 numbers for a box corner)."""


class EnvelopeNonFiniteError(EnvelopeError):
    """A limit is NaN or infinite."""


class EnvelopeMinMaxError(EnvelopeError):
    """A range whose minimum exceeds its maximum."""


class EnvelopeNonPositiveError(EnvelopeError):
    """A rate, effort, force or scale that must be positive is zero or negative."""


class EnvelopeLooserThanUrdfError(EnvelopeError):
    """A limit is looser than the URDF's hard limit for the same joint."""


class EnvelopeRobotError(EnvelopeError):
    """The envelope was written for another robot (name or tool link differ from the URDF)."""


@dataclass(frozen=True)
class JointEnvelope:
    """Operations' limits for one joint (SI units)."""

    name: str
    lower_rad: float
    upper_rad: float
    velocity_rad_s: float
    acceleration_rad_s2: float
    jerk_rad_s3: float
    effort_nm: float


@dataclass(frozen=True)
class ForceLimits:
    """Norm and per-axis limits on a wrench (N, N·m)."""

    max_force_n: float
    max_torque_nm: float
    max_force_per_axis_n: tuple[float, float, float]
    max_torque_per_axis_nm: tuple[float, float, float]


@dataclass(frozen=True)
class Envelope:
    """A validated safety envelope for one arm."""

    path: Path
    sha256: str
    version: int
    name: str
    robot: str
    joints: tuple[JointEnvelope, ...]
    tool_link: str
    box_min_m: tuple[float, float, float]
    box_max_m: tuple[float, float, float]
    max_tool_speed_m_s: float
    measured: ForceLimits
    commanded: ForceLimits
    limited_scale: float

    @property
    def joint_names(self) -> list[str]:
        """Joint names in the arm's chain order."""
        return [j.name for j in self.joints]

    def joint(self, name: str) -> JointEnvelope:
        """Return the limits of one joint by name."""
        for j in self.joints:
            if j.name == name:
                return j
        raise KeyError(f"no joint {name!r} in envelope {self.path}")


def derive_envelope_dict(arm: ArmModel, tool_speed_m_s: float = DEFAULT_TOOL_SPEED_M_S
                         ) -> dict[str, Any]:
    """Return a default envelope (as YAML data) derived from the arm's URDF limits with margins."""
    joints: dict[str, Any] = {}
    for name, lim in zip(arm.joint_names, arm.limits):
        if math.isfinite(lim.lower) and math.isfinite(lim.upper):
            margin = min(DEFAULT_POSITION_MARGIN_RAD,
                         DEFAULT_POSITION_MARGIN_FRACTION * (lim.upper - lim.lower))
            lo, hi = lim.lower + margin, lim.upper - margin
        else:
            # A continuous joint still gets a finite envelope: two turns either way.
            lo, hi = -4.0 * math.pi, 4.0 * math.pi
        vel = DEFAULT_VELOCITY_FRACTION * lim.velocity
        acc = vel / DEFAULT_RAMP_TO_VELOCITY_S
        # Rounded inwards so a derived limit is never looser than the URDF's.
        joints[name] = {
            "position_rad": [_up(lo), _down(hi)],
            "velocity_rad_s": _down(vel),
            "acceleration_rad_s2": _down(acc),
            "jerk_rad_s3": _down(acc / DEFAULT_RAMP_TO_ACCELERATION_S),
            "effort_nm": _down(DEFAULT_EFFORT_FRACTION * lim.effort),
        }
    reach = _reach_m(arm)
    base_z = float(arm.chain[0].origin[2, 3]) if arm.chain else 0.0
    return {
        "version": 1,
        "name": f"{arm.name} default envelope (URDF limits with margins)",
        "robot": arm.name,
        "joints": joints,
        "workspace": {
            "tool_link": arm.tip_link,
            "box_min_m": [_r(-0.9 * reach), _r(-0.9 * reach), _r(max(0.05, 0.5 * base_z))],
            "box_max_m": [_r(0.9 * reach), _r(0.9 * reach), _r(base_z + reach + 0.05)],
            "max_tool_speed_m_s": tool_speed_m_s,
        },
        "force": {
            "measured": {
                "max_force_n": DEFAULT_MEASURED_FORCE_N,
                "max_torque_nm": DEFAULT_MEASURED_TORQUE_NM,
                "max_force_per_axis_n": [DEFAULT_MEASURED_FORCE_N] * 3,
                "max_torque_per_axis_nm": [DEFAULT_MEASURED_TORQUE_NM] * 3,
            },
            "commanded": {
                "max_force_n": DEFAULT_COMMANDED_FORCE_N,
                "max_torque_nm": DEFAULT_COMMANDED_TORQUE_NM,
                "max_force_per_axis_n": [DEFAULT_COMMANDED_FORCE_N] * 3,
                "max_torque_per_axis_nm": [DEFAULT_COMMANDED_TORQUE_NM] * 3,
            },
        },
        "stages": {"limited_scale": DEFAULT_LIMITED_SCALE},
    }


def write_derived_envelope(arm: ArmModel, path: str | Path, header: str = "") -> Path:
    """Write a URDF-derived default envelope to `path` and return it."""
    p = Path(path)
    text = yaml.safe_dump(derive_envelope_dict(arm), sort_keys=False, default_flow_style=None)
    p.write_text((header.rstrip() + "\n" if header else "") + text)
    return p


def load_envelope(path: str | Path, arm: ArmModel) -> Envelope:
    """Read and validate an envelope file against the arm; raise an EnvelopeError on any fault."""
    p = Path(path)
    data = load_yaml(p)
    _known(data, TOP_KEYS, p, "")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise EnvelopeVersionError(p, "version", version,
                                   f"an integer version in {list(SUPPORTED_VERSIONS)}")
    if version not in SUPPORTED_VERSIONS:
        raise EnvelopeVersionError(p, "version", version, f"one of {list(SUPPORTED_VERSIONS)}")
    name = data.get("name", "")
    if not isinstance(name, str):
        raise EnvelopeShapeError(p, "name", name, "a string")
    robot = data.get("robot", arm.name)
    if not isinstance(robot, str):
        raise EnvelopeShapeError(p, "robot", robot, "a string")
    if robot != arm.name:
        raise EnvelopeRobotError(p, "robot", robot, f"the URDF's robot name {arm.name!r}")

    joints_data = _section(data, "joints", p, "")
    unknown = [n for n in joints_data if n not in arm.joint_names]
    if unknown:
        raise EnvelopeUnknownKeyError(p, f"joints.{unknown[0]}", unknown[0],
                                      f"a joint of the arm: {arm.joint_names}")
    joints = []
    for jname, lim in zip(arm.joint_names, arm.limits):
        if jname not in joints_data:
            raise EnvelopeMissingJointError(p, f"joints.{jname}", None,
                                            f"limits for every arm joint {arm.joint_names}")
        joints.append(_joint(joints_data, jname, lim, p))

    ws = _section(data, "workspace", p, "")
    _known(ws, WORKSPACE_KEYS, p, "workspace.")
    tool_link = ws.get("tool_link", arm.tip_link)
    if tool_link != arm.tip_link:
        raise EnvelopeRobotError(p, "workspace.tool_link", tool_link,
                                      f"the arm model's tip link {arm.tip_link!r}")
    box_min = _vector(ws, "box_min_m", 3, p, "workspace.")
    box_max = _vector(ws, "box_max_m", 3, p, "workspace.")
    for axis, lo, hi in zip("xyz", box_min, box_max):
        if lo >= hi:
            raise EnvelopeMinMaxError(p, f"workspace.box_min_m[{axis}]", lo,
                                      f"< box_max_m[{axis}] ({hi})")
    tool_speed = _positive(ws, "max_tool_speed_m_s", p, "workspace.")

    force = _section(data, "force", p, "")
    _known(force, FORCE_KEYS, p, "force.")
    measured = _force(force, "measured", p)
    commanded = _force(force, "commanded", p)
    # A policy must not be allowed to command a wrench that trips the e-stop by itself.
    for field in ("max_force_n", "max_torque_nm"):
        c, m = getattr(commanded, field), getattr(measured, field)
        if c > m:
            raise EnvelopeMinMaxError(p, f"force.commanded.{field}", c,
                                      f"<= force.measured.{field} ({m})")

    stages = _section(data, "stages", p, "")
    _known(stages, STAGE_KEYS, p, "stages.")
    scale = _positive(stages, "limited_scale", p, "stages.")
    if scale > 1.0:
        raise EnvelopeLooserThanUrdfError(p, "stages.limited_scale", scale,
                                          "a scale in (0, 1] (limited is never looser than full)")
    return Envelope(
        path=p,
        sha256=file_sha256(p),
        version=version,
        name=name,
        robot=robot,
        joints=tuple(joints),
        tool_link=tool_link,
        box_min_m=box_min,  # type: ignore[arg-type]
        box_max_m=box_max,  # type: ignore[arg-type]
        max_tool_speed_m_s=tool_speed,
        measured=measured,
        commanded=commanded,
        limited_scale=scale,
    )


def _r(x: float) -> float:
    return float(round(x, 4))


def _down(x: float) -> float:
    return math.floor(x * 1e4 + 1e-6) / 1e4


def _up(x: float) -> float:
    return math.ceil(x * 1e4 - 1e-6) / 1e4


def _reach_m(arm: ArmModel) -> float:
    """Upper bound of the tip's distance from the first joint: the sum of link offsets."""
    import numpy as np

    return float(sum(np.linalg.norm(j.origin[:3, 3]) for j in arm.chain[1:]))


def _known(data: dict[str, Any], keys: tuple[str, ...], path: Path, prefix: str) -> None:
    for k in data:
        if k not in keys:
            raise EnvelopeUnknownKeyError(path, f"{prefix}{k}", data[k], f"one of {list(keys)}")


def _section(data: dict[str, Any], key: str, path: Path, prefix: str) -> dict[str, Any]:
    if key not in data:
        raise EnvelopeMissingKeyError(path, f"{prefix}{key}", None, "a mapping (key missing)")
    value = data[key]
    if not isinstance(value, dict):
        raise EnvelopeShapeError(path, f"{prefix}{key}", value, "a mapping")
    return value


def _number(data: dict[str, Any], key: str, path: Path, prefix: str) -> float:
    if key not in data:
        raise EnvelopeMissingKeyError(path, f"{prefix}{key}", None, "a number (key missing)")
    return _as_float(data[key], path, f"{prefix}{key}")


def _as_float(value: Any, path: Path, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EnvelopeShapeError(path, key, value, "a number")
    v = float(value)
    if not math.isfinite(v):
        raise EnvelopeNonFiniteError(path, key, value, "a finite number")
    return v


def _positive(data: dict[str, Any], key: str, path: Path, prefix: str) -> float:
    v = _number(data, key, path, prefix)
    if v <= 0.0:
        raise EnvelopeNonPositiveError(path, f"{prefix}{key}", v, "a number > 0")
    return v


def _vector(data: dict[str, Any], key: str, n: int, path: Path, prefix: str
            ) -> tuple[float, ...]:
    if key not in data:
        raise EnvelopeMissingKeyError(path, f"{prefix}{key}", None,
                                      f"a list of {n} numbers (key missing)")
    value = data[key]
    if not isinstance(value, list) or len(value) != n:
        raise EnvelopeShapeError(path, f"{prefix}{key}", value, f"a list of {n} numbers")
    return tuple(_as_float(v, path, f"{prefix}{key}[{i}]") for i, v in enumerate(value))


def _joint(joints: dict[str, Any], name: str, lim: Any, path: Path) -> JointEnvelope:
    prefix = f"joints.{name}."
    data = joints[name]
    if not isinstance(data, dict):
        raise EnvelopeShapeError(path, f"joints.{name}", data,
                                 f"a mapping with {list(JOINT_KEYS)}")
    _known(data, JOINT_KEYS, path, prefix)
    lo, hi = _vector(data, "position_rad", 2, path, prefix)
    if lo > hi:
        raise EnvelopeMinMaxError(path, f"{prefix}position_rad", [lo, hi],
                                  f"[min, max] with min <= max (min {lo} > max {hi})")
    if lo < lim.lower:
        raise EnvelopeLooserThanUrdfError(path, f"{prefix}position_rad[0]", lo,
                                          f">= the URDF lower limit {lim.lower}")
    if hi > lim.upper:
        raise EnvelopeLooserThanUrdfError(path, f"{prefix}position_rad[1]", hi,
                                          f"<= the URDF upper limit {lim.upper}")
    vel = _positive(data, "velocity_rad_s", path, prefix)
    if vel > lim.velocity:
        raise EnvelopeLooserThanUrdfError(path, f"{prefix}velocity_rad_s", vel,
                                          f"(0, {lim.velocity}] (the URDF velocity limit)")
    acc = _positive(data, "acceleration_rad_s2", path, prefix)
    jerk = _positive(data, "jerk_rad_s3", path, prefix)
    effort = _positive(data, "effort_nm", path, prefix)
    if effort > lim.effort:
        raise EnvelopeLooserThanUrdfError(path, f"{prefix}effort_nm", effort,
                                          f"(0, {lim.effort}] (the URDF effort limit)")
    return JointEnvelope(name, lo, hi, vel, acc, jerk, effort)


def _force(force: dict[str, Any], key: str, path: Path) -> ForceLimits:
    group = _section(force, key, path, "force.")
    prefix = f"force.{key}."
    _known(group, FORCE_GROUP_KEYS, path, prefix)
    fn = _positive(group, "max_force_n", path, prefix)
    tn = _positive(group, "max_torque_nm", path, prefix)
    fa = _vector(group, "max_force_per_axis_n", 3, path, prefix)
    ta = _vector(group, "max_torque_per_axis_nm", 3, path, prefix)
    for label, vec in (("max_force_per_axis_n", fa), ("max_torque_per_axis_nm", ta)):
        for i, v in enumerate(vec):
            if v <= 0.0:
                raise EnvelopeNonPositiveError(path, f"{prefix}{label}[{i}]", v, "a number > 0")
    return ForceLimits(fn, tn, fa, ta)  # type: ignore[arg-type]

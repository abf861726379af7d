"""The physical arm in PyBullet (DIRECT mode): rigid-body dynamics, joint servo, friction, F/T.

No randomization logic and no rclpy here: the plant is the deterministic physics that the
randomizer perturbs (through PlantParams) and that system identification fits.

Modelling choices (see docs/sim.md for the reasoning):
- Joint servo in position mode: a PD on torque computed by us every physics step, with per-joint
  gains scheduled from the inertia each joint of the nominal arm sees with the others free,
  m_j = 1/(M(q)⁻¹)_jj (kp = m_j·ωn², kd = 2ζ·m_j·ωn, refreshed every `GAIN_UPDATE_STEPS`
  steps), in cascade form so the velocity set-point is clamped at the URDF velocity limit
  (large steps do not wind up), saturated at the URDF effort limit × torque_limit_scale. No
  gravity feed-forward and no integral action, as in a plain drive position loop, so payload
  and mass show up as tracking error and holding torque. The applied
  (saturated) motor torque is what `PlantState.tau_nm` reports.
- Viscous damping: -b·q̇ per joint. It and the servo's kd are explicit, exact while
  c = (kd + b)·dt/M_jj <= 0.5 on the actual inertia (with the default armature every joint of
  the shipped arm is below 0.2); above that both are scaled by 1/(1 + c - 0.5), so a light link
  with a large damping, or a drive tuned for more inertia than it drives, never flips sign.
- Coulomb friction: PyBullet's velocity motor with zero target velocity and maximum force equal to
  the friction torque; it is solved as a constraint, so stiction holds exactly and sliding
  friction is ±F_c without chattering.
- Armature (reflected rotor inertia): URDF cannot state it; it is added to the child link's
  inertia about the joint axis (exact for the joint itself, a small over-count for other joints
  whose axes are parallel to it).
- Mass, inertia, centre-of-mass offsets and the payload are written into a modified copy of the
  URDF, which is (re)loaded when they change; everything else is applied live.
- F/T sensor: PyBullet's joint reaction at the fixed sensor joint, converted into the wrench the
  tool side exerts on the arm side, about the sensor frame origin, in the sensor frame; tool
  gravity is included as on a real uncompensated sensor.
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pybullet as pb

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import ArmModel, load_arm
from sim2real_ros.sim import _pbnative

try:  # the C step loop (sim/_servo.c); the Python loop below is its reference and fallback
    from sim2real_ros.sim import _servo as _native  # type: ignore[attr-defined]

    _native.bind(_pbnative.pybullet_path())
except (ImportError, OSError):
    _native = None
NATIVE_AVAILABLE = _native is not None and _pbnative.client_handle_findable()
FORCE_PYTHON_ENV = "SIM2REAL_SIM_PYTHON"

CONTROL_MODES = ("position", "velocity", "effort")
GAIN_UPDATE_STEPS = 10  # inertia changes slowly; refreshing gains every 10 ms is plenty
DEFAULT_ARMATURE_KGM2 = 0.01
DEFAULT_FT_JOINT = "ft_sensor_joint"

_ARRAY_FIELDS = (
    "joint_damping_nms",
    "joint_friction_nm",
    "armature_kgm2",
    "kp_scale",
    "kd_scale",
    "torque_limit_scale",
    "motor_lag_s",
    "gravity",
    "payload_offset_m",
    "com_offset_m",
)


@dataclass
class PlantParams:
    """Physical and actuator parameters of the plant; per-joint arrays have one value a joint."""

    mass_scale: float = 1.0  # scales every link mass and inertia
    inertia_scale: float = 1.0  # extra scale on link inertias
    payload_kg: float = 0.0  # point mass added at the tip frame (tool0) + payload_offset_m
    payload_offset_m: np.ndarray = field(default_factory=lambda: np.zeros(3))  # in tip frame
    com_offset_m: np.ndarray | None = None  # (n, 3): shift of each moving link's COM, link frame
    joint_damping_nms: np.ndarray | None = None  # N·m·s/rad viscous; None -> URDF value
    joint_friction_nm: np.ndarray | None = None  # Coulomb, N·m; None -> URDF value
    armature_kgm2: np.ndarray | float | None = None  # reflected rotor inertia; None -> default
    kp_scale: np.ndarray | float = 1.0  # position-gain scale of the joint servo
    kd_scale: np.ndarray | float = 1.0  # velocity-gain scale of the joint servo
    torque_limit_scale: np.ndarray | float = 1.0  # multiplies URDF effort limits
    motor_lag_s: np.ndarray | float = 0.0  # first-order lag of motor torque (current loop)
    servo_bandwidth_hz: float = 20.0  # natural frequency of the position loop
    servo_damping_ratio: float = 1.0
    gravity: np.ndarray = field(default_factory=lambda: np.array([0.0, 0.0, -9.81]))  # m/s²
    lateral_friction: float = 0.8  # contact friction coefficients of every link and object
    spinning_friction: float = 0.0
    rolling_friction: float = 0.0
    restitution: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON/YAML-ready dict (arrays as lists, None kept)."""
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            if isinstance(v, np.ndarray):
                out[k] = v.tolist()
            elif isinstance(v, (np.floating, np.integer)):
                out[k] = v.item()
            else:
                out[k] = v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str | Path | None = None) -> PlantParams:
        """Build params from a dict of field names; unknown names raise ConfigError."""
        names = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                raise ConfigError(path, key, value, f"a PlantParams field, one of {sorted(names)}")
            if value is None:
                kwargs[key] = None
                continue
            try:
                if key in _ARRAY_FIELDS and isinstance(value, (list, tuple, np.ndarray)):
                    arr = np.asarray(value, dtype=float)
                    if not np.all(np.isfinite(arr)):
                        raise ValueError
                    kwargs[key] = arr
                else:
                    num = float(value)
                    if not math.isfinite(num) or isinstance(value, bool):
                        raise ValueError
                    kwargs[key] = num
            except (TypeError, ValueError):
                raise ConfigError(path, key, value, "finite number(s)") from None
        return cls(**kwargs)

    def copy(self) -> PlantParams:
        """Return a deep copy."""
        return PlantParams.from_dict(self.to_dict())


@dataclass
class PlantState:
    """What the plant's sensors would read if they were perfect."""

    t_s: float
    q: np.ndarray
    qd: np.ndarray
    tau_nm: np.ndarray  # motor torque applied over the last step (what joint_states.effort says)
    wrench: np.ndarray  # (6,) [fx fy fz tx ty tz] at the F/T joint, sensor frame; zeros if none


def _per_joint(value: Any, n: int, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        return np.full(n, float(arr))
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected a scalar or {n} values, got shape {arr.shape}")
    return arr.copy()


def resolve_params(params: PlantParams, arm: ArmModel) -> PlantParams:
    """Return a copy with None replaced by URDF/default values and per-joint arrays expanded."""
    p = params.copy()
    n = arm.n_joints
    urdf_damping = np.array([arm.all_joints[j].damping for j in arm.joint_names])
    urdf_friction = np.array([arm.all_joints[j].friction for j in arm.joint_names])
    p.joint_damping_nms = _per_joint(
        urdf_damping if p.joint_damping_nms is None else p.joint_damping_nms,
        n,
        "joint_damping_nms",
    )
    p.joint_friction_nm = _per_joint(
        urdf_friction if p.joint_friction_nm is None else p.joint_friction_nm,
        n,
        "joint_friction_nm",
    )
    p.armature_kgm2 = _per_joint(
        DEFAULT_ARMATURE_KGM2 if p.armature_kgm2 is None else p.armature_kgm2, n, "armature_kgm2"
    )
    p.kp_scale = _per_joint(p.kp_scale, n, "kp_scale")
    p.kd_scale = _per_joint(p.kd_scale, n, "kd_scale")
    p.torque_limit_scale = _per_joint(p.torque_limit_scale, n, "torque_limit_scale")
    p.motor_lag_s = _per_joint(p.motor_lag_s, n, "motor_lag_s")
    p.com_offset_m = (
        np.zeros((n, 3)) if p.com_offset_m is None else np.asarray(p.com_offset_m, dtype=float)
    )
    if p.com_offset_m.shape != (n, 3):
        raise ValueError(f"com_offset_m: expected shape ({n}, 3), got {p.com_offset_m.shape}")
    p.gravity = np.asarray(p.gravity, dtype=float)
    p.payload_offset_m = np.asarray(p.payload_offset_m, dtype=float)
    return p


def _inv_diag(m: list[float], n: int) -> list[float] | None:
    """Diagonal of the inverse of an n x n row-major matrix; None when it is singular.

    Gauss-Jordan elimination with partial pivoting (the first largest |pivot|), written out so
    that the C step loop (sim/_servo.c, `inv_diag`) performs exactly the same operations: both
    backends then compute the same servo gains to the last bit.
    """
    a = [[float(m[i * n + j]) for j in range(n)] + [1.0 if i == j else 0.0 for j in range(n)]
         for i in range(n)]
    w = 2 * n
    for col in range(n):
        piv, best = col, abs(a[col][col])
        for r in range(col + 1, n):
            v = abs(a[r][col])
            if v > best:
                best, piv = v, r
        if a[piv][col] == 0.0:
            return None
        if piv != col:
            a[col], a[piv] = a[piv], a[col]
        row = a[col]
        p = row[col]
        for j in range(w):
            row[j] = row[j] / p
        for r in range(n):
            if r == col:
                continue
            other = a[r]
            f = other[col]
            if f != 0.0:
                for j in range(w):
                    other[j] = other[j] - f * row[j]
    return [a[i][n + i] for i in range(n)]


class ArmPlant:
    """One arm in its own PyBullet DIRECT client, stepped at a fixed physics rate."""

    def __init__(
        self,
        urdf_path: str | Path | None = None,
        physics_dt_s: float = 1e-3,
        params: PlantParams | None = None,
        ft_joint: str = DEFAULT_FT_JOINT,
        ground_plane: bool = False,
        native: bool | None = None,
    ) -> None:
        if not (1e-5 <= physics_dt_s <= 0.01):
            raise ValueError(f"physics_dt_s = {physics_dt_s}: expected a value in [1e-5, 0.01] s")
        self.urdf_path = Path(urdf_path) if urdf_path is not None else default_urdf()
        self.arm: ArmModel = load_arm(self.urdf_path)
        self.joint_names: list[str] = list(self.arm.joint_names)
        self.n = self.arm.n_joints
        self.physics_dt_s = float(physics_dt_s)
        self._ft_joint_name = ft_joint if ft_joint in self.arm.all_joints else None
        self._ground_plane = ground_plane
        self._client = pb.connect(pb.DIRECT)
        self._tmpdir = tempfile.TemporaryDirectory(prefix="sim2real_plant_")
        self._urdf_xml = ET.parse(self.urdf_path)
        self._body = -1
        self._plane = -1
        self._loaded_key: tuple[Any, ...] | None = None
        self._load_count = 0
        self._hist_len = 0
        self._t_s = 0.0
        self._steps = 0
        self._mode = "position"
        self._target = np.zeros(self.n)
        self._target_l = [0.0] * self.n
        self._tau: list[float] = [0.0] * self.n
        self._q = np.zeros(self.n)
        self._qd = np.zeros(self.n)
        # The step loop: C (sim/_servo.c) when it is built and the client handles check out,
        # else Python. native=None picks C unless SIM2REAL_SIM_PYTHON=1; both give the same
        # trajectory bit for bit (test/test_sim_native.py). The C loop refreshes the gains
        # itself, so it runs arms whose movable joints are all chain joints; an arm with others
        # (a gripper) runs the Python loop.
        if native is None:
            native = os.environ.get(FORCE_PYTHON_ENV, "") in ("", "0")
        self._want_native = bool(native) and NATIVE_AVAILABLE
        self._servo: Any = None
        self._hbuf: tuple[np.ndarray, ...] | None = None
        # A second, never-stepped client holds the nominal arm whose inertia sets servo gains.
        self._nc = pb.connect(pb.DIRECT)
        pb.setPhysicsEngineParameter(enableFileCaching=0, physicsClientId=self._nc)
        nominal = self.resolved_params(PlantParams())
        self._nominal_body = pb.loadURDF(
            str(self._modified_urdf(nominal, "nominal")),
            useFixedBase=True,
            flags=pb.URDF_USE_INERTIA_FROM_FILE,
            physicsClientId=self._nc,
        )
        self.params = PlantParams()
        self.set_params(params or PlantParams())
        self.reset()

    # ----------------------------------------------------------------- parameters
    @property
    def urdf_damping_nms(self) -> np.ndarray:
        """Viscous damping from the URDF <dynamics damping>, N·m·s/rad."""
        return np.array([self.arm.all_joints[n].damping for n in self.joint_names])

    @property
    def urdf_friction_nm(self) -> np.ndarray:
        """Coulomb friction from the URDF <dynamics friction>, N·m."""
        return np.array([self.arm.all_joints[n].friction for n in self.joint_names])

    def resolved_params(self, params: PlantParams | None = None) -> PlantParams:
        """Return params with every None replaced by the value the plant actually uses."""
        p = resolve_params(params or self.params, self.arm)
        self._validate(p)
        return p

    def _validate(self, p: PlantParams) -> None:
        n = self.n
        checks = [
            ("mass_scale", p.mass_scale > 0),
            ("inertia_scale", p.inertia_scale > 0),
            ("payload_kg", p.payload_kg >= 0),
            ("servo_bandwidth_hz", 0 < p.servo_bandwidth_hz <= 0.1 / self.physics_dt_s),
            ("servo_damping_ratio", p.servo_damping_ratio > 0),
            ("joint_damping_nms", bool(np.all(p.joint_damping_nms >= 0))),
            ("joint_friction_nm", bool(np.all(p.joint_friction_nm >= 0))),
            ("armature_kgm2", bool(np.all(p.armature_kgm2 >= 0))),
            ("kp_scale", bool(np.all(p.kp_scale >= 0))),
            ("kd_scale", bool(np.all(p.kd_scale >= 0))),
            ("torque_limit_scale", bool(np.all(p.torque_limit_scale >= 0))),
            ("motor_lag_s", bool(np.all(p.motor_lag_s >= 0))),
            ("gravity", p.gravity.shape == (3,)),
            ("payload_offset_m", p.payload_offset_m.shape == (3,)),
            ("com_offset_m", p.com_offset_m.shape == (n, 3)),
            ("lateral_friction", p.lateral_friction >= 0),
            ("spinning_friction", p.spinning_friction >= 0),
            ("rolling_friction", p.rolling_friction >= 0),
            ("restitution", 0 <= p.restitution <= 1),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(
                    f"PlantParams.{name} = {getattr(p, name)!r} is out of range "
                    "(positive scales, non-negative coefficients, per-joint arrays of "
                    f"{n}, servo bandwidth <= {0.1 / self.physics_dt_s:g} Hz)"
                )

    def set_params(self, params: PlantParams) -> None:
        """Apply new parameters; inertial changes reload the arm and keep its joint state."""
        p = self.resolved_params(params)
        key = (
            p.mass_scale,
            p.inertia_scale,
            p.payload_kg,
            tuple(p.payload_offset_m.round(12)),
            tuple(p.com_offset_m.ravel().round(12)),
            tuple(p.armature_kgm2.round(12)),
        )
        if key != self._loaded_key:
            # Reload at the arm's true current state (not the last one a sensor read).
            q, qd = self._true_state() if self._body >= 0 else (None, None)
            self._load(p)
            self._loaded_key = key
            if q is not None:
                self._write_joint_state(q, qd)
        self.params = p
        c = self._client
        pb.setGravity(*p.gravity.tolist(), physicsClientId=c)
        self._damping = p.joint_damping_nms.copy()
        self._effort_limit = self.arm.max_effort_nm * p.torque_limit_scale
        self._effort_limit = np.where(np.isfinite(self._effort_limit), self._effort_limit, 1e9)
        lag = p.motor_lag_s
        self._lag_alpha = np.where(
            lag > 0, 1.0 - np.exp(-self.physics_dt_s / np.maximum(lag, 1e-12)), 1.0
        )
        self._lagged = bool(np.any(lag > 0))
        self._lag_l = self._lag_alpha.tolist()
        self._lim_l = self._effort_limit.tolist()
        vmax = self.arm.max_velocity_rad_s
        self._vmax_l = np.where(np.isfinite(vmax) & (vmax > 0), vmax, 1e9).tolist()
        omega = 2.0 * math.pi * p.servo_bandwidth_hz
        self._kp_per_inertia = omega**2 * p.kp_scale
        self._kd_per_inertia = 2.0 * p.servo_damping_ratio * omega * p.kd_scale
        if self._servo is not None:
            self._servo.set_limits(self._lim_l, self._lag_l, self._vmax_l, self._lagged)
            self._set_gain_model()
            self._servo.set_command(CONTROL_MODES.index(self._mode), self._target_l)
        # Coulomb friction: a velocity motor that wants zero speed with at most F_c of torque.
        pb.setJointMotorControlArray(
            self._body,
            self._idx,
            pb.VELOCITY_CONTROL,
            targetVelocities=[0.0] * self.n,
            forces=p.joint_friction_nm.tolist(),
            physicsClientId=c,
        )
        for link in range(-1, pb.getNumJoints(self._body, physicsClientId=c)):
            pb.changeDynamics(
                self._body,
                link,
                lateralFriction=p.lateral_friction,
                spinningFriction=p.spinning_friction,
                rollingFriction=p.rolling_friction,
                restitution=p.restitution,
                physicsClientId=c,
            )
        if self._plane >= 0:
            pb.changeDynamics(
                self._plane,
                -1,
                lateralFriction=p.lateral_friction,
                spinningFriction=p.spinning_friction,
                rollingFriction=p.rolling_friction,
                restitution=p.restitution,
                physicsClientId=c,
            )
        self._update_gains()

    # ----------------------------------------------------------------- loading
    def _modified_urdf(self, p: PlantParams, label: str = "plant") -> Path:
        """Write the URDF with scaled inertials, COM offsets, armature and payload."""
        root = ET.fromstring(ET.tostring(self._urdf_xml.getroot()))
        base_dir = self.urdf_path.resolve().parent
        for mesh in root.iter("mesh"):
            fn = mesh.get("filename", "")
            if fn and "://" not in fn and not Path(fn).is_absolute():
                mesh.set("filename", str(base_dir / fn))
        links = {el.get("name"): el for el in root.findall("link")}
        child_of_joint = {n: self.arm.all_joints[n].child for n in self.joint_names}
        axis_of_joint = {n: self.arm.all_joints[n].axis for n in self.joint_names}
        moving = {child_of_joint[n]: i for i, n in enumerate(self.joint_names)}
        # The payload hangs on the deepest link of the chain that has mass (tool_link for ours).
        payload_link, payload_xyz = self._payload_anchor(p.payload_offset_m)
        for name, el in links.items():
            inertial = el.find("inertial")
            if inertial is None:
                # PyBullet gives a link without <inertial> 1 kg and 1 kg·m²; a massless frame
                # (tool0) must stay massless.
                inertial = ET.SubElement(el, "inertial")
                ET.SubElement(inertial, "origin", xyz="0 0 0", rpy="0 0 0")
                ET.SubElement(inertial, "mass", value="0")
                ET.SubElement(
                    inertial, "inertia", ixx="0", ixy="0", ixz="0", iyy="0", iyz="0", izz="0"
                )
            org = inertial.find("origin")
            if org is None:
                org = ET.SubElement(inertial, "origin", xyz="0 0 0", rpy="0 0 0")
            mass_el = inertial.find("mass")
            if mass_el is None:
                mass_el = ET.SubElement(inertial, "mass", value="0")
            ine = inertial.find("inertia")
            if ine is None:
                ine = ET.SubElement(inertial, "inertia")
            info = self.arm.inertials.get(name)
            mass = (info.mass_kg if info else 0.0) * p.mass_scale
            com = info.com_xyz_m.copy() if info else np.zeros(3)
            inertia = (info.inertia.copy() if info else np.zeros((3, 3))) * (
                p.mass_scale * p.inertia_scale
            )
            if name in moving:
                i = moving[name]
                com = com + p.com_offset_m[i]
                a = axis_of_joint[self.joint_names[i]]
                # A thin disc of axial inertia A (transverse A/2) keeps the tensor physical
                # (PyBullet zeroes tensors that break the triangle inequality).
                arm_a = p.armature_kgm2[i]
                axial = np.outer(a, a)
                inertia = inertia + arm_a * axial + 0.5 * arm_a * (np.eye(3) - axial)
            if name == payload_link and p.payload_kg > 0:
                # Lump the point mass into this link: new COM and parallel-axis inertia.
                m_tot = mass + p.payload_kg
                new_com = (mass * com + p.payload_kg * payload_xyz) / m_tot
                d1, d2 = com - new_com, payload_xyz - new_com
                inertia = (
                    inertia
                    + mass * (d1 @ d1 * np.eye(3) - np.outer(d1, d1))
                    + p.payload_kg * (d2 @ d2 * np.eye(3) - np.outer(d2, d2))
                )
                mass, com = m_tot, new_com
            # The inertia tensor is stored in the link frame (load_arm rotated it), so the
            # written origin has no rotation.
            org.set("xyz", " ".join(f"{v:.12g}" for v in com))
            org.set("rpy", "0 0 0")
            mass_el.set("value", f"{mass:.12g}")
            for key, (r, c) in {
                "ixx": (0, 0),
                "ixy": (0, 1),
                "ixz": (0, 2),
                "iyy": (1, 1),
                "iyz": (1, 2),
                "izz": (2, 2),
            }.items():
                ine.set(key, f"{inertia[r, c]:.12g}")
        # A new name per load: PyBullet caches parsed URDFs by file name.
        self._load_count += 1
        for stale in Path(self._tmpdir.name).glob(f"{label}_*.urdf"):
            stale.unlink()
        out = Path(self._tmpdir.name) / f"{label}_{self._load_count}.urdf"
        ET.ElementTree(root).write(out)
        return out

    def _payload_anchor(self, offset_m: np.ndarray) -> tuple[str, np.ndarray]:
        """Return (link with mass nearest the tip, payload position in that link's frame)."""
        t_tip = np.eye(4)
        link = self.arm.tip_link
        for j in reversed(self.arm.chain):
            info = self.arm.inertials.get(link)
            if info is not None and info.mass_kg > 0:
                break
            if j.child != link:
                continue
            t_tip = j.origin @ t_tip
            link = j.parent
        pos = t_tip[:3, :3] @ np.asarray(offset_m, float) + t_tip[:3, 3]
        return link, pos

    def _load(self, p: PlantParams) -> None:
        c = self._client
        pb.resetSimulation(physicsClientId=c)
        pb.setTimeStep(self.physics_dt_s, physicsClientId=c)
        pb.setPhysicsEngineParameter(
            deterministicOverlappingPairs=1, enableFileCaching=0, physicsClientId=c
        )
        path = self._modified_urdf(p)
        self._body = pb.loadURDF(
            str(path),
            useFixedBase=True,
            flags=pb.URDF_USE_INERTIA_FROM_FILE,
            physicsClientId=c,
        )
        self._plane = -1
        if self._ground_plane:
            # Off by default: any second body in the world makes PyBullet's step 2-3x slower
            # (measured), and a free-standing arm never touches the floor.
            half = [2.0, 2.0, 0.05]
            shape = pb.createCollisionShape(pb.GEOM_BOX, halfExtents=half, physicsClientId=c)
            look = pb.createVisualShape(
                pb.GEOM_BOX, halfExtents=half, rgbaColor=[0.35, 0.35, 0.35, 1.0],
                physicsClientId=c,
            )
            self._plane = pb.createMultiBody(
                0.0, shape, look, basePosition=[0.0, 0.0, -half[2]], physicsClientId=c
            )
            # The base stands on the floor: that contact is permanent and means nothing.
            pb.setCollisionFilterPair(self._plane, self._body, -1, -1, 0, physicsClientId=c)
        by_name: dict[str, int] = {}
        movable: list[int] = []
        for j in range(pb.getNumJoints(self._body, physicsClientId=c)):
            info = pb.getJointInfo(self._body, j, physicsClientId=c)
            by_name[info[1].decode()] = j
            if info[2] != pb.JOINT_FIXED:
                movable.append(j)
            # Damping is ours (implicit); PyBullet's own is explicit and unstable on light links.
            pb.changeDynamics(
                self._body, j, jointDamping=0.0, linearDamping=0.0, angularDamping=0.0,
                physicsClientId=c,
            )
        pb.changeDynamics(
            self._body, -1, linearDamping=0.0, angularDamping=0.0, physicsClientId=c
        )
        self._idx = [by_name[n] for n in self.joint_names]
        self._movable = movable
        dof_of = {j: k for k, j in enumerate(movable)}
        self._dof = np.array([dof_of[j] for j in self._idx], dtype=int)
        self._other_movable = [j for j in movable if j not in self._idx]
        # Joints that are movable but not on our chain (a gripper) are left free: no motor.
        if self._other_movable:
            pb.setJointMotorControlArray(
                self._body,
                self._other_movable,
                pb.VELOCITY_CONTROL,
                targetVelocities=[0.0] * len(self._other_movable),
                forces=[0.0] * len(self._other_movable),
                physicsClientId=c,
            )
        self._ft_idx = by_name.get(self._ft_joint_name or "", -1)
        self._ft_com = np.zeros(3)
        self._ft_rot = np.eye(3)
        if self._ft_idx >= 0:
            pb.enableJointForceTorqueSensor(self._body, self._ft_idx, True, physicsClientId=c)
            dyn = pb.getDynamicsInfo(self._body, self._ft_idx, physicsClientId=c)
            self._ft_com = np.array(dyn[3])
            self._ft_rot = np.array(pb.getMatrixFromQuaternion(dyn[4])).reshape(3, 3)
        self._ft_com_t = tuple(float(v) for v in self._ft_com)
        # One getJointStates call reads the chain and the F/T joint together.
        self._read_idx = self._idx + ([self._ft_idx] if self._ft_idx >= 0 else [])
        self._u_idx = [pb.getJointInfo(self._body, j, physicsClientId=c)[4] for j in self._idx]
        if self._servo is not None:
            self._rebind_servo()
        elif self._want_native and not self._other_movable:
            self._servo = self._make_servo()

    def _make_servo(self) -> Any:
        """Build the C step loop on this client's body; None (Python loop) if it fails a check."""
        handle = _pbnative.client_handle(self._client)
        self._nc_handle = _pbnative.client_handle(self._nc)
        if handle is None or self._nc_handle is None or _native is None:
            return None
        try:
            servo = _native.Servo(handle, self._body, self._read_idx, self._u_idx,
                                  self._ft_idx >= 0, pb.TORQUE_CONTROL)
            ok = self._same_state(servo)
        except (RuntimeError, ValueError) as exc:
            warnings.warn(f"C step loop unavailable ({exc}); using the Python loop", stacklevel=3)
            return None
        if not ok:
            warnings.warn("C step loop reads a different state than pybullet.getJointStates; "
                          "using the Python loop", stacklevel=3)
            return None
        if self._hbuf is not None:
            servo.set_history(*self._hbuf)
        servo.set_ft_frame(self._ft_rot.ravel().tolist(), list(self._ft_com_t))
        return servo

    def _rebind_servo(self) -> None:
        """Move the C loop, with all its state, to the reloaded arm."""
        servo = self._servo
        servo.rebind(self._body, self._read_idx, self._u_idx, self._ft_idx >= 0)
        if not self._same_state(servo):
            # It holds the sensor state of a running episode: there is no quiet way back.
            raise RuntimeError("C step loop lost its client after reloading the arm")
        servo.set_ft_frame(self._ft_rot.ravel().tolist(), list(self._ft_com_t))

    def _same_state(self, servo: Any) -> bool:
        """True when the C API handle reads what pybullet.getJointStates reads."""
        ref = pb.getJointStates(self._body, self._read_idx, physicsClientId=self._client)
        got = servo.read()
        return len(got) == len(ref) and all(
            g[0] == r[0] and g[1] == r[1] and tuple(g[2]) == tuple(r[2])
            for g, r in zip(got, ref)
        )

    def _set_gain_model(self) -> None:
        """Give the C loop what it refreshes the gains from (the nominal arm and the params)."""
        self._servo.set_gain_model(
            self._nc_handle, self._nominal_body, self._dof.tolist(),
            np.broadcast_to(self._kp_per_inertia, (self.n,)).tolist(),
            np.broadcast_to(self._kd_per_inertia, (self.n,)).tolist(),
            self._damping.tolist(), self.physics_dt_s, GAIN_UPDATE_STEPS,
        )

    def _true_state(self) -> tuple[np.ndarray, np.ndarray]:
        states = pb.getJointStates(self._body, self._idx, physicsClientId=self._client)
        return np.array([s[0] for s in states]), np.array([s[1] for s in states])

    def _last_q(self) -> np.ndarray:
        """The joint positions last read (by a step or a sensor), as the gains see them."""
        return np.array(self._servo.q_last) if self._servo is not None else self._q

    @property
    def backend(self) -> str:
        """Which step loop runs: 'native' (C) or 'python'."""
        return "native" if self._servo is not None else "python"

    # ----------------------------------------------------------------- state
    def _write_joint_state(self, q: np.ndarray, qd: np.ndarray) -> None:
        for k, j in enumerate(self._idx):
            pb.resetJointState(
                self._body, j, float(q[k]), float(qd[k]), physicsClientId=self._client
            )
        self._q = np.array(q, dtype=float)
        self._qd = np.array(qd, dtype=float)
        if self._servo is not None:
            self._servo.set_q(self._q.tolist(), self._qd.tolist())

    def reset(self, q0: np.ndarray | None = None, qd0: np.ndarray | None = None) -> PlantState:
        """Put the arm at q0 (default: zeros clipped into limits) and hold it there."""
        n = self.n
        q = np.zeros(n) if q0 is None else np.asarray(q0, dtype=float)
        qd = np.zeros(n) if qd0 is None else np.asarray(qd0, dtype=float)
        for name, arr in (("q0", q), ("qd0", qd)):
            if arr.shape != (n,) or not np.all(np.isfinite(arr)):
                raise ValueError(f"{name}: expected {n} finite values, got {arr!r}")
        q = np.clip(q, self.arm.lower_rad, self.arm.upper_rad)
        self._write_joint_state(q, qd)
        self._t_s = 0.0
        self._steps = 0
        self._mode = "position"
        self._target = q.copy()
        self._target_l = q.tolist()
        self._tau = [0.0] * n
        if self._servo is not None:
            if not self._same_state(self._servo):
                warnings.warn("C step loop lost its client; using the Python loop", stacklevel=2)
                self._servo = None
            else:
                self._servo.set_command(0, self._target_l)
                self._servo.set_tau(self._tau)
        self._update_gains()
        return self.state()

    def set_command(self, mode: str, values: np.ndarray) -> None:
        """Hold a command: target positions (rad), velocities (rad/s) or torques (N·m)."""
        if mode not in CONTROL_MODES:
            raise ValueError(f"mode = {mode!r}: expected one of {list(CONTROL_MODES)}")
        arr = np.asarray(values, dtype=float)
        if arr.shape != (self.n,):
            raise ValueError(f"{mode} command: expected {self.n} values, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{mode} command has non-finite values: {arr.tolist()}")
        self.hold(mode, arr)

    def hold(self, mode: str, values: np.ndarray) -> None:
        """set_command without the checks, for callers that made them (SimCore)."""
        self._mode = mode
        self._target = values.copy()
        self._target_l = values.tolist()
        if self._servo is not None:
            self._servo.set_command(CONTROL_MODES.index(mode), self._target_l)

    @property
    def client(self) -> int:
        """The PyBullet client id (for rendering)."""
        return self._client

    @property
    def body(self) -> int:
        """The PyBullet body id of the arm."""
        return self._body

    @property
    def floor(self) -> int:
        """The PyBullet body id of the floor (-1 without one)."""
        return self._plane

    @property
    def steps(self) -> int:
        """Physics steps since the last reset."""
        return self._steps

    @property
    def history_s(self) -> float:
        """How far back history_at() can look, s (0 when history is off)."""
        return max(self._hist_len - 2, 0) * self.physics_dt_s

    @property
    def mode(self) -> str:
        """The control mode of the held command."""
        return self._mode

    @property
    def target(self) -> np.ndarray:
        """The held command values."""
        return self._target.copy()

    @property
    def time_s(self) -> float:
        """Simulated time since the last reset, s."""
        return self._t_s

    @property
    def effort_limit_nm(self) -> np.ndarray:
        """Torque limits in force: URDF effort × torque_limit_scale, N·m."""
        return self._effort_limit.copy()

    @property
    def servo_gains(self) -> tuple[np.ndarray, np.ndarray]:
        """Current (kp N·m/rad, kd N·m·s/rad) of the position servo."""
        if self._servo is not None:
            kp, kd = self._servo.gains()[:2]  # the C loop refreshes them itself
            return np.array(kp), np.array(kd)
        return self._kp.copy(), self._kd.copy()

    def mass_matrix(self, q: np.ndarray | None = None) -> np.ndarray:
        """Joint-space inertia M(q) of the chain joints (armature included), kg·m²."""
        qq = self._last_q() if q is None else np.asarray(q, dtype=float)
        full = self._full_q(qq)
        m = np.array(pb.calculateMassMatrix(self._body, full, physicsClientId=self._client))
        return m[np.ix_(self._dof, self._dof)]

    def inverse_dynamics(self, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray) -> np.ndarray:
        """Rigid-body torques M q̈ + C q̇ + g (no friction, no damping), N·m."""
        tau = pb.calculateInverseDynamics(
            self._body,
            self._full_q(q),
            self._full_q(qd, fill=0.0),
            self._full_q(qdd, fill=0.0),
            physicsClientId=self._client,
        )
        return np.asarray(tau)[self._dof]

    def _full_q(self, q: np.ndarray, fill: float | None = None) -> list[float]:
        if not self._other_movable:
            return [float(v) for v in q]
        full = [0.0] * len(self._movable)
        if fill is None:
            for j in self._other_movable:
                full[self._movable.index(j)] = pb.getJointState(
                    self._body, j, physicsClientId=self._client
                )[0]
        for k, d in enumerate(self._dof):
            full[d] = float(q[k])
        return full

    def _update_gains(self) -> None:
        # The drive was tuned on the nominal arm: its gains follow the nominal inertia, so a
        # payload or a heavier arm degrades tracking as it would on a real cell.
        # Each joint's loop is tuned for the inertia it sees with the other joints free,
        # 1/(M⁻¹)_jj, not M_jj: at a straight arm the lift/elbow "scissor" mode is ~30x lighter
        # than M_jj says, and gains from M_jj would put it at the edge of stability.
        if self._servo is not None:
            # The same computation in C (sim/_servo.c update_gains), on the same last state;
            # the gains stay there (servo_gains reads them back).
            self._servo.update_gains()
            return
        full = self._full_q(self._q)
        m_nom = self._free_inertia(
            pb.calculateMassMatrix(self._nominal_body, full, physicsClientId=self._nc))
        m_act = self._free_inertia(
            pb.calculateMassMatrix(self._body, full, physicsClientId=self._client))
        self._m_diag = np.maximum(m_act, 1e-9)
        m_nom = np.maximum(m_nom, 1e-9)
        self._kp = self._kp_per_inertia * m_nom
        self._kd = self._kd_per_inertia * m_nom
        # All velocity feedback a joint gets in one step (servo kd + viscous b) is explicit. It
        # is exact in steady state (what a fitter sees) and monotone while
        # c = (kd + b)·dt/M_jj <= 0.5 on the actual inertia; beyond that (a light link, a
        # drive tuned for more inertia than it drives) both are scaled down so a velocity
        # never flips sign from one step to the next. With the default armature no joint of
        # the shipped arm reaches the limit.
        c = (self._kd + self._damping) * self.physics_dt_s / self._m_diag
        scale = 1.0 / (1.0 + np.maximum(c - 0.5, 0.0))
        self._damp_eff = self._damping * scale
        kd_eff = self._kd * scale
        self._kp_l = (self._kp * scale).tolist()
        self._kd_l = kd_eff.tolist()
        # Position-loop gain of the cascade (1/s): kp/kd.
        self._kpos_l = np.where(
            self._kd > 0, self._kp / np.maximum(self._kd, 1e-300), 0.0
        ).tolist()
        self._damp_l = self._damp_eff.tolist()

    def _free_inertia(self, mass_matrix: Any) -> np.ndarray:
        """Return 1/(M⁻¹)_jj for the chain joints: the inertia each sees, the others free."""
        m = np.asarray(mass_matrix, dtype=float)
        d = _inv_diag(m.ravel().tolist(), m.shape[0])
        if d is None:
            return np.diag(m)[self._dof]
        return 1.0 / np.maximum(np.asarray(d)[self._dof], 1e-12)

    def enable_history(self, seconds: float) -> None:
        """Keep the pre-step state of every physics step for `seconds` (for delayed sensors)."""
        length = max(2, int(math.ceil(seconds / self.physics_dt_s)) + 2)
        self._hist_len = length
        # The raw PyBullet tuples are kept by reference: recording costs almost nothing and
        # parsing happens only for the steps a sensor actually reads.
        self._hraw: list[Any] = [None] * length
        self._htau: list[Any] = [None] * length
        if self._want_native:
            # The C loop's history: (L, n) q, qd, tau and (L, 6) raw F/T reaction.
            n = self.n
            self._hbuf = (np.zeros((length, n)), np.zeros((length, n)), np.zeros((length, n)),
                          np.zeros((length, 6)))
            if self._servo is not None:
                self._servo.set_history(*self._hbuf)

    def history_at(self, t_s: float) -> PlantState:
        """Return the state at the last physics step at or before t_s (clipped to the buffer)."""
        k = int(math.floor(t_s / self.physics_dt_s + 1e-9))
        if k >= self._steps or self._hist_len == 0:
            return self.state()
        k = max(k, self._steps - self._hist_len + 1, 0)
        i = k % self._hist_len
        if self._servo is not None and self._hbuf is not None:
            hq, hqd, htau, hft = self._hbuf
            wrench = self._raw_to_wrench(hft[i].tolist()) if self._ft_idx >= 0 else np.zeros(6)
            return PlantState(k * self.physics_dt_s, hq[i].copy(), hqd[i].copy(),
                              htau[i].copy(), wrench)
        return self._parse(self._hraw[i], self._htau[i], k * self.physics_dt_s)

    def _parse(self, states: Any, tau: np.ndarray, t_s: float) -> PlantState:
        nj = self.n
        q = np.array([states[k][0] for k in range(nj)])
        qd = np.array([states[k][1] for k in range(nj)])
        wrench = self._raw_to_wrench(states[nj][2]) if self._ft_idx >= 0 else np.zeros(6)
        return PlantState(t_s, q, qd, np.array(tau, dtype=float), wrench)

    def step(self, n: int = 1) -> PlantState:
        """Advance n physics steps with the held command; return the state after the last."""
        self.advance_steps(n)
        return self.state()

    def advance_steps(self, n: int) -> None:
        """Advance n physics steps with the held command (no state read at the end)."""
        servo = self._servo
        if servo is not None:
            servo.advance(n, self._steps)  # the whole loop, gain refreshes included, in C
            self._steps += n
            self._t_s = self._steps * self.physics_dt_s
        else:
            self._advance_python(int(n))

    def _advance_python(self, n: int) -> None:
        # The hot loop runs on Python floats: for six joints that is ~6x faster than numpy's
        # per-call overhead, and it dominates the cost of a physics step.
        body, read, c, rj = self._body, self._read_idx, self._client, range(self.n)
        idx = self._idx
        get_states, set_ctrl = pb.getJointStates, pb.setJointMotorControlArray
        step = pb.stepSimulation
        torque_mode = pb.TORQUE_CONTROL
        lim, alpha, lagged = self._lim_l, self._lag_l, self._lagged
        vmax = self._vmax_l
        target = self._target_l
        mode = self._mode
        hist = self._hist_len
        tau_prev = self._tau
        states: Any = None
        for _ in range(int(n)):
            if self._steps % GAIN_UPDATE_STEPS == 0:
                if states is not None:
                    self._q = np.array([states[j][0] for j in rj])
                self._update_gains()
            kp, kd, kpos, damp = self._kp_l, self._kd_l, self._kpos_l, self._damp_l
            states = get_states(body, read, physicsClientId=c)
            tau = []
            forces = []
            for j in rj:
                qj, qdj, _, _ = states[j]
                if mode == "position":
                    # Cascade form of the PD: position loop -> velocity set-point clamped at
                    # the joint's velocity limit -> velocity loop. Identical to
                    # kp·e - kd·q̇ until the clamp, which stops large steps winding up.
                    v = kpos[j] * (target[j] - qj)
                    vl = vmax[j]
                    if v > vl:
                        v = vl
                    elif v < -vl:
                        v = -vl
                    t = kd[j] * (v - qdj) if kd[j] > 0 else kp[j] * (target[j] - qj)
                elif mode == "velocity":
                    v = target[j]
                    vl = vmax[j]
                    if v > vl:
                        v = vl
                    elif v < -vl:
                        v = -vl
                    t = kd[j] * (v - qdj)
                else:
                    t = target[j]
                lj = lim[j]
                if t > lj:
                    t = lj
                elif t < -lj:
                    t = -lj
                if lagged:
                    # First-order current loop: the motor torque follows the demand with lag τ.
                    t = tau_prev[j] + alpha[j] * (t - tau_prev[j])
                tau.append(t)
                forces.append(t - damp[j] * qdj)
            if hist:
                i = self._steps % hist
                self._hraw[i] = states
                self._htau[i] = tau_prev
            set_ctrl(body, idx, torque_mode, forces=forces, physicsClientId=c)
            step(physicsClientId=c)
            tau_prev = tau
            self._steps += 1
        self._tau = tau_prev
        if states is not None:
            self._q = np.array([states[j][0] for j in rj])
        self._t_s = self._steps * self.physics_dt_s

    def state(self) -> PlantState:
        """Read the current joint state and F/T wrench."""
        if self._servo is not None:
            n = self.n
            buf = np.empty(2 * n + 6)
            self._servo.state(buf)
            # the C loop holds the applied torque (Python's _tau is not kept up to date)
            st = PlantState(self._t_s, buf[:n].copy(), buf[n:2 * n].copy(),
                            np.array(self._servo.tau), buf[2 * n:].copy())
            self._q, self._qd = st.q.copy(), st.qd.copy()
            return st
        states = pb.getJointStates(self._body, self._read_idx, physicsClientId=self._client)
        st = self._parse(states, self._tau, self._t_s)
        self._q, self._qd = st.q.copy(), st.qd.copy()
        return st

    def wrench(self) -> np.ndarray:
        """Wrench the tool side exerts on the arm at the sensor frame origin, sensor frame."""
        return self.state().wrench

    def _raw_to_wrench(self, raw: Any) -> np.ndarray:
        # PyBullet reports the parent-on-child wrench in the child's inertial frame, about the
        # child's centre of mass; move it to the sensor (link) frame origin and flip the sign.
        r = self._ft_rot
        fx, fy, fz, mx, my, mz = raw
        f0 = r[0, 0] * fx + r[0, 1] * fy + r[0, 2] * fz
        f1 = r[1, 0] * fx + r[1, 1] * fy + r[1, 2] * fz
        f2 = r[2, 0] * fx + r[2, 1] * fy + r[2, 2] * fz
        m0 = r[0, 0] * mx + r[0, 1] * my + r[0, 2] * mz
        m1 = r[1, 0] * mx + r[1, 1] * my + r[1, 2] * mz
        m2 = r[2, 0] * mx + r[2, 1] * my + r[2, 2] * mz
        cx, cy, cz = self._ft_com_t
        return -np.array(
            [f0, f1, f2, m0 + cy * f2 - cz * f1, m1 + cz * f0 - cx * f2, m2 + cx * f1 - cy * f0]
        )

    def close(self) -> None:
        """Disconnect the PyBullet client and delete the temporary URDF."""
        # The C loop holds a pointer into the client: drop it before pybullet frees it.
        self._servo = None
        self._want_native = False
        for attr in ("_client", "_nc"):
            cid = getattr(self, attr, -1)
            if cid >= 0:
                try:
                    pb.disconnect(physicsClientId=cid)
                except pb.error:
                    pass
                setattr(self, attr, -1)
        self._tmpdir.cleanup()

    def __enter__(self) -> ArmPlant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have removed pybullet
            pass

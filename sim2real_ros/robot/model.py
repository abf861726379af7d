"""Arm model from any URDF: joint names, limits, inertials, forward kinematics and Jacobians.

Nothing here is specific to our arm: every number comes from the URDF file. The safety filter,
the baseline controller, the policy task and the sim core all read the arm through this module.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transforms3d.euler import euler2mat

from sim2real_ros.config import ConfigError

MOVABLE_TYPES = ("revolute", "continuous", "prismatic")


@dataclass(frozen=True)
class JointLimits:
    """Hard limits of one joint as the URDF states them (SI units)."""

    lower: float
    upper: float
    velocity: float
    effort: float


@dataclass(frozen=True)
class Inertial:
    """Mass properties of one link in its own frame."""

    mass_kg: float
    com_xyz_m: np.ndarray
    inertia: np.ndarray  # 3x3, kg·m², about the centre of mass in the link frame


@dataclass(frozen=True)
class UrdfJoint:
    """One URDF joint: its kinematics and, if movable, its limits and dynamics."""

    name: str
    joint_type: str
    parent: str
    child: str
    origin: np.ndarray  # 4x4 transform parent -> joint frame at q = 0
    axis: np.ndarray  # unit vector in the joint frame
    limits: JointLimits | None
    damping: float
    friction: float


@dataclass
class ArmModel:
    """A serial chain from the URDF root to a tip frame, with its movable joints in order."""

    name: str
    urdf_path: Path
    root_link: str
    tip_link: str
    chain: list[UrdfJoint]  # every joint root -> tip, fixed ones included
    joint_names: list[str]  # movable joints in chain order
    limits: list[JointLimits]
    inertials: dict[str, Inertial]
    links: list[str]
    all_joints: dict[str, UrdfJoint] = field(repr=False, default_factory=dict)

    @property
    def n_joints(self) -> int:
        """Number of movable joints on the chain."""
        return len(self.joint_names)

    @property
    def lower_rad(self) -> np.ndarray:
        """Lower position limits, rad (m for prismatic)."""
        return np.array([lim.lower for lim in self.limits])

    @property
    def upper_rad(self) -> np.ndarray:
        """Upper position limits, rad (m for prismatic)."""
        return np.array([lim.upper for lim in self.limits])

    @property
    def max_velocity_rad_s(self) -> np.ndarray:
        """Velocity limits, rad/s."""
        return np.array([lim.velocity for lim in self.limits])

    @property
    def max_effort_nm(self) -> np.ndarray:
        """Effort limits, N·m (N for prismatic)."""
        return np.array([lim.effort for lim in self.limits])

    def index_of(self, joint_names: list[str]) -> np.ndarray:
        """Map names to chain indices; raise on a name the arm does not have."""
        lookup = {n: i for i, n in enumerate(self.joint_names)}
        unknown = [n for n in joint_names if n not in lookup]
        if unknown:
            raise KeyError(f"unknown joints {unknown}; the arm has {self.joint_names}")
        return np.array([lookup[n] for n in joint_names], dtype=int)

    def frames(self, q: np.ndarray) -> dict[str, np.ndarray]:
        """Return the 4x4 pose of every link on the chain in the root frame."""
        q = np.asarray(q, dtype=float)
        if q.shape != (self.n_joints,):
            raise ValueError(f"expected {self.n_joints} joint positions, got shape {q.shape}")
        out = {self.root_link: np.eye(4)}
        t = np.eye(4)
        k = 0
        for j in self.chain:
            t = t @ j.origin
            if j.joint_type in ("revolute", "continuous"):
                t = t @ _rot4(j.axis, float(q[k]))
                k += 1
            elif j.joint_type == "prismatic":
                step = np.eye(4)
                step[:3, 3] = j.axis * float(q[k])
                t = t @ step
                k += 1
            out[j.child] = t
        return out

    def fk(self, q: np.ndarray, link: str | None = None) -> np.ndarray:
        """Return the 4x4 pose of `link` (default: the tip) in the root frame."""
        return self.frames(q)[link or self.tip_link]

    def tool_position(self, q: np.ndarray) -> np.ndarray:
        """Return the tip position (m) in the root frame."""
        return self.fk(q)[:3, 3].copy()

    def jacobian(self, q: np.ndarray, link: str | None = None) -> np.ndarray:
        """Return the 6xN geometric Jacobian [linear; angular] of `link` in the root frame."""
        q = np.asarray(q, dtype=float)
        target = link or self.tip_link
        frames = self.frames(q)
        p_tip = frames[target][:3, 3]
        jac = np.zeros((6, self.n_joints))
        t = np.eye(4)
        k = 0
        for j in self.chain:
            t = t @ j.origin
            if j.joint_type in MOVABLE_TYPES:
                axis_world = t[:3, :3] @ j.axis
                if j.joint_type == "prismatic":
                    jac[:3, k] = axis_world
                else:
                    jac[:3, k] = np.cross(axis_world, p_tip - t[:3, 3])
                    jac[3:, k] = axis_world
                t = frames[j.child]
                k += 1
            else:
                t = frames[j.child]
            if j.child == target:
                break
        return jac

    def ik_position(
        self,
        target_xyz_m: np.ndarray,
        q0: np.ndarray,
        iterations: int = 100,
        tolerance_m: float = 1e-4,
        damping: float = 0.05,
    ) -> tuple[np.ndarray, float]:
        """Solve for a joint vector that puts the tip at a position (damped least squares).

        Returns the solution, clipped to the joint limits, and its residual distance in metres.
        """
        q = np.array(q0, dtype=float)
        lo, hi = self.lower_rad, self.upper_rad
        err = np.inf
        for _ in range(iterations):
            e = np.asarray(target_xyz_m, dtype=float) - self.tool_position(q)
            err = float(np.linalg.norm(e))
            if err < tolerance_m:
                break
            jv = self.jacobian(q)[:3]
            dq = jv.T @ np.linalg.solve(jv @ jv.T + damping**2 * np.eye(3), e)
            q = np.clip(q + dq, lo, hi)
        return q, err

    def total_mass_kg(self) -> float:
        """Sum of link masses on the whole model."""
        return float(sum(i.mass_kg for i in self.inertials.values()))


def _rot4(axis: np.ndarray, angle: float) -> np.ndarray:
    """Homogeneous rotation about a unit axis (Rodrigues)."""
    x, y, z = axis
    c, s = math.cos(angle), math.sin(angle)
    v = 1.0 - c
    r = np.eye(4)
    r[:3, :3] = (
        (c + x * x * v, x * y * v - z * s, x * z * v + y * s),
        (y * x * v + z * s, c + y * y * v, y * z * v - x * s),
        (z * x * v - y * s, z * y * v + x * s, c + z * z * v),
    )
    return r


def _vec(text: str | None, default: str, path: Path, key: str) -> np.ndarray:
    raw = (text if text is not None else default).split()
    try:
        vals = np.array([float(v) for v in raw])
    except ValueError:
        raise ConfigError(path, key, text, "three numbers") from None
    if vals.shape != (3,):
        raise ConfigError(path, key, text, "three numbers")
    return vals


def _origin(el: ET.Element | None, path: Path, key: str) -> np.ndarray:
    t = np.eye(4)
    if el is None:
        return t
    xyz = _vec(el.get("xyz"), "0 0 0", path, f"{key}/origin@xyz")
    rpy = _vec(el.get("rpy"), "0 0 0", path, f"{key}/origin@rpy")
    t[:3, :3] = euler2mat(rpy[0], rpy[1], rpy[2], "sxyz")
    t[:3, 3] = xyz
    return t


def load_arm(
    urdf_path: str | Path, tip_link: str | None = None, root_link: str | None = None
) -> ArmModel:
    """Parse a URDF into an ArmModel for the chain root -> tip.

    With no tip given, the tip is the deepest leaf link of the tree (for our arm: `tool0`).
    """
    path = Path(urdf_path)
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError) as exc:
        raise ConfigError(path, "<file>", None, f"a readable URDF ({exc})") from exc
    robot = tree.getroot()
    if robot.tag != "robot":
        raise ConfigError(path, "<root element>", robot.tag, "<robot>")

    inertials: dict[str, Inertial] = {}
    links = []
    for link in robot.findall("link"):
        name = link.get("name", "")
        links.append(name)
        el = link.find("inertial")
        if el is None:
            continue
        mass_el = el.find("mass")
        mass = float(mass_el.get("value", "0")) if mass_el is not None else 0.0
        org = _origin(el.find("origin"), path, f"link[{name}]/inertial")
        ine = el.find("inertia")
        inertia = np.zeros((3, 3))
        if ine is not None:
            g = {k: float(ine.get(k, "0")) for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")}
            inertia = np.array(
                [
                    [g["ixx"], g["ixy"], g["ixz"]],
                    [g["ixy"], g["iyy"], g["iyz"]],
                    [g["ixz"], g["iyz"], g["izz"]],
                ]
            )
            rot = org[:3, :3]
            inertia = rot @ inertia @ rot.T
        inertials[name] = Inertial(mass, org[:3, 3].copy(), inertia)

    joints: dict[str, UrdfJoint] = {}
    by_child: dict[str, UrdfJoint] = {}
    for el in robot.findall("joint"):
        name = el.get("name", "")
        jtype = el.get("type", "")
        key = f"joint[{name}]"
        parent_el, child_el = el.find("parent"), el.find("child")
        if parent_el is None or child_el is None:
            raise ConfigError(path, key, None, "a <parent> and a <child> link")
        axis = _vec(
            el.find("axis").get("xyz") if el.find("axis") is not None else None,
            "1 0 0",
            path,
            f"{key}/axis@xyz",
        )
        norm = float(np.linalg.norm(axis))
        if jtype in MOVABLE_TYPES and norm == 0.0:
            raise ConfigError(path, f"{key}/axis@xyz", "0 0 0", "a non-zero axis")
        axis = axis / norm if norm > 0 else axis
        limits = None
        if jtype in MOVABLE_TYPES:
            lim = el.find("limit")
            if lim is None and jtype != "continuous":
                raise ConfigError(path, f"{key}/limit", None, "a <limit> element")
            lower = float(lim.get("lower", "-inf")) if lim is not None else -math.inf
            upper = float(lim.get("upper", "inf")) if lim is not None else math.inf
            if jtype == "continuous":
                lower, upper = -math.inf, math.inf
            if lower > upper:
                raise ConfigError(path, f"{key}/limit@lower", lower, f"<= upper ({upper})")
            velocity = float(lim.get("velocity", "inf")) if lim is not None else math.inf
            effort = float(lim.get("effort", "inf")) if lim is not None else math.inf
            limits = JointLimits(lower, upper, velocity, effort)
        dyn = el.find("dynamics")
        damping = float(dyn.get("damping", "0")) if dyn is not None else 0.0
        friction = float(dyn.get("friction", "0")) if dyn is not None else 0.0
        joint = UrdfJoint(
            name,
            jtype,
            parent_el.get("link", ""),
            child_el.get("link", ""),
            _origin(el.find("origin"), path, key),
            axis,
            limits,
            damping,
            friction,
        )
        joints[name] = joint
        by_child[joint.child] = joint

    roots = [n for n in links if n not in by_child]
    if root_link is None:
        if len(roots) != 1:
            raise ConfigError(path, "<links>", roots, "exactly one root link")
        root_link = roots[0]
    if tip_link is None:
        parents = {j.parent for j in joints.values()}
        leaves = [n for n in links if n not in parents and n != root_link]

        def depth(link: str) -> int:
            d = 0
            while link in by_child:
                link = by_child[link].parent
                d += 1
            return d

        if not leaves:
            raise ConfigError(path, "<links>", links, "at least one link below the root")
        tip_link = max(leaves, key=depth)
    if tip_link not in links:
        raise ConfigError(path, "tip_link", tip_link, f"one of the links {links}")

    chain: list[UrdfJoint] = []
    link = tip_link
    while link != root_link:
        if link not in by_child:
            raise ConfigError(path, "tip_link", tip_link, f"a link below {root_link}")
        j = by_child[link]
        chain.append(j)
        link = j.parent
    chain.reverse()
    movable = [j for j in chain if j.joint_type in MOVABLE_TYPES]
    return ArmModel(
        name=robot.get("name", path.stem),
        urdf_path=path,
        root_link=root_link,
        tip_link=tip_link,
        chain=chain,
        joint_names=[j.name for j in movable],
        limits=[j.limits for j in movable if j.limits is not None],
        inertials=inertials,
        links=links,
        all_joints=joints,
    )

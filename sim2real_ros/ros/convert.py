"""Message <-> numpy conversions with explicit errors for wrong names, lengths and values."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import WrenchStamped
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension


class MessageError(ValueError):
    """A message cannot be turned into arrays for the configured joints."""


def stamp_to_s(stamp: Time) -> float:
    """Return a header stamp as float seconds."""
    return float(stamp.sec) + 1e-9 * float(stamp.nanosec)


def stamp_to_ns(stamp: Time) -> int:
    """Return a header stamp as integer nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def s_to_stamp(t_s: float) -> Time:
    """Return float seconds as a header stamp (non-negative)."""
    ns = int(round(max(t_s, 0.0) * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def ns_to_stamp(t_ns: int) -> Time:
    """Return integer nanoseconds as a header stamp."""
    return Time(sec=int(t_ns) // 1_000_000_000, nanosec=int(t_ns) % 1_000_000_000)


@dataclass
class JointArrays:
    """A JointState reordered into the configured joint order; missing fields are None."""

    stamp_s: float
    position: np.ndarray | None
    velocity: np.ndarray | None
    effort: np.ndarray | None


def joint_state_to_arrays(
    msg: JointState, joint_names: list[str], require_position: bool = True
) -> JointArrays:
    """Reorder a JointState into `joint_names` order.

    Extra joints in the message are ignored (a cell publishes grippers and other axes too);
    a configured joint that is missing, a duplicated name or a field whose length does not
    match `name` raise MessageError. Non-finite values are returned as they are: rejecting
    them is the caller's decision (the safety filter rejects, the recorder records).
    """
    names = list(msg.name)
    if len(set(names)) != len(names):
        raise MessageError(f"duplicate joint names in message: {names}")
    index = {n: i for i, n in enumerate(names)}
    missing = [n for n in joint_names if n not in index]
    if missing:
        raise MessageError(f"message lacks joints {missing} (has {names})")
    order = [index[n] for n in joint_names]

    def field(values: object, label: str, required: bool) -> np.ndarray | None:
        arr = np.asarray(values, dtype=float)
        if arr.size == 0:
            if required:
                raise MessageError(f"message has no {label} values")
            return None
        if arr.shape != (len(names),):
            raise MessageError(f"{label} has {arr.size} values for {len(names)} names")
        return arr[order]

    return JointArrays(
        stamp_to_s(msg.header.stamp),
        field(msg.position, "position", require_position),
        field(msg.velocity, "velocity", False),
        field(msg.effort, "effort", False),
    )


def arrays_to_joint_state(
    joint_names: list[str],
    stamp: Time,
    position: np.ndarray | None = None,
    velocity: np.ndarray | None = None,
    effort: np.ndarray | None = None,
    frame_id: str = "",
) -> JointState:
    """Build a JointState from arrays in `joint_names` order."""
    msg = JointState()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.name = list(joint_names)
    n = len(joint_names)
    for label, arr in (("position", position), ("velocity", velocity), ("effort", effort)):
        if arr is None:
            continue
        a = np.asarray(arr, dtype=float)
        if a.shape != (n,):
            raise MessageError(f"{label} has shape {a.shape}, expected ({n},)")
        setattr(msg, label, a.tolist())
    return msg


def multiarray_to_array(msg: Float64MultiArray, n: int) -> np.ndarray:
    """Return the data of a Float64MultiArray command, checking its length."""
    arr = np.asarray(msg.data, dtype=float)
    if arr.shape != (n,):
        raise MessageError(f"command has {arr.size} values, expected {n}")
    return arr


def array_to_multiarray(values: np.ndarray, label: str = "joints") -> Float64MultiArray:
    """Build a Float64MultiArray as forward_command_controller expects it."""
    arr = np.asarray(values, dtype=float).ravel()
    msg = Float64MultiArray()
    msg.layout.dim = [MultiArrayDimension(label=label, size=arr.size, stride=arr.size)]
    msg.data = arr.tolist()
    return msg


def wrench_to_array(msg: WrenchStamped) -> np.ndarray:
    """Return [fx, fy, fz, tx, ty, tz] (N, N·m)."""
    f, t = msg.wrench.force, msg.wrench.torque
    return np.array([f.x, f.y, f.z, t.x, t.y, t.z], dtype=float)


def array_to_wrench(values: np.ndarray, stamp: Time, frame_id: str) -> WrenchStamped:
    """Build a WrenchStamped from [fx, fy, fz, tx, ty, tz]."""
    w = np.asarray(values, dtype=float)
    if w.shape != (6,):
        raise MessageError(f"wrench has shape {w.shape}, expected (6,)")
    msg = WrenchStamped()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z = (float(v) for v in w[:3])
    msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z = (float(v) for v in w[3:])
    return msg

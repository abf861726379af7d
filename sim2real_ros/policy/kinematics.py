"""Batched forward kinematics and position Jacobians of an ArmModel chain (numpy).

Training steps many environments at a time; `ArmModel.jacobian` walks the chain in Python for
one configuration (about 0.5 ms). This evaluates the same chain for a batch at once, with the
same URDF numbers, and is checked against ArmModel in test_policy_task.py.
"""

from __future__ import annotations

import numpy as np

from sim2real_ros.robot.model import MOVABLE_TYPES, ArmModel


def _axis_angle(axis: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """Rotation matrices (B, 3, 3) about one unit axis for a batch of angles (Rodrigues)."""
    x, y, z = axis
    c, s = np.cos(angle), np.sin(angle)
    v = 1.0 - c
    r = np.empty(angle.shape + (3, 3))
    r[..., 0, 0] = c + x * x * v
    r[..., 0, 1] = x * y * v - z * s
    r[..., 0, 2] = x * z * v + y * s
    r[..., 1, 0] = y * x * v + z * s
    r[..., 1, 1] = c + y * y * v
    r[..., 1, 2] = y * z * v - x * s
    r[..., 2, 0] = z * x * v - y * s
    r[..., 2, 1] = z * y * v + x * s
    r[..., 2, 2] = c + z * z * v
    return r


class BatchKinematics:
    """Tip positions and position Jacobians for a batch of joint vectors."""

    def __init__(self, arm: ArmModel) -> None:
        self.arm = arm
        for j in arm.chain:
            if j.joint_type == "prismatic":
                raise ValueError(f"joint {j.name}: prismatic joints are not supported here")
        self.chain = [(j.origin.copy(), j.axis.copy(), j.joint_type in MOVABLE_TYPES)
                      for j in arm.chain]

    def tool_and_jacobian(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return tip positions (B, 3) and position Jacobians (B, 3, n) for q (B, n)."""
        q = np.atleast_2d(np.asarray(q, dtype=float))
        b = q.shape[0]
        rot = np.broadcast_to(np.eye(3), (b, 3, 3)).copy()
        pos = np.zeros((b, 3))
        axes, origins = [], []
        k = 0
        for origin, axis, movable in self.chain:
            pos = pos + rot @ origin[:3, 3]
            rot = rot @ origin[:3, :3]
            if movable:
                axes.append(rot @ axis)
                origins.append(pos.copy())
                rot = rot @ _axis_angle(axis, q[:, k])
                k += 1
        a = np.stack(axes, axis=2)  # (B, 3, k) joint axes in the base frame
        r = pos[:, :, None] - np.stack(origins, axis=2)  # (B, 3, k) joint -> tip
        jac = np.empty((b, 3, k))
        # a x r, written out: np.cross on small arrays costs more than the arithmetic
        jac[:, 0] = a[:, 1] * r[:, 2] - a[:, 2] * r[:, 1]
        jac[:, 1] = a[:, 2] * r[:, 0] - a[:, 0] * r[:, 2]
        jac[:, 2] = a[:, 0] * r[:, 1] - a[:, 1] * r[:, 0]
        return pos, jac

    def tool_position(self, q: np.ndarray) -> np.ndarray:
        """Return tip positions (B, 3) for q (B, n)."""
        return self.tool_and_jacobian(q)[0]

"""Tool position and per-joint lever arms from the arm model, on plain floats for the control loop.

`ArmModel.tool_position` builds 4x4 numpy matrices for every link (~65 µs); the projection needs
only the tool point, once per command, so this module walks the chain from the tip back to the
root moving a single point: a rotation about a unit axis and a fixed transform per joint. The same
pass yields, for every joint, the distance from its axis to the tool (the exact lever arm at that
configuration), which bounds the tool speed a joint velocity can cause.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from sim2real_ros.robot.model import ArmModel

_EPS = 1e-12

# Kinds of joint axes; a unit axis along x, y or z costs 4 multiplies instead of ~20.
_X, _Y, _Z, _GENERAL, _PRISMATIC = 0, 1, 2, 3, 4


class ToolKinematics:
    """Tool (tip-link) position and lever arms of an ArmModel's chain, on Python floats."""

    def __init__(self, arm: ArmModel, tip_link: str | None = None) -> None:
        self.arm = arm
        self.tip_link = tip_link or arm.tip_link
        chain = []
        for j in arm.chain:
            chain.append(j)
            if j.child == self.tip_link:
                break
        else:
            if chain and chain[-1].child != self.tip_link:
                raise ValueError(f"{self.tip_link!r} is not on the chain of {arm.name}")
        # Fixed transform before each movable joint (fixed joints merged in) and after the last.
        pre: list[np.ndarray] = []
        acc = np.eye(4)
        self._joints: list[tuple[int, float, float, float, int]] = []
        for j in chain:
            acc = acc @ j.origin
            if j.joint_type in ("revolute", "continuous", "prismatic"):
                pre.append(acc)
                ax = [float(v) for v in j.axis]
                kind = _PRISMATIC if j.joint_type == "prismatic" else _GENERAL
                sign = 1
                if kind == _GENERAL:
                    for k, code in ((0, _X), (1, _Y), (2, _Z)):
                        if abs(abs(ax[k]) - 1.0) < _EPS:
                            kind = code
                            sign = 1 if ax[k] > 0 else -1
                self._joints.append((kind, ax[0], ax[1], ax[2], sign))
                acc = np.eye(4)
        self.n_joints = len(self._joints)
        if self.n_joints != arm.n_joints:
            raise ValueError(f"tip {self.tip_link!r} leaves joints of {arm.name} off the chain")
        self._tip = (float(acc[0, 3]), float(acc[1, 3]), float(acc[2, 3]))
        # Each fixed transform as (is_pure_translation, 3x3 rows, translation).
        self._pre = []
        for t in pre:
            rot = t[:3, :3]
            pure = bool(np.allclose(rot, np.eye(3), atol=_EPS))
            rows = tuple(tuple(float(v) for v in r) for r in rot)
            self._pre.append((pure, rows, (float(t[0, 3]), float(t[1, 3]), float(t[2, 3]))))
        self.static_lever_arms_m = self._static_lever_arms()
        # The chain from the tip back to the root as flat tuples of floats (one unpacking per
        # joint in the hot loop): (k, kind, sign, ax, ay, az, pure, r00..r22, tx, ty, tz).
        self._rev: list[tuple] = []
        for k in range(self.n_joints - 1, -1, -1):
            kind, ax, ay, az, sign = self._joints[k]
            pure, rows, t = self._pre[k]
            self._rev.append((k, kind, float(sign), ax, ay, az, pure,
                              *rows[0], *rows[1], *rows[2], *t))
        # The same computation compiled for this chain (constants and branches resolved).
        self.fast_tool_position_and_levers: Callable[
            [Sequence[float], list[float]], tuple[float, float, float]] = self._compile()

    def _static_lever_arms(self) -> list[float]:
        """Upper bound, over all configurations, of each joint axis's distance to the tool."""
        lengths = [math.sqrt(sum(v * v for v in t)) for _, _, t in self._pre]
        tip = math.sqrt(sum(v * v for v in self._tip))
        out = []
        for k in range(self.n_joints):
            r = tip + sum(lengths[k + 1:])
            for i in range(k + 1, self.n_joints):
                if self._joints[i][0] == _PRISMATIC:
                    lim = self.arm.limits[i]
                    r += max(abs(lim.lower), abs(lim.upper))
            out.append(1.0 if self._joints[k][0] == _PRISMATIC else r)
        return out

    def _compile(self) -> Callable[[Sequence[float], list[float]], tuple[float, float, float]]:
        """Generate `tool_position_and_levers` as straight-line code for this chain.

        One statement per operation of the loop in `tool_position_and_levers`, in the same
        order and with the constants as exact float literals (repr round-trips), so the result
        is bit for bit the same; only the per-joint branching and tuple unpacking are gone.
        """
        f = repr
        lines = ["def fk(q, out_levers):", f"    x, y, z = {f(self._tip[0])}, {f(self._tip[1])}, "
                 f"{f(self._tip[2])}"]
        for (k, kind, sign, ax, ay, az, pure, r00, r01, r02, r10, r11, r12, r20, r21, r22,
             tx, ty, tz) in self._rev:
            if kind == _PRISMATIC:
                lines += [f"    out_levers[{k}] = 1.0", f"    qk = q[{k}]",
                          f"    x, y, z = x + {f(ax)} * qk, y + {f(ay)} * qk, z + {f(az)} * qk"]
            else:
                if kind == _Z:
                    lines.append(f"    out_levers[{k}] = sqrt(x * x + y * y)")
                elif kind == _Y:
                    lines.append(f"    out_levers[{k}] = sqrt(x * x + z * z)")
                elif kind == _X:
                    lines.append(f"    out_levers[{k}] = sqrt(y * y + z * z)")
                else:
                    lines += [f"    d = x * {f(ax)} + y * {f(ay)} + z * {f(az)}",
                              f"    out_levers[{k}] = "
                              "sqrt(max(0.0, x * x + y * y + z * z - d * d))"]
                lines += [f"    qk = q[{k}]", "    c = cos(qk)", f"    s = sin(qk) * {f(sign)}"]
                if kind == _Z:
                    lines.append("    x, y = c * x - s * y, s * x + c * y")
                elif kind == _Y:
                    lines.append("    x, z = c * x + s * z, c * z - s * x")
                elif kind == _X:
                    lines.append("    y, z = c * y - s * z, s * y + c * z")
                else:
                    lines += [f"    d = ({f(ax)} * x + {f(ay)} * y + {f(az)} * z) * (1.0 - c)",
                              f"    cx, cy, cz = {f(ay)} * z - {f(az)} * y, "
                              f"{f(az)} * x - {f(ax)} * z, {f(ax)} * y - {f(ay)} * x",
                              f"    x, y, z = (x * c + cx * s + {f(ax)} * d, "
                              f"y * c + cy * s + {f(ay)} * d, z * c + cz * s + {f(az)} * d)"]
            if pure:
                lines.append(f"    x, y, z = x + {f(tx)}, y + {f(ty)}, z + {f(tz)}")
            else:
                lines.append(f"    x, y, z = ("
                             f"{f(r00)} * x + {f(r01)} * y + {f(r02)} * z + {f(tx)}, "
                             f"{f(r10)} * x + {f(r11)} * y + {f(r12)} * z + {f(ty)}, "
                             f"{f(r20)} * x + {f(r21)} * y + {f(r22)} * z + {f(tz)})")
        lines.append("    return x, y, z")
        namespace: dict[str, object] = {"sqrt": math.sqrt, "cos": math.cos, "sin": math.sin}
        exec(compile("\n".join(lines) + "\n", f"<fk {self.arm.name}>", "exec"), namespace)
        return namespace["fk"]  # type: ignore[return-value]

    def tool_position(self, q: Sequence[float]) -> tuple[float, float, float]:
        """Return the tool position (m) in the root frame."""
        x, y, z = self._tip
        joints, pre = self._joints, self._pre
        for k in range(self.n_joints - 1, -1, -1):
            x, y, z = _move(joints[k], pre[k], q[k], x, y, z)
        return x, y, z

    def tool_position_and_levers(
        self, q: Sequence[float], out_levers: list[float]
    ) -> tuple[float, float, float]:
        """Return the tool position and fill `out_levers` with each axis's distance to the tool.

        The same arithmetic as `tool_position` (bit for bit), with the per-joint move inlined:
        this runs in the projection's control-loop path.
        """
        x, y, z = self._tip
        sqrt, cos, sin = math.sqrt, math.cos, math.sin
        for (k, kind, sign, ax, ay, az, pure, r00, r01, r02, r10, r11, r12, r20, r21, r22,
             tx, ty, tz) in self._rev:
            # (x, y, z) is the tool in joint k's frame, whose origin lies on its axis.
            qk = q[k]
            if kind == _Z:
                out_levers[k] = sqrt(x * x + y * y)
                c = cos(qk)
                s = sin(qk) * sign
                x, y = c * x - s * y, s * x + c * y
            elif kind == _Y:
                out_levers[k] = sqrt(x * x + z * z)
                c = cos(qk)
                s = sin(qk) * sign
                x, z = c * x + s * z, c * z - s * x
            elif kind == _X:
                out_levers[k] = sqrt(y * y + z * z)
                c = cos(qk)
                s = sin(qk) * sign
                y, z = c * y - s * z, s * y + c * z
            elif kind == _GENERAL:
                d = x * ax + y * ay + z * az
                out_levers[k] = sqrt(max(0.0, x * x + y * y + z * z - d * d))
                c = cos(qk)
                s = sin(qk) * sign
                d = (ax * x + ay * y + az * z) * (1.0 - c)
                cx, cy, cz = ay * z - az * y, az * x - ax * z, ax * y - ay * x
                x, y, z = (x * c + cx * s + ax * d, y * c + cy * s + ay * d,
                           z * c + cz * s + az * d)
            else:
                out_levers[k] = 1.0
                x, y, z = x + ax * qk, y + ay * qk, z + az * qk
            if pure:
                x, y, z = x + tx, y + ty, z + tz
            else:
                x, y, z = (r00 * x + r01 * y + r02 * z + tx,
                           r10 * x + r11 * y + r12 * z + ty,
                           r20 * x + r21 * y + r22 * z + tz)
        return x, y, z


def _move(
    joint: tuple[int, float, float, float, int],
    fixed: tuple[bool, tuple[tuple[float, ...], ...], tuple[float, float, float]],
    qk: float,
    x: float,
    y: float,
    z: float,
) -> tuple[float, float, float]:
    """Map a point from joint k's moving frame into its parent frame."""
    kind, ax, ay, az, sign = joint
    if kind == _PRISMATIC:
        x, y, z = x + ax * qk, y + ay * qk, z + az * qk
    else:
        c = math.cos(qk)
        s = math.sin(qk) * sign
        if kind == _Z:
            x, y = c * x - s * y, s * x + c * y
        elif kind == _Y:
            x, z = c * x + s * z, c * z - s * x
        elif kind == _X:
            y, z = c * y - s * z, s * y + c * z
        else:
            d = (ax * x + ay * y + az * z) * (1.0 - c)
            cx, cy, cz = ay * z - az * y, az * x - ax * z, ax * y - ay * x
            x, y, z = x * c + cx * s + ax * d, y * c + cy * s + ay * d, z * c + cz * s + az * d
    pure, rows, t = fixed
    if pure:
        return x + t[0], y + t[1], z + t[2]
    r0, r1, r2 = rows
    return (
        r0[0] * x + r0[1] * y + r0[2] * z + t[0],
        r1[0] * x + r1[1] * y + r1[2] * z + t[1],
        r2[0] * x + r2[1] * y + r2[2] * z + t[2],
    )

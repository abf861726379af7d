"""Streaming safety-filtered position commands to a joint_trajectory_controller (pure core).

A cell whose active controller is joint_trajectory_controller takes trajectory_msgs/
JointTrajectory, not the Float64MultiArray of forward_position_controller. Each command becomes
a one-point trajectory reached `time_from_start_s` after it arrives; the controller interpolates
from where the arm is, so a stream of such points tracks the filter's commands with one
`time_from_start_s` of lag and no jumps. A malformed command is dropped (the controller then
holds its last point), never forwarded: the safety filter's output is the only thing sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrajectoryPoint:
    """One streamed point: joint names in controller order, positions and when to reach them."""

    joint_names: tuple[str, ...]
    positions_rad: tuple[float, ...]
    time_from_start_s: float


@dataclass
class AdapterStats:
    """What the adapter has seen, for /diagnostics."""

    received: int = 0
    forwarded: int = 0
    rejected: int = 0
    last_reject_reason: str = ""
    reasons: dict[str, int] = field(default_factory=dict)


class TrajectoryStreamer:
    """Turn position commands (joint order = `joint_names`) into trajectory points."""

    def __init__(self, joint_names: list[str] | tuple[str, ...], time_from_start_s: float) -> None:
        if not joint_names or len(set(joint_names)) != len(joint_names):
            raise ValueError(f"expected distinct joint names, got {list(joint_names)}")
        if not (math.isfinite(time_from_start_s) and 0.0 < time_from_start_s <= 1.0):
            raise ValueError(f"expected time_from_start_s in (0, 1] s, got {time_from_start_s}")
        self.joint_names = tuple(joint_names)
        self.time_from_start_s = float(time_from_start_s)
        self.stats = AdapterStats()

    def convert(self, positions_rad: list[float] | tuple[float, ...]) -> TrajectoryPoint | None:
        """Return the point for one command, or None (counted with its reason) if malformed."""
        self.stats.received += 1
        values = [float(v) for v in positions_rad]
        reason = ""
        if len(values) != len(self.joint_names):
            reason = f"expected {len(self.joint_names)} positions, got {len(values)}"
        elif not all(math.isfinite(v) for v in values):
            reason = "non-finite position"
        if reason:
            self.stats.rejected += 1
            self.stats.last_reject_reason = reason
            key = reason.split(",")[0] if reason.startswith("expected") else reason
            self.stats.reasons[key] = self.stats.reasons.get(key, 0) + 1
            return None
        self.stats.forwarded += 1
        return TrajectoryPoint(self.joint_names, tuple(values), self.time_from_start_s)

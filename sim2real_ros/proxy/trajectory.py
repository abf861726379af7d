"""Follow a joint trajectory the way joint_trajectory_controller does (linear interpolation).

Only for the proxy's `joint_trajectory_controller` mode: a new trajectory replaces the old one
from the moment it starts, the first segment starts at the setpoint held when it arrived, and
after the last point the controller holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class _Trajectory:
    start_s: float
    times_s: np.ndarray  # (m,) absolute times of the points
    points: np.ndarray  # (m, n)
    origin: np.ndarray  # (n,) setpoint held when the trajectory arrived


class TrajectoryFollower:
    """Sample a position setpoint from the active trajectory."""

    def __init__(self, hold_rad: np.ndarray) -> None:
        self._hold = np.asarray(hold_rad, dtype=float).copy()
        self._active: _Trajectory | None = None

    def set_trajectory(
        self, now_s: float, start_s: float, time_from_start_s: np.ndarray, points: np.ndarray
    ) -> None:
        """Replace the active trajectory; start_s <= 0 means start now."""
        times = np.asarray(time_from_start_s, dtype=float)
        pts = np.asarray(points, dtype=float)
        if pts.ndim != 2 or pts.shape[0] != times.shape[0] or pts.shape[0] == 0:
            raise ValueError(f"expected m points with m times, got {pts.shape} and {times.shape}")
        if pts.shape[1] != self._hold.shape[0]:
            raise ValueError(f"points have {pts.shape[1]} joints, expected {self._hold.shape[0]}")
        if not np.all(np.isfinite(pts)) or not np.all(np.isfinite(times)):
            raise ValueError("trajectory has non-finite positions or times")
        if np.any(np.diff(times) <= 0) or times[0] < 0:
            raise ValueError(f"time_from_start must be non-negative and increasing: {times}")
        origin = self.sample(now_s)
        start = now_s if start_s <= 0 else start_s
        self._active = _Trajectory(start, start + times, pts, origin)

    def sample(self, t_s: float) -> np.ndarray:
        """Return the setpoint at time t_s."""
        tr = self._active
        if tr is None:
            return self._hold.copy()
        if t_s >= tr.times_s[-1]:
            self._hold = tr.points[-1].copy()
            self._active = None
            return self._hold.copy()
        if t_s <= tr.start_s:
            return tr.origin.copy()
        times = np.concatenate([[tr.start_s], tr.times_s])
        pts = np.vstack([tr.origin, tr.points])
        k = int(np.searchsorted(times, t_s, side="right")) - 1
        a = (t_s - times[k]) / (times[k + 1] - times[k])
        return (1.0 - a) * pts[k] + a * pts[k + 1]

    def hold(self, q_rad: np.ndarray) -> None:
        """Drop any trajectory and hold q (a forward command took over)."""
        self._active = None
        self._hold = np.asarray(q_rad, dtype=float).copy()

    @property
    def active(self) -> bool:
        """Whether a trajectory is being followed."""
        return self._active is not None

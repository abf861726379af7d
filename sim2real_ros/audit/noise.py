"""Sensor noise measured with the arm at rest: the real profile the simulator should inject.

A recording is cut into windows; a window is "at rest" when the linear trend of every joint
moves less than `max_motion_rad` across it. Within rest windows the residual about the trend is
the noise: its std per joint is the position noise, the std of the reported velocity the
velocity noise, the std of the F/T samples the force/torque noise. The median over windows
keeps one bump (someone touching the tool) from inflating the estimate. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim2real_ros.audit.evidence import MeasuredNoise


@dataclass(frozen=True)
class RestWindows:
    """Index ranges [start, stop) of the at-rest windows of one joint stream."""

    bounds: tuple[tuple[int, int], ...]
    t_bounds_s: tuple[tuple[float, float], ...]

    @property
    def total(self) -> int:
        """Number of at-rest windows."""
        return len(self.bounds)


def rest_windows(t_s: np.ndarray, position: np.ndarray, window_s: float = 0.5,
                 max_motion_rad: float = 2e-3, min_samples: int = 20) -> RestWindows:
    """Return the windows in which no joint's linear trend moves more than `max_motion_rad`."""
    t = np.asarray(t_s, dtype=float)
    q = np.asarray(position, dtype=float).reshape(len(t), -1)
    if t.size < min_samples:
        return RestWindows((), ())
    edges = np.arange(t[0], t[-1], window_s)
    # The last (possibly shorter) window runs to the end of the recording.
    idx = np.append(np.searchsorted(t, edges), t.size)
    bounds, tb = [], []
    for a, b in zip(idx[:-1], idx[1:], strict=True):
        if b - a < min_samples:
            continue
        tt = t[a:b] - t[a:b].mean()
        slope = (tt @ (q[a:b] - q[a:b].mean(axis=0))) / max(float(tt @ tt), 1e-12)
        if np.all(np.abs(slope) * (t[b - 1] - t[a]) <= max_motion_rad):
            bounds.append((int(a), int(b)))
            tb.append((float(t[a]), float(t[b - 1])))
    return RestWindows(tuple(bounds), tuple(tb))


def _detrended_std(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    tt = t - t.mean()
    xc = x - x.mean(axis=0)
    slope = (tt @ xc) / max(float(tt @ tt), 1e-12)
    return (xc - np.outer(tt, slope)).std(axis=0, ddof=1)


def joint_noise_at_rest(
    t_s: np.ndarray,
    position: np.ndarray,
    velocity: np.ndarray | None,
    source: str,
    window_s: float = 0.5,
    max_motion_rad: float = 2e-3,
    min_windows: int = 2,
    effort: np.ndarray | None = None,
) -> tuple[list[MeasuredNoise], RestWindows]:
    """Return measured position (velocity, effort) noise per joint, and the rest windows used.

    Empty when fewer than `min_windows` windows are at rest: no rest, no noise measurement.
    """
    t = np.asarray(t_s, dtype=float)
    q = np.asarray(position, dtype=float).reshape(len(t), -1)
    win = rest_windows(t, q, window_s, max_motion_rad)
    if win.total < min_windows:
        return [], win
    pos = np.median([_detrended_std(t[a:b], q[a:b]) for a, b in win.bounds], axis=0)
    n = sum(b - a for a, b in win.bounds)
    out = [MeasuredNoise("joint_position_std_rad", tuple(float(v) for v in pos), source, n)]
    if velocity is not None:
        v = np.asarray(velocity, dtype=float).reshape(len(t), -1)
        if np.all(np.isfinite(v)):
            vel = np.median([v[a:b].std(axis=0, ddof=1) for a, b in win.bounds], axis=0)
            out.append(MeasuredNoise("joint_velocity_std_rad_s", tuple(float(x) for x in vel),
                                     source, n))
    if effort is not None:
        e = np.asarray(effort, dtype=float).reshape(len(t), -1)
        if np.all(np.isfinite(e)):
            # Holding torque is constant at rest; its trend is not noise.
            eff = np.median([_detrended_std(t[a:b], e[a:b]) for a, b in win.bounds], axis=0)
            out.append(MeasuredNoise("joint_effort_std_nm", tuple(float(x) for x in eff),
                                     source, n))
    return out, win


def wrench_noise_at_rest(t_s: np.ndarray, wrench: np.ndarray, windows: RestWindows,
                         source: str, min_samples: int = 20) -> list[MeasuredNoise]:
    """Return F/T force and torque noise per axis over the joints' rest windows (by time)."""
    t = np.asarray(t_s, dtype=float)
    w = np.asarray(wrench, dtype=float).reshape(len(t), 6)
    stds = []
    n = 0
    for t0, t1 in windows.t_bounds_s:
        sel = (t >= t0) & (t <= t1)
        if sel.sum() >= min_samples:
            stds.append(_detrended_std(t[sel], w[sel]))
            n += int(sel.sum())
    if not stds:
        return []
    s = np.median(stds, axis=0)
    return [MeasuredNoise("ft_force_std_n", tuple(float(v) for v in s[:3]), source, n),
            MeasuredNoise("ft_torque_std_nm", tuple(float(v) for v in s[3:]), source, n)]

"""Joint encoder and F/T sensor models: noise, constant bias, random-walk drift, quantization."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def _z(n: int) -> np.ndarray:
    return np.zeros(n)


@dataclass
class SensorParams:
    """Per-joint and per-axis sensor imperfections (standard deviations are 1σ)."""

    position_noise_rad: np.ndarray = field(default_factory=lambda: _z(0))
    velocity_noise_rad_s: np.ndarray = field(default_factory=lambda: _z(0))
    effort_noise_nm: np.ndarray = field(default_factory=lambda: _z(0))
    position_bias_rad: np.ndarray = field(default_factory=lambda: _z(0))
    position_drift_rad_per_sqrt_s: np.ndarray = field(default_factory=lambda: _z(0))
    position_quantization_rad: np.ndarray = field(default_factory=lambda: _z(0))
    velocity_quantization_rad_s: np.ndarray = field(default_factory=lambda: _z(0))
    ft_force_noise_n: np.ndarray = field(default_factory=lambda: _z(3))
    ft_torque_noise_nm: np.ndarray = field(default_factory=lambda: _z(3))
    ft_force_bias_n: np.ndarray = field(default_factory=lambda: _z(3))
    ft_torque_bias_nm: np.ndarray = field(default_factory=lambda: _z(3))

    @classmethod
    def zeros(cls, n: int) -> SensorParams:
        """Return ideal sensors for n joints."""
        return cls(*(_z(n) for _ in range(7)), _z(3), _z(3), _z(3), _z(3))


def quantize(values: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Round to the nearest multiple of step where step > 0."""
    on = step > 0
    safe = np.where(on, step, 1.0)
    rounded = np.rint(values / safe) * safe
    return rounded if on.all() else np.where(on, rounded, values)


class SensorModel:
    """Turns true joint states and wrenches into what the encoders and the F/T sensor report."""

    def __init__(self, params: SensorParams, rng: np.random.Generator) -> None:
        self._rng = rng
        self.params = params
        self.reset()

    @property
    def params(self) -> SensorParams:
        """The sensor parameters in force."""
        return self._params

    @params.setter
    def params(self, p: SensorParams) -> None:
        self._params = p
        n = p.position_bias_rad.shape[0]
        self._n = n
        # Which effects are on is fixed per draw: decide once, and keep the number of numpy
        # calls per sample small (each costs about a microsecond for six joints).
        self._std3 = np.concatenate(
            [p.position_noise_rad, p.velocity_noise_rad_s, p.effort_noise_nm]
        )
        self._noisy = bool(np.any(self._std3 > 0))
        self._drifting = bool(np.any(p.position_drift_rad_per_sqrt_s > 0))
        self._pq = self._quantizer(p.position_quantization_rad)
        self._vq = self._quantizer(p.velocity_quantization_rad_s)
        self._ft_bias = np.concatenate([p.ft_force_bias_n, p.ft_torque_bias_nm])
        self._ft_std = np.concatenate([p.ft_force_noise_n, p.ft_torque_noise_nm])
        self._ft_noise = bool(np.any(self._ft_std > 0))

    @staticmethod
    def _quantizer(step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool] | None:
        on = step > 0
        if not on.any():
            return None
        safe = np.where(on, step, 1.0)
        return 1.0 / safe, safe, on, bool(on.all())

    @staticmethod
    def _quantize(values: np.ndarray, q: tuple[np.ndarray, np.ndarray, np.ndarray, bool]
                  ) -> np.ndarray:
        inv, step, on, every = q
        rounded = np.rint(values * inv) * step
        return rounded if every else np.where(on, rounded, values)

    def reset(self) -> None:
        """Zero the drift (a re-homed encoder) and restart its clock."""
        self.drift_rad = np.zeros_like(self._params.position_bias_rad)
        self._last_stamp_s: float | None = None

    def advance_drift(self, stamp_s: float) -> None:
        """Let the random walk evolve to stamp_s: its variance grows by σ²·Δt."""
        last = self._last_stamp_s
        if last is not None and self._drifting and stamp_s > last:
            scale = math.sqrt(stamp_s - last)
            self.drift_rad = self.drift_rad + self._rng.standard_normal(self._n) * (
                self._params.position_drift_rad_per_sqrt_s * scale
            )
        if last is None or stamp_s > last:
            self._last_stamp_s = stamp_s

    def joints(
        self, stamp_s: float, q: np.ndarray, qd: np.ndarray, tau: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return measured (position, velocity, effort) for true values taken at stamp_s."""
        n = self._n
        self.advance_drift(stamp_s)
        q_m = q + (self._params.position_bias_rad + self.drift_rad)
        if self._noisy:
            z = self._rng.standard_normal(3 * n) * self._std3
            q_m = q_m + z[:n]
            qd_m = qd + z[n : 2 * n]
            tau_m = tau + z[2 * n :]
        else:
            qd_m, tau_m = np.array(qd, dtype=float), np.array(tau, dtype=float)
        if self._pq is not None:
            q_m = self._quantize(q_m, self._pq)
        if self._vq is not None:
            qd_m = self._quantize(qd_m, self._vq)
        return q_m, qd_m, tau_m

    def wrench(self, wrench: np.ndarray) -> np.ndarray:
        """Return the measured F/T wrench [fx fy fz tx ty tz]."""
        out = wrench + self._ft_bias
        if self._ft_noise:
            out = out + self._rng.standard_normal(6) * self._ft_std
        return out

"""Joint encoder and F/T sensor models: noise, constant bias, random-walk drift, quantization."""

from __future__ import annotations

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
        # Which effects are on is fixed per draw: decide once, not on every sample.
        self._on = {
            "pn": bool(np.any(p.position_noise_rad > 0)),
            "vn": bool(np.any(p.velocity_noise_rad_s > 0)),
            "en": bool(np.any(p.effort_noise_nm > 0)),
            "pq": bool(np.any(p.position_quantization_rad > 0)),
            "vq": bool(np.any(p.velocity_quantization_rad_s > 0)),
            "drift": bool(np.any(p.position_drift_rad_per_sqrt_s > 0)),
        }
        self._ft_bias = np.concatenate([p.ft_force_bias_n, p.ft_torque_bias_nm])
        self._ft_std = np.concatenate([p.ft_force_noise_n, p.ft_torque_noise_nm])
        self._ft_noise = bool(np.any(self._ft_std > 0))

    def reset(self) -> None:
        """Zero the drift (a re-homed encoder) and restart its clock."""
        self.drift_rad = np.zeros_like(self._params.position_bias_rad)
        self._last_stamp_s: float | None = None

    def advance_drift(self, stamp_s: float) -> None:
        """Let the random walk evolve to stamp_s: its variance grows by σ²·Δt."""
        if self._last_stamp_s is not None and self._on["drift"]:
            dt = max(stamp_s - self._last_stamp_s, 0.0)
            sigma = self._params.position_drift_rad_per_sqrt_s
            self.drift_rad = self.drift_rad + self._rng.standard_normal(sigma.shape) * (
                sigma * np.sqrt(dt)
            )
        if self._last_stamp_s is None or stamp_s > self._last_stamp_s:
            self._last_stamp_s = stamp_s

    def joints(
        self, stamp_s: float, q: np.ndarray, qd: np.ndarray, tau: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return measured (position, velocity, effort) for true values taken at stamp_s."""
        p, on, rng = self._params, self._on, self._rng
        self.advance_drift(stamp_s)
        q_m = q + p.position_bias_rad + self.drift_rad
        if on["pn"]:
            q_m = q_m + rng.standard_normal(q.shape) * p.position_noise_rad
        qd_m = qd + rng.standard_normal(q.shape) * p.velocity_noise_rad_s if on["vn"] else qd
        tau_m = tau + rng.standard_normal(q.shape) * p.effort_noise_nm if on["en"] else tau
        if on["pq"]:
            q_m = quantize(q_m, p.position_quantization_rad)
        if on["vq"]:
            qd_m = quantize(qd_m, p.velocity_quantization_rad_s)
        return q_m, np.array(qd_m, dtype=float), np.array(tau_m, dtype=float)

    def wrench(self, wrench: np.ndarray) -> np.ndarray:
        """Return the measured F/T wrench [fx fy fz tx ty tz]."""
        out = wrench + self._ft_bias
        if self._ft_noise:
            out = out + self._rng.standard_normal(6) * self._ft_std
        return out

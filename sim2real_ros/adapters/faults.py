"""Observation faults for scripted fault injection: a glitching sensor on one node's input.

The demo's "uncertainty spike" is made the way one happens on a cell: the policy's view of the
arm goes wrong (an encoder offset, velocity noise) while the arm, the safety filter and the
baseline still see the truth. The policy's ensemble then disagrees and its OOD score rises, and
everything downstream (fallback, shadow metrics, gates) reacts to its real confidence output.
Seeded, so a demo run is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ObservationFault:
    """What is added to the observation while the fault is on (zero = healthy)."""

    position_offset_rad: float = 0.0
    velocity_noise_rad_s: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.position_offset_rad):
            raise ValueError(f"position_offset_rad must be finite, got {self.position_offset_rad}")
        if not (math.isfinite(self.velocity_noise_rad_s) and self.velocity_noise_rad_s >= 0):
            raise ValueError(
                f"velocity_noise_rad_s must be finite and >= 0, got {self.velocity_noise_rad_s}")

    @property
    def active(self) -> bool:
        """Return whether the fault changes anything."""
        return self.position_offset_rad != 0.0 or self.velocity_noise_rad_s > 0.0


class ObservationFaultInjector:
    """Apply an ObservationFault to joint positions and velocities, with seeded noise."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)
        self.fault = ObservationFault()
        self.applied = 0

    def apply(self, position: np.ndarray, velocity: np.ndarray | None
              ) -> tuple[np.ndarray, np.ndarray | None]:
        """Return the (possibly faulted) position and velocity; inputs are not modified."""
        f = self.fault
        if not f.active:
            return position, velocity
        self.applied += 1
        q = np.asarray(position, dtype=float) + f.position_offset_rad
        qd = velocity
        if velocity is not None and f.velocity_noise_rad_s > 0.0:
            v = np.asarray(velocity, dtype=float)
            qd = v + self._rng.normal(0.0, f.velocity_noise_rad_s, size=v.shape)
        return q, qd

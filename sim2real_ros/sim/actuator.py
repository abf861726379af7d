"""Command-side actuator effects of a position drive: deadband and gear backlash.

Motor lag, gains and torque limits act inside the drive's servo loop and live in the plant
(PlantParams); what is here shapes the position target before the servo sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ActuatorParams:
    """Per-joint deadband and backlash of the position drives."""

    deadband_rad: np.ndarray = field(default_factory=lambda: np.zeros(0))
    backlash_rad: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def zeros(cls, n: int) -> ActuatorParams:
        """Return ideal actuators for n joints."""
        return cls(np.zeros(n), np.zeros(n))


class ActuatorModel:
    """Shapes position targets: ignores moves inside the deadband, plays out backlash."""

    def __init__(self, params: ActuatorParams, q0: np.ndarray) -> None:
        self.params = params
        self.reset(q0)

    def reset(self, q0: np.ndarray) -> None:
        """Start with the drive holding q0 and the gear play centred."""
        self._held = np.array(q0, dtype=float)  # last target the drive accepted
        self._output = np.array(q0, dtype=float)  # link-side target after the backlash

    def position_target(self, commanded_rad: np.ndarray) -> np.ndarray:
        """Return the link-side target the servo tracks for a commanded position."""
        cmd = np.asarray(commanded_rad, dtype=float)
        db = self.params.deadband_rad
        # Deadband: a drive ignores a new set-point closer than the deadband to the one it holds.
        moved = np.abs(cmd - self._held) > db
        self._held = np.where(moved, cmd, self._held)
        # Backlash (play operator): the link side only follows once the play b is taken up, so
        # a reversal leaves a dead zone of width b.
        half = 0.5 * self.params.backlash_rad
        self._output = np.clip(self._output, self._held - half, self._held + half)
        return self._output.copy()

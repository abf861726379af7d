"""Keep a simulated plant in step with the wall clock, as a hardware-in-the-loop plant must run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WallClockSync:
    """Map wall-clock time onto plant time; when the host stalls, drop time instead of racing.

    A real arm does not speed up to make up for a late controller: if the process was starved
    for longer than `max_catchup_s`, the plant catches up only that much and the rest is counted
    as an overrun (the plant then lags the wall clock by the dropped amount, like a missed cycle).
    """

    max_catchup_s: float
    epoch_s: float = 0.0  # wall time that corresponds to plant time 0
    overruns: int = 0
    dropped_s: float = 0.0

    def start(self, wall_now_s: float, plant_time_s: float) -> None:
        """Anchor plant time `plant_time_s` at wall time `wall_now_s`."""
        self.epoch_s = wall_now_s - plant_time_s

    def target(self, wall_now_s: float, plant_time_s: float) -> float:
        """Return the plant time to advance to now, counting and dropping excess lag."""
        want = wall_now_s - self.epoch_s
        behind = want - plant_time_s
        if behind > self.max_catchup_s:
            drop = behind - self.max_catchup_s
            self.epoch_s += drop
            self.dropped_s += drop
            self.overruns += 1
            want -= drop
        return want

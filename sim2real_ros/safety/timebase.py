"""The time step the safety projection differentiates commands over (`rate_time_base`).

The projection limits the velocity, acceleration and jerk of the command by dividing its change
between ticks by dt. Ticks follow command arrival (`tick_on_command`), and on a loaded host
arrivals jitter by milliseconds: a command that comes 3 ms early, divided by its 7 ms arrival
interval, reads 40 % faster than the policy made it, so a stream that is smooth at the nominal
period gets reshaped and the rollback monitor counts interventions that no motion caused.

- `arrival`: the measured interval since the previous tick, clamped to [0.5, 2] periods (the
  behaviour before this parameter existed).
- `nominal`: always the control period.
- `smoothed` (default): an exponentially weighted mean m of the measured intervals (each
  clamped to [0.5, 2] periods first, so one pause does not swamp it) with a time constant of
  `smoothing_ticks` ticks; dt is the period unless m is shorter than the period by more than
  `band_fraction` of it, then m. Millisecond jitter averages out; a source that sustains a
  rate more than `band_fraction` above the control rate gets its long-run rate limited (m
  crosses a 5 % band a few ticks after a jump to twice the rate, and settles in about
  `smoothing_ticks` more).

The band is one-sided. A stream slower than the control rate, projected with the period, moves
more slowly in real time than the limits it was projected with (its real rates are the
projected ones times period/interval < 1): the period is the safe dt for it, and a longer dt
would only loosen the limits. Before, m above the band (a policy node descheduled for a few
ticks on a loaded host: its 20-tick mean reached 10.5-11.8 ms in the transfer experiment) also
switched dt to m, and the switch itself reshaped the stream (see "Why the band"): 9 of the 20
disturbances in one 30-target proxy evaluation started at such a switch.

Why the band: the projection differentiates the command three times, and a dt that changes from
one tick to the next is itself a jerk. At 1.4 rad/s and a 10 ms period a 1.5 % change of dt
between ticks reads as ~200 rad/s^3, three times the envelope's jerk limit, so a dt that merely
wanders with the jitter (even smoothed) still reshapes a smooth stream. With the defaults
(20 ticks, 5 %) arrival jitter up to about +-4 ms at 100 Hz keeps m inside the band.

Staleness and latency checks do not use this: they read real arrival times and stamps.
"""

from __future__ import annotations

import math

ARRIVAL = "arrival"
NOMINAL = "nominal"
SMOOTHED = "smoothed"
RATE_TIME_BASES = (ARRIVAL, NOMINAL, SMOOTHED)
DEFAULT_SMOOTHING_TICKS = 20.0
DEFAULT_BAND_FRACTION = 0.05


class RateTimeBase:
    """Turn tick times into the dt the projection uses, per `mode` (see module docstring)."""

    def __init__(self, mode: str, period_s: float,
                 smoothing_ticks: float = DEFAULT_SMOOTHING_TICKS,
                 band_fraction: float = DEFAULT_BAND_FRACTION) -> None:
        if mode not in RATE_TIME_BASES:
            raise ValueError(f"rate_time_base {mode!r}: expected one of {list(RATE_TIME_BASES)}")
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s {period_s!r}: expected a finite number > 0 s")
        if not (math.isfinite(smoothing_ticks) and smoothing_ticks >= 1.0):
            raise ValueError(f"smoothing_ticks {smoothing_ticks!r}: expected a number >= 1")
        if not (math.isfinite(band_fraction) and 0.0 <= band_fraction < 0.5):
            raise ValueError(f"band_fraction {band_fraction!r}: expected a number in [0, 0.5)")
        self.band_s = float(band_fraction) * float(period_s)
        self.mode = mode
        self.period_s = float(period_s)
        self.min_s = 0.5 * self.period_s
        self.max_s = 2.0 * self.period_s
        self._alpha = 1.0 / float(smoothing_ticks)
        self._last_s: float | None = None
        self.smoothed_s = self.period_s
        self.last_interval_s = math.nan  # raw measured interval of the latest tick, s
        self.last_dt_s = self.period_s  # the dt the latest tick returned, s

    def reset(self) -> None:
        """Forget the tick history (the next tick uses the nominal period)."""
        self._last_s = None
        self.smoothed_s = self.period_s
        self.last_interval_s = math.nan
        self.last_dt_s = self.period_s

    def tick(self, now_s: float, hold: bool = False) -> float:
        """Record a tick at `now_s` and return the dt (s) its projection should use.

        `hold`: the filter drives no source this tick, it brakes its last output on its own
        timer. There is no source timing to follow, and a dt that moved between ticks (the
        smoothed mean crossing its band on a loaded host) would read as motion and keep the
        held command creeping, so every mode returns the period (the tick still counts).
        """
        dt = self._dt(now_s)
        self.last_dt_s = self.period_s if hold else dt
        return self.last_dt_s

    def _dt(self, now_s: float) -> float:
        last, self._last_s = self._last_s, now_s
        if last is None or not now_s > last:
            # First tick, or a clock that did not advance (or jumped back): nothing measured.
            self.last_interval_s = math.nan
            return self._smoothed_dt() if self.mode == SMOOTHED else self.period_s
        self.last_interval_s = now_s - last
        measured = min(max(self.last_interval_s, self.min_s), self.max_s)
        if self.mode == ARRIVAL:
            return measured
        if self.mode == NOMINAL:
            return self.period_s
        self.smoothed_s += self._alpha * (measured - self.smoothed_s)
        return self._smoothed_dt()

    def _smoothed_dt(self) -> float:
        if self.smoothed_s >= self.period_s - self.band_s:
            return self.period_s  # within the band, or slower: the period is the safe dt
        return self.smoothed_s

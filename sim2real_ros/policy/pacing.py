"""The policy node's command pacing: at most one command per control period, ticks dropped.

rclpy runs an overdue timer again as soon as the executor gets to it, so after the policy
node's process was descheduled (a loaded host), its 100 Hz timer fired two or three times within
a millisecond, each answering a new joint state with the next 10 ms of its jerk-limited command
trajectory: 30 ms of trajectory in 0.6 ms (measured on the proxy cell). The safety filter runs
at most twice per period (`safety/ticks.py`): it projected the first and the last, the one in
between was superseded, and the skipped sample read as a jump beyond the acceleration limit.

A tick less than `min_gap_periods` of a period after the previous command is therefore
dropped (counted): its observation is answered by the next tick of the timer's own schedule,
so the stream's samples stay consecutive steps of the trajectory and only their spacing
stretches (the arm holds its setpoint a little longer, as after any late packet).

History of this rule (docs/policy.md): a first version *deferred* such a tick to the gap with
a one-shot timer. Each deferral moved the next command closer to the timer's next tick, which
was then deferred in turn: in two of four 30-target evaluations ~500 ticks cascaded. Dropping
was tried then too and lowered the stream's mean rate by ~8 %, which moved the filter's
smoothed time base out of its band and reshaped every command; the band is now one-sided (a
slower stream keeps the period: `safety/timebase.py`), so dropping costs nothing there.

No clocks here: the node passes `now` (s, monotonic) in. Tests: test_policy_pacing.py.
"""

from __future__ import annotations

import math

DEFAULT_MIN_GAP_PERIODS = 0.5


class CommandPacer:
    """Decide per timer tick whether a command may be sent now."""

    def __init__(self, period_s: float, min_gap_periods: float = DEFAULT_MIN_GAP_PERIODS) -> None:
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s {period_s!r}: expected a finite number > 0 s")
        if not (math.isfinite(min_gap_periods) and 0.0 <= min_gap_periods < 1.0):
            raise ValueError(f"min_command_gap_periods {min_gap_periods!r}: expected a number "
                             "in [0, 1) periods")
        self.min_gap_s = float(min_gap_periods) * float(period_s)
        self._last_sent_s: float | None = None
        self.skipped = 0  # ticks dropped because the previous command was too recent

    def may_send(self, now_s: float) -> bool:
        """True when a command may be sent now; False drops this tick (and counts it)."""
        last = self._last_sent_s
        if last is not None and 0.0 <= now_s - last < self.min_gap_s:
            self.skipped += 1
            return False
        return True

    def sent(self, now_s: float) -> None:
        """A command was sent at `now_s`."""
        self._last_sent_s = now_s

    def reset(self) -> None:
        """Forget the last command (after a stop: the next one goes at once)."""
        self._last_sent_s = None

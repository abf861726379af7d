"""When the safety filter's loop runs (`tick_on_command`, `late_command_grace_periods`).

The filter projects the driving source's latest command once per tick. With `tick_on_command`
the loop runs when that command arrives, and the 100 Hz timer is the backstop for when commands
stop. Two clocks then meet: the source's (the policy node's timer, the baseline's) and the
filter's. On a loaded host the source's commands arrive with milliseconds of jitter (p5/p95
7.4/12.7 ms at 100 Hz in the transfer experiment). With a timer that ran whenever 0.9 period
had passed since the last tick, a command 1-3 ms late found the timer had already run: it
re-projected the previous command (a request that implies a sudden stop, which the
acceleration and jerk limits reshape), and the late command, arriving within half a period of
that tick, waited for the next one, where the command after it replaced it unseen. One late
command became a repeated and a skipped sample: an intervention, a command that was not the
policy's, which the policy then continued from. Measured on the proxy arm: the policy adopted
the filter's command on 25 % of its steps (6 % with the same projector and one tick per
command offline), and its closed loop oscillated.

The rule here: a tick per new command of the driving source (none dropped, none repeated) as
long as the stream keeps coming; the timer ticks only when there is a command not yet
projected, when the filter holds (it brakes on its own clock), when commands are off (no
`tick_on_command`), or when the driving source's last command is `grace_periods` periods old:
then the stream is late, and the filter ticks every period again, re-projecting (braking
along) the last command until the source's watchdog (`command_timeout_s`) takes it away.
Between a command and that grace the arm holds its last setpoint, which is what a
ros2_control forward controller does with a late packet.

No clocks here: the node passes `now` (s, monotonic) in. Unit-tested in test_safety_ticks.py.
"""

from __future__ import annotations

import math

DEFAULT_GRACE_PERIODS = 1.5
# A command arriving this soon after a tick waits for the timer: the loop runs at most twice per
# period, which the rate time base's interval clamp ([0.5, 2] periods) assumes (a faster tick
# rate would let a flooding source move faster in real time than the limits it is projected
# with). Two commands of a 100 Hz stream arrive closer than this only after a stall of the
# source (then the older one is superseded, counted in `superseded`; the policy node can pace
# its commands against that: policy/pacing.py).
MIN_GAP_PERIODS = 0.5
# The timer's own spacing: it runs when this much of a period has passed since the last tick.
TIMER_GAP_PERIODS = 0.9


class TickScheduler:
    """Decide, per command arrival and per timer callback, whether the loop runs now."""

    def __init__(self, period_s: float, tick_on_command: bool = True,
                 grace_periods: float = DEFAULT_GRACE_PERIODS) -> None:
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s {period_s!r}: expected a finite number > 0 s")
        if not (math.isfinite(grace_periods) and 1.0 <= grace_periods <= 10.0):
            raise ValueError(f"late_command_grace_periods {grace_periods!r}: expected a number "
                             "in [1, 10] periods")
        self.period_s = float(period_s)
        self.tick_on_command = bool(tick_on_command)
        self.grace_s = float(grace_periods) * self.period_s
        self._last_tick_s: float | None = None
        self._last_command_s: float | None = None
        self._pending = False
        self.late_ticks = 0  # timer ticks that ran because the driving stream was late
        self.superseded = 0  # commands replaced by a newer one before a tick projected them

    def on_command(self, now_s: float) -> bool:
        """A command of the driving source arrived: return True when the loop should run now."""
        if self._pending:
            self.superseded += 1
        self._pending = True
        self._last_command_s = now_s
        if not self.tick_on_command:
            return False
        return (self._last_tick_s is None
                or now_s - self._last_tick_s >= MIN_GAP_PERIODS * self.period_s)

    def on_timer(self, now_s: float, holding: bool) -> bool:
        """The timer fired: return True when the loop should run now.

        `holding`: the filter drives no source (it brakes its last output on its own clock).
        """
        last = self._last_tick_s
        if last is not None and 0.0 <= now_s - last < TIMER_GAP_PERIODS * self.period_s:
            return False
        if not self.tick_on_command or holding or self._pending or self._last_command_s is None:
            return True
        if now_s - self._last_command_s >= self.grace_s:
            self.late_ticks += 1
            return True
        return False

    def ticked(self, now_s: float) -> None:
        """The loop ran at `now_s` (it projected whatever command was latest)."""
        self._last_tick_s = now_s
        self._pending = False

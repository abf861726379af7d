"""Freshness of every input stream: stale by arrival or by stamp, out of order, clock jumps.

Times are float seconds of the node's clock (ROS time: sim time under use_sim_time). The watchdog
never reads a clock itself; the node passes `now_s`, so every rule is unit-testable to the tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Reasons a stream is not usable (status strings in events and diagnostics).
FRESH = ""
MISSING = "missing"  # nothing received yet (or nothing since a clock jump)
STALE_ARRIVAL = "stale_arrival"  # no message for longer than the timeout
STALE_STAMP = "stale_stamp"  # the newest message describes a moment too long ago


@dataclass
class StreamWatch:
    """Tracks one input stream's last arrival time and last header stamp."""

    name: str
    timeout_s: float  # max time since the last arrival
    max_age_s: float  # max age of the last stamp relative to the reference time
    future_tolerance_s: float = 0.005  # how far a stamp may lead the reference time
    last_arrival_s: float | None = None
    last_stamp_s: float | None = None
    rejected_out_of_order: int = 0
    rejected_future: int = 0

    def accept(self, now_s: float, stamp_s: float, reference_s: float | None = None) -> str:
        """Record a message; return '' if accepted, else why it was rejected.

        `reference_s` is the time the stamp is compared with (the node clock for measured
        streams, the newest joint_states stamp for commands that answer an observation).
        """
        ref = now_s if reference_s is None else reference_s
        if not math.isfinite(stamp_s):
            return "non_finite_stamp"
        if self.last_stamp_s is not None and stamp_s < self.last_stamp_s:
            self.rejected_out_of_order += 1
            return "out_of_order"
        if stamp_s > ref + self.future_tolerance_s:
            self.rejected_future += 1
            return "future_stamp"
        self.last_stamp_s = stamp_s
        self.last_arrival_s = now_s
        return ""

    def status(self, now_s: float, reference_s: float | None = None) -> str:
        """Return '' if the stream is fresh at now_s, else MISSING/STALE_ARRIVAL/STALE_STAMP."""
        if self.last_arrival_s is None or self.last_stamp_s is None:
            return MISSING
        if now_s - self.last_arrival_s > self.timeout_s:
            return STALE_ARRIVAL
        ref = now_s if reference_s is None else reference_s
        if ref - self.last_stamp_s > self.max_age_s:
            return STALE_STAMP
        return FRESH

    def describe(self, now_s: float, reference_s: float | None = None) -> str:
        """`status` in words, with the figure that failed and its limit (for events/logs)."""
        status = self.status(now_s, reference_s)
        if status == FRESH:
            return f"{self.name} fresh"
        if self.last_arrival_s is None or self.last_stamp_s is None:
            return f"{self.name} {status}"
        if status == STALE_ARRIVAL:
            return (f"{self.name} {status}: last message {now_s - self.last_arrival_s:.3f} s "
                    f"ago > {self.timeout_s} s")
        ref = now_s if reference_s is None else reference_s
        return (f"{self.name} {status}: stamp {ref - self.last_stamp_s:.3f} s older than the "
                f"reference > {self.max_age_s} s")

    def stale_since(self) -> float | None:
        """Return when the stream became (or will become) stale by arrival; None if never seen."""
        if self.last_arrival_s is None:
            return None
        return self.last_arrival_s + self.timeout_s

    def forget(self) -> None:
        """Drop what was received (after a clock jump nothing old can be trusted)."""
        self.last_arrival_s = None
        self.last_stamp_s = None


@dataclass
class ClockGuard:
    """Detects the node clock jumping backwards or stalling and then leaping forwards."""

    period_s: float
    max_forward_jump_s: float = 0.5
    backward_tolerance_s: float = 1e-6
    last_now_s: float | None = None
    jumps: int = 0

    def check(self, now_s: float) -> str:
        """Return '' for a normal tick, else 'backward' or 'forward' (and count the jump)."""
        prev = self.last_now_s
        self.last_now_s = now_s
        if prev is None:
            return ""
        if now_s < prev - self.backward_tolerance_s:
            self.jumps += 1
            return "backward"
        if now_s - prev > self.max_forward_jump_s:
            self.jumps += 1
            return "forward"
        return ""

"""When the safety filter's loop runs: one tick per command of a jittered stream, none repeated.

The old rule (the timer ran whenever 0.9 period had passed since the last tick) turned a
command 1-3 ms late into a repeated sample (the timer re-projected the previous command) and a
skipped one (the late command waited and was replaced). These tests drive `TickScheduler`
with the event sequence a jittered 100 Hz source and a 100 Hz timer produce.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from sim2real_ros.safety.ticks import (
    DEFAULT_GRACE_PERIODS,
    MIN_GAP_PERIODS,
    TIMER_GAP_PERIODS,
    TickScheduler,
)

PERIOD = 0.01


def simulate(sched: TickScheduler | None, arrivals: np.ndarray, t_end: float,
             timer_phase: float = 0.0031) -> tuple[list[int], int]:
    """Run a 100 Hz timer against command arrivals; return, per tick, which command it
    projected (the latest arrived), and the number of ticks. `sched=None`: the old rule."""
    events: list[tuple[float, int, int]] = []  # (time, kind 0 = command 1 = timer, index)
    for k, t in enumerate(arrivals):
        heapq.heappush(events, (float(t), 0, k))
    t = timer_phase
    while t < t_end:
        heapq.heappush(events, (t, 1, -1))
        t += PERIOD
    latest = -1
    last_tick: float | None = None
    projected: list[int] = []
    while events:
        now, kind, k = heapq.heappop(events)
        if kind == 0:
            latest = k
            if sched is not None:
                run = sched.on_command(now)
            else:
                run = last_tick is None or now - last_tick >= 0.5 * PERIOD
        else:
            if sched is not None:
                run = sched.on_timer(now, holding=False)
            else:
                run = last_tick is None or now - last_tick >= 0.9 * PERIOD
        if run:
            if sched is not None:
                sched.ticked(now)
            last_tick = now
            projected.append(latest)
    return projected, len(projected)


def jittered_stream(seed: int, n: int, jitter_s: float) -> np.ndarray:
    """A 100 Hz source whose sends are late by up to `jitter_s` (a loaded host's scheduler)."""
    rng = np.random.default_rng(seed)
    t = 0.001 + PERIOD * np.arange(n) + rng.uniform(0.0, jitter_s, n)
    return np.sort(t)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jittered_stream_is_projected_once_per_command(seed: int) -> None:
    arrivals = jittered_stream(seed, 500, 0.005)
    sched = TickScheduler(PERIOD)
    projected, _ = simulate(sched, arrivals, arrivals[-1] + 0.001)
    # Every command projected exactly once, in order: no repeats, no skips (after the first
    # two, whose timing against the timer's phase is start-up).
    cmds = [k for k in projected if k >= 2]
    assert cmds == list(range(2, len(arrivals))), (
        f"repeated: {len(cmds) - len(set(cmds))}, skipped: {len(arrivals) - 2 - len(set(cmds))}")
    assert sched.superseded <= 1 and sched.late_ticks == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_old_rule_repeated_and_skipped_commands_of_the_same_stream(seed: int) -> None:
    """The regression this module fixes, shown on the same event sequence."""
    arrivals = jittered_stream(seed, 500, 0.005)
    projected, _ = simulate(None, arrivals, arrivals[-1] + 0.001)
    cmds = [k for k in projected if k >= 0]
    repeats = len(cmds) - len(set(cmds))
    skips = len(arrivals) - len(set(cmds))
    assert repeats > 10 and skips > 10


def test_a_stopped_stream_ticks_every_period_after_the_grace() -> None:
    arrivals = jittered_stream(0, 50, 0.0)
    sched = TickScheduler(PERIOD)
    t_stop = arrivals[-1]
    projected, _ = simulate(sched, arrivals, t_stop + 0.2)
    # After the last command, the timer keeps the loop going (re-projecting the last command)
    # from grace periods on: ~ (0.2 s - grace) / period ticks.
    after = len(projected) - len(arrivals)
    expected = (0.2 - DEFAULT_GRACE_PERIODS * PERIOD) / PERIOD
    assert expected - 2 <= after <= expected + 1
    assert sched.late_ticks == after


def test_timer_rules_hold_no_command_and_tick_on_command_off() -> None:
    s = TickScheduler(PERIOD)
    assert s.on_timer(0.0, holding=False)  # nothing received yet: the timer drives
    s.ticked(0.0)
    assert not s.on_timer(0.5 * PERIOD, holding=True)  # never faster than the timer gap
    assert s.on_timer(TIMER_GAP_PERIODS * PERIOD, holding=True)  # a hold brakes on the timer
    s.ticked(0.009)
    assert s.on_command(0.0095) is False  # too soon after a tick: waits
    assert s.on_timer(0.019, holding=False)  # ... for the timer, which projects it
    s.ticked(0.019)
    t = 0.019 + (MIN_GAP_PERIODS + 0.01) * PERIOD
    assert s.on_command(t)
    s.ticked(t)
    # Not late yet: no tick without a new command
    assert not s.on_timer(t + PERIOD, holding=False)
    off = TickScheduler(PERIOD, tick_on_command=False)
    assert off.on_command(0.0) is False
    assert off.on_timer(0.0, holding=False)
    off.ticked(0.0)
    assert off.on_timer(PERIOD, holding=False)


def test_superseded_commands_are_counted() -> None:
    s = TickScheduler(PERIOD)
    s.on_command(0.0)
    s.ticked(0.0)
    assert not s.on_command(0.001)
    assert not s.on_command(0.002)  # replaces the one before, unprojected
    assert s.superseded == 1


@pytest.mark.parametrize("bad", [0.5, 11.0, float("nan")])
def test_bad_grace_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="late_command_grace_periods"):
        TickScheduler(PERIOD, grace_periods=bad)
    with pytest.raises(ValueError, match="period_s"):
        TickScheduler(0.0)

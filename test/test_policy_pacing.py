"""The policy node's pacing: an overdue timer firing again at once is dropped, not deferred."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.policy.pacing import DEFAULT_MIN_GAP_PERIODS, CommandPacer

PERIOD = 0.01


def _replay(p: CommandPacer, ticks: list[float]) -> list[float]:
    sent = []
    for t in ticks:
        if p.may_send(t):
            p.sent(t)
            sent.append(t)
    return sent


def test_a_burst_after_a_stall_sends_once_and_the_stream_stays_on_the_timer() -> None:
    """Replay a timer that stalls 25 ms and then fires three times within 0.6 ms (observed on
    the proxy cell): the first overdue tick sends, the two right after it are dropped, and the
    next tick of the schedule sends again; no two commands closer than half a period."""
    p = CommandPacer(PERIOD, 0.5)
    ticks = [0.0, 0.01, 0.02, 0.045, 0.0452, 0.0456, 0.05, 0.06, 0.07]
    sent = _replay(p, ticks)
    assert sent == [0.0, 0.01, 0.02, 0.045, 0.05, 0.06, 0.07]
    assert p.skipped == 2
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert min(gaps) >= 0.5 * PERIOD - 1e-12


def test_dropping_cannot_cascade() -> None:
    """The old rule deferred a tick to the gap, which pushed the next tick under the gap in
    turn. Dropping leaves the schedule alone: a jittered 100 Hz timer with one stall loses
    only the ticks of the stall's burst, never a run of them."""
    p = CommandPacer(PERIOD, 0.5)
    rng = np.random.default_rng(0)
    ticks = [k * PERIOD + float(rng.uniform(-0.002, 0.002)) for k in range(1, 200)]
    ticks += [2.03, 2.0302, 2.04]  # a stall, then the timer catches up
    sent = _replay(p, ticks)
    assert p.skipped == 1 and len(sent) == len(ticks) - 1


def test_bad_gap_is_refused_reset_forgets_and_zero_is_off() -> None:
    assert DEFAULT_MIN_GAP_PERIODS == 0.5
    with pytest.raises(ValueError, match="min_command_gap_periods"):
        CommandPacer(PERIOD, 1.0)
    with pytest.raises(ValueError, match="period_s"):
        CommandPacer(0.0)
    p = CommandPacer(PERIOD, 0.5)
    p.sent(0.0)
    assert not p.may_send(0.001) and p.skipped == 1
    p.reset()
    assert p.may_send(0.001)
    off = CommandPacer(PERIOD, 0.0)
    off.sent(0.0)
    assert off.may_send(0.0001) and off.skipped == 0

"""The policy node's pacing: an overdue timer firing again at once waits for the gap."""

from __future__ import annotations

import pytest

from sim2real_ros.policy.pacing import CommandPacer

PERIOD = 0.01


def test_a_burst_of_ticks_is_spread_to_the_minimum_gap_and_the_rate_is_kept() -> None:
    """Replay a timer that stalls 25 ms and then fires three times within 0.6 ms (observed on
    the proxy cell): every tick still sends, none closer than half a period to the last."""
    p = CommandPacer(PERIOD, 0.5)
    sent: list[float] = []
    pending: list[float] = []
    ticks = [0.0, 0.01, 0.02, 0.045, 0.0452, 0.0456, 0.05, 0.06, 0.07]
    for t in ticks:
        for d in list(pending):  # a deferred tick due before this one runs first
            if d <= t:
                pending.remove(d)
                assert p.wait_s(d) == pytest.approx(0.0, abs=1e-12)
                p.sent(d)
                sent.append(d)
        w = p.wait_s(t)
        if w > 0.0:
            if not pending:
                pending.append(t + w)
            continue
        p.sent(t)
        sent.append(t)
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert min(gaps) >= 0.5 * PERIOD - 1e-12
    assert p.deferred >= 2
    # The stall cost time, not commands: the stream is back on the timer within two periods.
    assert sent[-1] == 0.07 and len(sent) >= len(ticks) - 3


def test_bad_gap_is_refused_and_reset_forgets() -> None:
    with pytest.raises(ValueError, match="min_command_gap_periods"):
        CommandPacer(PERIOD, 1.0)
    with pytest.raises(ValueError, match="period_s"):
        CommandPacer(0.0)
    p = CommandPacer(PERIOD, 0.5)
    p.sent(0.0)
    assert p.wait_s(0.001) == pytest.approx(0.004)
    p.reset()
    assert p.wait_s(0.001) == 0.0
    off = CommandPacer(PERIOD)  # the default: off
    off.sent(0.0)
    assert off.wait_s(0.0001) == 0.0 and off.deferred == 0

"""The projection's rate time base: ms arrival jitter must not reshape a smooth stream."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.policy.expert import IKExpert
from sim2real_ros.policy.task import (
    TaskConfig,
    advance_command,
    initial_history,
    resolve_rate_limits,
)
from sim2real_ros.robot import load_arm
from sim2real_ros.safety.envelope import load_envelope
from sim2real_ros.safety.projection import Projector
from sim2real_ros.safety.timebase import (
    ARRIVAL,
    NOMINAL,
    RATE_TIME_BASES,
    SMOOTHED,
    RateTimeBase,
)

ARM = load_arm(default_urdf())
ENV = load_envelope(share_path("config", "safety_envelope.yaml"), ARM)
PERIOD_S = 0.01
RESHAPED_RAD = 1e-3  # the rollback monitor's monitor_min_intervention_rad
CFG = resolve_rate_limits(TaskConfig(), ARM)


def test_nominal_and_arrival_follow_their_definitions() -> None:
    arrival = RateTimeBase(ARRIVAL, PERIOD_S)
    nominal = RateTimeBase(NOMINAL, PERIOD_S)
    for tb in (arrival, nominal):
        assert tb.tick(1.0) == PERIOD_S  # nothing measured yet
    assert arrival.tick(1.007) == pytest.approx(0.007)
    assert arrival.tick(1.009) == pytest.approx(0.005)  # clamped to half a period
    assert arrival.tick(1.5) == pytest.approx(0.02)  # and to two periods
    assert arrival.tick(1.4) == PERIOD_S  # clock went back: nothing measured
    assert [nominal.tick(t) for t in (1.007, 1.009, 1.5)] == [PERIOD_S] * 3


def test_smoothed_holds_the_period_through_jitter_and_follows_a_sustained_rate() -> None:
    tb = RateTimeBase(SMOOTHED, PERIOD_S)
    rng = np.random.default_rng(0)
    # Arrivals due every period, each up to 3 ms early or late.
    arrivals = PERIOD_S * np.arange(2000) + rng.uniform(-3e-3, 3e-3, 2000)
    assert all(tb.tick(t) == PERIOD_S for t in arrivals)
    assert abs(tb.smoothed_s - PERIOD_S) < 0.05 * PERIOD_S
    t = float(arrivals[-1])
    dts = []
    for _ in range(120):  # a source that now sustains twice the rate
        t += 0.5 * PERIOD_S
        dts.append(tb.tick(t))
    assert next(i for i, d in enumerate(dts) if d < PERIOD_S) <= 5  # leaves the band quickly
    assert all(b <= a for a, b in zip(dts, dts[1:]))
    assert dts[-1] == pytest.approx(0.5 * PERIOD_S, rel=0.01)
    t += 10.0  # a long pause counts as two periods, not as ten seconds
    assert tb.tick(t) <= 2.0 * PERIOD_S
    tb.reset()
    assert tb.tick(t + 1.0) == PERIOD_S and math.isnan(tb.last_interval_s)


def test_smoothed_keeps_the_period_for_a_slower_stream() -> None:
    """One-sided band: a source that falls behind (a descheduled policy node) is projected
    with the period, the safe dt for it; only a faster source gets a shorter dt."""
    tb = RateTimeBase(SMOOTHED, PERIOD_S)
    t = 1.0
    for k in range(200):
        t += 0.0118 if k < 100 else 0.02  # 18 % slow, then half the rate
        assert tb.tick(t) == PERIOD_S
    assert tb.smoothed_s > 1.5 * PERIOD_S  # measured all the same
    for _ in range(200):  # now 10 % fast: the mean crosses the band below the period
        t += 0.009
        last = tb.tick(t)
    assert last == pytest.approx(0.009, rel=0.01)


def test_bad_arguments_are_refused_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"one of \['arrival', 'nominal', 'smoothed'\]"):
        RateTimeBase("wall", PERIOD_S)
    with pytest.raises(ValueError, match="period_s"):
        RateTimeBase(SMOOTHED, 0.0)
    with pytest.raises(ValueError, match="smoothing_ticks"):
        RateTimeBase(SMOOTHED, PERIOD_S, smoothing_ticks=0.5)


def _reshaped_fraction(mode: str, jitter_s: float, episodes: int = 4, seed: int = 0) -> float:
    """Share of ticks the projection changes by > 1 mrad: the IK expert drives the jerk-limited
    interface (smooth and feasible at the nominal period) to seeded targets on a kinematic arm,
    and each command reaches the filter `jitter_s` early or late."""
    expert = IKExpert(ARM, CFG)
    proj = Projector(ENV, ARM, PERIOD_S)
    rng = np.random.default_rng(seed)
    home = np.array(CFG.home_rad)
    moving = np.array([1.0, 1, 1, 1, 1, 0])
    ticks = changed = 0
    for _ in range(episodes):
        q = home + rng.uniform(-0.3, 0.3, 6) * moving
        target = ARM.tool_position(home + rng.uniform(-0.5, 0.5, 6) * moving)
        hist = initial_history(q)
        proj.reset(q.tolist())
        tb = RateTimeBase(mode, PERIOD_S)
        t = 0.0
        for k in range(CFG.max_steps):
            action = expert.act(q[None], target[None])[0]
            hist = advance_command(CFG, ARM, hist, q, action)
            dt = tb.tick(k * PERIOD_S + rng.uniform(-jitter_s, jitter_s) + t)
            res = proj.project_position(ARM.joint_names, hist[0].tolist(), dt, q.tolist())
            ticks += 1
            changed += res.deviation > RESHAPED_RAD
            q = np.array(res.command)
            hist = np.stack([q, hist[1], hist[2]])
        t += 100.0
    return changed / ticks


@pytest.fixture(scope="module")
def jittered() -> dict[str, float]:
    return {mode: _reshaped_fraction(mode, 3e-3) for mode in RATE_TIME_BASES}


def test_smooth_stream_without_jitter_passes_in_every_mode() -> None:
    for mode in RATE_TIME_BASES:
        assert _reshaped_fraction(mode, 0.0, episodes=2) == 0.0


def test_arrival_jitter_reshapes_only_with_the_arrival_time_base(
    jittered: dict[str, float],
) -> None:
    assert jittered[ARRIVAL] > 0.05
    assert jittered[SMOOTHED] == 0.0
    assert jittered[NOMINAL] == 0.0


@pytest.mark.parametrize("mode", [ARRIVAL, SMOOTHED])
def test_sustained_too_fast_stream_is_still_rate_limited(mode: str) -> None:
    """Commands each a feasible step at the nominal period, but arriving twice as often."""
    proj = Projector(ENV, ARM, PERIOD_S)
    q = np.array(CFG.home_rad)
    proj.reset(q.tolist())
    hist = initial_history(q)
    action = np.zeros(ARM.n_joints)
    action[0] = 1.0  # shoulder_pan to 0.8 of its velocity limit, as the generator allows
    tb = RateTimeBase(mode, PERIOD_S)
    fast_s = 0.5 * PERIOD_S
    emitted = [q.copy()]
    deviations = []
    for k in range(120):
        hist = advance_command(CFG, ARM, hist, emitted[-1], action)
        dt = tb.tick(1.0 + k * fast_s)
        res = proj.project_position(ARM.joint_names, hist[0].tolist(), dt)
        emitted.append(np.array(res.command))
        deviations.append(res.deviation)
    x = np.array(emitted)[:, 0]
    real_speed = np.abs(np.diff(x[-40:])) / fast_s
    vmax = ENV.joints[0].velocity_rad_s
    requested = CFG.max_velocity_rad_s[0] * 2  # what the stream asks for in real time
    assert requested > 1.5 * vmax
    assert np.max(real_speed) <= vmax * 1.05
    assert max(deviations[-40:]) > RESHAPED_RAD


def test_nominal_trusts_the_source_to_keep_the_period() -> None:
    """Documented limit of `nominal`: a source that is too fast is not rate limited by it."""
    tb = RateTimeBase(NOMINAL, PERIOD_S)
    assert all(tb.tick(1.0 + k * 0.5 * PERIOD_S) == PERIOD_S for k in range(50))


@pytest.mark.parametrize("mode", RATE_TIME_BASES)
def test_a_hold_uses_the_period_in_every_mode_and_its_ticks_still_count(mode: str) -> None:
    # A hold brakes on the filter's own timer: a dt that moved between its ticks (the smoothed
    # mean crossing its band on a loaded host) kept the held command creeping.
    tb = RateTimeBase(mode, PERIOD_S)
    ref = RateTimeBase(mode, PERIOD_S)
    t = 1.0
    for k in range(60):
        t += 0.007 if k % 2 else 0.008  # early timer ticks: the mean leaves the 5 % band
        assert tb.tick(t, hold=True) == PERIOD_S
        ref.tick(t)
    assert tb.last_dt_s == PERIOD_S
    assert tb.smoothed_s == ref.smoothed_s  # the held ticks were measured all the same
    if mode == SMOOTHED:
        assert ref.last_dt_s < PERIOD_S * 0.95  # without the hold it would have moved
    t += 0.0075
    assert tb.tick(t) == ref.tick(t)  # after the hold, back to the mode's own dt

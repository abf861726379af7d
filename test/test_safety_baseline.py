"""The baseline controller: hold, home and IK target tracking, smooth and inside the envelope."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import sim2real_ros.safety.baseline as baseline_module
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot import load_arm
from sim2real_ros.safety.baseline import (
    HOLD,
    HOME,
    TRACK,
    BaselineConfig,
    BaselineController,
    plan_quintic,
)
from sim2real_ros.safety.envelope import load_envelope
from sim2real_ros.safety.projection import Projector

ARM = load_arm(default_urdf())
ENV = load_envelope(share_path("config", "safety_envelope.yaml"), ARM)
HOME_Q = np.array([0.0, 0.0, 1.6, 0.0, 1.5, 0.0])
P = 0.01


def _run(ctrl: BaselineController, q: np.ndarray, t0: float, seconds: float,
         proj: Projector | None = None) -> tuple[np.ndarray, int]:
    """Step the controller with a perfectly tracking arm; return final q and interventions."""
    interventions = 0
    for k in range(int(round(seconds / P))):
        out = ctrl.step(t0 + k * P, q)
        if proj is not None:
            interventions += proj.project_position(None, out.position, P).intervened
        q = np.array(out.position)
    return q, interventions


def test_baseline_shares_no_code_with_the_policy_room() -> None:
    for name in ("baseline.py", "baseline_node.py"):
        tree = ast.parse((Path(baseline_module.__file__).parent / name).read_text())
        modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in modules if "policy" in m], modules


def test_hold_keeps_the_start_position_and_pd_torque_pulls_back() -> None:
    ctrl = BaselineController(ARM, ENV)
    out = ctrl.step(0.0, HOME_Q)
    assert out.mode == HOLD and np.allclose(out.position, HOME_Q)
    pushed = HOME_Q.copy()
    pushed[1] += 0.01
    out = ctrl.step(0.01, pushed, np.zeros(6))
    assert np.allclose(out.position, HOME_Q)
    assert out.effort[1] == pytest.approx(-150.0 * 0.01)


def test_move_to_home_is_smooth_and_never_needs_projection() -> None:
    ctrl = BaselineController(ARM, ENV)
    start = HOME_Q + np.array([0.6, -0.4, -0.5, 0.8, 0.3, -1.0])
    proj = Projector(ENV, ARM, P)
    proj.reset(list(start))
    ctrl.step(0.0, start)
    ok, _ = ctrl.go_home(0.0)
    assert ok and ctrl.mode == HOME
    q, interventions = _run(ctrl, start, 0.01, 6.0, proj)
    assert np.allclose(q, HOME_Q, atol=1e-6)
    assert interventions == 0
    assert ctrl.step(6.1, q).at_goal


def test_tracks_a_tool_target_through_ik_within_tolerance() -> None:
    ctrl = BaselineController(ARM, ENV)
    q0 = HOME_Q.copy()
    goal_q = HOME_Q + np.array([0.3, 0.2, -0.3, 0.1, 0.2, 0.0])
    target = ARM.tool_position(goal_q)
    proj = Projector(ENV, ARM, P)
    proj.reset(list(q0))
    ctrl.step(0.0, q0)
    ok, note = ctrl.set_target(target, 0.0)
    assert ok, note
    assert ctrl.mode == TRACK
    q, interventions = _run(ctrl, q0, 0.01, 5.0, proj)
    assert np.linalg.norm(ARM.tool_position(q) - target) < ctrl.config.ik_tolerance_m
    assert interventions == 0


def test_retargeting_mid_motion_stays_continuous_and_inside_the_limits() -> None:
    ctrl = BaselineController(ARM, ENV)
    rng = np.random.default_rng(4)
    q = HOME_Q.copy()
    proj = Projector(ENV, ARM, P)
    proj.reset(list(q))
    ctrl.step(0.0, q)
    total = 0
    for seg in range(6):
        target = ARM.tool_position(HOME_Q + rng.uniform(-0.4, 0.4, 6))
        ctrl.set_target(target, seg * 0.7)
        q, n = _run(ctrl, q, seg * 0.7, 0.7, proj)
        total += n
    assert total == 0


def test_unreachable_or_outside_targets_are_refused_and_tracking_continues() -> None:
    ctrl = BaselineController(ARM, ENV)
    ctrl.step(0.0, HOME_Q)
    ok, note = ctrl.set_target([5.0, 0.0, 0.5], 0.0)
    assert not ok and "outside the workspace box" in note
    ok, note = ctrl.set_target([0.0, 0.0, 1.45], 0.0)  # above the fully stretched arm
    assert not ok and "unreachable" in note
    ok, note = ctrl.set_target([float("nan"), 0.0, 0.5], 0.0)
    assert not ok
    assert ctrl.mode == HOLD


def test_quintic_plan_respects_rate_limits_from_a_moving_start() -> None:
    vmax, amax, jmax = np.full(6, 1.0), np.full(6, 4.0), np.full(6, 40.0)
    q = plan_quintic(np.zeros(6), np.full(6, 0.5), np.full(6, 1.0), np.full(6, -1.0),
                     vmax, amax, jmax)
    pv, pa, pj = q.peaks(256)
    assert np.all(pv <= vmax * 1.001) and np.all(pa <= amax * 1.001) and np.all(pj <= jmax * 1.01)
    p, v, a, _ = q.sample(q.duration_s)
    assert np.allclose(p, -1.0) and np.allclose(v, 0.0) and np.allclose(a, 0.0)
    p0, v0, a0, _ = q.sample(0.0)
    assert np.allclose(p0, 0.0) and np.allclose(v0, 0.5) and np.allclose(a0, 1.0)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="home_rad"):
        BaselineController(ARM, ENV, BaselineConfig(home_rad=(0.0,) * 5))
    with pytest.raises(ValueError, match="rate_fraction"):
        BaselineController(ARM, ENV, BaselineConfig(rate_fraction=0.0))


def test_step_clock_advances_whole_periods_whatever_the_timer_jitter() -> None:
    from sim2real_ros.safety.baseline import StepClock

    rng = np.random.default_rng(3)
    clock = StepClock(P)
    wall = 10.0 + np.arange(200) * P + rng.uniform(-0.002, 0.002, 200)
    refs = [clock.tick(float(w)) for w in wall]
    assert all(r is not None for r in refs)
    assert np.allclose(np.diff(np.array(refs, dtype=float)), P, atol=1e-12)
    assert clock.dropped == 0 and clock.resyncs == 0
    # An overdue timer firing twice within a millisecond: the second tick is dropped.
    t_last = clock.t_s
    assert clock.tick(wall[-1] + 0.0102) == pytest.approx(t_last + P)
    assert clock.tick(wall[-1] + 0.0105) is None and clock.dropped == 1
    # A plan made between ticks starts at the last command's reference time.
    assert clock.now(wall[-1] + 0.015) == pytest.approx(t_last + P)
    # After a stall longer than resync_periods the reference jumps to the wall clock (counted),
    # and so it does when the clock steps back.
    assert clock.tick(wall[-1] + 1.0) == pytest.approx(wall[-1] + 1.0)
    assert clock.resyncs == 1
    assert clock.tick(wall[-1] + 0.5) == pytest.approx(wall[-1] + 0.5)
    assert clock.resyncs == 2
    with pytest.raises(ValueError, match="period_s"):
        StepClock(0.0)
    with pytest.raises(ValueError, match="early_periods"):
        StepClock(P, early_periods=1.0)
    with pytest.raises(ValueError, match="resync_periods"):
        StepClock(P, resync_periods=0.5)


def test_step_clock_stays_on_the_wall_clock_grid_after_late_ticks() -> None:
    # rclpy's timer keeps its phase: a late callback is followed by one less than a period
    # later. That one is published (not dropped), so the reference never falls behind.
    from sim2real_ros.safety.baseline import StepClock

    rng = np.random.default_rng(11)
    clock = StepClock(P)
    grid = 10.0 + np.arange(2000) * P
    late = rng.random(2000) < 0.1
    wall = grid + np.where(late, rng.uniform(0.004, 0.008, 2000), rng.uniform(0, 5e-4, 2000))
    refs = np.array([clock.tick(float(w)) for w in wall], dtype=float)
    assert clock.dropped == 0 and clock.resyncs == 0
    assert np.allclose(np.diff(refs), P, atol=1e-12)
    assert np.max(np.abs(refs - grid)) < 1e-3  # no lag accumulated over ~200 late ticks
    # A stall that skips callbacks (rclpy does not replay them): the lag is bounded by
    # resync_periods, then the reference jumps back onto the clock.
    t = float(grid[-1])
    lags = []
    for k in range(1, 40):
        now = t + (k + 3) * P  # three periods lost, the timer back on phase
        ref = clock.tick(now)
        lags.append(now - ref)
    assert max(lags) <= 2.5 * P + 1e-9 and clock.resyncs == 1


def test_reference_sampled_on_the_step_clock_keeps_the_jerk_inside_the_plan() -> None:
    # Sampled at jittered wall times, the same trajectory's third difference (what the filter
    # projects at its period) exceeds the envelope's jerk limit by an order of magnitude.
    from sim2real_ros.safety.baseline import StepClock

    rng = np.random.default_rng(5)
    jerk_limit = max(j.jerk_rad_s3 for j in ENV.joints)
    peaks = {}
    for label in ("wall", "step"):
        ctrl = BaselineController(ARM, ENV)
        clock = StepClock(P)
        wall = 10.0 + np.arange(300) * P + rng.uniform(-0.002, 0.002, 300)
        t0 = clock.tick(float(wall[0]))
        ctrl.step(t0, HOME_Q)
        ok, _ = ctrl.set_target(ARM.tool_position(np.array(HOME_Q) + 0.6), clock.now(wall[0]))
        assert ok
        cmds = []
        for w in wall[1:]:
            t = clock.tick(float(w)) if label == "step" else float(w)
            cmds.append(ctrl.step(t, HOME_Q).position)
        jerk = np.diff(np.array(cmds), n=3, axis=0) / P ** 3
        peaks[label] = float(np.max(np.abs(jerk)))
    assert peaks["step"] <= jerk_limit, peaks
    assert peaks["wall"] > 5 * jerk_limit, peaks


def test_solving_a_target_changes_nothing_and_a_republished_one_is_not_solved_again() -> None:
    ctrl = BaselineController(ARM, ENV)
    ctrl.step(0.0, HOME_Q)
    target = ARM.tool_position(HOME_Q + np.array([0.3, 0.2, -0.3, 0.1, 0.2, 0.0]))
    solved = ctrl.solve_target(target)
    assert solved.ok and solved.goal_rad is not None
    assert ctrl.mode == HOLD and ctrl.goal is None and ctrl.traj is None  # untouched
    ok, _ = ctrl.apply_target(solved, 0.0)
    assert ok and ctrl.mode == TRACK and ctrl.traj is not None
    traj = ctrl.traj
    for k in range(1, 30):
        ctrl.step(k * P, HOME_Q)
    # The evaluation re-publishes its target every 0.2 s: no second IK, no re-plan.
    again = ctrl.solve_target(target)
    assert again.ok and again.goal_rad is None and "unchanged" in again.note
    assert ctrl.apply_target(again, 0.3)[0] and ctrl.traj is traj
    # A new target is solved; if the mode changed in between, "unchanged" is solved afresh.
    moved = ctrl.solve_target(target + np.array([0.02, 0.0, 0.0]))
    assert moved.goal_rad is not None
    stale = ctrl.solve_target(target)
    ctrl.hold(0.31)
    ok, note = ctrl.apply_target(stale, 0.31)
    assert ok and ctrl.mode == TRACK and "IK residual" in note
    refused = ctrl.solve_target([5.0, 0.0, 0.5])
    assert not refused.ok and ctrl.apply_target(refused, 0.32) == (False, refused.note)
    assert ctrl.mode == TRACK
    with pytest.raises(ValueError, match="same_target_m"):
        BaselineController(ARM, ENV, BaselineConfig(same_target_m=float("nan")))


def test_vectorized_sampling_matches_the_scalar_sample_and_bounds_the_tool_speed() -> None:
    # The duration search samples each candidate in one pass (sample_many): it must be the
    # scalar `sample` exactly, ends included, or the plan's limits would not be what it checks;
    # both must be the quintic itself (numpy's own polynomial evaluation, an independent path).
    ctrl = BaselineController(ARM, ENV)
    rng = np.random.default_rng(3)
    for k in range(40):
        p0, p1 = rng.uniform(ctrl.lower, ctrl.upper), rng.uniform(ctrl.lower, ctrl.upper)
        v0, a0 = rng.normal(0, 0.3, 6) * (k % 2), rng.normal(0, 0.5, 6) * (k % 2)
        q = plan_quintic(p0, v0, a0, p1, ctrl.vmax, ctrl.amax, ctrl.jmax, ctrl.kin,
                         ctrl.max_tool_speed_m_s)
        ts = np.concatenate([[-0.1], np.linspace(0.0, q.duration_s, 97), [q.duration_s + 0.1]])
        many = q.sample_many(ts)
        for i, t in enumerate(ts):
            for x, y in zip(q.sample(float(t)), many):
                np.testing.assert_array_equal(x, y[i])
        inside = ts[(ts >= 0.0) & (ts < q.duration_s)]
        for d in range(4):
            ref = np.stack([np.polynomial.polynomial.polyval(
                inside, np.polynomial.polynomial.polyder(q.c[:, j], d)) for j in range(6)], 1)
            got = q.sample_many(inside)[d]
            np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
        np.testing.assert_array_equal(many[0][0], q.c[0])  # before the start: the start
        np.testing.assert_array_equal(many[0][-1], q.p1)  # after the end: at rest on p1
        assert not np.any(many[1][-1]) and not np.any(many[2][-1]) and not np.any(many[3][-1])
        scalar = [np.max([np.abs(q.sample(float(t))[d]) for t in np.linspace(0, q.duration_s,
                                                                            64)], axis=0)
                  for d in (1, 2, 3)]
        for x, y in zip(q.peaks(), scalar):
            np.testing.assert_array_equal(x, y)
        if k % 2:
            continue  # a moving start may already exceed the tool-speed bound at t = 0
        levers = [0.0] * 6
        pos, vel, _, _ = q.sample_many(np.linspace(0.0, q.duration_s, 24))
        for pq, vq in zip(pos.tolist(), np.abs(vel)):
            ctrl.kin.tool_position_and_levers(pq, levers)
            assert float(np.dot(levers, vq)) <= ctrl.max_tool_speed_m_s * (1 + 1e-9)

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

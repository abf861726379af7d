"""The reaching task: kinematics, targets, action bounds, observation layout, the IK expert."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.expert import IKExpert
from sim2real_ros.policy.kinematics import BatchKinematics
from sim2real_ros.policy.task import (
    advance_command,
    command_rates,
    initial_history,
    resolve_rate_limits,
    TaskConfig,
    action_to_step,
    apply_action,
    build_observation,
    in_box,
    reachable_targets,
    step_to_action,
)
from sim2real_ros.robot.model import load_arm

ARM = load_arm(default_urdf())


def test_batch_kinematics_matches_the_arm_model() -> None:
    q = np.random.default_rng(3).uniform(ARM.lower_rad, ARM.upper_rad, size=(16, ARM.n_joints))
    pos, jac = BatchKinematics(ARM).tool_and_jacobian(q)
    for i in range(16):
        np.testing.assert_allclose(pos[i], ARM.tool_position(q[i]), atol=1e-12)
        np.testing.assert_allclose(jac[i], ARM.jacobian(q[i])[:3], atol=1e-12)


def test_targets_are_seeded_inside_the_box_and_reachable() -> None:
    cfg = TaskConfig()
    a = reachable_targets(5, 20, ARM)
    b = reachable_targets(5, 20, ARM)
    c = reachable_targets(6, 20, ARM)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    lo, hi = np.array(cfg.workspace_min_m), np.array(cfg.workspace_max_m)
    for p in a:
        assert in_box(p, lo, hi)
        _, err = ARM.ik_position(p, np.array(cfg.home_rad), iterations=300)
        assert err < 2e-3, f"target {p} unreachable (IK residual {err:.4f} m)"


def test_an_empty_workspace_box_is_a_config_error_naming_the_box() -> None:
    with pytest.raises(ConfigError, match="workspace box"):
        reachable_targets(0, 1, ARM, np.array([5.0, 5.0, 5.0]), np.array([6.0, 6.0, 6.0]))


STEP = TaskConfig(action_interface="step")


def test_actions_never_move_the_target_more_than_max_step_or_beyond_the_offset() -> None:
    cfg = STEP
    rng = np.random.default_rng(0)
    q = np.array(cfg.home_rad)
    cmd = q.copy()
    for _ in range(200):
        a = rng.uniform(-3, 3, size=ARM.n_joints)  # out of range on purpose
        nxt = apply_action(cfg, ARM, cmd, q, a)
        assert np.all(np.abs(nxt - cmd) <= cfg.max_step_rad + 1e-12)
        assert np.all(np.abs(nxt - q) <= cfg.max_offset_rad + 1e-12)
        assert np.all(nxt >= ARM.lower_rad) and np.all(nxt <= ARM.upper_rad)
        cmd = nxt
    for _ in range(100):  # keep pushing one way while the arm does not follow
        cmd = apply_action(cfg, ARM, cmd, q, np.ones(ARM.n_joints))
    # the integrator saturated at the offset bound rather than winding up
    np.testing.assert_allclose(cmd - q, cfg.max_offset_rad, atol=1e-9)


def test_signed_square_action_map_round_trips_and_is_fine_near_zero() -> None:
    cfg = STEP
    steps = np.linspace(-cfg.max_step_rad, cfg.max_step_rad, 41)
    np.testing.assert_allclose(action_to_step(cfg, step_to_action(cfg, steps)), steps, atol=1e-15)
    # a 0.03 output bias moves the target by 0.09 % of the largest step
    assert action_to_step(cfg, np.array([0.03]))[0] == pytest.approx(9e-4 * cfg.max_step_rad)


def test_observation_layout_is_q_qd_target_error_offset() -> None:
    cfg = STEP
    q = np.arange(6) * 0.1
    qd = -np.arange(6) * 0.01
    target = np.array([0.5, 0.1, 0.3])
    tool = np.array([0.4, 0.0, 0.2])
    cmd = q + 0.01
    o = build_observation(cfg, q, qd, target, tool, cmd)
    assert o.shape == (cfg.obs_dim(6),) == (24,)
    np.testing.assert_allclose(o[:6], q, atol=1e-7)
    np.testing.assert_allclose(o[6:12], qd, atol=1e-7)
    np.testing.assert_allclose(o[12:15], target, atol=1e-7)
    np.testing.assert_allclose(o[15:18], target - tool, atol=1e-7)
    np.testing.assert_allclose(o[18:24], 0.01, atol=1e-7)
    with pytest.raises(ValueError, match="wrench"):
        build_observation(replace(STEP, include_wrench=True), q, qd, target, tool, cmd)


def test_task_config_rejects_bad_values_naming_key_and_range() -> None:
    with pytest.raises(ConfigError,
                       match=r"max_step_rad = 2.0: expected a number in \[0.0001, 0.5\]"):
        TaskConfig.from_dict({"max_step_rad": 2.0})
    with pytest.raises(ConfigError, match="no_such_key"):
        TaskConfig.from_dict({"no_such_key": 1})
    cfg = TaskConfig.from_dict(TaskConfig().to_dict())
    assert cfg == TaskConfig()


def test_ik_expert_reaches_and_rests_in_the_randomized_simulator() -> None:
    from sim2real_ros.policy.env import ReachingVecEnv, load_spec

    env = ReachingVecEnv(4, TaskConfig(), load_spec("default"), seed=11)
    try:
        env.reset()
        results: list[float] = []
        for _ in range(TaskConfig().max_steps):
            r = env.step(env.expert_actions())
            results += r.episode_success[~np.isnan(r.episode_success)].tolist()
            if len(results) >= 4:
                break
    finally:
        env.close()
    assert len(results) >= 4 and all(s == 1.0 for s in results), results


def test_expert_step_points_the_tool_toward_the_target() -> None:
    cfg = resolve_rate_limits(TaskConfig(), ARM)
    expert = IKExpert(ARM, cfg)
    rng = np.random.default_rng(2)
    for _ in range(20):
        q = np.array(cfg.home_rad) + rng.uniform(-0.3, 0.3, 6)
        target = ARM.tool_position(q) + rng.uniform(-0.05, 0.05, 3)
        step = action_to_step(cfg, expert.act(q, target)[0])
        before = np.linalg.norm(target - ARM.tool_position(q))
        after = np.linalg.norm(target - ARM.tool_position(q + step))
        assert after < before


def _envelope_limits() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from sim2real_ros.paths import share_path
    from sim2real_ros.safety.envelope import load_envelope

    env = load_envelope(share_path("config", "safety_envelope.yaml"), ARM)
    return (np.array([j.velocity_rad_s for j in env.joints]),
            np.array([j.acceleration_rad_s2 for j in env.joints]),
            np.array([j.jerk_rad_s3 for j in env.joints]))


def test_jerk_limited_limits_resolve_from_the_envelope_and_are_stored() -> None:
    cfg = resolve_rate_limits(TaskConfig(), ARM)
    v, a, j = _envelope_limits()
    np.testing.assert_allclose(cfg.max_velocity_rad_s, 0.8 * v)
    np.testing.assert_allclose(cfg.max_acceleration_rad_s2, 0.8 * a)
    np.testing.assert_allclose(cfg.max_jerk_rad_s3, 0.8 * j)
    again = TaskConfig.from_dict(cfg.to_dict(), strict=False)
    assert again == cfg and again.jerk_limited
    # a policy file written before the interface existed keeps acting through `step`
    old = {k: v for k, v in STEP.to_dict().items() if k not in
           ("action_interface", "max_velocity_rad_s", "max_acceleration_rad_s2",
            "max_jerk_rad_s3", "limit_fraction")}
    assert TaskConfig.from_dict(old, strict=False).action_interface == "step"
    assert cfg.obs_dim(6) == 36
    with pytest.raises(ConfigError, match="action_interface"):
        TaskConfig.from_dict({"action_interface": "teleport"})
    with pytest.raises(ConfigError, match="max_jerk_rad_s3"):
        TaskConfig.from_dict({"max_jerk_rad_s3": [1.0, -2.0]})


def test_jerk_limited_commands_stay_inside_the_envelope_rates_for_any_actions() -> None:
    """Adversarial action streams: the finite-difference rates the safety filter measures."""
    cfg = resolve_rate_limits(TaskConfig(), ARM)
    v, a, j = _envelope_limits()
    rng = np.random.default_rng(5)
    dt = cfg.dt_s
    for trial in range(40):
        q = np.array(cfg.home_rad)
        hist = initial_history(q)
        cmds = [hist[0]]
        for k in range(150):
            if trial % 3 == 0:
                act = rng.choice([-1.0, 1.0], size=6)  # bang-bang every period
            elif trial % 3 == 1:
                act = rng.uniform(-3, 3, size=6)  # out of range on purpose
            else:
                act = np.full(6, 1.0 if (k // 20) % 2 else -1.0)
            hist = advance_command(cfg, ARM, hist, q, act)
            cmds.append(hist[0])
            q = q + 0.5 * (hist[0] - q)  # an arm that follows with lag
        c = np.array(cmds)
        vel = np.diff(c, axis=0) / dt
        acc = np.diff(vel, axis=0) / dt
        jerk = np.diff(acc, axis=0) / dt
        assert np.all(np.abs(vel) <= v + 1e-9)
        assert np.all(np.abs(acc) <= a + 1e-6)
        assert np.all(np.abs(jerk) <= j + 1e-3)
        assert np.all(c >= ARM.lower_rad) and np.all(c <= ARM.upper_rad)


def test_jerk_limited_command_reaches_the_requested_velocity_and_stops_without_overshoot() -> None:
    cfg = resolve_rate_limits(TaskConfig(), ARM)
    q = np.array(cfg.home_rad)
    hist = initial_history(q)
    act = np.zeros(6)
    act[0] = 0.5  # requests 0.25 of the velocity limit on joint 0
    for _ in range(100):
        hist = advance_command(cfg, ARM, hist, hist[0], act)
    rates = command_rates(cfg, hist)
    assert rates[0] == pytest.approx(0.25 * cfg.max_velocity_rad_s[0], rel=1e-9)
    assert rates[6] == pytest.approx(0.0, abs=1e-9)
    peak = rates[0]
    for _ in range(100):
        hist = advance_command(cfg, ARM, hist, hist[0], np.zeros(6))
        rates = command_rates(cfg, hist)
        assert -1e-3 <= rates[0] <= peak + 1e-9  # decelerates, never reverses (1 mrad/s)
    assert rates[0] == pytest.approx(0.0, abs=1e-6)


def test_jerk_limited_offset_bound_stops_the_integrator_winding_up() -> None:
    cfg = resolve_rate_limits(TaskConfig(), ARM)
    q = np.array(cfg.home_rad)
    hist = initial_history(q)
    for _ in range(400):  # keep pushing while the arm does not follow
        hist = advance_command(cfg, ARM, hist, q, np.ones(6))
    # it stops past the bound by no more than the braking distance from full speed
    off = hist[0] - q
    assert np.all(off > cfg.max_offset_rad)
    v, a, _ = (np.array(x) for x in (cfg.max_velocity_rad_s, cfg.max_acceleration_rad_s2,
                                     cfg.max_jerk_rad_s3))
    assert np.all(off <= cfg.max_offset_rad + v * v / a)
    np.testing.assert_allclose(command_rates(cfg, hist), 0.0, atol=1e-9)


def test_jerk_limited_observation_carries_the_command_rates() -> None:
    cfg = resolve_rate_limits(TaskConfig(), ARM)
    q = np.array(cfg.home_rad)
    hist = np.stack([q + 0.003, q + 0.001, q])
    o = build_observation(cfg, q, np.zeros(6), np.zeros(3), np.zeros(3), hist[0], None, hist)
    assert o.shape == (36,)
    np.testing.assert_allclose(o[24:30], 0.2, atol=1e-5)  # (0.003 - 0.001) / 0.01
    np.testing.assert_allclose(o[30:36], 0.0 + (0.003 - 0.002 + 0.0) / 1e-4, atol=1e-2)


def test_jerk_limited_tool_speed_cap_resolves_from_the_envelope_and_holds_the_filter_bound() -> None:
    """The safety filter bounds the tool speed by sum_i L_i w_i (lever arm x peak braking
    speed); the interface caps the request's bound so a full-speed action never trips it."""
    from sim2real_ros.config import load_yaml
    from sim2real_ros.paths import share_path
    from sim2real_ros.policy.task import tool_lever_arms
    from sim2real_ros.safety.envelope import load_envelope
    from sim2real_ros.safety.projection import Projector

    cfg = resolve_rate_limits(TaskConfig(), ARM)
    env_path = share_path("config", "safety_envelope.yaml")
    speed_max = float(load_yaml(env_path)["workspace"]["max_tool_speed_m_s"])
    assert cfg.max_tool_speed_m_s == pytest.approx(0.8 * speed_max)
    uncapped = replace(cfg, max_tool_speed_m_s=-1.0)
    proj = Projector(load_envelope(env_path, ARM), ARM, cfg.dt_s)
    rng = np.random.default_rng(11)
    worst = {"capped": 0.0, "uncapped": 0.0}
    tool_speed_events = {"capped": 0, "uncapped": 0}
    for trial in range(12):
        act = rng.choice([-1.0, 1.0], size=6)  # every joint at full request speed
        for name, c in (("capped", cfg), ("uncapped", uncapped)):
            q = np.array(cfg.home_rad)
            hist = initial_history(q)
            proj.reset(list(q))
            for _ in range(60):
                hist = advance_command(c, ARM, hist, q, act)
                v = (hist[0] - hist[1]) / c.dt_s
                worst[name] = max(worst[name], float(np.sum(tool_lever_arms(ARM, hist[0])
                                                            * np.abs(v))))
                res = proj.project_position(None, list(hist[0]), c.dt_s, list(q))
                tool_speed_events[name] += sum(e.limit == "tool_speed" for e in res.events)
                hist[0] = np.array(res.command)  # what reached the arm
                q = q + 0.5 * (hist[0] - q)
    # The capped command's lever bound stays at the cap (one period of rounding); uncapped,
    # the same actions ask for far more and the filter's Cartesian check brakes them.
    assert worst["capped"] <= cfg.max_tool_speed_m_s * 1.02
    assert worst["uncapped"] > 1.1 * cfg.max_tool_speed_m_s, worst
    assert tool_speed_events["capped"] == 0 < tool_speed_events["uncapped"], tool_speed_events
    # A policy file written before the cap acts as trained (no cap); a bad value is refused.
    old = {k: v for k, v in cfg.to_dict().items() if k != "max_tool_speed_m_s"}
    assert TaskConfig.from_dict(old, strict=False).max_tool_speed_m_s == -1.0
    with pytest.raises(ConfigError, match="max_tool_speed_m_s"):
        TaskConfig.from_dict({"max_tool_speed_m_s": float("nan")})

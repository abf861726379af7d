"""The reaching task: kinematics, targets, action bounds, observation layout, the IK expert."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.expert import IKExpert
from sim2real_ros.policy.kinematics import BatchKinematics
from sim2real_ros.policy.task import (
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


def test_actions_never_move_the_target_more_than_max_step_or_beyond_the_offset() -> None:
    cfg = TaskConfig()
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
    cfg = TaskConfig()
    steps = np.linspace(-cfg.max_step_rad, cfg.max_step_rad, 41)
    np.testing.assert_allclose(action_to_step(cfg, step_to_action(cfg, steps)), steps, atol=1e-15)
    # a 0.03 output bias moves the target by 0.09 % of the largest step
    assert action_to_step(cfg, np.array([0.03]))[0] == pytest.approx(9e-4 * cfg.max_step_rad)


def test_observation_layout_is_q_qd_target_error_offset() -> None:
    cfg = TaskConfig()
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
        build_observation(TaskConfig(include_wrench=True), q, qd, target, tool, cmd)


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
    cfg = TaskConfig()
    expert = IKExpert(ARM, cfg)
    rng = np.random.default_rng(2)
    for _ in range(20):
        q = np.array(cfg.home_rad) + rng.uniform(-0.3, 0.3, 6)
        target = ARM.tool_position(q) + rng.uniform(-0.05, 0.05, 3)
        step = action_to_step(cfg, expert.act(q, target)[0])
        before = np.linalg.norm(target - ARM.tool_position(q))
        after = np.linalg.norm(target - ARM.tool_position(q + step))
        assert after < before

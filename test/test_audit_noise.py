"""At-rest noise: the measured std matches the injected one; motion is not mistaken for noise."""

from __future__ import annotations

import numpy as np

from sim2real_ros.audit.noise import joint_noise_at_rest, rest_windows, wrench_noise_at_rest


def recording(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """2 s at rest, 1 s moving 0.5 rad, 2 s at rest; 500 Hz; per-joint noise 1e-4..3e-4 rad."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, 5.0, 0.002)
    moving = np.clip(t - 2.0, 0.0, 1.0) * 0.5
    sigma_q = np.array([1e-4, 2e-4, 3e-4])
    q = moving[:, None] + np.array([0.1, -0.2, 0.3]) + rng.normal(0, 1, (t.size, 3)) * sigma_q
    v = np.gradient(moving, t)[:, None] + rng.normal(0, 1, (t.size, 3)) * 3e-3
    return t, q, v, sigma_q


def test_position_and_velocity_noise_are_measured_at_rest_only() -> None:
    t, q, v, sigma_q = recording()
    effort = 12.0 + 0.5 * q + np.random.default_rng(3).normal(0, 0.05, q.shape)
    noise, win = joint_noise_at_rest(t, q, v, "synthetic", effort=effort)
    assert win.total == 8  # 4 windows of 0.5 s before the move, 4 after, none during it
    assert all(t1 <= 2.0 or t0 >= 3.0 for t0, t1 in win.t_bounds_s)
    pos = next(m for m in noise if m.key == "joint_position_std_rad")
    vel = next(m for m in noise if m.key == "joint_velocity_std_rad_s")
    np.testing.assert_allclose(pos.std, sigma_q, rtol=0.15)
    np.testing.assert_allclose(vel.std, 3e-3, rtol=0.15)
    eff = next(m for m in noise if m.key == "joint_effort_std_nm")
    np.testing.assert_allclose(eff.std, 0.05, rtol=0.15)


def test_a_moving_recording_gives_no_noise_measurement() -> None:
    t = np.arange(0.0, 3.0, 0.002)
    q = np.column_stack([0.3 * np.sin(2 * t), 0.1 * t])
    noise, win = joint_noise_at_rest(t, q, None, "moving")
    assert noise == [] and win.total == 0


def test_slow_drift_within_a_window_is_not_counted_as_noise() -> None:
    t = np.arange(0.0, 2.0, 0.002)
    rng = np.random.default_rng(1)
    q = (1e-3 * t + rng.normal(0, 1e-4, t.size))[:, None]  # 1 mrad/s creep, below the limit
    noise, _ = joint_noise_at_rest(t, q, None, "creep")
    assert abs(noise[0].std[0] - 1e-4) < 2e-5


def test_wrench_noise_uses_the_joint_rest_windows() -> None:
    t, q, _, _ = recording()
    rng = np.random.default_rng(2)
    sigma_w = np.array([0.2, 0.2, 0.4, 0.01, 0.01, 0.02])
    w = rng.normal(0, 1, (t.size, 6)) * sigma_w
    w[(t > 2.0) & (t < 3.0)] += 25.0 * rng.normal(0, 1, (int(((t > 2) & (t < 3)).sum()), 6))
    win = rest_windows(t, q)
    force, torque = wrench_noise_at_rest(t, w, win, "synthetic")
    np.testing.assert_allclose(force.std, sigma_w[:3], rtol=0.15)
    np.testing.assert_allclose(torque.std, sigma_w[3:], rtol=0.15)

"""SimCore: every randomization term measurably does what it says; seeds reproduce exactly."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sim.core import SimCore
from sim2real_ros.sim.randomization import RandomizationSpec
from sim2real_ros.sim.sensors import SensorModel, SensorParams

ARM = load_arm(default_urdf())
ELBOW = 2
BENT = np.array([0.0, 0.6, 0.9, 0.0, 0.6, 0.0])
G = 9.81


def fixed(value: float | list[float], mode: str = "reset", **extra: object) -> dict:
    """A term that always takes `value` (abs, uniform with low == high)."""
    v = value if isinstance(value, list) else [value, value]
    return {"operation": "abs", "distribution": "uniform", "range": v, "mode": mode, **extra}


def core_with(terms: dict, seed: int = 0, q0: np.ndarray | None = None) -> SimCore:
    spec = RandomizationSpec.from_dict({"terms": terms}, "test-spec", ARM)
    return SimCore(spec, seed=seed, q0=q0)


def onset_s(core: SimCore, joint: int, step_rad: float, threshold: float = 2e-3) -> float:
    """Command a step on one joint at t=0.1 s; return when the true position first moves."""
    core.advance(0.1)
    target = core.home_q.copy()
    target[joint] += step_rad
    core.command("position", target)
    q0 = core.plant.state().q[joint]
    for _ in range(300):
        core.advance(0.001)
        if abs(core.plant.state().q[joint] - q0) > threshold:
            return core.time_s
    raise AssertionError("joint never moved")


def settle(core: SimCore, target: np.ndarray, seconds: float = 0.6) -> np.ndarray:
    core.command("position", target)
    core.advance(seconds)
    return core.plant.state().q


def test_same_seed_reproduces_the_draw_and_a_bit_identical_trajectory() -> None:
    spec = RandomizationSpec.from_yaml(share_path("config", "randomization.yaml"), ARM)
    runs = []
    for seed in (11, 11, 12):
        core = SimCore(spec, seed=seed)
        traj = []
        for k in range(150):
            if k % 5 == 0:
                core.command("position", BENT * min(1.0, k / 100))
            traj.append(np.concatenate([core.advance(0.002).q, core.observe().wrench]))
        runs.append((core.draw.to_json(), np.array(traj)))
        core.close()
    assert runs[0][0] == runs[1][0] and np.array_equal(runs[0][1], runs[1][1])
    assert runs[0][0] != runs[2][0] and not np.array_equal(runs[0][1], runs[2][1])


def test_reset_draws_anew_and_a_seed_reproduces_a_reset() -> None:
    core = core_with({"joint_friction": {"operation": "abs", "range": [0.0, 1.0],
                                         "mode": "reset"}}, seed=5)
    first = core.draw.values["joint_friction"]
    core.reset()
    second = core.draw.values["joint_friction"]
    assert first != second
    other = core_with({"joint_friction": {"operation": "abs", "range": [0.0, 1.0],
                                          "mode": "reset"}}, seed=5)
    other.reset()
    assert other.draw.values["joint_friction"] == second
    core.close()
    other.close()


def test_action_delay_shifts_the_step_response_by_that_delay() -> None:
    plain = onset_s(core_with({}), ELBOW, 0.1)
    delayed = onset_s(core_with({"action_delay": fixed(0.04)}), ELBOW, 0.1)
    assert delayed - plain == pytest.approx(0.04, abs=0.0015)


def test_observation_delay_reports_the_state_from_that_long_ago() -> None:
    core = core_with({"observation_delay": fixed(0.02)})
    core.command("position", np.array([0, 0, 0.3, 0, 0, 0]))
    true_q = {}
    for _ in range(120):
        obs = core.advance(0.001)
        true_q[round(core.time_s, 6)] = core.plant.state().q
    assert obs.stamp_s == pytest.approx(obs.t_s - 0.02, abs=1e-9)
    assert np.allclose(obs.q, true_q[round(obs.stamp_s, 6)], atol=1e-12)
    assert abs(obs.q[ELBOW] - true_q[round(obs.t_s, 6)][ELBOW]) > 1e-3  # the arm was moving


def test_backlash_gives_a_dead_zone_on_reversal() -> None:
    core = core_with({"backlash": fixed(0.02, joints=["elbow_joint"])})
    forward = np.zeros(6)
    forward[ELBOW] = 0.1
    q_fwd = settle(core, forward)[ELBOW]
    back_inside = forward.copy()
    back_inside[ELBOW] -= 0.015  # reversal smaller than the play
    assert settle(core, back_inside)[ELBOW] == pytest.approx(q_fwd, abs=5e-4)
    back_outside = forward.copy()
    back_outside[ELBOW] -= 0.05
    assert q_fwd - settle(core, back_outside)[ELBOW] == pytest.approx(0.05 - 0.02, abs=2e-3)


def test_deadband_ignores_set_point_changes_smaller_than_it() -> None:
    core = core_with({"deadband": fixed(0.01)})
    small = np.zeros(6)
    small[ELBOW] = 0.006
    assert abs(settle(core, small, 0.3)[ELBOW]) < 5e-4
    big = np.zeros(6)
    big[ELBOW] = 0.03
    assert settle(core, big, 0.5)[ELBOW] == pytest.approx(0.03, abs=2e-3)


def test_motor_lag_makes_torque_follow_the_demand_with_that_time_constant() -> None:
    core = core_with({"motor_lag": fixed(0.02)})
    core.command("effort", np.array([1.0, 0, 0, 0, 0, 0]))
    obs = core.advance(0.02)
    assert obs.tau_nm[0] == pytest.approx(1.0 - np.exp(-1.0), abs=0.02)
    assert core.advance(0.1).tau_nm[0] == pytest.approx(1.0, abs=0.01)


def test_heavier_payload_raises_holding_torque() -> None:
    torques = []
    for kg in (0.0, 2.0):
        core = core_with({"payload_mass": fixed(kg)}, q0=BENT)
        settle(core, BENT, 0.5)
        torques.append(core.observe().tau_nm)
    reach_m = ARM.tool_position(BENT)[0]
    extra = torques[1][1] - torques[0][1]
    assert abs(extra) == pytest.approx(2.0 * G * reach_m, rel=0.1)


def test_link_mass_and_com_offset_change_holding_torque() -> None:
    def hold(terms: dict) -> float:
        core = core_with(terms, q0=BENT)
        settle(core, BENT, 0.4)
        return abs(core.observe().tau_nm[1])

    base = hold({})
    assert hold({"link_mass": fixed(1.3)}) > base * 1.2
    heavy_forward = hold({"com_offset": {"operation": "add", "range": [0.0, 0.0],
                                         "mode": "reset"}})
    assert heavy_forward == pytest.approx(base, rel=1e-6)
    shifted = hold({"com_offset": {"operation": "abs", "range": [0.05, 0.05], "mode": "reset",
                                   "links": ["upper_arm_link"]}})
    assert abs(shifted - base) > 0.5


@pytest.mark.parametrize(
    ("terms", "terminal_rad_s"),
    [
        ({"joint_damping": fixed(2.0)}, 0.5),
        ({"joint_damping": fixed(4.0)}, 0.25),
        ({"joint_damping": fixed(2.0), "joint_friction": fixed(0.5)}, 0.25),
    ],
)
def test_damping_and_friction_set_the_terminal_velocity(
    terms: dict, terminal_rad_s: float
) -> None:
    core = core_with(terms)
    core.command("effort", np.array([1.0, 0, 0, 0, 0, 0]))
    assert core.advance(0.5).qd[0] == pytest.approx(terminal_rad_s, rel=0.03)


def test_kp_scale_changes_the_gravity_sag_inversely() -> None:
    sags = []
    for kp in (0.5, 2.0):
        core = core_with({"kp": fixed(kp)}, q0=BENT)
        sags.append(abs(settle(core, BENT, 0.6)[1] - BENT[1]))
    assert sags[0] / sags[1] == pytest.approx(4.0, rel=0.1)


def test_torque_limit_scale_caps_the_motor_torque() -> None:
    core = core_with({"torque_limit": fixed(0.3)})
    target = np.zeros(6)
    target[1] = 1.0
    core.command("position", target)
    peak = max(abs(core.advance(0.005).tau_nm[1]) for _ in range(20))
    assert peak == pytest.approx(0.3 * ARM.max_effort_nm[1], rel=1e-9)


def test_joint_and_ft_noise_have_the_stated_std() -> None:
    core = core_with({"joint_position_noise": fixed(0.01), "ft_force_noise": fixed(0.5),
                      "joint_effort_noise": fixed(0.2)})
    obs = [core.advance(0.001) for _ in range(400)]
    q = np.array([o.q for o in obs])
    f = np.array([o.wrench[:3] for o in obs])
    assert np.allclose(q.std(axis=0), 0.01, rtol=0.15)
    assert np.allclose(f.std(axis=0), 0.5, rtol=0.15)
    assert np.array([o.tau_nm for o in obs]).std(axis=0)[0] == pytest.approx(0.2, rel=0.15)


def test_constant_bias_offsets_every_reading() -> None:
    core = core_with({"joint_position_bias": fixed(0.02), "ft_force_bias": fixed(3.0)})
    obs = core.advance(0.05)
    assert np.allclose(obs.q - core.plant.state().q, 0.02, atol=1e-6)
    assert np.allclose(obs.wrench[:3] - core.plant.state().wrench[:3], 3.0, atol=1e-3)


def test_bias_drift_is_a_random_walk_with_variance_proportional_to_time() -> None:
    sigma = 0.01
    n = 4000  # independent walks, one per "joint"
    params = SensorParams.zeros(n)
    params.position_drift_rad_per_sqrt_s = np.full(n, sigma)
    model = SensorModel(params, np.random.default_rng(0))
    var = {}
    for k in range(401):
        t = k * 0.01
        model.joints(t, np.zeros(n), np.zeros(n), np.zeros(n))
        if k in (100, 400):
            var[k] = model.drift_rad.var()
    assert var[100] == pytest.approx(sigma**2 * 1.0, rel=0.1)
    assert var[400] / var[100] == pytest.approx(4.0, rel=0.15)
    # And through the core: an encoder with drift wanders away from the truth.
    core = core_with({"joint_position_drift": fixed(0.05)})
    err = core.advance(1.0).q - core.plant.state().q
    assert np.all(err != 0.0) and np.abs(err).max() < 0.05 * 6


def test_quantization_rounds_to_the_resolution() -> None:
    core = core_with({"joint_position_quantization": fixed(0.001)})
    core.command("position", BENT * 0.1)
    for _ in range(20):
        q = core.advance(0.003).q
        assert np.allclose(q / 0.001, np.round(q / 0.001), atol=1e-9)
    assert np.abs(q - core.plant.state().q).max() <= 0.0005 + 1e-3  # within half a step + motion


def test_dropped_messages_are_lost_at_the_stated_rate() -> None:
    core = core_with({"action_drop": fixed(0.4), "observation_drop": fixed(0.25)})
    for _ in range(500):
        core.command("position", np.zeros(6))
    assert core.stats.commands_dropped / core.stats.commands_sent == pytest.approx(0.4, abs=0.06)
    valid = [core.observe().valid for _ in range(800)]
    assert 1.0 - np.mean(valid) == pytest.approx(0.25, abs=0.05)


def test_action_jitter_varies_delay_but_never_reorders_commands() -> None:
    core = core_with({"action_delay": fixed(0.005), "action_jitter": fixed(0.003)})
    for k in range(200):
        core.command("position", np.full(6, 1e-4 * k))
        core.advance(0.001)
        # The drive only ever moves forward through the sequence of set-points.
        held = core.plant.target[0]
        assert held <= 1e-4 * k + 1e-12
    assert core.stats.commands_delivered >= 190


def test_interval_term_is_redrawn_on_its_timer() -> None:
    core = core_with({"pixel_noise": {"operation": "abs", "range": [0.0, 10.0],
                                      "mode": "interval", "interval_s": 0.1}})
    seen = {core.draw.visual.pixel_noise_std}
    for _ in range(10):
        core.advance(0.1)
        seen.add(core.draw.visual.pixel_noise_std)
    assert core.stats.interval_redraws == 10
    assert len(seen) == 11


def test_gravity_tilt_tilts_the_sensed_tool_weight() -> None:
    core = core_with({"gravity_tilt": fixed([0.1, 0.1], shared=True)})
    w = core.advance(0.2).wrench
    tool_kg = sum(ARM.inertials[n].mass_kg for n in ("ft_sensor_link", "tool_link"))
    # Rotating gravity about x by +0.1 rad gives it a +y component of g·sin(0.1).
    assert w[1] == pytest.approx(tool_kg * G * np.sin(0.1), rel=0.05)


def test_visual_terms_change_the_camera_image_and_reproduce() -> None:
    terms = {"light_direction": {"operation": "add", "range": [-1.0, 1.0], "mode": "reset"},
             "arm_color": {"operation": "add", "range": [-0.3, 0.3], "mode": "reset"},
             "pixel_noise": fixed(3.0)}
    a, b, c = core_with(terms, seed=1), core_with(terms, seed=1), core_with(terms, seed=2)
    img_a, img_b, img_c = a.render(), b.render(), c.render()
    assert img_a.shape == (a.camera.height, a.camera.width, 3) and img_a.dtype == np.uint8
    assert np.array_equal(img_a, img_b)
    assert np.abs(img_a.astype(int) - img_c.astype(int)).mean() > 2.0

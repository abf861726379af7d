"""The MuJoCo proxy arm core: it follows position commands and every hidden perturbation acts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.proxy.plant import ProxyPlant
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.robot.model import load_arm

ARM = load_arm(default_urdf())
POSE = np.array([0.4, 0.7, 0.9, 0.3, -0.5, 0.2])
SHIPPED_UNIT = share_path("config", "proxy", "unit_proxy-SN0001.yaml")


def unit_with(**changes: object) -> ProxyUnit:
    """Return the nominal unit with some fields replaced."""
    base = ProxyUnit.nominal(ARM)
    return ProxyUnit(**{**base.__dict__, **changes})


def ramp_to(plant: ProxyPlant, q: np.ndarray, ramp_s: float = 0.5, hold_s: float = 1.0,
            period_s: float = 0.01) -> list[np.ndarray]:
    """Stream a linear ramp at 100 Hz then hold; return the true positions after each period."""
    start = plant.truth().q
    out = []
    steps = int(round((ramp_s + hold_s) / period_s))
    for k in range(1, steps + 1):
        a = min(1.0, k * period_s / ramp_s)
        plant.command_position(start + a * (q - start))
        plant.advance(period_s)
        out.append(plant.truth().q)
    return out


def test_proxy_follows_position_commands_to_within_two_millirad() -> None:
    plant = ProxyPlant()
    ramp_to(plant, POSE)
    assert np.max(np.abs(plant.truth().q - POSE)) < 2e-3
    assert np.max(np.abs(plant.truth().qd)) < 1e-2


def test_shipped_unit_still_follows_commands_within_its_backlash() -> None:
    unit = ProxyUnit.from_yaml(SHIPPED_UNIT, ARM)
    plant = ProxyPlant(unit)
    ramp_to(plant, POSE, hold_s=1.5)
    err = np.abs(plant.truth().q - POSE)
    # Integral action removes the gravity sag; what is left is gearbox play and friction.
    assert np.all(err < 0.5 * unit.backlash_rad + 2e-3), err


def test_encoder_bias_shows_in_the_measurement_not_in_the_truth() -> None:
    bias = np.array([0.01, -0.02, 0.015, 0.0, 0.005, -0.01])
    plant = ProxyPlant(unit_with(encoder_bias_rad=bias))
    plant.advance(0.2)
    np.testing.assert_allclose(plant.measure().q - plant.truth().q, bias, atol=1e-12)
    assert np.max(np.abs(plant.truth().q)) < 1e-3


def test_encoder_drift_grows_with_time_and_quantization_snaps_to_counts() -> None:
    drift = np.full(6, 5e-3)
    res = 1e-4
    plant = ProxyPlant(
        unit_with(encoder_drift_rad_s=drift, encoder_resolution_rad=np.full(6, res)))
    early = plant.advance(0.5).q - plant.truth().q
    late = plant.advance(2.0).q - plant.truth().q
    np.testing.assert_allclose(late - early, 2.0 * drift, atol=res + 1e-9)
    counts = plant.measure().q / res
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-9)


def test_action_latency_delays_the_response_by_the_latency() -> None:
    def first_motion_s(latency_s: float) -> float:
        plant = ProxyPlant(unit_with(action_latency_s=latency_s))
        plant.advance(0.05)
        target = plant.truth().q.copy()
        target[0] += 0.1
        plant.command_position(target)
        t0 = plant.time_s
        while plant.time_s - t0 < 1.0:
            plant.step(1)
            if abs(plant.truth().q[0]) > 1e-3:
                return plant.time_s - t0
        raise AssertionError("the joint never moved")

    delay = first_motion_s(0.08) - first_motion_s(0.0)
    assert delay == pytest.approx(0.08, abs=2e-3)


def test_latency_jitter_never_reorders_commands() -> None:
    plant = ProxyPlant(unit_with(action_latency_s=0.01, action_jitter_s=0.05))
    applied = []
    for k in range(100):
        applied.append(plant.command_position(np.full(6, 0.001 * k)))
        plant.advance(0.002)
    delays = np.array(applied) - 0.002 * np.arange(100)
    assert np.all(np.diff(applied) >= 0)
    assert delays.min() >= 0.01 - 1e-9 and delays.max() > 0.03


def test_torque_saturation_caps_the_effort_and_lets_gravity_win() -> None:
    horizontal = np.array([0.0, 1.5, 0.0, 0.0, 0.0, 0.0])
    strong = ProxyPlant()
    ramp_to(strong, horizontal, ramp_s=1.0, hold_s=1.0)
    holding_nm = abs(strong.truth().tau_nm[1])
    weak_limit = ARM.max_effort_nm.copy()
    weak_limit[1] = 0.6 * holding_nm
    weak = ProxyPlant(unit_with(torque_limit_nm=weak_limit))
    ramp_to(weak, horizontal, ramp_s=1.0, hold_s=1.0)
    assert abs(weak.truth().tau_nm[1]) == pytest.approx(weak_limit[1], rel=1e-6)
    assert strong.truth().q[1] == pytest.approx(1.5, abs=2e-3)
    assert weak.truth().q[1] > 1.6  # sags past the target


def test_payload_and_mass_raise_the_holding_torque() -> None:
    pose = np.array([0.0, 1.2, 0.3, 0.0, 0.0, 0.0])
    torques = []
    for unit in (unit_with(), unit_with(payload_kg=2.0), unit_with(link_mass_scale=1.2)):
        plant = ProxyPlant(unit)
        ramp_to(plant, pose)
        torques.append(abs(plant.truth().tau_nm[1]))
    nominal, payload, heavy = torques
    # 2 kg about 1 m out from the shoulder: ~ 2 * 9.81 * reach more torque.
    reach_m = float(np.linalg.norm(ARM.tool_position(pose)[:2]))
    assert payload - nominal == pytest.approx(2.0 * 9.81 * reach_m, rel=0.1)
    assert heavy / nominal == pytest.approx(1.2, rel=0.05)


def test_coulomb_friction_holds_against_a_small_push_and_damping_slows_motion() -> None:
    def reach_time_s(unit: ProxyUnit) -> float:
        plant = ProxyPlant(unit)
        target = np.zeros(6)
        target[5] = 0.5
        plant.command_position(target)
        while plant.time_s < 3.0:
            plant.advance(0.005)
            if plant.truth().q[5] > 0.45:
                return plant.time_s
        return 3.0

    assert reach_time_s(unit_with(joint_damping_nms=np.full(6, 5.0))) > 1.2 * reach_time_s(
        unit_with())
    friction = ProxyPlant(unit_with(joint_friction_nm=np.full(6, 3.0)))
    assert friction.model.dof_frictionloss.max() == pytest.approx(3.0)


def test_backlash_leaves_play_that_depends_on_the_approach_direction() -> None:
    play = 0.02
    plant = ProxyPlant(unit_with(backlash_rad=np.full(6, play), servo_integral_time_s=0.05))
    target = np.zeros(6)
    target[0] = 0.2
    ramp_to(plant, target)
    from_below = plant.truth().q[0]
    ramp_to(plant, target + 0.3)
    ramp_to(plant, target)
    from_above = plant.truth().q[0]
    assert from_above - from_below == pytest.approx(play, abs=2e-3)


def test_ft_sensor_weighs_the_tool_and_carries_the_unit_bias() -> None:
    bias = np.array([1.0, -2.0, 3.0, 0.1, -0.2, 0.3])
    plant = ProxyPlant(unit_with(ft_bias=bias))
    plant.advance(0.1)
    tool_kg = ARM.inertials["ft_sensor_link"].mass_kg + ARM.inertials["tool_link"].mass_kg
    truth = plant.truth().wrench
    # Arm straight up: the tool side loads the sensor with its weight along -z.
    assert truth[2] == pytest.approx(-9.81 * tool_kg, rel=1e-3)
    np.testing.assert_allclose(plant.measure().wrench - truth, bias, atol=1e-9)


def test_mujoco_and_pybullet_respond_differently_to_the_same_commands() -> None:
    from sim2real_ros.sim.plant import ArmPlant

    proxy = ProxyPlant()
    sim = ArmPlant()
    try:
        diffs, sim_q, proxy_q = [], None, None
        for k in range(1, 151):
            cmd = POSE * min(1.0, k / 50)
            sim.set_command("position", cmd)
            sim_q = sim.step(10).q
            proxy.command_position(cmd)
            proxy.advance(0.01)
            proxy_q = proxy.truth().q
            diffs.append(np.abs(sim_q - proxy_q))
        assert sim_q is not None and proxy_q is not None
        # Both track the command (same arm, same task) ...
        assert np.max(np.abs(sim_q - POSE)) < 0.02 and np.max(np.abs(proxy_q - POSE)) < 0.02
        # ... but the engines and drive loops differ measurably, in motion and at rest.
        assert np.max(diffs) > 0.02
        assert np.max(np.abs(sim_q - proxy_q)) > 2e-3
        # The F/T readings agree at rest: the same arm, weighed by two engines.
        np.testing.assert_allclose(sim.state().wrench, proxy.truth().wrench, atol=0.3)
    finally:
        sim.close()


def test_unit_file_errors_name_the_file_key_and_allowed_range(tmp_path: Path) -> None:
    bad = tmp_path / "unit_bad.yaml"
    bad.write_text("unit_id: x\njoints:\n  backlash_rad: [0.001, 0.002]\n")
    with pytest.raises(ConfigError) as info:
        ProxyUnit.from_yaml(bad, ARM)
    assert str(bad) in str(info.value) and "joints.backlash_rad" in str(info.value)
    assert "list of 6" in str(info.value)
    bad.write_text("unit_id: x\nlatency:\n  action_latency_s: 3.0\n")
    with pytest.raises(ConfigError, match=r"latency.action_latency_s = 3.0: expected .*0.5"):
        ProxyUnit.from_yaml(bad, ARM)
    bad.write_text("unit_id: x\nencoder:\n  bias: 0.1\n")
    with pytest.raises(ConfigError, match="encoder.bias"):
        ProxyUnit.from_yaml(bad, ARM)
    bad.write_text("unit_id: x\njoints:\n  friction_nm: {elbow_joint: 2.0, knee: 1.0}\n")
    with pytest.raises(ConfigError, match="joints.friction_nm.knee"):
        ProxyUnit.from_yaml(bad, ARM)


def test_unit_file_accepts_scalars_lists_and_joint_maps(tmp_path: Path) -> None:
    f = tmp_path / "unit_ok.yaml"
    f.write_text(
        "unit_id: bench-7\nseed: 3\njoints:\n  damping_nms: 2.0\n"
        "  friction_nm: {elbow_joint: 1.5}\n  torque_limit_scale: 0.5\n"
    )
    u = ProxyUnit.from_yaml(f, ARM)
    assert u.unit_id == "bench-7" and u.seed == 3 and len(u.sha256) == 64
    np.testing.assert_allclose(u.joint_damping_nms, 2.0)
    assert u.joint_friction_nm[ARM.joint_names.index("elbow_joint")] == 1.5
    assert u.joint_friction_nm.sum() == 1.5
    np.testing.assert_allclose(u.torque_limit_nm, 0.5 * ARM.max_effort_nm)


def _excitation_runs(unit: ProxyUnit, n_runs: int = 3) -> tuple[list, list]:
    """Noise-free multisine runs on the proxy: (runs with the reported effort, runs with
    MuJoCo's raw actuator_force), sampled at 250 Hz with commands at 100 Hz."""
    from sim2real_ros.sysid import excitation as ex
    from sim2real_ros.sysid.runs import RunData

    env = ex.ExcitationEnvelope.from_arm(ARM, 0.3, 0.3, 3.0)
    reported, raw = [], []
    for k in range(n_runs):
        exc = ex.make_excitation("multisine", np.zeros(ARM.n_joints), env, 20.0, 0.3, 0.2, 2.0,
                                 seed=1 + k)
        plant = ProxyPlant(unit)
        t, q, qd, tau, tau_raw, ct, cmd = [], [], [], [], [], [], []
        for i in range(int(round((exc.duration_s + 2.0) / plant.physics_dt_s))):
            if i % 10 == 0:
                u = exc.at(plant.time_s - 1.0)
                plant.command_position(u)
                ct.append(plant.time_s)
                cmd.append(u)
            plant.step(1)
            if (i + 1) % 4 == 0:
                m = plant.truth()
                t.append(m.t_s)
                q.append(m.q)
                qd.append(m.qd)
                tau.append(m.tau_nm)
                tau_raw.append(plant.data.actuator_force.copy())
        for out, efforts in ((reported, tau), (raw, tau_raw)):
            out.append(RunData(name=f"run{k}", joint_names=list(ARM.joint_names),
                               t_s=np.array(t) - t[0], q=np.array(q), qd=np.array(qd),
                               tau=np.array(efforts), cmd_t_s=np.array(ct) - t[0],
                               cmd=np.array(cmd)))
    return reported, raw


def test_reported_effort_is_the_applied_torque_so_the_regression_finds_the_armature() -> None:
    # MuJoCo's implicit integrator applies the drive's kv at the step's end velocity, so its
    # actuator_force over-reports the torque by dt·kv·q̈, an apparent inertia of dt·kv. A drive
    # reports what it applies: the effort regression on it finds the unit's armature.
    from sim2real_ros.sim.plant import ArmPlant, PlantParams
    from sim2real_ros.sysid.fit import regression_start

    unit = ProxyUnit.from_yaml(SHIPPED_UNIT, ARM)
    assert unit.integrator == "implicitfast"
    reported, raw = _excitation_runs(unit)
    groups = ("joint_damping_nms", "joint_friction_nm", "armature_kgm2", "mass_scale",
              "payload_kg")
    plant = ArmPlant()
    try:
        base = plant.resolved_params(PlantParams())
        est = {name: regression_start(plant, runs, base, groups, 0.0, 0.2, trusted_only=False,
                                      bounded=False).values
               for name, runs in (("reported", reported), ("raw", raw))}
    finally:
        plant.close()
    # Measured (3 runs of 20 s): reported -6/-24/-9 %, raw +96/+78/+42 % on joints 0/1/2.
    for j in range(3):  # the big joints, where dt·kv is 0.1-0.7 kg·m² against 0.18-0.35
        true = unit.armature_kgm2[j]
        got = est["reported"][f"armature_kgm2[{j}]"]
        biased = est["raw"][f"armature_kgm2[{j}]"]
        assert abs(got - true) <= 0.3 * true, (j, got, true)
        assert biased - true >= 0.35 * true, (j, biased, true)  # the bias the fix removes


def test_reported_effort_is_the_mean_applied_torque_since_the_previous_sample() -> None:
    # A drive's current measurement integrates over its reporting period: measure() reports
    # the mean of every physics step's applied torque since the previous measure().
    unit = ProxyUnit.from_yaml(SHIPPED_UNIT, ARM)
    q0 = np.array([0.0, -0.4, 1.2, 0.0, 1.5, 0.0])
    sampled, stepped = ProxyPlant(unit), ProxyPlant(unit)
    for p in (sampled, stepped):
        p.reset(q0)
        p.command_position(q0 + 0.3)
        p.advance(0.05)  # the bus delivered the command; the drives are moving the arm
    per_step = []
    for _ in range(8):
        stepped.step(1)
        per_step.append(stepped.truth().tau_nm)
    sampled.step(8)
    m = sampled.measure()
    assert np.allclose(m.tau_nm, np.mean(per_step, axis=0), rtol=0.0, atol=1e-9)
    # Not a snapshot: the last step's torque differs (the arm accelerates under the new target).
    assert np.max(np.abs(m.tau_nm - per_step[-1])) > 0.05
    # No step since the last sample: the last step's torque.
    assert np.array_equal(sampled.measure().tau_nm, sampled.truth().tau_nm)

"""The PyBullet plant: servo stability, saturation, friction, damping, payload, F/T sensor."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.sim.plant import ArmPlant, PlantParams

G = 9.81
POSE = np.array([0.3, 0.8, 0.9, 0.2, 1.2, 0.3])


@pytest.fixture(scope="module")
def plant() -> ArmPlant:
    p = ArmPlant()
    yield p
    p.close()


def test_position_servo_is_stable_and_converges_on_every_joint(plant: ArmPlant) -> None:
    plant.set_params(PlantParams())
    plant.reset()
    plant.set_command("position", POSE)
    qs = []
    for _ in range(150):
        qs.append(plant.step(10).q)
    qs = np.array(qs)
    # No step-to-step sign flipping (explicit-integration instability) in the last 0.5 s ...
    tail_vel = np.diff(qs[-50:], axis=0)
    assert np.all(np.abs(tail_vel) < 1e-4)
    # ... and every joint within a few mrad (no gravity feed-forward: a small sag remains).
    err = qs[-1] - POSE
    assert np.all(np.abs(err) < 0.02), err
    assert np.abs(err[0]) < 1e-4  # the pan joint carries no gravity load


def test_heavier_payload_raises_holding_torque_and_sag(plant: ArmPlant) -> None:
    results = {}
    for payload in (0.0, 3.0):
        plant.set_params(PlantParams(payload_kg=payload))
        plant.reset(POSE)
        plant.set_command("position", POSE)
        s = plant.step(1500)
        results[payload] = s
    light, heavy = results[0.0], results[3.0]
    # Shoulder lift holds roughly 3 kg × g × horizontal reach more.
    reach = plant.arm.tool_position(POSE)[0]
    extra = abs(heavy.tau_nm[1]) - abs(light.tau_nm[1])
    assert extra == pytest.approx(3.0 * G * reach, rel=0.15)
    assert abs(heavy.q[1] - POSE[1]) > abs(light.q[1] - POSE[1]) + 5e-4


def test_servo_torque_saturates_at_scaled_effort_limit(plant: ArmPlant) -> None:
    plant.set_params(PlantParams(torque_limit_scale=0.2))
    plant.reset()
    plant.set_command("position", np.array([0.0, 1.5, 0.0, 0.0, 0.0, 0.0]))
    peak = np.zeros(6)
    for _ in range(20):
        peak = np.maximum(peak, np.abs(plant.step(5).tau_nm))
    limit = 0.2 * plant.arm.max_effort_nm
    assert np.all(peak <= limit + 1e-9)
    assert peak[1] == pytest.approx(limit[1])


def test_coulomb_friction_holds_against_torque_below_it_and_slides_above(plant: ArmPlant) -> None:
    friction = np.full(6, 1.0)
    plant.set_params(
        PlantParams(joint_friction_nm=friction, joint_damping_nms=np.zeros(6), gravity=np.zeros(3))
    )
    plant.reset()
    below = np.array([0.9, 0, 0, 0, 0, 0])
    plant.set_command("effort", below)
    # Without friction it would turn 0.5 · 0.9 / M · t² ≈ 0.5 rad; stiction allows some creep.
    assert abs(plant.step(300).q[0]) < 1e-3
    plant.reset()
    plant.set_command("effort", 2.0 * below)
    s = plant.step(300)
    # Net torque 0.8 N·m on the pan inertia: q = 0.5 · a · t².
    m00 = plant.mass_matrix(np.zeros(6))[0, 0]
    assert s.q[0] == pytest.approx(0.5 * (1.8 - 1.0) / m00 * 0.3**2, rel=0.1)


def test_viscous_damping_sets_terminal_velocity(plant: ArmPlant) -> None:
    damping = np.full(6, 2.0)
    plant.set_params(PlantParams(joint_damping_nms=damping, gravity=np.zeros(3)))
    plant.reset()
    plant.set_command("effort", np.array([1.0, 0, 0, 0, 0, 0]))
    s = plant.step(1000)
    assert s.qd[0] == pytest.approx(1.0 / 2.0, rel=0.02)


def test_ft_sensor_reads_tool_weight_in_sensor_frame(plant: ArmPlant) -> None:
    plant.set_params(PlantParams())
    plant.reset()
    plant.set_command("position", np.zeros(6))
    w = plant.step(200).wrench
    tool_side_kg = sum(plant.arm.inertials[n].mass_kg for n in ("ft_sensor_link", "tool_link"))
    # Arm straight up: the sensor's z points up, the tool presses down on it.
    assert w[2] == pytest.approx(-tool_side_kg * G, rel=1e-3)
    assert np.allclose(w[[0, 1, 3, 4, 5]], 0.0, atol=1e-3)
    # Wrist 2 at +90°: sensor x points down; the tool's weight acts at its centre of mass.
    q = np.array([0, 0, 0, 0, np.pi / 2, 0])
    plant.reset(q)
    plant.set_command("position", q)
    w = plant.step(300).wrench
    assert w[0] == pytest.approx(tool_side_kg * G, rel=2e-2)
    com_z = (0.3 * 0.0175 + 0.5 * (0.035 + 0.05)) / tool_side_kg
    assert w[4] == pytest.approx(tool_side_kg * G * com_z, rel=2e-2)


def test_same_params_give_bit_identical_trajectories() -> None:
    runs = []
    for _ in range(2):
        with ArmPlant(params=PlantParams(payload_kg=1.0, joint_friction_nm=np.full(6, 0.5))) as p:
            p.set_command("position", POSE)
            runs.append(np.array([p.step(5).q for _ in range(40)]))
    assert np.array_equal(runs[0], runs[1])


def test_params_round_trip_and_reject_unknown_fields() -> None:
    p = PlantParams(payload_kg=2.0, joint_damping_nms=np.arange(6.0), kp_scale=1.2)
    back = PlantParams.from_dict(p.to_dict())
    assert back.to_dict() == p.to_dict()
    with pytest.raises(ConfigError, match="payload_kgs"):
        PlantParams.from_dict({"payload_kgs": 1.0}, path="cal.yaml")


def test_bad_command_is_refused(plant: ArmPlant) -> None:
    with pytest.raises(ValueError, match="expected 6 values"):
        plant.set_command("position", np.zeros(5))
    with pytest.raises(ValueError, match="non-finite"):
        plant.set_command("position", np.array([0, 0, np.nan, 0, 0, 0]))
    with pytest.raises(ValueError, match="mode"):
        plant.set_command("torque", np.zeros(6))


def test_light_wrist_without_armature_stays_stable_with_heavy_damping(plant: ArmPlant) -> None:
    # Wrist 3 alone weighs ~6e-4 kg·m²: a URDF damping of 2 N·m·s/rad gives b·dt/M > 3, where
    # an explicit damper would flip the velocity's sign every step.
    plant.set_params(PlantParams(armature_kgm2=0.0, joint_damping_nms=np.full(6, 2.0)))
    plant.reset()
    target = np.array([0.0, 0.0, 0.0, 0.3, 0.3, 0.5])
    plant.set_command("position", target)
    vel = np.array([plant.step(1).qd for _ in range(600)])
    flips = np.sum(np.sign(vel[1:, 5]) * np.sign(vel[:-1, 5]) < 0)
    assert flips <= 2
    assert np.all(np.abs(vel) < 5.0)
    assert np.abs(plant.state().q[3:] - target[3:]).max() < 0.02

"""The C step loop (sim/_servo.c) against its Python reference: the same trajectory, bit for bit.

The native backend does the plant's servo, physics stepping, gain refresh and the whole sensor
path (history, delay, jitter, drops, bias, drift, noise, quantization, F/T frame) in C on
PyBullet's C API. Every test here runs the same seeded scenario twice, once with
`native=False`, and compares every number the core hands out with `==`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pybullet_data
import pytest

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sim import _pbnative, plant as plant_mod
from sim2real_ros.sim.core import SimCore
from sim2real_ros.sim.plant import ArmPlant, PlantParams, _inv_diag
from sim2real_ros.sim.randomization import RandomizationSpec

REPO = Path(__file__).resolve().parents[1]
ARM = load_arm(default_urdf())
SHIPPED = RandomizationSpec.from_yaml(share_path("config", "randomization.yaml"))


def test_the_extension_is_built_and_chosen() -> None:
    # A missing build must fail here, not quietly run the slow loop everywhere else.
    assert plant_mod._native is not None, "sim2real_ros/sim/_servo.c was not built"
    assert plant_mod.NATIVE_AVAILABLE
    assert _pbnative.client_handle_findable()
    plant = ArmPlant()
    try:
        assert plant.backend == "native"
    finally:
        plant.close()
    slow = ArmPlant(native=False)
    try:
        assert slow.backend == "python"
    finally:
        slow.close()


def test_the_environment_variable_forces_the_python_loop() -> None:
    code = ("from sim2real_ros.sim.plant import ArmPlant; p = ArmPlant(); print(p.backend)")
    env = dict(os.environ, SIM2REAL_SIM_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "python"


def test_client_handles_are_found_for_every_client_and_refused_out_of_range() -> None:
    import pybullet as pb

    ids = [pb.connect(pb.DIRECT) for _ in range(3)]
    try:
        handles = [_pbnative.client_handle(c) for c in ids]
        assert all(h is not None and h > 0 for h in handles)
        assert len(set(handles)) == 3
        assert _pbnative.client_handle(-1) is None
        assert _pbnative.client_handle(_pbnative.MAX_PHYSICS_CLIENTS) is None
    finally:
        for c in ids:
            pb.disconnect(physicsClientId=c)
    # a disconnected id has no handle
    assert _pbnative.client_handle(ids[-1]) is None


def record(core: SimCore, rng: np.random.Generator, ticks: int) -> list[np.ndarray]:
    """Drive a core with mixed commands; return every observation as one row."""
    rows = []
    n = core.n
    for k in range(ticks):
        if k % 5 == 0:
            phase = (k // 150) % 3
            if phase == 0:
                core.command("position", np.clip(rng.normal(0.0, 0.6, n), -1.5, 1.5))
            elif phase == 1:
                core.command("velocity", rng.normal(0.0, 0.4, n))
            else:
                core.command("effort", rng.normal(0.0, 5.0, n))
        o = core.advance(0.002)
        rows.append(np.concatenate([[o.t_s, o.stamp_s, float(o.valid)], o.q, o.qd, o.tau_nm,
                                    o.wrench]))
    return rows


def run_core(spec: RandomizationSpec, seed: int, native: bool, urdf: str | None = None,
             episodes: int = 2, ticks: int = 600) -> tuple[np.ndarray, dict]:
    core = SimCore(spec, seed=seed, native=native, urdf_path=urdf)
    try:
        assert core.plant.backend == ("native" if native else "python")
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(episodes):
            rows += record(core, rng, ticks)
            core.reset()
        stats = {k: v for k, v in vars(core.stats).items() if k != "extra"}
        return np.array(rows), stats
    finally:
        core.close()


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_shipped_randomization_gives_the_same_trajectory_bit_for_bit(seed: int) -> None:
    ref, ref_stats = run_core(SHIPPED, seed, native=False)
    got, got_stats = run_core(SHIPPED, seed, native=True)
    assert got.shape == ref.shape
    assert np.array_equal(got, ref), np.abs(got - ref).max()
    assert got_stats == ref_stats
    # the scenario exercised what it is meant to: commands of all modes arrived
    assert ref_stats["commands_delivered"] > 100


def test_drops_delay_jitter_drift_quantization_and_mid_episode_reloads_match() -> None:
    # Every sensor effect strong, and inertial terms redrawn at intervals (the arm reloads in
    # the middle of an episode, the C loop moves to the new body with its sensor state).
    def t(lo: float, hi: float, mode: str = "reset", **extra: object) -> dict:
        return {"operation": "abs", "distribution": "uniform", "range": [lo, hi], "mode": mode,
                **extra}

    terms = {
        "observation_delay": t(0.003, 0.008),
        "observation_jitter": t(0.001, 0.003),
        "observation_drop": t(0.2, 0.3),
        "action_delay": t(0.002, 0.006),
        "action_jitter": t(0.001, 0.002),
        "action_drop": t(0.05, 0.1),
        "joint_position_noise": t(1e-3, 2e-3),
        "joint_velocity_noise": t(1e-2, 2e-2),
        "joint_effort_noise": t(0.1, 0.3),
        "joint_position_drift": t(1e-3, 3e-3),
        "joint_position_bias": t(-0.01, 0.01),
        "joint_position_quantization": t(1e-4, 1e-4),
        "joint_velocity_quantization": t(1e-3, 1e-3),
        "ft_force_noise": t(0.2, 0.5),
        "ft_torque_noise": t(0.01, 0.02),
        "ft_force_bias": t(-1.0, 1.0),
        "payload_mass": t(0.0, 2.0, mode="interval", interval_s=[0.1, 0.3]),
        "kp": {"operation": "scale", "distribution": "uniform", "range": [0.7, 1.3],
               "mode": "interval", "interval_s": [0.05, 0.2]},
        "motor_lag": t(0.002, 0.01),
        "joint_friction": t(0.2, 1.5),
        "backlash": t(0.002, 0.004),
        "deadband": t(0.0005, 0.001),
    }
    spec = RandomizationSpec.from_dict({"terms": terms}, "test-spec", ARM)
    ref, ref_stats = run_core(spec, 3, native=False, ticks=500)
    got, got_stats = run_core(spec, 3, native=True, ticks=500)
    assert np.array_equal(got, ref), np.abs(got - ref).max()
    assert got_stats == ref_stats
    assert ref_stats["observations_dropped"] > 50
    assert ref_stats["interval_redraws"] > 10
    assert (ref[:, 2] == 0.0).any()  # some observations were lost, and marked so


def test_a_second_arm_from_pybullet_data_matches_too() -> None:
    urdf = str(Path(pybullet_data.getDataPath()) / "kuka_iiwa" / "model.urdf")
    arm = load_arm(urdf)
    spec = RandomizationSpec.from_dict({"terms": {
        "joint_position_noise": {"operation": "abs", "distribution": "uniform",
                                 "range": [1e-3, 1e-3], "mode": "reset"},
        "observation_delay": {"operation": "abs", "distribution": "uniform",
                              "range": [0.004, 0.004], "mode": "reset"},
    }}, "test-spec", arm)
    ref, _ = run_core(spec, 5, native=False, urdf=urdf, ticks=300)
    got, _ = run_core(spec, 5, native=True, urdf=urdf, ticks=300)
    assert got.shape[1] == 3 + 3 * 7 + 6
    assert np.array_equal(got, ref)


def test_plant_state_gains_and_inverse_dynamics_agree_between_backends() -> None:
    params = PlantParams(payload_kg=1.5, motor_lag_s=0.004, torque_limit_scale=0.3,
                         joint_friction_nm=np.full(6, 0.8))
    out = {}
    for native in (False, True):
        p = ArmPlant(params=params, native=native)
        try:
            p.reset(np.array([0.1, -0.4, 0.8, 0.0, 0.5, 0.2]))
            p.set_command("position", np.array([0.6, 0.3, 1.2, -0.4, 0.9, -0.3]))
            states = []
            for _ in range(120):
                p.advance_steps(3)
                st = p.state()
                states.append(np.concatenate([st.q, st.qd, st.tau_nm, st.wrench]))
            kp, kd = p.servo_gains
            out[native] = (np.array(states), kp, kd, p.mass_matrix(), p.effort_limit_nm)
        finally:
            p.close()
    for a, b in zip(out[False], out[True]):
        assert np.array_equal(a, b)
    # saturation was reached (the scenario means something)
    assert np.max(np.abs(out[True][0][:, 12:18])) == pytest.approx(
        np.max(out[True][4]), rel=1e-9)


def test_an_arm_with_a_movable_joint_off_the_chain_runs_the_python_loop(tmp_path: Path) -> None:
    # The C loop refreshes the gains from the chain's mass matrix alone; a branch (a gripper
    # finger on the base here) needs the Python loop, which still steps the arm normally.
    import xml.etree.ElementTree as ET

    tree = ET.parse(default_urdf())
    root = tree.getroot()
    root.append(ET.fromstring(
        '<link name="finger"><inertial><mass value="0.05"/><origin xyz="0 0 0.01"/>'
        '<inertia ixx="1e-5" iyy="1e-5" izz="1e-5" ixy="0" ixz="0" iyz="0"/></inertial></link>'))
    root.append(ET.fromstring(
        '<joint name="finger_joint" type="prismatic"><parent link="base_link"/>'
        '<child link="finger"/><axis xyz="0 1 0"/>'
        '<limit lower="0" upper="0.04" effort="20" velocity="0.2"/></joint>'))
    urdf = tmp_path / "branched.urdf"
    tree.write(urdf)
    p = ArmPlant(urdf)
    try:
        assert p.n == 6 and p.backend == "python"
        target = np.array([0.3, 0.5, 0.8, 0.2, 0.9, 0.3])
        p.set_command("position", target)
        p.advance_steps(1500)
        np.testing.assert_allclose(p.state().q, target, atol=0.02)
    finally:
        p.close()


def test_inverse_diagonal_matches_numpy_and_reports_singular_matrices() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 3, 6, 7):
        for _ in range(20):
            a = rng.normal(size=(n, n))
            m = a @ a.T + 0.1 * np.eye(n)
            got = np.array(_inv_diag(m.ravel().tolist(), n))
            np.testing.assert_allclose(got, np.diag(np.linalg.inv(m)), rtol=1e-9)
    assert _inv_diag([1.0, 2.0, 2.0, 4.0], 2) is None
    assert _inv_diag([0.0], 1) is None


def test_the_c_loop_refuses_bad_buffers_and_handles() -> None:
    servo_type = plant_mod._native.Servo
    with pytest.raises(ValueError, match="null"):
        servo_type(0, 0, [0], [6], False, 1)
    p = ArmPlant()
    try:
        s = p._servo
        with pytest.raises(ValueError, match="float64"):
            s.sense(np.zeros(3, dtype=np.float32), p.steps)
        with pytest.raises(ValueError, match="expected 6 values"):
            s.set_command(0, [0.0] * 5)
        with pytest.raises(ValueError, match="mode"):
            s.set_command(7, [0.0] * 6)
        with pytest.raises(ValueError, match="history"):
            s.set_history(np.zeros((4, 6)), np.zeros((4, 6)), np.zeros((4, 6)),
                          np.zeros((4, 5)))
        with pytest.raises(ValueError, match="2n"):
            s.state(np.zeros(5))
    finally:
        p.close()


def test_a_closed_plant_raises_instead_of_touching_a_freed_client() -> None:
    import pybullet as pb

    p = ArmPlant()
    assert p.backend == "native"
    p.close()
    # The C loop held a pointer into the client pybullet freed: close() drops it first.
    assert p.backend == "python"
    with pytest.raises(pb.error):
        p.advance_steps(1)

"""The arm model comes from any URDF and agrees with PyBullet's kinematics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pybullet as p
import pybullet_data
import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot import load_arm

IIWA = Path(pybullet_data.getDataPath()) / "kuka_iiwa" / "model.urdf"


def test_our_arm_has_six_joints_limits_and_a_tool_frame() -> None:
    arm = load_arm(default_urdf())
    assert arm.n_joints == 6
    assert arm.tip_link == "tool0"
    assert arm.joint_names[0] == "shoulder_pan_joint"
    assert np.all(arm.lower_rad < arm.upper_rad)
    assert np.all(arm.max_velocity_rad_s > 0) and np.all(arm.max_effort_nm > 0)
    assert "ft_sensor_joint" in arm.all_joints
    assert arm.all_joints["ft_sensor_joint"].joint_type == "fixed"
    assert 20.0 < arm.total_mass_kg() < 30.0


def test_loader_reads_a_second_arm_without_anything_hard_wired() -> None:
    arm = load_arm(IIWA)
    assert arm.n_joints == 7
    assert arm.joint_names == [f"lbr_iiwa_joint_{i}" for i in range(1, 8)]


def _pybullet_tip(urdf: Path, q: np.ndarray, tip: str) -> np.ndarray:
    cid = p.connect(p.DIRECT)
    try:
        body = p.loadURDF(str(urdf), useFixedBase=True, physicsClientId=cid)
        names = {}
        k = 0
        for j in range(p.getNumJoints(body, physicsClientId=cid)):
            info = p.getJointInfo(body, j, physicsClientId=cid)
            names[info[12].decode()] = j
            if info[2] != p.JOINT_FIXED:
                p.resetJointState(body, j, float(q[k]), physicsClientId=cid)
                k += 1
        state = p.getLinkState(body, names[tip], computeForwardKinematics=True,
                               physicsClientId=cid)
        return np.array(state[4])
    finally:
        p.disconnect(cid)


@pytest.mark.parametrize("urdf", [default_urdf(), IIWA], ids=["sim2real_arm", "kuka_iiwa"])
def test_forward_kinematics_matches_pybullet(urdf: Path) -> None:
    arm = load_arm(urdf)
    rng = np.random.default_rng(3)
    for _ in range(5):
        q = rng.uniform(np.maximum(arm.lower_rad, -3), np.minimum(arm.upper_rad, 3))
        ours = arm.fk(q)[:3, 3]
        theirs = _pybullet_tip(urdf, q, arm.tip_link)
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_jacobian_matches_finite_differences() -> None:
    arm = load_arm(default_urdf())
    q = np.array([0.3, -0.5, 1.1, 0.2, 0.7, -0.4])
    jac = arm.jacobian(q)[:3]
    eps = 1e-6
    num = np.stack(
        [(arm.tool_position(q + eps * e) - arm.tool_position(q - eps * e)) / (2 * eps)
         for e in np.eye(6)], axis=1)
    np.testing.assert_allclose(jac, num, atol=1e-6)


def test_inverse_kinematics_reaches_a_reachable_point() -> None:
    arm = load_arm(default_urdf())
    q_true = np.array([0.4, 0.6, 0.9, 0.0, 0.5, 0.0])
    target = arm.tool_position(q_true)
    q, err = arm.ik_position(target, np.zeros(6) + 0.1)
    assert err < 1e-3
    np.testing.assert_allclose(arm.tool_position(q), target, atol=1e-3)


def test_wrong_number_of_joint_positions_is_an_error() -> None:
    arm = load_arm(default_urdf())
    with pytest.raises(ValueError, match="expected 6 joint positions"):
        arm.fk(np.zeros(5))


def test_unknown_joint_names_are_refused() -> None:
    arm = load_arm(default_urdf())
    with pytest.raises(KeyError, match="elbow_jiont"):
        arm.index_of(["elbow_jiont"])


def test_inverted_limits_name_the_file_and_joint(tmp_path: Path) -> None:
    bad = tmp_path / "bad.urdf"
    bad.write_text(default_urdf().read_text().replace(
        'lower="-2.6" upper="2.6"', 'lower="2.6" upper="-2.6"'))
    with pytest.raises(ConfigError, match=r"bad.urdf: joint\[elbow_joint\]/limit@lower"):
        load_arm(bad)


def test_unreadable_urdf_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="readable URDF"):
        load_arm(tmp_path / "missing.urdf")

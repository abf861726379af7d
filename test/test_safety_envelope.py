"""The safety envelope loads, matches the URDF, and each kind of bad file has its own error."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pybullet_data
import pytest
import yaml

from sim2real_ros.config import ConfigError, file_sha256
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot import load_arm
from sim2real_ros.safety.envelope import (
    EnvelopeLooserThanUrdfError,
    EnvelopeMinMaxError,
    EnvelopeMissingJointError,
    EnvelopeMissingKeyError,
    EnvelopeNonFiniteError,
    EnvelopeNonPositiveError,
    EnvelopeRobotError,
    EnvelopeShapeError,
    EnvelopeUnknownKeyError,
    EnvelopeVersionError,
    derive_envelope_dict,
    load_envelope,
    write_derived_envelope,
)

ARM = load_arm(default_urdf())
SHIPPED = share_path("config", "safety_envelope.yaml")
IIWA = Path(pybullet_data.getDataPath()) / "kuka_iiwa" / "model.urdf"


def _write(tmp_path: Path, data: dict[str, Any], text: str | None = None) -> Path:
    p = tmp_path / "envelope.yaml"
    p.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
    return p


def test_shipped_envelope_loads_is_tighter_than_the_urdf_and_is_hashed() -> None:
    env = load_envelope(SHIPPED, ARM)
    assert env.joint_names == ARM.joint_names
    assert env.sha256 == file_sha256(SHIPPED) and len(env.sha256) == 64
    for j, lim in zip(env.joints, ARM.limits):
        assert lim.lower < j.lower_rad < j.upper_rad < lim.upper
        assert 0 < j.velocity_rad_s < lim.velocity and 0 < j.effort_nm < lim.effort
        assert j.acceleration_rad_s2 > 0 and j.jerk_rad_s3 > 0
    assert env.commanded.max_force_n < env.measured.max_force_n
    assert 0 < env.limited_scale < 1
    # The task's home pose is inside the workspace box.
    tool = ARM.tool_position([0.0, 0.0, 1.6, 0.0, 1.5, 0.0])
    assert all(lo < t < hi for lo, t, hi in zip(env.box_min_m, tool, env.box_max_m))


def test_derived_envelope_for_a_seven_joint_arm_round_trips(tmp_path: Path) -> None:
    iiwa = load_arm(IIWA)
    path = write_derived_envelope(iiwa, tmp_path / "iiwa.yaml")
    env = load_envelope(path, iiwa)
    assert len(env.joints) == 7 and env.robot == iiwa.name
    assert env.joints[0].upper_rad == pytest.approx(iiwa.limits[0].upper - 0.1, abs=1e-4)
    assert env.joints[0].upper_rad <= iiwa.limits[0].upper - 0.1


def _mutate(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = derive_envelope_dict(ARM)
    change(data)
    return data


def _set(path: list[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return change


def _delete(path: list[str]) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        for k in path[:-1]:
            d = d[k]
        del d[path[-1]]
    return change


CASES = [
    ("missing_joint", _delete(["joints", "elbow_joint"]), EnvelopeMissingJointError,
     "joints.elbow_joint"),
    ("min_greater_than_max", _set(["joints", "wrist_1_joint", "position_rad"], [1.0, -1.0]),
     EnvelopeMinMaxError, "joints.wrist_1_joint.position_rad"),
    ("box_min_greater_than_max", _set(["workspace", "box_min_m"], [2.0, -1.0, 0.1]),
     EnvelopeMinMaxError, "workspace.box_min_m[x]"),
    ("position_looser_than_urdf", _set(["joints", "shoulder_pan_joint", "position_rad"],
                                       [-3.5, 2.0]),
     EnvelopeLooserThanUrdfError, "joints.shoulder_pan_joint.position_rad[0]"),
    ("velocity_looser_than_urdf", _set(["joints", "elbow_joint", "velocity_rad_s"], 9.0),
     EnvelopeLooserThanUrdfError, "joints.elbow_joint.velocity_rad_s"),
    ("effort_looser_than_urdf", _set(["joints", "wrist_3_joint", "effort_nm"], 500.0),
     EnvelopeLooserThanUrdfError, "joints.wrist_3_joint.effort_nm"),
    ("scale_looser_than_full", _set(["stages", "limited_scale"], 1.5),
     EnvelopeLooserThanUrdfError, "stages.limited_scale"),
    ("range_is_a_scalar", _set(["joints", "elbow_joint", "position_rad"], 1.0),
     EnvelopeShapeError, "joints.elbow_joint.position_rad"),
    ("box_has_two_numbers", _set(["workspace", "box_max_m"], [1.0, 1.0]),
     EnvelopeShapeError, "workspace.box_max_m"),
    ("limit_is_a_string", _set(["joints", "elbow_joint", "jerk_rad_s3"], "fast"),
     EnvelopeShapeError, "joints.elbow_joint.jerk_rad_s3"),
    ("unknown_key_typo", _set(["joints", "elbow_joint", "velocty_rad_s"], 1.0),
     EnvelopeUnknownKeyError, "joints.elbow_joint.velocty_rad_s"),
    ("unknown_joint", _set(["joints", "gripper_joint"], {}), EnvelopeUnknownKeyError,
     "joints.gripper_joint"),
    ("unknown_section", _set(["speed_limits"], {}), EnvelopeUnknownKeyError, "speed_limits"),
    ("nan_limit", _set(["joints", "elbow_joint", "acceleration_rad_s2"], float("nan")),
     EnvelopeNonFiniteError, "joints.elbow_joint.acceleration_rad_s2"),
    ("infinite_force", _set(["force", "measured", "max_force_n"], float("inf")),
     EnvelopeNonFiniteError, "force.measured.max_force_n"),
    ("zero_velocity", _set(["joints", "elbow_joint", "velocity_rad_s"], 0.0),
     EnvelopeNonPositiveError, "joints.elbow_joint.velocity_rad_s"),
    ("missing_workspace", _delete(["workspace"]), EnvelopeMissingKeyError, "workspace"),
    ("missing_version", _delete(["version"]), EnvelopeVersionError, "version"),
    ("future_version", _set(["version"], 2), EnvelopeVersionError, "version"),
    ("other_robot", _set(["robot"], "ur5e"), EnvelopeRobotError, "robot"),
    ("commanded_force_above_estop", _set(["force", "commanded", "max_force_n"], 500.0),
     EnvelopeMinMaxError, "force.commanded.max_force_n"),
]


@pytest.mark.parametrize("change,error,key", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_invalid_envelope_kind_raises_its_own_error_naming_file_and_key(
        tmp_path: Path, change: Callable[[dict[str, Any]], None], error: type[ConfigError],
        key: str) -> None:
    path = _write(tmp_path, _mutate(change))
    with pytest.raises(error) as info:
        load_envelope(path, ARM)
    exc = info.value
    assert type(exc) is error, f"expected exactly {error.__name__}, got {type(exc).__name__}"
    assert isinstance(exc, ConfigError)
    assert exc.path == str(path) and exc.key == key
    assert str(path) in str(exc) and key in str(exc) and exc.allowed


def test_error_classes_are_distinct_per_kind() -> None:
    kinds = {c[2] for c in CASES}
    assert len(kinds) == 10


def test_unparsable_and_non_mapping_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_envelope(_write(tmp_path, {}, text="joints: [unclosed"), ARM)
    with pytest.raises(ConfigError):
        load_envelope(_write(tmp_path, {}, text="- a list\n"), ARM)
    with pytest.raises(ConfigError):
        load_envelope(tmp_path / "absent.yaml", ARM)


def test_hash_changes_with_any_edit(tmp_path: Path) -> None:
    a = load_envelope(_write(tmp_path, derive_envelope_dict(ARM)), ARM)
    data = derive_envelope_dict(ARM)
    data["joints"]["elbow_joint"]["velocity_rad_s"] = 2.0
    b = load_envelope(_write(tmp_path, data), ARM)
    assert a.sha256 != b.sha256

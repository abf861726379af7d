"""Coverage reference: the [q, qd] block of the policy's saved training statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.task import TaskConfig, build_observation
from sim2real_ros.robot.model import load_arm
from sim2real_ros.shadow.stats import (
    load_registry_stats,
    load_training_stats,
    state_block_names,
)

ARM = load_arm(default_urdf())
JOINTS = list(ARM.joint_names)


def test_state_block_is_the_first_two_n_entries_of_the_policy_observation() -> None:
    rng = np.random.default_rng(3)
    q, qd, cmd = rng.normal(size=6), rng.normal(size=6), rng.normal(size=6)
    target = np.array([0.5, 0.1, 0.4])
    obs = build_observation(TaskConfig(), q, qd, target, ARM.tool_position(q), cmd)
    np.testing.assert_allclose(obs[:12], np.concatenate([q, qd]).astype(np.float32))
    assert state_block_names(JOINTS)[6] == "qd[shoulder_pan_joint]"


def test_registry_version_and_policy_file_give_the_policys_own_statistics(
    tmp_path: Path,
) -> None:
    from sim2real_ros.policy.registry import PolicyRegistry

    reg = PolicyRegistry(tmp_path / "registry")  # initialised from the shipped default policy
    policy, rec = reg.load(1)
    stats = load_registry_stats(1, JOINTS, reg.root)
    np.testing.assert_array_equal(stats.mean, policy.stats.mean[:12])
    np.testing.assert_array_equal(stats.std, policy.stats.std[:12])
    from_file = load_training_stats(reg.root / rec.file, JOINTS)
    np.testing.assert_array_equal(from_file.mean, stats.mean)


def test_missing_registry_is_refused_without_creating_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="index.json"):
        load_registry_stats(1, JOINTS, tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    "text, key",
    [
        ('{"mean": [0, 0]}', "std"),
        ('{"mean": [0, 0], "std": [1, 1]}', "obs_mean/obs_std"),
        ('{"mean": ' + str([0] * 12) + ', "std": ' + str([1] * 11 + [0]) + "}", "obs_std"),
        ("{not json", "<file>"),
    ],
)
def test_bad_statistics_file_is_refused_naming_file_and_key(
    tmp_path: Path, text: str, key: str
) -> None:
    p = tmp_path / "stats.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_training_stats(p, JOINTS)
    assert str(p) in str(err.value) and key in str(err.value)

"""Policy registry: integrity, promotion, rollback, tamper refusal, the shipped default, CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from sim2real_ros.cli import main as sim2real
from sim2real_ros.config import ConfigError, file_sha256
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.model import EnsemblePolicy, ModelSpec, ObsStats
from sim2real_ros.policy.registry import DEFAULT_DIR, PolicyIntegrityError, PolicyRegistry
from sim2real_ros.policy.task import TaskConfig, resolve_rate_limits
from sim2real_ros.robot.model import load_arm

ARM = load_arm(default_urdf())


def _policy(seed: int) -> EnsemblePolicy:
    cfg = resolve_rate_limits(TaskConfig(), ARM)
    d = cfg.obs_dim(ARM.n_joints)
    stats = ObsStats(np.zeros(d), np.ones(d), 1)
    return EnsemblePolicy(ModelSpec(d, ARM.n_joints, (16,), members=3), stats, cfg.to_dict(),
                          ARM.joint_names, {"seed": seed}, seed=seed)


def _tamper(path: Path) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_new_registry_starts_from_the_shipped_default_as_known_good(tmp_path: Path) -> None:
    reg = PolicyRegistry(tmp_path / "reg")
    assert reg.known_good == 1
    rec = reg.record(0)
    assert rec.sha256 == file_sha256(DEFAULT_DIR / "policy.pt")
    assert rec.metadata["source"] == "shipped default"
    meta = json.loads((DEFAULT_DIR / "metadata.json").read_text())
    # the shipped policy records how it was made, and that it was made by our trainer
    assert rec.metadata["seed"] == meta["seed"] and "train_config" in rec.metadata
    assert rec.metadata["trainer"] == "sim2real_ros.policy.train"
    assert rec.metadata["sim_success"] >= 0.9
    assert (DEFAULT_DIR / "policy.pt").stat().st_size < 1_000_000
    policy, _ = reg.load(0)
    assert policy.joint_names == ARM.joint_names
    assert [e["event"] for e in reg.events()] == ["add", "promote"]


def test_default_root_follows_the_environment_variable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SIM2REAL_POLICY_REGISTRY", str(tmp_path / "env-reg"))
    reg = PolicyRegistry()
    assert reg.root == tmp_path / "env-reg" and reg.index_path.is_file()


def test_versions_carry_hash_parent_and_metadata(tmp_path: Path) -> None:
    reg = PolicyRegistry(tmp_path, init_from_default=False)
    assert reg.known_good is None
    a = reg.add(_policy(1), {"sim_success": 0.5, "randomization_sha256": "abc"})
    b = reg.add(_policy(2), {"sim_success": 0.9}, parent=a.version)
    assert (a.version, b.version) == (1, 2)
    assert b.parent == 1 and b.metadata["sim_success"] == 0.9 and b.metadata["seed"] == 2
    assert b.sha256 == file_sha256(reg.path_of(2))
    with pytest.raises(ConfigError, match="parent = 7"):
        reg.add(_policy(3), parent=7)
    with pytest.raises(ConfigError, match=r"version = 9: expected one of \[1, 2\]"):
        reg.load(9)
    with pytest.raises(ConfigError, match="registry is empty"):
        reg.load(0)


def test_promote_and_rollback_move_the_known_good_pointer_and_log_why(tmp_path: Path) -> None:
    reg = PolicyRegistry(tmp_path, init_from_default=False)
    for s in (1, 2, 3):
        reg.add(_policy(s))
    reg.promote(1, "first")
    reg.promote(3, "better in sim")
    assert reg.known_good == 3 and reg.known_good_history() == [1, 3]
    rec = reg.rollback("shadow divergence on cell 4")
    assert rec.version == 1 and reg.known_good == 1
    last = reg.events()[-1]
    assert last["event"] == "rollback" and last["previous"] == 3
    assert last["reason"] == "shadow divergence on cell 4"
    with pytest.raises(ConfigError, match="at least two promoted versions"):
        reg.rollback("nothing left")
    assert reg.known_good == 1


def test_tampered_policy_file_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    reg = PolicyRegistry(tmp_path, init_from_default=False)
    rec = reg.add(_policy(1))
    reg.add(_policy(2))
    reg.promote(1)
    path = reg.path_of(2)
    _tamper(path)
    with pytest.raises(PolicyIntegrityError) as err:
        reg.load(2)
    msg = str(err.value)
    assert str(path) in msg and "version 2" in msg and "refusing to load" in msg
    assert reg.record(2).sha256 in msg and file_sha256(path) in msg
    with pytest.raises(PolicyIntegrityError):
        reg.promote(2, "should not happen")
    assert reg.known_good == 1
    assert reg.load(1)[1].sha256 == rec.sha256  # the untouched version still loads


def test_rollback_refuses_a_tampered_previous_version(tmp_path: Path) -> None:
    reg = PolicyRegistry(tmp_path, init_from_default=False)
    reg.add(_policy(1))
    reg.add(_policy(2))
    reg.promote(1)
    reg.promote(2)
    _tamper(reg.path_of(1))
    with pytest.raises(PolicyIntegrityError, match="version 1"):
        reg.rollback("try")
    assert reg.known_good == 2


def test_cli_list_promote_rollback_verify(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "reg")
    reg = PolicyRegistry(root)  # version 1 = shipped default, known-good
    reg.add(_policy(5), {"sim_success": 0.95}, parent=1)
    assert sim2real(["policy", "promote", "2", "--reason", "ok", "--registry", root]) == 0
    assert sim2real(["policy", "list", "--json", "--registry", root]) == 0
    out = capsys.readouterr().out
    listing = json.loads(out[out.index("{"):])
    assert listing["known_good"] == 2
    assert [v["version"] for v in listing["versions"]] == [1, 2]
    assert listing["versions"][1]["parent"] == 1
    assert sim2real(["policy", "rollback", "--reason", "regression", "--registry", root]) == 0
    assert PolicyRegistry(root).known_good == 1
    assert sim2real(["policy", "verify", "--registry", root]) == 0
    _tamper(PolicyRegistry(root).path_of(2))
    assert sim2real(["policy", "verify", "--registry", root]) == 1
    assert "REFUSED" in capsys.readouterr().out
    # a refused promote is a config error: exit 2 with one line naming the file
    assert sim2real(["policy", "promote", "2", "--registry", root]) == 2
    assert "sha256" in capsys.readouterr().err

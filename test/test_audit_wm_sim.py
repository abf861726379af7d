"""The world-model check on real pieces: a SimCore bag, a calibration, a registry policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sim2real_ros.audit.sources import world_model_check
from sim2real_ros.audit.worldmodel import WorldModelConfig
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.model import EnsemblePolicy, ModelSpec, ObsStats
from sim2real_ros.policy.registry import ENV_VAR, PolicyRegistry
from sim2real_ros.policy.task import TaskConfig, resolve_rate_limits
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sim.core import SimCore
from sim2real_ros.sysid.bags import BagWriter, joint_state_msg, multiarray_msg, unit_metadata

HOME = np.array([0.0, -0.5, 1.2, 0.0, 1.0, 0.0])


def record_sim_bag(path: Path, seconds: float = 10.0) -> Path:
    """Drive the simulated arm with a multi-sine about HOME and record it as the recorder would."""
    rng = np.random.default_rng(0)
    freqs = rng.uniform(0.1, 1.0, (3, 6))
    phases = rng.uniform(0, 2 * np.pi, (3, 6))
    core = SimCore(seed=0, q0=HOME)
    obs = core.reset(q0=HOME)
    names = core.joint_names
    t0 = 1_000_000_000
    try:
        with BagWriter(path, unit_metadata("arm-SIM")) as w:
            w.add_topic("/joint_states", "sensor_msgs/msg/JointState")
            w.add_topic("/forward_position_controller/commands",
                        "std_msgs/msg/Float64MultiArray")
            for k in range(int(seconds * 100)):
                t = t0 + k * 10_000_000
                w.write_msg("/joint_states", t, joint_state_msg(names, t, obs.q, obs.qd))
                target = HOME + 0.1 * np.sin(2 * np.pi * freqs * k * 0.01 + phases).sum(0)
                core.command("position", target)
                w.write_msg("/forward_position_controller/commands", t + 100_000,
                            multiarray_msg(target))
                obs = core.advance(0.01)
    finally:
        core.close()
    return path


@pytest.mark.slow
def test_world_model_check_runs_the_registry_policy_in_the_calibrated_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    bag = record_sim_bag(tmp_path / "run1")
    task = resolve_rate_limits(TaskConfig(), load_arm(default_urdf()))
    names = ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint",
             "wrist_2_joint", "wrist_3_joint"]
    spec = ModelSpec(obs_dim=task.obs_dim(6), act_dim=6, hidden=(16,), members=2)
    stats = ObsStats(np.zeros(spec.obs_dim), np.ones(spec.obs_dim), 1)
    registry = PolicyRegistry(tmp_path / "registry", init_from_default=False)
    rec = registry.add(EnsemblePolicy(spec, stats, task.to_dict(), names, seed=3))
    registry.promote(rec.version, "test")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "registry"))
    cal = tmp_path / "arm-SIM.yaml"
    cal.write_text("nominal: {mass_scale: 1.0}\n")
    summary, details = world_model_check(
        [str(bag)], [str(cal)], n_starts=3, horizon=20, threshold_rad=0.05,
        config=WorldModelConfig(epochs=40, members=3))
    assert summary.n_states == 60
    assert 0.0 <= summary.flagged_fraction <= 1.0
    assert summary.max_divergence_rad >= summary.mean_divergence_rad >= 0.0
    assert f"policy v{rec.version}" in summary.source and "calibrated by" in summary.source
    assert len(details["final_divergence_per_start"]) == 3
    assert all(f["reasons"] for f in details["flagged"])
    assert len(details["fit_heldout_rms"]) == 12

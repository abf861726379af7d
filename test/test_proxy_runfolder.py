"""Sealed, resumable stages: a changed artifact is never silently reused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.task import TaskConfig
from sim2real_ros.proxy.experiment import ExperimentConfig, check_resume, run_info
from sim2real_ros.proxy.realtime import WallClockSync
from sim2real_ros.proxy.runfolder import ArtifactError, RunFolder
from sim2real_ros.proxy.scoring import EpisodeScorer, episode_targets, summarize
from sim2real_ros.proxy.trajectory import TrajectoryFollower
from sim2real_ros.robot.model import load_arm

ARM = load_arm(default_urdf())


def sealed_run(tmp_path: Path) -> RunFolder:
    run = RunFolder(tmp_path / "run")
    run.create({"format": "test"})
    a = run.begin("a")
    (a / "policy.pt").write_bytes(b"weights" * 100)
    (a / "sub").mkdir()
    (a / "sub" / "eval.json").write_text('{"success": 0.9}')
    run.seal("a", [], {"note": "first"})
    b = run.begin("b")
    (b / "calibration.yaml").write_text("mass_scale: 1.1\n")
    run.seal("b", ["a"])
    return run


def test_sealed_stage_verifies_and_lists_its_artifacts(tmp_path: Path) -> None:
    run = sealed_run(tmp_path)
    rec = run.verify("a")
    assert set(rec.files) == {"policy.pt", "sub/eval.json"}
    assert rec.meta == {"note": "first"}
    assert run.artifact("b", "calibration.yaml").read_text() == "mass_scale: 1.1\n"


def test_corrupted_artifact_is_refused_naming_the_file(tmp_path: Path) -> None:
    run = sealed_run(tmp_path)
    f = run.stage_dir("a") / "sub" / "eval.json"
    f.write_text('{"success": 1.0}')
    with pytest.raises(ArtifactError) as info:
        run.verify("a")
    msg = str(info.value)
    assert str(f) in msg and "sha256" in msg and "modified or corrupted" in msg
    with pytest.raises(ArtifactError, match="eval.json"):
        run.artifact("a", "policy.pt")  # any use of the stage re-verifies all of it


def test_missing_artifact_and_recomputed_upstream_are_refused(tmp_path: Path) -> None:
    run = sealed_run(tmp_path)
    (run.stage_dir("a") / "policy.pt").unlink()
    with pytest.raises(ArtifactError, match=r"policy.pt: <file> = 'missing'"):
        run.verify("a")
    run = sealed_run(tmp_path / "second")
    # Stage a recomputed (different content, resealed): b was computed from the old a.
    import shutil

    shutil.rmtree(run.stage_dir("a"))
    a = run.begin("a")
    (a / "policy.pt").write_bytes(b"other weights")
    run.seal("a", [])
    with pytest.raises(ArtifactError, match=r"stage b was computed from that a"):
        run.verify("b")


def test_interrupted_stage_is_cleared_and_a_sealed_one_is_never_reopened(tmp_path: Path) -> None:
    run = sealed_run(tmp_path)
    c = run.begin("c")
    (c / "half_written.bin").write_bytes(b"x")
    assert not run.is_sealed("c")
    c = run.begin("c")
    assert list(c.iterdir()) == []
    with pytest.raises(ConfigError, match="already finished"):
        run.begin("a")


def test_new_run_refuses_an_existing_folder(tmp_path: Path) -> None:
    run = sealed_run(tmp_path)
    with pytest.raises(ConfigError, match="--resume"):
        RunFolder(run.root).create({"format": "test"})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        RunFolder(tmp_path / "other").create({})


def test_resume_refuses_a_different_configuration(tmp_path: Path) -> None:
    cfg = ExperimentConfig.quick()
    run = RunFolder(tmp_path / "run")
    run.create(run_info(cfg, quick=True))
    check_resume(run, cfg, quick=True)
    with pytest.raises(ConfigError, match=r"config.proxy_episodes = 6: expected 9"):
        check_resume(run, cfg.with_overrides(["proxy_episodes=9"]), quick=True)
    with pytest.raises(ConfigError, match="--quick"):
        check_resume(run, cfg, quick=False)
    with pytest.raises(ConfigError, match="an existing run to resume"):
        check_resume(RunFolder(tmp_path / "none"), cfg, quick=True)


def test_config_overrides_are_typed_and_checked() -> None:
    cfg = ExperimentConfig().with_overrides(["seed=3", "excitation_s=12.5"])
    assert cfg.seed == 3 and cfg.excitation_s == 12.5
    with pytest.raises(ConfigError, match="sysid_runs = 2: expected an integer >= 3"):
        ExperimentConfig().with_overrides(["sysid_runs=2"])
    with pytest.raises(ConfigError, match="key=value with key one of"):
        ExperimentConfig().with_overrides(["episodes=3"])
    with pytest.raises(ConfigError, match="proxy_episodes = 'many': expected a int"):
        ExperimentConfig().with_overrides(["proxy_episodes=many"])
    cfg = ExperimentConfig().with_overrides(["finetune_anchor_steps=0",
                                             "finetune_fit_space=action"])
    assert cfg.finetune_anchor_steps == 0 and cfg.finetune_fit_space == "action"
    for pair, match in [("finetune_anchor_steps=-5", "finetune_anchor_steps = -5"),
                        ("finetune_anchor_weight=-1", "finetune_anchor_weight = -1.0"),
                        ("finetune_anchor_weight=nan", "finetune_anchor_weight = nan"),
                        ("finetune_fit_space=torque", "finetune_fit_space = 'torque'")]:
        with pytest.raises(ConfigError, match=match):
            ExperimentConfig().with_overrides([pair])


def test_scorer_applies_the_task_success_rule_and_tracking_error() -> None:
    task = TaskConfig()
    q_goal = np.array(task.home_rad)
    target = ARM.tool_position(q_goal)
    scorer = EpisodeScorer(ARM, task)
    scorer.start(0, 10.0, target)
    q_far = q_goal + 0.1
    scorer.add_command(q_goal)
    assert not scorer.add_state(10.1, q_far, np.zeros(6))
    # In tolerance but still moving: not yet.
    assert not scorer.add_state(10.2, q_goal, np.full(6, 2 * task.rest_speed_rad_s))
    assert scorer.add_state(10.3, q_goal, np.zeros(6))
    r = scorer.finish()
    assert r.success and r.time_to_success_s == pytest.approx(0.3)
    assert r.final_distance_m < 1e-9
    assert r.tracking_rms_rad == pytest.approx(np.sqrt(0.01 / 3), rel=1e-9)
    scorer.start(1, 0.0, target)
    scorer.add_state(task.episode_s + 0.01, q_goal, np.zeros(6))  # too late
    late = scorer.finish()
    assert not late.success and scorer.timed_out(task.episode_s)
    s = summarize([r, late])
    assert s.success_rate == 0.5 and s.mean_time_to_success_s == pytest.approx(0.3)


def test_targets_are_seeded_reachable_and_far_enough_apart() -> None:
    task = TaskConfig()
    a = episode_targets(5, 8, task, ARM)
    np.testing.assert_array_equal(a, episode_targets(5, 8, task, ARM))
    assert not np.array_equal(a, episode_targets(6, 8, task, ARM))
    assert np.all(np.linalg.norm(np.diff(a, axis=0), axis=1) >= task.min_distance_m)
    assert np.all(a >= np.array(task.workspace_min_m)) and np.all(
        a <= np.array(task.workspace_max_m))


def test_wall_clock_sync_drops_time_after_a_long_stall() -> None:
    sync = WallClockSync(max_catchup_s=0.1)
    sync.start(wall_now_s=100.0, plant_time_s=0.0)
    assert sync.target(100.05, 0.0) == pytest.approx(0.05)
    assert sync.target(101.0, 0.05) == pytest.approx(0.15)  # 0.9 s stall: only 0.1 made up
    assert sync.overruns == 1 and sync.dropped_s == pytest.approx(0.85)
    assert sync.target(101.01, 0.15) == pytest.approx(0.16)


def test_trajectory_follower_interpolates_from_the_held_setpoint() -> None:
    f = TrajectoryFollower(np.zeros(2))
    f.set_trajectory(1.0, 0.0, np.array([1.0, 2.0]), np.array([[1.0, 2.0], [3.0, 2.0]]))
    np.testing.assert_allclose(f.sample(1.5), [0.5, 1.0])
    np.testing.assert_allclose(f.sample(2.5), [2.0, 2.0])
    np.testing.assert_allclose(f.sample(5.0), [3.0, 2.0])
    assert not f.active
    with pytest.raises(ValueError, match="increasing"):
        f.set_trajectory(5.0, 0.0, np.array([1.0, 1.0]), np.ones((2, 2)))

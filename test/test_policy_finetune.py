"""Last-layer fine-tuning from rosbag2 (MCAP) bags recorded from a shifted simulated cell."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sim2real_ros.cli import main as sim2real
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.finetune import (
    FinetuneError,
    TeacherShift,
    finetune_last_layer,
    load_trajectories,
    record_teacher_bag,
)
from sim2real_ros.policy.registry import PolicyRegistry
from sim2real_ros.policy.task import TaskConfig
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sysid.bags import bag_info

torch.set_num_threads(1)
ARM = load_arm(default_urdf())
# The rehearsal "real" cell: a 1.5 kg tool and a teacher at 60 % speed with a softer gain.
SHIFT = TeacherShift(speed_scale=0.6, k_integral_per_s=6.0, payload_kg=1.5)


@pytest.fixture(scope="module")
def bags(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two bags, 24 trajectories in all, written with the rosbags MCAP writer."""
    root = tmp_path_factory.mktemp("bags")
    return [
        record_teacher_bag(root / "run1", 14, seed=1, shift=SHIFT, steps_per_trajectory=60),
        record_teacher_bag(root / "run2", 10, seed=2, shift=SHIFT, steps_per_trajectory=60),
    ]


def test_recorded_bags_are_rosbag2_mcap_with_the_cell_topics(bags: list[Path]) -> None:
    info = bag_info(bags[0])
    assert (bags[0] / "metadata.yaml").is_file() and list(bags[0].glob("*.mcap"))
    assert info.topics["joint_states"].count == 14 * 60
    assert info.topics["forward_position_controller/commands"].count == 14 * 60
    assert info.topics["task/target"].count == 14
    assert info.topics["task/target"].msgtype == "geometry_msgs/msg/PointStamped"


def test_bags_split_into_one_trajectory_per_target(bags: list[Path]) -> None:
    trajs = load_trajectories(bags, TaskConfig(), ARM)
    assert len(trajs) == 24
    # the first command of the first bag has no predecessor, every other one does
    assert sum(len(t.obs) for t in trajs) == 24 * 60 - 2
    assert all(np.all(np.abs(t.step_rad) <= TaskConfig().max_step_rad + 1e-9) for t in trajs)


def test_finetune_changes_only_the_last_layer_and_cuts_heldout_error(
    bags: list[Path], tmp_path: Path
) -> None:
    reg = PolicyRegistry(tmp_path / "reg")
    parent, _ = reg.load(0)
    trajs = load_trajectories(bags, TaskConfig.from_dict(parent.task, strict=False), ARM)
    child, rep = finetune_last_layer(parent, trajs, heldout_fraction=0.25, seed=0, epochs=200)
    before, after = parent.net.state_dict(), child.net.state_dict()
    last_w, last_b = f"weights.{parent.net.n_layers - 1}", f"biases.{parent.net.n_layers - 1}"
    for name, tensor in before.items():
        if name in (last_w, last_b):
            assert not torch.equal(tensor, after[name]), f"{name} did not change"
        else:
            assert torch.equal(tensor, after[name]), f"{name} changed"
    np.testing.assert_array_equal(child.stats.mean, parent.stats.mean)
    assert rep.n_heldout == 6 and rep.n_train == 18
    # The shipped policy is jerk-limited: its labels are the teacher's action at each recorded
    # state (the recorded steps of the slower rehearsal teacher are not its action), and the
    # last layer moves toward them on held-out trajectories too.
    assert rep.labels == "teacher"
    assert rep.after_rms_rad < 0.97 * rep.before_rms_rad, rep
    assert rep.train_after_rms_rad < rep.train_before_rms_rad


def test_command_labels_are_refused_for_a_jerk_limited_policy(bags: list[Path],
                                                              tmp_path: Path) -> None:
    """Fitting a requested velocity to the step the command took makes the policy request what
    it already does (transfer run 6: the child reached 0 %): refused with the reason."""
    from sim2real_ros.policy.finetune import FinetuneError

    parent, _ = PolicyRegistry(tmp_path / "reg").load(0)
    trajs = load_trajectories(bags, TaskConfig.from_dict(parent.task, strict=False), ARM)
    with pytest.raises(FinetuneError, match="jerk_limited"):
        finetune_last_layer(parent, trajs, labels="commands")
    with pytest.raises(FinetuneError, match="labels"):
        finetune_last_layer(parent, trajs, labels="bogus")


def test_cli_finetune_writes_a_child_version_with_the_report(
    bags: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "reg")
    code = sim2real(["policy", "finetune", *map(str, bags), "--registry", root,
                     "--epochs", "100", "--sim-eval-episodes", "0"])
    assert code == 0
    out = capsys.readouterr().out
    assert "held-out" in out and "before" in out and "after" in out
    reg = PolicyRegistry(root)
    rec = reg.record(2)
    assert rec.parent == 1 and reg.known_good == 1  # not promoted without --promote
    ft = rec.metadata["finetune"]
    assert ft["layers_changed"] == "last" and ft["after_rms_rad"] < ft["before_rms_rad"]
    # The default loss space is the step space: the action space did worse on the proxy
    # (docs/proxy.md, run 12), so it is an option, not the default.
    assert ft["fit_space"] == "step"
    assert len(ft["bag_sha256"]) == 64 and len(ft["bags"]) == 2
    reg.load(2)  # the child loads and verifies


def test_a_bag_at_another_control_rate_is_refused(tmp_path: Path) -> None:
    bag = record_teacher_bag(tmp_path / "slow", 2, seed=0, shift=SHIFT,
                             task=TaskConfig(control_rate_hz=50.0), steps_per_trajectory=10)
    with pytest.raises(FinetuneError, match=r"runs every 20.0 ms.*100 Hz"):
        load_trajectories([bag], TaskConfig(), ARM)


def test_a_bag_without_targets_is_refused_naming_the_topic(bags: list[Path]) -> None:
    from sim2real_ros.sysid.bags import BagError

    with pytest.raises(BagError, match="missing topic 'no/such/target'"):
        load_trajectories(bags[:1], TaskConfig(), ARM, target_topic="no/such/target")


def test_the_action_space_fit_resolves_the_small_near_target_moves(bags: list[Path],
                                                                   tmp_path: Path) -> None:
    """The signed square a|a| makes a 1 % move an action of 0.1 but a 1e-4 step-space error:
    a step-space fit leaves the near-target moves nearly unconstrained (the transfer run 11
    child, docs/proxy.md). Fitting the action, the training space, fits them better."""
    from sim2real_ros.policy.finetune import _action_error, teacher_steps
    from sim2real_ros.policy.task import resolve_rate_limits, step_to_action

    parent, _ = PolicyRegistry(tmp_path / "reg").load(0)
    task = resolve_rate_limits(TaskConfig.from_dict(parent.task, strict=False), ARM)
    trajs = load_trajectories(bags, task, ARM)
    kids = {space: finetune_last_layer(parent, trajs, heldout_fraction=0.25, seed=0,
                                       epochs=200, fit_space=space)
            for space in ("action", "step")}
    rep_a, rep_s = kids["action"][1], kids["step"][1]
    assert rep_a.fit_space == "action" and rep_s.fit_space == "step"
    assert rep_a.after_action_rms < 0.95 * rep_a.before_action_rms, rep_a
    # the small moves: teacher actions under 0.3 on every joint (steps under 9 % of the scale)
    obs = np.concatenate([t.obs for t in trajs])
    steps = np.concatenate(teacher_steps(trajs, task, ARM))
    small = np.all(np.abs(step_to_action(task, steps)) < 0.3, axis=1)
    assert small.sum() > 50
    err = {space: float(np.sqrt(np.mean(_action_error(child, obs[small], steps[small]) ** 2)))
           for space, (child, _) in [*kids.items(), ("parent", (parent, None))]}
    # measured: parent 0.057, step-space child 0.044, action-space child 0.010
    assert err["action"] < 0.8 * err["step"], err
    with pytest.raises(FinetuneError, match="fit_space 'torque'"):
        finetune_last_layer(parent, trajs, fit_space="torque")


def test_rehearsal_on_the_parents_own_sim_states_keeps_its_behaviour_there(
    bags: list[Path], tmp_path: Path
) -> None:
    """A last layer fitted only on the recorded states moves the policy on the states it
    visits itself (the transfer experiment's seed-1 children, docs/proxy.md); rehearsing the
    teacher on the parent's own simulator rollouts holds it there while the recorded states
    are still fitted."""
    from sim2real_ros.policy.env import load_spec
    from sim2real_ros.policy.finetune import sim_anchor

    parent, _ = PolicyRegistry(tmp_path / "reg").load(0)
    trajs = load_trajectories(bags, TaskConfig.from_dict(parent.task, strict=False), ARM)
    ao, aa = sim_anchor(parent, 120, load_spec("default"), seed=3)
    assert ao.shape == (960, parent.spec.obs_dim) and aa.shape == (960, parent.spec.act_dim)
    assert np.all(np.isfinite(ao)) and np.all(np.abs(aa) <= 1.0)
    reps = {w: finetune_last_layer(parent, trajs, heldout_fraction=0.25, seed=0, epochs=200,
                                   anchor=(ao, aa), anchor_weight=w)[1] for w in (0.0, 0.3)}
    free, held = reps[0.0], reps[0.3]
    assert free.n_anchor_samples == held.n_anchor_samples == 960 and held.anchor_weight == 0.3
    assert free.anchor_before_action_rms == pytest.approx(held.anchor_before_action_rms)
    # without rehearsal the sim-state error grows; with it, it stays well below that
    assert free.anchor_after_action_rms > free.anchor_before_action_rms, free
    assert held.anchor_after_action_rms < 0.8 * free.anchor_after_action_rms, (free, held)
    # and the recorded states are still fitted (measured, step error in mrad: free 0.778 ->
    # 0.729, rehearsed 0.778 -> 0.754; anchor action error: free 0.132 -> 0.162, rehearsed
    # 0.083). The two pull against each other: at weight 1 the recorded error no longer falls.
    assert held.after_rms_rad < held.before_rms_rad, held


def test_a_bad_rehearsal_set_or_weight_is_refused(bags: list[Path], tmp_path: Path) -> None:
    from sim2real_ros.policy.finetune import sim_anchor

    parent, _ = PolicyRegistry(tmp_path / "reg").load(0)
    trajs = load_trajectories(bags[:1], TaskConfig.from_dict(parent.task, strict=False), ARM)
    d, a = parent.spec.obs_dim, parent.spec.act_dim
    ok = (np.zeros((10, d)), np.zeros((10, a)))
    for w in (-1.0, float("nan"), float("inf")):
        with pytest.raises(FinetuneError, match="anchor_weight"):
            finetune_last_layer(parent, trajs, anchor=ok, anchor_weight=w, epochs=1)
    bad_obs = np.zeros((10, d))
    bad_obs[3, 0] = np.nan
    cases = {
        "non-finite": (bad_obs, ok[1]),
        "observations of": (np.zeros((10, d + 1)), ok[1]),
        "expected \\(observations": (np.zeros((10, d)), np.zeros((9, a))),
    }
    for match, anchor in cases.items():
        with pytest.raises(FinetuneError, match=match):
            finetune_last_layer(parent, trajs, anchor=anchor, epochs=1)
    with pytest.raises(FinetuneError, match="anchor steps = 0"):
        sim_anchor(parent, 0)


def test_cli_finetune_rehearses_in_the_parents_simulator(
    bags: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "reg")
    code = sim2real(["policy", "finetune", *map(str, bags), "--registry", root, "--epochs", "50",
                     "--sim-eval-episodes", "0", "--anchor-steps", "40", "--anchor-weight", "2"])
    assert code == 0
    assert "rehearsal: 320 samples" in capsys.readouterr().out
    ft = PolicyRegistry(root).record(2).metadata["finetune"]
    assert ft["n_anchor_samples"] == 320 and ft["anchor_weight"] == 2.0
    assert ft["anchor_steps"] == 40 and ft["anchor_source"] == "randomization default"
    with pytest.raises(SystemExit, match="--anchor-steps -1"):
        sim2real(["policy", "finetune", *map(str, bags), "--registry", root,
                  "--anchor-steps", "-1"])

"""Ensemble policy: shapes, normalization, persistence, disagreement and OOD scores, runner."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

torch.set_num_threads(1)  # tiny networks: one thread is fastest and fair to a shared machine

from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.expert import IKExpert
from sim2real_ros.policy.model import EnsemblePolicy, ModelSpec, ObsStats
from sim2real_ros.policy.runner import PolicyRunner
from sim2real_ros.policy.task import (
    TaskConfig,
    action_to_step,
    build_observation,
    resolve_rate_limits,
    sample_configuration,
    sample_reachable_target,
)
from sim2real_ros.robot.model import load_arm

ARM = load_arm(default_urdf())
CFG = resolve_rate_limits(TaskConfig(), ARM)
N = ARM.n_joints


def _task_observations(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """States of the task distribution (without physics) and the expert's labels."""
    rng = np.random.default_rng(seed)
    q = np.array([sample_configuration(rng, CFG, ARM) for _ in range(n)])
    targets = np.array([sample_reachable_target(rng, CFG, ARM)[0] for _ in range(n)])
    qd = rng.normal(0.0, 0.3, size=q.shape)
    cmd = q + rng.normal(0.0, 0.01, size=q.shape)
    tool = np.array([ARM.tool_position(x) for x in q])
    obs = build_observation(CFG, q, qd, targets, tool, cmd)
    return obs, IKExpert(ARM, CFG).act(q, targets)


@pytest.fixture(scope="module")
def fitted() -> tuple[EnsemblePolicy, np.ndarray]:
    """A small ensemble fitted by behaviour cloning on task-distribution states."""
    torch.manual_seed(0)
    obs, act = _task_observations(1500, 0)
    spec = ModelSpec(CFG.obs_dim(N), N, (64, 64), members=5)
    pol = EnsemblePolicy(spec, ObsStats.from_data(obs), CFG.to_dict(), ARM.joint_names, seed=0)
    opt = torch.optim.Adam(pol.net.parameters(), lr=3e-3)
    x = torch.as_tensor(obs)
    y = torch.as_tensor(act, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    for _ in range(400):
        idx = torch.randint(0, len(x), (5, 256), generator=gen)
        loss = torch.mean((pol.members_torch(x[idx]) - y[idx]) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return pol, obs


def test_inference_shapes_for_one_and_many_observations(fitted: tuple) -> None:
    pol, obs = fitted
    one = pol.evaluate(obs[0])
    assert one.action.shape == (1, N) and one.member_actions.shape == (5, 1, N)
    assert one.disagreement_rad.shape == (1,) and one.ood.shape == (1,)
    many = pol.evaluate(obs[:7])
    assert many.action.shape == (7, N) and many.member_actions.shape == (5, 7, N)
    assert np.all(np.abs(many.action) <= 1.0)
    np.testing.assert_allclose(many.action, many.member_actions.mean(axis=0), atol=1e-6)
    d = CFG.obs_dim(N)
    with pytest.raises(ValueError, match=rf"expected observations of shape \(B, {d}\)"):
        pol.evaluate(np.zeros((2, d - 1)))


def test_normalization_uses_saved_statistics_and_clips(fitted: tuple) -> None:
    pol, obs = fitted
    z = pol.normalize(torch.as_tensor(obs)).numpy()
    # the training data come out standardized (up to the clip)
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=0.05)
    varying = pol.stats.std > 1e-3  # wrist_3 never moves in this task: its column is constant
    assert varying.sum() >= 20
    np.testing.assert_allclose(z.std(axis=0)[varying], 1.0, atol=0.02)
    far = obs[:1] + 1e3 * pol.stats.std
    assert float(pol.normalize(torch.as_tensor(far, dtype=torch.float32)).max()) == (
        pytest.approx(pol.spec.obs_clip))


def test_policy_file_round_trip_gives_identical_outputs(fitted: tuple, tmp_path) -> None:
    pol, obs = fitted
    path = pol.save(tmp_path / "p.pt")
    back = EnsemblePolicy.load(path)
    a, b = pol.evaluate(obs[:32]), back.evaluate(obs[:32])
    np.testing.assert_array_equal(a.member_actions, b.member_actions)
    np.testing.assert_array_equal(a.ood, b.ood)
    assert back.joint_names == ARM.joint_names and back.task == pol.task


def test_a_file_that_is_not_a_policy_is_refused(tmp_path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a policy")
    with pytest.raises(ValueError, match="not a readable policy file"):
        EnsemblePolicy.load(bad)


def test_ood_score_is_about_one_in_distribution_and_rises_outside(fitted: tuple) -> None:
    pol, _ = fitted
    fresh, _ = _task_observations(300, 1)  # unseen, same distribution
    inside = pol.evaluate(fresh).ood
    assert 0.7 < float(np.median(inside)) < 1.3
    shifted = fresh.copy()
    shifted[:, :N] += 1.5  # joints far from anywhere the training went
    shifted[:, 12:15] += np.array([1.0, 1.0, 1.0])  # a target 1.7 m away from the box
    outside = pol.evaluate(shifted).ood
    assert float(np.median(outside)) > 3.0 * float(np.median(inside))


def test_disagreement_rises_on_out_of_distribution_observations(fitted: tuple) -> None:
    pol, _ = fitted
    fresh, _ = _task_observations(300, 2)
    inside = pol.evaluate(fresh).disagreement_rad
    shifted = fresh.copy()
    shifted[:, :N] += 1.5
    shifted[:, 6:12] *= 8.0  # joint speeds far above the training's
    shifted[:, 12:15] += 1.0
    outside = pol.evaluate(shifted).disagreement_rad
    assert np.all(inside >= 0.0) and np.all(inside <= CFG.max_step_rad)
    assert float(np.median(outside)) > 2.0 * float(np.median(inside))


def test_untrained_ensemble_members_disagree_more_than_trained_ones(fitted: tuple) -> None:
    pol, _ = fitted
    fresh, _ = _task_observations(200, 3)
    trained = pol.evaluate(fresh)
    # the members agree with each other and with the expert on fresh in-distribution data
    _, labels = _task_observations(200, 3)
    err = np.abs(action_to_step(CFG, trained.action) - action_to_step(CFG, labels))
    assert float(np.median(err)) < 0.2 * CFG.max_step_rad


def test_runner_keeps_the_previous_target_and_bounds_each_step(fitted: tuple) -> None:
    pol, _ = fitted
    runner = PolicyRunner(pol, ARM)
    q = np.array(CFG.home_rad)
    target = ARM.tool_position(q) + np.array([0.05, -0.05, 0.05])
    first = runner.step(q, np.zeros(N), target)
    assert np.all(np.abs(first.joint_target_rad - q) <= CFG.max_step_rad + 1e-12)
    second = runner.step(q, np.zeros(N), target)
    # the target integrates: the second step starts from the first target, not from q
    assert np.all(np.abs(second.joint_target_rad - first.joint_target_rad)
                  <= CFG.max_step_rad + 1e-12)
    np.testing.assert_allclose(second.observation[18:24], first.joint_target_rad - q, atol=1e-6)
    runner.reset()
    third = runner.step(q, np.zeros(N), target)
    np.testing.assert_allclose(third.joint_target_rad, first.joint_target_rad, atol=1e-12)
    with pytest.raises(ValueError, match="expected q, qd of shape"):
        runner.step(q[:5], np.zeros(5), target)


def test_runner_moves_the_executed_command_when_someone_else_drives(fitted: tuple) -> None:
    pol, _ = fitted
    runner = PolicyRunner(pol, ARM)
    q = np.array(CFG.home_rad)
    target = ARM.tool_position(q) + np.array([0.05, -0.05, 0.05])
    first = runner.step(q, np.zeros(N), target)
    # the arm was sent our own target (in flight or passed through): nothing changes
    runner.executed(first.joint_target_rad)
    second = runner.step(q, np.zeros(N), target)
    np.testing.assert_allclose(second.observation[18:24], first.joint_target_rad - q, atol=1e-6)
    assert runner.adopted == 0
    # the baseline holds the arm at q (shadow stage, a fallback): the next step moves q, and
    # the policy sees cmd - q = 0 as in training instead of its own drifting target
    held = q - 0.01
    runner.executed(held)
    third = runner.step(held, np.zeros(N), target)
    np.testing.assert_allclose(third.observation[18:24], 0.0, atol=1e-6)
    assert np.all(np.abs(third.joint_target_rad - held) <= CFG.max_step_rad + 1e-12)
    assert runner.adopted == 1
    # a trim within the tolerance (the filter reshaped ours by 1 mrad, and its
    # echo may come back a step late) is ours: no adoption, our own target continues
    assert runner.own_tolerance_rad == 0.005
    trimmed = third.joint_target_rad + 1e-3
    runner.executed(trimmed)
    kept = runner.step(q, np.zeros(N), target)
    np.testing.assert_allclose(kept.observation[18:24], third.joint_target_rad - q, atol=1e-6)
    assert runner.adopted == 1
    # a clip beyond it (the safety filter held ours back) is adopted like another source
    clipped = kept.joint_target_rad + 0.02
    runner.executed(clipped)
    fourth = runner.step(q, np.zeros(N), target)
    np.testing.assert_allclose(fourth.observation[18:24], clipped - q, atol=1e-6)
    assert runner.adopted == 2
    runner.executed(None)  # none known (stale): back to our own
    fifth = runner.step(q, np.zeros(N), target)
    np.testing.assert_allclose(fifth.observation[18:24], fourth.joint_target_rad - q, atol=1e-6)
    for bad in (q[:5], np.full(N, np.nan)):
        with pytest.raises(ValueError, match="executed command"):
            runner.executed(bad)
    for tol in (-1e-3, 0.2, math.nan):
        with pytest.raises(ValueError, match="own_tolerance_rad"):
            PolicyRunner(pol, ARM, own_tolerance_rad=tol)


def test_runner_refuses_an_arm_with_other_joints(fitted: tuple) -> None:
    pol, _ = fitted
    other = EnsemblePolicy(pol.spec, pol.stats, pol.task, ["a", "b", "c", "d", "e", "f"],
                           net=pol.net)
    with pytest.raises(ValueError, match="trained for joints"):
        PolicyRunner(other, ARM)


def test_numpy_inference_matches_the_torch_module(fitted: tuple) -> None:
    pol, obs = fitted
    with torch.inference_mode():
        t = pol.members_torch(torch.as_tensor(obs[:64])).numpy()
    np.testing.assert_allclose(pol.evaluate(obs[:64]).member_actions, t, atol=2e-6)


def test_running_a_policy_does_not_import_torch(tmp_path) -> None:
    import subprocess
    import sys

    code = ("import sys; from sim2real_ros.policy.registry import PolicyRegistry; "
            "from sim2real_ros.policy.runner import PolicyRunner; "
            "import sim2real_ros.policy.node; "
            f"p, _ = PolicyRegistry({str(tmp_path / 'reg')!r}).load(0); r = PolicyRunner(p); "
            "s = r.step(r.task.home_rad, [0.0] * 6, [0.5, 0.0, 0.4]); "
            "print('torch' in sys.modules, s.joint_target_rad.shape)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "(6,)"]


def test_legacy_torch_archive_policies_still_load(fitted: tuple) -> None:
    import io
    import json

    pol, obs = fitted
    payload = {
        "format": "sim2real_policy/1",
        "spec": json.dumps(pol.spec.to_dict()), "task": json.dumps(pol.task),
        "joint_names": json.dumps(pol.joint_names), "metadata": json.dumps({}),
        "obs_mean": torch.as_tensor(pol.stats.mean), "obs_std": torch.as_tensor(pol.stats.std),
        "obs_count": 1, "state_dict": pol.net.state_dict(),
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    old = EnsemblePolicy.from_bytes(buf.getvalue())
    np.testing.assert_allclose(old.evaluate(obs[:8]).member_actions,
                               pol.evaluate(obs[:8]).member_actions, atol=1e-6)


def test_an_adopted_history_is_clipped_to_the_jerk_limited_interface() -> None:
    # Another source's commands, sampled where they reach the arm, make finite-difference
    # rates the interface never produces; the adopted state keeps the position, clips the rates.
    from pathlib import Path

    import sim2real_ros.policy as policy_pkg
    from sim2real_ros.policy.task import command_rates

    pol = EnsemblePolicy.load(Path(policy_pkg.__file__).parent / "default" / "policy.pt")
    runner = PolicyRunner(pol, ARM)
    task = runner.task
    assert task.jerk_limited
    vmax = np.asarray(task.max_velocity_rad_s)
    amax = np.asarray(task.max_acceleration_rad_s2)
    q = np.array(task.home_rad)
    target = ARM.tool_position(q) + np.array([0.05, -0.05, 0.05])
    runner.step(q, np.zeros(N), target)
    jump = q + 0.01  # a source switch: 10 mrad in one sample is 1 rad/s and 100 rad/s²
    runner.executed(q)
    runner.executed(q)
    runner.executed(jump)
    out = runner.step(q, np.zeros(N), target)
    assert runner.adopted == 1
    obs = out.observation.astype(float)  # float32: compare at its precision
    v, a = obs[24:30], obs[30:36]
    assert np.all(np.abs(v) <= vmax * (1 + 1e-6)) and np.all(np.abs(a) <= amax * (1 + 1e-6))
    np.testing.assert_allclose(obs[18:24], jump - q, atol=1e-6)
    np.testing.assert_allclose(np.abs(a), amax, rtol=1e-6)  # clipped, not zeroed
    # a history within the limits is adopted as it is
    rows = np.stack([q + 2e-4, q + 1e-4, q])
    assert np.all(np.abs(command_rates(task, rows)[N:]) <= amax)
    np.testing.assert_allclose(runner.feasible_history(rows), rows, atol=1e-12)

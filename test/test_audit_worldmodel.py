"""The world model learns a known damped linear system; its disagreement marks unseen states."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.linalg import expm

from sim2real_ros.audit.worldmodel import (
    EnsembleWorldModel,
    Transitions,
    WorldModelConfig,
    consistency_check,
    step_rollout,
    transitions_from_arrays,
    transitions_from_bag,
)

DT_S = 0.01
KP = np.array([100.0, 60.0])  # 1/s^2: servo stiffness per joint
KD = np.array([12.0, 8.0])  # 1/s: servo damping per joint
VEL_RANGE = 3.0  # rad/s covered by the training data (positions cover +-1 rad)


def servo(kp: np.ndarray, kd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact zero-order-hold discretisation of qdd = kp (u - q) - kd qd for two joints."""
    a = np.zeros((4, 4))
    a[:2, 2:] = np.eye(2)
    a[2:, :2] = -np.diag(kp)
    a[2:, 2:] = -np.diag(kd)
    b = np.zeros((4, 2))
    b[2:, :] = np.diag(kp)
    m = np.zeros((6, 6))
    m[:4, :4], m[:4, 4:] = a, b
    e = expm(m * DT_S)
    return e[:4, :4], e[:4, 4:]


AD, BD = servo(KP, KD)


def true_step(s: np.ndarray, u: np.ndarray) -> np.ndarray:
    return AD @ s + BD @ u


def sample_states(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    return np.hstack([rng.uniform(-1, 1, (n, 2)), rng.uniform(-VEL_RANGE, VEL_RANGE, (n, 2))]
                     ) * scale


@pytest.fixture(scope="module")
def model() -> EnsembleWorldModel:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    s = sample_states(rng, 2000)
    u = rng.uniform(-1, 1, (2000, 2))
    return EnsembleWorldModel.fit(Transitions(s, u, s @ AD.T + u @ BD.T),
                                  WorldModelConfig(epochs=100, seed=0))


class StepTo:
    """Command a fixed joint goal (a step response of the servo)."""

    def __init__(self, goal: np.ndarray) -> None:
        self.goal = goal
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def __call__(self, s: np.ndarray) -> np.ndarray:
        return self.goal


def test_learns_the_damped_linear_system_to_two_percent(model: EnsembleWorldModel) -> None:
    rng = np.random.default_rng(1)
    s = sample_states(rng, 1000)
    u = rng.uniform(-1, 1, (1000, 2))
    true_next = s @ AD.T + u @ BD.T
    pred, _ = model.predict(s, u)
    rms = np.sqrt(np.mean((pred - true_next) ** 2, axis=0))
    change_std = (true_next - s).std(axis=0)
    # Stated accuracy: one-step RMS error below 2% of the per-step change, every dimension.
    assert np.all(rms < 0.02 * change_std), rms / change_std
    assert model.fit_report is not None
    assert np.all(model.fit_report.heldout_rms < 0.02 * change_std)


def test_disagreement_flags_states_outside_its_data(model: EnsembleWorldModel) -> None:
    rng = np.random.default_rng(2)
    inside = sample_states(rng, 500)
    u = rng.uniform(-1, 1, (500, 2))
    far = sample_states(rng, 500, scale=4.0)
    assert model.outside_data(inside, u).mean() <= 0.02
    assert model.outside_data(far, u).mean() >= 0.90
    assert np.median(model.disagreement(far, u)) > 3 * np.median(model.disagreement(inside, u))


def test_rollouts_agree_with_the_true_system_and_flag_a_wrong_simulator(
    model: EnsembleWorldModel,
) -> None:
    rng = np.random.default_rng(3)
    starts = np.hstack([rng.uniform(-0.6, 0.6, (6, 2)), np.zeros((6, 2))])
    policies = [StepTo(s0[:2] + rng.uniform(-0.3, 0.3, 2)) for s0 in starts]
    # 0.6 s step responses: the world model stays within 0.02 rad of the true system.
    good = consistency_check(step_rollout(true_step), model, policies, starts, 60, 0.02,
                             compare_dims=[0, 1])
    assert good.n_states == 360
    assert good.flagged == []
    assert good.divergence.max() < 0.02
    assert all(p.resets == 2 for p in policies)  # once for the sim, once for the model
    # A "calibrated" simulator whose servo is half as stiff as the data's is caught.
    soft_ad, soft_bd = servo(KP / 2, KD)
    bad = consistency_check(step_rollout(lambda s, u: soft_ad @ s + soft_bd @ u), model,
                            policies, starts, 60, 0.02, compare_dims=[0, 1])
    assert bad.flagged_fraction() >= 0.4
    assert all(f.reasons == ["rollouts diverged"] for f in bad.flagged)
    summary = bad.summary("test")
    assert summary.flagged_fraction == bad.flagged_fraction()
    assert summary.max_divergence_rad > 0.05


def test_starts_outside_the_data_are_flagged_as_such(model: EnsembleWorldModel) -> None:
    starts = np.array([[3.5, -3.5, 0.0, 0.0]])
    report = consistency_check(step_rollout(true_step), model, StepTo(np.array([3.5, -3.5])),
                               starts, 20, 10.0, compare_dims=[0, 1])
    assert report.flagged
    assert all("outside the world model's data" in f.reasons for f in report.flagged)


def test_fit_is_seeded_and_save_load_round_trips(model: EnsembleWorldModel,
                                                 tmp_path: Path) -> None:
    path = model.save(tmp_path / "wm.pt")
    again = EnsembleWorldModel.load(path)
    s = sample_states(np.random.default_rng(4), 50)
    u = np.zeros((50, 2))
    np.testing.assert_array_equal(model.members(s, u), again.members(s, u))
    assert again.ood_threshold == model.ood_threshold
    small = Transitions(s, u, s @ AD.T)
    cfg = WorldModelConfig(epochs=2, members=2, seed=7)
    a = EnsembleWorldModel.fit(small, cfg).members(s, u)
    b = EnsembleWorldModel.fit(small, cfg).members(s, u)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="sim2real_worldmodel"):
        (tmp_path / "junk.pt").write_bytes(b"")
        torch.save({"format": "other"}, tmp_path / "junk.pt")
        EnsembleWorldModel.load(tmp_path / "junk.pt")


def test_bad_transitions_are_refused() -> None:
    with pytest.raises(ValueError, match="one N"):
        Transitions(np.zeros((3, 4)), np.zeros((2, 2)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="non-finite"):
        Transitions(np.full((3, 4), np.nan), np.zeros((3, 2)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match=">= 2 members"):
        WorldModelConfig(members=1)


def test_transitions_resample_streams_on_the_control_grid() -> None:
    t_state = np.arange(0, 1.0, 0.002)  # 500 Hz states
    state = np.column_stack([t_state, -t_state])
    t_cmd = np.arange(0.0005, 1.0, 0.01)  # 100 Hz commands
    cmd = np.column_stack([t_cmd * 10])
    tr = transitions_from_arrays(t_state, state, t_cmd, cmd, 0.01)
    np.testing.assert_allclose(tr.next_state[:, 0] - tr.state[:, 0], 0.01, atol=1e-9)
    # Each action is the newest command at or before the state's grid time.
    # (state samples every 2 ms: the state is at most 2 ms older than the grid time).
    assert np.all(tr.action[:, 0] / 10 <= tr.state[:, 0] + 0.002 + 1e-9)
    assert np.all(tr.state[:, 0] - tr.action[:, 0] / 10 < 0.01)


def test_transitions_from_a_real_bag(tmp_path: Path) -> None:
    from sim2real_ros.sysid.bags import (
        BagWriter,
        joint_state_msg,
        multiarray_msg,
        unit_metadata,
    )

    names = ["j1", "j2"]
    bag = tmp_path / "run1"
    s = np.array([0.2, -0.1, 0.0, 0.0])
    goal = np.array([0.5, 0.3])
    states, actions = [], []
    with BagWriter(bag, unit_metadata("arm-TEST")) as w:
        w.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        w.add_topic("/forward_position_controller/commands", "std_msgs/msg/Float64MultiArray")
        for k in range(200):
            t_ns = 1_000_000_000 + k * 10_000_000
            w.write_msg("/joint_states", t_ns, joint_state_msg(names, t_ns, s[:2], s[2:]))
            u = s[:2] + np.clip(goal - s[:2], -0.02, 0.02)
            w.write_msg("/forward_position_controller/commands", t_ns + 1000, multiarray_msg(u))
            states.append(s)
            actions.append(u)
            s = true_step(s, u)
    tr = transitions_from_bag(bag, names, DT_S)
    assert len(tr) >= 190
    # Every transition is one step of the recorded system.
    np.testing.assert_allclose(tr.next_state, tr.state @ AD.T + tr.action @ BD.T, atol=1e-9)


def test_one_step_disagreement_points_at_the_states_where_dynamics_differ(
    model: EnsembleWorldModel,
) -> None:
    rng = np.random.default_rng(5)
    starts = np.hstack([rng.uniform(-0.6, 0.6, (4, 2)), np.zeros((4, 2))])
    policies = [StepTo(s0[:2] + rng.uniform(-0.3, 0.3, 2)) for s0 in starts]
    kwargs = {"compare_dims": [2, 3], "one_step_threshold": 0.05}  # rad/s, velocities
    good = consistency_check(step_rollout(true_step), model, policies, starts, 40, 10.0,
                             **kwargs)
    assert good.flagged == []
    soft_ad, soft_bd = servo(KP / 2, KD)
    bad = consistency_check(step_rollout(lambda s, u: soft_ad @ s + soft_bd @ u), model,
                            policies, starts, 40, 10.0, **kwargs)
    hits = [f for f in bad.flagged if "one-step disagreement" in f.reasons]
    assert hits
    # The flagged states are in the transient, where the servo's stiffness acts, not at rest.
    assert min(f.step for f in hits) < 10
    assert all(np.abs(f.state[2:]).max() > 0.05 or f.step < 3 for f in hits)

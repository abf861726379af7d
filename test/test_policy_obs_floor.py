"""Per-column observation std floor: shapes, values from the real-unit tolerances, OOD effect."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.policy.model import ObsStats
from sim2real_ros.policy.obs_floor import (
    COMMAND_RATE_FLOOR_FRACTION,
    SensorTolerance,
    observation_column_kinds,
    observation_std_floor,
)
from sim2real_ros.policy.task import (
    TaskConfig,
    advance_command,
    build_observation,
    initial_history,
    resolve_rate_limits,
    sample_configuration,
    sample_reachable_target,
)
from sim2real_ros.robot.model import load_arm

ARM = load_arm(default_urdf())
CFG = resolve_rate_limits(TaskConfig(), ARM)
N = ARM.n_joints
OOD_ENTER = 3.0  # config/sim2real.yaml safety_filter.ood_enter
WRIST_3 = N - 1


def _columns(kind: str, cfg: TaskConfig = CFG) -> np.ndarray:
    return np.flatnonzero(np.array(observation_column_kinds(cfg, N)) == kind)


@pytest.mark.parametrize("cfg", [
    CFG,
    TaskConfig(action_interface="step"),
    replace(CFG, include_wrench=True),
])
def test_floor_has_one_positive_entry_per_observation_column(cfg: TaskConfig) -> None:
    floor = observation_std_floor(cfg, N)
    assert floor.shape == (cfg.obs_dim(N),)
    assert len(observation_column_kinds(cfg, N)) == cfg.obs_dim(N)
    assert np.all(np.isfinite(floor)) and np.all(floor > 0)


def test_default_tolerances_are_the_shipped_randomization_spec() -> None:
    assert SensorTolerance.from_randomization() == SensorTolerance()
    shipped = SensorTolerance.from_randomization(share_path("config", "randomization.yaml"))
    assert shipped.position_bias_rad == pytest.approx(0.002)
    assert shipped.velocity_noise_rad_s == pytest.approx(0.01)


def test_floor_values_follow_sensor_and_command_limits() -> None:
    floor = observation_std_floor(CFG, N)
    tol = SensorTolerance()
    # encoder error: bias dominates, a few mrad
    np.testing.assert_allclose(floor[_columns("q")], tol.position_rad)
    assert 0.002 <= tol.position_rad < 0.005
    np.testing.assert_allclose(floor[_columns("qd")], tol.velocity_rad_s)
    assert np.all(floor[_columns("cmd_minus_q")] > floor[_columns("q")])
    np.testing.assert_allclose(floor[_columns("target")], CFG.tolerance_m)
    v = np.asarray(CFG.max_velocity_rad_s)
    np.testing.assert_allclose(floor[_columns("cmd_velocity")], COMMAND_RATE_FLOOR_FRACTION * v)
    # the acceleration floor is what one period of the generator reaches for that request
    hist = advance_command(CFG, ARM, initial_history(np.array(CFG.home_rad)),
                           np.array(CFG.home_rad), np.full(N, 0.1))
    acc = (hist[0] - 2 * hist[1] + hist[2]) / CFG.dt_s**2
    np.testing.assert_allclose(floor[_columns("cmd_acceleration")], acc, rtol=1e-6)


def test_floor_rejects_unresolved_limits_and_zero_tolerances() -> None:
    with pytest.raises(ValueError, match="resolve_rate_limits"):
        observation_std_floor(TaskConfig(), N)
    zero = SensorTolerance(**{k: 0.0 for k in SensorTolerance.__dataclass_fields__})
    with pytest.raises(ValueError, match=r"column 0 \(q\)"):
        observation_std_floor(CFG, N, zero)
    with pytest.raises(ValueError, match="std floor"):
        ObsStats.from_data(np.zeros((4, 3)), floor=np.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="std floor"):
        ObsStats.from_data(np.zeros((4, 3)), floor=np.ones(2))


def _training_observations(n: int, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Task-distribution states where wrist_3 never moves (its spread is 0), as in training."""
    rng = np.random.default_rng(seed)
    q = np.array([sample_configuration(rng, CFG, ARM) for _ in range(n)])
    targets = np.array([sample_reachable_target(rng, CFG, ARM)[0] for _ in range(n)])
    moving = np.ones(N)
    moving[WRIST_3] = 0.0
    qd = rng.normal(0.0, 0.3, size=q.shape) * moving
    cmd = q + rng.normal(0.0, 0.01, size=q.shape) * moving
    step1 = rng.normal(0.0, 0.01, size=q.shape) * moving
    step2 = rng.normal(0.0, 0.01, size=q.shape) * moving
    history = np.stack([cmd, cmd - step1, cmd - step1 - step2], axis=-2)
    tool = np.array([ARM.tool_position(x) for x in q])
    obs = build_observation(CFG, q, qd, targets, tool, cmd, history=history)
    return obs, {"q": q, "qd": qd, "target": targets, "cmd": cmd}


@pytest.fixture(scope="module")
def training() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    return _training_observations(800, 0)


def test_constant_training_column_gets_the_floor_not_1e_3(training: tuple) -> None:
    obs, _ = training
    floor = observation_std_floor(CFG, N)
    old = ObsStats.from_data(obs)
    new = ObsStats.from_data(obs, floor=floor)
    constant = np.flatnonzero(obs.std(axis=0) < 1e-9)
    # wrist_3's q, qd, cmd - q, cmd velocity and cmd acceleration never vary
    assert len(constant) == 5
    np.testing.assert_allclose(old.std[constant], 1e-3)
    np.testing.assert_allclose(new.std[constant], floor[constant])
    # columns that do vary keep their measured std (it is far above the floor)
    varying = np.setdiff1d(np.arange(obs.shape[1]), constant)
    np.testing.assert_allclose(new.std[varying], obs.astype(np.float64).std(axis=0)[varying])


def _biased_observation(state: dict[str, np.ndarray], i: int, bias_rad: float) -> np.ndarray:
    """Row i seen through encoders biased by `bias_rad` on every joint, with the small wrist_3
    correction (1 % of its velocity limit requested from rest) a policy answers that with."""
    q_meas = state["q"][i] + bias_rad
    cmd = state["cmd"][i].copy()
    rest = initial_history(cmd)
    action = np.zeros(N)
    action[WRIST_3] = 0.1
    wrist = advance_command(CFG, ARM, rest, state["q"][i], action)
    hist = rest.copy()
    hist[:, WRIST_3] = wrist[:, WRIST_3]
    tool = ARM.tool_position(q_meas)
    return build_observation(CFG, q_meas, state["qd"][i], state["target"][i], tool, hist[0],
                             history=hist)


def test_few_mrad_encoder_bias_on_a_constant_column_stays_in_distribution(
    training: tuple,
) -> None:
    obs, state = training
    old = ObsStats.from_data(obs)
    new = ObsStats.from_data(obs, floor=observation_std_floor(CFG, N))
    rows = np.stack([_biased_observation(state, i, 0.004) for i in range(50)])
    assert float(np.max(new.ood_score(rows))) < OOD_ENTER
    # the flat 1e-3 floor sends the same observations far past the filter's threshold
    assert float(np.min(old.ood_score(rows))) > 10 * OOD_ENTER


def test_far_out_observation_still_scores_large(training: tuple) -> None:
    obs, state = training
    new = ObsStats.from_data(obs, floor=observation_std_floor(CFG, N))
    assert float(np.median(new.ood_score(obs))) < 1.5
    far = obs[:20].copy()
    # a target 1.5 m outside the workspace and a wrist_3 0.5 rad from where it always sat
    far[:, _columns("target")] += 1.5
    far[:, _columns("q")[WRIST_3]] += 0.5
    assert float(np.min(new.ood_score(far))) > 10 * OOD_ENTER
    # one constant column far off (a 0.2 rad wrist_3 encoder fault) alone crosses it
    fault = obs[:20].copy()
    fault[:, _columns("q")[WRIST_3]] += 0.2
    assert float(np.min(new.ood_score(fault))) > OOD_ENTER

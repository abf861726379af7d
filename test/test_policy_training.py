"""Training in the randomized simulator: a short real run beats an untrained policy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from sim2real_ros.config import ConfigError
from sim2real_ros.policy.env import ReachingVecEnv, load_spec
from sim2real_ros.policy.model import EnsemblePolicy, ModelSpec
from sim2real_ros.policy.registry import PolicyRegistry
from sim2real_ros.policy.task import TaskConfig
from sim2real_ros.policy.train import TrainConfig, evaluate_in_sim, train, write_run

torch.set_num_threads(1)
EVAL_EPISODES = 16
SEED = 1


@pytest.fixture(scope="module")
def short_run() -> object:
    """6 BC/DAgger iterations of 16 randomized environments x 150 steps (14,400 env steps).

    The jerk-limited action interface needs more data than the old per-step target move:
    5 x 8 x 80 steps reached 0.375 (the step interface: above 0.6), 6 x 16 x 150 reach 0.94.
    """
    cfg = TrainConfig(n_envs=16, dagger_iterations=6, steps_per_iteration=150,
                      grad_steps_per_iteration=400, hidden=(128, 128), members=3,
                      eval_episodes=EVAL_EPISODES, iteration_eval_episodes=0, seed=SEED)
    return train(cfg, progress=False)


@pytest.mark.slow
def test_short_training_run_succeeds_far_more_often_than_an_untrained_policy(
    short_run: object,
) -> None:
    res = short_run
    task = TaskConfig.from_dict(res.policy.task)
    untrained = EnsemblePolicy(res.policy.spec, res.policy.stats, task.to_dict(),
                               res.policy.joint_names, seed=99)
    # The trainer's own evaluation ran EVAL_EPISODES fresh episodes from this seed; the
    # untrained policy gets the first 8 of the very same episodes (an untrained episode
    # always runs to the time limit, so 8 keep the test short).
    base = evaluate_in_sim(untrained, 8, task, load_spec("default"),
                           seed=SEED + 1_000_003).success_rate
    trained = res.sim_success
    assert trained >= base + 0.5, (base, trained)
    assert trained >= 0.6, trained
    assert res.policy.metadata["sim_success"] == trained


def test_training_logs_return_and_success_every_iteration_and_records_its_config(
    short_run: object, tmp_path: Path,
) -> None:
    res = short_run
    assert [h.iteration for h in res.history] == [0, 1, 2, 3, 4, 5]
    assert [h.phase for h in res.history] == ["bc"] + ["dagger"] * 5
    assert all(h.episodes > 0 and math.isfinite(h.mean_return) for h in res.history)
    assert res.history[1].beta == 0.5 and res.history[-1].env_steps == 6 * 16 * 150
    meta = res.policy.metadata
    assert meta["seed"] == SEED and meta["train_config"]["dagger_iterations"] == 6
    assert meta["randomization_sha256"] == load_spec("default").sha256
    paths = write_run(res, tmp_path / "run")
    png = paths["curve"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert len(json.loads(paths["history"].read_text())) == 6
    reg = PolicyRegistry(tmp_path / "reg", init_from_default=False)
    rec = reg.add(res.policy)
    assert reg.record(rec.version).metadata["sim_success"] == res.sim_success


def test_vectorized_env_is_seeded() -> None:
    def rollout(seed: int) -> np.ndarray:
        env = ReachingVecEnv(2, TaskConfig(), load_spec("default"), seed=seed)
        try:
            obs = [env.reset()]
            for _ in range(15):
                obs.append(env.step(env.expert_actions()).obs)
        finally:
            env.close()
        return np.array(obs)

    a, b, c = rollout(4), rollout(4), rollout(5)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_ppo_iterations_update_the_imitation_policy_and_log_their_phase() -> None:
    common = dict(n_envs=4, dagger_iterations=1, steps_per_iteration=40,
                  grad_steps_per_iteration=50, hidden=(32, 32), members=2, eval_episodes=0,
                  iteration_eval_episodes=0, seed=3)
    bc = train(TrainConfig(algo="dagger", **common), progress=False)
    res = train(TrainConfig(algo="dagger+ppo", ppo_iterations=2, ppo_steps=40,
                            ppo_minibatch=64, ppo_epochs=2,
                            **{**common, "iteration_eval_episodes": 2}), progress=False)
    assert [h.phase for h in res.history] == ["bc", "ppo", "ppo"]
    assert res.history[0].loss == bc.history[0].loss  # same seed, same imitation phase
    assert all(math.isfinite(h.loss) and math.isfinite(h.mean_return) for h in res.history
               if h.episodes)
    # the learner alone is evaluated after every iteration on the same fresh episodes
    assert all(0.0 <= h.eval_success <= 1.0 and math.isfinite(h.eval_return)
               for h in res.history)

    def flat(p: EnsemblePolicy) -> torch.Tensor:
        return torch.cat([t.detach().flatten() for t in p.net.parameters()])

    # same seed, same imitation phase: what differs is what PPO changed
    assert torch.isfinite(flat(res.policy)).all()
    assert not torch.allclose(flat(res.policy), flat(bc.policy))


def test_bad_training_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match="algo = 'sac'"):
        TrainConfig(algo="sac").validate()
    with pytest.raises(ConfigError, match="ppo_iterations"):
        TrainConfig(algo="ppo", ppo_iterations=0).validate()


def test_model_spec_round_trips() -> None:
    spec = ModelSpec(24, 6, (32, 16), 4, 6.0)
    assert ModelSpec.from_dict(spec.to_dict()) == spec


def test_a_calibration_file_trains_in_the_calibrated_simulator(tmp_path: Path) -> None:
    import yaml

    from sim2real_ros.policy.env import load_simulator

    cal = tmp_path / "SN-T.yaml"
    cal.write_text(yaml.safe_dump({
        "nominal": {"payload_kg": 3.0, "mass_scale": 1.2},
        "randomization": {"version": 1, "terms": {}},
    }))
    spec, nominal = load_simulator(str(cal))
    assert nominal is not None and nominal.payload_kg == 3.0 and nominal.mass_scale == 1.2
    assert load_simulator("default")[1] is None and load_simulator("none")[1] is None

    def holding_effort(calibration: object) -> np.ndarray:
        env = ReachingVecEnv(1, TaskConfig(), spec, seed=2, calibration=calibration)
        try:
            assert env.cores[0].nominal.plant.payload_kg == (3.0 if calibration else 0.0)
            env.reset()
            for _ in range(30):
                env.step(np.zeros((1, env.act_dim)))
            return env.cores[0].plant.state().tau_nm
        finally:
            env.close()

    # the heavier calibrated arm needs visibly more torque to hold the same pose
    calibrated, plain = holding_effort(nominal), holding_effort(None)
    assert np.abs(calibrated[1]) > 1.2 * np.abs(plain[1])
    res = train(TrainConfig(n_envs=2, dagger_iterations=1, steps_per_iteration=20,
                            grad_steps_per_iteration=5, hidden=(16, 16), members=2,
                            eval_episodes=0, iteration_eval_episodes=0, seed=5,
                            randomization=str(cal)), progress=False)
    assert res.policy.metadata["calibrated_nominal"]["payload_kg"] == 3.0

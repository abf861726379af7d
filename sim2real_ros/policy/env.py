"""A vectorized reaching environment over several simulator instances, without ROS.

Each instance is a `SimCore` (PyBullet plant + domain randomization + actuator, latency and
sensor models) with its own seeded stream: the same seed gives the same episodes, draws and
noise. Success and reward are judged on the plant's true state; the policy and the expert see
only the simulated (delayed, noisy, possibly dropped) observation, as on the real cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.policy.expert import IKExpert
from sim2real_ros.policy.kinematics import BatchKinematics
from sim2real_ros.policy.task import (
    TaskConfig,
    advance_command,
    build_observation,
    initial_history,
    is_success,
    resolve_rate_limits,
    reward,
    sample_episode,
)
from sim2real_ros.robot.model import ArmModel


def load_spec(randomization: str | Path | None) -> Any:
    """Return a RandomizationSpec: None/'default' = config/randomization.yaml, 'none' = off.

    """
    from sim2real_ros.sim.randomization import RandomizationSpec

    if randomization is not None and str(randomization) == "none":
        return RandomizationSpec.disabled()
    if randomization is None or str(randomization) == "default":
        from sim2real_ros.paths import share_path

        return RandomizationSpec.from_yaml(share_path("config", "randomization.yaml"))
    return RandomizationSpec.from_yaml(randomization)


def load_simulator(randomization: str | Path | None) -> tuple[Any, Any]:
    """Return (RandomizationSpec, nominal PlantParams or None) for a training simulator.

    `randomization` is as for `load_spec`, or a calibration file written by
    `sim2real sysid fit` (it has a `nominal:` section): then the simulator is the calibrated
    one, its plant at the fitted nominal values and its ranges from the file's
    `randomization:` section (none there = randomization off), exactly what the sim bridge
    runs with `calibration_file:=`.
    """
    if randomization is None or str(randomization) in ("none", "default"):
        return load_spec(randomization), None
    from sim2real_ros.config import load_yaml

    if "nominal" not in load_yaml(randomization):
        return load_spec(randomization), None
    from sim2real_ros.sim.randomization import RandomizationSpec, load_calibration

    nominal, spec = load_calibration(randomization)
    return (spec if spec is not None else RandomizationSpec.disabled()), nominal


@dataclass
class StepResult:
    """What one vectorized step returns (B environments)."""

    obs: np.ndarray  # (B, D) next observation (first of a new episode where done)
    reward: np.ndarray  # (B,)
    terminated: np.ndarray  # (B,) bool: success ended the episode
    truncated: np.ndarray  # (B,) bool: the time limit ended it
    final_obs: np.ndarray  # (B, D) the last observation of each episode that just ended
    episode_return: np.ndarray  # (B,) return of each episode that just ended (nan otherwise)
    episode_success: np.ndarray  # (B,) 1/0 for episodes that just ended, nan otherwise
    episode_steps: np.ndarray  # (B,) length of episodes that just ended, 0 otherwise


class ReachingVecEnv:
    """B reaching environments stepped together in this process."""

    def __init__(
        self,
        n_envs: int,
        task: TaskConfig | None = None,
        spec: Any = None,
        seed: int = 0,
        physics_dt_s: float = 1e-3,
        calibration: Any = None,
    ) -> None:
        from sim2real_ros.sim.core import SimCore

        if n_envs < 1:
            raise ValueError(f"n_envs = {n_envs}: expected >= 1")
        self.spec = spec
        self.n = n_envs
        seqs = np.random.SeedSequence(seed).spawn(n_envs)
        self.rngs = [np.random.default_rng(s) for s in seqs]
        self.cores = [
            SimCore(spec=spec, seed=int(r.integers(2**31)), physics_dt_s=physics_dt_s,
                    calibration=calibration)
            for r in self.rngs
        ]
        self.arm: ArmModel = self.cores[0].arm
        self.task = resolve_rate_limits(task or TaskConfig(), self.arm)
        self.task.validate(n_joints=self.arm.n_joints)
        self.kin = BatchKinematics(self.arm)
        self.expert = IKExpert(self.arm, self.task)
        n, b = self.arm.n_joints, n_envs
        self.steps_per_control = max(1, int(round(self.task.dt_s / physics_dt_s)))
        self.q_obs = np.zeros((b, n))
        self.qd_obs = np.zeros((b, n))
        self.wrench_obs = np.zeros((b, 6))
        self.hist = np.zeros((b, 3, n))  # the last three commands, newest first
        self.target = np.zeros((b, 3))
        self.t = np.zeros(b, dtype=int)
        self.ret = np.zeros(b)
        self.total_steps = 0

    @property
    def obs_dim(self) -> int:
        """Observation length."""
        return self.task.obs_dim(self.arm.n_joints)

    @property
    def act_dim(self) -> int:
        """Action length (one per joint)."""
        return self.arm.n_joints

    def _reset_one(self, i: int) -> None:
        rng = self.rngs[i]
        q0, target = sample_episode(rng, self.task, self.arm)
        o = self.cores[i].reset(seed=int(rng.integers(2**31)), q0=q0)
        self._take(i, o, fallback_q=q0)
        self.hist[i] = initial_history(self.q_obs[i])
        self.target[i] = target
        self.t[i] = 0
        self.ret[i] = 0.0

    def _take(self, i: int, o: Any, fallback_q: np.ndarray | None = None) -> None:
        # A dropped measurement leaves the previous one in place, as a node keeps its latest.
        if getattr(o, "valid", True):
            self.q_obs[i] = o.q
            self.qd_obs[i] = o.qd
            self.wrench_obs[i] = o.wrench
        elif fallback_q is not None:
            self.q_obs[i] = fallback_q
            self.qd_obs[i] = 0.0
            self.wrench_obs[i] = 0.0

    def observations(self) -> np.ndarray:
        """Return the current raw observations (B, D)."""
        tool = self.kin.tool_position(self.q_obs)
        return build_observation(
            self.task, self.q_obs, self.qd_obs, self.target, tool, self.hist[:, 0],
            self.wrench_obs if self.task.include_wrench else None, self.hist,
        )

    def reset(self) -> np.ndarray:
        """Start a new episode in every environment; return observations (B, D)."""
        for i in range(self.n):
            self._reset_one(i)
        return self.observations()

    def expert_actions(self) -> np.ndarray:
        """Return the expert's normalized actions (B, A) for the current observations."""
        return self.expert.act(self.q_obs, self.target, self.qd_obs)

    def step(self, actions: np.ndarray) -> StepResult:
        """Apply normalized actions (B, A) for one control period."""
        actions = np.asarray(actions, dtype=float)
        if actions.shape != (self.n, self.act_dim):
            raise ValueError(f"expected actions of shape {(self.n, self.act_dim)}, "
                             f"got {actions.shape}")
        cfg = self.task
        b = self.n
        rew = np.zeros(b)
        term = np.zeros(b, dtype=bool)
        trunc = np.zeros(b, dtype=bool)
        q_true = np.zeros((b, self.arm.n_joints))
        qd_true = np.zeros_like(q_true)
        for i in range(b):
            self.hist[i] = advance_command(cfg, self.arm, self.hist[i], self.q_obs[i],
                                           actions[i])
            core = self.cores[i]
            core.command("position", self.hist[i, 0])
            o = core.advance(cfg.dt_s)
            self._take(i, o)
            st = core.plant.state()
            q_true[i], qd_true[i] = st.q, st.qd
        dist = np.linalg.norm(self.kin.tool_position(q_true) - self.target, axis=1)
        self.t += 1
        self.total_steps += b
        for i in range(b):
            ok = is_success(cfg, float(dist[i]), qd_true[i])
            rew[i] = reward(cfg, float(dist[i]), actions[i], ok, qd_true[i])
            term[i] = ok
            trunc[i] = (not ok) and self.t[i] >= cfg.max_steps
        self.ret += rew
        final_obs = self.observations()
        ep_ret = np.full(b, np.nan)
        ep_succ = np.full(b, np.nan)
        ep_len = np.zeros(b, dtype=int)
        done = term | trunc
        for i in np.flatnonzero(done):
            ep_ret[i] = self.ret[i]
            ep_succ[i] = float(term[i])
            ep_len[i] = self.t[i]
            self._reset_one(int(i))
        obs = self.observations() if done.any() else final_obs
        return StepResult(obs, rew, term, trunc, final_obs, ep_ret, ep_succ, ep_len)

    def close(self) -> None:
        """Release the simulators."""
        for c in self.cores:
            c.close()

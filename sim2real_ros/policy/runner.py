"""Run a policy on one arm, one observation at a time (the node, shadow mode, transfer tests).

The task's action moves the previous joint target, so running a policy carries one piece of
state: the last commanded target. `PolicyRunner` keeps it and starts it from the measured
position after `reset()` (start-up, stale observations, a version switch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.model import EnsemblePolicy
from sim2real_ros.policy.task import TaskConfig, apply_action, build_observation
from sim2real_ros.robot.model import ArmModel, load_arm


@dataclass
class PolicyStep:
    """One answer of the policy."""

    joint_target_rad: np.ndarray  # (n,) joint position command, rad
    action: np.ndarray  # (n,) normalized ensemble-mean action in [-1, 1]
    disagreement_rad: float  # max over joints of the members' std of the joint target
    ood: float  # RMS z-score of the observation
    observation: np.ndarray  # the raw observation the policy saw


class PolicyRunner:
    """Stateful wrapper: observation in, joint target out, for one arm."""

    def __init__(self, policy: EnsemblePolicy, arm: ArmModel | None = None) -> None:
        self.policy = policy
        self.task = TaskConfig.from_dict(policy.task, "policy task config", strict=False)
        self.arm = arm if arm is not None else load_arm(default_urdf())
        if list(self.arm.joint_names) != list(policy.joint_names):
            raise ValueError(
                f"policy was trained for joints {policy.joint_names}, the arm has "
                f"{self.arm.joint_names}"
            )
        self.cmd: np.ndarray | None = None

    @property
    def control_rate_hz(self) -> float:
        """Rate the policy was trained at, Hz."""
        return self.task.control_rate_hz

    def reset(self) -> None:
        """Forget the last target; the next step starts from the measured position."""
        self.cmd = None

    def observation(
        self,
        q: np.ndarray,
        qd: np.ndarray,
        target_m: np.ndarray,
        wrench: np.ndarray | None = None,
    ) -> np.ndarray:
        """Return the raw observation for the current state (does not change the runner)."""
        q = np.asarray(q, dtype=float)
        cmd = q if self.cmd is None else self.cmd
        return build_observation(
            self.task, q, np.asarray(qd, dtype=float), np.asarray(target_m, dtype=float),
            self.arm.tool_position(q), cmd, wrench,
        )

    def step(
        self,
        q: np.ndarray,
        qd: np.ndarray,
        target_m: np.ndarray,
        wrench: np.ndarray | None = None,
    ) -> PolicyStep:
        """Answer one observation with the next joint target."""
        q = np.asarray(q, dtype=float)
        n = self.arm.n_joints
        if q.shape != (n,) or np.shape(qd) != (n,) or np.shape(target_m) != (3,):
            raise ValueError(
                f"expected q, qd of shape ({n},) and target of shape (3,), got "
                f"{q.shape}, {np.shape(qd)}, {np.shape(target_m)}"
            )
        if self.cmd is None:
            self.cmd = q.copy()
        obs = self.observation(q, qd, target_m, wrench)
        out = self.policy.evaluate(obs)
        self.cmd = apply_action(self.task, self.arm, self.cmd, q, out.action[0])
        return PolicyStep(
            self.cmd.copy(), out.action[0], float(out.disagreement_rad[0]), float(out.ood[0]), obs
        )

"""Run a policy on one arm, one observation at a time (the node, shadow mode, transfer tests).

The task's action moves the previous joint target, so running a policy carries state: the last
three commanded targets (the jerk-limited interface continues from the command's velocity and
acceleration, as the safety filter measures them). `PolicyRunner` keeps them and starts them at
rest at the measured position after `reset()` (start-up, stale observations, a version
switch).

In training the target the policy moves is the one the arm tracks. On a cell it is not always
the policy's own: in shadow or advisory stage the baseline drives, after a fallback the baseline
or a hold drives, and the safety filter may clip the policy's target. A policy that kept
integrating its own target would then see `cmd - q` pinned at its offset limit, an observation
it never met in training (out of distribution, so the filter keeps falling back). `executed()`
tells the runner what the arm was actually sent; when that is not one of the runner's own
recent targets, the next step starts from it (and from the rates of the last executed
commands).

"One of our own" allows `own_tolerance_rad` (default 5 mrad, on every joint). The executed
command comes back over the graph after the command went out, and on a loaded host after the
runner's next step: a target the filter reshaped by a fraction of a millimetre (a burst after
a stall, a late stream it braked along) then got adopted one step late, the step continued
from a command already one period behind the stream, the filter saw that step back as a jerk
and reshaped again, and the policy kept adopting its own delayed echo. Offline, with the
executed command 2-12 ms behind (`proxy.offline`, `feedback_hop_s`), exact matching adopted
on 18 056 of 18 063 steps and the calibrated policy of transfer run 7 reached 0 of 90 proxy
targets (86 of 90 with the tolerance, none adopted).
A reshape within the tolerance is left to the filter, whose output converges back onto the
policy's stream (it tracks the request within the limits); another source driving (the
baseline, a hold, a sustained clip) leaves the tolerance within a step or two at any speed
that matters and is adopted as before. The tolerance also bounds how far the policy's own
target may drift from what the arm is sent.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.model import EnsemblePolicy
from sim2real_ros.policy.task import (
    TaskConfig,
    advance_command,
    build_observation,
    initial_history,
    resolve_rate_limits,
)
from sim2real_ros.robot.model import ArmModel, load_arm

# An executed command within this of one of our recent targets (every joint) counts as ours, rad.
DEFAULT_OWN_TOLERANCE_RAD = 0.005


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

    # How many of our own targets may be in flight to the arm.
    OWN_HISTORY = 4

    def __init__(self, policy: EnsemblePolicy, arm: ArmModel | None = None,
                 own_tolerance_rad: float = DEFAULT_OWN_TOLERANCE_RAD) -> None:
        if not (math.isfinite(own_tolerance_rad) and 0.0 <= own_tolerance_rad <= 0.1):
            raise ValueError(f"own_tolerance_rad {own_tolerance_rad!r}: expected a number in "
                             "[0, 0.1] rad")
        self.own_tolerance_rad = float(own_tolerance_rad)
        self.policy = policy
        self.arm = arm if arm is not None else load_arm(default_urdf())
        self.task = resolve_rate_limits(
            TaskConfig.from_dict(policy.task, "policy task config", strict=False), self.arm)
        if list(self.arm.joint_names) != list(policy.joint_names):
            raise ValueError(
                f"policy was trained for joints {policy.joint_names}, the arm has "
                f"{self.arm.joint_names}"
            )
        self.cmd: np.ndarray | None = None
        self.history: np.ndarray | None = None  # last three commands, newest first
        # the last few targets this runner emitted (any may still be in flight to the arm)
        self._own: deque[np.ndarray] = deque(maxlen=self.OWN_HISTORY)
        self._executed: np.ndarray | None = None
        self._executed_hist: deque[np.ndarray] = deque(maxlen=3)
        self.adopted = 0  # steps that started from the executed command instead of our own

    def executed(self, cmd: np.ndarray | None) -> None:
        """Note the joint command the arm was last sent (None: none known, or too old)."""
        if cmd is None:
            self._executed = None
            self._executed_hist.clear()
            return
        c = np.asarray(cmd, dtype=float)
        if c.shape != (self.arm.n_joints,) or not np.all(np.isfinite(c)):
            raise ValueError(f"executed command {c.tolist()}: expected {self.arm.n_joints} "
                             "finite joint positions")
        if self._executed is None or np.any(c != self._executed):
            self._executed_hist.appendleft(c)
        self._executed = c

    def _base(self, q: np.ndarray) -> np.ndarray:
        """The history the next action continues: ours, or the arm's if someone else drives."""
        if self.history is None:
            return initial_history(q)
        ex = self._executed
        if ex is None or any(np.max(np.abs(ex - own)) <= self.own_tolerance_rad
                             for own in self._own):
            return self.history
        self.adopted += 1
        rows = list(self._executed_hist) or [ex]
        while len(rows) < 3:
            rows.append(rows[-1])
        return self.feasible_history(np.stack(rows[:3]))

    def feasible_history(self, rows: np.ndarray) -> np.ndarray:
        """The command state of an adopted history, within the interface's rate limits.

        Another source's commands, sampled where they reach the arm, need not follow the
        jerk-limited interface: a source switch, a baseline's steps or a sample missed between
        two ticks make finite differences of 50-100 rad/s² from millimetres. The policy never
        saw such a command state, so it would score out of distribution and the filter would
        keep falling back. The adopted state keeps the newest executed position and clips
        its velocity and acceleration to the task's limits (what the interface can continue
        from); the step interface has no rate state and keeps the rows as they are.
        """
        if not self.task.jerk_limited:
            return rows
        dt = self.task.dt_s
        vmax = np.asarray(self.task.max_velocity_rad_s, dtype=float)
        amax = np.asarray(self.task.max_acceleration_rad_s2, dtype=float)
        v = np.clip((rows[0] - rows[1]) / dt, -vmax, vmax)
        a = np.clip((rows[0] - 2.0 * rows[1] + rows[2]) / (dt * dt), -amax, amax)
        r1 = rows[0] - v * dt
        r2 = r1 - (v - a * dt) * dt
        return np.stack([rows[0], r1, r2])

    @property
    def control_rate_hz(self) -> float:
        """Rate the policy was trained at, Hz."""
        return self.task.control_rate_hz

    def reset(self) -> None:
        """Forget the last target; the next step starts from the measured position."""
        self.cmd = None
        self.history = None
        self._own.clear()
        self._executed = None
        self._executed_hist.clear()

    def observation(
        self,
        q: np.ndarray,
        qd: np.ndarray,
        target_m: np.ndarray,
        wrench: np.ndarray | None = None,
    ) -> np.ndarray:
        """Return the raw observation for the current state (does not change the runner)."""
        q = np.asarray(q, dtype=float)
        hist = initial_history(q) if self.history is None else self.history
        return build_observation(
            self.task, q, np.asarray(qd, dtype=float), np.asarray(target_m, dtype=float),
            self.arm.tool_position(q), hist[0], wrench, hist,
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
        self.history = self._base(q)
        obs = self.observation(q, qd, target_m, wrench)
        out = self.policy.evaluate(obs)
        self.history = advance_command(self.task, self.arm, self.history, q, out.action[0])
        self.cmd = self.history[0].copy()
        self._own.append(self.cmd.copy())
        return PolicyStep(
            self.cmd.copy(), out.action[0], float(out.disagreement_rad[0]), float(out.ood[0]), obs
        )

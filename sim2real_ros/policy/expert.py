"""The imitation expert: resolved-rate inverse kinematics from the arm model.

It answers the same observation the policy sees with the normalized action the task expects,
for the joint-target step

    dq = J^+ (k_i dt e) + (I - J^+ J) k_null f(|e|) dt (q_home - q)

with `J^+` the damped least-squares pseudo-inverse of the position Jacobian at the measured q,
`e` the tool position error and `f` a fade from 1 (far) to 0 (at the target). Because the
step moves the previous target, the loop integrates the Cartesian error: no steady-state
error under gravity sag. The step is scaled down uniformly
(direction kept: the tool moves on a straight line) so no joint exceeds its largest move
(`task.step_scale_rad`). With the jerk-limited action interface the step is a command-velocity
request that the command follows with bounded acceleration and jerk, so the expert also plans
the tool's speed: k_i e capped at the speed from which the tool can stop in the remaining
distance, sqrt(2 a_c |e|) (a deceleration ramp instead of the lag of the command generator
overshooting the target), and the safety filter's tool-speed bound sum_i |J_i| |q̇_i| under
`max_tool_speed_m_s`.

This is the policy room's teacher for behaviour cloning and DAgger. The safety room's
baseline controller is a separate, independently written controller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim2real_ros.policy.kinematics import BatchKinematics
from sim2real_ros.policy.task import TaskConfig, step_scale_rad, step_to_action
from sim2real_ros.robot.model import ArmModel


@dataclass(frozen=True)
class ExpertGains:
    """Gains of the resolved-rate expert."""

    k_integral_per_s: float = 10.0  # Cartesian error -> target velocity, 1/s
    k_null_per_s: float = 2.0  # posture pull toward home in the Jacobian null space, 1/s
    null_fade_m: float = 0.1  # the posture pull fades out linearly below this tool error, m
    damping_m: float = 0.05  # damped least squares, m
    # jerk-limited interface only: tool speed plan
    max_tool_speed_m_s: float = 0.75  # of the filter's bound; the envelope allows 1.0
    tool_decel_m_s2: float = 2.0
    # Phase lead: the error is taken where the tool will be lead_s ahead at its measured
    # velocity. A cell's loop is slower than the simulator's: on the proxy arm's command path
    # (joint_states age, policy tick, filter hop, the drive's bus) an observation reaches the
    # drive 25-35 ms later, behind a PID drive with stiction and backlash. Without the lead the
    # teacher itself hunts around the target there (76 of 90 proxy targets reached; the
    # policy imitates that); with 40 ms it reaches 89 of 90 (80 ms: 88), and in every
    # simulator (nominal, default randomization, 10-45 ms action delay) it still reaches all
    # of them. docs/proxy.md, "The teacher's lead".
    lead_s: float = 0.04


class IKExpert:
    """Batched resolved-rate IK teacher for the reaching task."""

    def __init__(self, arm: ArmModel, cfg: TaskConfig, gains: ExpertGains | None = None) -> None:
        self.arm = arm
        self.cfg = cfg
        self.gains = gains or ExpertGains()
        self.kin = BatchKinematics(arm)
        self.home = np.array(cfg.home_rad, dtype=float)

    def act(self, q: np.ndarray, target_m: np.ndarray, qd: np.ndarray | None = None
            ) -> np.ndarray:
        """Return normalized actions (B, n) in [-1, 1] for measured q (B, n) and targets (B, 3).

        With the jerk-limited interface the measured joint velocities `qd` give the loop phase
        lead: the error is taken at the tool position `lead_s` ahead (the command generator and
        the drive lag the request by about that much).
        """
        q = np.atleast_2d(np.asarray(q, dtype=float))
        target_m = np.atleast_2d(np.asarray(target_m, dtype=float))
        g, dt = self.gains, self.cfg.dt_s
        tool, jac = self.kin.tool_and_jacobian(q)
        err = target_m - tool
        if self.cfg.jerk_limited and qd is not None and g.lead_s > 0:
            qd2 = np.atleast_2d(np.asarray(qd, dtype=float))
            err = err - g.lead_s * (jac @ qd2[..., None])[..., 0]
        gain = np.full((q.shape[0], 1), g.k_integral_per_s)
        if self.cfg.jerk_limited:
            dist = np.maximum(np.linalg.norm(err, axis=1, keepdims=True), 1e-12)
            speed = np.minimum(g.k_integral_per_s * dist, np.sqrt(2.0 * g.tool_decel_m_s2 * dist))
            gain = speed / dist
        jjt = jac @ np.swapaxes(jac, 1, 2) + g.damping_m**2 * np.eye(3)
        # J^+ = J^T (J J^T + l^2 I)^-1, applied to vectors without forming it twice
        jpinv = np.swapaxes(jac, 1, 2) @ np.linalg.inv(jjt)
        dq_task = (jpinv @ (gain * dt * err)[..., None])[..., 0]
        proj = np.eye(q.shape[1]) - jpinv @ jac
        # The posture pull only acts while the tool travels: it keeps the redundant joints
        # near home over many targets, yet lets the arm come to rest once the tool arrives.
        fade = np.minimum(np.linalg.norm(err, axis=1, keepdims=True) / g.null_fade_m, 1.0)
        dq_null = (proj @ (fade * g.k_null_per_s * dt * (self.home - q))[..., None])[..., 0]
        dq = dq_task + dq_null
        peak = np.max(np.abs(dq) / step_scale_rad(self.cfg, q.shape[1]), axis=1, keepdims=True)
        if self.cfg.jerk_limited:
            # The safety filter bounds the tool speed by sum_i |J_i| |q̇_i| (each joint's lever
            # arm times its rate, whatever the others do): keep that bound, not only the
            # tool's actual speed, under the cap.
            bound = np.sum(np.linalg.norm(jac, axis=1) * np.abs(dq), axis=1, keepdims=True) / dt
            peak = np.maximum(peak, bound / g.max_tool_speed_m_s)
        dq = dq / np.maximum(peak, 1.0)
        return step_to_action(self.cfg, dq)

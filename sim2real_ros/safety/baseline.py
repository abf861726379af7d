"""The baseline controller: the independent, hand-coded fallback the safety filter hands over to.

It shares no code with the policy room; it reads only the arm model and the safety envelope.
Three modes:

* `hold`: PD hold of the joint positions where it entered hold (position command = the hold
  point; effort = PD torque for torque-mode cells).
* `home`: a smooth move to the configured home configuration, then hold.
* `track`: the task's tool-frame target (task/target) is turned into a joint goal with the arm
  model's inverse kinematics; the goal is reached along a quintic (minimum-jerk shaped) joint
  trajectory whose duration keeps every joint inside a fraction of the envelope's velocity,
  acceleration and jerk limits. A new target re-plans from the current trajectory state, so the
  command stays smooth.

Rate limits are its own (a fraction of the envelope's), so the safety filter's projection almost
never has to intervene on it. Pure: no rclpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim2real_ros.robot.model import ArmModel
from sim2real_ros.safety.envelope import Envelope
from sim2real_ros.safety.kinematics import ToolKinematics

HOLD, HOME, TRACK = "hold", "home", "track"
MODES = (HOLD, HOME, TRACK)


@dataclass(frozen=True)
class BaselineConfig:
    """Gains, limits and targets of the baseline controller."""

    home_rad: tuple[float, ...] = (0.0, 0.0, 1.6, 0.0, 1.5, 0.0)
    # Share of the envelope's velocity/acceleration/jerk limits the trajectories plan with.
    rate_fraction: float = 0.5
    kp_nm_rad: float = 150.0
    kd_nms_rad: float = 15.0
    ik_tolerance_m: float = 0.005
    goal_tolerance_rad: float = 1e-3
    # Keep IK goals this far inside the envelope's position limits.
    position_margin_rad: float = 0.05
    # A target within this distance of the tracked one is the same target (not solved again).
    same_target_m: float = 1e-6

    def check(self, n_joints: int) -> str | None:
        """Return why the configuration is invalid, or None."""
        if len(self.home_rad) != n_joints:
            return f"home_rad has {len(self.home_rad)} values, the arm has {n_joints} joints"
        if not all(math.isfinite(v) for v in self.home_rad):
            return "home_rad must be finite"
        if not 0.0 < self.rate_fraction <= 1.0:
            return f"rate_fraction must be in (0, 1], got {self.rate_fraction}"
        for name in ("kp_nm_rad", "kd_nms_rad", "ik_tolerance_m", "goal_tolerance_rad"):
            if not getattr(self, name) > 0.0:
                return f"{name} must be > 0, got {getattr(self, name)}"
        if self.position_margin_rad < 0.0:
            return f"position_margin_rad must be >= 0, got {self.position_margin_rad}"
        if not (math.isfinite(self.same_target_m) and self.same_target_m >= 0.0):
            return f"same_target_m must be a finite number >= 0, got {self.same_target_m}"
        return None


@dataclass
class BaselineOutput:
    """One step of the baseline: position command, PD torque and where it is going."""

    position: list[float]
    velocity: list[float]
    effort: list[float]
    mode: str
    at_goal: bool


def _horner(c: np.ndarray, t: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Position, velocity, acceleration, jerk of the quintic with coefficients c (6, n) at t:
    a float (the control tick, kept cheap) or an (S, 1) array of times (the duration search)."""
    p = c[0] + t * (c[1] + t * (c[2] + t * (c[3] + t * (c[4] + t * c[5]))))
    v = c[1] + t * (2 * c[2] + t * (3 * c[3] + t * (4 * c[4] + t * 5 * c[5])))
    a = 2 * c[2] + t * (6 * c[3] + t * (12 * c[4] + t * 20 * c[5]))
    j = 6 * c[3] + t * (24 * c[4] + t * 60 * c[5])
    return p, v, a, j


class Quintic:
    """Per-joint quintic from (p0, v0, a0) to (p1, 0, 0) over a common duration."""

    def __init__(self, p0: np.ndarray, v0: np.ndarray, a0: np.ndarray, p1: np.ndarray,
                 duration_s: float) -> None:
        t = duration_s
        self.duration_s = t
        self.p1 = p1.copy()
        d = p1 - p0 - v0 * t - 0.5 * a0 * t * t
        # Boundary conditions p(T)=p1, v(T)=0, a(T)=0 solved for the cubic..quintic terms.
        self.c = np.zeros((6, p0.size))
        self.c[0], self.c[1], self.c[2] = p0, v0, 0.5 * a0
        rhs = np.vstack([d, -v0 - a0 * t, -a0])
        m = np.array([[t**3, t**4, t**5], [3 * t**2, 4 * t**3, 5 * t**4],
                      [6 * t, 12 * t**2, 20 * t**3]])
        sol = np.linalg.solve(m, rhs)
        self.c[3], self.c[4], self.c[5] = sol

    def sample(self, t_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return position, velocity, acceleration and jerk at time t (clamped to [0, T])."""
        if t_s >= self.duration_s:
            p = self.p1.copy()
            return p, np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
        return _horner(self.c, max(t_s, 0.0))

    def sample_many(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
        """`sample` at each of the times ts, in one pass: (len(ts), n) arrays."""
        ts = np.asarray(ts, dtype=float)
        p, v, a, j = _horner(self.c, np.clip(ts, 0.0, self.duration_s)[:, None])
        end = ts >= self.duration_s
        if np.any(end):
            p[end] = self.p1
            v[end] = a[end] = j[end] = 0.0
        return p, v, a, j

    def peaks(self, samples: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the largest |velocity|, |acceleration|, |jerk| per joint along the trajectory."""
        _, v, a, j = self.sample_many(np.linspace(0.0, self.duration_s, samples))
        return np.abs(v).max(axis=0), np.abs(a).max(axis=0), np.abs(j).max(axis=0)


def plan_quintic(p0: np.ndarray, v0: np.ndarray, a0: np.ndarray, p1: np.ndarray,
                 vmax: np.ndarray, amax: np.ndarray, jmax: np.ndarray,
                 kin: ToolKinematics | None = None, max_tool_speed_m_s: float = math.inf
                 ) -> Quintic:
    """Return the shortest (within 10 %) quintic whose peaks respect the given limits.

    With `kin`, the tool speed is bounded too, by sum_k lever_k(q) * |qd_k| along the path
    (the same conservative measure the safety filter applies).
    """
    dist = np.abs(p1 - p0)
    # Minimum-jerk peaks: v = 1.875 d / T, a = 5.774 d / T^2, j = 60 d / T^3.
    t = max(0.05,
            float(np.max(1.875 * dist / vmax)),
            float(np.max(np.sqrt(5.774 * dist / amax))),
            float(np.max(np.cbrt(60.0 * dist / jmax))),
            float(np.max(np.abs(v0) / amax)) * 2.0,
            float(np.max(np.abs(a0) / jmax)) * 2.0)
    levers = [0.0] * p0.size
    for _ in range(60):
        q = Quintic(p0, v0, a0, p1, t)
        pv, pa, pj = q.peaks()
        ok = bool(np.all(pv <= vmax) and np.all(pa <= amax) and np.all(pj <= jmax))
        if ok and kin is not None and math.isfinite(max_tool_speed_m_s):
            pos_all, vel_all, _, _ = q.sample_many(np.linspace(0.0, t, 24))
            for pos, vel in zip(pos_all.tolist(), np.abs(vel_all).tolist()):
                kin.tool_position_and_levers(pos, levers)
                if sum(lk * w for lk, w in zip(levers, vel)) > max_tool_speed_m_s:
                    ok = False
                    break
        if ok:
            return q
        t *= 1.1
    return q


@dataclass(frozen=True)
class TargetSolution:
    """A target's IK result: `goal_rad` None with ok = the target already being tracked."""

    ok: bool
    note: str
    xyz: np.ndarray | None = None
    goal_rad: np.ndarray | None = None


class StepClock:
    """The baseline reference's time base: one control period per published command.

    Sampling the quintic at the timer's wall time put the timer's jitter into the command: a
    1 ms late tick at 0.9 rad/s moves the sample 0.9 mrad, which the safety filter, dividing by
    its smoothed 10 ms period, reads as a jerk of ~900 rad/s^3 against the envelope's 72. On the
    proxy cell the filter trimmed about half of the baseline's commands (1278 interventions in
    12 advisory episodes). With this clock the n-th command is the trajectory at t0 + n periods,
    as the policy's jerk-limited interface does it: a late tick stretches the spacing of the
    samples, never their content. The command after a late one is not dropped: rclpy's timer
    keeps its phase, so a late tick is followed by one less than a period later, and that one
    brings the reference back onto the wall clock's grid (dropping it, as the first version
    did, left the reference a period behind for good: 0.2 s behind after 20 late ticks, which
    made the baseline miss the 2 s episode deadline). A tick is dropped only when the wall
    clock has not reached within `early_periods` of the next sample's time (a timer firing
    twice at once). The reference is re-anchored to the wall clock when it lags by more than
    `resync_periods` (a stall that skipped timer callbacks: the one jump of the old sampling,
    now only where the host really stalled). Pure: the node passes `now` in.
    """

    def __init__(self, period_s: float, early_periods: float = 0.5,
                 resync_periods: float = 2.5) -> None:
        if not (math.isfinite(period_s) and period_s > 0.0):
            raise ValueError(f"period_s {period_s!r}: expected a finite number > 0 s")
        if not (math.isfinite(early_periods) and 0.0 <= early_periods < 1.0):
            raise ValueError(f"early_periods {early_periods!r}: expected a number in "
                             "[0, 1) periods")
        if not (math.isfinite(resync_periods) and resync_periods >= 1.0):
            raise ValueError(f"resync_periods {resync_periods!r}: expected a number >= 1 "
                             "period")
        self.period_s = float(period_s)
        self.early_s = float(early_periods) * self.period_s
        self.resync_s = float(resync_periods) * self.period_s
        self.t_s: float | None = None  # reference time of the last command
        self.dropped = 0  # ticks that came before the next sample was due
        self.resyncs = 0  # stalls after which the reference jumped to the wall clock

    def tick(self, now_s: float) -> float | None:
        """The reference time of this tick's command, or None when the tick is dropped."""
        now_s = float(now_s)
        if self.t_s is None:
            self.t_s = now_s
            return self.t_s
        t = self.t_s + self.period_s
        if t - self.resync_s <= now_s < t - self.early_s:
            self.dropped += 1
            return None
        if abs(now_s - t) > self.resync_s:  # a stall, or the clock stepped back
            t = now_s
            self.resyncs += 1
        self.t_s = t
        return t

    def now(self, now_s: float) -> float:
        """The reference time for a plan made between ticks: the last command's (so the new
        trajectory starts exactly at the last sample sent), or the wall time before the first."""
        return float(now_s) if self.t_s is None else self.t_s


class BaselineController:
    """Hold, home and target tracking on the arm model; one `step` per control period."""

    def __init__(self, arm: ArmModel, envelope: Envelope, config: BaselineConfig | None = None
                 ) -> None:
        self.config = config or BaselineConfig()
        why = self.config.check(arm.n_joints)
        if why:
            raise ValueError(why)
        if envelope.joint_names != arm.joint_names:
            raise ValueError("envelope and arm joints differ")
        self.arm = arm
        self.envelope = envelope
        f = self.config.rate_fraction
        self.lower = np.array([j.lower_rad for j in envelope.joints])
        self.upper = np.array([j.upper_rad for j in envelope.joints])
        self.vmax = f * np.array([j.velocity_rad_s for j in envelope.joints])
        self.amax = f * np.array([j.acceleration_rad_s2 for j in envelope.joints])
        self.jmax = f * np.array([j.jerk_rad_s3 for j in envelope.joints])
        self.effort = np.array([j.effort_nm for j in envelope.joints])
        self.kin = ToolKinematics(arm, envelope.tool_link)
        self.max_tool_speed_m_s = f * envelope.max_tool_speed_m_s
        self.box_min = np.array(envelope.box_min_m)
        self.box_max = np.array(envelope.box_max_m)
        m = self.config.position_margin_rad
        self.goal_lower = np.minimum(self.lower + m, 0.5 * (self.lower + self.upper))
        self.goal_upper = np.maximum(self.upper - m, 0.5 * (self.lower + self.upper))
        self.mode = HOLD
        self.ref: np.ndarray | None = None  # reference position (the command)
        self.ref_v = np.zeros(arm.n_joints)
        self.ref_a = np.zeros(arm.n_joints)
        self.traj: Quintic | None = None
        self.traj_t0 = 0.0
        self.target_xyz: np.ndarray | None = None
        self.goal: np.ndarray | None = None

    # -- mode changes ---------------------------------------------------------------------
    def hold(self, now_s: float) -> None:
        """Hold near where the reference is now (a moving reference stops smoothly)."""
        self.mode = HOLD
        self.target_xyz = None
        if self.ref is not None:
            self.goal = np.clip(self.ref + self._stop_offset(), self.lower, self.upper)
            self._plan_to(self.goal, now_s)
        else:
            self.goal = None

    def go_home(self, now_s: float) -> tuple[bool, str]:
        """Move to the home configuration along a smooth trajectory."""
        home = np.clip(np.array(self.config.home_rad), self.goal_lower, self.goal_upper)
        self.mode = HOME
        self.target_xyz = None
        if self.ref is not None:
            self._plan_to(home, now_s)
        self.goal = home
        return True, "homing"

    def set_target(self, xyz: Sequence[float], now_s: float) -> tuple[bool, str]:
        """Track a tool-frame target (base frame, m); refuse it if IK cannot reach it."""
        solved = self.solve_target(xyz)
        if not solved.ok:
            return False, solved.note
        return self.apply_target(solved, now_s)

    def solve_target(self, xyz: Sequence[float], seed: np.ndarray | None = None
                     ) -> TargetSolution:
        """The joint goal of a tool-frame target, or why it is refused; changes nothing.

        The IK takes 10-40 ms here, longer on a loaded host: the node runs this off its
        control thread (baseline_node) and hands the result to `apply_target`. A target equal
        to the one being tracked (within `same_target_m`) is not solved again: the evaluation
        and the task sequencer re-publish their target every 0.2 s.
        """
        target = np.asarray(xyz, dtype=float)
        if target.shape != (3,) or not np.all(np.isfinite(target)):
            return TargetSolution(False, f"target must be 3 finite numbers, got {list(xyz)!r}")
        if np.any(target < self.box_min) or np.any(target > self.box_max):
            return TargetSolution(False, f"target {target.round(4).tolist()} outside the "
                                  f"workspace box {self.box_min.tolist()}.."
                                  f"{self.box_max.tolist()}")
        current = self.target_xyz
        if (current is not None and self.mode == TRACK and self.goal is not None
                and float(np.max(np.abs(current - target))) <= self.config.same_target_m):
            return TargetSolution(True, "tracking (target unchanged)", target, None)
        if seed is None:
            seed = self.goal if self.goal is not None else (
                self.ref if self.ref is not None else np.array(self.config.home_rad))
        q, _ = self.arm.ik_position(target, np.asarray(seed, dtype=float))
        q = np.clip(q, self.goal_lower, self.goal_upper)
        err = float(np.linalg.norm(self.arm.tool_position(q) - target))
        if err > self.config.ik_tolerance_m:
            # Try once more from home: a far seed can stall the damped least squares.
            q2, _ = self.arm.ik_position(target, np.array(self.config.home_rad))
            q2 = np.clip(q2, self.goal_lower, self.goal_upper)
            err2 = float(np.linalg.norm(self.arm.tool_position(q2) - target))
            if err2 < err:
                q, err = q2, err2
        if err > self.config.ik_tolerance_m:
            return TargetSolution(False, f"target {target.round(4).tolist()} unreachable inside "
                                  f"the envelope (IK residual {err:.4f} m > "
                                  f"{self.config.ik_tolerance_m} m)")
        return TargetSolution(True, f"tracking, IK residual {err:.5f} m", target, q)

    def apply_target(self, solved: TargetSolution, now_s: float) -> tuple[bool, str]:
        """Start tracking a solved target (re-plans from the running trajectory at now_s)."""
        if not solved.ok or solved.xyz is None:
            return False, solved.note
        if solved.goal_rad is None:  # the target being tracked, re-published
            cur = self.target_xyz
            if (self.mode == TRACK and cur is not None
                    and float(np.max(np.abs(cur - solved.xyz))) <= self.config.same_target_m):
                return True, solved.note
            # The mode or target changed while it was being checked: solve it now.
            return self.set_target(solved.xyz, now_s)
        self.mode = TRACK
        self.target_xyz = solved.xyz.copy()
        self.goal = solved.goal_rad.copy()
        if self.ref is not None:
            self._plan_to(self.goal, now_s)
        return True, solved.note

    # -- the step -------------------------------------------------------------------------
    def step(self, now_s: float, q_measured: Sequence[float],
             qd_measured: Sequence[float] | None = None) -> BaselineOutput:
        """Advance the reference to now_s and return the command for this period."""
        q = np.asarray(q_measured, dtype=float)
        qd = (np.zeros_like(q) if qd_measured is None
              else np.nan_to_num(np.asarray(qd_measured, dtype=float)))
        if self.ref is None:
            # Start where the arm is (clamped into the envelope): no jump on start-up.
            self.ref = np.clip(q, self.lower, self.upper)
            if self.goal is not None and self.mode in (HOME, TRACK):
                self._plan_to(self.goal, now_s)
        if self.traj is not None:
            p, v, a, _ = self.traj.sample(now_s - self.traj_t0)
            self.ref, self.ref_v, self.ref_a = p, v, a
            if now_s - self.traj_t0 >= self.traj.duration_s:
                self.traj = None
        else:
            self.ref_v = np.zeros_like(q)
            self.ref_a = np.zeros_like(q)
        tau = self.config.kp_nm_rad * (self.ref - q) + self.config.kd_nms_rad * (self.ref_v - qd)
        tau = np.clip(tau, -self.effort, self.effort)
        at_goal = self.traj is None and (
            self.goal is None
            or float(np.max(np.abs(self.ref - self.goal))) <= self.config.goal_tolerance_rad)
        return BaselineOutput(self.ref.tolist(), self.ref_v.tolist(), tau.tolist(), self.mode,
                              at_goal)

    def _stop_offset(self) -> np.ndarray:
        # Where a moving reference comes to rest on a gentle brake: v * t_stop / 2.
        t_stop = float(np.max(np.abs(self.ref_v) / self.amax)) if self.ref_v.size else 0.0
        return self.ref_v * 0.5 * t_stop

    def _plan_to(self, goal: np.ndarray, now_s: float) -> None:
        assert self.ref is not None
        goal = np.clip(goal, self.lower, self.upper)
        p0, v0, a0 = self.ref, self.ref_v, self.ref_a
        if self.traj is not None:
            # Start from where the running trajectory is at now_s, so the command is continuous
            # at the next sample.
            p0, v0, a0, _ = self.traj.sample(now_s - self.traj_t0)
        self.traj = plan_quintic(p0, v0, a0, goal, self.vmax, self.amax, self.jmax, self.kin,
                                 self.max_tool_speed_m_s)
        self.traj_t0 = now_s

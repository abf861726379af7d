"""Node `baseline_controller`: the independent hand-coded controller the filter falls back to.

Subscribes `joint_states` and `task/target` (geometry_msgs/PointStamped, tool0 position in the
base frame); publishes `baseline/joint_command` (sensor_msgs/JointState: position = the smooth
reference, velocity = its rate, effort = PD torque; header.stamp = the joint_states stamp it
answers) at `rate_hz`, and `/diagnostics`. The n-th command is its trajectory n periods after
the first (baseline.StepClock), so timer jitter never reaches the command's rates. Parameter
`mode` (hold | home | track) may be set at run time. It publishes nothing while joint_states are stale: a command that answers an old
observation would only be rejected by the safety filter.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
from geometry_msgs.msg import PointStamped
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import MessageError, arrays_to_joint_state, joint_state_to_arrays
from sim2real_ros.ros.diagnostics import OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS, STATE_QOS
from sim2real_ros.safety.baseline import (
    HOLD,
    HOME,
    MODES,
    TRACK,
    BaselineConfig,
    StepClock,
    TargetSolution,
)
from sim2real_ros.safety.baseline import BaselineController as BaselineCore
from sim2real_ros.safety.envelope import load_envelope

NODE_NAME = "baseline_controller"

PARAMS = [
    ParamSpec("urdf_path", "", "URDF of the arm; '' = the shipped arm.", read_only=True),
    ParamSpec("envelope_file", "",
              "Safety envelope (the baseline plans inside a fraction of it); '' = "
              "config/safety_envelope.yaml.", read_only=True),
    ParamSpec("joints", [""], "Joint order of baseline/joint_command; [''] = URDF order.",
              param_type=Parameter.Type.STRING_ARRAY, read_only=True),
    ParamSpec("mode", TRACK,
              "hold: PD hold where it is; home: move to home_rad then hold; track: follow "
              "task/target (hold until the first target).", choices=MODES),
    ParamSpec("rate_hz", 100.0, "Publish rate of baseline/joint_command (Hz).", low=1.0,
              high=1000.0, read_only=True),
    ParamSpec("home_rad", [0.0, 0.0, 1.6, 0.0, 1.5, 0.0],
              "Home configuration (rad, URDF joint order).",
              param_type=Parameter.Type.DOUBLE_ARRAY, read_only=True),
    ParamSpec("rate_fraction", 0.5,
              "Share of the envelope's velocity, acceleration, jerk and tool-speed limits the "
              "trajectories use.", low=0.01, high=1.0, read_only=True),
    ParamSpec("kp_nm_rad", 150.0, "PD stiffness of the effort output (N·m/rad).", low=0.0,
              high=1e5, read_only=True),
    ParamSpec("kd_nms_rad", 15.0, "PD damping of the effort output (N·m·s/rad).", low=0.0,
              high=1e4, read_only=True),
    ParamSpec("ik_tolerance_m", 0.005, "Largest IK residual a target may have (m).", low=1e-6,
              high=1.0, read_only=True),
    ParamSpec("state_timeout_s", 0.05, "Stop publishing when joint_states are older (s).",
              low=0.001, high=10.0, read_only=True),
    ParamSpec("diagnostics_period_s", 1.0, "Period of /diagnostics (s).", low=0.01, high=60.0,
              read_only=True),
]


class BaselineController(Node):
    """Publishes the baseline controller's joint command at a fixed rate."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.p = declare_params(self, PARAMS, on_change=self._on_param_change)
        p = self.p
        arm = load_arm(p["urdf_path"] or str(default_urdf()))
        env_path = p["envelope_file"] or str(share_path("config", "safety_envelope.yaml"))
        envelope = load_envelope(env_path, arm)
        joints = [j for j in p["joints"] if j] or list(arm.joint_names)
        if sorted(joints) != sorted(arm.joint_names) or len(set(joints)) != len(joints):
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "joints", joints,
                              f"a permutation of the arm's joints {arm.joint_names}")
        cfg = BaselineConfig(home_rad=tuple(p["home_rad"]), rate_fraction=p["rate_fraction"],
                             kp_nm_rad=p["kp_nm_rad"], kd_nms_rad=p["kd_nms_rad"],
                             ik_tolerance_m=p["ik_tolerance_m"])
        why = cfg.check(arm.n_joints)
        if why:
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "home_rad/gains",
                              list(p["home_rad"]), why)
        self.core = BaselineCore(arm, envelope, cfg)
        # The reference advances one period per command, not with the timer's jitter.
        self.clock = StepClock(1.0 / p["rate_hz"])
        self.internal = list(arm.joint_names)
        self.joints = joints
        self._out = [self.internal.index(j) for j in joints]
        self._q: np.ndarray | None = None
        self._qd: np.ndarray | None = None
        self._stamp = None
        self._arrival_s: float | None = None
        self._target_note = "no target yet"
        self._published = 0
        self._pending_mode: str | None = p["mode"]
        # Targets are solved (IK, 10-40 ms; more on a loaded host) on a worker thread, so the
        # command stream never pauses for them; the control timer applies the newest solution.
        self._lock = threading.Lock()
        self._wanted: list[float] | None = None
        self._solved: TargetSolution | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.solve_ms_max = 0.0
        self.apply_ms_max = 0.0  # planning the move, on the control thread
        self.targets_solved = 0
        self._stale_since: float | None = None
        self._solver = threading.Thread(target=self._solve_loop, name="baseline_ik", daemon=True)
        self._solver.start()
        self.pub = self.create_publisher(JointState, "baseline/joint_command", COMMAND_QOS)
        self.diag = DiagnosticsPublisher(self)
        self.create_subscription(JointState, "joint_states", self._on_joint_state, STATE_QOS)
        self.create_subscription(PointStamped, "task/target", self._on_target, COMMAND_QOS)
        self.create_timer(1.0 / p["rate_hz"], self._on_timer)
        self.create_timer(p["diagnostics_period_s"], self._publish_diagnostics)

    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_param_change(self, changes: dict[str, Any]) -> str | None:
        if "mode" in changes:
            self._pending_mode = changes["mode"]
        return None

    def _apply_mode(self, now: float) -> None:
        mode, self._pending_mode = self._pending_mode, None
        if mode == HOME:
            self.core.go_home(now)
        elif mode == HOLD:
            self.core.hold(now)
        elif mode == TRACK and self.core.mode != TRACK:
            self.core.hold(now)  # track without a target holds until one arrives
            self.core.mode = TRACK

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            arr = joint_state_to_arrays(msg, self.internal)
        except MessageError as exc:
            self.get_logger().warning(f"joint_states rejected: {exc}", throttle_duration_sec=5.0)
            return
        if not np.all(np.isfinite(arr.position)):
            return
        self._q = arr.position
        self._qd = arr.velocity
        self._stamp = msg.header.stamp
        self._arrival_s = self._now_s()

    def _on_target(self, msg: PointStamped) -> None:
        if self.core.mode != TRACK and self._pending_mode != TRACK:
            self._target_note = f"target ignored in mode {self.core.mode}"
            return
        with self._lock:
            self._wanted = [msg.point.x, msg.point.y, msg.point.z]
        self._wake.set()

    def _solve_loop(self) -> None:
        while not self._stop.is_set():
            if not self._wake.wait(0.2):
                continue
            self._wake.clear()
            with self._lock:
                xyz, self._wanted = self._wanted, None
            if xyz is None:
                continue
            t0 = time.perf_counter()
            solved = self.core.solve_target(xyz)  # reads the core only
            ms = (time.perf_counter() - t0) * 1e3
            with self._lock:
                self._solved = solved  # the newest target wins
                if solved.goal_rad is not None:
                    self.targets_solved += 1
                    self.solve_ms_max = max(self.solve_ms_max, ms)

    def _apply_solution(self, t: float) -> None:
        with self._lock:
            solved, self._solved = self._solved, None
        if solved is None:
            return
        t0 = time.perf_counter()
        ok, note = self.core.apply_target(solved, t)
        ms = (time.perf_counter() - t0) * 1e3
        self.apply_ms_max = max(self.apply_ms_max, ms)
        period_ms = 1e3 / self.p["rate_hz"]
        if ms > 2.0 * period_ms:
            self.get_logger().warning(
                f"planning the move to the new target took {ms:.1f} ms (> 2 control periods "
                f"of {period_ms:.1f} ms): the command stream paused", throttle_duration_sec=2.0)
        self._target_note = note
        if not ok:
            self.get_logger().warning(f"task/target refused: {note}", throttle_duration_sec=2.0)

    def destroy_node(self) -> None:
        """Stop the target solver, then the node."""
        self._stop.set()
        self._wake.set()
        self._solver.join(timeout=2.0)
        super().destroy_node()

    def _on_timer(self) -> None:
        now = self._now_s()
        if self._q is None or self._arrival_s is None:
            return
        age = now - self._arrival_s
        if age > self.p["state_timeout_s"]:
            if self._stale_since is None:
                self._stale_since = now
                self.get_logger().warning(
                    f"joint_states {age:.3f} s old > state_timeout_s "
                    f"{self.p['state_timeout_s']} s: not publishing baseline/joint_command")
            return
        if self._stale_since is not None:
            self.get_logger().warning(f"joint_states fresh again after "
                                      f"{now - self._stale_since:.3f} s: publishing")
            self._stale_since = None
        t = self.clock.tick(now)
        if t is None:
            return
        self._apply_solution(t)
        out = self.core.step(t, self._q, self._qd)
        if self._pending_mode is not None:
            self._apply_mode(t)
        idx = self._out
        msg = arrays_to_joint_state(
            self.joints, self._stamp, np.asarray(out.position)[idx],
            np.asarray(out.velocity)[idx], np.asarray(out.effort)[idx])
        self.pub.publish(msg)
        self._published += 1

    def _publish_diagnostics(self) -> None:
        now = self._now_s()
        fresh = self._arrival_s is not None and now - self._arrival_s <= self.p["state_timeout_s"]
        level = OK if fresh else WARN
        msg = f"mode {self.core.mode}" if fresh else "joint_states stale: not publishing"
        goal = self.core.goal
        values = {
            "mode": self.core.mode,
            "target": self._target_note,
            "goal_rad": [] if goal is None else [round(float(g), 4) for g in goal],
            "trajectory_active": self.core.traj is not None,
            "published": self._published,
            "ticks_dropped_early": self.clock.dropped,
            "reference_resyncs": self.clock.resyncs,
            "targets_solved": self.targets_solved,
            "target_solve_ms_max": round(self.solve_ms_max, 2),
            "target_plan_ms_max": round(self.apply_ms_max, 2),
        }
        self.diag.publish([make_status(f"{NODE_NAME}: baseline", level, msg, values)])


def main(args: list[str] | None = None) -> int:
    """Run the baseline_controller node."""
    return spin_node(BaselineController, args)


if __name__ == "__main__":
    sys.exit(main())

"""policy_node: runs a registered policy on the latest joint state and task target.

Thin over `PolicyRunner` and `PolicyRegistry`: declares parameters, converts messages, publishes.
Each control tick answers the newest fresh observation once: `policy/joint_command` (position =
joint targets, header.stamp = the observation's stamp) and `policy/confidence` (x ensemble
disagreement rad, y OOD RMS z-score, z version). A stale observation gets no command at all
(the safety filter's watchdog takes over) and /diagnostics says why.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import numpy as np
from geometry_msgs.msg import PointStamped, Vector3Stamped, WrenchStamped
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.pacing import DEFAULT_MIN_GAP_PERIODS, CommandPacer
from sim2real_ros.policy.registry import PolicyRegistry, VersionRecord
from sim2real_ros.policy.runner import DEFAULT_OWN_TOLERANCE_RAD, PolicyRunner
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import (
    MessageError,
    arrays_to_joint_state,
    joint_state_to_arrays,
    multiarray_to_array,
    stamp_to_s,
    wrench_to_array,
)
from sim2real_ros.ros.diagnostics import ERROR, OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS, LATCHED_QOS, STATE_QOS

PARAMS = [
    ParamSpec("policy_version", 0, "Registry version to run; 0 = the registry's known-good "
              "version. Settable at run time (the new version is verified before use).",
              low=0, high=1_000_000),
    ParamSpec("registry_path", "", "Policy registry directory; empty = "
              "$SIM2REAL_POLICY_REGISTRY or ~/.local/share/sim2real_ros/policies.",
              read_only=True),
    ParamSpec("urdf_path", "", "Arm URDF; empty = the shipped sim2real_arm.urdf.",
              read_only=True),
    ParamSpec("rate_hz", 100.0, "Control rate, Hz; should equal the rate the policy was "
              "trained at (diagnostics warn otherwise).", low=1.0, high=1000.0, read_only=True),
    ParamSpec("min_command_gap_periods", DEFAULT_MIN_GAP_PERIODS,
              "> 0: a timer tick less than this share of a control period after the previous "
              "command is dropped, its observation answered by the next tick (an overdue timer "
              "firing again at once would send a burst of trajectory the filter cannot take "
              "at its rate; policy/pacing.py); 0 = off.", low=0.0, high=0.99, read_only=True),
    ParamSpec("stale_timeout_s", 0.05, "An observation older than this is stale: nothing is "
              "published, s.", low=0.001, high=10.0),
    ParamSpec("stale_clock", "receipt", "How an observation's age is measured: 'receipt' = "
              "time since it was received (the stream stopped); 'stamp' = node clock minus "
              "header.stamp, and at least the time since receipt (true latency; needs the "
              "driver to stamp with the node's clock, else the node stays silent). Commands "
              "carry the observation's stamp, so the safety filter can judge latency either way.",
              choices=("stamp", "receipt")),
    ParamSpec("follow_executed_command", True, "Listen to the command the arm is sent "
              "(forward_position_controller/commands, after the safety filter) and, when it is "
              "not one of our own recent targets (baseline driving, a hold, a clip), move that "
              "one instead of our own: the observation then stays what training showed."),
    ParamSpec("executed_command_tolerance_rad", DEFAULT_OWN_TOLERANCE_RAD,
              "An executed command within this of one of our recent targets (every joint) is "
              "our own, rad: a small reshape by the filter is left to the filter, because the "
              "executed command comes back after the next step on a loaded host and adopting "
              "it then cascades (policy/runner.py).", low=0.0, high=0.1),
    ParamSpec("executed_command_timeout_s", 0.05, "An executed command older than this is "
              "ignored, s.", low=0.001, high=10.0),
    ParamSpec("diagnostics_period_s", 1.0, "Period of /diagnostics reports, s.",
              low=0.05, high=60.0, read_only=True),
]

STATE_RUNNING = "running"
STATE_STALE = "stale"
STATE_NO_STATE = "waiting_for_joint_states"
STATE_NO_TARGET = "waiting_for_target"
STATE_BAD_OBS = "invalid_observation"


class PolicyNode(Node):
    """Publishes policy joint commands and confidence for the latest observation."""

    def __init__(self, name: str = "policy_node", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.p = declare_params(self, PARAMS, on_change=self._on_param_change)
        self.registry = PolicyRegistry(self.p["registry_path"] or None)
        self.arm = load_arm(self.p["urdf_path"] or default_urdf())
        self.runner: PolicyRunner | None = None
        self.record: VersionRecord | None = None
        self.reason = ""
        requested = int(self.p["policy_version"])
        policy, rec = self.registry.load(requested)
        try:
            self._activate(policy, rec, f"startup: policy_version={requested}"
                           + (" (known-good)" if requested == 0 else ""))
        except ValueError as exc:  # a policy for another arm: refuse like any bad config
            raise ConfigError(self.registry.root / rec.file, "joint_names", policy.joint_names,
                              f"the joints of {self.arm.urdf_path} ({exc})") from exc

        self._q: np.ndarray | None = None
        self._qd: np.ndarray | None = None
        self._wrench: np.ndarray | None = None
        self._obs_stamp = None
        self._obs_stamp_s = -math.inf
        self._obs_recv_s = -math.inf
        self._obs_seq = 0
        self._answered_seq = 0
        self._target: np.ndarray | None = None
        self._state = STATE_NO_STATE
        self._published = 0
        self._pacer = CommandPacer(1.0 / float(self.p["rate_hz"]),
                                   float(self.p["min_command_gap_periods"]))
        self._stale_ticks = 0
        self._bad_messages = 0
        self._last_error = ""
        self._last_dis = math.nan
        self._last_ood = math.nan
        self._max_dis = 0.0
        self._max_ood = 0.0
        self._infer_s: list[float] = []

        self.cmd_pub = self.create_publisher(JointState, "policy/joint_command", COMMAND_QOS)
        self.conf_pub = self.create_publisher(Vector3Stamped, "policy/confidence", STATE_QOS)
        self.version_pub = self.create_publisher(String, "~/active_version", LATCHED_QOS)
        self.diag = DiagnosticsPublisher(self)
        self.create_subscription(JointState, "joint_states", self._on_joint_state, STATE_QOS)
        self.create_subscription(PointStamped, "task/target", self._on_target, STATE_QOS)
        self.create_subscription(WrenchStamped, "force_torque_sensor_broadcaster/wrench",
                                 self._on_wrench, STATE_QOS)
        self._executed: np.ndarray | None = None
        self._executed_recv_s = -math.inf
        if self.p["follow_executed_command"]:
            self.create_subscription(Float64MultiArray, "forward_position_controller/commands",
                                     self._on_executed, STATE_QOS)
        self.create_service(Trigger, "~/rollback", self._on_rollback)
        self.create_timer(1.0 / float(self.p["rate_hz"]), self._tick)
        self.create_timer(float(self.p["diagnostics_period_s"]), self._publish_diagnostics)
        self._publish_version()

    # --- policy versions ---------------------------------------------------------------------

    def _activate(self, policy: Any, rec: VersionRecord, reason: str) -> None:
        runner = PolicyRunner(policy, self.arm,
                              float(self.p["executed_command_tolerance_rad"]))
        # One evaluation now so the first control tick does not pay torch's lazy set-up.
        policy.evaluate(policy.stats.mean)
        self.runner = runner
        self.record = rec
        self.reason = reason
        self.get_logger().info(
            f"active policy version {rec.version} (sha256 {rec.sha256[:12]}): {reason}")

    def _publish_version(self) -> None:
        assert self.record is not None
        msg = String()
        msg.data = json.dumps({
            "version": self.record.version,
            "sha256": self.record.sha256,
            "known_good": self.registry.known_good,
            "reason": self.reason,
        })
        self.version_pub.publish(msg)

    def _on_param_change(self, changes: dict[str, Any]) -> str | None:
        if "policy_version" in changes:
            v = int(changes["policy_version"])
            try:
                policy, rec = self.registry.load(v)
                self._activate(policy, rec, f"parameter policy_version set to {v}")
            except (ConfigError, ValueError) as exc:
                return f"policy_version = {v} refused: {exc}"
            self._publish_version()
        self.p.update(changes)
        if "executed_command_tolerance_rad" in changes and self.runner is not None:
            self.runner.own_tolerance_rad = float(changes["executed_command_tolerance_rad"])
        return None

    def _on_rollback(self, request: Trigger.Request, response: Trigger.Response
                     ) -> Trigger.Response:
        assert self.record is not None
        current = self.record.version
        try:
            policy, rec = self.registry.load(0)
            PolicyRunner(policy, self.arm)  # refuse a known-good for another arm up front
        except (ConfigError, ValueError) as exc:
            response.success = False
            response.message = f"rollback refused, staying on version {current}: {exc}"
            self.registry.log_event("node_rollback_refused", node=self.get_fully_qualified_name(),
                                    version=current, reason=response.message)
            self.get_logger().error(response.message)
            return response
        why = (
            f"rollback service call: version {current} -> known-good {rec.version}; at the call "
            f"the last disagreement was {self._last_dis:.4g} rad (max {self._max_dis:.4g}), "
            f"last OOD score {self._last_ood:.3g} (max {self._max_ood:.3g}), "
            f"node state {self._state}"
        )
        self.registry.log_event("node_rollback", node=self.get_fully_qualified_name(),
                                from_version=current, to_version=rec.version, reason=why)
        self._activate(policy, rec, why)
        self._publish_version()
        self._publish_diagnostics()
        response.success = True
        response.message = why
        return response

    # --- inputs ------------------------------------------------------------------------------

    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _bad_input(self, why: str) -> None:
        """Count an unusable input message and keep its reason for the diagnostics."""
        self._bad_messages += 1
        self._last_error = why

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            arrays = joint_state_to_arrays(msg, self.arm.joint_names)
        except MessageError as exc:
            return self._bad_input(f"joint_states: {exc}")
        if arrays.velocity is None:
            return self._bad_input("joint_states: no velocities (the policy observes them)")
        self._q, self._qd = arrays.position, arrays.velocity
        self._obs_stamp = msg.header.stamp
        self._obs_stamp_s = stamp_to_s(msg.header.stamp)
        self._obs_recv_s = self._now_s()
        self._obs_seq += 1

    def _on_executed(self, msg: Float64MultiArray) -> None:
        try:
            cmd = multiarray_to_array(msg, self.arm.n_joints)
        except MessageError as exc:
            return self._bad_input(f"forward_position_controller/commands: {exc}")
        if not np.all(np.isfinite(cmd)):
            return self._bad_input("forward_position_controller/commands: non-finite values")
        self._executed = cmd
        self._executed_recv_s = self._now_s()
        # Every executed command goes into the runner's history, so its rates come from
        # consecutive commands, not from whichever one was latest at each of our ticks.
        if self.runner is not None:
            self.runner.executed(cmd)

    def _on_target(self, msg: PointStamped) -> None:
        p = np.array([msg.point.x, msg.point.y, msg.point.z], dtype=float)
        if not np.all(np.isfinite(p)):
            return self._bad_input(f"task/target: non-finite point {p.tolist()}")
        self._target = p

    def _on_wrench(self, msg: WrenchStamped) -> None:
        self._wrench = wrench_to_array(msg)

    # --- control -----------------------------------------------------------------------------

    def _observation_age_s(self) -> float:
        """Age of the latest joint state by the configured clock, s (inf if none yet)."""
        now = self._now_s()
        age = now - self._obs_recv_s
        if self.p["stale_clock"] == "stamp":
            age = max(age, now - self._obs_stamp_s)
        return age

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            if state != STATE_RUNNING:
                self.get_logger().warning(f"publishing nothing: {state}")
            self._publish_diagnostics()

    def _tick(self) -> None:
        runner = self.runner
        assert runner is not None
        if self._q is None or self._qd is None:
            self._set_state(STATE_NO_STATE)
            return
        if self._target is None:
            self._set_state(STATE_NO_TARGET)
            return
        age = self._observation_age_s()
        if age > float(self.p["stale_timeout_s"]):
            self._stale_ticks += 1
            # Restart the integrating action from the measured position when data return.
            runner.reset()
            self._set_state(STATE_STALE)
            return
        if self._obs_seq == self._answered_seq:
            return  # no new observation since the last command; each is answered once
        if not (np.all(np.isfinite(self._q)) and np.all(np.isfinite(self._qd))):
            runner.reset()
            self._set_state(STATE_BAD_OBS)
            return
        wrench = self._wrench if runner.task.include_wrench else None
        if runner.task.include_wrench and wrench is None:
            self._set_state(STATE_NO_STATE)
            return
        if not self._pacer.may_send(self._now_s()):
            # The previous command went out less than the minimum gap ago (an overdue timer
            # firing again at once): the next tick answers, no burst.
            return
        fresh = self._now_s() - self._executed_recv_s <= float(
            self.p["executed_command_timeout_s"])
        if not fresh:
            runner.executed(None)
        t0 = time.perf_counter()
        out = runner.step(self._q, self._qd, self._target, wrench)
        self._infer_s.append(time.perf_counter() - t0)
        self._answered_seq = self._obs_seq
        stamp = self._obs_stamp
        self.cmd_pub.publish(arrays_to_joint_state(self.arm.joint_names, stamp,
                                                   position=out.joint_target_rad))
        conf = Vector3Stamped()
        conf.header.stamp = stamp
        conf.vector.x = out.disagreement_rad
        conf.vector.y = out.ood
        assert self.record is not None
        conf.vector.z = float(self.record.version)
        self.conf_pub.publish(conf)
        self._published += 1
        self._pacer.sent(self._now_s())
        self._last_dis, self._last_ood = out.disagreement_rad, out.ood
        self._max_dis = max(self._max_dis, out.disagreement_rad)
        self._max_ood = max(self._max_ood, out.ood)
        self._set_state(STATE_RUNNING)

    # --- diagnostics -------------------------------------------------------------------------

    def _publish_diagnostics(self) -> None:
        assert self.runner is not None and self.record is not None
        age = self._observation_age_s()
        level, message = OK, "running"
        if self._state == STATE_STALE:
            level = WARN
            message = (f"stale observation: latest joint_states is {age:.3f} s old "
                       f"({self.p['stale_clock']}) > stale_timeout_s "
                       f"{float(self.p['stale_timeout_s']):g}; publishing nothing")
        elif self._state == STATE_NO_STATE:
            level, message = WARN, "waiting for joint_states; publishing nothing"
        elif self._state == STATE_NO_TARGET:
            level, message = WARN, "waiting for task/target; publishing nothing"
        elif self._state == STATE_BAD_OBS:
            level, message = ERROR, "non-finite joint state; publishing nothing"
        rate = float(self.p["rate_hz"])
        if level == OK and abs(rate - self.runner.control_rate_hz) > 1e-6:
            level = WARN
            message = (f"running at {rate:g} Hz but the policy was trained at "
                       f"{self.runner.control_rate_hz:g} Hz")
        infer = np.array(self._infer_s[-1000:]) * 1e3
        values = {
            "state": self._state,
            "version": self.record.version,
            "sha256": self.record.sha256,
            "known_good": self.registry.known_good,
            "reason": self.reason,
            "observation_age_s": age if math.isfinite(age) else "never",
            "stale_timeout_s": float(self.p["stale_timeout_s"]),
            "stale_clock": self.p["stale_clock"],
            "commands_published": self._published,
            "ticks_skipped_too_soon": self._pacer.skipped,
            "stale_ticks": self._stale_ticks,
            "steps_from_executed_command": self.runner.adopted,
            "bad_messages": self._bad_messages,
            "last_error": self._last_error,
            "disagreement_rad": self._last_dis,
            "disagreement_max_rad": self._max_dis,
            "ood_score": self._last_ood,
            "ood_max": self._max_ood,
            "rate_hz": rate,
            "policy_rate_hz": self.runner.control_rate_hz,
            "inference_p50_ms": float(np.percentile(infer, 50)) if infer.size else math.nan,
            "inference_max_ms": float(infer.max()) if infer.size else math.nan,
        }
        self.diag.publish([make_status(f"{self.get_name()}: policy", level, message, values)])


def main(args: list[str] | None = None) -> int:
    """Console script entry point."""
    return spin_node(PolicyNode, args)


if __name__ == "__main__":
    sys.exit(main())


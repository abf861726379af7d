"""The in-process side of the fault suite: plays the arm, the F/T sensor and the task, records.

Separate from faults.py so that reading and writing fault records needs no rclpy.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from geometry_msgs.msg import PointStamped, WrenchStamped
from rcl_interfaces.msg import Parameter as ParameterMsg
from rcl_interfaces.msg import ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from sim2real_ros.config import file_sha256
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS
from sim2real_ros.safety.envelope import load_envelope
from sim2real_ros.safety.fault_policy import CONTROL_TOPIC

StartFn = Callable[..., "subprocess.Popen[bytes]"]
DEFAULT_CONTROL = {"disagreement_rad": 0.01, "ood": 0.5, "drift_rad_s2": 0.0, "publish": True,
                   "offset_rad": None, "nan_every": 0}


class FaultHarness(Node):
    """Plays the cell around the safety filter and injects faults on cue."""

    def __init__(self, context: Any, start: StartFn, policy_kind: str,
                 envelope_path: str | Path | None, registry_path: str | Path | None,
                 config: Any) -> None:
        super().__init__("fault_harness", context=context)
        if policy_kind not in ("scripted", "policy_node"):
            raise ValueError(f"policy must be 'scripted' or 'policy_node', got {policy_kind!r}")
        self.start_process = start
        self.policy_kind = policy_kind
        self.policy_label = "fault_policy" if policy_kind == "scripted" else "policy_node"
        self.config = config
        self.envelope_path = Path(envelope_path) if envelope_path else share_path(
            "config", "safety_envelope.yaml")
        self.registry_path = registry_path
        arm = load_arm(default_urdf())
        env = load_envelope(self.envelope_path, arm)
        self.envelope_sha256 = file_sha256(self.envelope_path)
        self.force_limit_n = env.measured.max_force_n
        self.envelope = env
        self.arm = arm
        self.joints = list(arm.joint_names)
        self.q = list(config.home_rad)
        self.q_prev = list(self.q)
        self.joint_states_on = True
        self.force_n = 0.0
        self.commands: list[tuple[float, list[float]]] = []
        self.status: list[tuple[float, dict[str, Any]]] = []
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.rollbacks = 0
        self.last_policy_arrival = math.nan
        self.policy_proc: subprocess.Popen[bytes] | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self._control = dict(DEFAULT_CONTROL)

        self.js_pub = self.create_publisher(JointState, "joint_states", STATE_QOS)
        self.wrench_pub = self.create_publisher(WrenchStamped,
                                                "force_torque_sensor_broadcaster/wrench",
                                                STATE_QOS)
        self.target_pub = self.create_publisher(PointStamped, "task/target", STATE_QOS)
        self.control_pub = self.create_publisher(String, CONTROL_TOPIC, LATCHED_QOS)
        self.create_subscription(Float64MultiArray, "forward_position_controller/commands",
                                 self._on_command, COMMAND_QOS)
        self.create_subscription(String, "safety_filter/status", self._on_status, LATCHED_QOS)
        self.create_subscription(String, "safety_filter/events", self._on_event, EVENT_QOS)
        self.create_subscription(JointState, "policy/joint_command", self._on_policy,
                                 COMMAND_QOS)
        if policy_kind == "scripted":
            # The real policy_node serves its own rollback; the scripted source has none.
            self.create_service(Trigger, "policy_node/rollback", self._on_rollback)
        self.reset_client = self.create_client(Trigger, "safety_filter/reset_estop")
        self.param_client = self.create_client(SetParameters, "safety_filter/set_parameters")
        self.create_timer(0.01, self._publish_state)
        self.create_timer(0.01, self._publish_wrench)
        self.create_timer(0.1, self._publish_target)
        self.executor_ = SingleThreadedExecutor(context=context)
        self.executor_.add_node(self)

    # -- the cell ---------------------------------------------------------------------------
    def now(self) -> float:
        """Node clock time (s), the same clock the safety filter stamps its events with."""
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_command(self, msg: Float64MultiArray) -> None:
        values = list(msg.data)
        self.commands.append((self.now(), values))
        if len(values) == len(self.q):
            # A stiff position-controlled arm: it is where it was last commanded to be.
            self.q_prev, self.q = self.q, values

    def _publish_state(self) -> None:
        if not self.joint_states_on:
            return
        msg = JointState()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.name = self.joints
        msg.position = [float(v) for v in self.q]
        msg.velocity = [0.0] * len(self.q)
        msg.effort = [0.0] * len(self.q)
        self.js_pub.publish(msg)

    def _publish_wrench(self) -> None:
        msg = WrenchStamped()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = "ft_sensor_link"
        msg.wrench.force.z = float(self.force_n)
        self.wrench_pub.publish(msg)

    def _publish_target(self) -> None:
        import numpy as np

        tool = self.arm.tool_position(np.array(self.config.home_rad))
        msg = PointStamped()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = self.arm.root_link
        msg.point.x, msg.point.y, msg.point.z = (float(tool[0]) + 0.05, float(tool[1]),
                                                 float(tool[2]))
        self.target_pub.publish(msg)

    def _on_status(self, msg: String) -> None:
        self.status.append((self.now(), json.loads(msg.data)))

    def _on_event(self, msg: String) -> None:
        self.events.append((self.now(), json.loads(msg.data)))

    def _on_policy(self, msg: JointState) -> None:
        self.last_policy_arrival = self.now()

    def _on_rollback(self, req: Trigger.Request, resp: Trigger.Response) -> Trigger.Response:
        self.rollbacks += 1
        resp.success = True
        resp.message = f"fault harness: rollback #{self.rollbacks} accepted"
        return resp

    # -- processes --------------------------------------------------------------------------
    def launch(self) -> None:
        """Start the safety filter, the baseline and the policy process."""
        c = self.config
        env_arg = f"envelope_file:={self.envelope_path}"
        self.procs.append(self.start_process("sim2real_ros.safety.node", ros_args=[
            "-p", env_arg, "-p", "rollout_stage:=full",
            "-p", f"calm_period_s:={c.calm_period_s}",
            "-p", f"command_timeout_s:={c.command_timeout_s}",
            "-p", f"baseline_timeout_s:={c.command_timeout_s}",
            "-p", f"confidence_timeout_s:={2 * c.command_timeout_s}",
            "-p", f"max_command_age_s:={3 * c.command_timeout_s}",
            "-p", f"max_baseline_age_s:={3 * c.command_timeout_s}",
            "-p", f"max_state_age_s:={3 * c.state_timeout_s}",
            # Only the drift scenario is meant to trigger the monitor (by interventions).
            "-p", "monitor_max_fallback_rate:=1.0",
            "-p", f"state_timeout_s:={c.state_timeout_s}",
            "-p", f"control_rate_hz:={1.0 / c.period_s}",
            "-p", f"monitor_window_s:={c.monitor_window_s}",
            "-p", f"monitor_max_intervention_rate:={c.monitor_max_intervention_rate}",
            "-p", "monitor_cooldown_s:=1.0", "-p", "rollback_retry_period_s:=0.2",
            # With the real policy only the stream's death is under test (the confidence gate
            # is the scripted uncertainty scenario's); its OOD score depends on this stand-in
            # arm, not on the filter.
            "-p", f"require_confidence:={'true' if self.policy_kind == 'scripted' else 'false'}"],
            name="safety_filter"))
        self.procs.append(self.start_process("sim2real_ros.safety.baseline_node", ros_args=[
            "-p", env_arg, "-p", "mode:=hold"], name="baseline_controller"))
        if self.policy_kind == "scripted":
            # A slow small wave: visibly a policy, but a scheduling hiccup of a loaded machine
            # never makes it jump by more than the monitor's 1 mm.
            self.policy_proc = self.start_process("sim2real_ros.safety.fault_policy", ros_args=[
                "-p", "amplitude_rad:=0.01", "-p", "frequency_hz:=0.2"], name="fault_policy")
        else:
            self.policy_proc = self.start_process("sim2real_ros.policy.node", ros_args=[
                "-p", f"registry_path:={self.registry_path}", "-p", "policy_version:=2",
                # Its own staleness check must not be tighter than the suite's timing allows.
                "-p", f"stale_timeout_s:={3 * self.config.state_timeout_s}"],
                name="policy_node")
        self.procs.append(self.policy_proc)
        self.set_control()

    def kill_policy(self) -> int:
        """SIGKILL the policy process (kill -9) and reap it; return its pid."""
        assert self.policy_proc is not None
        pid = self.policy_proc.pid
        os.kill(pid, signal.SIGKILL)
        self.policy_proc.wait(timeout=5.0)
        return pid

    def close(self) -> None:
        """Remove the harness from its executor and destroy it."""
        self.executor_.remove_node(self)
        self.destroy_node()

    # -- spinning and waiting ------------------------------------------------------------------
    def spin_for(self, seconds: float) -> None:
        """Spin the harness for a while (wall time)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor_.spin_once(timeout_sec=0.005)

    def spin_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Spin until predicate() holds or the timeout passes; return predicate()."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if predicate():
                return True
            self.executor_.spin_once(timeout_sec=0.005)
        return predicate()

    def wait_status(self, pred: Callable[[dict[str, Any]], bool], timeout_s: float,
                    after: float) -> tuple[float, dict[str, Any]] | None:
        """Return the first status after `after` that satisfies pred (waiting up to timeout)."""
        def find() -> tuple[float, dict[str, Any]] | None:
            return next(((t, s) for t, s in self.status if t >= after and pred(s)), None)

        self.spin_until(lambda: find() is not None, timeout_s)
        return find()

    def wait_event(self, pred: Callable[[dict[str, Any]], bool], timeout_s: float,
                   after: float) -> dict[str, Any] | None:
        """Return the first event after `after` (filter time) that satisfies pred."""
        def find() -> dict[str, Any] | None:
            return next((e for t, e in self.events if e["t"] >= after - 0.05 and pred(e)), None)

        self.spin_until(lambda: find() is not None, timeout_s)
        return find()

    def last_status(self) -> dict[str, Any] | None:
        """Return the newest status record."""
        return self.status[-1][1] if self.status else None

    def max_command_gap(self, t0: float, t1: float) -> float:
        """Largest time between consecutive arm commands received in [t0, t1] (s)."""
        ts = [t for t, _ in self.commands if t0 - 0.05 <= t <= t1]
        return max((b - a for a, b in zip(ts, ts[1:])), default=math.inf)

    def why_not(self) -> str:
        """Describe why the policy is not driving (for a failed set-up)."""
        st = self.last_status()
        return "no status from safety_filter" if st is None else json.dumps(st, sort_keys=True)

    # -- controls -----------------------------------------------------------------------------
    def set_control(self, **changes: Any) -> None:
        """Send the scripted policy its fault controls (latched)."""
        self._control.update(changes)
        self.control_pub.publish(String(data=json.dumps(self._control)))

    def _call(self, client: Any, request: Any, timeout_s: float = 5.0) -> Any:
        if not client.wait_for_service(timeout_sec=timeout_s):
            return None
        fut = client.call_async(request)
        self.spin_until(fut.done, timeout_s)
        return fut.result() if fut.done() else None

    def reset_estop(self) -> tuple[bool, str] | None:
        """Call safety_filter/reset_estop; return (success, message) or None on no answer."""
        resp = self._call(self.reset_client, Trigger.Request())
        return None if resp is None else (bool(resp.success), str(resp.message))

    def set_stage(self, stage: str) -> bool:
        """Set safety_filter's rollout_stage through its parameter service."""
        req = SetParameters.Request()
        req.parameters = [ParameterMsg(name="rollout_stage", value=ParameterValue(
            type=ParameterType.PARAMETER_STRING, string_value=stage))]
        resp = self._call(self.param_client, req)
        return resp is not None and all(r.successful for r in resp.results)

    def ensure_policy_drives(self) -> bool:
        """Undo earlier faults (controls, e-stop, stage) and wait until the policy drives."""
        self.joint_states_on = True
        self.force_n = 0.0
        if self.policy_kind == "scripted":
            self.set_control(**DEFAULT_CONTROL)
        first = not self.status
        self.spin_until(lambda: bool(self.status), self.config.startup_timeout_s)
        st = self.last_status()
        if st is None:
            return False
        if st["estop"]:
            self.spin_for(0.1)
            self.reset_estop()
        if st["rollout_stage"] != "full":
            self.set_stage("full")
            self.wait_status(lambda s: s["rollout_stage"] == "full", 5.0, after=self.now() - 1.0)
        slow_start = first or self.policy_kind != "scripted"
        timeout = self.config.startup_timeout_s if slow_start else 10.0
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ok = self.spin_until(lambda: self.last_status() is not None
                                 and self.last_status()["source"] == "policy"
                                 and self.now() - self.last_policy_arrival < 0.1,
                                 end - time.monotonic())
            if not ok:
                return False
            # Driving steadily (not a blip between two jitter-induced fallbacks)?
            self.spin_for(0.2)
            if self.last_status()["source"] == "policy":
                return True
        return False

"""A listening node that feeds ProbeCore from a running graph (demo, graph tests, benchmark).

It only subscribes (and may set parameters or call services for scripted faults, through the
demo). Arrival times come from the node's clock, so on a wall-clock graph they compare with the
header stamps the publishers set from theirs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PointStamped, Vector3Stamped
from rclpy.context import Context
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String

from sim2real_ros.adapters.probe import ProbeCore
from sim2real_ros.graph import DRIVER_TOPICS
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import ArmModel, load_arm
from sim2real_ros.ros.convert import MessageError, joint_state_to_arrays, stamp_to_s
from sim2real_ros.ros.diagnostics import status_level, status_values
from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS

# Latched JSON records (topic -> key) and periodic JSON reports; the newest of each is kept in
# `latched`, every one with its time in `latched_history`.
LATCHED = {
    "safety_filter/status": "safety_status",
    "policy_node/active_version": "policy_version",
    "sim_bridge/randomization": "randomization",
    "shadow_comparator/recommendation": "shadow_recommendation",
}
REPORTS = {
    "shadow_comparator/report": "shadow_report",
}


class GraphProbe(Node):
    """Subscribe to the graph's contract topics and keep what the reports need."""

    def __init__(self, name: str = "graph_probe", context: Context | None = None,
                 topics: dict[str, str] | None = None, arm: ArmModel | None = None,
                 fk_every: int = 5, reach_tolerance_m: float = 0.02) -> None:
        super().__init__(name, context=context)
        t = {**DRIVER_TOPICS, **(topics or {})}
        self.core = ProbeCore(reach_tolerance_m=reach_tolerance_m)
        self.arm = arm or load_arm(default_urdf())
        self.fk_every = max(1, fk_every)
        self._n_states = 0
        self.last_q: np.ndarray | None = None
        self.latched: dict[str, dict[str, Any]] = {}
        self.latched_history: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        # name -> (t_rel, level, message, values) of the newest /diagnostics status.
        self.diagnostics: dict[str, tuple[float, int, str, dict[str, str]]] = {}
        self.diagnostics_history: dict[str, list[tuple[float, int, dict[str, str]]]] = {}
        self.topics_seen: set[str] = set()
        self.create_subscription(JointState, t["joint_states"], self._on_state, STATE_QOS)
        self.create_subscription(Float64MultiArray, t["position_command"], self._on_command,
                                 COMMAND_QOS)
        for source in ("policy", "baseline"):
            self.create_subscription(
                JointState, f"{source}/joint_command",
                lambda m, s=source: self._on_source(s, m), COMMAND_QOS)
        self.create_subscription(Vector3Stamped, "policy/confidence", self._on_confidence,
                                 COMMAND_QOS)
        self.create_subscription(PointStamped, "task/target", self._on_target, STATE_QOS)
        self.create_subscription(String, "safety_filter/events", self._on_event, EVENT_QOS)
        for topic, key in LATCHED.items():
            self.create_subscription(
                String, topic, lambda m, tp=topic, k=key: self._on_latched(tp, k, m),
                LATCHED_QOS)
        for topic, key in REPORTS.items():
            self.create_subscription(
                String, topic, lambda m, tp=topic, k=key: self._on_latched(tp, k, m), STATE_QOS)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics,
                                 STATE_QOS)

    def now_s(self) -> float:
        """Return the node clock in seconds."""
        return self.get_clock().now().nanoseconds * 1e-9

    def t_rel(self) -> float:
        """Return seconds since the first message heard (0 before that)."""
        return self.now_s() - self.core.t0_s if self.core.t0_s is not None else 0.0

    def _on_state(self, msg: JointState) -> None:
        self.topics_seen.add("joint_states")
        now = self.now_s()
        self._n_states += 1
        tool = None
        if self._n_states % self.fk_every == 0:
            try:
                arrays = joint_state_to_arrays(msg, self.arm.joint_names)
            except MessageError:
                arrays = None
            if arrays is not None and arrays.position is not None:
                self.last_q = arrays.position
                tool = self.arm.tool_position(arrays.position)
        self.core.on_joint_state(now, stamp_to_s(msg.header.stamp), tool)

    def _on_command(self, _msg: Float64MultiArray) -> None:
        self.topics_seen.add("arm_command")
        self.core.on_arm_command(self.now_s())

    def _on_source(self, source: str, msg: JointState) -> None:
        self.topics_seen.add(f"{source}/joint_command")
        self.core.on_source_command(source, self.now_s(), stamp_to_s(msg.header.stamp))

    def _on_confidence(self, msg: Vector3Stamped) -> None:
        self.topics_seen.add("policy/confidence")
        self.core.on_confidence(self.now_s(), float(msg.vector.x), float(msg.vector.y))

    def _on_target(self, msg: PointStamped) -> None:
        self.topics_seen.add("task/target")
        self.core.on_target(self.now_s(), (msg.point.x, msg.point.y, msg.point.z))

    def _on_event(self, msg: String) -> None:
        self.topics_seen.add("safety_filter/events")
        try:
            event = json.loads(msg.data)
        except json.JSONDecodeError:
            event = {"kind": "unparsable", "raw": msg.data}
        self.core.on_event(self.now_s(), event if isinstance(event, dict) else {"raw": event})

    def _on_latched(self, topic: str, key: str, msg: String) -> None:
        self.topics_seen.add(topic)
        try:
            data = json.loads(msg.data)
        except json.JSONDecodeError:
            return
        if not isinstance(data, dict):
            return
        now = self.now_s()
        self.latched[key] = data
        self.latched_history.setdefault(key, []).append((self.t_rel(), data))
        if key == "safety_status" and isinstance(data.get("source"), str):
            self.core.on_active_source(now, data["source"])

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        t = self.t_rel()
        for status in msg.status:
            values = status_values(status)
            level = status_level(status)
            self.diagnostics[status.name] = (t, level, status.message, values)
            self.diagnostics_history.setdefault(status.name, []).append((t, level, values))

    def diagnostics_matching(self, fragment: str) -> dict[str, dict[str, str]]:
        """Return the newest values of every /diagnostics status whose name has `fragment`."""
        return {n: v[3] for n, v in self.diagnostics.items() if fragment in n}


def spin_for(executor: Any, duration_s: float, step_s: float = 0.02) -> None:
    """Spin `executor` for `duration_s` seconds of wall time."""
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        executor.spin_once(timeout_sec=min(step_s, max(0.0, deadline - time.monotonic())))

"""A listening node for `sim2real audit --live`: latency, unit id, wrapper status, at-rest noise.

It only subscribes. Arrival times come from the node's clock, so on a wall-clock graph they are
comparable with the header stamps the publishers set from theirs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import WrenchStamped
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String

from sim2real_ros.audit.evidence import LatencyMeasurement, LiveGraphEvidence
from sim2real_ros.audit.latency import (
    ANSWER_TOPICS,
    COMMAND_TOPIC,
    STATE_TOPIC,
    LatencyPairer,
    answer_source,
)
from sim2real_ros.ros.convert import stamp_to_ns, wrench_to_array
from sim2real_ros.ros.qos import COMMAND_QOS, LATCHED_QOS, STATE_QOS

LATCHED_TOPICS = {
    "safety_filter/status": "safety_status",
    "sim_bridge/randomization": "randomization_draw",
    "policy_node/active_version": "policy_version",
}


class AuditProbe(Node):
    """Subscribe to the graph's state, command and status topics and keep what the audit needs."""

    def __init__(self, name: str = "audit_probe", context: Context | None = None,
                 keep_samples: int = 200_000) -> None:
        super().__init__(name, context=context)
        self.pairer = LatencyPairer()
        self.latched: dict[str, dict[str, Any]] = {}
        self.unit_id: str | None = None
        self.topics_seen: set[str] = set()
        self.keep_samples = keep_samples
        self.state_t_s: list[float] = []
        self.state_names: list[str] | None = None
        self.state_position: list[np.ndarray] = []
        self.state_velocity: list[np.ndarray] = []
        self.wrench_t_s: list[float] = []
        self.wrench: list[np.ndarray] = []
        self.create_subscription(JointState, STATE_TOPIC, self._on_state, STATE_QOS)
        for topic in ANSWER_TOPICS:
            self.create_subscription(
                JointState, topic, lambda m, t=topic: self._on_answer(t, m), COMMAND_QOS)
        self.create_subscription(Float64MultiArray, COMMAND_TOPIC, self._on_command, COMMAND_QOS)
        self.create_subscription(WrenchStamped, "force_torque_sensor_broadcaster/wrench",
                                 self._on_wrench, STATE_QOS)
        for topic, key in LATCHED_TOPICS.items():
            self.create_subscription(
                String, topic, lambda m, t=topic, k=key: self._on_latched(t, k, m), LATCHED_QOS)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _on_state(self, msg: JointState) -> None:
        self.topics_seen.add(STATE_TOPIC)
        now = self._now_ns()
        stamp = stamp_to_ns(msg.header.stamp)
        self.pairer.add_state(now, stamp)
        if len(self.state_t_s) >= self.keep_samples or not msg.position:
            return
        if self.state_names is None:
            self.state_names = list(msg.name)
        if list(msg.name) != self.state_names or len(msg.velocity) not in (0, len(msg.name)):
            return
        self.state_t_s.append(stamp * 1e-9)
        self.state_position.append(np.asarray(msg.position, dtype=float))
        vel = msg.velocity if msg.velocity else [np.nan] * len(msg.name)
        self.state_velocity.append(np.asarray(vel, dtype=float))

    def _on_answer(self, topic: str, msg: JointState) -> None:
        self.topics_seen.add(topic)
        self.pairer.add_answer(self._now_ns(), stamp_to_ns(msg.header.stamp),
                               answer_source(topic))

    def _on_command(self, msg: Float64MultiArray) -> None:
        self.topics_seen.add(COMMAND_TOPIC)
        self.pairer.add_command(self._now_ns())

    def _on_wrench(self, msg: WrenchStamped) -> None:
        self.topics_seen.add("force_torque_sensor_broadcaster/wrench")
        if len(self.wrench_t_s) < self.keep_samples:
            self.wrench_t_s.append(stamp_to_ns(msg.header.stamp) * 1e-9)
            self.wrench.append(wrench_to_array(msg))

    def _on_latched(self, topic: str, key: str, msg: String) -> None:
        self.topics_seen.add(topic)
        try:
            data = json.loads(msg.data)
        except json.JSONDecodeError:
            self.get_logger().warning(f"{topic}: not JSON, ignored")
            return
        if isinstance(data, dict):
            self.latched[key] = data
            if key == "safety_status":
                self.pairer.set_status(data)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        # A node that knows which unit it drives (driver, recorder, sim bridge) reports it as
        # the key `unit_id` in its diagnostic status.
        for status in msg.status:
            for kv in status.values:
                if kv.key == "unit_id" and kv.value:
                    self.unit_id = kv.value

    def reset_measurements(self) -> None:
        """Forget latency pairs and samples (the latched records and the unit id stay)."""
        self.pairer = LatencyPairer(driving=self.pairer.driving)
        self.state_t_s.clear()
        self.state_position.clear()
        self.state_velocity.clear()
        self.wrench_t_s.clear()
        self.wrench.clear()

    def latency(self, source: str = "live graph") -> LatencyMeasurement | None:
        """Return the latency measured so far."""
        return self.pairer.measurement(source)

    def evidence(self, duration_s: float) -> LiveGraphEvidence:
        """Return what the graph reported while the probe listened."""
        return LiveGraphEvidence(
            duration_s=duration_s,
            unit_id=self.unit_id,
            safety_status=self.latched.get("safety_status"),
            randomization_draw=self.latched.get("randomization_draw"),
            topics_seen=tuple(sorted(self.topics_seen)),
        )

    def joint_samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Return (t_s, position, velocity) of the joint_states received, or None."""
        if len(self.state_t_s) < 2:
            return None
        return (np.asarray(self.state_t_s), np.vstack(self.state_position),
                np.vstack(self.state_velocity))


def listen(duration_s: float, context: Context | None = None, discovery_timeout_s: float = 5.0
           ) -> AuditProbe:
    """Spin a probe for `duration_s` seconds of wall time in its own executor; return it.

    First wait (up to `discovery_timeout_s`) until the state, answer and arm command topics
    have publishers the probe has discovered: on a loaded host DDS discovery takes seconds,
    and pairs missed while a subscription is still unmatched would shorten the window.
    """
    probe = AuditProbe(context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(probe)
    topics = (STATE_TOPIC, COMMAND_TOPIC, ANSWER_TOPICS[0])

    def spin_for(seconds: float, until: object = None) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until is not None and until():  # type: ignore[operator]
                return
            executor.spin_once(timeout_sec=min(0.05, max(0.0, deadline - time.monotonic())))

    try:
        spin_for(discovery_timeout_s,
                 lambda: all(probe.count_publishers(t) > 0 for t in topics))
        spin_for(0.3)  # let the matched subscriptions deliver before counting
        probe.reset_measurements()
        spin_for(duration_s)
    finally:
        executor.remove_node(probe)
        executor.shutdown()
    return probe

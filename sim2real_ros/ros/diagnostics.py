"""Health on /diagnostics (diagnostic_msgs/DiagnosticArray), as every node of ours reports it."""

from __future__ import annotations

from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node

from sim2real_ros.ros.qos import STATE_QOS


def _as_int(level: int | bytes) -> int:
    return level[0] if isinstance(level, (bytes, bytearray)) else int(level)


# Plain ints for comparisons; the message field itself is a byte in this binding.
OK = _as_int(DiagnosticStatus.OK)
WARN = _as_int(DiagnosticStatus.WARN)
ERROR = _as_int(DiagnosticStatus.ERROR)
STALE = _as_int(DiagnosticStatus.STALE)


def make_status(
    name: str, level: int, message: str, values: dict[str, Any], hardware_id: str = ""
) -> DiagnosticStatus:
    """Build one DiagnosticStatus; values are stringified (floats with 6 significant digits)."""
    st = DiagnosticStatus()
    st.level = bytes([_as_int(level)])
    st.name = name
    st.message = message
    st.hardware_id = hardware_id
    st.values = [
        KeyValue(key=str(k), value=f"{v:.6g}" if isinstance(v, float) else str(v))
        for k, v in values.items()
    ]
    return st


def status_values(status: DiagnosticStatus) -> dict[str, str]:
    """Return a status's key/values as a dict."""
    return {kv.key: kv.value for kv in status.values}


def status_level(status: DiagnosticStatus) -> int:
    """Return a status level as int, whatever the message binding stores."""
    return _as_int(status.level)


class DiagnosticsPublisher:
    """Publishes one node's statuses on /diagnostics."""

    def __init__(self, node: Node, topic: str = "/diagnostics") -> None:
        self._node = node
        self._pub = node.create_publisher(DiagnosticArray, topic, STATE_QOS)

    def publish(self, statuses: list[DiagnosticStatus]) -> None:
        """Send the statuses stamped with the node's clock."""
        msg = DiagnosticArray()
        msg.header.stamp = self._node.get_clock().now().to_msg()
        msg.status = statuses
        self._pub.publish(msg)

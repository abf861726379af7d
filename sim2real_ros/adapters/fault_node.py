"""Node `fault_injector`: forwards joint_states to one node, glitching them on request.

Subscribes `joint_states` (sensor_msgs/JointState, STATE_QOS) and publishes
`fault_injector/joint_states` (same type and QoS, same header and names) for the node whose
input it stands in front of (the demo remaps the policy's `joint_states` there). While
`position_offset_rad` or `velocity_noise_rad_s` is non-zero (settable at run time), positions
are offset and velocities get seeded Gaussian noise; otherwise messages pass unchanged. Not part
of any deployed graph: only scripted fault injection (the demo) adds it.
"""

from __future__ import annotations

import sys
from typing import Any

from rclpy.node import Node
from sensor_msgs.msg import JointState

from sim2real_ros.adapters.faults import ObservationFault, ObservationFaultInjector
from sim2real_ros.ros.diagnostics import OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import STATE_QOS

NODE_NAME = "fault_injector"
OUTPUT_TOPIC = "fault_injector/joint_states"

PARAMS = [
    ParamSpec("position_offset_rad", 0.0,
              "Offset added to every joint position while non-zero (rad).", low=-3.2, high=3.2),
    ParamSpec("velocity_noise_rad_s", 0.0,
              "Standard deviation of Gaussian noise added to joint velocities (rad/s).",
              low=0.0, high=100.0),
    ParamSpec("seed", 0, "Seed of the velocity noise.", low=0, high=2**31 - 1, read_only=True),
    ParamSpec("diagnostics_period_s", 1.0, "Period of the /diagnostics report (s).",
              low=0.05, high=60.0),
]


class FaultInjector(Node):
    """Forward joint_states, applying the configured observation fault."""

    def __init__(self, **node_kwargs: Any) -> None:
        super().__init__(NODE_NAME, **node_kwargs)
        values = declare_params(self, PARAMS, on_change=self._on_change)
        self._injector = ObservationFaultInjector(int(values["seed"]))
        self._injector.fault = ObservationFault(values["position_offset_rad"],
                                                values["velocity_noise_rad_s"])
        self._forwarded = 0
        self._pub = self.create_publisher(JointState, OUTPUT_TOPIC, STATE_QOS)
        self.create_subscription(JointState, "joint_states", self._on_state, STATE_QOS)
        self._diag = DiagnosticsPublisher(self)
        self.create_timer(values["diagnostics_period_s"], self._report)

    def _on_change(self, changes: dict[str, Any]) -> str | None:
        f = self._injector.fault
        try:
            new = ObservationFault(
                float(changes.get("position_offset_rad", f.position_offset_rad)),
                float(changes.get("velocity_noise_rad_s", f.velocity_noise_rad_s)))
        except ValueError as exc:
            return str(exc)
        self._injector.fault = new
        self.get_logger().warning(
            f"observation fault {'ON' if new.active else 'off'}: offset "
            f"{new.position_offset_rad} rad, velocity noise {new.velocity_noise_rad_s} rad/s")
        return None

    def _on_state(self, msg: JointState) -> None:
        self._forwarded += 1
        if self._injector.fault.active and msg.position:
            q, qd = self._injector.apply(msg.position, msg.velocity if msg.velocity else None)
            msg.position = q.tolist()
            if qd is not None:
                msg.velocity = list(map(float, qd))
        self._pub.publish(msg)

    def _report(self) -> None:
        f = self._injector.fault
        self._diag.publish([make_status(
            f"{NODE_NAME}: observation fault", WARN if f.active else OK,
            "fault active" if f.active else "passing through",
            {"position_offset_rad": f.position_offset_rad,
             "velocity_noise_rad_s": f.velocity_noise_rad_s,
             "forwarded": self._forwarded, "faulted": self._injector.applied})])


def main(args: list[str] | None = None) -> int:
    """Run the fault injector node."""
    return spin_node(FaultInjector, args)


if __name__ == "__main__":
    sys.exit(main())

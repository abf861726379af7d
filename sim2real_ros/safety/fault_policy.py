"""Node `fault_policy`: a scripted command source that plays a (mis)behaving policy on cue.

Fault injection needs a policy process whose failures can be dialled in: ensemble disagreement
and OOD spikes, a drifting command, a stream that stops. This node publishes what a policy node
publishes (`policy/joint_command` answering the newest `joint_states` stamp, `policy/confidence`)
from a fixed script: a slow sine around `home_rad` (inside every envelope limit), plus whatever
the latched JSON on `fault_policy/control` asks for:
{"disagreement_rad": float, "ood": float, "drift_rad_s2": float, "publish": bool,
 "offset_rad": [per-joint offsets] or null, "nan_every": n (every n-th command carries a NaN)}.
It is a test instrument for the safety filter (used by `sim2real safety fault-suite`), not a
controller; it shares no code with the policy room.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from geometry_msgs.msg import Vector3Stamped
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS, LATCHED_QOS, STATE_QOS

NODE_NAME = "fault_policy"
CONTROL_TOPIC = "fault_policy/control"
CONTROL_KEYS = ("disagreement_rad", "ood", "drift_rad_s2", "publish", "offset_rad",
                "nan_every")

PARAMS = [
    ParamSpec("urdf_path", "", "URDF of the arm; '' = the shipped arm.", read_only=True),
    ParamSpec("rate_hz", 100.0, "Command rate (Hz).", low=1.0, high=1000.0, read_only=True),
    ParamSpec("home_rad", [0.0, 0.0, 1.6, 0.0, 1.5, 0.0], "Centre of the scripted motion (rad).",
              param_type=Parameter.Type.DOUBLE_ARRAY, read_only=True),
    ParamSpec("amplitude_rad", 0.05, "Amplitude of the scripted sine (rad).", low=0.0, high=1.0,
              read_only=True),
    ParamSpec("frequency_hz", 0.25, "Frequency of the scripted sine (Hz).", low=0.0, high=5.0,
              read_only=True),
]


class FaultPolicy(Node):
    """Publishes a scripted policy stream whose confidence and drift are set on a topic."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.p = declare_params(self, PARAMS)
        arm = load_arm(self.p["urdf_path"] or str(default_urdf()))
        self.joints = list(arm.joint_names)
        self.home = list(self.p["home_rad"])
        if len(self.home) != len(self.joints):
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "home_rad", self.home,
                              f"{len(self.joints)} values")
        self.control: dict[str, Any] = {"disagreement_rad": 0.01, "ood": 0.5,
                                        "drift_rad_s2": 0.0, "publish": True,
                                        "offset_rad": None, "nan_every": 0}
        self._count = 0
        self._stamp = None
        self._t0: float | None = None
        self._drift_t0: float | None = None
        self.cmd_pub = self.create_publisher(JointState, "policy/joint_command", COMMAND_QOS)
        self.conf_pub = self.create_publisher(Vector3Stamped, "policy/confidence", COMMAND_QOS)
        self.create_subscription(JointState, "joint_states", self._on_js, STATE_QOS)
        self.create_subscription(String, CONTROL_TOPIC, self._on_control, LATCHED_QOS)
        self.create_timer(1.0 / self.p["rate_hz"], self._on_timer)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_js(self, msg: JointState) -> None:
        self._stamp = msg.header.stamp

    def _on_control(self, msg: String) -> None:
        try:
            data = json.loads(msg.data)
        except json.JSONDecodeError:
            self.get_logger().warning(f"ignoring control that is not JSON: {msg.data!r}")
            return
        for k in CONTROL_KEYS:
            if k in data:
                self.control[k] = data[k]
        self._drift_t0 = self._now() if self.control["drift_rad_s2"] else None
        self.get_logger().info(f"control: {self.control}")

    def _on_timer(self) -> None:
        if self._stamp is None or not self.control["publish"]:
            return
        now = self._now()
        if self._t0 is None:
            self._t0 = now
        t = now - self._t0
        amp, f = self.p["amplitude_rad"], self.p["frequency_hz"]
        # 1 - cos starts at rest, so the stream passes the filter unchanged from the start.
        wave = amp * (1.0 - math.cos(2.0 * math.pi * f * t))
        drift = 0.0
        if self._drift_t0 is not None:
            drift = 0.5 * float(self.control["drift_rad_s2"]) * (now - self._drift_t0) ** 2
        cmd = JointState()
        cmd.header.stamp = self._stamp
        cmd.name = self.joints
        offset = self.control["offset_rad"] or [0.0] * len(self.home)
        position = [h + wave + drift + float(o) for h, o in zip(self.home, offset)]
        self._count += 1
        nan_every = int(self.control["nan_every"] or 0)
        if nan_every and self._count % nan_every == 0:
            position[0] = math.nan
        cmd.position = position
        self.cmd_pub.publish(cmd)
        conf = Vector3Stamped()
        conf.header.stamp = self._stamp
        conf.vector.x = float(self.control["disagreement_rad"])
        conf.vector.y = float(self.control["ood"])
        self.conf_pub.publish(conf)


def main(args: list[str] | None = None) -> int:
    """Run the fault_policy node."""
    return spin_node(FaultPolicy, args)


if __name__ == "__main__":
    sys.exit(main())

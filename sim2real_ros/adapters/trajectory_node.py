"""Node `trajectory_adapter`: forward_position_controller commands -> joint_trajectory_controller.

Subscribes `forward_position_controller/commands` (std_msgs/Float64MultiArray, as the arm would;
the graph remaps it to `trajectory_adapter/commands`) and publishes
`joint_trajectory_controller/joint_trajectory` (trajectory_msgs/JointTrajectory), both with the
command QoS ros2_control uses, plus its counters on /diagnostics.
"""

from __future__ import annotations

import sys
from typing import Any

from builtin_interfaces.msg import Duration
from rclpy.node import Node
from rclpy.parameter import Parameter
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from sim2real_ros.adapters.trajectory import TrajectoryStreamer
from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.diagnostics import OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS

NODE_NAME = "trajectory_adapter"

PARAMS = [
    ParamSpec("time_from_start_s", 0.02,
              "Time after arrival at which each streamed point is to be reached (s); one "
              "control period of the trajectory controller or more.", low=0.001, high=1.0),
    ParamSpec("joints", [""],
              "Joint names in the order of the incoming Float64MultiArray (the safety filter's "
              "`joints`); [''] = the URDF's movable joints in file order.",
              param_type=Parameter.Type.STRING_ARRAY, read_only=True),
    ParamSpec("urdf_path", "", "URDF the default joint names come from; '' = the shipped arm.",
              read_only=True),
    ParamSpec("diagnostics_period_s", 1.0, "Period of the /diagnostics report (s).",
              low=0.05, high=60.0),
]


def _to_duration(t_s: float) -> Duration:
    ns = int(round(t_s * 1e9))
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


class TrajectoryAdapter(Node):
    """Stream every position command as a one-point JointTrajectory."""

    def __init__(self, **node_kwargs: Any) -> None:
        # node_kwargs (context, parameter_overrides) let tests run the node in-process.
        super().__init__(NODE_NAME, **node_kwargs)
        values = declare_params(self, PARAMS, on_change=self._on_change)
        joints = [j for j in values["joints"] if j]
        if not joints:
            path = values["urdf_path"] or str(default_urdf())
            joints = load_arm(path).joint_names
        try:
            self._streamer = TrajectoryStreamer(joints, values["time_from_start_s"])
        except ValueError as exc:
            raise ConfigError(f"ROS parameters of /{NODE_NAME}", "joints", joints,
                              str(exc)) from exc
        self._pub = self.create_publisher(
            JointTrajectory, "joint_trajectory_controller/joint_trajectory", COMMAND_QOS)
        self.create_subscription(
            Float64MultiArray, "forward_position_controller/commands", self._on_command,
            COMMAND_QOS)
        self._diag = DiagnosticsPublisher(self)
        self.create_timer(values["diagnostics_period_s"], self._report)
        self.get_logger().info(
            f"streaming {len(joints)} joints as one-point trajectories "
            f"(time_from_start {values['time_from_start_s']:.3f} s)")

    def _on_change(self, changes: dict[str, object]) -> str | None:
        if "time_from_start_s" in changes:
            value = changes["time_from_start_s"]
            self._streamer.time_from_start_s = float(value)  # type: ignore[arg-type]
        return None

    def _on_command(self, msg: Float64MultiArray) -> None:
        point = self._streamer.convert(list(msg.data))
        if point is None:
            self.get_logger().warning(
                f"dropped command: {self._streamer.stats.last_reject_reason}",
                throttle_duration_sec=1.0)
            return
        traj = JointTrajectory()
        # A zero stamp means "start now" to joint_trajectory_controller.
        traj.joint_names = list(point.joint_names)
        traj.points = [JointTrajectoryPoint(
            positions=list(point.positions_rad),
            time_from_start=_to_duration(point.time_from_start_s))]
        self._pub.publish(traj)

    def _report(self) -> None:
        s = self._streamer.stats
        level = WARN if s.rejected else OK
        msg = f"{s.rejected} malformed commands dropped" if s.rejected else "streaming"
        self._diag.publish([make_status(
            f"{NODE_NAME}: command adapter", level, msg,
            {"received": s.received, "forwarded": s.forwarded, "rejected": s.rejected,
             "last_reject_reason": s.last_reject_reason,
             "time_from_start_s": self._streamer.time_from_start_s})])


def main(args: list[str] | None = None) -> int:
    """Run the trajectory adapter node."""
    return spin_node(TrajectoryAdapter, args)


if __name__ == "__main__":
    sys.exit(main())

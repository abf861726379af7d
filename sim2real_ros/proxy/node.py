"""Node `proxy_arm`: the MuJoCo proxy arm behind exactly the topics a ros2_control cell offers.

Subscribes `forward_position_controller/commands` (std_msgs/Float64MultiArray), or
`joint_trajectory_controller/joint_trajectory` (trajectory_msgs/JointTrajectory) when
`command_interface` says that controller is the active one; publishes `joint_states`
(sensor_msgs/JointState), `force_torque_sensor_broadcaster/wrench` (geometry_msgs/WrenchStamped)
and /diagnostics, with the QoS ros2_control uses. It runs on the wall clock: the plant is
advanced to "now" on every publish tick and before every command. The unit file's hidden values
never leave this process; /diagnostics reports the unit id as hardware_id, as a real driver
reports the serial number of the arm it drives.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from geometry_msgs.msg import WrenchStamped
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.proxy.plant import FT_LINK, ProxyPlant
from sim2real_ros.proxy.realtime import WallClockSync
from sim2real_ros.proxy.trajectory import TrajectoryFollower
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import (
    MessageError,
    array_to_wrench,
    arrays_to_joint_state,
    multiarray_to_array,
    stamp_to_s,
)
from sim2real_ros.ros.diagnostics import OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS, STATE_QOS

NODE_NAME = "proxy_arm"
COMMAND_INTERFACES = ("forward_position_controller", "joint_trajectory_controller")
POSITION_TOPIC = "forward_position_controller/commands"
TRAJECTORY_TOPIC = "joint_trajectory_controller/joint_trajectory"
JOINT_STATES_TOPIC = "joint_states"
WRENCH_TOPIC = "force_torque_sensor_broadcaster/wrench"

PARAMS = [
    ParamSpec("unit_file", "",
              "Unit file with the proxy's hidden perturbations (config/proxy/unit_*.yaml); "
              "'' = the nominal URDF arm with no perturbation.", read_only=True),
    ParamSpec("unit_id", "",
              "Serial number of the unit this driver expects; '' = accept the file's unit_id. "
              "A mismatch refuses to start, as a driver refuses the wrong arm.", read_only=True),
    ParamSpec("urdf_path", "", "URDF of the arm; '' = the shipped arm.", read_only=True),
    ParamSpec("joints", [""],
              "Joint order of the forward_position_controller commands (the controller's "
              "`joints`); [''] = the URDF's movable joints in file order.",
              param_type=Parameter.Type.STRING_ARRAY, read_only=True),
    ParamSpec("command_interface", "forward_position_controller",
              "Which ros2_control command controller is active (the topic subscribed).",
              choices=COMMAND_INTERFACES, read_only=True),
    ParamSpec("initial_positions_rad", [0.0],
              "Joint positions at power-up, rad, in `joints` order; [0.0] = all zero "
              "(arm straight up).", param_type=Parameter.Type.DOUBLE_ARRAY, read_only=True),
    ParamSpec("publish_rate_hz", 500.0,
              "Rate of joint_states and of the F/T wrench (Hz), as joint_state_broadcaster "
              "at the controller manager's update rate.", low=10.0, high=2000.0, read_only=True),
    ParamSpec("max_catchup_s", 0.1,
              "Longest host stall the plant makes up for (s); beyond it time is dropped and "
              "counted as an overrun.", low=0.005, high=2.0),
    ParamSpec("diagnostics_period_s", 1.0, "Period of the /diagnostics report (s).",
              low=0.05, high=60.0),
]


class ProxyArm(Node):
    """Drive the MuJoCo proxy arm in real time behind the ros2_control topics."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        values = declare_params(self, PARAMS)
        where = f"ROS parameters of /{self.get_name()}"
        urdf = Path(values["urdf_path"]) if values["urdf_path"] else default_urdf()
        arm = load_arm(urdf)
        if values["unit_file"]:
            unit = ProxyUnit.from_yaml(values["unit_file"], arm)
        else:
            unit = ProxyUnit.nominal(arm)
        if values["unit_id"] and values["unit_id"] != unit.unit_id:
            raise ConfigError(where, "unit_id", values["unit_id"],
                              f"the unit in {values['unit_file'] or '<nominal>'} "
                              f"({unit.unit_id!r})")
        self._plant = ProxyPlant(unit, urdf)
        joints = [j for j in values["joints"] if j] or list(arm.joint_names)
        if sorted(joints) != sorted(arm.joint_names):
            raise ConfigError(where, "joints", joints,
                              f"a permutation of the URDF's joints {arm.joint_names}")
        # _order[k] = plant index of the k-th joint in the command/joint_states order.
        self._joints = joints
        self._order = arm.index_of(joints)
        q0 = np.asarray(values["initial_positions_rad"], dtype=float)
        if q0.shape == (1,) and q0[0] == 0.0:
            q0 = np.zeros(arm.n_joints)
        if q0.shape != (arm.n_joints,) or np.any(q0 < arm.lower_rad[self._order]) or np.any(
            q0 > arm.upper_rad[self._order]
        ):
            raise ConfigError(where, "initial_positions_rad", q0.tolist(),
                              f"{arm.n_joints} positions within the URDF limits")
        q0_plant = np.zeros(arm.n_joints)
        q0_plant[self._order] = q0
        self._plant.reset(q0_plant)
        self._unit_id = unit.unit_id
        self._interface = values["command_interface"]
        self._follower = TrajectoryFollower(q0_plant)

        self._sync = WallClockSync(max_catchup_s=values["max_catchup_s"])
        self._sync.start(time.monotonic(), self._plant.time_s)
        self._js_pub = self.create_publisher(JointState, JOINT_STATES_TOPIC, STATE_QOS)
        self._wrench_pub = self.create_publisher(WrenchStamped, WRENCH_TOPIC, STATE_QOS)
        if self._interface == "forward_position_controller":
            self.create_subscription(
                Float64MultiArray, POSITION_TOPIC, self._on_position, COMMAND_QOS)
        else:
            self.create_subscription(
                JointTrajectory, TRAJECTORY_TOPIC, self._on_trajectory, COMMAND_QOS)
        self._diag = DiagnosticsPublisher(self)
        self._received = 0
        self._rejected = 0
        self._last_reject = ""
        self._published = 0
        self._last_command_wall_s: float | None = None
        self._window = (time.monotonic(), 0, self._plant.time_s, 0)
        self.add_on_set_parameters_callback(self._on_set)
        self.create_timer(1.0 / values["publish_rate_hz"], self._tick)
        self.create_timer(values["diagnostics_period_s"], self._report)
        self.get_logger().info(
            f"proxy arm unit {unit.unit_id}: {arm.n_joints} joints, "
            f"{1.0 / unit.physics_dt_s:.0f} Hz physics, {self._interface} active")

    def _on_set(self, params: list[Parameter]) -> Any:
        from rcl_interfaces.msg import SetParametersResult

        for p in params:
            if p.name == "max_catchup_s":
                self._sync.max_catchup_s = float(p.value)
        return SetParametersResult(successful=True)

    # ---- plant in real time ---------------------------------------------------------------
    def _advance(self) -> None:
        target = self._sync.target(time.monotonic(), self._plant.time_s)
        if self._interface == "joint_trajectory_controller" and self._follower.active:
            # The trajectory controller updates its setpoint every cycle; 1 ms cycles here.
            dt = max(self._plant.physics_dt_s, 1e-3)
            while self._plant.time_s + dt <= target:
                self._plant.command_position(self._follower.sample(self._plant.time_s))
                self._plant.advance_to(self._plant.time_s + dt)
        self._plant.advance_to(target)

    def _tick(self) -> None:
        self._advance()
        m = self._plant.measure()
        stamp = self.get_clock().now().to_msg()
        self._js_pub.publish(arrays_to_joint_state(
            self._joints, stamp, m.q[self._order], m.qd[self._order], m.tau_nm[self._order]))
        self._wrench_pub.publish(array_to_wrench(m.wrench, stamp, FT_LINK))
        self._published += 1

    # ---- commands ----------------------------------------------------------------------------
    def _reject(self, why: str) -> None:
        self._rejected += 1
        self._last_reject = why
        self.get_logger().warning(f"command rejected: {why}", throttle_duration_sec=1.0)

    def _on_position(self, msg: Float64MultiArray) -> None:
        self._received += 1
        try:
            q = multiarray_to_array(msg, len(self._joints))
        except MessageError as exc:
            self._reject(str(exc))
            return
        if not np.all(np.isfinite(q)):
            self._reject(f"non-finite command {q.tolist()}")
            return
        self._advance()
        cmd = np.zeros_like(q)
        cmd[self._order] = q
        self._plant.command_position(cmd)
        self._last_command_wall_s = time.monotonic()

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        self._received += 1
        names = list(msg.joint_names)
        missing = [j for j in self._joints if j not in names]
        if missing or len(set(names)) != len(names):
            self._reject(f"trajectory joints {names} do not cover {self._joints} exactly once")
            return
        cols = [names.index(j) for j in self._plant.joint_names]
        try:
            pts = np.array([[p.positions[c] for c in cols] for p in msg.points], dtype=float)
        except IndexError:
            self._reject("a trajectory point has fewer positions than joint_names")
            return
        tfs = np.array([p.time_from_start.sec + 1e-9 * p.time_from_start.nanosec
                        for p in msg.points])
        self._advance()
        # A stamped trajectory starts at its stamp (ROS time), mapped onto plant time.
        start = stamp_to_s(msg.header.stamp)
        if start > 0:
            now_ros = self.get_clock().now().nanoseconds * 1e-9
            start = self._plant.time_s + (start - now_ros)
        try:
            self._follower.set_trajectory(self._plant.time_s, start, tfs, pts)
        except ValueError as exc:
            self._reject(str(exc))
            return
        self._last_command_wall_s = time.monotonic()

    # ---- health ----------------------------------------------------------------------------
    def _report(self) -> None:
        now = time.monotonic()
        w0, pub0, plant0, over0 = self._window
        elapsed = max(now - w0, 1e-9)
        rate = (self._published - pub0) / elapsed
        rtf = (self._plant.time_s - plant0) / elapsed
        new_overruns = self._sync.overruns - over0
        self._window = (now, self._published, self._plant.time_s, self._sync.overruns)
        level, message = OK, "running"
        if new_overruns:
            level, message = WARN, f"{new_overruns} host stalls longer than max_catchup_s"
        elif self._rejected and self._last_reject:
            level, message = WARN, f"commands rejected: {self._last_reject}"
            self._last_reject = ""
        age = "none" if self._last_command_wall_s is None else now - self._last_command_wall_s
        values: dict[str, Any] = {
            "unit_id": self._unit_id,
            "command_interface": self._interface,
            "joint_states_rate_hz": rate,
            "real_time_factor": rtf,
            "overruns": self._sync.overruns,
            "dropped_time_s": self._sync.dropped_s,
            "commands_received": self._received,
            "commands_rejected": self._rejected,
            "last_command_age_s": age,
            "commands_in_flight": self._plant.pending_commands(),
            "uptime_s": self._plant.time_s,
        }
        self._diag.publish(
            [make_status(f"{self.get_name()}: drive", level, message, values,
                         hardware_id=self._unit_id)])


def main(args: list[str] | None = None) -> int:
    """Run the proxy_arm node."""
    return spin_node(ProxyArm, args)


if __name__ == "__main__":
    sys.exit(main())

"""proxy_arm speaks exactly the ros2_control topics and carries its unit's perturbations."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from builtin_interfaces.msg import Duration
from conftest import spin_until
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import WrenchStamped
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import array_to_multiarray, joint_state_to_arrays
from sim2real_ros.ros.diagnostics import status_values
from sim2real_ros.ros.qos import COMMAND_QOS, STATE_QOS

ARM = load_arm(default_urdf())
UNIT = share_path("config", "proxy", "unit_proxy-SN0001.yaml")
PARAMS = share_path("config", "nodes", "proxy_arm.yaml")
MODULE = "sim2real_ros.proxy.node"
# Every rclpy node publishes these two itself; they are ROS infrastructure, not the driver's API.
INFRASTRUCTURE = {"/rosout", "/parameter_events"}
TARGET = np.array([0.3, 0.4, 0.6, 0.2, -0.3, 0.25])


class Probe:
    """A test node that talks to proxy_arm over DDS as the graph would."""

    def __init__(self, context: object, trajectory: bool = False) -> None:
        self.node = Node("proxy_probe", context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.states: list[JointState] = []
        self.wrenches: list[WrenchStamped] = []
        self.diagnostics: list[DiagnosticArray] = []
        self.node.create_subscription(JointState, "/joint_states", self.states.append, STATE_QOS)
        self.node.create_subscription(WrenchStamped, "/force_torque_sensor_broadcaster/wrench",
                                      self.wrenches.append, STATE_QOS)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append,
                                      STATE_QOS)
        self.position_pub = self.node.create_publisher(
            Float64MultiArray, "/forward_position_controller/commands", COMMAND_QOS)
        self.trajectory_pub = self.node.create_publisher(
            JointTrajectory, "/joint_trajectory_controller/joint_trajectory", COMMAND_QOS)

    def spin_for(self, duration_s: float) -> None:
        spin_until(self.executor, lambda: False, duration_s)

    def last_q(self) -> np.ndarray:
        return joint_state_to_arrays(self.states[-1], ARM.joint_names).position  # type: ignore

    def topics_of(self, node_name: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        pubs = dict(self.node.get_publisher_names_and_types_by_node(node_name, "/"))
        subs = dict(self.node.get_subscriber_names_and_types_by_node(node_name, "/"))
        return pubs, subs

    def wait_for_node(self, name: str, timeout_s: float = 20.0) -> bool:
        return spin_until(self.executor, lambda: name in self.node.get_node_names() and bool(
            self.states), timeout_s)

    def stream_ramp(self, target: np.ndarray, duration_s: float, rate_hz: float = 100.0) -> None:
        start = self.last_q()
        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < duration_s:
            a = min(1.0, t / (0.5 * duration_s))
            self.position_pub.publish(array_to_multiarray(start + a * (target - start)))
            spin_until(self.executor, lambda: False, 1.0 / rate_hz)


def test_proxy_speaks_only_ros2_control_topics_and_follows_position_commands(
    ros_context: object, node_processes: object
) -> None:
    proc = node_processes.start(  # type: ignore[attr-defined]
        MODULE, ros_args=["--params-file", str(PARAMS), "-p", f"unit_file:={UNIT}"])
    probe = Probe(ros_context)
    assert probe.wait_for_node("proxy_arm"), node_processes.log(proc)  # type: ignore
    pubs, subs = probe.topics_of("proxy_arm")
    assert set(pubs) - INFRASTRUCTURE == {
        "/joint_states", "/force_torque_sensor_broadcaster/wrench", "/diagnostics"}
    assert pubs["/joint_states"] == ["sensor_msgs/msg/JointState"]
    assert pubs["/force_torque_sensor_broadcaster/wrench"] == ["geometry_msgs/msg/WrenchStamped"]
    assert subs == {"/forward_position_controller/commands": ["std_msgs/msg/Float64MultiArray"]}

    probe.stream_ramp(TARGET, 3.0)
    probe.spin_for(0.5)
    q = probe.last_q()
    # The shipped unit's encoders carry up to 6 mrad of homing offset; the arm is on target.
    assert np.max(np.abs(q - TARGET)) < 0.012, q - TARGET
    msg = probe.states[-1]
    assert list(msg.name) == ARM.joint_names and len(msg.velocity) == 6 and len(msg.effort) == 6
    assert probe.wrenches[-1].header.frame_id == "ft_sensor_link"
    stamps = [s.header.stamp.sec + 1e-9 * s.header.stamp.nanosec for s in probe.states[-50:]]
    assert np.all(np.diff(stamps) > 0)
    assert proc.poll() is None


def test_trajectory_mode_subscribes_only_the_trajectory_controller_topic(
    ros_context: object, node_processes: object
) -> None:
    node_processes.start(  # type: ignore[attr-defined]
        MODULE, ros_args=["--params-file", str(PARAMS),
                          "-p", "command_interface:=joint_trajectory_controller"])
    probe = Probe(ros_context)
    assert probe.wait_for_node("proxy_arm")
    _, subs = probe.topics_of("proxy_arm")
    assert subs == {
        "/joint_trajectory_controller/joint_trajectory": ["trajectory_msgs/msg/JointTrajectory"]}
    traj = JointTrajectory()
    order = list(reversed(ARM.joint_names))  # any joint order, as the controller accepts
    traj.joint_names = order
    point = JointTrajectoryPoint()
    point.positions = [float(TARGET[ARM.joint_names.index(j)]) for j in order]
    point.time_from_start = Duration(sec=1, nanosec=0)
    traj.points = [point]
    probe.trajectory_pub.publish(traj)
    probe.spin_for(0.5)
    mid = probe.last_q()
    probe.spin_for(2.0)
    assert 0.05 < mid[2] / TARGET[2] < 0.95  # interpolated, not jumped
    assert np.max(np.abs(probe.last_q() - TARGET)) < 5e-3


def _unit_file(tmp_path: Path, text: str) -> str:
    f = tmp_path / "unit_test.yaml"
    f.write_text(text)
    return str(f)


def test_encoder_bias_shows_in_joint_states_and_unit_id_in_diagnostics(
    ros_context: object, tmp_path: Path
) -> None:
    from sim2real_ros.proxy.node import ProxyArm

    bias = [0.02, -0.03, 0.01, 0.0, 0.015, -0.02]
    unit = _unit_file(tmp_path, f"unit_id: bench-42\nencoder:\n  bias_rad: {bias}\n")
    proxy = ProxyArm(context=ros_context, parameter_overrides=[
        Parameter("unit_file", value=unit), Parameter("diagnostics_period_s", value=0.2)])
    probe = Probe(ros_context)
    probe.executor.add_node(proxy)
    try:
        assert spin_until(probe.executor, lambda: len(probe.states) > 20 and any(
            d.status for d in probe.diagnostics), 10.0)
        np.testing.assert_allclose(probe.last_q(), bias, atol=1e-3)
        status = probe.diagnostics[-1].status[0]
        assert status.hardware_id == "bench-42"
        values = status_values(status)
        assert values["unit_id"] == "bench-42" and values["commands_rejected"] == "0"
        # No hidden value leaks into the report.
        assert not any("bias" in k or "latency" in k for k in values)
    finally:
        probe.executor.remove_node(proxy)
        proxy.destroy_node()


def test_malformed_commands_are_rejected_and_the_arm_holds(
    ros_context: object, tmp_path: Path
) -> None:
    from sim2real_ros.proxy.node import ProxyArm

    proxy = ProxyArm(context=ros_context, parameter_overrides=[
        Parameter("diagnostics_period_s", value=0.2)])
    probe = Probe(ros_context)
    probe.executor.add_node(proxy)
    try:
        assert spin_until(probe.executor, lambda: len(probe.states) > 5, 10.0)
        probe.position_pub.publish(array_to_multiarray(np.ones(4)))
        probe.position_pub.publish(array_to_multiarray(np.array([np.nan, 0, 0, 0, 0, 0])))
        probe.diagnostics.clear()
        assert spin_until(probe.executor, lambda: any(
            status_values(d.status[0]).get("commands_rejected") == "2"
            for d in probe.diagnostics), 5.0)
        probe.spin_for(0.3)
        assert np.max(np.abs(probe.last_q())) < 1e-3
    finally:
        probe.executor.remove_node(proxy)
        proxy.destroy_node()


def test_driver_refuses_a_unit_with_another_serial_number(node_processes: object) -> None:
    proc = node_processes.start(  # type: ignore[attr-defined]
        MODULE, ros_args=["-p", f"unit_file:={UNIT}", "-p", "unit_id:=proxy-SN9999"])
    assert proc.wait(timeout=30) == 2
    log = node_processes.log(proc)  # type: ignore[attr-defined]
    assert "unit_id" in log and "proxy-SN9999" in log and "proxy-SN0001" in log


@pytest.mark.parametrize("bad", ["joints:=[elbow_joint]", "publish_rate_hz:=5.0"])
def test_bad_parameters_refuse_to_start(node_processes: object, bad: str) -> None:
    proc = node_processes.start(MODULE, ros_args=["-p", bad])  # type: ignore[attr-defined]
    assert proc.wait(timeout=30) == 2
    assert bad.split(":=")[0] in node_processes.log(proc)  # type: ignore[attr-defined]

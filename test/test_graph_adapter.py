"""The trajectory adapter: safety commands become one-point JointTrajectory messages."""

from __future__ import annotations

import math

import pytest
from conftest import spin_until
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from sim2real_ros.adapters.trajectory import TrajectoryStreamer
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.qos import COMMAND_QOS

JOINTS = load_arm(default_urdf()).joint_names


def test_a_command_becomes_a_point_reached_time_from_start_later() -> None:
    s = TrajectoryStreamer(JOINTS, 0.02)
    point = s.convert([0.1, -0.2, 0.3, 0.0, 0.5, -0.6])
    assert point is not None
    assert point.joint_names == tuple(JOINTS)
    assert point.positions_rad == (0.1, -0.2, 0.3, 0.0, 0.5, -0.6)
    assert point.time_from_start_s == 0.02


@pytest.mark.parametrize("values, reason", [
    ([0.0] * 5, "expected 6 positions, got 5"),
    ([0.0] * 7, "expected 6 positions, got 7"),
    ([0.0, math.nan, 0.0, 0.0, 0.0, 0.0], "non-finite position"),
    ([0.0, 0.0, math.inf, 0.0, 0.0, 0.0], "non-finite position"),
])
def test_a_malformed_command_is_dropped_and_counted_never_forwarded(
    values: list[float], reason: str
) -> None:
    s = TrajectoryStreamer(JOINTS, 0.02)
    assert s.convert(values) is None
    assert (s.stats.received, s.stats.forwarded, s.stats.rejected) == (1, 0, 1)
    assert s.stats.last_reject_reason == reason


@pytest.mark.parametrize("joints, tfs", [([], 0.02), (["a", "a"], 0.02), (JOINTS, 0.0),
                                         (JOINTS, math.nan), (JOINTS, 2.0)])
def test_bad_streamer_configuration_is_refused(joints: list[str], tfs: float) -> None:
    with pytest.raises(ValueError, match="expected"):
        TrajectoryStreamer(joints, tfs)


def test_adapter_node_streams_commands_to_the_trajectory_controller_topic(
    ros_context: object,
) -> None:
    from rclpy.parameter import Parameter

    from sim2real_ros.adapters.trajectory_node import TrajectoryAdapter

    adapter = TrajectoryAdapter(
        context=ros_context, parameter_overrides=[Parameter("time_from_start_s", value=0.05)])
    peer = Node("peer", context=ros_context)
    got: list[JointTrajectory] = []
    peer.create_subscription(JointTrajectory, "joint_trajectory_controller/joint_trajectory",
                             got.append, COMMAND_QOS)
    pub = peer.create_publisher(Float64MultiArray, "forward_position_controller/commands",
                                COMMAND_QOS)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(adapter)
    ex.add_node(peer)
    assert spin_until(ex, lambda: pub.get_subscription_count() > 0
                      and peer.count_publishers(
                          "joint_trajectory_controller/joint_trajectory") > 0, 5.0)
    pub.publish(Float64MultiArray(data=[0.0] * 5))  # dropped
    pub.publish(Float64MultiArray(data=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]))
    assert spin_until(ex, lambda: len(got) >= 1, 5.0)
    spin_until(ex, lambda: False, 0.2)
    assert len(got) == 1
    msg = got[0]
    assert list(msg.joint_names) == JOINTS
    assert list(msg.points[0].positions) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    tfs = msg.points[0].time_from_start
    assert (tfs.sec, tfs.nanosec) == (0, 50_000_000)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (0, 0)  # start now
    ex.shutdown()
    adapter.destroy_node()
    peer.destroy_node()

"""The real backend across processes: the graph against a driver speaking only ros2_control.

The stand-in driver is `proxy_arm` (MuJoCo, issue 9), which offers exactly the topics of a
ros2_control cell (joint_state_broadcaster, force_torque_sensor_broadcaster and either
forward_position_controller or joint_trajectory_controller) and nothing of ours.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import spin_until
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from sim2real_ros.graph import ADAPTER_INPUT_TOPIC, GraphArgs, backend_file, build_graph
from sim2real_ros.paths import share_path
from sim2real_ros.ros.convert import joint_state_to_arrays
from sim2real_ros.ros.qos import COMMAND_QOS, STATE_QOS
from sim2real_ros.runner import GraphRunner, RunnerConfig

PROXY = "sim2real_ros.proxy.node"


def _proxy_args(interface: str) -> list[str]:
    return ["--params-file", str(share_path("config", "nodes", "proxy_arm.yaml")),
            "-p", f"command_interface:={interface}"]


@pytest.mark.graph
def test_trajectory_controller_route_moves_the_proxy_arm_with_no_code_change(
    tmp_path: Path, ros_context: object, node_processes: object
) -> None:
    backend = yaml.safe_load(backend_file("real").read_text())
    backend["command_interface"] = "joint_trajectory_controller"
    path = tmp_path / "real_jtc.yaml"
    path.write_text(yaml.safe_dump(backend))
    graph = build_graph(GraphArgs(backend="real"), backend_path=path)
    assert "trajectory_adapter" in graph.names() and "sim_bridge" not in graph.names()
    # Only the adapter here: the safety filter's output is played by this test.
    graph = graph.without([n for n in graph.names() if n != "trajectory_adapter"])
    proxy = node_processes.start(PROXY, ros_args=_proxy_args("joint_trajectory_controller"),
                                 name="proxy_arm")
    out = io.StringIO()
    runner = GraphRunner(graph, out=out, config=RunnerConfig(grace_s=5.0))
    runner.start()
    peer = Node("safety_stand_in", context=ros_context)
    states: list[JointState] = []
    peer.create_subscription(JointState, "/joint_states", states.append, STATE_QOS)
    pub = peer.create_publisher(Float64MultiArray, ADAPTER_INPUT_TOPIC, COMMAND_QOS)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(peer)
    try:
        assert spin_until(ex, lambda: len(states) > 10 and pub.get_subscription_count() > 0,
                          30.0), node_processes.log(proxy) + out.getvalue()
        names = list(states[-1].name)
        target = np.array([0.3, -0.25, 0.4, 0.1, 0.2, -0.1])

        def arrived() -> bool:
            pub.publish(Float64MultiArray(data=target.tolist()))
            q = joint_state_to_arrays(states[-1], names).position
            return q is not None and float(np.max(np.abs(q - target))) < 0.02

        assert spin_until(ex, arrived, 20.0, step_s=0.02), (
            f"arm at {joint_state_to_arrays(states[-1], names).position}, target {target}\n"
            + node_processes.log(proxy) + out.getvalue())
        assert runner.poll() is None
    finally:
        ex.shutdown()
        peer.destroy_node()
        assert runner.stop()

"""Launch the sim2real graph on a ROS 2 machine: `ros2 launch sim2real_ros sim2real.launch.py`.

A thin translation of sim2real_ros/graph.py, which holds the graph (nodes, parameter files,
overrides, remaps) for both backends; `sim2real run` starts the same description as processes
where `ros2 launch` is absent. Arguments: backend:=sim|real, rollout_stage:=, policy_version:=,
calibration:= (see their descriptions, or `ros2 launch sim2real_ros sim2real.launch.py -s`).
"""

from __future__ import annotations

from typing import Any

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, Shutdown
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from sim2real_ros.graph import (
    ARGUMENT_CHOICES,
    ARGUMENT_DESCRIPTIONS,
    RESTART_DELAY_S,
    RESTART_LIMIT,
    GraphArgs,
    build_graph,
)


def graph_nodes(context: Any, *args: Any, **kwargs: Any) -> list[Node]:
    """Build one launch_ros Node per node of graph.py for the given arguments."""
    values = {name: LaunchConfiguration(name).perform(context) for name in ARGUMENT_DESCRIPTIONS}
    graph = build_graph(GraphArgs(**values))
    nodes = []
    for spec in graph.nodes:
        extra: dict[str, Any] = {}
        if spec.restartable:
            extra.update(respawn=True, respawn_delay=RESTART_DELAY_S,
                         respawn_max_retries=RESTART_LIMIT)
        else:
            # As with `sim2real run`: a node that is not restartable takes the graph down.
            extra.update(on_exit=Shutdown(reason=f"{spec.name} exited"))
        if spec.nice > 0:
            # As the runner does: the policy side and observers yield the CPU to the driver
            # and the safety filter.
            extra.update(prefix=f"nice -n {spec.nice}")
        nodes.append(Node(
            package=spec.package,
            executable=spec.executable,
            name=spec.name,
            output="screen",
            emulate_tty=True,
            parameters=[*spec.parameter_files, spec.parameter_dict()],
            remappings=list(spec.remappings),
            **extra,
        ))
    return nodes


def generate_launch_description() -> LaunchDescription:
    """Declare the graph's arguments and build its nodes once they are known."""
    defaults = GraphArgs()
    declared = []
    for name, description in ARGUMENT_DESCRIPTIONS.items():
        choices = ARGUMENT_CHOICES[name]
        kwargs: dict[str, Any] = {"choices": list(choices)} if choices else {}
        declared.append(DeclareLaunchArgument(
            name, default_value=str(getattr(defaults, name)), description=description, **kwargs))
    return LaunchDescription([*declared, OpaqueFunction(function=graph_nodes)])

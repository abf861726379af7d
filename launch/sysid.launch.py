"""Excite and record a calibration run: `ros2 launch sim2real_ros sysid.launch.py unit:=SN1234`.

A thin translation of sim2real_ros/sysid/graph.py (`sysid_nodes`), which says which nodes run:
the arm's driver (or the sim bridge), the safety filter in stage `full` with
require_confidence:=false, its baseline fallback, and sysid_recorder. Arguments: unit:=,
backend:=sim|real, calibration:=, excitation:=, duration_s:=, amplitude_rad:=, output_dir:=,
cell:=, tool:=, note:= (`ros2 launch sim2real_ros sysid.launch.py -s` lists them).
"""

from __future__ import annotations

from typing import Any

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, Shutdown
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from sim2real_ros.sysid.graph import (
    LAUNCH_ARGUMENTS,
    LAUNCH_DEFAULTS,
    RECORDER,
    recorder_overrides,
    sysid_nodes,
)


def nodes(context: Any, *args: Any, **kwargs: Any) -> list[Node]:
    """Build one launch_ros Node per node dict of sysid_nodes()."""
    values = {name: LaunchConfiguration(name).perform(context) for name in LAUNCH_ARGUMENTS}
    described = sysid_nodes(values["unit"], values["backend"], values["calibration"],
                            recorder_overrides(values))
    out = []
    for d in described:
        # The run is over when the recorder has closed its bag; any other node exiting (the
        # driver, the safety filter) ends it too, as in sim2real.launch.py and `sim2real run`.
        reason = "sysid_recorder finished" if d["name"] == RECORDER else f"{d['name']} exited"
        extra: dict[str, Any] = {"on_exit": Shutdown(reason=reason)}
        out.append(Node(package=d["package"], executable=d["executable"], name=d["name"],
                        output="screen", emulate_tty=True, parameters=d["parameters"],
                        remappings=d["remappings"], **extra))
    return out


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments and build the nodes once they are known."""
    declared = [DeclareLaunchArgument(name, default_value=LAUNCH_DEFAULTS[name],
                                      description=desc)
                for name, desc in LAUNCH_ARGUMENTS.items()]
    return LaunchDescription([*declared, OpaqueFunction(function=nodes)])

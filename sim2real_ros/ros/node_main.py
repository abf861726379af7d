"""The one way our node processes start: DDS checks, clean shutdown, refuse bad config."""

from __future__ import annotations

import sys
from typing import Callable

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node

from sim2real_ros.config import ConfigError
from sim2real_ros.ros.env import dds_env_problems


def spin_node(make_node: Callable[[], Node], args: list[str] | None = None) -> int:
    """Init rclpy, build the node, spin until Ctrl-C or shutdown; exit code 2 on bad config."""
    for problem in dds_env_problems():
        print(f"[sim2real_ros] warning: {problem}; DDS traffic may leave loopback", file=sys.stderr)
    with rclpy.init(args=args):
        try:
            node = make_node()
        except ConfigError as exc:
            print(f"[sim2real_ros] refusing to start: {exc}", file=sys.stderr)
            return 2
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        try:
            executor.spin()
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        finally:
            executor.remove_node(node)
            node.destroy_node()
    return 0

"""task_sequencer: publishes tool targets (task/target), cycling through seeded reachable points.

The targets are forward-kinematics points of joint vectors drawn around the task's home pose
that fall inside the workspace box, so each one is reachable by construction. The same seed
gives the same list on every machine. The current target is re-published at
`publish_rate_hz` so late joiners and restarted nodes pick it up within one period.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from geometry_msgs.msg import PointStamped
from rclpy.node import Node

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.task import TaskConfig, reachable_targets
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.diagnostics import OK, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import STATE_QOS

_DEFAULT_TASK = TaskConfig()

PARAMS = [
    ParamSpec("seed", 0, "Seed of the target list (same seed, same targets).",
              low=0, high=2**31 - 1, read_only=True),
    ParamSpec("targets", 10, "Number of targets in the cycle.", low=1, high=100_000,
              read_only=True),
    ParamSpec("dwell_s", 3.0, "Time each target is held before the next, s.",
              low=0.05, high=86_400.0),
    ParamSpec("publish_rate_hz", 10.0, "Rate at which the current target is re-published, Hz.",
              low=0.1, high=1000.0, read_only=True),
    ParamSpec("workspace_min_m", list(_DEFAULT_TASK.workspace_min_m),
              "Lower corner (x, y, z) of the target box in the base frame, m.", read_only=True),
    ParamSpec("workspace_max_m", list(_DEFAULT_TASK.workspace_max_m),
              "Upper corner (x, y, z) of the target box in the base frame, m.", read_only=True),
    ParamSpec("frame_id", "base_link", "Frame of the published points.", read_only=True),
    ParamSpec("loop", True, "Start again at the first target after the last; false = hold "
              "the last target.", read_only=True),
    ParamSpec("urdf_path", "", "Arm URDF; empty = the shipped sim2real_arm.urdf.",
              read_only=True),
]


class TaskSequencer(Node):
    """Cycles through a seeded list of reachable tool targets with a dwell time."""

    def __init__(self, name: str = "task_sequencer", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.p = declare_params(self, PARAMS, on_change=self._on_change)
        src = f"ROS parameters of /{self.get_name()}"
        lo = np.asarray(self.p["workspace_min_m"], dtype=float)
        hi = np.asarray(self.p["workspace_max_m"], dtype=float)
        for key, v in (("workspace_min_m", lo), ("workspace_max_m", hi)):
            if v.shape != (3,) or not np.all(np.isfinite(v)):
                raise ConfigError(src, key, self.p[key], "three finite numbers (x, y, z), m")
        if np.any(lo >= hi):
            raise ConfigError(src, "workspace_max_m", hi.tolist(),
                              f"each component > workspace_min_m {lo.tolist()}")
        arm = load_arm(self.p["urdf_path"] or default_urdf())
        try:
            self.targets = reachable_targets(int(self.p["seed"]), int(self.p["targets"]), arm,
                                             lo, hi)
        except ConfigError as exc:
            raise ConfigError(src, "workspace_min_m/workspace_max_m", (lo.tolist(), hi.tolist()),
                              f"a box that contains reachable tool positions ({exc.allowed})"
                              ) from exc
        self.index = 0
        self._start_ns = self.get_clock().now().nanoseconds
        self.pub = self.create_publisher(PointStamped, "task/target", STATE_QOS)
        self.diag = DiagnosticsPublisher(self)
        self.create_timer(1.0 / float(self.p["publish_rate_hz"]), self._tick)
        self.create_timer(1.0, self._publish_diagnostics)
        self._tick()

    def _on_change(self, changes: dict[str, Any]) -> str | None:
        self.p.update(changes)
        return None

    def current_index(self) -> int:
        """Index of the target to hold now."""
        elapsed_s = (self.get_clock().now().nanoseconds - self._start_ns) * 1e-9
        k = int(max(elapsed_s, 0.0) // float(self.p["dwell_s"]))
        n = len(self.targets)
        return k % n if self.p["loop"] else min(k, n - 1)

    def _tick(self) -> None:
        self.index = self.current_index()
        p = self.targets[self.index]
        msg = PointStamped()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = str(self.p["frame_id"])
        msg.point.x, msg.point.y, msg.point.z = (float(v) for v in p)
        self.pub.publish(msg)

    def _publish_diagnostics(self) -> None:
        p = self.targets[self.index]
        self.diag.publish([make_status(
            f"{self.get_name()}: targets", OK, f"target {self.index + 1}/{len(self.targets)}",
            {"index": self.index, "count": len(self.targets), "seed": int(self.p["seed"]),
             "dwell_s": float(self.p["dwell_s"]), "target_x_m": float(p[0]),
             "target_y_m": float(p[1]), "target_z_m": float(p[2])},
        )])


def main(args: list[str] | None = None) -> int:
    """Console script entry point."""
    return spin_node(TaskSequencer, args)


if __name__ == "__main__":
    sys.exit(main())

"""Node `unit_check`: warns loudly when the live arm is not the unit the calibration was made on.

Started by the graph on the real backend when a calibration is given. Subscribes /diagnostics
(diagnostic_msgs/DiagnosticArray) for the key `unit_id`, which a driver that knows its arm
reports (proxy_arm and the sim bridge do; `sim2real audit --live` reads the same key), compares
it with the calibration's unit through the sysid room's `check_unit`, logs a framed ERROR on a
mismatch and reports on /diagnostics: ERROR on a mismatch, WARN while no unit is reported, OK
when the units agree. It warns, it does not stop the arm: the calibration only shapes the
simulator and what was trained in it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node

from sim2real_ros.config import ConfigError
from sim2real_ros.ros.diagnostics import ERROR, OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import STATE_QOS

NODE_NAME = "unit_check"

PARAMS = [
    ParamSpec("calibration_file", "", "Calibration whose unit the live arm must be (required).",
              read_only=True),
    ParamSpec("silence_warning_s", 10.0,
              "Warn when no node has reported a unit_id after this long (s).",
              low=0.1, high=3600.0, read_only=True),
    ParamSpec("diagnostics_period_s", 1.0, "Period of the /diagnostics report (s).",
              low=0.05, high=60.0, read_only=True),
]


class UnitCheck(Node):
    """Compare the unit a driver reports with the calibration's unit."""

    def __init__(self, **node_kwargs: Any) -> None:
        super().__init__(NODE_NAME, **node_kwargs)
        from sim2real_ros.sysid.calibration import load_calibration

        values = declare_params(self, PARAMS)
        where = f"ROS parameters of /{self.get_name()}"
        if not values["calibration_file"]:
            raise ConfigError(where, "calibration_file", "", "the calibration file to check")
        self.calibration = load_calibration(values["calibration_file"])
        self.live_unit_id: str | None = None
        self.mismatch: str | None = None
        self._silence_s = float(values["silence_warning_s"])
        self._t0 = time.monotonic()
        self._warned_silence = False
        self._diag = DiagnosticsPublisher(self)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, STATE_QOS)
        self.create_timer(float(values["diagnostics_period_s"]), self._report)
        self.get_logger().info(f"checking that the live arm is unit "
                               f"'{self.calibration.unit_id}' ({self.calibration.path})")

    def _on_diag(self, msg: DiagnosticArray) -> None:
        from sim2real_ros.sysid.calibration import check_unit

        for status in msg.status:
            if status.name.startswith(f"{self.get_name()}:"):
                continue
            for kv in status.values:
                if kv.key != "unit_id" or not kv.value or kv.value == self.live_unit_id:
                    continue
                self.live_unit_id = kv.value
                self.mismatch = check_unit(self.calibration, kv.value)
                if self.mismatch:
                    frame = "!" * 72
                    self.get_logger().error(f"\n{frame}\n{self.mismatch}\n{frame}")
                else:
                    self.get_logger().info(f"live arm is unit '{kv.value}', the calibrated unit")

    def _report(self) -> None:
        values = {"calibration_unit": self.calibration.unit_id,
                  "calibration_file": self.calibration.path,
                  "live_unit_id": self.live_unit_id or "none reported"}
        if self.mismatch:
            level, message = ERROR, f"UNIT MISMATCH: live '{self.live_unit_id}', calibration " \
                f"'{self.calibration.unit_id}'"
        elif self.live_unit_id is None:
            level, message = WARN, "no node reports a unit_id yet"
            if not self._warned_silence and time.monotonic() - self._t0 > self._silence_s:
                self._warned_silence = True
                self.get_logger().warning(
                    f"no node reports a unit_id on /diagnostics after {self._silence_s:.0f} s; "
                    f"cannot check that the live arm is '{self.calibration.unit_id}'")
        else:
            level, message = OK, f"live arm is the calibrated unit '{self.live_unit_id}'"
        self._diag.publish([make_status(f"{NODE_NAME}: calibration unit", level, message,
                                        values)])


def main(args: list[str] | None = None) -> int:
    """Run the unit check node."""
    return spin_node(UnitCheck, args)


if __name__ == "__main__":
    sys.exit(main())

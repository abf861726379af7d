"""Node `sim_bridge`: the randomized PyBullet arm behind the topics of a ros2_control driver.

Subscribes `forward_position_controller/commands` and `forward_effort_controller/commands`
(std_msgs/Float64MultiArray; optionally `forward_velocity_controller/commands`), publishes
`joint_states`, `force_torque_sensor_broadcaster/wrench`, `sim_bridge/randomization` (latched
JSON of the realized draw), `/diagnostics`, `/clock` when sim time is the clock, and optionally
`camera/image_raw`. Service `sim_bridge/reset` (std_srvs/Trigger) starts a new episode with a
new draw from parameter `seed`. All logic lives in SimCore; this file converts messages.

Clock modes: `realtime` follows the wall clock; `lockstep` advances one control period of sim
time per cycle, publishes /clock and waits for the controller's next command (or at most
`lockstep_timeout_s`); `freerun` advances as fast as possible and waits for nothing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from geometry_msgs.msg import WrenchStamped
from rclpy.node import Node
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import (
    MessageError,
    array_to_wrench,
    arrays_to_joint_state,
    multiarray_to_array,
    s_to_stamp,
)
from sim2real_ros.ros.diagnostics import OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import CLOCK_QOS, COMMAND_QOS, LATCHED_QOS, STATE_QOS
from sim2real_ros.sim.camera import CameraConfig
from sim2real_ros.sim.core import Observation, SimCore
from sim2real_ros.sim.plant import PlantParams
from sim2real_ros.sim.randomization import RandomizationSpec, load_calibration

NODE_NAME = "sim_bridge"
CLOCK_MODES = ("realtime", "lockstep", "freerun")
POSITION_TOPIC = "forward_position_controller/commands"
EFFORT_TOPIC = "forward_effort_controller/commands"
VELOCITY_TOPIC = "forward_velocity_controller/commands"
JOINT_STATES_TOPIC = "joint_states"
WRENCH_TOPIC = "force_torque_sensor_broadcaster/wrench"
IMAGE_TOPIC = "camera/image_raw"
# Sim time starts here rather than at 0: a zero stamp means "unset" to many ROS tools.
SIM_CLOCK_START_S = 1.0
FREERUN_SLICE_S = 0.005  # wall time a freerun callback may run before the executor gets a turn

PARAMS = [
    ParamSpec("urdf_path", "", "URDF of the arm; '' = the shipped arm.", read_only=True),
    ParamSpec("joints", [""],
              "Joint order of commands and joint_states (the controllers' `joints`); "
              "[''] = the URDF's movable joints in chain order.",
              param_type=Parameter.Type.STRING_ARRAY, read_only=True),
    ParamSpec("initial_positions_rad", [0.0],
              "Joint positions at start and after reset, rad, in `joints` order; [0.0] = all "
              "zero (arm straight up).", param_type=Parameter.Type.DOUBLE_ARRAY, read_only=True),
    ParamSpec("physics_rate_hz", 1000.0, "Physics step rate (Hz).", low=100.0, high=10000.0,
              read_only=True),
    ParamSpec("publish_rate_hz", 500.0, "Rate of joint_states and the F/T wrench (Hz).",
              low=1.0, high=2000.0, read_only=True),
    ParamSpec("clock_mode", "realtime",
              "realtime: follow the wall clock; lockstep: one control period of sim time per "
              "cycle, publish /clock, wait for the next command; freerun: as fast as possible, "
              "publish /clock, wait for nothing.", choices=CLOCK_MODES, read_only=True),
    ParamSpec("control_period_s", 0.01,
              "Sim time advanced per lockstep cycle (s): the controller's period.",
              low=0.0005, high=1.0, read_only=True),
    ParamSpec("lockstep_timeout_s", 0.5,
              "Longest wall time a lockstep cycle waits for a command before advancing (s).",
              low=0.0, high=60.0),
    ParamSpec("max_catchup_s", 0.1,
              "Longest host stall realtime mode makes up for (s); beyond it sim time is "
              "dropped and counted as an overrun.", low=0.005, high=2.0),
    ParamSpec("seed", 0, "Seed of the randomization draw; read again at every reset.",
              low=0, high=2**31 - 1),
    ParamSpec("randomize", True, "Apply domain randomization (false = the nominal plant).",
              read_only=True),
    ParamSpec("randomization_file", "",
              "Randomization spec (config/randomization.yaml format); '' = the calibration's "
              "randomization section if it has one, else the shipped spec.", read_only=True),
    ParamSpec("calibration_file", "",
              "Calibration of the unit (nominal plant parameters and a randomization section) "
              "written by `sim2real sysid fit`; '' = the URDF nominal.", read_only=True),
    ParamSpec("unit_id", "sim", "Identifier of the simulated unit, reported in /diagnostics "
              "(hardware_id) and in the randomization record.", read_only=True),
    ParamSpec("velocity_commands", False,
              "Also subscribe forward_velocity_controller/commands (rad/s).", read_only=True),
    ParamSpec("ft_frame_id", "ft_sensor_link", "frame_id of the wrench messages.",
              read_only=True),
    ParamSpec("floor", False,
              "Put a floor slab under the arm (contact randomization acts on it); it makes "
              "each physics step 2-3x slower. Always on with the camera.", read_only=True),
    ParamSpec("camera_enabled", False, "Publish camera/image_raw (sensor_msgs/Image, rgb8).",
              read_only=True),
    ParamSpec("camera_rate_hz", 10.0, "Camera frame rate (Hz).", low=0.1, high=60.0,
              read_only=True),
    ParamSpec("camera_width", 160, "Image width (pixels).", low=16, high=1280, read_only=True),
    ParamSpec("camera_height", 120, "Image height (pixels).", low=16, high=960, read_only=True),
    ParamSpec("diagnostics_period_s", 1.0, "Period of the /diagnostics report (s).",
              low=0.05, high=60.0),
]


class SimBridge(Node):
    """Run SimCore behind the ros2_control topics, in real time or on its own clock."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        values = declare_params(self, PARAMS, on_change=self._on_change)
        where = f"ROS parameters of /{self.get_name()}"
        urdf = Path(values["urdf_path"]) if values["urdf_path"] else default_urdf()
        arm = load_arm(urdf)
        joints = [j for j in values["joints"] if j] or list(arm.joint_names)
        if sorted(joints) != sorted(arm.joint_names) or len(set(joints)) != len(joints):
            raise ConfigError(where, "joints", joints,
                              f"a permutation of the URDF's joints {arm.joint_names}")
        self._joints = joints
        self._order = arm.index_of(joints)  # _order[k] = core index of the k-th joint
        q0 = np.asarray(values["initial_positions_rad"], dtype=float)
        if q0.shape == (1,) and q0[0] == 0.0:
            q0 = np.zeros(arm.n_joints)
        if q0.shape != (arm.n_joints,) or np.any(q0 < arm.lower_rad[self._order]) or np.any(
            q0 > arm.upper_rad[self._order]
        ):
            raise ConfigError(where, "initial_positions_rad", q0.tolist(),
                              f"{arm.n_joints} positions within the URDF limits")
        q0_core = np.zeros(arm.n_joints)
        q0_core[self._order] = q0

        calibration: PlantParams | None = None
        cal_spec: RandomizationSpec | None = None
        if values["calibration_file"]:
            calibration, cal_spec = load_calibration(values["calibration_file"], arm)
        if not values["randomize"]:
            spec = RandomizationSpec.disabled()
        elif values["randomization_file"]:
            spec = RandomizationSpec.from_yaml(values["randomization_file"], arm)
        elif cal_spec is not None:
            spec = cal_spec
        else:
            spec = RandomizationSpec.from_yaml(share_path("config", "randomization.yaml"), arm)
        self._spec = spec
        self._calibration_file = values["calibration_file"]
        self._unit_id = values["unit_id"]
        self._mode = values["clock_mode"]
        self._seed = int(values["seed"])
        camera = CameraConfig(width=int(values["camera_width"]),
                              height=int(values["camera_height"]))
        self._core = SimCore(spec, seed=self._seed, urdf_path=urdf,
                             physics_dt_s=1.0 / values["physics_rate_hz"],
                             calibration=calibration, q0=q0_core, camera=camera,
                             floor=bool(values["floor"] or values["camera_enabled"]))
        self._publish_period_s = 1.0 / values["publish_rate_hz"]
        self._control_period_s = float(values["control_period_s"])
        self._lockstep_timeout_s = float(values["lockstep_timeout_s"])
        self._max_catchup_s = float(values["max_catchup_s"])
        self._ft_frame = values["ft_frame_id"]

        self._js_pub = self.create_publisher(JointState, JOINT_STATES_TOPIC, STATE_QOS)
        self._wrench_pub = self.create_publisher(WrenchStamped, WRENCH_TOPIC, STATE_QOS)
        self._draw_pub = self.create_publisher(String, "~/randomization", LATCHED_QOS)
        self._clock_pub = (
            self.create_publisher(Clock, "/clock", CLOCK_QOS) if self._mode != "realtime"
            else None
        )
        self._image_pub = (
            self.create_publisher(Image, IMAGE_TOPIC, STATE_QOS) if values["camera_enabled"]
            else None
        )
        self.create_subscription(Float64MultiArray, POSITION_TOPIC,
                                 lambda m, i: self._on_command("position", m, i), COMMAND_QOS)
        self.create_subscription(Float64MultiArray, EFFORT_TOPIC,
                                 lambda m, i: self._on_command("effort", m, i), COMMAND_QOS)
        if values["velocity_commands"]:
            self.create_subscription(Float64MultiArray, VELOCITY_TOPIC,
                                     lambda m, i: self._on_command("velocity", m, i), COMMAND_QOS)
        self.create_service(Trigger, "~/reset", self._on_reset)
        self._diag = DiagnosticsPublisher(self)

        self._received = 0
        self._rejected = 0
        # Longest wall-clock gap between valid commands, as the arm saw them: since the last
        # report (open gaps included) and since start.
        self._last_cmd_rx: float | None = None  # system time, s
        self._gap_window_s = 0.0
        self._gap_total_s = 0.0
        self._last_reject = ""
        self._last_reject_reason = "none"
        self._published = 0
        self._overruns = 0
        self._dropped_time_s = 0.0
        self._resets = 0
        self._clock_base_s = SIM_CLOCK_START_S
        self._command_since_cycle = False
        self._cycle_wall_s = time.monotonic()
        self._last_clock_wall_s = 0.0
        self._next_publish_sim_s = 0.0
        self._next_image_sim_s = 0.0
        self._image_period_s = 1.0 / values["camera_rate_hz"]
        self._window = (time.monotonic(), 0, self._sim_clock_s())

        self._publish_draw()
        if self._mode == "realtime":
            self._wall_start_s = time.monotonic()
            self._sim_start_s = self._core.time_s
            self.create_timer(self._publish_period_s, self._tick_realtime)
            if self._image_pub is not None:
                self.create_timer(self._image_period_s, self._publish_image)
        else:
            # A short timer hands control back to the executor between cycles, so commands
            # and service calls are served while the sim runs ahead.
            self.create_timer(0.0002, self._tick_sim_clock)
            self._publish_clock()
        self.create_timer(values["diagnostics_period_s"], self._report)
        self.get_logger().info(
            f"sim bridge {self._unit_id}: {arm.n_joints} joints, clock {self._mode}, "
            f"{len(spec.terms)} randomization terms (spec {spec.sha256[:12]}), seed {self._seed}")

    # ---- parameters --------------------------------------------------------------------
    def _on_change(self, changes: dict[str, Any]) -> str | None:
        if "seed" in changes:
            self._seed = int(changes["seed"])
        if "lockstep_timeout_s" in changes:
            self._lockstep_timeout_s = float(changes["lockstep_timeout_s"])
        if "max_catchup_s" in changes:
            self._max_catchup_s = float(changes["max_catchup_s"])
        return None

    # ---- time ------------------------------------------------------------------------------
    def _sim_clock_s(self) -> float:
        """ROS time of the sim (monotonic across resets) in sim-clock modes."""
        return self._clock_base_s + self._core.time_s

    def _stamp(self, obs: Observation | None = None) -> Any:
        if self._mode == "realtime":
            return self.get_clock().now().to_msg()
        return s_to_stamp(self._sim_clock_s())

    def _publish_clock(self) -> None:
        self._last_clock_wall_s = time.monotonic()
        if self._clock_pub is not None:
            self._clock_pub.publish(Clock(clock=s_to_stamp(self._sim_clock_s())))

    def _tick_realtime(self) -> None:
        target = self._sim_start_s + (time.monotonic() - self._wall_start_s)
        behind = target - self._core.time_s
        if behind > self._max_catchup_s:
            # The host stalled: drop the time rather than run the arm in a burst.
            self._overruns += 1
            self._dropped_time_s += behind - self._publish_period_s
            self._sim_start_s -= behind - self._publish_period_s
            behind = self._publish_period_s
        steps = int(behind / self._core.physics_dt_s + 1e-9)
        obs = self._core.advance(steps * self._core.physics_dt_s)
        self._publish_state(obs)

    def _tick_sim_clock(self) -> None:
        if self._mode == "lockstep":
            now = time.monotonic()
            waited = now - self._cycle_wall_s
            if not self._command_since_cycle and waited < self._lockstep_timeout_s:
                # While waiting, repeat the (unchanged) time for nodes that joined late.
                if now - self._last_clock_wall_s > 0.1:
                    self._publish_clock()
                return
            self._run_cycle(self._control_period_s)
            self._command_since_cycle = False
            self._cycle_wall_s = time.monotonic()
            return
        deadline = time.monotonic() + FREERUN_SLICE_S
        while time.monotonic() < deadline:
            self._run_cycle(self._publish_period_s)

    def _run_cycle(self, duration_s: float) -> None:
        """Advance sim time by duration_s, publishing /clock and states on the sim schedule."""
        end = self._core.time_s + duration_s - 1e-9
        while self._core.time_s < end:
            step = min(self._next_publish_sim_s, end + 1e-9) - self._core.time_s
            if step > 1e-9:
                self._core.advance(step)
            self._publish_clock()
            if self._core.time_s >= self._next_publish_sim_s - 1e-9:
                self._publish_state(self._core.observe())
                self._next_publish_sim_s += self._publish_period_s
            if self._image_pub is not None and self._core.time_s >= self._next_image_sim_s - 1e-9:
                self._publish_image()
                self._next_image_sim_s += self._image_period_s

    # ---- outputs -------------------------------------------------------------------------
    def _publish_state(self, obs: Observation) -> None:
        if not obs.valid:
            return  # the measurement was lost on the way: nothing is published this cycle
        stamp = self._stamp(obs)
        o = self._order
        self._js_pub.publish(
            arrays_to_joint_state(self._joints, stamp, obs.q[o], obs.qd[o], obs.tau_nm[o]))
        self._wrench_pub.publish(array_to_wrench(obs.wrench, stamp, self._ft_frame))
        self._published += 1

    def _publish_image(self) -> None:
        if self._image_pub is None:
            return
        img = self._core.render()
        msg = Image()
        msg.header.stamp = self._stamp()
        msg.header.frame_id = "camera_optical_frame"
        msg.height, msg.width = int(img.shape[0]), int(img.shape[1])
        msg.encoding = "rgb8"
        msg.is_bigendian = 0
        msg.step = 3 * msg.width
        msg.data = img.tobytes()
        self._image_pub.publish(msg)

    def _draw_record(self) -> dict[str, Any]:
        rec = self._core.draw.to_dict()
        rec.update({
            "unit_id": self._unit_id,
            "calibration_file": self._calibration_file,
            "joint_names": list(self._core.joint_names),
            "clock_mode": self._mode,
        })
        return rec

    def _publish_draw(self) -> None:
        self._draw_pub.publish(String(data=json.dumps(self._draw_record(), sort_keys=True)))

    # ---- inputs --------------------------------------------------------------------------
    def _reject(self, why: str) -> None:
        self._rejected += 1
        self._last_reject = why
        self._last_reject_reason = why
        self.get_logger().warning(f"command rejected: {why}", throttle_duration_sec=1.0)

    def _on_command(self, mode: str, msg: Float64MultiArray,
                    info: dict[str, Any] | None = None) -> None:
        self._received += 1
        try:
            values = multiarray_to_array(msg, len(self._joints))
        except MessageError as exc:
            self._reject(f"{mode}: {exc}")
            return
        if not np.all(np.isfinite(values)):
            self._reject(f"{mode}: non-finite values {values.tolist()}")
            return
        # When the middleware received it (system clock), not when this callback ran: a busy
        # simulator step must not count as a gap in the command stream the arm was sent.
        rx = info.get("received_timestamp") if info else None
        now = rx * 1e-9 if rx else time.time()
        if self._last_cmd_rx is not None:
            gap = now - self._last_cmd_rx
            self._gap_window_s = max(self._gap_window_s, gap)
            self._gap_total_s = max(self._gap_total_s, gap)
        self._last_cmd_rx = now
        if self._mode == "realtime":
            self._tick_catchup()
        cmd = np.zeros_like(values)
        cmd[self._order] = values
        self._core.command(mode, cmd)
        self._command_since_cycle = True

    def _tick_catchup(self) -> None:
        """Bring the plant up to the wall clock so a command acts at the right time."""
        target = self._sim_start_s + (time.monotonic() - self._wall_start_s)
        steps = int((target - self._core.time_s) / self._core.physics_dt_s + 1e-9)
        if 0 < steps * self._core.physics_dt_s <= self._max_catchup_s:
            self._core.advance(steps * self._core.physics_dt_s)

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Any:
        self._clock_base_s = self._sim_clock_s()
        self._core.reset(seed=self._seed)
        self._resets += 1
        self._next_publish_sim_s = 0.0
        self._next_image_sim_s = 0.0
        if self._mode == "realtime":
            self._wall_start_s = time.monotonic()
            self._sim_start_s = self._core.time_s
        self._publish_draw()
        response.success = True
        response.message = json.dumps({
            "episode": self._core.episode, "seed": self._core.seed,
            "spec_sha256": self._core.draw.spec_sha256,
        })
        return response

    # ---- health --------------------------------------------------------------------------
    def _report(self) -> None:
        now = time.monotonic()
        w0, pub0, sim0 = self._window
        elapsed = max(now - w0, 1e-9)
        sim_now = self._sim_clock_s()
        rate = (self._published - pub0) / elapsed
        rtf = (sim_now - sim0) / elapsed
        self._window = (now, self._published, sim_now)
        level, message = OK, "running"
        if self._last_reject:
            level, message = WARN, f"commands rejected: {self._last_reject}"
            self._last_reject = ""
        elif self._overruns:
            level, message = WARN, f"{self._overruns} host stalls longer than max_catchup_s"
        st = self._core.stats
        open_gap = time.time() - self._last_cmd_rx if self._last_cmd_rx is not None else 0.0
        gap_window = max(self._gap_window_s, open_gap)
        self._gap_window_s = 0.0
        values: dict[str, Any] = {
            "unit_id": self._unit_id,
            "clock_mode": self._mode,
            "seed": self._core.seed,
            "episode": self._core.episode,
            "resets": self._resets,
            "spec_sha256": self._spec.sha256,
            "randomization_terms": len(self._spec.terms),
            "calibration_file": self._calibration_file or "none",
            "sim_time_s": self._core.time_s,
            "real_time_factor": rtf,
            "joint_states_rate_hz": rate,
            "commands_received": self._received,
            "commands_rejected": self._rejected,
            "command_gap_max_s": gap_window,
            "command_gap_max_total_s": max(self._gap_total_s, open_gap),
            "last_reject_reason": self._last_reject_reason,
            "commands_lost_in_link": st.commands_dropped,
            "observations_lost_in_link": st.observations_dropped,
            "physics_steps": st.physics_steps,
            "overruns": self._overruns,
            "dropped_time_s": self._dropped_time_s,
        }
        self._diag.publish([make_status(f"{self.get_name()}: simulation", level, message,
                                        values, hardware_id=self._unit_id)])

    def destroy_node(self) -> None:
        """Release the physics client with the node."""
        core = getattr(self, "_core", None)  # absent when construction was refused
        if core is not None:
            core.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the sim_bridge node."""
    return spin_node(SimBridge, args)


if __name__ == "__main__":
    sys.exit(main())

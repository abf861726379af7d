"""sysid_recorder: excite the arm through the safety filter and record everything to a bag.

The excitation goes out as sensor_msgs/JointState on `policy/joint_command`, stamped with the
latest joint_states stamp, so the safety filter (stage `full`, confidence not required) checks
every command; what actually reaches the arm is recorded from
`forward_position_controller/commands`. Every configured topic is recorded as the raw CDR bytes
DDS delivered (no re-serialization) into a rosbag2 MCAP bag whose metadata names the unit and
the safety envelope's hash. With `excitation: none` the node is a plain recorder of a live graph
(fine-tuning data, shadow reports).

Phases: waiting (for joint_states) -> moving (to the centre pose, minimum jerk) -> settling
(hold, which also measures sensor noise at rest) -> exciting -> settling -> done (bag closed).
The excitation aborts, and the bag is marked aborted, when joint_states go stale or the arm
stops following (tracking error over `abort_tracking_error_rad`).
"""

from __future__ import annotations

import importlib
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from sim2real_ros.config import ConfigError, file_sha256
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import MessageError, arrays_to_joint_state, joint_state_to_arrays
from sim2real_ros.ros.diagnostics import ERROR, OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS
from sim2real_ros.sysid import bags
from sim2real_ros.sysid.excitation import (
    KINDS,
    Excitation,
    ExcitationEnvelope,
    ExcitationError,
    append_latency_probe,
    make_excitation,
)

NODE_NAME = "sysid_recorder"
DEFAULT_TOPICS = (
    "joint_states",
    "forward_position_controller/commands",
    "force_torque_sensor_broadcaster/wrench",
    "/diagnostics",
    "policy/joint_command",
    "policy/confidence",
    "safety_filter/events",
    "safety_filter/status",
    "sim_bridge/randomization",
)
# Types of the contract's topics; any other topic's type is discovered from the graph.
KNOWN_TYPES = {
    "joint_states": "sensor_msgs/msg/JointState",
    "forward_position_controller/commands": "std_msgs/msg/Float64MultiArray",
    "forward_effort_controller/commands": "std_msgs/msg/Float64MultiArray",
    "force_torque_sensor_broadcaster/wrench": "geometry_msgs/msg/WrenchStamped",
    "diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
    "policy/joint_command": "sensor_msgs/msg/JointState",
    "baseline/joint_command": "sensor_msgs/msg/JointState",
    "policy/wrench_command": "geometry_msgs/msg/WrenchStamped",
    "policy/confidence": "geometry_msgs/msg/Vector3Stamped",
    "policy_node/active_version": "std_msgs/msg/String",
    "task/target": "geometry_msgs/msg/PointStamped",
    "clock": "rosgraph_msgs/msg/Clock",
    "sim_bridge/randomization": "std_msgs/msg/String",
    "safety_filter/events": "std_msgs/msg/String",
    "safety_filter/status": "std_msgs/msg/String",
}
LATCHED_TOPICS = {"sim_bridge/randomization", "safety_filter/status", "policy_node/active_version"}
RECORD_DEPTH = 1000  # keep-last depth: the executor can fall seconds behind without a drop
PHASES = ("waiting", "moving", "settling", "exciting", "settling_end", "recording", "done",
          "aborted")

PARAMS = [
    ParamSpec("unit_serial", "", "Serial number of the arm being identified (required)."),
    ParamSpec("unit_cell", "", "Cell the arm is installed in."),
    ParamSpec("unit_tool", "", "Tool mounted on the flange (and cables), as an operator names it."),
    ParamSpec("operator_note", "", "Free text stored in the bag's metadata."),
    ParamSpec("output_dir", "bags", "Directory the bag directory is created in."),
    ParamSpec("run_name", "", "Bag directory name; empty = <unit_serial>_<UTC time>."),
    ParamSpec("envelope_file", "", "Safety envelope whose sha256 goes into the bag metadata; "
              "empty = config/safety_envelope.yaml of the package."),
    ParamSpec("excitation", "multisine", "Excitation kind: multisine | chirp | step | none "
              "(none = record only).", choices=(*KINDS, "none")),
    ParamSpec("duration_s", 20.0, "Excitation length, s (record-only: 0 = until ~/stop).",
              low=0.0, high=3600.0),
    ParamSpec("amplitude_rad", 0.3, "Peak offset per joint before envelope scaling, rad.",
              low=0.0, high=1.5),
    ParamSpec("f_min_hz", 0.2, "Lowest excitation frequency, Hz.", low=0.01, high=10.0),
    ParamSpec("f_max_hz", 2.0, "Highest excitation frequency, Hz.", low=0.02, high=10.0),
    ParamSpec("seed", 0, "Seed of the excitation's phases and step levels.", low=0, high=2**31 - 1),
    ParamSpec("center_rad", [0.0], "Centre pose, rad per joint; [0.0] alone = the measured "
              "pose at start."),
    ParamSpec("velocity_fraction", 0.3, "Excitation velocity bound as a fraction of the URDF "
              "velocity limits.", low=0.01, high=0.8),
    ParamSpec("max_acceleration_rad_s2", 3.0, "Excitation acceleration bound, rad/s².",
              low=0.1, high=20.0),
    ParamSpec("position_margin_rad", 0.3, "Excitation stays this far inside the URDF limits, "
              "rad.", low=0.0, high=1.5),
    ParamSpec("settle_s", 2.0, "Hold before and after the excitation (noise at rest), s.",
              low=0.0, high=60.0),
    ParamSpec("latency_probe_moves", 0, "Moves from rest appended after the excitation, "
              "where the fit reads the command path's dead time (a multiple of 6; 0 = none).",
              low=0, high=120),
    ParamSpec("latency_probe_step_rad", 0.03, "Latency probe: each move's length per joint, rad.",
              low=0.001, high=0.2),
    ParamSpec("latency_probe_jerk_rad_s3", 40.0, "Latency probe: peak jerk of a move, rad/s³ "
              "(keep it under the safety envelope's jerk limit).", low=1.0, high=1000.0),
    ParamSpec("latency_probe_hold_s", 0.6, "Latency probe: rest before each move, s.",
              low=0.3, high=5.0),
    ParamSpec("command_rate_hz", 100.0, "Rate of policy/joint_command, Hz.", low=1.0,
              high=1000.0),
    ParamSpec("topics", list(DEFAULT_TOPICS), "Topics to record; 'name' or 'name:pkg/msg/Type' "
              "(types of other topics are taken from the graph)."),
    ParamSpec("joints", [""], "Joint order of commands; [''] = the URDF's joints."),
    ParamSpec("urdf_path", "", "URDF of the arm; empty = the package's arm."),
    ParamSpec("autostart", True, "Start as soon as joint_states arrive (else call ~/start)."),
    ParamSpec("exit_when_done", False, "Shut the node down once the bag is closed."),
    ParamSpec("joint_states_timeout_s", 0.5, "joint_states older than this abort the "
              "excitation, s.", low=0.01, high=10.0),
    ParamSpec("abort_tracking_error_rad", 0.3, "Abort when any joint is this far from its "
              "excitation target, rad.", low=0.01, high=3.0),
    ParamSpec("command_path_timeout_s", 15.0, "Before exciting, wait this long for the command "
              "path to connect (a subscriber on policy/joint_command and, when recorded, a "
              "publisher on forward_position_controller/commands); abort if it does not, s.",
              low=0.1, high=600.0),
    ParamSpec("diagnostics_period_s", 1.0, "Period of /diagnostics, s.", low=0.05, high=60.0),
]


def _relative(topic: str) -> str:
    return topic.lstrip("/")


def message_class(msgtype: str) -> Any:
    """Import the Python class of 'pkg/msg/Name'."""
    parts = msgtype.split("/")
    if len(parts) != 3:
        raise ConfigError(None, "topics", msgtype, "a message type 'pkg/msg/Name'")
    try:
        return getattr(importlib.import_module(f"{parts[0]}.{parts[1]}"), parts[2])
    except (ImportError, AttributeError) as exc:
        raise ConfigError(None, "topics", msgtype, f"an installed message type ({exc})") from exc


def recording_qos(node: Node, topic: str) -> QoSProfile:
    """Match the publishers (as rosbag2 does): latched stays latched, best effort is accepted."""
    infos = node.get_publishers_info_by_topic(topic)
    transient = _relative(topic) in LATCHED_TOPICS
    best_effort = _relative(topic) == "clock"
    if infos:
        transient = all(i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL
                        for i in infos)
        best_effort = any(i.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT
                          for i in infos)
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=RECORD_DEPTH,
        reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if transient else DurabilityPolicy.VOLATILE,
    )


def min_jerk_duration_s(delta_rad: np.ndarray, v_max: np.ndarray, a_max: np.ndarray) -> float:
    """Return the shortest minimum-jerk move respecting velocity and acceleration bounds."""
    d = np.abs(delta_rad)
    t_v = 1.875 * d / np.maximum(v_max, 1e-9)
    t_a = np.sqrt(5.774 * d / np.maximum(a_max, 1e-9))
    return float(max(np.max(t_v), np.max(t_a), 0.5))


class SysidRecorder(Node):
    """Runs an excitation through the safety filter and records the graph to a bag."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.p = declare_params(self, PARAMS)
        p = self.p
        if not str(p["unit_serial"]).strip():
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "unit_serial", "",
                              "the serial of the arm being measured (a bag must name its unit)")
        urdf = Path(p["urdf_path"]) if p["urdf_path"] else default_urdf()
        self.arm = load_arm(urdf)
        joints = [j for j in p["joints"] if j]
        self.joints: list[str] = joints or list(self.arm.joint_names)
        unknown = [j for j in self.joints if j not in self.arm.joint_names]
        if unknown:
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "joints", unknown,
                              f"joints of {urdf} ({self.arm.joint_names})")
        self.kind = str(p["excitation"])
        if self.kind != "none" and p["duration_s"] < 0.5:
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "duration_s",
                              p["duration_s"], ">= 0.5 s for an excitation")
        if p["f_min_hz"] >= p["f_max_hz"]:
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "f_min_hz",
                              p["f_min_hz"], f"< f_max_hz ({p['f_max_hz']})")
        self.envelope = ExcitationEnvelope.from_arm(
            self.arm, p["position_margin_rad"], p["velocity_fraction"],
            p["max_acceleration_rad_s2"])
        center = np.asarray(p["center_rad"], dtype=float)
        self.center: np.ndarray | None = None
        if not (center.size == 1 and center[0] == 0.0):
            if center.size != self.arm.n_joints:
                raise ConfigError(f"ROS parameters of /{self.get_name()}", "center_rad",
                                  center.tolist(), f"{self.arm.n_joints} values or [0.0]")
            self.center = center
        env_file = Path(p["envelope_file"]) if p["envelope_file"] else share_path(
            "config", "safety_envelope.yaml")
        self.envelope_sha256 = file_sha256(env_file) if env_file.is_file() else ""
        if p["envelope_file"] and not env_file.is_file():
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "envelope_file",
                              str(env_file), "an existing safety envelope file")
        stamp = datetime.now(timezone.utc)
        name = p["run_name"] or f"{p['unit_serial']}_{stamp.strftime('%Y%m%dT%H%M%SZ')}"
        self.bag_path = Path(p["output_dir"]) / name
        if self.bag_path.exists():
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "run_name", name,
                              f"a bag name not yet used in {p['output_dir']} (never overwritten)")
        self.metadata: dict[str, Any] = bags.unit_metadata(
            str(p["unit_serial"]), str(p["unit_cell"]), str(p["unit_tool"]),
            stamp.isoformat(timespec="seconds"), str(p["operator_note"]), self.envelope_sha256,
            run_id=name, joints=self.joints, recorder=NODE_NAME,
            excitation={"kind": self.kind},
        )
        self.bag: bags.BagWriter | None = None
        self.phase = "waiting"
        self.failed = False
        self.reason = ""
        self._exc: Excitation | None = None
        self._phase_t0 = 0.0
        self._phase_ticks = 0
        self._move_from: np.ndarray | None = None
        self._move_s = 0.0
        self._hold: np.ndarray | None = None
        self._last_js_stamp = None
        self._last_js_rx_s: float | None = None
        self._last_q: np.ndarray | None = None
        self._js_stamps: list[float] = []
        self._started = bool(p["autostart"])
        self._path_wait_t0: float | None = None
        self._subs: dict[str, Any] = {}
        self._pending: list[tuple[str, str | None]] = []
        for entry in p["topics"]:
            if not entry:
                continue
            topic, _, msgtype = str(entry).partition(":")
            self._pending.append((topic, msgtype or KNOWN_TYPES.get(_relative(topic))))
        self._cmd_pub = self.create_publisher(JointState, "policy/joint_command", COMMAND_QOS)
        self._diag = DiagnosticsPublisher(self)
        self.create_service(Trigger, "~/start", self._on_start)
        self.create_service(Trigger, "~/stop", self._on_stop)
        self.bag = bags.BagWriter(self.bag_path, self.metadata).open()
        self._subscribe_pending()
        if self._pending:
            self._discover = self.create_timer(0.5, self._subscribe_pending)
        self._tick_timer = self.create_timer(1.0 / p["command_rate_hz"], self._tick)
        self._diag_timer = self.create_timer(p["diagnostics_period_s"], self._publish_diag)
        if self.kind == "none" and self._started:
            self._enter("recording")
        self.get_logger().info(f"recording to {self.bag_path} (excitation: {self.kind})")

    # ----------------------------------------------------------------- recording
    def _subscribe_pending(self) -> None:
        if not self._pending:
            return
        graph = dict(self.get_topic_names_and_types())
        still = []
        for topic, msgtype in self._pending:
            resolved = self.resolve_topic_name(topic)
            if msgtype is None:
                types = graph.get(resolved)
                if not types:
                    still.append((topic, None))
                    continue
                msgtype = types[0]
            cls = message_class(msgtype)
            qos = recording_qos(self, resolved)
            assert self.bag is not None
            if not self.bag.has_topic(resolved):
                self.bag.add_topic(resolved, msgtype, bags.make_qos(
                    reliable=qos.reliability == ReliabilityPolicy.RELIABLE,
                    transient_local=qos.durability == DurabilityPolicy.TRANSIENT_LOCAL))
            self._subs[resolved] = self.create_subscription(
                cls, resolved, self._recorder(resolved, msgtype), qos, raw=True)
        self._pending = still

    def _recorder(self, topic: str, msgtype: str) -> Any:
        is_js = topic == self.resolve_topic_name("joint_states")

        def callback(raw: bytes) -> None:
            now_ns = self.get_clock().now().nanoseconds
            if self.bag is not None and self.bag.is_open:
                self.bag.write(topic, now_ns, raw)
            if is_js:
                self._on_joint_state(raw, now_ns)

        return callback

    def _on_joint_state(self, raw: bytes, now_ns: int) -> None:
        msg = deserialize_message(raw, JointState)
        try:
            arrays = joint_state_to_arrays(msg, self.joints)
        except MessageError as exc:
            self.get_logger().warning(f"joint_states unusable: {exc}", throttle_duration_sec=5.0)
            return
        self._last_js_stamp = msg.header.stamp
        self._last_js_rx_s = now_ns * 1e-9
        self._last_q = arrays.position
        self._js_stamps.append(arrays.stamp_s)

    # ----------------------------------------------------------------- excitation
    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self._phase_t0 = self._now_s()
        self._phase_ticks = 0
        self.get_logger().info(f"phase: {phase}")

    def _abort(self, reason: str) -> None:
        self.failed = True
        self.reason = reason
        self.get_logger().error(f"excitation aborted: {reason}")
        self._enter("aborted")
        self._finish(f"aborted: {reason}")

    def _tick(self) -> None:
        if self.phase in ("done", "aborted"):
            return
        now = self._now_s()
        if self.phase == "recording":
            dur = float(self.p["duration_s"])
            if dur > 0.0 and now - self._phase_t0 >= dur:
                self._finish("complete")
            return
        if self.phase == "waiting":
            if self._last_q is not None and self._started:
                missing = self._command_path_missing()
                if not missing:
                    self._start_excitation()
                    return
                if self._path_wait_t0 is None:
                    self._path_wait_t0 = now
                waited = now - self._path_wait_t0
                if waited > float(self.p["command_path_timeout_s"]):
                    self._abort(f"command path not connected after {waited:.1f} s: {missing} "
                                "(is the safety filter running?)")
                    return
                self.get_logger().info(f"waiting for the command path: {missing}",
                                       throttle_duration_sec=2.0)
            return
        # joint_states must stay fresh while we command the arm
        assert self._last_js_rx_s is not None
        if now - self._last_js_rx_s > self.p["joint_states_timeout_s"]:
            self._abort(f"joint_states stale for {now - self._last_js_rx_s:.3f} s")
            return
        # The trajectory is sampled on the command grid, k periods into the phase, not at the
        # timer's wall-clock time: the safety filter divides each command change by the
        # nominal period, so a sample taken 3 ms late read as jerk (0.16 rad/s x 3 ms over
        # (10 ms)^3 ~ 480 rad/s^3 against a 72 rad/s^3 limit). It trimmed the excitation and
        # overshot every stop by up to 1.5 mrad, then crept back (docs/sysid.md). A slipped
        # timer tick plays the trajectory that much later; the bag has the times it was sent.
        t = self._phase_ticks / float(self.p["command_rate_hz"])
        self._phase_ticks += 1
        target = self._target(t)
        if target is None:
            return
        assert self._last_q is not None
        err = np.abs(self._last_q - target)
        if self.phase in ("exciting", "settling", "settling_end") and err.max() > self.p[
                "abort_tracking_error_rad"]:
            j = int(np.argmax(err))
            self._abort(f"{self.joints[j]} is {err[j]:.3f} rad from its target (the arm is not "
                        "following: safety filter holding or e-stopped?)")
            return
        msg = arrays_to_joint_state(self.joints, self._last_js_stamp, position=target)
        self._cmd_pub.publish(msg)

    def _command_path_missing(self) -> str:
        """Say what of the command path is not connected yet; '' when all of it is.

        Exciting before the path is up would send commands nobody forwards and record a bag
        whose commands start late: the arm must be listening to us, and the commands the
        filter sends on must reach the bag.
        """
        missing = []
        me = (self.get_name(), self.get_namespace())

        def others(infos: Any) -> int:  # our own recording subscription does not count
            return sum(1 for i in infos if (i.node_name, i.node_namespace) != me)

        cmd = self._cmd_pub.topic_name
        if others(self.get_subscriptions_info_by_topic(cmd)) == 0:
            missing.append(f"no subscriber on {cmd}")
        fwd = self.resolve_topic_name("forward_position_controller/commands")
        if fwd in self._subs and others(self.get_publishers_info_by_topic(fwd)) == 0:
            missing.append(f"no publisher on {fwd}")
        return "; ".join(missing)

    def _target(self, t: float) -> np.ndarray | None:
        assert self._hold is not None and self._exc is not None
        settle = float(self.p["settle_s"])
        if self.phase == "moving":
            assert self._move_from is not None
            s = min(t / self._move_s, 1.0)
            blend = s**3 * (10.0 - 15.0 * s + 6.0 * s**2)
            if s >= 1.0:
                self._enter("settling")
            return self._move_from + (self._hold - self._move_from) * blend
        if self.phase == "settling":
            if t >= settle:
                self._enter("exciting")
            return self._hold.copy()
        if self.phase == "exciting":
            if t >= self._exc.duration_s:
                self._enter("settling_end")
                return self._exc.q[-1].copy()
            return self._exc.at(t)
        if self.phase == "settling_end":
            if t >= settle:
                self._finish("complete")
                return None
            return self._exc.q[-1].copy()
        return None

    def _start_excitation(self) -> None:
        assert self._last_q is not None
        q_now = self._last_q.copy()
        center = self.center if self.center is not None else q_now
        p = self.p
        try:
            self._exc = make_excitation(self.kind, center, self.envelope, float(p["duration_s"]),
                                        float(p["amplitude_rad"]), float(p["f_min_hz"]),
                                        float(p["f_max_hz"]), int(p["seed"]))
            if int(p["latency_probe_moves"]) > 0:
                self._exc = append_latency_probe(
                    self._exc, self.envelope, int(p["latency_probe_moves"]),
                    float(p["latency_probe_step_rad"]), float(p["latency_probe_jerk_rad_s3"]),
                    float(p["latency_probe_hold_s"]), int(p["seed"]))
        except ExcitationError as exc:
            self._abort(f"cannot excite around {np.round(center, 3).tolist()}: {exc}")
            return
        self.metadata["excitation"] = self._exc.describe()
        self.metadata["excitation"]["settle_s"] = float(p["settle_s"])
        self._hold = self._exc.q[0].copy()
        self._move_from = q_now
        delta = self._hold - q_now
        if np.abs(delta).max() > 1e-3:
            self._move_s = min_jerk_duration_s(delta, self.envelope.max_velocity_rad_s,
                                               self.envelope.max_acceleration_rad_s2)
            self._enter("moving")
        else:
            self._enter("settling")

    def _finish(self, status: str) -> None:
        if self.phase not in ("done", "aborted"):
            self._enter("done")
        self._close_bag(status)
        if self.p["exit_when_done"]:
            self.get_logger().info("done; shutting down (exit_when_done)")
            self.context.try_shutdown()

    def _close_bag(self, status: str) -> None:
        bag, self.bag = self.bag, None
        if bag is None:
            return
        bag.metadata = self.metadata
        bag.status = status
        bag.metadata["joint_states_gaps"] = self.joint_state_gaps()
        bag.close()
        counts = ", ".join(f"{t}: {c}" for t, c in sorted(bag.counts.items()))
        self.get_logger().info(f"bag closed ({status}): {self.bag_path} [{counts}]")

    def joint_state_gaps(self) -> int:
        """Return how many joint_states stamp gaps exceed 1.5 median periods (dropped samples)."""
        if len(self._js_stamps) < 3:
            return 0
        d = np.diff(np.asarray(self._js_stamps))
        med = float(np.median(d))
        return int(np.sum(d > 1.5 * med)) if med > 0 else 0

    # ----------------------------------------------------------------- services, health
    def _on_start(self, _req: Trigger.Request, resp: Trigger.Response) -> Trigger.Response:
        if self.phase != "waiting":
            resp.success, resp.message = False, f"already {self.phase}"
            return resp
        self._started = True
        if self.kind == "none":
            self._enter("recording")
        resp.success = True
        resp.message = "started" if self._last_q is not None or self.kind == "none" else \
            "starting when joint_states arrive"
        return resp

    def _on_stop(self, _req: Trigger.Request, resp: Trigger.Response) -> Trigger.Response:
        if self.phase in ("done", "aborted"):
            resp.success, resp.message = False, f"already {self.phase}"
            return resp
        excitation_running = self.phase in ("moving", "settling", "exciting", "settling_end")
        status = "aborted: stopped by ~/stop during the excitation" if excitation_running \
            else "complete"
        self._finish(status)
        resp.success, resp.message = True, f"bag closed: {self.bag_path} ({status})"
        return resp

    def _publish_diag(self) -> None:
        counts = dict(self.bag.counts) if self.bag is not None else {}
        values: dict[str, Any] = {
            "phase": self.phase,
            "bag": str(self.bag_path),
            "unit_serial": self.p["unit_serial"],
            "envelope_sha256": self.envelope_sha256,
            "joint_states_gaps": self.joint_state_gaps(),
            "topics_waiting_for_type": len(self._pending),
        }
        for t, c in counts.items():
            values[f"messages{t}"] = c
        level, text = OK, self.phase
        if self.phase == "aborted":
            level, text = ERROR, f"aborted: {self.reason}"
        elif self.phase == "waiting" and self._last_q is None:
            level, text = WARN, "waiting for joint_states"
        elif self._pending:
            level, text = WARN, f"{len(self._pending)} topics not yet on the graph"
        self._diag.publish([make_status(f"{NODE_NAME}: recording", level, text, values,
                                        hardware_id=str(self.p["unit_serial"]))])

    def destroy_node(self) -> None:
        """Close the bag (marked aborted if an excitation was cut short) before going."""
        if self.bag is not None:
            running = self.phase in ("moving", "settling", "exciting", "settling_end")
            self._close_bag("aborted: node shut down during the excitation" if running
                            else "complete")
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the recorder; exit code 1 when the excitation aborted, 2 on bad configuration."""
    holder: dict[str, SysidRecorder] = {}

    def make() -> SysidRecorder:
        holder["node"] = SysidRecorder()
        return holder["node"]

    rc = spin_node(make, args)
    node = holder.get("node")
    if rc == 0 and node is not None and node.failed:
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())

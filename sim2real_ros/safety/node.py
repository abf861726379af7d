"""Node `safety_filter`: every command to the arm passes through here, inside the envelope.

Subscribes `joint_states`, `force_torque_sensor_broadcaster/wrench`, `policy/joint_command`,
`policy/wrench_command`, `policy/confidence` and `baseline/joint_command`; publishes the arm
command (`forward_position_controller/commands`, or the velocity/effort controller's topic),
`safety_filter/wrench_command` (the clipped policy wrench while the policy drives),
`safety_filter/events` (one JSON object per event, envelope hash included),
`safety_filter/status` (latched JSON, on change) and `/diagnostics`. Service
`safety_filter/reset_estop` (std_srvs/Trigger). Parameter `rollout_stage` may be set at run time.
When the monitor fires it calls `policy_node/rollback` asynchronously (the control loop never
waits), retries, and drops the stage. All decisions live in the Supervisor; this file converts
messages and owns the clock.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from typing import Any

from geometry_msgs.msg import Vector3Stamped, WrenchStamped
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, String
from std_srvs.srv import Trigger

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import (
    MessageError,
    array_to_wrench,
    joint_state_to_arrays,
    stamp_to_s,
    wrench_to_array,
)
from sim2real_ros.ros.diagnostics import ERROR, OK, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS
from sim2real_ros.safety import events as ev
from sim2real_ros.safety.envelope import load_envelope
from sim2real_ros.safety.events import EventCounter, SafetyEvent
from sim2real_ros.safety.monitor import INTERVENTION_LIMITS, SMOOTHING_LIMITS, MonitorConfig
from sim2real_ros.safety.projection import EFFORT, MODES, POSITION, VELOCITY
from sim2real_ros.safety.supervisor import (
    SOURCE_HOLD,
    SOURCE_POLICY,
    STAGES,
    Supervisor,
    SupervisorConfig,
)
from sim2real_ros.safety.timebase import RATE_TIME_BASES, SMOOTHED, RateTimeBase
from sim2real_ros.safety.ticks import DEFAULT_GRACE_PERIODS, TickScheduler

NODE_NAME = "safety_filter"
COMMAND_TOPICS = {
    POSITION: "forward_position_controller/commands",
    VELOCITY: "forward_velocity_controller/commands",
    EFFORT: "forward_effort_controller/commands",
}
RO = True  # safety limits are read-only at run time (set them in the params file)

PARAMS = [
    ParamSpec("urdf_path", "", "URDF of the arm; '' = the shipped arm.", read_only=RO),
    ParamSpec("envelope_file", "",
              "Safety envelope YAML (owned by operations); '' = config/safety_envelope.yaml.",
              read_only=RO),
    ParamSpec("joints", [""],
              "Joint order of the arm command (the forward controller's `joints`); [''] = the "
              "URDF's movable joints in chain order.",
              param_type=Parameter.Type.STRING_ARRAY, read_only=RO),
    ParamSpec("rollout_stage", "shadow",
              "Who drives: shadow|advisory = the baseline, limited = the policy inside the "
              "envelope scaled by limited_scale, full = the policy. Settable at run time.",
              choices=STAGES),
    ParamSpec("require_confidence", True,
              "Policy must publish policy/confidence to drive (false only for excitation "
              "sources such as sysid)."),
    ParamSpec("command_interface", POSITION,
              "Arm command: position (forward_position_controller), velocity or effort.",
              choices=MODES, read_only=RO),
    ParamSpec("control_rate_hz", 100.0, "Control loop rate (Hz).", low=1.0, high=1000.0,
              read_only=RO),
    ParamSpec("tick_on_command", True,
              "Also run the loop when the driving source's command arrives (lower latency); "
              "the timer keeps the rate and the watchdog when commands stop.", read_only=RO),
    ParamSpec("late_command_grace_periods", DEFAULT_GRACE_PERIODS,
              "With tick_on_command: the timer re-projects the driving source's last command "
              "only once it is this many control periods old (a later one is still one "
              "sample of the stream: projected once when it arrives, never repeated or "
              "skipped); in between the arm holds its last setpoint.", low=1.0, high=10.0,
              read_only=RO),
    ParamSpec("rate_time_base", SMOOTHED,
              "dt the projection's velocity/acceleration/jerk limits divide a command change "
              "by: arrival (measured tick interval, clamped to [0.5, 2] periods: ms arrival "
              "jitter reads as speed), nominal (the control period), smoothed (the period "
              "unless a running mean of the measured intervals, ~20 ticks, is more than 5 % "
              "shorter, then that mean: jitter averages out, a sustained faster stream is "
              "still limited, a slower one is safe at the period); a hold always uses the period. Staleness and latency checks "
              "always use real arrival times and stamps.",
              choices=RATE_TIME_BASES, read_only=RO),
    ParamSpec("command_timeout_s", 0.025,
              "Policy command stale after this long without a message (s).", low=0.001,
              high=10.0, read_only=RO),
    ParamSpec("max_command_age_s", 0.1,
              "Policy command stale when its stamp is this much older than the newest "
              "joint_states stamp (s).", low=0.001, high=10.0, read_only=RO),
    ParamSpec("baseline_timeout_s", 0.025, "Baseline command stale after (s).", low=0.001,
              high=10.0, read_only=RO),
    ParamSpec("max_baseline_age_s", 0.1, "Baseline stamp age limit vs joint_states (s).",
              low=0.001, high=10.0, read_only=RO),
    ParamSpec("state_timeout_s", 0.025, "joint_states stale after this long without one (s).",
              low=0.001, high=10.0, read_only=RO),
    ParamSpec("max_state_age_s", 0.25,
              "joint_states stale when its stamp lags the node clock by more (s).", low=0.001,
              high=1e6, read_only=RO),
    ParamSpec("confidence_timeout_s", 0.05, "policy/confidence stale after (s).", low=0.001,
              high=10.0, read_only=RO),
    ParamSpec("future_tolerance_s", 0.02,
              "How far a command's stamp may lead the node clock before it counts as from the "
              "future (s).",
              low=0.0, high=1.0, read_only=RO),
    ParamSpec("clock_jump_s", 0.5,
              "A forward step of the node clock larger than this between ticks is a jump (s).",
              low=0.01, high=60.0, read_only=RO),
    ParamSpec("disagreement_enter_rad", 0.1, "Fall back above this ensemble disagreement (rad).",
              low=1e-6, high=10.0, read_only=RO),
    ParamSpec("disagreement_exit_rad", 0.07,
              "Return only below this disagreement (rad), <= disagreement_enter_rad.", low=0.0,
              high=10.0, read_only=RO),
    ParamSpec("ood_enter", 3.0, "Fall back above this OOD score.", low=1e-6, high=1e3,
              read_only=RO),
    ParamSpec("ood_exit", 2.5, "Return only below this OOD score (<= ood_enter).", low=0.0,
              high=1e3, read_only=RO),
    ParamSpec("calm_period_s", 1.0,
              "The policy returns only after this long with every signal good (s).", low=0.0,
              high=600.0, read_only=RO),
    ParamSpec("invalid_estop_count", 10,
              "This many invalid policy commands within invalid_window_s latch the e-stop.",
              low=1, high=100000, read_only=RO),
    ParamSpec("invalid_window_s", 1.0, "Window for counting invalid commands (s).", low=0.01,
              high=600.0, read_only=RO),
    ParamSpec("hard_limit_tolerance_rad", 0.0,
              "A measured joint this far beyond its URDF limit latches the e-stop (rad).",
              low=0.0, high=1.0, read_only=RO),
    ParamSpec("force_warning_fraction", 0.5,
              "Wrist force above this fraction of the envelope counts as a force event.",
              low=0.01, high=1.0, read_only=RO),
    ParamSpec("wrench_timeout_s", 0.1, "F/T wrench stale after (s).", low=0.001, high=10.0,
              read_only=RO),
    ParamSpec("handover_grace_s", 1.0,
              "After the policy regains authority, the monitor ignores the projector's "
              "catch-up corrections for this long (s).", low=0.0, high=60.0, read_only=RO),
    ParamSpec("monitor_window_s", 2.0, "Sliding window of the rollback monitor (s).", low=0.05,
              high=3600.0, read_only=RO),
    ParamSpec("monitor_min_fill", 0.9, "Fraction of the window filled before judging.",
              low=0.01, high=1.0, read_only=RO),
    ParamSpec("monitor_max_intervention_rate", 0.5,
              "Roll back above this fraction of projected ticks.", low=1e-6, high=1.0,
              read_only=RO),
    ParamSpec("monitor_max_fallback_rate", 0.5,
              "Roll back above this fraction of ticks in fallback (limited/full).", low=1e-6,
              high=1.0, read_only=RO),
    ParamSpec("monitor_min_intervention_rad", 0.001,
              "A tick counts as an intervention for the monitor only if the projection moved "
              "the command by more than this (rad).", low=0.0, high=10.0, read_only=RO),
    ParamSpec("monitor_max_tracking_error_rad", 0.25,
              "Roll back above this mean |command - measured| (rad).", low=1e-6, high=10.0,
              read_only=RO),
    ParamSpec("monitor_max_force_events", 5, "Roll back above this many force events.", low=1,
              high=100000, read_only=RO),
    ParamSpec("monitor_cooldown_s", 5.0, "No second rollback within this time (s).", low=0.0,
              high=3600.0, read_only=RO),
    ParamSpec("monitor_ignored_limits", list(SMOOTHING_LIMITS),
              "Limits whose interventions the monitor's rate does not count (still reported); "
              "[''] counts every limit.", read_only=RO),
    ParamSpec("rollback_service", "policy_node/rollback",
              "std_srvs/Trigger service called when the monitor fires.", read_only=RO),
    ParamSpec("rollback_retries", 5, "Calls after the first one if it fails or is unavailable.",
              low=0, high=1000, read_only=RO),
    ParamSpec("rollback_retry_period_s", 1.0, "Time between rollback attempts (s).", low=0.01,
              high=600.0, read_only=RO),
    ParamSpec("event_throttle_s", 0.1,
              "Identical intervention events are published at most once per this (s); all "
              "are counted.", low=0.0, high=60.0, read_only=RO),
    ParamSpec("diagnostics_period_s", 1.0, "Period of /diagnostics (s).", low=0.01, high=60.0,
              read_only=RO),
]


class SafetyFilter(Node):
    """Safety filter: projection, watchdog, fallback, e-stop and rollback monitor."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.p = declare_params(self, PARAMS, on_change=self._on_param_change)
        p = self.p
        urdf = p["urdf_path"] or str(default_urdf())
        arm = load_arm(urdf)
        env_path = p["envelope_file"] or str(share_path("config", "safety_envelope.yaml"))
        self.envelope = load_envelope(env_path, arm)
        internal = arm.joint_names
        joints = [j for j in p["joints"] if j] or list(internal)
        if sorted(joints) != sorted(internal) or len(set(joints)) != len(joints):
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "joints", joints,
                              f"a permutation of the arm's joints {internal}")
        self.joints = joints
        self._out_index = [internal.index(j) for j in joints]
        self.internal_joints = internal
        period = 1.0 / p["control_rate_hz"]
        self.period_s = period
        monitor = MonitorConfig(
            window_s=p["monitor_window_s"], min_fill=p["monitor_min_fill"],
            max_intervention_rate=p["monitor_max_intervention_rate"],
            max_fallback_rate=p["monitor_max_fallback_rate"],
            min_intervention_rad=p["monitor_min_intervention_rad"],
            max_tracking_error_rad=p["monitor_max_tracking_error_rad"],
            max_force_events=p["monitor_max_force_events"], cooldown_s=p["monitor_cooldown_s"],
            ignored_limits=self._ignored_limits(p["monitor_ignored_limits"]))
        cfg = SupervisorConfig(
            period_s=period, mode=p["command_interface"],
            command_timeout_s=p["command_timeout_s"], max_command_age_s=p["max_command_age_s"],
            baseline_timeout_s=p["baseline_timeout_s"],
            max_baseline_age_s=p["max_baseline_age_s"], state_timeout_s=p["state_timeout_s"],
            max_state_age_s=p["max_state_age_s"], confidence_timeout_s=p["confidence_timeout_s"],
            future_tolerance_s=p["future_tolerance_s"], clock_jump_s=p["clock_jump_s"],
            require_confidence=p["require_confidence"],
            disagreement_enter_rad=p["disagreement_enter_rad"],
            disagreement_exit_rad=p["disagreement_exit_rad"], ood_enter=p["ood_enter"],
            ood_exit=p["ood_exit"], calm_period_s=p["calm_period_s"],
            invalid_estop_count=p["invalid_estop_count"], invalid_window_s=p["invalid_window_s"],
            hard_limit_tolerance_rad=p["hard_limit_tolerance_rad"],
            force_warning_fraction=p["force_warning_fraction"],
            wrench_timeout_s=p["wrench_timeout_s"], handover_grace_s=p["handover_grace_s"],
            monitor=monitor)
        why = cfg.check()
        if why:
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "<thresholds>", None, why)
        self.sup = Supervisor(self.envelope, arm, cfg, stage=p["rollout_stage"])
        self.mode = p["command_interface"]
        self.counter = EventCounter()
        self._throttle: dict[tuple[str, str, str], tuple[float, int]] = {}
        self._ticks = TickScheduler(period, p["tick_on_command"],
                                    p["late_command_grace_periods"])
        self._timebase = RateTimeBase(p["rate_time_base"], period)
        self._tick_wall_us: list[float] = []
        self._alarm = ""
        self.rollback_state = "idle"
        self.rollback_requests = 0
        self._rollback_attempts_left = 0
        self._rollback_reason = ""
        self._rollback_future: Any = None

        self.cmd_pub = self.create_publisher(Float64MultiArray, COMMAND_TOPICS[self.mode],
                                             COMMAND_QOS)
        self.wrench_pub = self.create_publisher(WrenchStamped, "safety_filter/wrench_command",
                                                COMMAND_QOS)
        self.event_pub = self.create_publisher(String, "safety_filter/events", EVENT_QOS)
        self.status_pub = self.create_publisher(String, "safety_filter/status", LATCHED_QOS)
        self.diag = DiagnosticsPublisher(self)
        self.create_subscription(JointState, "joint_states", self._on_joint_state, STATE_QOS)
        self.create_subscription(WrenchStamped, "force_torque_sensor_broadcaster/wrench",
                                 self._on_wrench, STATE_QOS)
        self.create_subscription(JointState, "policy/joint_command", self._on_policy,
                                 COMMAND_QOS)
        self.create_subscription(WrenchStamped, "policy/wrench_command", self._on_policy_wrench,
                                 COMMAND_QOS)
        self.create_subscription(Vector3Stamped, "policy/confidence", self._on_confidence,
                                 COMMAND_QOS)
        self.create_subscription(JointState, "baseline/joint_command", self._on_baseline,
                                 COMMAND_QOS)
        self.create_service(Trigger, "safety_filter/reset_estop", self._on_reset_estop)
        self.rollback_client = self.create_client(Trigger, p["rollback_service"])
        self.create_timer(period, self._on_timer)
        self.create_timer(p["diagnostics_period_s"], self._publish_diagnostics)
        self._retry_timer = self.create_timer(p["rollback_retry_period_s"], self._retry_rollback)
        self._retry_timer.cancel()
        self._publish_status()
        self.get_logger().info(
            f"safety_filter: stage {self.sup.stage}, {self.mode} commands on "
            f"{COMMAND_TOPICS[self.mode]}, envelope {env_path} sha256 {self.envelope.sha256}")

    # -- clock and parameters --------------------------------------------------------------
    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_param_change(self, changes: dict[str, Any]) -> str | None:
        if "rollout_stage" in changes:
            try:
                self.sup.set_stage(changes["rollout_stage"], self._now_s(), "parameter set")
            except ValueError as exc:
                return str(exc)
        if "require_confidence" in changes:
            self.sup.config = dataclasses.replace(
                self.sup.config, require_confidence=bool(changes["require_confidence"]))
        return None

    # -- inputs ----------------------------------------------------------------------------
    def _field(self, msg: JointState) -> list[float]:
        if self.mode == VELOCITY:
            return list(msg.velocity)
        if self.mode == EFFORT:
            return list(msg.effort)
        return list(msg.position)

    def _on_joint_state(self, msg: JointState) -> None:
        now = self._now_s()
        try:
            arr = joint_state_to_arrays(msg, self.internal_joints)
        except MessageError as exc:
            self._emit([SafetyEvent(ev.INVALID_INPUT, "joint_states", "", math.nan, str(exc),
                                    now)])
            return
        self.sup.on_joint_state(now, arr.stamp_s, arr.position.tolist(),
                                None if arr.velocity is None else arr.velocity.tolist())

    def _on_wrench(self, msg: WrenchStamped) -> None:
        self.sup.on_wrench(self._now_s(), stamp_to_s(msg.header.stamp),
                           wrench_to_array(msg).tolist())
        if self.sup.estop and self.sup.source != SOURCE_HOLD:
            # A force spike must not wait for the next timer tick.
            self._tick()

    def _on_policy(self, msg: JointState) -> None:
        self.sup.on_policy_command(self._now_s(), stamp_to_s(msg.header.stamp), list(msg.name),
                                   self._field(msg))
        if self.sup.source == SOURCE_POLICY:
            self._tick_on_command()

    def _on_policy_wrench(self, msg: WrenchStamped) -> None:
        self.sup.on_policy_wrench(self._now_s(), stamp_to_s(msg.header.stamp),
                                  wrench_to_array(msg).tolist())

    def _on_confidence(self, msg: Vector3Stamped) -> None:
        self.sup.on_confidence(self._now_s(), stamp_to_s(msg.header.stamp), msg.vector.x,
                               msg.vector.y)

    def _on_baseline(self, msg: JointState) -> None:
        self.sup.on_baseline_command(self._now_s(), stamp_to_s(msg.header.stamp),
                                     list(msg.name), self._field(msg))
        if self.sup.source != SOURCE_POLICY and self.sup.source != SOURCE_HOLD:
            self._tick_on_command()

    def _on_reset_estop(self, request: Trigger.Request, response: Trigger.Response
                        ) -> Trigger.Response:
        ok, message = self.sup.reset_estop(self._now_s())
        response.success = ok
        response.message = message
        self.get_logger().warning(f"reset_estop: {message}")
        self._tick()
        return response

    # -- the loop --------------------------------------------------------------------------
    def _tick_on_command(self) -> None:
        if self._ticks.on_command(self._now_s()):
            self._tick()

    def _on_timer(self) -> None:
        # safety/ticks.py: one tick per new command of the driving source; the timer runs
        # the loop when the filter holds or the stream is late (or tick_on_command is off).
        if self._ticks.on_timer(self._now_s(), holding=self.sup.source == SOURCE_HOLD):
            self._tick()

    def _tick(self) -> None:
        t0 = time.perf_counter()
        now = self._now_s()
        dt = self._timebase.tick(now, hold=self.sup.source == SOURCE_HOLD)
        self._ticks.ticked(now)
        res = self.sup.tick(now, dt)
        if res.command:
            out = [res.command[i] for i in self._out_index]
            msg = Float64MultiArray()
            msg.layout.dim = [MultiArrayDimension(label="joints", size=len(out),
                                                  stride=len(out))]
            msg.data = out
            self.cmd_pub.publish(msg)
        if res.wrench is not None:
            self.wrench_pub.publish(array_to_wrench(res.wrench, self.get_clock().now().to_msg(),
                                                    "ft_sensor_link"))
        if res.events:
            self._emit(res.events)
        if res.rollback is not None:
            self._alarm = "; ".join(res.rollback.reasons)
            self._start_rollback(self._alarm)
            # Keep the parameter in step with the stage the monitor dropped to.
            self.set_parameters([Parameter("rollout_stage", Parameter.Type.STRING,
                                           self.sup.stage)])
        if res.status_changed:
            self._publish_status()
        self._tick_wall_us.append((time.perf_counter() - t0) * 1e6)
        if len(self._tick_wall_us) > 1000:
            del self._tick_wall_us[:500]

    # -- outputs ---------------------------------------------------------------------------
    def _emit(self, events: list[SafetyEvent]) -> None:
        self.counter.add(events)
        throttle = self.p["event_throttle_s"]
        for e in events:
            extra: dict[str, Any] = {}
            if e.kind == ev.INTERVENTION and throttle > 0.0:
                key = (e.kind, e.limit, e.joint)
                last, suppressed = self._throttle.get(key, (-math.inf, 0))
                if e.t_s - last < throttle:
                    self._throttle[key] = (last, suppressed + 1)
                    continue
                self._throttle[key] = (e.t_s, 0)
                if suppressed:
                    extra["suppressed"] = suppressed
            d = e.to_dict(self.envelope.sha256)
            d.update(extra)
            self.event_pub.publish(String(data=json.dumps(d, sort_keys=True)))
            if e.kind in (ev.ESTOP, ev.FALLBACK, ev.RETURN, ev.STAGE, ev.MONITOR, ev.ROLLBACK,
                          ev.HOLD, ev.ESTOP_RESET, ev.CLOCK_JUMP):
                self.get_logger().warning(
                    f"{e.kind} {e.limit} {e.joint} {e.detail} "
                    f"(envelope {self.envelope.sha256[:12]})")

    def _ignored_limits(self, names: list[str]) -> tuple[str, ...]:
        """The monitor's ignored limits from the parameter ([''] = none); unknown ones refused."""
        ignored = tuple(n for n in names if n)
        unknown = [n for n in ignored if n not in INTERVENTION_LIMITS]
        if unknown:
            raise ConfigError(f"ROS parameters of /{self.get_name()}", "monitor_ignored_limits",
                              unknown, f"limits the projection names: {list(INTERVENTION_LIMITS)}"
                              " (or [''] for none)")
        return ignored

    def _publish_status(self) -> None:
        st = self.sup.status()
        st["rollback"] = self.rollback_state
        self.status_pub.publish(String(data=json.dumps(st, sort_keys=True)))

    # -- rollback --------------------------------------------------------------------------
    def _start_rollback(self, reason: str) -> None:
        self.rollback_requests += 1
        self._rollback_reason = reason
        self._rollback_attempts_left = self.p["rollback_retries"] + 1
        self.rollback_state = "requested"
        self._attempt_rollback()

    def _attempt_rollback(self) -> None:
        if self._rollback_attempts_left <= 0:
            self.rollback_state = "failed"
            self._retry_timer.cancel()
            self._rollback_event("failed", "no attempts left")
            self._publish_status()
            return
        self._rollback_attempts_left -= 1
        if not self.rollback_client.service_is_ready():
            self._rollback_event("unavailable", f"{self.p['rollback_service']} not available; "
                                 f"{self._rollback_attempts_left} attempts left")
            self._retry_timer.reset()
            return
        req = Trigger.Request()
        self._rollback_future = self.rollback_client.call_async(req)
        self._rollback_future.add_done_callback(self._on_rollback_done)
        self._retry_timer.cancel()
        self._rollback_event("called", self._rollback_reason)

    def _retry_rollback(self) -> None:
        self._retry_timer.cancel()
        if self.rollback_state in ("requested",):
            self._attempt_rollback()

    def _on_rollback_done(self, future: Any) -> None:
        try:
            resp = future.result()
            ok, message = bool(resp.success), str(resp.message)
        except Exception as exc:  # noqa: BLE001 - any transport failure is a failed attempt
            ok, message = False, f"call failed: {exc}"
        if ok:
            self.rollback_state = "done"
            self._rollback_event("done", message)
            self._publish_status()
        else:
            self._rollback_event("refused", message)
            self._retry_timer.reset()

    def _rollback_event(self, outcome: str, detail: str) -> None:
        self._emit([SafetyEvent(ev.ROLLBACK, outcome, "", 0.0, detail, self._now_s())])

    # -- diagnostics -----------------------------------------------------------------------
    def _publish_diagnostics(self) -> None:
        sup = self.sup
        mon = sup.monitor.figures()
        intended = SOURCE_POLICY if sup.stage in ("limited", "full") else "baseline"
        if sup.estop or self.rollback_state == "failed":
            level, msg = ERROR, f"e-stop: {sup.estop_reason}" if sup.estop else "rollback failed"
        elif self._alarm and self.rollback_state != "idle":
            level, msg = WARN, f"rolled back ({self.rollback_state}): {self._alarm}"
        elif sup.source != intended:
            level, msg = WARN, f"{sup.source} drives ({sup.fallback_reason or sup.hold_reason})"
        else:
            level, msg = OK, f"{sup.source} drives"
        ticks = sorted(self._tick_wall_us)
        values: dict[str, Any] = {
            "rollout_stage": sup.stage,
            "source": sup.source,
            "estop": sup.estop,
            "estop_reason": sup.estop_reason,
            "fallback_reason": sup.fallback_reason,
            "hold_reason": sup.hold_reason,
            "envelope_sha256": self.envelope.sha256,
            "envelope_version": self.envelope.version,
            "ticks": sup.ticks,
            "interventions": sup.interventions,
            "events_total": self.counter.total,
            "intervention_rate": mon["intervention_rate"],
            # what the windowed rate is made of, e.g. "jerk 0.310, workspace 0.050"
            "intervention_rate_by_limit": ", ".join(
                f"{k} {v:.3f}" for k, v in sup.monitor.limit_rates().items()),
            "fallback_rate": mon["fallback_rate"],
            "tracking_error_rad": mon["tracking_error_rad"],
            "force_events": int(mon["force_events"]),
            "monitor_fired": sup.monitor.fired,
            "rollback_requests": self.rollback_requests,
            "rollback_state": self.rollback_state,
            "tick_p50_us": ticks[len(ticks) // 2] if ticks else 0.0,
            "tick_p99_us": ticks[int(0.99 * (len(ticks) - 1))] if ticks else 0.0,
            "rate_time_base": self._timebase.mode,
            "rate_dt_s": self._timebase.last_dt_s,
            "late_stream_ticks": self._ticks.late_ticks,
            "superseded_commands": self._ticks.superseded,
        }
        for key, count in sorted(self.counter.by_limit.items()):
            values[f"count.{key}"] = count
        self.diag.publish([make_status(f"{NODE_NAME}: safety", level, msg, values,
                                       self.envelope.robot)])


def main(args: list[str] | None = None) -> int:
    """Run the safety_filter node."""
    return spin_node(SafetyFilter, args)


if __name__ == "__main__":
    sys.exit(main())

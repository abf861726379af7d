"""shadow_comparator: compares the policy with the acting baseline and recommends the next stage.

Thin node over ShadowAccumulator (divergence.py), the gates (gates.py) and the stage machine
(rollout.py): it converts messages, feeds the accumulator, and every `report_period_s` publishes
/diagnostics, a JSON report and the latched recommendation. It follows the safety filter's
`rollout_stage` (from safety_filter/status): a stage change restarts the evidence, and a drop
is logged to the rollout log as an automatic demotion, or a rollback when the policy version
changed with it, with the safety events and metrics that preceded it.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from typing import Any

from geometry_msgs.msg import Vector3Stamped
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import MessageError, joint_state_to_arrays, stamp_to_ns
from sim2real_ros.ros.diagnostics import OK, STALE, WARN, DiagnosticsPublisher, make_status
from sim2real_ros.ros.node_main import spin_node
from sim2real_ros.ros.params import ParamSpec, declare_params
from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS
from sim2real_ros.shadow.divergence import ShadowAccumulator, TrainingStats, json_default
from sim2real_ros.shadow.gates import STAGES, load_rollout_config, recommend
from sim2real_ros.shadow.interventions import build_intervention_check
from sim2real_ros.shadow.rollout import RolloutLog, RolloutStateMachine, Transition
from sim2real_ros.shadow.stats import load_registry_stats, load_training_stats

NODE_NAME = "shadow_comparator"
REPORT_TOPIC = "shadow_comparator/report"
RECOMMENDATION_TOPIC = "shadow_comparator/recommendation"
TRANSITIONS_TOPIC = "shadow_comparator/transitions"
# safety_filter/events kinds that explain a stage change (see sim2real_ros.safety.events).
KEY_EVENT_KINDS = ("monitor", "rollback", "stage", "estop", "estop_reset", "fallback", "hold")

PARAMS = [
    ParamSpec("urdf_path", "", "URDF of the arm (joint names and order); '' = shipped arm"),
    ParamSpec("rollout_config", "", "rollout.yaml with metric settings and gates; '' = shipped"),
    ParamSpec("rollout_log", "", "JSON-lines rollout log; '' = rollout.yaml log_file"),
    ParamSpec("envelope_file", "",
              "safety envelope for would-be interventions; '' = shipped safety envelope"),
    ParamSpec("training_stats", "active",
              "coverage reference: 'active' = the stats of the version on "
              "policy_node/active_version (from the registry), a stats/policy file path, or "
              "'none' (coverage unmeasured: gates that need it fail)"),
    ParamSpec("policy_registry", "", "policy registry root for 'active'; '' = registry default"),
    ParamSpec("report_period_s", 1.0, "period of report, recommendation and diagnostics, s",
              low=0.01, high=3600.0),
    ParamSpec("transition_grace_s", 1.0,
              "how long a stage change waits for its rollback version change or operator "
              "record before it is logged, s", low=0.0, high=60.0),
    ParamSpec("stale_after_s", 2.0,
              "WARN/STALE when no policy or baseline command arrived for this long, s",
              low=0.01, high=3600.0),
]


class ShadowComparator(Node):
    """Measures policy-vs-baseline divergence and publishes the rollout recommendation."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        p = declare_params(self, PARAMS, on_change=self._refuse_runtime_change)
        self.params = p
        urdf = p["urdf_path"] or str(default_urdf())
        self.arm = load_arm(urdf)
        self.joint_names = list(self.arm.joint_names)
        self.config = load_rollout_config(p["rollout_config"] or None)
        log_path = p["rollout_log"] or str(self.config.log_path())
        self.log = RolloutLog(log_path)
        check, self.intervention_source = build_intervention_check(
            p["envelope_file"] or None, self.arm
        )
        self.stats_source = "none"
        stats: TrainingStats | None = None
        mode = p["training_stats"]
        if mode not in ("active", "none", ""):
            stats = load_training_stats(mode, self.joint_names)
            self.stats_source = mode
        self.acc = ShadowAccumulator(self.joint_names, self.config.metrics, check, stats)
        self.machine = RolloutStateMachine(STAGES[0], self.log)
        self.stage_known = False
        self.stage_since_wall_s = time.time()
        self.active_version: dict[str, Any] | None = None
        self._version_at_stage: int | None = None
        self._version_changed_at: float | None = None  # monotonic s of the last version change
        self._before_version_change: dict[str, Any] | None = None
        self._pending: tuple[str, float, dict[str, Any]] | None = None  # stage, wall t, evidence
        self.safety_events: deque[dict[str, Any]] = deque(maxlen=20)
        # Stage-relevant events kept apart: a burst of throttled interventions must not push
        # the monitor's verdict out of a demotion's evidence.
        self.key_events: deque[dict[str, Any]] = deque(maxlen=20)
        self.malformed = 0
        self._last_cmd_wall: dict[str, float | None] = {"policy": None, "baseline": None}
        self.last_report: dict[str, Any] | None = None
        self.last_recommendation: dict[str, Any] | None = None

        self.create_subscription(JointState, "policy/joint_command",
                                 lambda m: self._on_command("policy", m), COMMAND_QOS)
        self.create_subscription(JointState, "baseline/joint_command",
                                 lambda m: self._on_command("baseline", m), COMMAND_QOS)
        self.create_subscription(JointState, "joint_states", self._on_joint_states, STATE_QOS)
        self.create_subscription(Vector3Stamped, "policy/confidence", self._on_confidence,
                                 STATE_QOS)
        self.create_subscription(String, "safety_filter/status", self._on_status, LATCHED_QOS)
        self.create_subscription(String, "safety_filter/events", self._on_event, EVENT_QOS)
        self.create_subscription(String, "policy_node/active_version", self._on_version,
                                 LATCHED_QOS)
        self.report_pub = self.create_publisher(String, REPORT_TOPIC, STATE_QOS)
        self.rec_pub = self.create_publisher(String, RECOMMENDATION_TOPIC, LATCHED_QOS)
        self.transition_pub = self.create_publisher(String, TRANSITIONS_TOPIC, LATCHED_QOS)
        self.diag = DiagnosticsPublisher(self)
        self.create_timer(p["report_period_s"], self._on_report)
        self.create_timer(0.05, self._settle_pending)
        self.get_logger().info(
            f"comparing policy vs baseline for {self.joint_names}; would-be interventions: "
            f"{self.intervention_source}; coverage reference: {mode}; log: {self.log.path}"
        )

    def _refuse_runtime_change(self, changes: dict[str, Any]) -> str | None:
        # Every parameter shapes what the evidence means; changing one mid-stage would mix
        # two definitions in one gate. Restart the node instead.
        return f"{sorted(changes)} are read at start-up; restart {NODE_NAME} to change them"

    # --- inputs --------------------------------------------------------------------------

    def _on_command(self, stream: str, msg: JointState) -> None:
        try:
            arr = joint_state_to_arrays(msg, self.joint_names)
        except MessageError as exc:
            self._malformed(f"{stream}/joint_command: {exc}")
            return
        t_ns = stamp_to_ns(msg.header.stamp)
        assert arr.position is not None
        self._last_cmd_wall[stream] = time.monotonic()
        if stream == "policy":
            self.acc.add_policy(t_ns, arr.position)
        else:
            self.acc.add_baseline(t_ns, arr.position)

    def _on_joint_states(self, msg: JointState) -> None:
        try:
            arr = joint_state_to_arrays(msg, self.joint_names)
        except MessageError as exc:
            self._malformed(f"joint_states: {exc}")
            return
        assert arr.position is not None
        self.acc.add_joint_state(stamp_to_ns(msg.header.stamp), arr.position, arr.velocity)

    def _on_confidence(self, msg: Vector3Stamped) -> None:
        v = msg.vector
        self.acc.add_confidence(stamp_to_ns(msg.header.stamp), v.x, v.y, int(round(v.z)))

    def _on_event(self, msg: String) -> None:
        try:
            event = json.loads(msg.data)
        except json.JSONDecodeError:
            self._malformed(f"safety_filter/events: not JSON: {msg.data[:80]!r}")
            return
        record = event if isinstance(event, dict) else {"event": event}
        self.safety_events.append(record)
        if record.get("kind") in KEY_EVENT_KINDS:
            self.key_events.append(record)

    def _on_version(self, msg: String) -> None:
        try:
            info = json.loads(msg.data)
            version = int(info["version"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            self._malformed(f"policy_node/active_version: {msg.data[:80]!r}")
            return
        previous = None if self.active_version is None else self.active_version.get("version")
        self.active_version = info
        if self._version_at_stage is None:
            self._version_at_stage = version
        if previous is not None and previous != version:
            self._version_changed_at = time.monotonic()
        if previous != version:
            # Gate evidence belongs to one policy version: a new version starts afresh. What
            # was measured on the old one is kept as evidence for the stage drop that follows
            # a rollback.
            self._before_version_change = self.acc.metrics().gate_metrics()
            if self.params["training_stats"] == "active":
                self._load_active_stats(version)
            self.acc.reset()

    def _load_active_stats(self, version: int) -> None:
        try:
            stats = load_registry_stats(version, self.joint_names,
                                        self.params["policy_registry"] or None)
        except (ConfigError, OSError, ValueError) as exc:
            # Fail closed: without the reference, coverage is unmeasured and its gates fail.
            self.get_logger().error(f"training statistics of version {version} unusable: {exc}")
            self.acc.training_stats = None
            self.stats_source = f"unavailable (version {version}: {exc})"
        else:
            self.acc.training_stats = stats
            self.stats_source = f"policy registry version {version}"

    def _on_status(self, msg: String) -> None:
        try:
            status = json.loads(msg.data)
            stage = str(status["rollout_stage"])
        except (json.JSONDecodeError, KeyError, TypeError):
            self._malformed(f"safety_filter/status: {msg.data[:80]!r}")
            return
        if stage not in STAGES:
            self._malformed(f"safety_filter/status: unknown rollout_stage {stage!r}")
            return
        self.acc.add_status(bool(status.get("estop", False)))
        if not self.stage_known:
            # The first status tells where we are; nothing changed, so nothing is logged.
            self.stage_known = True
            self.machine = RolloutStateMachine(stage, self.log)
            self._restart_evidence()
            return
        target = self._pending[0] if self._pending else self.machine.stage
        if stage != target:
            evidence = {
                "status": status,
                "metrics": self.acc.metrics().gate_metrics(),
            }
            if self._before_version_change is not None:
                evidence["metrics_before_version_change"] = self._before_version_change
            self._pending = (stage, time.monotonic(), evidence)
            self._settle_pending()

    def _malformed(self, what: str) -> None:
        self.malformed += 1
        self.get_logger().warning(f"ignored malformed input: {what}",
                                  throttle_duration_sec=5.0)

    # --- stage changes ---------------------------------------------------------------------

    def _settle_pending(self) -> None:
        if self._pending is None:
            return
        stage, since, evidence = self._pending
        grace = self.params["transition_grace_s"]
        changed = self._version_changed_at
        # The monitor rolls the policy back and drops the stage together; either may be seen
        # first, so a version change within the grace period on either side counts.
        rolled_back = changed is not None and changed >= since - grace
        lower = STAGES.index(stage) < STAGES.index(self.machine.stage)
        last = self.log.last()
        recorded = (last is not None and last.kind == "promotion" and last.to_stage == stage
                    and last.from_stage == self.machine.stage)
        waited = time.monotonic() - since >= self.params["transition_grace_s"]
        # A drop waits briefly for the policy node's version change (a rollback); a rise waits
        # for the operator's log record, which the CLI writes right after setting the stage.
        if not (waited or (lower and rolled_back) or (not lower and recorded)):
            return
        self._pending = None
        # Events are taken now, not when the status arrived: topics are not ordered, and the
        # monitor's own event may trail the status that reports its stage drop.
        evidence = {**evidence, "safety_events": list(self.safety_events),
                    "key_safety_events": list(self.key_events),
                    "active_version": self.active_version,
                    "version_at_stage_start": self._version_at_stage}
        t = self.machine.observe(stage, evidence, rolled_back=rolled_back,
                                 promotion_record=last if recorded else None)
        if t is not None:
            self._announce(t)
        self._restart_evidence()

    def _announce(self, t: Transition) -> None:
        self.get_logger().warning(
            f"rollout {t.kind}: {t.from_stage} -> {t.to_stage} by {t.who}: {t.why}"
        )
        self.transition_pub.publish(String(data=json.dumps(t.as_dict(), default=json_default)))

    def _restart_evidence(self) -> None:
        self.acc.reset()
        self._before_version_change = None
        self.stage_since_wall_s = time.time()
        self._version_at_stage = (
            None if self.active_version is None else self.active_version.get("version")
        )

    # --- outputs ---------------------------------------------------------------------------

    def build_report(self) -> dict[str, Any]:
        """Return the report and recommendation for the evidence gathered so far."""
        m = self.acc.metrics()
        rec = recommend(self.config, self.machine.stage, m.gate_metrics())
        return {
            "stamp_s": self.get_clock().now().nanoseconds * 1e-9,
            "stage": self.machine.stage,
            "stage_known": self.stage_known,
            "stage_since_unix_s": self.stage_since_wall_s,
            "joints": self.joint_names,
            "intervention_check": self.intervention_source,
            "training_stats": self.stats_source,
            "active_version": self.active_version,
            "malformed_inputs": self.malformed,
            "metrics": m.as_dict(),
            "recommendation": rec.as_dict(),
            "rollout_config": self.config.path,
        }

    def _on_report(self) -> None:
        report = self.build_report()
        rec = report["recommendation"]
        self.last_report = report
        self.last_recommendation = {
            **rec, "stage_known": self.stage_known, "stamp_s": report["stamp_s"],
            # The promotion CLI refuses evidence gathered on another policy version.
            "policy_versions": report["metrics"]["policy_versions"],
        }
        self.report_pub.publish(String(data=json.dumps(report, default=json_default)))
        self.rec_pub.publish(
            String(data=json.dumps(self.last_recommendation, default=json_default))
        )
        self.diag.publish([self._status(report)])

    def _status(self, report: dict[str, Any]) -> Any:
        m = report["metrics"]
        g = m["gate_metrics"]
        rec = report["recommendation"]
        now = time.monotonic()
        stale = [s for s, t in self._last_cmd_wall.items()
                 if t is None or now - t > self.params["stale_after_s"]]
        window = m["window"] or {}
        values: dict[str, Any] = {
            "stage": report["stage"],
            "stage_known": self.stage_known,
            "recommended_stage": rec["recommended_stage"],
            "gate_passed": rec["gate"]["passed"] if rec["gate"] else "n/a",
            "gate_failing": ",".join(
                c["criterion"] for c in (rec["gate"] or {}).get("criteria", []) if not c["passed"]
            ),
            "steps": g["steps"],
            "time_s": float(g["time_s"]),
            "agreement_rate": _num(g["agreement_rate"]),
            "window_agreement_rate": _num(window.get("agreement_rate")),
            "mean_l2_rad": _num(m["mean_l2_rad"]),
            "p95_l2_rad": _num(g["p95_l2_divergence_rad"]),
            "hard_violations": g["hard_violations"],
            "soft_interventions": g["soft_interventions"],
            "ood_fraction": _num(g["ood_fraction"]),
            "fallback_rate": _num(g["fallback_rate"]),
            "coverage": _num(g["coverage"]),
            "unmatched_policy": m["unmatched_policy"],
            "unmatched_baseline": m["unmatched_baseline"],
            "confidence_samples": m["confidence_samples"],
            "policy_version": "" if self.active_version is None
            else self.active_version.get("version"),
            "malformed_inputs": self.malformed,
        }
        for j, v in zip(self.joint_names, window.get("max_abs_rad") or []):
            values[f"window_max_abs_rad.{j}"] = float(v)
        if stale:
            return make_status(f"{self.get_name()}: divergence", STALE,
                               f"no {' or '.join(stale)} commands for "
                               f"{self.params['stale_after_s']} s", values)
        if g["hard_violations"]:
            return make_status(f"{self.get_name()}: divergence", WARN,
                               f"{g['hard_violations']} would-be hard violations at stage "
                               f"{report['stage']}", values)
        return make_status(f"{self.get_name()}: divergence", OK,
                           f"stage {report['stage']}, recommend {rec['recommended_stage']}",
                           values)


def _num(v: Any) -> float | str:
    return "n/a" if v is None else float(v)


def main(args: list[str] | None = None) -> int:
    """Run the shadow comparator node."""
    return spin_node(ShadowComparator, args)


if __name__ == "__main__":
    sys.exit(main())

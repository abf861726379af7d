"""`sim2real shadow report` and `sim2real rollout promote|status`.

Promotion is the one operator action of the rollout: it re-evaluates the gate for the requested
step on the evidence (a saved report or the comparator's live recommendation) against the current
rollout.yaml, sets the safety filter's `rollout_stage` parameter, and appends who, why and the
evidence to the rollout log. Exit codes: 0 done, 1 refused (gate, rule or the node said no),
2 bad configuration or input, 3 the graph did not answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sim2real_ros.config import ConfigError
from sim2real_ros.shadow.gates import (
    CRITERIA,
    STAGES,
    GateResult,
    RolloutConfig,
    evaluate,
    load_rollout_config,
)
from sim2real_ros.shadow.rollout import PromotionRefused, RolloutLog, RolloutStateMachine

EXIT_REFUSED = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
RECOMMENDATION_TOPIC = "/shadow_comparator/recommendation"


def register(subparsers: Any) -> None:
    """Add `shadow` and `rollout` sub-commands to the `sim2real` parser."""
    shadow = subparsers.add_parser("shadow", help="shadow-mode comparison of policy and baseline")
    ssub = shadow.add_subparsers(dest="shadow_command", required=True)
    rep = ssub.add_parser("report", help="write a shadow report (plots, gate table) from a bag "
                                         "or the live graph")
    rep.add_argument("bag", nargs="?", default="",
                     help="rosbag2 directory (MCAP) with policy/joint_command and "
                          "baseline/joint_command")
    rep.add_argument("--live", action="store_true",
                     help="instead of a bag, listen to the running graph for --duration s")
    rep.add_argument("--duration", type=float, default=30.0, help="seconds to listen (--live)")
    rep.add_argument("-o", "--output", default="shadow_report", help="output directory")
    rep.add_argument("--format", choices=("md", "html"), default="md", help="page format")
    rep.add_argument("--config", default="", help="rollout.yaml (default: shipped)")
    rep.add_argument("--urdf", default="", help="URDF of the arm (default: shipped)")
    rep.add_argument("--envelope", default="",
                     help="safety envelope for would-be interventions (default: shipped)")
    rep.add_argument("--stats", default="",
                     help="training statistics (.json) or policy file for coverage "
                          "(default: none; coverage gates then fail)")
    rep.set_defaults(func=cmd_shadow_report)

    rollout = subparsers.add_parser("rollout", help="phased rollout: promote, status")
    rsub = rollout.add_subparsers(dest="rollout_command", required=True)
    pro = rsub.add_parser("promote", help="promote the rollout stage one step (operator action)")
    pro.add_argument("--to", required=True, choices=STAGES[1:], help="the stage to promote to")
    pro.add_argument("--who", required=True, help="who promotes (recorded)")
    pro.add_argument("--why", required=True, help="why (recorded)")
    pro.add_argument("--evidence", default="",
                     help="report JSON (shadow report or comparator report); default: the live "
                          "shadow_comparator/recommendation")
    _common(pro)
    pro.set_defaults(func=cmd_rollout_promote)
    st = rsub.add_parser("status", help="show the stage, the recommendation and the log")
    _common(st)
    st.add_argument("--last", type=int, default=5, help="log records to show")
    st.set_defaults(func=cmd_rollout_status)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="", help="rollout.yaml (default: shipped)")
    p.add_argument("--log", default="",
                   help="rollout log (default: rollout.yaml log_file, as shipped "
                        "$SIM2REAL_ROLLOUT_LOG or ~/.local/share/sim2real_ros/rollout_log.jsonl)")
    p.add_argument("--safety-node", default="/safety_filter",
                   help="node that owns the rollout_stage parameter")
    p.add_argument("--recommendation-topic", default=RECOMMENDATION_TOPIC,
                   help="latched recommendation topic of the comparator")
    p.add_argument("--version-topic", default="/policy_node/active_version",
                   help="latched active policy version (evidence on another version is refused)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the graph")


def _log(args: argparse.Namespace, cfg: RolloutConfig) -> RolloutLog:
    return RolloutLog(args.log or cfg.log_path())


def evidence_gate(cfg: RolloutConfig, stage: str, to_stage: str, evidence: dict[str, Any],
                  source: str) -> GateResult:
    """Re-evaluate the gate `stage -> to_stage` on the measured values in `evidence`.

    `evidence` is a report (with metrics.gate_metrics) or a recommendation (with a gate table);
    its thresholds and pass flags are ignored: the current rollout.yaml decides. Evidence
    gathered at another stage is refused.
    """
    ev_stage = evidence.get("stage", evidence.get("current_stage"))
    if ev_stage != stage:
        raise PromotionRefused(
            f"the evidence ({source}) was gathered at stage {ev_stage!r}, the safety filter is at "
            f"{stage!r}: gather evidence at the current stage"
        )
    if evidence.get("stage_known") is False:
        raise PromotionRefused(f"the evidence ({source}) does not know the stage it was "
                               "gathered at (no safety_filter/status)")
    metrics = (evidence.get("metrics") or {}).get("gate_metrics")
    if metrics is None:
        gate = evidence.get("gate") or (evidence.get("recommendation") or {}).get("gate")
        if not gate:
            raise ConfigError(source, "metrics.gate_metrics", None,
                              "a shadow report or recommendation with measured values")
        metrics = {row["metric"]: row["measured"] for row in gate["criteria"]}
    if not isinstance(metrics, dict):
        raise ConfigError(source, "metrics.gate_metrics", metrics, "a mapping")
    known = {c.metric for c in CRITERIA.values()}
    return evaluate(cfg.gate_to(to_stage), {k: v for k, v in metrics.items() if k in known})


def evidence_versions(evidence: dict[str, Any]) -> set[int]:
    """Return the policy versions the evidence was gathered on (empty when it does not say)."""
    versions = (evidence.get("metrics") or {}).get("policy_versions") or []
    versions = list(versions) + list(evidence.get("policy_versions") or [])
    return {int(v) for v in versions}


def check_versions(evidence: dict[str, Any], active: dict[str, Any] | None, source: str) -> None:
    """Refuse evidence gathered on other policy versions than the one now active."""
    seen = evidence_versions(evidence)
    if active is None or "version" not in active or not seen:
        return
    if int(active["version"]) not in seen or len(seen) > 1:
        raise PromotionRefused(
            f"the evidence ({source}) was gathered on policy version(s) {sorted(seen)}, the "
            f"active version is {active['version']}: gather evidence on the active version")


def _print_gate(gate: GateResult) -> None:
    print(f"gate {gate.from_stage} -> {gate.to_stage}: "
          f"{'PASSED' if gate.passed else 'NOT PASSED'}")
    for c in gate.criteria:
        measured = "not measured" if c.measured is None else f"{c.measured:.6g}"
        print(f"  {'ok  ' if c.passed else 'FAIL'} {c.key:<28} {measured:>14} {c.op} "
              f"{c.threshold:g} {c.unit}")


def cmd_rollout_promote(args: argparse.Namespace) -> int:
    """Promote one stage after checking the gate; set the safety filter; log who/why/evidence."""
    from sim2real_ros.shadow.remote import GraphClient, RemoteError

    cfg = load_rollout_config(args.config or None)
    log = _log(args, cfg)
    evidence: dict[str, Any] | None = None
    source = args.evidence
    if args.evidence:
        try:
            evidence = json.loads(Path(args.evidence).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(args.evidence, "<file>", None, f"a JSON report ({exc})") from exc
    with GraphClient() as graph:
        try:
            stage = graph.get_stage(args.safety_node, args.timeout)
            if evidence is None:
                source = args.recommendation_topic
                evidence = graph.latest(args.recommendation_topic, args.timeout)
                if evidence is None:
                    print(f"sim2real rollout: no recommendation on {source} within "
                          f"{args.timeout} s (is shadow_comparator running?); pass --evidence",
                          file=sys.stderr)
                    return EXIT_UNREACHABLE
        except RemoteError as exc:
            print(f"sim2real rollout: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        if stage not in STAGES:
            raise ConfigError(args.safety_node, "rollout_stage", stage, f"one of {list(STAGES)}")
        active = graph.latest(args.version_topic, min(args.timeout, 2.0))
        machine = RolloutStateMachine(stage)
        try:
            check_versions(evidence, active, source)
            gate = evidence_gate(cfg, stage, args.to, evidence, source)
            _print_gate(gate)
            # Checked before touching the graph; the record is written only once the safety
            # filter accepted the new stage.
            transition = machine.promote(args.to, args.who, args.why, gate,
                                         evidence={"source": source, "evidence": evidence})
        except PromotionRefused as exc:
            print(f"sim2real rollout: refused: {exc}", file=sys.stderr)
            return EXIT_REFUSED
        try:
            graph.set_stage(args.safety_node, args.to, args.timeout)
        except RemoteError as exc:
            print(f"sim2real rollout: {exc}", file=sys.stderr)
            return EXIT_REFUSED if "refused" in str(exc) else EXIT_UNREACHABLE
    log.append(transition)
    print(f"promoted {stage} -> {args.to} by {args.who}; logged to {log.path}")
    return 0


def cmd_rollout_status(args: argparse.Namespace) -> int:
    """Print the live stage, the comparator's recommendation and the last log records."""
    from sim2real_ros.shadow.remote import GraphClient, RemoteError

    cfg = load_rollout_config(args.config or None)
    log = _log(args, cfg)
    with GraphClient() as graph:
        try:
            stage = graph.get_stage(args.safety_node, args.timeout)
        except RemoteError as exc:
            stage = f"unknown ({exc})"
        rec = graph.latest(args.recommendation_topic, args.timeout)
    print(f"stage: {stage}")
    if rec is None:
        print(f"recommendation: none on {args.recommendation_topic}")
    else:
        print(f"recommendation: {rec.get('recommended_stage')} "
              f"(current {rec.get('current_stage')}, promote={rec.get('promote')})")
        if rec.get("gate"):
            _print_gate(GateResult.from_dict(rec["gate"]))
    records = log.read()
    print(f"rollout log {log.path}: {len(records)} records")
    for t in records[-max(args.last, 0):] if args.last else []:
        print(f"  {t.time_s:.3f} {t.kind:<9} {t.from_stage} -> {t.to_stage} by {t.who}: {t.why}")
    return 0


def cmd_shadow_report(args: argparse.Namespace) -> int:
    """Write the shadow report of a bag."""
    from sim2real_ros.paths import default_urdf
    from sim2real_ros.robot.model import load_arm
    from sim2real_ros.shadow.interventions import build_intervention_check
    from sim2real_ros.shadow.report import TOPICS, analyze_bag, analyze_messages, write_report
    from sim2real_ros.shadow.stats import load_training_stats
    from sim2real_ros.sysid.bags import BagError

    if bool(args.bag) == bool(args.live):
        raise ConfigError(None, "BAG / --live", args.bag or None, "a bag or --live (one of them)")
    cfg = load_rollout_config(args.config or None)
    arm = load_arm(args.urdf or default_urdf())
    check, check_source = build_intervention_check(args.envelope or None, arm)
    stats = load_training_stats(args.stats, arm.joint_names) if args.stats else None
    if args.live:
        messages = _capture_live(args.duration)
        counts = {k: sum(1 for m in messages if m[0] == k) for k in TOPICS}
        if not counts["policy"] or not counts["baseline"]:
            print(f"sim2real shadow report: no policy or baseline commands in {args.duration} s "
                  f"(received {counts})", file=sys.stderr)
            return EXIT_UNREACHABLE
        analysis = analyze_messages(f"live graph ({args.duration:g} s)", messages, counts,
                                    arm.joint_names, cfg, check, stats, check_source,
                                    args.stats or "none")
    else:
        try:
            analysis = analyze_bag(args.bag, arm.joint_names, cfg, check, stats,
                                   intervention_source=check_source,
                                   stats_source=args.stats or "none")
        except BagError as exc:
            print(f"sim2real shadow report: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    page = write_report(analysis, args.output, args.format)
    rec = analysis.recommendation
    print(f"{page}: stage {rec.current_stage}, recommended {rec.recommended_stage}, "
          f"{analysis.metrics.steps} aligned steps, agreement "
          f"{analysis.metrics.agreement_rate}")
    return 0


def _capture_live(duration_s: float) -> list[tuple[str, int, Any]]:
    """Listen to the comparator's input topics on the running graph."""
    from geometry_msgs.msg import Vector3Stamped
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS
    from sim2real_ros.shadow.remote import GraphClient
    from sim2real_ros.shadow.report import TOPICS

    kinds = {
        "policy": (JointState, COMMAND_QOS), "baseline": (JointState, COMMAND_QOS),
        "joint_states": (JointState, STATE_QOS), "confidence": (Vector3Stamped, STATE_QOS),
        "status": (String, LATCHED_QOS), "events": (String, EVENT_QOS),
        "transitions": (String, LATCHED_QOS), "version": (String, LATCHED_QOS),
    }
    specs = {k: (TOPICS[k], t, q) for k, (t, q) in kinds.items()}
    with GraphClient("sim2real_shadow_report") as graph:
        return graph.capture(specs, duration_s)


"""`sim2real audit`: the reality-gap checklist from files and, optionally, a running graph.

Exit codes: 0 no row is red (amber rows are listed with their missing mitigation), 1 a row is
red (deployment blocked), 2 bad configuration or input (from the `sim2real` entry point).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sim2real_ros.audit.checklist import RED, Thresholds, evaluate
from sim2real_ros.audit.evidence import (
    AuditEvidence,
    bag_evidence,
    calibration_evidence,
    fault_record_evidence,
    load_hil_record,
    parse_utc,
)
from sim2real_ros.audit.report import write_report
from sim2real_ros.config import ConfigError, file_sha256

EXIT_RED = 1


def register(subparsers: Any) -> None:
    """Add `sim2real audit` to the `sim2real` parser."""
    p = subparsers.add_parser(
        "audit", help="reality-gap checklist (green/amber/red per gap); exits 1 on any red",
        description="Name each sim-to-real gap from evidence and refuse to deploy on red. "
                    "Writes audit.md and audit.json into the output directory.")
    p.add_argument("--spec", default="",
                   help="randomization spec the simulator runs (default: the calibration's, "
                        "else the shipped config/randomization.yaml)")
    p.add_argument("--calibration", action="append", default=[], metavar="YAML",
                   help="calibration file of the unit (repeatable)")
    p.add_argument("--bag", action="append", default=[], metavar="DIR",
                   help="rosbag2 bag: unit id, at-rest noise, observation-to-action latency "
                        "(repeatable)")
    p.add_argument("--fault-record", default="", metavar="JSON",
                   help="the safety suite's fault-injection record (default: the shipped "
                        "config/safety_fault_record.json if there is one)")
    p.add_argument("--hil-record", action="append", default=[], metavar="JSON",
                   help="hardware-in-the-loop run record (repeatable)")
    p.add_argument("--unit", default="", help="the unit (serial) to be deployed on")
    p.add_argument("--envelope", default="",
                   help="the deployed safety envelope (default: the shipped "
                        "config/safety_envelope.yaml)")
    p.add_argument("--live", type=float, default=0.0, metavar="SECONDS",
                   help="listen to the running graph for SECONDS (latency, unit id, wrapper)")
    p.add_argument("--camera", choices=("auto", "used", "unused"), default="auto",
                   help="does the policy observe images (auto: if the simulator renders them)")
    p.add_argument("--world-model", action="store_true",
                   help="fit a world model on the bags and check it against the calibrated "
                        "simulator with the active policy")
    p.add_argument("--policy-version", type=int, default=0,
                   help="policy version for --world-model (0 = known-good)")
    p.add_argument("--now", default="", help="evaluate ages at this ISO-8601 time (default: now)")
    d = Thresholds()
    p.add_argument("--min-calibration-runs", type=int, default=d.calibration_min_runs)
    p.add_argument("--max-calibration-age-days", type=float, default=d.calibration_max_age_days)
    p.add_argument("--noise-factor", type=float, default=d.noise_factor,
                   help="configured noise std must be within this factor of the measured")
    p.add_argument("--latency-tolerance-ms", type=float, default=d.latency_abs_tolerance_s * 1e3)
    p.add_argument("--min-hil-episodes", type=int, default=d.hil_min_episodes)
    p.add_argument("--max-fault-record-age-days", type=float,
                   default=d.fault_record_max_age_days)
    p.add_argument("-o", "--output", default="audit_report", help="output directory")
    p.set_defaults(func=cmd_audit)


def thresholds_from_args(args: argparse.Namespace) -> Thresholds:
    """Return the thresholds with the command-line overrides."""
    try:
        return Thresholds(
            calibration_min_runs=args.min_calibration_runs,
            calibration_max_age_days=args.max_calibration_age_days,
            noise_factor=args.noise_factor,
            latency_abs_tolerance_s=args.latency_tolerance_ms * 1e-3,
            hil_min_episodes=args.min_hil_episodes,
            fault_record_max_age_days=args.max_fault_record_age_days,
        )
    except ValueError as exc:
        raise ConfigError("<command line>", "thresholds", None, str(exc)) from exc


def _shipped(*parts: str) -> Path | None:
    from sim2real_ros.paths import share_path

    try:
        p = share_path(*parts)
    except FileNotFoundError:
        return None
    return p if p.is_file() else None


def gather(args: argparse.Namespace) -> tuple[AuditEvidence, dict[str, Any]]:
    """Read every input named on the command line into evidence; return it and the inputs."""
    from sim2real_ros.audit.sources import sim_model_for

    ev = AuditEvidence(declared_unit=args.unit or None)
    inputs: dict[str, Any] = {}
    for path in args.calibration:
        cal, noise = calibration_evidence(path)
        ev.calibrations.append(cal)
        ev.measured_noise += noise
    inputs["calibrations"] = list(args.calibration)
    ev.sim, spec_source = sim_model_for(args.spec or None, args.calibration)
    inputs["spec"] = spec_source
    for path in args.bag:
        try:
            b = bag_evidence(path)
        except ValueError as exc:  # BagError names the bag and the problem
            raise ConfigError(path, "--bag", path, f"a readable rosbag2 bag ({exc})") from exc
        if b.unit_id:
            ev.observed_units[f"bag {path}"] = b.unit_id
        ev.measured_noise += b.noise
        if b.latency is not None:
            ev.latency.append(b.latency)
        if not b.noise:
            ev.notes.append(f"bag {path}: no at-rest segment, no noise measured")
        if b.latency is None:
            ev.notes.append(f"bag {path}: no policy/arm command pairs, no latency measured")
    inputs["bags"] = list(args.bag)
    _camera_coverage(args, ev)
    record = args.fault_record or _shipped("config", "safety_fault_record.json")
    if record:
        ev.faults = fault_record_evidence(record)
    inputs["fault_record"] = str(record) if record else None
    ev.hil = [load_hil_record(p) for p in args.hil_record]
    inputs["hil_records"] = list(args.hil_record)
    envelope = Path(args.envelope) if args.envelope else _shipped("config", "safety_envelope.yaml")
    if envelope is not None:
        if not envelope.is_file():
            raise ConfigError(envelope, "--envelope", str(envelope), "an existing envelope file")
        ev.envelope_sha256 = file_sha256(envelope)
        ev.envelope_source = str(envelope)
    inputs["envelope"] = str(envelope) if envelope else None
    ev.policy_uses_images = {"auto": None, "used": True, "unused": False}[args.camera]
    if ev.policy_uses_images and ev.sim is not None:
        # SimCore renders the camera (sim/camera.py); the sim_bridge parameter only decides
        # whether the ROS graph publishes it.
        ev.sim = dataclasses.replace(ev.sim, camera_enabled=True)
    inputs["camera"] = args.camera
    if args.live > 0:
        _listen_live(args.live, ev)
    inputs["live_s"] = args.live
    return ev, inputs


def _camera_coverage(args: argparse.Namespace, ev: AuditEvidence) -> None:
    """Compare the bags' camera images with randomized renders of the simulator."""
    from sim2real_ros.audit.sources import resolve_spec
    from sim2real_ros.audit.visual import image_coverage, images_from_bag, render_randomized

    real, poses = [], []
    for path in args.bag:
        images, at = images_from_bag(path)
        real += images
        poses += at
    if not real:
        return
    spec, source = resolve_spec(args.spec or None, args.calibration)
    rendered = render_randomized(spec, poses)
    ev.image_coverage = image_coverage(real, rendered, f"camera images of {len(args.bag)} "
                                                       f"bag(s) vs renders of {source}")


def _listen_live(duration_s: float, ev: AuditEvidence) -> None:
    """Listen to the running graph and add what it showed to the evidence."""
    import rclpy
    from rclpy.context import Context

    from sim2real_ros.audit.noise import joint_noise_at_rest
    from sim2real_ros.audit.probe import listen
    from sim2real_ros.ros.env import dds_env_problems

    for problem in dds_env_problems():
        print(f"sim2real audit: warning: {problem}", file=sys.stderr)
    ctx = Context()
    rclpy.init(context=ctx)
    try:
        probe = listen(duration_s, context=ctx)
        live = probe.evidence(duration_s)
        latency = probe.latency()
        samples = probe.joint_samples()
        probe.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
    ev.live = live
    if live.unit_id:
        ev.observed_units["live graph"] = live.unit_id
    if latency is not None:
        ev.latency.append(latency)
    else:
        ev.notes.append(f"live graph: no policy/arm command pairs in {duration_s:g} s "
                        f"(topics seen: {', '.join(live.topics_seen) or 'none'})")
    if samples is not None:
        noise, _ = joint_noise_at_rest(*samples, source="live graph")
        ev.measured_noise += noise


def cmd_audit(args: argparse.Namespace) -> int:
    """Run the audit; write audit.md and audit.json; exit 1 on any red row."""
    now = parse_utc(args.now, "<command line>", "--now") if args.now else datetime.now(
        timezone.utc)
    th = thresholds_from_args(args)
    ev, inputs = gather(args)
    extra: dict[str, Any] = {}
    if args.world_model:
        from sim2real_ros.audit.sources import world_model_check

        summary, details = world_model_check(args.bag, args.calibration, args.policy_version,
                                             args.spec or None)
        ev.world_model = summary
        extra["world_model_details"] = details
    checklist = evaluate(ev, now, th)
    md, js = write_report(args.output, checklist, ev, inputs, extra)
    width = max(len(r.title) for r in checklist.rows)
    for r in checklist.rows:
        print(f"{r.title:<{width}}  {r.status:<5}  {r.rule}")
        for m in r.missing:
            print(f"{'':<{width}}         missing: {m}")
    print(f"overall: {checklist.overall}; wrote {md} and {js}")
    if any(r.status == RED for r in checklist.rows):
        print("sim2real audit: red row(s): deployment blocked", file=sys.stderr)
        return EXIT_RED
    return 0

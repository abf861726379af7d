"""`sim2real safety ...`: check or derive an envelope, run the fault-injection suite."""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.env import DISCOVERY_VAR, DOMAIN_VAR
from sim2real_ros.safety.envelope import load_envelope, write_derived_envelope


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `sim2real safety {check-envelope, derive-envelope, fault-suite}`."""
    safety = subparsers.add_parser("safety", help="safety envelope and fault-injection tools")
    sub = safety.add_subparsers(dest="safety_command", required=True)

    check = sub.add_parser("check-envelope",
                           help="validate a safety envelope against the URDF; print its hash")
    check.add_argument("file", help="envelope YAML (e.g. config/safety_envelope.yaml)")
    check.add_argument("--urdf", default=None, help="URDF of the arm (default: the shipped arm)")
    check.set_defaults(func=_check)

    derive = sub.add_parser("derive-envelope",
                            help="write a default envelope derived from a URDF with margins")
    derive.add_argument("--urdf", default=None, help="URDF (default: the shipped arm)")
    derive.add_argument("--out", required=True, help="output YAML")
    derive.set_defaults(func=_derive)

    faults = sub.add_parser("fault-suite",
                            help="inject faults against real node processes; write the record")
    faults.add_argument("--out", required=True, help="fault record JSON to write")
    faults.add_argument("--envelope", default=None,
                        help="envelope YAML (default: config/safety_envelope.yaml)")
    faults.add_argument("--scripted-only", action="store_true",
                        help="kill the scripted fault_policy instead of the real policy_node")
    faults.add_argument("--log-dir", default=None, help="where node logs go (default: a tmp dir)")
    faults.set_defaults(func=_fault_suite)


def _check(args: argparse.Namespace) -> int:
    arm = load_arm(args.urdf or default_urdf())
    env = load_envelope(args.file, arm)
    print(f"{env.path}: valid envelope v{env.version} for {env.robot} ({len(env.joints)} joints)")
    print(f"sha256 {env.sha256}")
    print(f"{'joint':22s} {'position rad':>17s} {'vel rad/s':>9s} {'acc':>7s} {'jerk':>7s} "
          f"{'effort':>7s}")
    for j in env.joints:
        print(f"{j.name:22s} [{j.lower_rad:7.3f},{j.upper_rad:7.3f}] {j.velocity_rad_s:9.3f} "
              f"{j.acceleration_rad_s2:7.2f} {j.jerk_rad_s3:7.1f} {j.effort_nm:7.1f}")
    print(f"workspace box {list(env.box_min_m)} .. {list(env.box_max_m)} m, tool speed "
          f"<= {env.max_tool_speed_m_s} m/s; measured force <= {env.measured.max_force_n} N, "
          f"torque <= {env.measured.max_torque_nm} N·m; commanded force <= "
          f"{env.commanded.max_force_n} N; limited_scale {env.limited_scale}")
    return 0


def _derive(args: argparse.Namespace) -> int:
    urdf = Path(args.urdf) if args.urdf else default_urdf()
    arm = load_arm(urdf)
    path = write_derived_envelope(arm, args.out, header=(
        f"# Derived from {urdf.name} by `sim2real safety derive-envelope`; review before use.\n"
        "# Owned by operations: every change is a new version and a new SHA-256."))
    env = load_envelope(path, arm)
    print(f"wrote {path} ({len(env.joints)} joints, sha256 {env.sha256})")
    return 0


def _fault_suite(args: argparse.Namespace) -> int:
    # Loopback-only DDS on a run-unique domain unless the caller chose one.
    os.environ[DISCOVERY_VAR] = "LOCALHOST"
    if not os.environ.get(DOMAIN_VAR, "").isdigit():
        os.environ[DOMAIN_VAR] = str(random.SystemRandom().randint(1, 100))
    from sim2real_ros.safety.faults import run_fault_suite

    record = run_fault_suite(args.out, args.envelope, use_policy_node=not args.scripted_only,
                             log_dir=args.log_dir)
    ok = record.all_survived()
    n = sum(f.survived for f in record.faults)
    print(f"{n}/{len(record.faults)} faults survived; record written to {args.out} "
          f"(envelope sha256 {record.envelope_sha256[:12]})")
    return 0 if ok else 1

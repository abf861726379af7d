"""`sim2real sim ...`: inspect randomization specs and draws without starting ROS."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `sim draw`, `sim check-spec` and `sim terms` to the sim2real command."""
    sim = subparsers.add_parser(
        "sim", help="simulator: randomization specs and draws",
        description="Inspect the sim bridge's domain randomization.")
    sub = sim.add_subparsers(dest="sim_command", required=True)

    draw = sub.add_parser(
        "draw", help="print the realized draw for a seed as JSON",
        description="Build the SimCore for a spec and a seed and print its draw (what the "
        "sim_bridge publishes on sim_bridge/randomization), after --resets resets.")
    draw.add_argument("--seed", type=int, default=0, help="randomization seed (default 0)")
    draw.add_argument("--spec", type=Path, default=None,
                      help="spec or calibration file (default: config/randomization.yaml, or "
                      "the calibration's randomization section)")
    draw.add_argument("--calibration", type=Path, default=None,
                      help="calibration file whose nominal values the terms perturb")
    draw.add_argument("--resets", type=int, default=0, help="resets before printing (episode)")
    draw.add_argument("--urdf", type=Path, default=None, help="URDF (default: shipped arm)")
    draw.set_defaults(func=cmd_draw)

    check = sub.add_parser(
        "check-spec", help="validate a randomization spec (or calibration) file",
        description="Validate a spec against the arm; print its terms and sha256. Exit 2 with "
        "the file, key and value on the first error.")
    check.add_argument("file", type=Path)
    check.add_argument("--urdf", type=Path, default=None, help="URDF (default: shipped arm)")
    check.set_defaults(func=cmd_check_spec)

    terms = sub.add_parser("terms", help="list the randomization terms the spec may use")
    terms.set_defaults(func=cmd_terms)


def cmd_draw(args: argparse.Namespace) -> int:
    """Print the draw of SimCore(spec, seed) after the requested resets."""
    from sim2real_ros.config import ConfigError
    from sim2real_ros.paths import default_urdf, share_path
    from sim2real_ros.robot.model import load_arm
    from sim2real_ros.sim.core import SimCore
    from sim2real_ros.sim.randomization import RandomizationSpec, load_calibration

    if args.resets < 0:
        raise ConfigError("<command line>", "--resets", args.resets, "an integer >= 0")
    urdf = args.urdf or default_urdf()
    arm = load_arm(urdf)
    nominal, cal_spec = (None, None)
    if args.calibration is not None:
        nominal, cal_spec = load_calibration(args.calibration, arm)
    if args.spec is not None:
        spec = RandomizationSpec.from_yaml(args.spec, arm)
    elif cal_spec is not None:
        spec = cal_spec
    else:
        spec = RandomizationSpec.from_yaml(share_path("config", "randomization.yaml"), arm)
    core = SimCore(spec, seed=args.seed, urdf_path=urdf, calibration=nominal)
    try:
        for _ in range(args.resets):
            core.reset()
        print(json.dumps(core.draw.to_dict(), indent=2, sort_keys=True))
    finally:
        core.close()
    return 0


def cmd_check_spec(args: argparse.Namespace) -> int:
    """Validate a spec file; print a summary."""
    from sim2real_ros.paths import default_urdf
    from sim2real_ros.robot.model import load_arm
    from sim2real_ros.sim.randomization import TERMS, RandomizationSpec

    arm = load_arm(args.urdf or default_urdf())
    spec = RandomizationSpec.from_yaml(args.file, arm)
    print(f"{args.file}: {len(spec.terms)} terms, sha256 {spec.sha256}")
    for name, t in spec.terms.items():
        d = TERMS[name]
        where = f" joints={list(t.joints)}" if t.joints else ""
        where += f" links={list(t.links)}" if t.links else ""
        every = f" every {t.interval_s[0]:g}-{t.interval_s[1]:g} s" if t.interval_s else ""
        print(f"  {d.group:9s} {name:28s} {t.operation:5s} {t.distribution:11s} "
              f"{list(t.range)} {d.unit} at {t.mode}{every}{where}")
    groups = sorted({TERMS[n].group for n in spec.terms})
    print(f"gaps covered: {', '.join(groups) or 'none'}")
    return 0


def cmd_terms(args: argparse.Namespace) -> int:
    """List the catalogue of terms."""
    from sim2real_ros.sim.randomization import TERMS

    for name, d in TERMS.items():
        print(f"{d.group:9s} {name:28s} {d.shape:6s} {d.unit:10s} {d.description}")
    return 0

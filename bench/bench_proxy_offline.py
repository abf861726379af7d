"""Policies and the IK teacher on the MuJoCo proxy plant, offline (no ROS), filter on and off.

    .venv/bin/python -m bench.bench_proxy_offline [--policy FILE ...] [--teacher-lead S ...]
        [--unit config/proxy/unit_proxy-SN0001.yaml] [--episodes 30] [--target-seeds 7919 11 12]
        [--feedback-hop-ms LO HI] [--own-tolerance-rad R]

For each policy (and the teacher at each lead), the success over the target sets with and
without the safety projection, failures split into 'near' (came within the tolerance, never
at rest there) and 'far', and what the projection did (changed commands, new disturbances by
limit). The harness reads the unit's hidden values (sim2real_ros/proxy/offline.py): it is a
development tool, the experiment's numbers come from the graph. Figures: docs/proxy.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", nargs="*", default=[], type=Path)
    ap.add_argument("--teacher-lead", nargs="*", default=[], type=float,
                    help="also run the IK teacher with these lead times (s)")
    ap.add_argument("--unit", type=Path, default=REPO / "config/proxy/unit_proxy-SN0001.yaml")
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--target-seeds", nargs="+", type=int, default=[7919, 11, 12])
    ap.add_argument("--feedback-hop-ms", nargs=2, type=float, default=[0.0, 0.0],
                    metavar=("LO", "HI"), help="the executed command's echo delay to the "
                    "runner (uniform, ms; 2 12 puts about a fifth of them after the next step)")
    ap.add_argument("--own-tolerance-rad", type=float, default=None,
                    help="the runner's own_tolerance_rad (default: the shipped one)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from sim2real_ros.paths import share_path
    from sim2real_ros.policy.expert import ExpertGains
    from sim2real_ros.policy.model import EnsemblePolicy
    from sim2real_ros.policy.runner import PolicyRunner
    from sim2real_ros.policy.runner import DEFAULT_OWN_TOLERANCE_RAD
    from sim2real_ros.proxy.offline import (
        OfflineTiming,
        classify,
        evaluate_on_plant,
        teacher_runner,
    )
    from sim2real_ros.proxy.plant import ProxyPlant
    from sim2real_ros.proxy.scoring import episode_targets
    from sim2real_ros.proxy.unit import ProxyUnit
    from sim2real_ros.robot.model import load_arm
    from sim2real_ros.paths import default_urdf

    arm = load_arm(default_urdf())
    unit = ProxyUnit.from_yaml(args.unit, arm)
    envelope = share_path("config", "safety_envelope.yaml")
    cases: list[tuple[str, object]] = []
    tol = (DEFAULT_OWN_TOLERANCE_RAD if args.own_tolerance_rad is None
           else args.own_tolerance_rad)
    timing = OfflineTiming(feedback_hop_s=(args.feedback_hop_ms[0] * 1e-3,
                                           args.feedback_hop_ms[1] * 1e-3))
    timing.check()
    for p in args.policy:
        cases.append((str(p), lambda p=p: PolicyRunner(EnsemblePolicy.load(p), arm, tol)))
    for lead in args.teacher_lead:
        cases.append((f"teacher lead {lead * 1e3:.0f} ms",
                      lambda lead=lead: teacher_runner(gains=ExpertGains(lead_s=lead), arm=arm)))
    if not cases:
        ap.error("nothing to run: give --policy and/or --teacher-lead")
    print(f"unit {unit.unit_id}, {len(args.target_seeds)} target sets x {args.episodes} "
          "episodes, 125 Hz joint_states, 1-11 ms command hop, executed echo "
          f"{args.feedback_hop_ms[0]:g}-{args.feedback_hop_ms[1]:g} ms, own tolerance "
          f"{tol:g} rad")
    print("| case | filter | success | near | far | commands changed | new disturbances "
          "(by limit) | steps adopted | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, make in cases:
        for filt in (False, True):
            t0 = time.perf_counter()
            kinds: Counter[str] = Counter()
            changed = commands = adopted = 0
            onsets: Counter[str] = Counter()
            for ts in args.target_seeds:
                runner = make()
                targets = episode_targets(ts, args.episodes, runner.task, arm)
                res, c = evaluate_on_plant(runner, targets, ProxyPlant(unit), timing,
                                           envelope_path=envelope if filt else None)
                kinds.update(classify(r, runner.task.tolerance_m) for r in res)
                changed += c.intervened
                adopted += c.adopted
                commands += c.commands
                onsets.update(c.onset_limits)
            n = sum(kinds.values())
            dist = ", ".join(f"{k} {v}" for k, v in onsets.most_common()) or "-"
            print(f"| {name} | {'on' if filt else 'off'} | {kinds['success']}/{n} "
                  f"({kinds['success'] / n:.0%}) | {kinds['near']} | {kinds['far']} | "
                  f"{changed / max(commands, 1):.1%} | {dist if filt else '-'} | {adopted} | "
                  f"{time.perf_counter() - t0:.0f} |")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())

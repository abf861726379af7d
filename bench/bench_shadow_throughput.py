"""Cost of the shadow comparator's core per control step, against the 10 ms control period.

One control step = one joint_states observation, one policy command, one baseline command and
one confidence message, as the comparator receives them at 100 Hz. Measured:

- metrics: `ShadowAccumulator` alone (alignment, divergence, confidence, coverage): the baseline;
- metrics + would-be interventions: the same with the safety room's `Projector` running on the
  policy's commands (what the live node does).

Rounds alternate the two so load from other processes hits both alike; the table shows the median
over rounds and the ratio to the baseline. Writes bench/results/shadow_throughput.json.

    .venv/bin/python -m bench.bench_shadow_throughput [--rounds 5] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
HOME = np.array([0.0, 0.25, 1.5, 0.0, 1.5, 0.0])
PERIOD_S = 0.01


def run(steps: int, with_check: bool, seed: int) -> float:
    """Return seconds per control step for `steps` steps of a seeded shadow stream."""
    from sim2real_ros.paths import default_urdf
    from sim2real_ros.robot.model import load_arm
    from sim2real_ros.shadow.divergence import ShadowAccumulator, TrainingStats
    from sim2real_ros.shadow.gates import load_rollout_config
    from sim2real_ros.shadow.interventions import build_intervention_check

    arm = load_arm(default_urdf())
    cfg = load_rollout_config()
    check = build_intervention_check(None, arm)[0] if with_check else None
    stats = TrainingStats(np.concatenate([HOME, np.zeros(6)]), np.full(12, 0.3))
    acc = ShadowAccumulator(arm.joint_names, cfg.metrics, check, stats)
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, 0.005, (steps, 6))
    ood = rng.gamma(2.0, 0.5, steps)
    t0 = time.perf_counter()
    for k in range(steps):
        t_ns = k * 10_000_000
        q = HOME + 0.2 * np.sin(0.005 * k + np.arange(6))
        acc.add_joint_state(t_ns, q, np.zeros(6))
        acc.add_policy(t_ns, q + noise[k])
        acc.add_baseline(t_ns, q)
        acc.add_confidence(t_ns, 0.01, float(ood[k]), 1)
    acc.metrics()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    """Run the benchmark, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    base: list[float] = []
    full: list[float] = []
    for r in range(args.rounds):
        base.append(run(args.steps, False, seed=r))
        full.append(run(args.steps, True, seed=r))
    b, f = statistics.median(base), statistics.median(full)
    rows = [
        ("metrics only (baseline)", b, 1.0),
        ("metrics + Projector would-be check", f, f / b),
    ]
    print(f"{'configuration':<38} {'us/step':>9} {'x baseline':>11} {'% of 10 ms':>11}")
    for name, s, ratio in rows:
        print(f"{name:<38} {s * 1e6:>9.1f} {ratio:>11.2f} {100 * s / PERIOD_S:>10.2f}%")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "shadow_throughput.json"
    out.write_text(json.dumps({
        "command": "python -m bench.bench_shadow_throughput "
                   f"--rounds {args.rounds} --steps {args.steps}",
        "machine": platform.platform(),
        "python": platform.python_version(),
        "us_per_step": {"metrics_only": b * 1e6, "metrics_and_projector": f * 1e6},
        "ratio_to_baseline": f / b,
        "fraction_of_control_period": {"metrics_only": b / PERIOD_S,
                                       "metrics_and_projector": f / PERIOD_S},
        "rounds": {"metrics_only": base, "metrics_and_projector": full},
    }, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

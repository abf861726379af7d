"""Training throughput: environment steps per second of the reaching environment.

One control step = 10 physics steps (100 Hz control, 1 kHz physics) of a randomized `SimCore`
with the shipped config/randomization.yaml. Measured in one process, rounds interleaved:

- core_only: the same `SimCore`s stepped directly (`command` + `advance(0.01)`), a fixed
  command, no task logic: the simulator's own cost (the baseline for the ratios).
- env_expert: `ReachingVecEnv.step` with the IK expert's actions (observations, forward
  kinematics, rewards, success checks, resets): what BC/DAgger data collection costs.
- env_policy: the same with the ensemble policy choosing the actions (DAgger rollouts,
  evaluation).
- bc_update: gradient steps/s of the ensemble regression (5 members, batch 256 each).

Prints a table; writes bench/results/policy_training.json.

    .venv/bin/python -m bench.bench_policy_training [--envs 8] [--steps 150] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150, help="vectorized steps per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from sim2real_ros.policy.env import ReachingVecEnv, load_spec
    from sim2real_ros.policy.model import EnsemblePolicy
    from sim2real_ros.policy.registry import DEFAULT_DIR
    from sim2real_ros.policy.train import _fit, _policy_action

    spec = load_spec("default")
    env = ReachingVecEnv(args.envs, spec=spec, seed=0)
    policy = EnsemblePolicy.load(DEFAULT_DIR / "policy.pt")
    obs = env.reset()
    rates: dict[str, list[float]] = {"core_only": [], "env_expert": [], "env_policy": [],
                                     "bc_update": []}
    dt = env.task.dt_s
    hold = [c.plant.state().q.copy() for c in env.cores]
    x = np.concatenate([env.observations() for _ in range(4)])
    y = env.expert_actions().repeat(4, axis=0)
    opt = torch.optim.Adam(policy.net.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    try:
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                for c, q in zip(env.cores, hold, strict=True):
                    c.command("position", q)
                    c.advance(dt)
            rates["core_only"].append(args.steps * env.n / (time.perf_counter() - t0))
            obs = env.reset()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                obs = env.step(env.expert_actions()).obs
            rates["env_expert"].append(args.steps * env.n / (time.perf_counter() - t0))
            obs = env.reset()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                obs = env.step(_policy_action(policy, obs)).obs
            rates["env_policy"].append(args.steps * env.n / (time.perf_counter() - t0))
            n_grad = 100
            t0 = time.perf_counter()
            _fit(policy, opt, x, y, n_grad, 256, gen)
            rates["bc_update"].append(n_grad / (time.perf_counter() - t0))
    finally:
        env.close()
    med = {k: float(np.median(v)) for k, v in rates.items()}
    base = med["core_only"]
    print(f"reaching env, {args.envs} randomized SimCores in one process, 100 Hz control / "
          f"1 kHz physics, torch 1 thread; median of {args.rounds} rounds")
    print(f"{'variant':12} {'rate':>10} {'unit':18} {'x core_only':>11}")
    for k in ("core_only", "env_expert", "env_policy"):
        print(f"{k:12} {med[k]:10.0f} {'env steps/s':18} {med[k] / base:11.2f}")
    print(f"{'bc_update':12} {med['bc_update']:10.0f} {'grad steps/s':18} {'':>11}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "benchmark": "policy_training",
        "command": ".venv/bin/python -m bench.bench_policy_training "
                   f"--envs {args.envs} --steps {args.steps} --rounds {args.rounds}",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "loadavg": os.getloadavg()},
        "median": med,
        "rounds": rates,
        "ratio_vs_core_only": {k: med[k] / base for k in ("env_expert", "env_policy")},
    }
    (RESULTS / "policy_training.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / 'policy_training.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Policy inference latency at batch 1: the shipped ensemble against a plain MLP of its width.

All in one process with torch.set_num_threads(1), interleaved in rounds so that load from
other processes hits every variant alike:

- plain_mlp: `torch.nn.Sequential` of Linear+Tanh with the same layer sizes, one member,
  `torch.inference_mode()`, input already a tensor (the floor).
- ensemble_torch: the shipped ensemble as the torch `EnsembleMLP` (N members as batched
  matmuls, what training uses) on a normalized tensor.
- ensemble_numpy: the same forward pass in NumPy (`EnsemblePolicy.members_np`, what running a
  policy uses: no torch at run time) from a raw observation, normalization included.
- ensemble_evaluate: `EnsemblePolicy.evaluate` from a NumPy observation: normalization, all
  members, mean action, disagreement (rad) and OOD score (what the node calls per tick).
- runner_step: `PolicyRunner.step` (adds the observation build with forward kinematics and
  the bounded target update): the node's whole per-tick compute.

Prints a table of p50/p99 in microseconds and ratios against plain_mlp; writes
bench/results/policy_inference.json.

    .venv/bin/python -m bench.bench_policy_inference [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"


def _timings(fn: Callable[[], Any], calls: int) -> np.ndarray:
    for _ in range(50):
        fn()
    out = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        out[i] = time.perf_counter_ns() - t0
    return out / 1e3  # µs


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from sim2real_ros.policy.model import EnsemblePolicy
    from sim2real_ros.policy.nets import PlainMLP
    from sim2real_ros.policy.registry import DEFAULT_DIR
    from sim2real_ros.policy.runner import PolicyRunner

    policy = EnsemblePolicy.load(DEFAULT_DIR / "policy.pt")
    runner = PolicyRunner(EnsemblePolicy.load(DEFAULT_DIR / "policy.pt"))  # NumPy weights
    spec = policy.spec
    plain = PlainMLP(spec).eval()
    q = np.array(runner.task.home_rad)
    qd = np.zeros_like(q)
    target = runner.arm.tool_position(q) + np.array([0.1, 0.05, -0.05])
    obs_np = runner.observation(q, qd, target)
    obs_t = torch.as_tensor(obs_np[None, :])
    norm_t = policy.normalize(obs_t)

    def plain_call() -> None:
        with torch.inference_mode():
            plain(norm_t)

    def net_call() -> None:
        with torch.inference_mode():
            policy.net(norm_t)

    def numpy_call() -> None:
        runner.policy.members_np(obs_np[None, :])

    def eval_call() -> None:
        runner.policy.evaluate(obs_np)

    def runner_call() -> None:
        runner.reset()
        runner.step(q, qd, target)

    variants = {"plain_mlp": plain_call, "ensemble_torch": net_call,
                "ensemble_numpy": numpy_call, "ensemble_evaluate": eval_call,
                "runner_step": runner_call}
    samples: dict[str, list[np.ndarray]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            samples[name].append(_timings(fn, args.calls))
    rows = {}
    for name, parts in samples.items():
        s = np.concatenate(parts)
        rows[name] = {"p50_us": float(np.percentile(s, 50)), "p99_us": float(np.percentile(s, 99)),
                      "mean_us": float(s.mean()), "calls": int(s.size)}
    base = rows["plain_mlp"]
    for r in rows.values():
        r["p50_ratio_vs_plain"] = r["p50_us"] / base["p50_us"]
        r["p99_ratio_vs_plain"] = r["p99_us"] / base["p99_us"]
    print(f"policy inference at batch 1, torch {torch.__version__}, 1 thread; ensemble "
          f"{spec.members} x {list(spec.hidden)} (obs {spec.obs_dim}, act {spec.act_dim})")
    print(f"{'variant':20} {'p50 us':>9} {'p99 us':>9} {'p50 x plain':>12} {'p99 x plain':>12}")
    for name, r in rows.items():
        print(f"{name:20} {r['p50_us']:9.1f} {r['p99_us']:9.1f} {r['p50_ratio_vs_plain']:12.2f} "
              f"{r['p99_ratio_vs_plain']:12.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "benchmark": "policy_inference",
        "command": ".venv/bin/python -m bench.bench_policy_inference "
                   f"--calls {args.calls} --rounds {args.rounds}",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "loadavg": os.getloadavg()},
        "torch": torch.__version__,
        "members": spec.members, "hidden": list(spec.hidden),
        "results": rows,
    }
    (RESULTS / "policy_inference.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / 'policy_inference.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

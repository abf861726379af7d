"""How often the safety projection reshapes the jerk-limited action interface, vs arrival jitter.

Not a speed benchmark: a measurement of the interaction between the policy's action interface
(`policy.task.advance_command`, jerk-limited, 0.8 of the envelope's rates) and the safety
filter's projection (`safety.projection.Projector`, config/safety_envelope.yaml), which takes
the command's rates from the time between arrivals. The IK expert (the policy's teacher) drives
a kinematic arm (the measured position is the emitted command) to seeded targets; the command
history is the executed one, as in the policy node (`follow_executed_command`). Each command is
projected with dt = 10 ms + uniform(-jitter, +jitter), i.e. as if it reached the filter that
much early or late.

Baseline, same run: the old `step` interface (a target move of up to 0.02 rad per period) at
zero jitter.

    .venv/bin/python -m bench.bench_interface_jitter [--episodes 10]

Writes bench/results/interface_jitter.json; figures in docs/proxy.md.
"""

from __future__ import annotations

import argparse
import collections
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
PERIOD_S = 0.01
JITTERS_S = (0.0, 0.5e-3, 1e-3, 2e-3, 4e-3)


def run(interface: str, jitter_s: float, episodes: int, seed: int) -> dict[str, object]:
    """Return the share of ticks the projection changed by > 1 mrad and the limits it hit."""
    from sim2real_ros.paths import default_urdf, share_path
    from sim2real_ros.policy.expert import IKExpert
    from sim2real_ros.policy.task import (
        TaskConfig,
        advance_command,
        initial_history,
        resolve_rate_limits,
    )
    from sim2real_ros.robot import load_arm
    from sim2real_ros.safety.envelope import load_envelope
    from sim2real_ros.safety.projection import Projector

    arm = load_arm(default_urdf())
    env = load_envelope(share_path("config", "safety_envelope.yaml"), arm)
    cfg = resolve_rate_limits(replace(TaskConfig(), action_interface=interface), arm)
    expert = IKExpert(arm, cfg)
    proj = Projector(env, arm, PERIOD_S)
    rng = np.random.default_rng(seed)
    home = np.array(cfg.home_rad)
    moving = np.array([1.0, 1, 1, 1, 1, 0])
    ticks = changed = 0
    limits: collections.Counter[str] = collections.Counter()
    for _ in range(episodes):
        q = home + rng.uniform(-0.3, 0.3, 6) * moving
        target = arm.tool_position(home + rng.uniform(-0.5, 0.5, 6) * moving)
        hist = initial_history(q)
        executed = [q.copy(), q.copy()]
        proj.reset(q.tolist())
        for _ in range(int(round(cfg.episode_s / PERIOD_S))):
            action = expert.act(q[None], target[None])[0]
            hist = advance_command(cfg, arm, hist, q, action)
            dt = PERIOD_S + rng.uniform(-jitter_s, jitter_s)
            res = proj.project_position(arm.joint_names, hist[0].tolist(), dt, q.tolist())
            ticks += 1
            if res.deviation > 1e-3:
                changed += 1
                limits.update(e.limit for e in res.events)
            q = np.array(res.command)
            # The executed command replaces the request: history = the last three emitted.
            hist = np.stack([q, executed[0], executed[1]])
            executed = [q, executed[0]]
    return {"interface": interface, "jitter_ms": jitter_s * 1e3, "ticks": ticks,
            "changed_fraction": changed / ticks, "limits": dict(limits)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = [run("step", 0.0, args.episodes, args.seed)]
    rows += [run("jerk_limited", j, args.episodes, args.seed) for j in JITTERS_S]
    print("| interface | arrival jitter | ticks changed > 1 mrad | limits hit (events) |")
    print("|---|---|---|---|")
    for r in rows:
        lim = ", ".join(f"{k} {v}" for k, v in sorted(r["limits"].items()))  # type: ignore[union-attr]
        print(f"| {r['interface']} | ±{r['jitter_ms']:.1f} ms | {r['changed_fraction']:.1%} | "
              f"{lim or '-'} |")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "interface_jitter.json"
    path.write_text(json.dumps({"episodes": args.episodes, "seed": args.seed, "rows": rows},
                               indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

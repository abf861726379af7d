"""World model: one-step accuracy and fit time, against a linear least-squares model, same data.

Two data sets, both seeded:
- `synthetic`: a two-joint damped servo (exact ZOH discretisation at 10 ms), random states and
  targets (the dynamics the tests hold the world model to);
- `arm`: the shipped 6-DOF arm in SimCore (nominal, no randomization) driven by a multi-sine
  about a working pose at 100 Hz; split at random (interpolation) and in time (the last 20 %
  of the run: states the model has not seen).

For each: held-out one-step RMS error as a fraction of the per-step change's std (worst
position and worst velocity dimension), fit wall time, the same errors for a linear
least-squares model `next - state = W [state, action, 1]` fitted on the same split, and the
fraction of test states the ensemble flags as outside its data. Also the out-of-data fraction
on states at 4x the synthetic data range.

    .venv/bin/python -m bench.bench_audit_worldmodel [--epochs 100]

Writes bench/results/audit_worldmodel.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """Random transitions of a two-joint damped servo; also return the state sampler."""
    from scipy.linalg import expm

    kp, kd, dt = np.array([100.0, 60.0]), np.array([12.0, 8.0]), 0.01
    a = np.zeros((4, 4))
    a[:2, 2:] = np.eye(2)
    a[2:, :2], a[2:, 2:] = -np.diag(kp), -np.diag(kd)
    b = np.zeros((4, 2))
    b[2:, :] = np.diag(kp)
    m = np.zeros((6, 6))
    m[:4, :4], m[:4, 4:] = a, b
    e = expm(m * dt)
    ad, bd = e[:4, :4], e[:4, 4:]
    rng = np.random.default_rng(seed)

    def states(k: int, scale: float = 1.0) -> np.ndarray:
        return np.hstack([rng.uniform(-1, 1, (k, 2)), rng.uniform(-3, 3, (k, 2))]) * scale

    s = states(n)
    u = rng.uniform(-1, 1, (n, 2))
    return s, u, s @ ad.T + u @ bd.T, states


def arm(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Transitions of the shipped arm in SimCore under a multi-sine about a working pose."""
    from sim2real_ros.sim.core import SimCore

    home = np.array([0.0, -0.5, 1.2, 0.0, 1.0, 0.0])
    rng = np.random.default_rng(seed)
    freqs = rng.uniform(0.1, 1.0, (3, 6))
    phases = rng.uniform(0, 2 * np.pi, (3, 6))
    core = SimCore(seed=seed, q0=home)
    obs = core.reset(q0=home)
    s, u, nxt = [], [], []
    try:
        for k in range(n):
            target = home + 0.1 * np.sin(2 * np.pi * freqs * k * 0.01 + phases).sum(0)
            s.append(np.concatenate([obs.q, obs.qd]))
            core.command("position", target)
            obs = core.advance(0.01)
            u.append(target)
            nxt.append(np.concatenate([obs.q, obs.qd]))
    finally:
        core.close()
    return np.array(s), np.array(u), np.array(nxt)


def evaluate(s: np.ndarray, u: np.ndarray, nxt: np.ndarray, epochs: int, split: str
             ) -> dict[str, Any]:
    """Fit both models on 80 % (random or the first 80 % in time), score both on the rest."""
    from sim2real_ros.audit.worldmodel import EnsembleWorldModel, Transitions, WorldModelConfig

    n_train = int(0.8 * len(s))
    order = (np.random.default_rng(1).permutation(len(s)) if split == "random"
             else np.arange(len(s)))
    tr, te = order[:n_train], order[n_train:]
    change_std = (nxt - s)[te].std(axis=0)
    t0 = time.perf_counter()
    model = EnsembleWorldModel.fit(Transitions(s[tr], u[tr], nxt[tr]),
                                   WorldModelConfig(epochs=epochs), heldout_fraction=0.0)
    fit_s = time.perf_counter() - t0
    pred, _ = model.predict(s[te], u[te])
    wm = np.sqrt(np.mean((pred - nxt[te]) ** 2, axis=0)) / change_std
    x = np.hstack([s, u, np.ones((len(s), 1))])
    w, *_ = np.linalg.lstsq(x[tr], (nxt - s)[tr], rcond=None)
    lin = np.sqrt(np.mean((s[te] + x[te] @ w - nxt[te]) ** 2, axis=0)) / change_std
    half = s.shape[1] // 2
    return {
        "split": split, "n_train": n_train, "n_test": len(te), "fit_s": fit_s,
        "wm_rel_err_position": float(wm[:half].max()),
        "wm_rel_err_velocity": float(wm[half:].max()),
        "linear_rel_err_position": float(lin[:half].max()),
        "linear_rel_err_velocity": float(lin[half:].max()),
        "test_flagged_out_of_data": float(model.outside_data(s[te], u[te]).mean()),
        "_model": model,
    }


def main(argv: list[str] | None = None) -> int:
    """Run both data sets and print the table."""
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=100)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows: dict[str, dict[str, Any]] = {}
    s, u, nxt, states = synthetic(3000, 0)
    rows["synthetic random"] = evaluate(s, u, nxt, args.epochs, "random")
    model = rows["synthetic random"].pop("_model")
    far = states(1000, 4.0)
    flagged_far = float(model.outside_data(far, np.zeros((1000, 2))).mean())
    arm_data = arm(3000, 0)
    for split in ("random", "time"):
        rows[f"arm {split}"] = evaluate(*arm_data, args.epochs, split)
        rows[f"arm {split}"].pop("_model")
    print(f"{'data':<17} {'fit s':>6} {'WM pos':>7} {'WM vel':>7} {'lin pos':>7} "
          f"{'lin vel':>7} {'lin/WM vel':>10} {'test OOD':>8}")
    for name, r in rows.items():
        ratio = r["linear_rel_err_velocity"] / r["wm_rel_err_velocity"]
        print(f"{name:<17} {r['fit_s']:>6.1f} {r['wm_rel_err_position']:>7.4f} "
              f"{r['wm_rel_err_velocity']:>7.4f} {r['linear_rel_err_position']:>7.4f} "
              f"{r['linear_rel_err_velocity']:>7.4f} {ratio:>10.2f} "
              f"{r['test_flagged_out_of_data']:>8.1%}")
    print("errors: held-out one-step RMS / std of the per-step change, worst dimension; "
          "2400 train, 600 test transitions")
    print(f"synthetic: {flagged_far:.1%} of states at 4x the data range flagged out of data")
    rows["synthetic random"]["flagged_out_of_data_at_4x"] = flagged_far
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "audit_worldmodel.json"
    out.write_text(json.dumps({"epochs": args.epochs, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

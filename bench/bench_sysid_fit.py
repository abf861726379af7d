"""Benchmark: sysid fit of 3 runs x 20 s at 500 Hz; held-out rollout error nominal vs calibrated.

    .venv/bin/python -m bench.bench_sysid_fit [--runs 3] [--duration 20] [--seed 0]

Synthetic "real" runs come from the sim plant with hidden parameters (synth.default_hidden_unit,
a 2 % run-to-run variation, sensor noise), are written as bags in the recorder's layout and read
back, so the timed path is the one `sim2real sysid fit` runs. Prints a table and writes
bench/results/sysid_fit.json. Target: held-out rollout error nominal / calibrated >= 3.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from sim2real_ros.sim.plant import ArmPlant
from sim2real_ros.sysid import excitation as ex
from sim2real_ros.sysid import synth
from sim2real_ros.sysid.fit import FitOptions, fit, get_value
from sim2real_ros.sysid.residual import train_residual
from sim2real_ros.sysid.runs import load_run

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 when the held-out improvement meets the 3x target."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-iterations", type=int, default=10)
    args = ap.parse_args(argv)

    hidden, latency = synth.default_hidden_unit()
    plant = ArmPlant()
    env = ex.ExcitationEnvelope.from_arm(plant.arm, velocity_fraction=0.4,
                                         max_acceleration_rad_s2=6.0)
    center = ex.default_center(env)
    with tempfile.TemporaryDirectory(prefix="bench_sysid_") as tmp:
        t0 = time.perf_counter()
        paths = []
        for i in range(args.runs):
            exc = ex.make_excitation("multisine", center, env, args.duration, 0.4,
                                     seed=args.seed + i)
            run = synth.synthesize_run(plant, synth.run_variation(hidden, i, args.seed), exc,
                                       latency_s=latency, seed=args.seed + 100 + i,
                                       name=f"run{i}")
            paths.append(synth.write_run_bag(Path(tmp) / f"run{i}", run,
                                             synth.synthetic_metadata("BENCH", i, exc)))
        t_synth = time.perf_counter() - t0
        t0 = time.perf_counter()
        runs = [load_run(p, plant.joint_names) for p in paths]
        t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    c0 = time.process_time()
    result = fit(runs, FitOptions(max_iterations=args.max_iterations, progress=False),
                 plant=plant)
    t_fit = time.perf_counter() - t0
    cpu_fit = time.process_time() - c0
    t0 = time.perf_counter()
    train = [r for r in runs if r.name in result.train_runs]
    test = [r for r in runs if r.name in result.validation_runs]
    _, res_rep = train_residual(plant, train, test, result.params, result.action_latency_s)
    t_res = time.perf_counter() - t0
    plant.close()

    truth = plant.resolved_params(hidden)
    errors = {}
    for d in result.defs:
        if d.name in result.fitted:
            want = get_value(truth, latency, d)
            errors[d.name] = {"fitted": result.fitted[d.name], "truth": want,
                              "rel_error": (result.fitted[d.name] - want) / max(abs(want), 1e-9)}
    samples = sum(r.t_s.size for r in runs)
    out = {
        "runs": args.runs, "duration_s": args.duration, "samples": samples,
        "sample_rate_hz": 1.0 / runs[0].sample_period_s,
        "synthesize_s": t_synth, "load_bags_s": t_load, "fit_s": t_fit, "fit_cpu_s": cpu_fit, "residual_s": t_res,
        "simulations": result.evaluations, "solver_evaluations": result.iterations,
        "windows": result.n_windows,
        "held_out_rms_nominal_rad": result.error_nominal.rms_q_total_rad,
        "held_out_rms_calibrated_rad": result.error_calibrated.rms_q_total_rad,
        "improvement": result.improvement,
        "latency_truth_s": latency, "latency_fit_s": result.action_latency_s,
        "latency_xcorr_s": result.latency.action_latency_s,
        "max_rel_error": {g: max(abs(v["rel_error"]) for k, v in errors.items()
                                 if k.startswith(g)) for g in
                          ("joint_damping_nms", "joint_friction_nm", "kp_scale", "mass_scale",
                           "inertia_scale", "payload_kg")
                          if any(k.startswith(g) for k in errors)},
        "refused": result.identifiability.refused,
        "residual_held_out_rms_q_sim_rad": res_rep.rms_q_sim_rad,
        "residual_held_out_rms_q_corrected_rad": res_rep.rms_q_corrected_rad,
        "parameters": errors,
        "machine": platform.platform(), "python": platform.python_version(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sysid_fit.json").write_text(json.dumps(out, indent=2, default=float))
    print(f"sysid fit benchmark: {args.runs} runs x {args.duration:g} s at "
          f"{out['sample_rate_hz']:.0f} Hz ({samples} joint states)")
    print(f"{'quantity':44s} {'value':>14s}")
    rows = [
        ("synthesize + write bags [s]", f"{t_synth:.1f}"),
        ("read bags [s]", f"{t_load:.2f}"),
        ("fit (latency, pre-check, LSQ, spread, held-out) [s]", f"{t_fit:.1f}"),
        ("fit CPU time (process) [s]", f"{cpu_fit:.1f}"),
        ("plant simulations / solver evaluations", f"{result.evaluations} / {result.iterations}"),
        ("held-out rollout RMS, nominal [rad]", f"{result.error_nominal.rms_q_total_rad:.3g}"),
        ("held-out rollout RMS, calibrated [rad]",
         f"{result.error_calibrated.rms_q_total_rad:.3g}"),
        ("nominal / calibrated (target >= 3)", f"{result.improvement:.1f}x"),
        ("latency truth / xcorr / fit [ms]",
         f"{latency * 1e3:.1f}/{result.latency.action_latency_s * 1e3:.1f}/"
         f"{result.action_latency_s * 1e3:.2f}"),
        ("residual: held-out 1-step RMS sim -> corrected [rad]",
         f"{res_rep.rms_q_sim_rad:.2g}->{res_rep.rms_q_corrected_rad:.2g}"),
    ]
    for g, v in out["max_rel_error"].items():
        rows.append((f"max |relative error| {g}", f"{100 * v:.1f} %"))
    for name, value in rows:
        print(f"{name:44s} {value:>14s}")
    print(f"wrote {RESULTS / 'sysid_fit.json'}")
    return 0 if result.improvement >= 3.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

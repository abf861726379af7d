"""Study: which excitation lets the effort regression recover the proxy unit's physics?

Not a speed benchmark: an offline identification study on the proxy plant (MuJoCo, the shipped
hidden unit), the question issue #9's parameter-recovery target asks. Each excitation variant is
run as the recorder runs it in the transfer experiment (hold, multisine around a centre, hold;
commands at 100 Hz through the unit's bus latency, joint states at the proxy's publish rate with
the unit's encoder errors), three seeds per variant. The recorded runs go through exactly the
fit's physics path (the effort lag and alignment, `servo_start` for the drive's start, then
`effort_estimate`: the effort regression with its nuisance parameters) and the estimate is compared
with the unit's hidden values under the simulator's names (`proxy.recovery.truth_values`).

    ROS not needed.  .venv/bin/python -m bench.study_excitation_recovery [--quick]

Writes bench/results/excitation_recovery.json and .md (per variant: per-parameter errors and
how many of the compared values are within +-10 %).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.policy.task import TaskConfig
from sim2real_ros.proxy.offline import record_excitation
from sim2real_ros.proxy.plant import ProxyPlant
from sim2real_ros.proxy.recovery import TOLERANCE, truth_values
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.robot.model import load_arm
from sim2real_ros.sim.plant import ArmPlant
from sim2real_ros.sysid import excitation as ex
from sim2real_ros.sysid.fit import FitOptions, effort_estimate, param_defs, servo_start
from sim2real_ros.sysid.regression import EffortRegression, align_effort
from sim2real_ros.sysid.runs import RunData

RESULTS = Path(__file__).resolve().parent / "results"
REGRESSION = ("joint_damping_nms", "joint_friction_nm", "armature_kgm2", "mass_scale",
              "inertia_scale", "payload_kg")
GROUPS = REGRESSION + ("kp_scale", "kd_scale", "action_latency_s")
COMMAND_HZ = 100.0


@dataclass(frozen=True)
class Variant:
    """One excitation recipe (the recorder's parameters of the same names)."""

    name: str
    center: str = "home"  # 'home' (the task's home pose: where the experiment excites) | 'bent'
    velocity_fraction: float = 0.3
    max_acceleration_rad_s2: float = 3.0
    amplitude_rad: float = 0.3
    f_min_hz: float = 0.2
    f_max_hz: float = 2.0
    duration_s: float = 20.0


VARIANTS = (
    Variant("current (home, 0.3 v, 3 rad/s2)"),
    Variant("acc 6, v 0.5", velocity_fraction=0.5, max_acceleration_rad_s2=6.0),
    Variant("bent centre", center="bent"),
    Variant("bent, acc 6, v 0.5", center="bent", velocity_fraction=0.5,
            max_acceleration_rad_s2=6.0),
    Variant("bent, acc 10, v 0.6, 0.5 rad, 0.2-4 Hz", center="bent", velocity_fraction=0.6,
            max_acceleration_rad_s2=10.0, amplitude_rad=0.5, f_max_hz=4.0),
)


def estimate(sim: ArmPlant, runs: list[RunData]) -> dict[str, float]:
    """The fit's physics path: the effort lag, the aligned efforts, the drive's start and the
    effort regression (with its nuisance parameters), as `sysid.fit` runs them."""
    opts = FitOptions(groups=GROUPS, hold_regression=REGRESSION)
    base = sim.resolved_params()
    defs = param_defs(GROUPS, sim.n)
    runs = align_effort(runs, EffortRegression(sim, runs, base).scan_lag(REGRESSION).lag_s)
    latency0 = 0.02
    servo = servo_start(sim, runs, base, latency0, opts.max_latency_s)
    drive: dict[str, float] = {}
    if servo is not None:
        latency0 = servo.latency_s
        drive = {f"kp_scale[{j}]": float(v) for j, v in enumerate(servo.kp_scale)}
    warm = effort_estimate(sim, runs, base, defs, GROUPS, latency0, opts.max_latency_s, drive)
    return {k: v for k, v in warm.values.items() if not k.startswith(("kp_scale", "kd_scale"))}


def compare(values: dict[str, float], truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows per compared parameter (and joint): fitted, true, relative error."""
    rows = []
    for key in ("mass_scale", "payload_kg", "joint_damping_nms", "joint_friction_nm",
                "armature_kgm2"):
        t = np.atleast_1d(np.asarray(truth[key], dtype=float))
        for j in range(t.size):
            name = key if t.size == 1 else f"{key}[{j}]"
            if name not in values or abs(t[j]) < 1e-12:
                continue
            rel = (values[name] - t[j]) / abs(t[j])
            rows.append({"parameter": name, "fitted": values[name], "true": float(t[j]),
                         "rel_error": float(rel), "within_10pct": bool(abs(rel) <= TOLERANCE)})
    return rows


def run_variant(v: Variant, unit: ProxyUnit, sim: ArmPlant, seeds: tuple[int, ...],
                obs_hz: float, settle_s: float, noise_free: bool) -> dict[str, Any]:
    """Record `seeds` runs of one variant on a fresh plant and estimate from them."""
    arm = sim.arm
    envelope = ex.ExcitationEnvelope.from_arm(arm, 0.3, v.velocity_fraction,
                                              v.max_acceleration_rad_s2)
    center = (np.array(TaskConfig().home_rad) if v.center == "home"
              else ex.default_center(envelope))
    plant_unit = unit
    if noise_free:
        zero = np.zeros(arm.n_joints)
        plant_unit = replace(unit, encoder_bias_rad=zero, encoder_drift_rad_s=zero,
                             encoder_resolution_rad=zero, encoder_noise_std_rad=zero)
    plant = ProxyPlant(plant_unit)
    t0 = time.monotonic()
    runs = []
    for s in seeds:
        exc = ex.make_excitation("multisine", center, envelope, v.duration_s, v.amplitude_rad,
                                 v.f_min_hz, v.f_max_hz, seed=s)
        runs.append(record_excitation(plant, exc, obs_hz, settle_s, COMMAND_HZ, f"seed{s}"))
    values = estimate(sim, runs)
    rows = compare(values, truth_values(unit))
    peak_acc = float(max(np.abs(np.diff(r.qd, axis=0)).max() * obs_hz for r in runs))
    return {"variant": v.__dict__, "noise_free": noise_free, "rows": rows,
            "n_within": sum(r["within_10pct"] for r in rows), "n_compared": len(rows),
            "center_rad": np.round(center, 3).tolist(), "measured_peak_acc_rad_s2": peak_acc,
            "wall_s": time.monotonic() - t0}


def markdown(results: list[dict[str, Any]]) -> str:
    """One table: a column per variant, a row per parameter (relative error, %)."""
    names = [r["parameter"] for r in results[0]["rows"]]
    head = "| parameter | " + " | ".join(
        f"{r['variant']['name']}{' (noise-free)' if r['noise_free'] else ''}"
        for r in results) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    for k, name in enumerate(names):
        cells = []
        for r in results:
            row = r["rows"][k] if k < len(r["rows"]) else None
            if row is None or row["parameter"] != name:
                cells.append("—")
                continue
            mark = "" if row["within_10pct"] else "**"
            cells.append(f"{mark}{100 * row['rel_error']:+.0f} %{mark}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **within ±10 %** | " + " | ".join(
        f"{r['n_within']} of {r['n_compared']}" for r in results) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the study; print and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two variants, 8 s runs (a check)")
    ap.add_argument("--unit", type=Path, default=None, help="proxy unit file (default: shipped)")
    ap.add_argument("--obs-hz", type=float, default=125.0, help="joint-state rate (proxy_rate_hz)")
    ap.add_argument("--noise-free", action="store_true", help="also run without encoder errors")
    args = ap.parse_args(argv)
    arm = load_arm(default_urdf())
    unit_path = args.unit or share_path("config", "proxy", "unit_proxy-SN0001.yaml")
    unit = ProxyUnit.from_yaml(unit_path, arm)
    variants = VARIANTS[:1] + VARIANTS[3:4] if args.quick else VARIANTS
    if args.quick:
        variants = tuple(Variant(**{**v.__dict__, "duration_s": 8.0}) for v in variants)
    sim = ArmPlant()
    results = []
    try:
        for v in variants:
            for nf in ((False, True) if args.noise_free else (False,)):
                res = run_variant(v, unit, sim, (1, 2, 3), args.obs_hz, 2.0, nf)
                results.append(res)
                print(f"{v.name}{' noise-free' if nf else ''}: {res['n_within']} of "
                      f"{res['n_compared']} within 10 % ({res['wall_s']:.0f} s)", flush=True)
    finally:
        sim.close()
    md = markdown(results)
    print(md)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "excitation_recovery.json").write_text(json.dumps(
            {"unit_file": str(unit_path), "obs_hz": args.obs_hz, "results": results}, indent=1))
        (RESULTS / "excitation_recovery.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sim-core physics steps per second with every randomization term on, against raw PyBullet.

Both sides simulate the same arm (urdf/sim2real_arm.urdf) at the same 1 kHz physics step with
the same I/O cadence a controller gives it: a position command every 10 ms and a joint-state
read every 2 ms (500 Hz joint_states).

- raw: PyBullet's own POSITION_CONTROL motors, `stepSimulation()` per step, `getJointStates()`
  every 2 steps, `setJointMotorControlArray()` every 10 steps; nothing else.
- plant: `ArmPlant` alone (our drive servo in Python every step, no randomization), same
  cadence, to show where the time goes.
- core: `SimCore` with the shipped config/randomization.yaml (all 42 terms, every gap; camera
  rendering excluded because it is off by default), `command()` every 10 ms and
  `advance(0.002)` (which returns an observation through the latency and sensor models). The
  physics-step loop, servo, gain refresh and sensor path run in C (sim/_servo.c).
- core, Python loop: the same with `native=False`, the C loop's reference (same trajectory bit
  for bit): what the C loop buys.
- physics of the drawn arm: `stepSimulation()` alone on the core's own randomized arm (its joint
  friction motors and the F/T sensor make PyBullet's step itself dearer than the raw arm's):
  the ceiling no loop around it can pass.

Rounds alternate raw / core so that load from other processes hits both alike; the table shows
the median over rounds. Writes bench/results/sim_steps.json.

    .venv/bin/python -m bench.bench_sim_steps [--rounds 7] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = np.array([0.3, 0.5, 0.8, 0.2, 0.9, 0.3])


def raw_pybullet(sim_seconds: float) -> float:
    """Return physics steps/s of plain PyBullet stepping the arm with the same I/O cadence."""
    import pybullet as pb

    from sim2real_ros.paths import default_urdf
    from sim2real_ros.robot.model import load_arm

    arm = load_arm(default_urdf())
    c = pb.connect(pb.DIRECT)
    try:
        pb.setTimeStep(1e-3, physicsClientId=c)
        pb.setGravity(0, 0, -9.81, physicsClientId=c)
        body = pb.loadURDF(str(default_urdf()), useFixedBase=True,
                           flags=pb.URDF_USE_INERTIA_FROM_FILE, physicsClientId=c)
        idx = list(range(arm.n_joints))
        forces = arm.max_effort_nm.tolist()
        steps = int(round(sim_seconds / 1e-3))
        t0 = time.perf_counter()
        for k in range(steps):
            if k % 10 == 0:
                pb.setJointMotorControlArray(body, idx, pb.POSITION_CONTROL,
                                             targetPositions=TARGET.tolist(), forces=forces,
                                             physicsClientId=c)
            pb.stepSimulation(physicsClientId=c)
            if k % 2 == 1:
                states = pb.getJointStates(body, idx, physicsClientId=c)
                np.array([s[0] for s in states])
        return steps / (time.perf_counter() - t0)
    finally:
        pb.disconnect(physicsClientId=c)


def plant_only(sim_seconds: float) -> float:
    """Return physics steps/s of the bare ArmPlant (our servo, no randomization), same cadence."""
    from sim2real_ros.sim.plant import ArmPlant

    plant = ArmPlant()
    try:
        ticks = int(round(sim_seconds / 0.002))
        t0 = time.perf_counter()
        for k in range(ticks):
            if k % 5 == 0:
                plant.set_command("position", TARGET)
            plant.advance_steps(2)
            plant.state()
        return 2 * ticks / (time.perf_counter() - t0)
    finally:
        plant.close()


def physics_only(sim_seconds: float, seed: int) -> float:
    """Return steps/s of bare stepSimulation() on the arm a SimCore drew (no loop around it)."""
    import pybullet as pb

    from sim2real_ros.paths import share_path
    from sim2real_ros.sim.core import SimCore
    from sim2real_ros.sim.randomization import RandomizationSpec

    spec = RandomizationSpec.from_yaml(share_path("config", "randomization.yaml"))
    core = SimCore(spec, seed=seed)
    try:
        core.command("position", TARGET)
        core.advance(0.05)
        c = core.plant.client
        steps = int(round(sim_seconds / 1e-3))
        t0 = time.perf_counter()
        for _ in range(steps):
            pb.stepSimulation(physicsClientId=c)
        return steps / (time.perf_counter() - t0)
    finally:
        core.close()


def sim_core(sim_seconds: float, seed: int, native: bool = True) -> tuple[float, dict[str, Any]]:
    """Return physics steps/s of SimCore with every shipped randomization term on."""
    from sim2real_ros.paths import share_path
    from sim2real_ros.sim.core import SimCore
    from sim2real_ros.sim.randomization import RandomizationSpec

    spec = RandomizationSpec.from_yaml(share_path("config", "randomization.yaml"))
    core = SimCore(spec, seed=seed, native=native)
    try:
        ticks = int(round(sim_seconds / 0.002))
        steps0 = core.stats.physics_steps
        t0 = time.perf_counter()
        for k in range(ticks):
            if k % 5 == 0:
                core.command("position", TARGET)
            core.advance(0.002)
        elapsed = time.perf_counter() - t0
        steps = core.stats.physics_steps - steps0
        info = {"terms": len(spec.terms), "spec_sha256": spec.sha256,
                "commands_lost": core.stats.commands_dropped,
                "observations_lost": core.stats.observations_dropped,
                "backend": core.plant.backend}
        return steps / elapsed, info
    finally:
        core.close()


def main(argv: list[str] | None = None) -> int:
    """Run the alternating rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=1.0, help="sim seconds per round")
    args = ap.parse_args(argv)
    raw_rates, plant_rates, core_rates, py_rates, phys_rates = [], [], [], [], []
    info: dict[str, Any] = {}
    raw_pybullet(0.2)  # warm up imports and caches on all sides
    plant_only(0.2)
    sim_core(0.2, 0)
    for r in range(args.rounds):
        raw_rates.append(raw_pybullet(args.seconds))
        plant_rates.append(plant_only(args.seconds))
        rate, info = sim_core(args.seconds, seed=r)
        core_rates.append(rate)
        py_rates.append(sim_core(args.seconds, seed=r, native=False)[0])
        phys_rates.append(physics_only(args.seconds, seed=r))
    raw_med, core_med = float(np.median(raw_rates)), float(np.median(core_rates))
    plant_med = float(np.median(plant_rates))
    py_med, phys_med = float(np.median(py_rates)), float(np.median(phys_rates))
    ratios = np.array(core_rates) / np.array(raw_rates)
    result = {
        "benchmark": "sim_steps",
        "command": "python -m bench.bench_sim_steps "
                   f"--rounds {args.rounds} --seconds {args.seconds}",
        "raw_pybullet_steps_per_s": raw_rates,
        "plant_only_steps_per_s": plant_rates,
        "sim_core_steps_per_s": core_rates,
        "sim_core_python_loop_steps_per_s": py_rates,
        "drawn_arm_physics_only_steps_per_s": phys_rates,
        "python_loop_median": py_med,
        "physics_only_median": phys_med,
        "native_over_python": core_med / py_med,
        "plant_median": plant_med,
        "raw_median": raw_med,
        "core_median": core_med,
        "ratio_of_medians": core_med / raw_med,
        "ratio_per_round_median": float(np.median(ratios)),
        "target_ratio": 0.7,
        "core": info,
        "host": {"cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                 "python": platform.python_version()},
    }
    print(f"{'variant':28s} {'steps/s (median)':>18s} {'min':>10s} {'max':>10s}")
    print(f"{'raw PyBullet':28s} {raw_med:18.0f} {min(raw_rates):10.0f} {max(raw_rates):10.0f}")
    print(f"{'ArmPlant, no randomization':28s} {plant_med:18.0f} {min(plant_rates):10.0f} "
          f"{max(plant_rates):10.0f}")
    print(f"{'SimCore, all terms':28s} {core_med:18.0f} {min(core_rates):10.0f} "
          f"{max(core_rates):10.0f}")
    print(f"{'SimCore, Python loop':28s} {py_med:18.0f} {min(py_rates):10.0f} "
          f"{max(py_rates):10.0f}")
    print(f"{'drawn arm, physics only':28s} {phys_med:18.0f} {min(phys_rates):10.0f} "
          f"{max(phys_rates):10.0f}")
    print(f"C loop / Python loop: {core_med / py_med:.2f}x; core / physics of the drawn arm: "
          f"{core_med / phys_med:.2f}")
    print(f"ratio core/raw: {core_med / raw_med:.2f} (per-round median "
          f"{np.median(ratios):.2f}; target >= 0.7); load average {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sim_steps.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

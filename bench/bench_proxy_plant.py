"""How fast the MuJoCo proxy plant runs against the PyBullet plant on the same command stream.

The proxy node must keep a 1 kHz plant in step with the wall clock next to the whole graph on
two cores; this measures its real-time factor (simulated seconds per wall second, single
process, no ROS) with the nominal unit and with the shipped unit (latency queue, backlash,
encoder model on), against the PyBullet `ArmPlant` stepping the same arm with the same 100 Hz
command stream in the same run.

    .venv/bin/python -m bench.bench_proxy_plant [--seconds 10]

Writes bench/results/proxy_plant.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def commands(seconds: float) -> np.ndarray:
    """A 100 Hz stream of joint targets: slow sines around a working pose."""
    t = np.arange(0.0, seconds, 0.01)[:, None]
    home = np.array([0.0, 0.0, 1.6, 0.0, 1.5, 0.0])
    return home + 0.3 * np.sin(2 * np.pi * 0.5 * t + np.arange(6)[None, :])


def run(step: Callable[[np.ndarray], None], cmds: np.ndarray) -> float:
    """Return the wall time to play the commands (each held for 10 ms of plant time)."""
    t0 = time.perf_counter()
    for c in cmds:
        step(c)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table."""
    from sim2real_ros.paths import share_path
    from sim2real_ros.proxy.plant import ProxyPlant
    from sim2real_ros.proxy.unit import ProxyUnit
    from sim2real_ros.sim.plant import ArmPlant

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="plant seconds per case")
    ns = parser.parse_args(argv)
    cmds = commands(ns.seconds)
    home = cmds[0]

    sim = ArmPlant()
    sim.reset(home)

    def sim_step(c: np.ndarray) -> None:
        sim.set_command("position", c)
        sim.step(10)

    nominal = ProxyPlant()
    nominal.reset(home)
    unit = ProxyPlant(ProxyUnit.from_yaml(share_path("config", "proxy", "unit_proxy-SN0001.yaml"),
                                          nominal.arm))
    unit.reset(home)

    def proxy_step(p: ProxyPlant) -> Callable[[np.ndarray], None]:
        def f(c: np.ndarray) -> None:
            p.command_position(c)
            p.advance(0.01)
            p.measure()
        return f

    rows: list[dict[str, Any]] = []
    for name, fn in (("pybullet ArmPlant (baseline)", sim_step),
                     ("mujoco ProxyPlant, nominal unit", proxy_step(nominal)),
                     ("mujoco ProxyPlant, unit proxy-SN0001", proxy_step(unit))):
        wall = run(fn, cmds)
        rows.append({"case": name, "plant_s": ns.seconds, "wall_s": wall,
                     "real_time_factor": ns.seconds / wall})
    sim.close()
    base = rows[0]["real_time_factor"]
    for r in rows:
        r["vs_pybullet"] = r["real_time_factor"] / base
    print(f"{'case':<40} {'real-time factor':>17} {'vs PyBullet':>12}")
    for r in rows:
        print(f"{r['case']:<40} {r['real_time_factor']:>16.1f}x {r['vs_pybullet']:>11.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "proxy_plant.json"
    out.write_text(json.dumps({"rows": rows, "seconds": ns.seconds}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

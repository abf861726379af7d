"""Projection cost per command, 6 and 7 joints: the C core, the Python reference, a naive clamp.

Arms: the shipped 6-DOF sim2real_arm with config/safety_envelope.yaml, and the 7-DOF KUKA iiwa
(pybullet_data/kuka_iiwa/model.urdf) with an envelope derived from its URDF. Streams, 100 Hz:

- `tracking`: a smooth stream inside every limit (a policy that behaves): the hot path, emitted
  bit for bit unchanged;
- `clipping`: a stream of random far targets (a policy that does not): rate limits, braking
  reserve and the Cartesian checks all work.

Each stream runs through `Projector.project_position` twice: on the C core (`native`,
sim2real_ros/safety/_projection.c, what the safety node runs when the extension is built) and
on the Python reference (`python`, `native=False`); an untimed replay checks that both emit the
same commands and events bit for bit. Baseline `naive_clamp`: per joint, clamp position and
velocity (what a minimal wrapper does, without acceleration, jerk, braking or Cartesian limits),
plain Python, same streams.

Per call: wall time (perf_counter_ns) and thread CPU time (thread_time_ns, which excludes the
time the OS had the thread descheduled: on a shared machine wall p99 is mostly the scheduler).
Target: p99 < 20 us for the core (the `native` rows). The 1-minute load average is recorded
before and after the run (the machine is shared; read the absolute figures against the naive
clamp of the same run).

    .venv/bin/python -m bench.bench_safety_projection [--calls 20000]

Writes bench/results/bench_safety_projection.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pybullet_data

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot import load_arm
from sim2real_ros.safety.envelope import Envelope, load_envelope, write_derived_envelope
from sim2real_ros.safety.projection import NATIVE_AVAILABLE, Projector

RESULTS = Path(__file__).resolve().parent / "results"
PERIOD_S = 0.01
TARGET_P99_US = 20.0
BACKENDS = ("native", "python") if NATIVE_AVAILABLE else ("python",)


def _streams(env: Envelope, home: np.ndarray, n: int, seed: int) -> dict[str, list[list[float]]]:
    rng = np.random.default_rng(seed)
    amp = rng.uniform(0.03, 0.08, home.size) * rng.choice([-1.0, 1.0], home.size)
    t = np.arange(n) * PERIOD_S
    tracking = [list(home + amp * (1.0 - np.cos(2 * np.pi * 0.5 * tt))) for tt in t]
    lo = np.array([j.lower_rad for j in env.joints])
    hi = np.array([j.upper_rad for j in env.joints])
    clipping, target = [], home.copy()
    for _ in range(n):
        if rng.random() < 0.02:
            target = np.clip(home + rng.uniform(-1.5, 1.5, home.size), lo - 0.5, hi + 0.5)
        clipping.append(list(target))
    return {"tracking": tracking, "clipping": clipping}


class NaiveClamp:
    """Clamp position and velocity per joint: the baseline a minimal wrapper would be."""

    def __init__(self, env: Envelope, home: np.ndarray) -> None:
        self.lo = [j.lower_rad for j in env.joints]
        self.hi = [j.upper_rad for j in env.joints]
        self.step = [j.velocity_rad_s * PERIOD_S for j in env.joints]
        self.x = list(home)

    def __call__(self, values: list[float]) -> list[float]:
        out = []
        for i, r in enumerate(values):
            r = min(max(r, self.lo[i]), self.hi[i])
            x = self.x[i]
            s = self.step[i]
            r = min(max(r, x - s), x + s)
            out.append(r)
        self.x = out
        return out


def _time(fn: Callable[[list[float]], Any], stream: list[list[float]]) -> dict[str, float]:
    wall = np.empty(len(stream))
    cpu = np.empty(len(stream))
    pc, tt = time.perf_counter_ns, time.thread_time_ns
    for k, cmd in enumerate(stream):
        c0, w0 = tt(), pc()
        fn(cmd)
        w1, c1 = pc(), tt()
        wall[k] = w1 - w0
        cpu[k] = c1 - c0
    wall /= 1e3
    cpu /= 1e3
    return {"wall_p50_us": float(np.percentile(wall, 50)),
            "wall_p99_us": float(np.percentile(wall, 99)),
            "cpu_p50_us": float(np.percentile(cpu, 50)),
            "cpu_p99_us": float(np.percentile(cpu, 99)),
            "mean_us": float(wall.mean())}


def run(calls: int) -> dict[str, Any]:
    """Benchmark both arms; return the results."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_safety_"))
    iiwa_urdf = Path(pybullet_data.getDataPath()) / "kuka_iiwa" / "model.urdf"
    iiwa = load_arm(iiwa_urdf)
    arms = {
        "sim2real_arm (6 joints)": (load_arm(default_urdf()),
                                    share_path("config", "safety_envelope.yaml"),
                                    np.array([0.0, 0.0, 1.6, 0.0, 1.5, 0.0])),
        "kuka_iiwa (7 joints)": (iiwa, write_derived_envelope(iiwa, tmp / "iiwa.yaml"),
                                 np.array([0.0, 0.6, 0.0, -1.2, 0.0, 0.8, 0.0])),
    }
    out: dict[str, Any] = {}
    for label, (arm, env_path, home) in arms.items():
        env = load_envelope(env_path, arm)
        streams = _streams(env, home, calls, seed=1)
        rows: dict[str, Any] = {}
        for name, stream in streams.items():
            for backend in BACKENDS:
                proj = Projector(env, arm, PERIOD_S, native=backend == "native")
                assert proj.backend == backend
                proj.reset(list(home))
                for warm in stream[:200]:
                    proj.project_position(None, warm, PERIOD_S)
                proj.reset(list(home))
                interventions = [0]

                def project(cmd: list[float], p: Projector = proj, n: list[int] = interventions
                            ) -> None:
                    n[0] += p.project_position(None, cmd, PERIOD_S).intervened

                rows[f"{backend}/{name}"] = _time(project, stream)
                rows[f"{backend}/{name}"]["intervened_fraction"] = interventions[0] / len(stream)
            rows[f"naive_clamp/{name}"] = _time(NaiveClamp(env, home), stream)
            if "native" in BACKENDS:
                rows[f"native/{name}"]["identical_to_python"] = _identical(env, arm, home, stream)
        out[label] = rows
    return out


def _identical(env: Envelope, arm: Any, home: np.ndarray, stream: list[list[float]]) -> bool:
    """Whether the C core and the Python reference emit the same results on the stream."""
    ref = Projector(env, arm, PERIOD_S, native=False)
    fast = Projector(env, arm, PERIOD_S, native=True)
    ref.reset(list(home))
    fast.reset(list(home))
    return all(ref.project_position(None, cmd, PERIOD_S)
               == fast.project_position(None, cmd, PERIOD_S) for cmd in stream)


def main() -> None:
    """Run, print the table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    res = run(args.calls)
    load_after = os.getloadavg()[0]
    print(f"projection cost per command ({args.calls} calls per row, 1-min load {load:.1f} "
          f"before, {load_after:.1f} after, on {os.cpu_count()} CPUs)")
    if not NATIVE_AVAILABLE:
        print("C core not built (sim2real_ros.safety._projection): Python reference only")
    print(f"{'arm':26s} {'stream':22s} {'wall p50':>9s} {'wall p99':>9s} {'cpu p50':>8s} "
          f"{'cpu p99':>8s} {'x naive':>8s} {'clipped':>8s}")
    for arm, rows in res.items():
        for name in ("tracking", "clipping"):
            naive = rows[f"naive_clamp/{name}"]
            for backend in BACKENDS:
                r = rows[f"{backend}/{name}"]
                ratio = r["cpu_p50_us"] / max(naive["cpu_p50_us"], 1e-9)
                print(f"{arm:26s} {backend + '/' + name:22s} {r['wall_p50_us']:9.1f} "
                      f"{r['wall_p99_us']:9.1f} {r['cpu_p50_us']:8.1f} {r['cpu_p99_us']:8.1f} "
                      f"{ratio:8.1f} {r['intervened_fraction']:8.2f}")
            print(f"{'':26s} {'naive_clamp/' + name:22s} {naive['wall_p50_us']:9.1f} "
                  f"{naive['wall_p99_us']:9.1f} {naive['cpu_p50_us']:8.1f} "
                  f"{naive['cpu_p99_us']:8.1f}")
            if "native" in BACKENDS:
                fast, ref = rows[f"native/{name}"], rows[f"python/{name}"]
                print(f"{'':26s} {'python / native':22s} "
                      f"{ref['wall_p50_us'] / fast['wall_p50_us']:8.1f}x "
                      f"{ref['wall_p99_us'] / fast['wall_p99_us']:8.1f}x "
                      f"{ref['cpu_p50_us'] / fast['cpu_p50_us']:7.1f}x "
                      f"{ref['cpu_p99_us'] / fast['cpu_p99_us']:7.1f}x   identical: "
                      f"{fast['identical_to_python']}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "bench_safety_projection.json"
    path.write_text(json.dumps({"calls": args.calls, "period_s": PERIOD_S,
                                "target_p99_us": TARGET_P99_US, "load_1min": load,
                                "load_1min_after": load_after,
                                "cpus": os.cpu_count(), "python": platform.python_version(),
                                "backends": list(BACKENDS),
                                "results": res}, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

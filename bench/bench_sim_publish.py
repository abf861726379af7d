"""Publish-period accuracy of the sim bridge at 500 Hz in real-time mode.

Starts `sim_bridge` as its own process (real time, 500 Hz joint_states, the shipped
randomization spec, 1 kHz physics) and subscribes to joint_states from this process for a
window. Reports, for the 2 ms period:

- stamp period error: |Δ header.stamp − 2 ms| (the bridge's own timing: when it published);
- arrival period error: |Δ arrival − 2 ms| at the subscriber (adds DDS delivery and this
  process's scheduling);
- achieved rate and messages missing (gaps longer than 1.5 periods).

Target: stamp p99 < 1 ms. Writes bench/results/sim_publish.json.

    .venv/bin/python -m bench.bench_sim_publish [--seconds 10] [--rate 500]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Loopback only and a run-unique domain, before rclpy is imported (as in test/conftest.py).
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
if not os.environ.get("ROS_DOMAIN_ID", "").isdigit():
    os.environ["ROS_DOMAIN_ID"] = str(random.SystemRandom().randint(1, 100))

import numpy as np  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def percentiles(x: np.ndarray) -> dict[str, float]:
    """p50/p99/max in milliseconds."""
    return {"p50_ms": float(np.percentile(x, 50) * 1e3),
            "p99_ms": float(np.percentile(x, 99) * 1e3),
            "max_ms": float(np.max(x) * 1e3)}


def main(argv: list[str] | None = None) -> int:
    """Run the bridge, record joint_states, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement window (s)")
    ap.add_argument("--warmup", type=float, default=3.0, help="settling time (s)")
    ap.add_argument("--rate", type=float, default=500.0, help="publish_rate_hz")
    args = ap.parse_args(argv)

    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from sensor_msgs.msg import JointState

    from sim2real_ros.ros.convert import stamp_to_s
    from sim2real_ros.ros.env import child_env
    from sim2real_ros.ros.qos import STATE_QOS

    cmd = [sys.executable, "-m", "sim2real_ros.sim.node", "--ros-args",
           "-p", "clock_mode:=realtime", "-p", f"publish_rate_hz:={args.rate}"]
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed with the run
        prefix="sim_publish_bridge_", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=child_env(), cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    ctx = Context()
    rclpy.init(context=ctx)
    stamps: list[float] = []
    arrivals: list[float] = []
    recording = [False]

    def on_js(msg: JointState) -> None:
        if recording[0]:
            arrivals.append(time.monotonic())
            stamps.append(stamp_to_s(msg.header.stamp))

    node = Node("sim_publish_bench", context=ctx)
    node.create_subscription(JointState, "joint_states", on_js, STATE_QOS)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    try:
        deadline = time.monotonic() + args.warmup
        while time.monotonic() < deadline:
            ex.spin_once(timeout_sec=0.01)
        recording[0] = True
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            ex.spin_once(timeout_sec=0.01)
        recording[0] = False
    finally:
        ex.remove_node(node)
        node.destroy_node()
        rclpy.shutdown(context=ctx)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    if len(stamps) < 10:
        print(f"only {len(stamps)} messages received; is the bridge running? "
              f"(exit code {proc.poll()}, log {log.name})", file=sys.stderr)
        return 1
    period = 1.0 / args.rate
    d_stamp = np.diff(np.array(stamps))
    d_arrival = np.diff(np.array(arrivals))
    stamp_err = np.abs(d_stamp - period)
    arrival_err = np.abs(d_arrival - period)
    missing = int(np.sum(np.maximum(np.round(d_stamp / period) - 1, 0)))
    result = {
        "benchmark": "sim_publish",
        "command": f"python -m bench.bench_sim_publish --seconds {args.seconds} "
                   f"--rate {args.rate}",
        "publish_rate_hz": args.rate,
        "messages": len(stamps),
        "achieved_rate_hz": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
        "missing_messages": missing,
        "stamp_period_error": percentiles(stamp_err),
        "arrival_period_error": percentiles(arrival_err),
        "target_stamp_p99_ms": 1.0,
        "host": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
    }
    print(f"{'period error (target p99 < 1 ms)':36s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s}")
    for label, key in (("stamps (bridge timing)", "stamp_period_error"),
                       ("arrivals (incl. DDS + subscriber)", "arrival_period_error")):
        r = result[key]
        print(f"{label:36s} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['max_ms']:8.3f}")
    print(f"rate {result['achieved_rate_hz']:.1f} Hz of {args.rate:g}, {missing} missing of "
          f"{len(stamps) + missing}; load average {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sim_publish.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

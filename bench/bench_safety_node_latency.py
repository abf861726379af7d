"""Latency the safety_filter node adds, against a plain relay node in the same run.

Three processes on loopback DDS: the benchmark (publishes `policy/joint_command` at 100 Hz, a
slow ramp whose every value is unique and inside the envelope, so the filter passes it bit for
bit; also `joint_states`), the real `safety_filter` (stage full, no confidence required) and a
relay (this module with --relay: JointState in, Float64MultiArray out, nothing else). Each output
is matched to its input by value; latency = arrival at the benchmark - publish time, on one
clock. The difference of the two is what the filter adds (parsing, watchdog, projection,
Cartesian check, publishing); transport is in both.

    .venv/bin/python -m bench.bench_safety_node_latency [--messages 1500]

Writes bench/results/bench_safety_node_latency.json.
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
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HOME = [0.0, 0.0, 1.6, 0.0, 1.5, 0.0]
RATE_HZ = 100.0
STEP_RAD = 1e-5  # per message: 1 mrad/s, far inside every limit


def relay() -> int:
    """Run the relay node: policy/joint_command -> relay/commands, nothing else."""
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from rclpy.node import Node
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from sim2real_ros.ros.qos import COMMAND_QOS

    with rclpy.init():
        node = Node("relay")
        pub = node.create_publisher(Float64MultiArray, "relay/commands", COMMAND_QOS)

        def forward(msg: JointState) -> None:
            out = Float64MultiArray()
            out.data = list(msg.position)
            pub.publish(out)

        node.create_subscription(JointState, "policy/joint_command", forward, COMMAND_QOS)
        try:
            rclpy.spin(node)
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
    return 0


def measure(messages: int) -> dict[str, Any]:
    """Start the filter and the relay, stream commands, return latency statistics."""
    import numpy as np
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from sim2real_ros.ros.diagnostics import status_values
    from sim2real_ros.robot.model import load_arm
    from sim2real_ros.paths import default_urdf
    from sim2real_ros.ros.env import child_env
    from sim2real_ros.ros.qos import COMMAND_QOS, STATE_QOS

    joints = load_arm(default_urdf()).joint_names
    logs = Path(tempfile.mkdtemp(prefix="bench_safety_latency_"))
    env = child_env()
    procs = []
    for name, cmd in (
        ("safety_filter", [sys.executable, "-m", "sim2real_ros.safety.node", "--ros-args",
                           "-p", "rollout_stage:=full", "-p", "require_confidence:=false",
                           "-p", "calm_period_s:=0.0", "-p", "command_timeout_s:=0.5",
                           "-p", "max_command_age_s:=0.5", "-p", "state_timeout_s:=0.5",
                           "-p", "max_state_age_s:=1.0", "-p", "event_throttle_s:=1.0"]),
            ("relay", [sys.executable, "-m", "bench.bench_safety_node_latency", "--relay"])):
        log = open(logs / f"{name}.log", "wb")  # noqa: SIM115
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    sent: dict[float, int] = {}
    got: dict[str, dict[float, int]] = {"safety_filter": {}, "relay": {}}
    rclpy.init()
    node = Node("latency_probe")
    clock = time.monotonic_ns
    js_pub = node.create_publisher(JointState, "joint_states", STATE_QOS)
    cmd_pub = node.create_publisher(JointState, "policy/joint_command", COMMAND_QOS)

    def receiver(label: str) -> Any:
        def on(msg: Float64MultiArray) -> None:
            t = clock()
            if msg.data:
                got[label].setdefault(msg.data[0], t)
        return on

    node.create_subscription(Float64MultiArray, "forward_position_controller/commands",
                             receiver("safety_filter"), COMMAND_QOS)
    node.create_subscription(Float64MultiArray, "relay/commands", receiver("relay"),
                             COMMAND_QOS)
    diag: dict[str, str] = {}

    def on_diag(msg: DiagnosticArray) -> None:
        for st in msg.status:
            if st.name.startswith("safety_filter"):
                diag.update(status_values(st))

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, STATE_QOS)
    state = {"k": 0, "stamp": None}

    def tick() -> None:
        stamp = node.get_clock().now().to_msg()
        js = JointState()
        js.header.stamp = stamp
        js.name = joints
        js.position = list(HOME)
        js_pub.publish(js)
        if state["stamp"] is None:
            state["stamp"] = stamp
            return
        k = state["k"]
        if k >= messages:
            return
        cmd = JointState()
        cmd.header.stamp = state["stamp"]
        cmd.name = joints
        pos = list(HOME)
        pos[0] = HOME[0] + STEP_RAD * k
        cmd.position = pos
        sent[pos[0]] = clock()
        cmd_pub.publish(cmd)
        state["k"] = k + 1
        state["stamp"] = stamp

    ex = SingleThreadedExecutor()
    ex.add_node(node)
    try:
        # Wait until both outputs are flowing before the measured stream starts.
        end = time.monotonic() + 60.0
        ready = False
        while time.monotonic() < end and not ready:
            ex.spin_once(timeout_sec=0.05)
            ready = (node.count_subscribers("policy/joint_command") >= 2
                     and node.count_publishers("forward_position_controller/commands") >= 1
                     and node.count_publishers("relay/commands") >= 1)
        time.sleep(1.0)
        node.create_timer(1.0 / RATE_HZ, tick)
        end = time.monotonic() + messages / RATE_HZ + 5.0
        while time.monotonic() < end:
            ex.spin_once(timeout_sec=0.01)
    finally:
        node.destroy_node()
        rclpy.shutdown()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    warm = 100  # the filter needs a few commands to hand authority to the policy
    out: dict[str, Any] = {"messages": messages, "logs": str(logs)}
    for label, arrivals in got.items():
        lat = [(arrivals[v] - t) / 1e3 for v, t in sent.items()
               if v in arrivals and v >= HOME[0] + STEP_RAD * warm]
        a = np.array(lat)
        out[label] = {
            "matched": len(lat),
            "p50_us": float(np.percentile(a, 50)) if lat else None,
            "p99_us": float(np.percentile(a, 99)) if lat else None,
            "mean_us": float(a.mean()) if lat else None,
        }
    # The filter's own measure of one control tick (its wall time inside the process).
    out["filter_tick_p50_us"] = float(diag.get("tick_p50_us", "nan"))
    out["filter_tick_p99_us"] = float(diag.get("tick_p99_us", "nan"))
    f, r = out["safety_filter"], out["relay"]
    if f["p50_us"] is not None and r["p50_us"] is not None:
        out["added_p50_us"] = f["p50_us"] - r["p50_us"]
        out["added_p99_us"] = f["p99_us"] - r["p99_us"]
    return out


def main() -> int:
    """Run the benchmark (or the relay), print the table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1500)
    ap.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.relay:
        return relay()
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    if not os.environ.get("ROS_DOMAIN_ID", "").isdigit():
        os.environ["ROS_DOMAIN_ID"] = str(random.SystemRandom().randint(1, 100))
    load = os.getloadavg()[0]
    res = measure(args.messages)
    res["load_1min"] = load
    res["cpus"] = os.cpu_count()
    print(f"latency policy/joint_command -> arm command, {args.messages} messages at "
          f"{RATE_HZ:.0f} Hz (1-min load {load:.1f} on {os.cpu_count()} CPUs)")
    print(f"{'path':16s} {'matched':>8s} {'p50 us':>9s} {'p99 us':>9s} {'mean us':>9s}")
    for label in ("relay", "safety_filter"):
        r = res[label]
        fmt = (lambda v: f"{v:9.0f}" if v is not None else f"{'n/a':>9s}")
        print(f"{label:16s} {r['matched']:8d} {fmt(r['p50_us'])} {fmt(r['p99_us'])} "
              f"{fmt(r['mean_us'])}")
    if "added_p50_us" in res:
        print(f"added by safety_filter: p50 {res['added_p50_us']:.0f} us, "
              f"p99 {res['added_p99_us']:.0f} us")
    print(f"one control tick inside safety_filter (its diagnostics): p50 "
          f"{res['filter_tick_p50_us']:.0f} us, p99 {res['filter_tick_p99_us']:.0f} us")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "bench_safety_node_latency.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end latency of the sim graph, observation to arm command, at two policy rates.

For each policy rate (100 Hz and 250 Hz; the safety filter and the baseline run at the same
rate) the benchmark starts the whole sim graph as processes (`sim2real run`'s runner, the sim
bridge in real time) with the policy driving the arm (rollout stage `full`, so the path measured
is joint_states -> policy_node -> safety_filter -> forward_position_controller/commands), lets
it settle, then listens for a fixed window and reports:

- obs -> arm command latency p50/p99: arrival of forward_position_controller/commands minus the
  stamp of the joint_states the decision behind it answered (the audit room's pairing);
- obs -> policy command latency p50/p99 (policy/joint_command arrival minus its stamp);
- the baseline measured in the same run: the age of joint_states when they arrive (arrival
  minus stamp: the sim bridge's simulated sensor latency plus one DDS hop), and what the graph
  adds on top (e2e p50 minus that age p50, i.e. policy + safety filter + two more hops);
- achieved loop rate (arm commands per second) against the configured rate;
- CPU per node (% of one core, from /proc/<pid>/stat over the window).

    .venv/bin/python -m bench.bench_graph_latency [--window 15] [--rates 100 250]

Writes bench/results/graph_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
# Which parameter sets each node's control rate (Hz).
RATE_PARAMS = {
    "policy_node": "rate_hz",
    "safety_filter": "control_rate_hz",
    "baseline_controller": "rate_hz",
}


def cpu_seconds(pid: int) -> float | None:
    """Return user+system CPU seconds of a process from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is fields[0]; utime and stime are stat fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(rate_hz: float, window_s: float, settle_s: float) -> dict[str, Any]:
    """Run the graph at one policy rate and return its figures."""
    import numpy as np
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    from sim2real_ros.adapters.probe_node import GraphProbe, spin_for
    from sim2real_ros.graph import GraphArgs, build_graph
    from sim2real_ros.runner import GraphRunner, RunnerConfig

    graph = build_graph(GraphArgs(backend="sim", rollout_stage="full"))
    graph = graph.without(graph.missing())
    for node, param in RATE_PARAMS.items():
        if node in graph.names():
            graph = graph.with_parameters(node, **{param: float(rate_hz)})
    log = open(os.devnull, "w")  # noqa: SIM115 - node chatter is not part of the figures
    import tempfile

    registry = tempfile.mkdtemp(prefix="bench-registry-")
    runner = GraphRunner(graph, out=log, config=RunnerConfig(
        grace_s=10.0, extra_env={"SIM2REAL_POLICY_REGISTRY": registry}))
    ctx = Context()
    rclpy.init(context=ctx)
    probe = GraphProbe("bench_probe", context=ctx, fk_every=1_000_000)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(probe)
    try:
        runner.start()
        deadline = time.monotonic() + 60.0
        while not probe.core.command_arrivals_s and time.monotonic() < deadline:
            ex.spin_once(timeout_sec=0.05)
            if runner.poll() is not None:
                raise RuntimeError(f"node {runner.failed_node} died during start-up")
        if not probe.core.command_arrivals_s:
            raise RuntimeError("no arm command within 60 s")
        spin_for(ex, settle_s)
        # Only the window counts: reset what the probe heard while settling.
        from sim2real_ros.adapters.probe import ProbeCore

        probe.core = ProbeCore()
        cpu0 = {n: cpu_seconds(runner.pid(n)) for n in graph.names()}
        w0 = time.monotonic()
        spin_for(ex, window_s)
        elapsed = time.monotonic() - w0
        cpu1 = {n: cpu_seconds(runner.pid(n)) for n in graph.names()}
        if runner.poll() is not None:
            raise RuntimeError(f"node {runner.failed_node} died during the window")
    finally:
        runner.stop()
        ex.shutdown()
        probe.destroy_node()
        rclpy.shutdown(context=ctx)
        log.close()
    s = probe.core.summary()
    hop_ms = np.asarray(probe.core.pairer.state_transport_s) * 1e3
    hop_p50 = float(np.percentile(hop_ms, 50)) if hop_ms.size else None
    e2e = s["obs_to_command_latency_ms"]
    cpu = {n: (round(100.0 * (cpu1[n] - cpu0[n]) / elapsed, 1)
               if cpu0[n] is not None and cpu1[n] is not None else None) for n in cpu0}
    return {
        "policy_rate_hz": rate_hz,
        "window_s": round(elapsed, 2),
        "nodes": graph.names(),
        "achieved_loop_rate_hz": s["control_rate_hz"],
        "policy_command_rate_hz": (s["source_commands"]["policy"] / elapsed),
        "obs_to_command_ms": e2e,
        "obs_to_policy_command_ms": s["obs_to_policy_command_latency_ms"],
        "baseline_state_age_at_arrival_ms_p50": hop_p50,
        "graph_added_ms_p50": (e2e["p50"] - hop_p50 if e2e["p50"] and hop_p50 else None),
        "obs_to_command_p50_over_state_age": (e2e["p50"] / hop_p50
                                              if e2e["p50"] and hop_p50 else None),
        "load_average_1min_after": os.getloadavg()[0],
        "command_period_ms_p99": s["command_period_ms_p99"],
        "cpu_percent_of_one_core": cpu,
    }


def _f(v: Any, d: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{d}f}"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 250.0])
    parser.add_argument("--window", type=float, default=15.0, help="seconds measured per rate")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before measuring")
    ns = parser.parse_args(argv)
    from sim2real_ros.demo import ensure_dds_env

    ensure_dds_env()
    rows = [measure(r, ns.window, ns.settle) for r in ns.rates]
    print(f"{'policy Hz':>9} {'loop Hz':>8} {'e2e p50':>8} {'e2e p99':>8} {'pol p50':>8} "
          f"{'pol p99':>8} {'age':>6} {'added':>6} {'load':>5}   CPU % per node")
    for r in rows:
        e, p = r["obs_to_command_ms"], r["obs_to_policy_command_ms"]
        cpu = ", ".join(f"{n} {v}" for n, v in r["cpu_percent_of_one_core"].items())
        print(f"{r['policy_rate_hz']:>9.0f} {_f(r['achieved_loop_rate_hz'], 1):>8} "
              f"{_f(e['p50']):>8} {_f(e['p99']):>8} {_f(p['p50']):>8} {_f(p['p99']):>8} "
              f"{_f(r['baseline_state_age_at_arrival_ms_p50'], 2):>6} "
              f"{_f(r['graph_added_ms_p50'], 2):>6} {r['load_average_1min_after']:>5.1f}   {cpu}")
    print("latencies in ms; e2e = joint_states stamp -> arrival of "
          "forward_position_controller/commands; pol = joint_states stamp -> policy command; "
          "age = joint_states stamp -> arrival (p50); added = e2e p50 - age; load = 1-min "
          "load average of the host")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "graph_latency.json"
    out.write_text(json.dumps({"command": "python -m bench.bench_graph_latency "
                               + " ".join(argv if argv is not None else sys.argv[1:]),
                               "cpus": os.cpu_count(), "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

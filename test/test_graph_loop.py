"""The whole graph across processes, started by the commands a user runs.

Sim backend: `sim2real demo` (the full sim graph, the sim bridge in real time, scripted faults)
closes the loop and the arm reaches the task's targets. Real backend: `sim2real run --backend
real` against `proxy_arm` (MuJoCo), a driver that speaks only the ros2_control topics, with no
code change; it ends with Ctrl-C (SIGINT to the runner), which must stop every node cleanly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, spin_until
from rclpy.executors import SingleThreadedExecutor

from sim2real_ros.adapters.probe_node import GraphProbe
from sim2real_ros.graph import GraphArgs, build_graph
from sim2real_ros.paths import share_path
from sim2real_ros.ros.env import child_env

REACH_TOLERANCE_M = 0.03
CALIBRATION_OF_ANOTHER_UNIT = """\
unit: {serial: arm-SN0000}
created_utc: '2026-01-01T00:00:00+00:00'
runs: [run1]
n_runs: 1
nominal: {}
latency: {}
noise: {}
randomization: {}
"""


def _start_run(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "run.log"
    # A fresh policy registry (initialised from the shipped default) per test.
    env = child_env({"SIM2REAL_POLICY_REGISTRY": str(tmp_path / "policies")})
    proc = subprocess.Popen([sys.executable, "-m", "sim2real_ros.cli", "run", *args],
                            env=env, cwd=REPO, stdout=open(log, "wb"),  # noqa: SIM115
                            stderr=subprocess.STDOUT)
    return proc, log


def _ctrl_c(proc: subprocess.Popen[bytes], log: Path) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return log.read_text(errors="replace")


def _watch(ros_context: object, proc: subprocess.Popen[bytes], log: Path, targets: int,
           timeout_s: float, topics: dict[str, str] | None = None) -> GraphProbe:
    probe = GraphProbe("test_probe", context=ros_context, topics=topics,
                       reach_tolerance_m=REACH_TOLERANCE_M)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(probe)

    def done() -> bool:
        assert proc.poll() is None, "sim2real run exited early:\n" + log.read_text()
        reached = sum(1 for v in probe.core.targets if v.reached_at_s is not None)
        return reached >= targets and probe.core.source_arrivals["policy"] > 50

    try:
        ok = spin_until(ex, done, timeout_s, step_s=0.05)
    finally:
        ex.shutdown()
    assert ok, (f"summary {probe.core.summary()}\n"
                f"closest approach per target {[v.min_distance_m for v in probe.core.targets]}\n"
                + log.read_text(errors="replace")[-6000:])
    return probe


def _assert_clean(text: str, proc: subprocess.Popen[bytes], nodes: list[str]) -> None:
    assert "died" not in text, text[-6000:]
    assert proc.returncode == 0, text[-6000:]
    assert "stopping (SIGINT)" in text and "all nodes stopped; exit 0" in text, text[-4000:]
    for name in nodes:
        assert f"[runner] started {name} (pid " in text
    # Node output reaches the console prefixed with the node's name (the policy logs its
    # version at start-up; other nodes may be silent).
    assert "[policy_node] [INFO]" in text and "active policy version" in text


@pytest.mark.graph
@pytest.mark.slow
def test_demo_sim_graph_closes_the_loop_reaches_targets_and_survives_its_faults(
    tmp_path: Path,
) -> None:
    # `sim2real demo` is the full sim graph (sim bridge in real time, safety filter, baseline,
    # policy in shadow, task sequencer, shadow comparator) plus the demo's fault injector.
    env = child_env()
    env.pop("SIM2REAL_POLICY_REGISTRY", None)  # the demo makes its own in the run folder
    done = subprocess.run(
        [sys.executable, "-m", "sim2real_ros.cli", "demo", "--duration", "24",
         "--runs-dir", str(tmp_path)], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=180)
    out = done.stdout + done.stderr
    (run_dir,) = list(tmp_path.glob("demo-*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["nodes_missing"] == [], out
    assert {"sim_bridge", "safety_filter", "baseline_controller", "policy_node",
            "task_sequencer", "shadow_comparator"} <= set(summary["nodes"])
    assert summary["checks"]["loop_closed"] and summary["checks"]["graph_stayed_up"], out
    assert summary["targets_reached"] >= 2, out
    assert summary["obs_to_command_latency_ms"]["n"] > 100
    spike, kill = summary["faults"]
    assert spike["kind"] == "uncertainty_spike" and spike["detail"]["applied"], out
    assert kill["kind"] == "policy_killed"
    events = [(e["node"], e["kind"]) for e in summary["runner_events"]]
    assert ("policy_node", "killed") in events and ("policy_node", "restarted") in events
    # Every other node ran from start to the end of the demo.
    for name in summary["nodes"]:
        if name != "policy_node":
            assert (name, "exited") not in events, out
    assert summary["checks"]["clean_shutdown"], out
    for name in ("overview.png", "latency.png", "graph.json", "graph.log"):
        assert (run_dir / name).stat().st_size > 0
    assert "sim2real demo summary" in done.stdout and "obs -> arm command latency" in done.stdout
    # The policy's observation glitch reached it: the policy's OOD score rose during the spike
    # whenever the policy answered then (a starved host can leave it stale throughout).
    if spike["detail"]["ood_during_max"] is not None and spike["detail"]["ood_before_max"]:
        assert spike["detail"]["ood_during_max"] > 3 * spike["detail"]["ood_before_max"]


@pytest.mark.graph
@pytest.mark.slow
def test_real_backend_runs_against_a_ros2_control_driver_with_no_code_change(
    tmp_path: Path, ros_context: object, node_processes: object
) -> None:
    calibration = tmp_path / "arm-SN0000.yaml"
    calibration.write_text(CALIBRATION_OF_ANOTHER_UNIT)
    graph = build_graph(GraphArgs(backend="real", calibration=str(calibration)))
    assert "sim_bridge" not in graph.names() and "unit_check" in graph.names()
    driver = node_processes.start(  # type: ignore[attr-defined]
        "sim2real_ros.proxy.node", name="proxy_arm",
        ros_args=["--params-file", str(share_path("config", "nodes", "proxy_arm.yaml"))])
    # A calibration made on another unit: unit_check must say so loudly (the proxy reports
    # unit_id 'nominal' on /diagnostics, as a driver reports the serial of its arm).
    proc, log = _start_run(["--backend", "real", "--calibration", str(calibration)], tmp_path)
    try:
        _watch(ros_context, proc, log, targets=1, timeout_s=75.0, topics=graph.backend.topics)
        assert driver.poll() is None, node_processes.log(driver)  # type: ignore[attr-defined]
    finally:
        text = _ctrl_c(proc, log)
    _assert_clean(text, proc, graph.names())
    assert "[unit_check] UNIT MISMATCH: calibration" in text
    assert "'arm-SN0000' but the live arm reports 'nominal'" in text

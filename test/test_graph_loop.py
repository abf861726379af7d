"""The whole graph across processes, started by `sim2real run` exactly as a user would.

Sim backend: the sim bridge in real time closes the loop and the arm reaches the task's targets.
Real backend: the same command with `--backend real` against `proxy_arm` (MuJoCo), a driver
that speaks only the ros2_control topics, with no code change. Both end with Ctrl-C (SIGINT to
the runner), which must stop every node cleanly with exit code 0.
"""

from __future__ import annotations

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
def test_sim_graph_closes_the_loop_and_the_arm_reaches_its_targets(
    tmp_path: Path, ros_context: object
) -> None:
    graph = build_graph(GraphArgs(backend="sim"))
    proc, log = _start_run(["--backend", "sim"], tmp_path)
    try:
        probe = _watch(ros_context, proc, log, targets=2, timeout_s=75.0)
        s = probe.core.summary()
        assert s["control_rate_hz"] is not None and s["control_rate_hz"] > 50.0
        assert s["obs_to_command_latency_ms"]["n"] > 100
        assert probe.latched.get("safety_status", {}).get("rollout_stage") == "shadow"
    finally:
        text = _ctrl_c(proc, log)
    _assert_clean(text, proc, graph.names())


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

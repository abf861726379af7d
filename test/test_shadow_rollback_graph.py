"""End to end across processes: promotion through the gate, drift, automatic rollback, stage drop.

Real processes: safety_filter, policy_node and shadow_comparator. The test process plays the
arm (joint_states follow the safety filter's position commands), the task target and a
hold-position baseline (the baseline controller is the safety room's and tested there; a hold
keeps this test's CPU within a loaded 2-core machine). The policy starts at version 2 of a
private registry whose known-good version is 1.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from geometry_msgs.msg import PointStamped
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String

from sim2real_ros.cli import main as sim2real
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import arrays_to_joint_state
from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS
from sim2real_ros.shadow.rollout import RolloutLog

ARM = load_arm(default_urdf())
JOINTS = list(ARM.joint_names)
HOME = np.array([0.0, 0.0, 1.6, 0.0, 1.5, 0.0])
# The task target is where the tool already is: the policy rests (cmd = q) and the hold
# baseline agrees with it, so nothing but the injected drift can push the policy out of its
# training distribution. (A held arm away from the target winds the policy's integrator up,
# cmd - q, which alone reads as out of distribution.)
TARGET_M = ARM.tool_position(HOME)
# A velocity-sensor drift of 1 rad/s on every joint: the policy was trained with wrist_3 almost
# still (velocity std 0.047 rad/s), so its OOD score jumps far above the filter's 3.0.
DRIFT_RAD_S = 1.0


class Cell:
    """The arm (perfect position tracking of the filter's commands) and the task target."""

    def __init__(self, ctx: Any) -> None:
        self.node = Node("e2e_cell", context=ctx)
        self.q = HOME.copy()
        self.qd = np.zeros(6)
        self.drift_rad_s = 0.0
        self.status: dict[str, Any] = {}
        self.version: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []
        self.transitions: list[dict[str, Any]] = []
        self.recommendation: dict[str, Any] = {}
        self.commands = 0
        self.lock = threading.Lock()
        self.js_pub = self.node.create_publisher(JointState, "joint_states", STATE_QOS)
        self.base_pub = self.node.create_publisher(JointState, "baseline/joint_command",
                                                   COMMAND_QOS)
        self.target_pub = self.node.create_publisher(PointStamped, "task/target", STATE_QOS)
        n = self.node

        def keep(attr: str) -> Any:
            return lambda m: setattr(self, attr, json.loads(m.data))

        n.create_subscription(Float64MultiArray, "forward_position_controller/commands",
                              self._on_command, COMMAND_QOS)
        n.create_subscription(String, "safety_filter/status", keep("status"), LATCHED_QOS)
        n.create_subscription(String, "policy_node/active_version", keep("version"),
                              LATCHED_QOS)
        n.create_subscription(String, "shadow_comparator/recommendation",
                              keep("recommendation"), LATCHED_QOS)
        self.report: dict[str, Any] = {}
        n.create_subscription(String, "shadow_comparator/report", keep("report"), STATE_QOS)
        n.create_subscription(String, "safety_filter/events",
                              lambda m: self.events.append(json.loads(m.data)), EVENT_QOS)
        n.create_subscription(String, "shadow_comparator/transitions",
                              lambda m: self.transitions.append(json.loads(m.data)), LATCHED_QOS)
        n.create_timer(0.01, self._tick)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(n)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on_command(self, msg: Float64MultiArray) -> None:
        cmd = np.asarray(msg.data, dtype=float)
        if cmd.shape == (6,) and np.all(np.isfinite(cmd)):
            with self.lock:
                self.qd = (cmd - self.q) / 0.01
                self.q = cmd
                self.commands += 1

    def _tick(self) -> None:
        stamp = self.node.get_clock().now().to_msg()
        with self.lock:
            q, qd = self.q.copy(), self.qd + self.drift_rad_s
        self.js_pub.publish(arrays_to_joint_state(JOINTS, stamp, q, qd, np.zeros(6)))
        self.base_pub.publish(arrays_to_joint_state(JOINTS, stamp, q))
        t = PointStamped()
        t.header.stamp = stamp
        t.header.frame_id = "base_link"
        t.point.x, t.point.y, t.point.z = (float(v) for v in TARGET_M)
        self.target_pub.publish(t)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.thread.join(5.0)
        self.node.destroy_node()


def wait_for(predicate: Any, timeout_s: float, what: str, procs: Any = None,
             cell: Cell | None = None) -> None:
    """Poll `predicate` until true; fail with `what` and the process logs otherwise."""
    deadline = time.monotonic() + timeout_s
    why = f"timed out after {timeout_s} s waiting for {what}"
    while time.monotonic() < deadline:
        if predicate():
            return
        dead = [p for p in (procs.procs if procs is not None else []) if p.poll() is not None]
        if dead:
            why = f"{[d.args[2] for d in dead]} exited while waiting for {what}"
            break
        time.sleep(0.05)
    logs = ""
    if procs is not None:
        logs = "\n".join(f"--- {p.args[2]}\n{procs.log(p)[-3000:]}" for p in procs.procs)
    if cell is not None:
        m = cell.report.get("metrics", {})
        keys = ("steps", "policy_commands", "baseline_commands", "unmatched_policy",
                "agreement_rate")
        logs += (f"\n--- cell: status {cell.status}, version {cell.version}, comparator "
                 f"{ {k: m.get(k) for k in keys} }")
    pytest.fail(f"{why}\n{logs}")


def _registry(tmp_path: Path) -> Path:
    from sim2real_ros.policy.registry import PolicyRegistry

    reg = PolicyRegistry(tmp_path / "registry")  # version 1 (shipped default), known-good
    reg.add_file(reg.path_of(1), {"note": "candidate under rollout"}, parent=1)  # version 2
    assert reg.known_good == 1
    return reg.root


def _rollout_yaml(tmp_path: Path) -> Path:
    # A short gate: this test is about the mechanism, not about how much evidence to demand.
    gate = {"min_steps": 50, "min_time_s": 0.5, "min_agreement_rate": 0.0,
            "max_hard_violations": 0}
    p = tmp_path / "rollout.yaml"
    p.write_text(yaml.safe_dump({"gates": {"advisory": gate, "limited": gate, "full": gate},
                                 "log_file": str(tmp_path / "rollout.jsonl")}))
    return p


@pytest.mark.slow
@pytest.mark.graph
def test_drift_triggers_rollback_to_known_good_and_stage_drop(
    node_processes: Any, ros_context: Any, tmp_path: Path
) -> None:
    root = _registry(tmp_path)
    rollout = _rollout_yaml(tmp_path)
    log_path = tmp_path / "rollout.jsonl"
    # Timeouts relaxed for a loaded 2-core test machine and the monitor window shortened so
    # the test is quick. The monitor's intervention-rate trigger is switched off (rate 1.0 is
    # never exceeded) so that the only way to a rollback here is the one under test:
    # drift -> OOD fallback -> fallback rate -> monitor -> rollback and stage drop.
    relaxed = ["command_timeout_s:=0.3", "baseline_timeout_s:=0.3", "state_timeout_s:=0.3",
               "confidence_timeout_s:=0.3", "max_command_age_s:=0.5", "max_baseline_age_s:=0.5",
               "max_state_age_s:=1.0", "calm_period_s:=0.3", "monitor_window_s:=1.0",
               "monitor_max_intervention_rate:=1.0", "monitor_cooldown_s:=30.0"]
    p = node_processes
    p.start("sim2real_ros.safety.node", name="safety_filter", ros_args=[
        "-p", "rollout_stage:=advisory", *[a for r in relaxed for a in ("-p", r)]])
    p.start("sim2real_ros.shadow.node", name="shadow_comparator", ros_args=[
        "-p", f"rollout_config:={rollout}", "-p", f"rollout_log:={log_path}",
        "-p", "training_stats:=none", "-p", "report_period_s:=0.2",
        "-p", "transition_grace_s:=3.0"])
    p.start("sim2real_ros.policy.node", name="policy_node", ros_args=[
        "-p", f"registry_path:={root}", "-p", "policy_version:=2",
        "-p", "stale_timeout_s:=0.5"])
    cell = Cell(ros_context)
    try:
        # Evidence at advisory until the comparator recommends limited; the policy has
        # authority (it would drive) once its signals were calm.
        wait_for(lambda: cell.version.get("version") == 2, 60.0, "policy version 2", p, cell)
        wait_for(lambda: cell.recommendation.get("current_stage") == "advisory"
                 and cell.recommendation.get("promote") is True, 30.0,
                 "a recommendation to promote advisory -> limited", p, cell)
        wait_for(lambda: cell.status.get("fallback_reason") == "", 20.0,
                 "the policy to hold authority (no fallback reason)", p, cell)

        # The operator promotes through the gate; the CLI sets the real filter's parameter.
        rc = sim2real(["rollout", "promote", "--to", "limited", "--who", "e2e-test",
                       "--why", "gate passed in advisory", "--config", str(rollout),
                       "--log", str(log_path), "--timeout", "20"])
        assert rc == 0
        wait_for(lambda: cell.status.get("rollout_stage") == "limited"
                 and cell.status.get("source") == "policy", 10.0, "the policy driving", p, cell)
        promotion = RolloutLog(log_path).read()
        assert [(t.kind, t.from_stage, t.to_stage, t.who) for t in promotion] == [
            ("promotion", "advisory", "limited", "e2e-test")]
        # Without drift the monitor stays quiet for longer than its window.
        time.sleep(1.5)
        assert cell.status.get("rollout_stage") == "limited", [
            (e["kind"], e["limit"], e["detail"]) for e in cell.events
            if e["kind"] in ("monitor", "fallback", "stage")]
        assert cell.version.get("version") == 2

        # Drift: the velocity sensor reads 1 rad/s high on every joint.
        cell.drift_rad_s = DRIFT_RAD_S
        wait_for(lambda: cell.status.get("rollout_stage") == "advisory", 20.0,
                 "the monitor to drop the stage", p, cell)
        wait_for(lambda: cell.version.get("version") == 1, 10.0,
                 "the policy node to roll back to known-good version 1", p, cell)
        wait_for(lambda: len(RolloutLog(log_path).read()) == 2, 10.0,
                 "the comparator to log the rollback", p, cell)
        wait_for(lambda: bool(cell.transitions) and cell.transitions[-1]["kind"] == "rollback",
                 10.0, "the rollback on shadow_comparator/transitions", p, cell)
    finally:
        cell.close()

    monitor = [e for e in cell.events if e["kind"] == "monitor"]
    assert monitor and "fallback" in monitor[0]["detail"], cell.events[-20:]
    fallbacks = [(e["limit"], e["detail"]) for e in cell.events if e["kind"] == "fallback"]
    assert any(limit in ("ood", "disagreement") for limit, _ in fallbacks), fallbacks
    rollback = RolloutLog(log_path).read()[-1]
    assert (rollback.kind, rollback.from_stage, rollback.to_stage, rollback.who) == (
        "rollback", "limited", "advisory", "automatic")
    ev = rollback.evidence
    assert ev["active_version"]["version"] == 1 and ev["version_at_stage_start"] == 2
    assert ev["status"]["rollout_stage"] == "advisory"
    assert any(e.get("kind") == "monitor" for e in ev["key_safety_events"]), ev
    assert cell.transitions[-1]["evidence"]["active_version"]["version"] == 1
    assert "known-good 1" in cell.version["reason"]

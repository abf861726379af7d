"""shadow_comparator in-process with real rclpy: metrics, recommendation, stage changes, log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import spin_until
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Vector3Stamped
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import arrays_to_joint_state, ns_to_stamp
from sim2real_ros.ros.diagnostics import status_values
from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS
from sim2real_ros.shadow.divergence import TrainingStats
from sim2real_ros.shadow.node import ShadowComparator
from sim2real_ros.shadow.rollout import RolloutLog
from sim2real_ros.shadow.stats import save_training_stats, state_block_names

ARM = load_arm(default_urdf())
JOINTS = list(ARM.joint_names)
OFFSET = np.array([2.0**-6, 0.0, -(2.0**-5), 0.0, 0.0, 2.0**-4])  # joint 6 beyond 0.05 rad
HOME = np.array([0.0, 0.25, 1.5, 0.0, 1.5, 0.0])


def _rollout_yaml(tmp_path: Path, min_steps: int) -> Path:
    gate = {"min_steps": min_steps, "min_time_s": 0.0, "min_agreement_rate": 0.5,
            "max_hard_violations": 0, "max_ood_fraction": 0.5, "min_coverage": 0.9}
    data = {"metrics": {"agreement_tolerance_rad": 0.05, "ood_threshold": 3.0},
            "gates": {"advisory": gate, "limited": gate, "full": gate},
            "log_file": str(tmp_path / "rollout.jsonl")}
    p = tmp_path / "rollout.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _stats_file(tmp_path: Path) -> Path:
    stats = TrainingStats(np.concatenate([HOME, np.zeros(6)]), np.full(12, 0.5),
                          state_block_names(JOINTS))
    return save_training_stats(stats, tmp_path / "stats.json")


class Graph:
    """The comparator plus a test node that plays policy, baseline, arm and safety filter."""

    def __init__(self, ctx: Any, tmp_path: Path, min_steps: int = 40, **params: Any) -> None:
        overrides = {
            "rollout_config": str(_rollout_yaml(tmp_path, min_steps)),
            "training_stats": str(_stats_file(tmp_path)),
            "report_period_s": 0.1,
            "transition_grace_s": 0.3,
            **params,
        }
        self.comparator = ShadowComparator(
            context=ctx,
            parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()],
        )
        self.peer = Node("shadow_test_peer", context=ctx)
        self.ex = SingleThreadedExecutor(context=ctx)
        self.ex.add_node(self.comparator)
        self.ex.add_node(self.peer)
        pub = self.peer.create_publisher
        self.policy = pub(JointState, "policy/joint_command", COMMAND_QOS)
        self.baseline = pub(JointState, "baseline/joint_command", COMMAND_QOS)
        self.joints = pub(JointState, "joint_states", STATE_QOS)
        self.conf = pub(Vector3Stamped, "policy/confidence", STATE_QOS)
        self.status = pub(String, "safety_filter/status", LATCHED_QOS)
        self.events = pub(String, "safety_filter/events", EVENT_QOS)
        self.version = pub(String, "policy_node/active_version", LATCHED_QOS)
        self.diags: list[DiagnosticArray] = []
        self.transitions: list[dict[str, Any]] = []
        self.peer.create_subscription(DiagnosticArray, "/diagnostics", self.diags.append,
                                      STATE_QOS)
        self.peer.create_subscription(
            String, "shadow_comparator/transitions",
            lambda m: self.transitions.append(json.loads(m.data)), LATCHED_QOS)
        self.k = 0

    def wait_connected(self) -> None:
        topics = [self.policy, self.baseline, self.joints, self.conf, self.status]
        assert spin_until(self.ex, lambda: all(p.get_subscription_count() for p in topics), 5.0)

    def set_stage(self, stage: str, estop: bool = False) -> None:
        self.status.publish(String(data=json.dumps(
            {"rollout_stage": stage, "source": "baseline", "estop": estop,
             "envelope_sha256": "x"})))
        # Evidence gathered before the comparator knows the stage is discarded; wait for it.
        assert spin_until(self.ex, lambda: self.comparator.stage_known, 5.0)

    def set_version(self, version: int) -> None:
        self.version.publish(String(data=json.dumps(
            {"version": version, "sha256": "0" * 64, "known_good": version, "reason": "t"})))
        c = self.comparator
        assert spin_until(self.ex, lambda: (c.active_version or {}).get("version") == version,
                          5.0)

    def step(self, n: int, offset: np.ndarray = OFFSET, ood: float = 1.0) -> None:
        """Publish n control steps at 100 Hz stamps; spin between them."""
        for _ in range(n):
            t_ns = 1_000_000_000 + self.k * 10_000_000
            stamp = ns_to_stamp(t_ns)
            q = HOME + 0.01 * np.sin(0.05 * self.k + np.arange(6))
            self.joints.publish(arrays_to_joint_state(JOINTS, stamp, q, np.zeros(6)))
            self.baseline.publish(arrays_to_joint_state(JOINTS, stamp, q))
            self.policy.publish(arrays_to_joint_state(JOINTS, stamp, q + offset))
            c = Vector3Stamped()
            c.header.stamp = stamp
            c.vector.x, c.vector.y, c.vector.z = 0.01, ood, 1.0
            self.conf.publish(c)
            self.k += 1
            # Keep-last-10 queues: let the comparator take each step before the next.
            target = self.k
            spin_until(self.ex, lambda: self.comparator.acc._policy_n >= target, 1.0, 0.001)

    def close(self) -> None:
        self.ex.remove_node(self.comparator)
        self.ex.remove_node(self.peer)
        self.comparator.destroy_node()
        self.peer.destroy_node()


@pytest.fixture
def graph(ros_context: Any, tmp_path: Path):  # type: ignore[no-untyped-def]
    g = Graph(ros_context, tmp_path)
    try:
        yield g
    finally:
        g.close()


def test_live_metrics_reach_report_diagnostics_and_latched_recommendation(
    graph: Graph, ros_context: Any
) -> None:
    graph.wait_connected()
    graph.set_stage("shadow")
    graph.step(60)
    c = graph.comparator

    def all_in() -> bool:
        m = c.acc.metrics()
        return m.steps == 60 and m.confidence_samples == 60 and m.coverage.samples == 60

    assert spin_until(graph.ex, all_in, 5.0)
    report = c.build_report()
    m = report["metrics"]
    assert report["stage"] == "shadow" and report["stage_known"] is True
    assert m["mean_abs_rad"] == pytest.approx(list(np.abs(OFFSET)), abs=1e-12)
    assert m["agreement_rate"] == 0.0  # joint 6 is 0.0625 rad off on every step
    assert m["coverage"]["fraction_within"] == 1.0 and m["confidence_samples"] == 60
    assert "safety_envelope.yaml" in report["intervention_check"]
    # 0 % agreement < 50 %: the gate does not pass.
    assert report["recommendation"]["promote"] is False

    # A later subscriber still receives the latched recommendation.
    late: list[dict[str, Any]] = []
    graph.peer.create_subscription(String, "shadow_comparator/recommendation",
                                   lambda msg: late.append(json.loads(msg.data)), LATCHED_QOS)
    assert spin_until(graph.ex, lambda: bool(late), 3.0)
    rows = {r["criterion"]: r for r in late[-1]["gate"]["criteria"]}
    assert rows["min_agreement_rate"]["passed"] is False
    assert rows["min_steps"]["measured"] >= 40 and rows["min_steps"]["passed"] is True

    assert spin_until(graph.ex, lambda: any(
        s.name.startswith("shadow_comparator") for d in graph.diags for s in d.status), 3.0)
    status = [s for d in graph.diags for s in d.status][-1]
    values = status_values(status)
    assert values["stage"] == "shadow" and values["gate_failing"] == "min_agreement_rate"
    assert float(values["window_max_abs_rad.wrist_3_joint"]) == pytest.approx(0.0625)
    for key in ("agreement_rate", "hard_violations", "ood_fraction", "fallback_rate",
                "coverage", "p95_l2_rad", "recommended_stage", "policy_version"):
        assert key in values


def test_recommendation_turns_to_promotion_once_the_gate_passes(graph: Graph) -> None:
    graph.wait_connected()
    graph.set_stage("shadow")
    small = np.array([0.01, 0, 0, 0, 0, 0.0])
    graph.step(30, offset=small)
    assert spin_until(graph.ex, lambda: graph.comparator.acc.metrics().steps == 30, 5.0)
    assert graph.comparator.build_report()["recommendation"]["promote"] is False  # 30 < 40
    graph.step(15, offset=small)
    assert spin_until(graph.ex, lambda: graph.comparator.acc.metrics().steps == 45, 5.0)
    rec = graph.comparator.build_report()["recommendation"]
    assert rec["promote"] is True and rec["recommended_stage"] == "advisory"


def test_stage_drop_with_version_change_is_logged_as_rollback_with_evidence(
    graph: Graph, tmp_path: Path
) -> None:
    graph.wait_connected()
    graph.set_version(2)
    graph.set_stage("limited")
    assert spin_until(graph.ex, lambda: graph.comparator.stage_known, 5.0)
    graph.step(20)
    graph.events.publish(String(data=json.dumps({"kind": "drift", "joint": "elbow_joint"})))
    assert spin_until(graph.ex, lambda: graph.comparator.acc.metrics().steps == 20, 5.0)
    graph.set_version(1)
    graph.set_stage("shadow")
    assert spin_until(graph.ex, lambda: bool(graph.transitions), 5.0)
    t = graph.transitions[-1]
    assert (t["from"], t["to"], t["kind"], t["who"]) == ("limited", "shadow", "rollback",
                                                         "automatic")
    assert t["evidence"]["active_version"]["version"] == 1
    assert t["evidence"]["version_at_stage_start"] == 2
    assert t["evidence"]["safety_events"] == [{"kind": "drift", "joint": "elbow_joint"}]
    assert t["evidence"]["key_safety_events"] == []  # "drift" is not a stage-relevant kind
    # The rollback reset the evidence first; what the old version did is kept with it.
    assert t["evidence"]["metrics_before_version_change"]["steps"] == 20
    records = RolloutLog(tmp_path / "rollout.jsonl").read()
    assert [(r.kind, r.to_stage) for r in records] == [("rollback", "shadow")]
    assert graph.comparator.acc.metrics().steps == 0  # evidence restarts at the new stage


def test_stage_drop_without_version_change_is_a_demotion_after_the_grace(
    graph: Graph, tmp_path: Path
) -> None:
    graph.wait_connected()
    graph.set_version(3)
    graph.set_stage("advisory")
    assert spin_until(graph.ex, lambda: graph.comparator.stage_known, 5.0)
    graph.set_stage("shadow", estop=True)
    assert spin_until(graph.ex, lambda: bool(graph.transitions), 5.0)
    assert graph.transitions[-1]["kind"] == "demotion"
    assert RolloutLog(tmp_path / "rollout.jsonl").read()[0].to_stage == "shadow"


def test_parameters_cannot_change_at_runtime(graph: Graph) -> None:
    res = graph.comparator.set_parameters([Parameter("report_period_s", value=5.0)])
    assert not res[0].successful and "restart" in res[0].reason


def test_missing_rollout_config_refuses_to_start(ros_context: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.yaml"):
        ShadowComparator(context=ros_context, parameter_overrides=[
            Parameter("rollout_config", value=str(tmp_path / "missing.yaml"))])


def test_bad_envelope_refuses_to_start(ros_context: Any, tmp_path: Path) -> None:
    bad = tmp_path / "env.yaml"
    bad.write_text("version: 7\n")
    with pytest.raises(ConfigError, match="version"):
        ShadowComparator(context=ros_context, parameter_overrides=[
            Parameter("envelope_file", value=str(bad)), Parameter("training_stats", value="none")])


def test_active_training_stats_follow_the_announced_policy_version(
    ros_context: Any, tmp_path: Path
) -> None:
    from sim2real_ros.policy.registry import PolicyRegistry

    reg = PolicyRegistry(tmp_path / "registry")  # version 1 = the shipped default policy
    policy, _ = reg.load(1)
    g = Graph(ros_context, tmp_path, training_stats="active", policy_registry=str(reg.root))
    try:
        g.wait_connected()
        g.set_stage("shadow")
        g.set_version(1)
        c = g.comparator
        assert c.stats_source == "policy registry version 1"
        assert c.acc.training_stats is not None
        np.testing.assert_array_equal(c.acc.training_stats.std, policy.stats.std[:12])
        g.set_version(7)  # not in the registry: coverage becomes unmeasured (fail closed)
        assert c.acc.training_stats is None and "unavailable" in c.stats_source
        g.step(5)
        assert c.build_report()["metrics"]["coverage"] is None
    finally:
        g.close()

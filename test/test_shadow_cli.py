"""`sim2real rollout promote|status` against a real rclpy node that owns `rollout_stage`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rcl_interfaces.msg import SetParametersResult
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String
from test_shadow_report import JOINTS, OFFSET, _rollout_yaml, write_bag

from sim2real_ros.cli import main as sim2real
from sim2real_ros.ros.qos import LATCHED_QOS
from sim2real_ros.shadow.divergence import json_default
from sim2real_ros.shadow.gates import load_rollout_config
from sim2real_ros.shadow.report import analyze_bag
from sim2real_ros.shadow.rollout import RolloutLog

STAGES = ("shadow", "advisory", "limited", "full")


class StageOwner:
    """A real rclpy node named safety_filter with a validated `rollout_stage` parameter."""

    def __init__(self, ctx: Any, stage: str = "shadow", refuse: str = "") -> None:
        self.node = Node("safety_filter", context=ctx)
        self.node.declare_parameter("rollout_stage", stage)
        self.refuse = refuse

        def guard(params: list[Any]) -> SetParametersResult:
            for p in params:
                if p.name == "rollout_stage" and (p.value not in STAGES or p.value == refuse):
                    return SetParametersResult(successful=False, reason=f"refusing {p.value}")
            return SetParametersResult(successful=True)

        self.node.add_on_set_parameters_callback(guard)
        self.rec_pub = self.node.create_publisher(
            String, "/shadow_comparator/recommendation", LATCHED_QOS)
        # The active policy version is the one the evidence bags were recorded with (4).
        self.version_pub = self.node.create_publisher(
            String, "/policy_node/active_version", LATCHED_QOS)
        self.set_version(4)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def set_version(self, version: int) -> None:
        self.version_pub.publish(String(data=json.dumps(
            {"version": version, "sha256": "x", "known_good": version, "reason": "test"})))

    @property
    def stage(self) -> str:
        return str(self.node.get_parameter("rollout_stage").value)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.thread.join(5.0)
        self.node.destroy_node()


@pytest.fixture
def owner(ros_context: Any) -> Iterator[StageOwner]:
    o = StageOwner(ros_context)
    try:
        yield o
    finally:
        o.close()


_REPORTS: dict[int, str] = {}


def _evidence(tmp_path: Path, steps: int = 200) -> Path:
    """Write the JSON report of a shadow bag with `steps` steps (the analysis is cached)."""
    if steps not in _REPORTS:
        bag = write_bag(tmp_path / f"bag{steps}", steps, OFFSET)
        cfg = load_rollout_config(_rollout_yaml(tmp_path))
        analysis = analyze_bag(bag, JOINTS, cfg)
        _REPORTS[steps] = json.dumps(analysis.as_dict(), default=json_default)
    p = tmp_path / f"report{steps}.json"
    p.write_text(_REPORTS[steps])
    return p


def _promote(tmp_path: Path, to: str, *extra: str) -> int:
    return sim2real(["rollout", "promote", "--to", to, "--who", "alice",
                     "--why", "two clean shifts", "--config", str(_rollout_yaml(tmp_path)),
                     "--timeout", "10", *extra])


def test_promotion_with_passing_evidence_sets_the_stage_and_logs_who_why_evidence(
    owner: StageOwner, tmp_path: Path
) -> None:
    report = _evidence(tmp_path)
    assert _promote(tmp_path, "advisory", "--evidence", str(report)) == 0
    assert owner.stage == "advisory"
    [rec] = RolloutLog(tmp_path / "rollout.jsonl").read()
    assert (rec.kind, rec.from_stage, rec.to_stage, rec.who, rec.why) == (
        "promotion", "shadow", "advisory", "alice", "two clean shifts")
    assert rec.evidence["gate"]["passed"] is True
    assert rec.evidence["source"] == str(report)
    assert rec.evidence["evidence"]["recommendation"]["recommended_stage"] == "advisory"
    assert rec.evidence["evidence"]["metrics"]["steps"] == 200


def test_failing_gate_refuses_and_changes_nothing(
    owner: StageOwner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _evidence(tmp_path, steps=99)  # the gate needs 100 steps
    assert _promote(tmp_path, "advisory", "--evidence", str(report)) == 1
    assert owner.stage == "shadow"
    assert RolloutLog(tmp_path / "rollout.jsonl").read() == []
    assert "min_steps (measured 99.0, needs >= 100.0)" in capsys.readouterr().err


def test_promotion_skipping_a_stage_is_refused(owner: StageOwner, tmp_path: Path) -> None:
    assert _promote(tmp_path, "limited", "--evidence", str(_evidence(tmp_path))) == 1
    assert owner.stage == "shadow"


def test_evidence_from_another_stage_is_refused(
    ros_context: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _evidence(tmp_path)  # gathered at shadow
    o = StageOwner(ros_context, stage="advisory")
    try:
        assert _promote(tmp_path, "limited", "--evidence", str(report)) == 1
        assert o.stage == "advisory"
        assert "gathered at stage 'shadow'" in capsys.readouterr().err
    finally:
        o.close()


def test_live_recommendation_is_the_default_evidence(owner: StageOwner, tmp_path: Path) -> None:
    report = json.loads(_evidence(tmp_path).read_text())
    rec = {**report["recommendation"], "stage_known": True}
    owner.rec_pub.publish(String(data=json.dumps(rec)))
    assert _promote(tmp_path, "advisory") == 0
    assert owner.stage == "advisory"
    [t] = RolloutLog(tmp_path / "rollout.jsonl").read()
    assert t.evidence["source"] == "/shadow_comparator/recommendation"


def test_stage_refused_by_the_node_is_not_logged(ros_context: Any, tmp_path: Path) -> None:
    report = _evidence(tmp_path)
    o = StageOwner(ros_context, refuse="advisory")
    try:
        assert _promote(tmp_path, "advisory", "--evidence", str(report)) == 1
        assert o.stage == "shadow"
        assert RolloutLog(tmp_path / "rollout.jsonl").read() == []
    finally:
        o.close()


def test_unreachable_safety_filter_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _evidence(tmp_path)
    assert _promote(tmp_path, "advisory", "--evidence", str(report), "--timeout", "0.5") == 3
    assert "parameter services not available" in capsys.readouterr().err


def test_status_prints_stage_recommendation_and_log(
    owner: StageOwner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _evidence(tmp_path)
    assert _promote(tmp_path, "advisory", "--evidence", str(report)) == 0
    owner.rec_pub.publish(String(data=json.dumps(
        json.loads(report.read_text())["recommendation"])))
    capsys.readouterr()
    assert sim2real(["rollout", "status", "--config", str(_rollout_yaml(tmp_path)),
                     "--timeout", "10"]) == 0
    out = capsys.readouterr().out
    assert "stage: advisory" in out
    assert "recommendation: advisory (current shadow, promote=True)" in out
    assert "promotion shadow -> advisory by alice: two clean shifts" in out


class Streamer:
    """Plays policy (= baseline + OFFSET), baseline and stage status at 100 Hz in a thread."""

    def __init__(self, ctx: Any) -> None:
        from rclpy.qos import QoSProfile
        from sensor_msgs.msg import JointState

        from sim2real_ros.ros.convert import arrays_to_joint_state, ns_to_stamp

        self.node = Node("shadow_test_streamer", context=ctx)
        depth = QoSProfile(depth=100)
        pol = self.node.create_publisher(JointState, "policy/joint_command", depth)
        base = self.node.create_publisher(JointState, "baseline/joint_command", depth)
        status = self.node.create_publisher(String, "safety_filter/status", LATCHED_QOS)
        status.publish(String(data=json.dumps({"rollout_stage": "shadow", "estop": False})))
        self.k = 0

        def tick() -> None:
            stamp = ns_to_stamp(1_000_000_000 + self.k * 10_000_000)
            q = np.round((0.1 * np.sin(0.01 * self.k + np.arange(6))) * 2**20) / 2**20
            base.publish(arrays_to_joint_state(JOINTS, stamp, q))
            pol.publish(arrays_to_joint_state(JOINTS, stamp, q + OFFSET))
            self.k += 1

        self.node.create_timer(0.01, tick)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.thread.join(5.0)
        self.node.destroy_node()


def test_live_report_listens_to_the_running_graph(ros_context: Any, tmp_path: Path) -> None:
    streamer = Streamer(ros_context)
    try:
        out = tmp_path / "live"
        assert sim2real(["shadow", "report", "--live", "--duration", "1.5", "-o", str(out),
                         "--config", str(_rollout_yaml(tmp_path))]) == 0
    finally:
        streamer.close()
    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    assert m["steps"] >= 50  # ~150 at 100 Hz; a loaded machine delivers fewer
    assert m["mean_abs_rad"] == list(np.abs(OFFSET)) and m["agreement_rate"] == 1.0
    assert report["stage"] == "shadow" and report["bag"] == "live graph (1.5 s)"
    assert (out / "divergence.png").is_file()


def test_report_needs_a_bag_or_live(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim2real(["shadow", "report"]) == 2
    assert "a bag or --live" in capsys.readouterr().err


def test_evidence_from_another_policy_version_is_refused(
    owner: StageOwner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _evidence(tmp_path)  # the bag's confidence messages say version 4
    owner.set_version(5)
    assert _promote(tmp_path, "advisory", "--evidence", str(report)) == 1
    assert owner.stage == "shadow"
    assert "policy version(s) [4], the active version is 5" in capsys.readouterr().err
    owner.set_version(4)
    assert _promote(tmp_path, "advisory", "--evidence", str(report)) == 0
    assert owner.stage == "advisory"


def test_promote_sets_the_real_safety_filters_stage(ros_context: Any, tmp_path: Path) -> None:
    from sim2real_ros.safety.node import SafetyFilter

    report = _evidence(tmp_path)
    sf = SafetyFilter(context=ros_context)
    statuses: list[dict[str, Any]] = []
    sf.create_subscription(String, "safety_filter/status",
                           lambda m: statuses.append(json.loads(m.data)), LATCHED_QOS)
    version_pub = sf.create_publisher(String, "/policy_node/active_version", LATCHED_QOS)
    version_pub.publish(String(data=json.dumps({"version": 4, "sha256": "x", "known_good": 4,
                                                "reason": "test"})))
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(sf)
    thread = threading.Thread(target=ex.spin, daemon=True)
    thread.start()
    try:
        assert _promote(tmp_path, "advisory", "--evidence", str(report)) == 0
        assert sf.get_parameter("rollout_stage").value == "advisory"
        assert sf.sup.stage == "advisory"
        def published() -> bool:
            return bool(statuses) and statuses[-1]["rollout_stage"] == "advisory"

        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not published():
            time.sleep(0.02)
        assert published(), statuses
    finally:
        ex.shutdown(timeout_sec=2.0)
        thread.join(5.0)
        sf.destroy_node()
    [t] = RolloutLog(tmp_path / "rollout.jsonl").read()
    assert (t.from_stage, t.to_stage, t.who) == ("shadow", "advisory", "alice")

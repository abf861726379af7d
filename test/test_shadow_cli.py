"""`sim2real rollout promote|status` against a real rclpy node that owns `rollout_stage`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

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
                     "--timeout", "3", *extra])


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
                     "--timeout", "3"]) == 0
    out = capsys.readouterr().out
    assert "stage: advisory" in out
    assert "recommendation: advisory (current shadow, promote=True)" in out
    assert "promotion shadow -> advisory by alice: two clean shifts" in out

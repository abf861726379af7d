"""`sim2real shadow report BAG` on real rosbag2 (MCAP) bags written with rosbags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sim2real_ros.cli import main as sim2real
from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot.model import load_arm
from sim2real_ros.safety.envelope import load_envelope
from sim2real_ros.shadow.divergence import TrainingStats
from sim2real_ros.shadow.stats import save_training_stats, state_block_names
from sim2real_ros.sysid.bags import BagWriter, joint_state_msg, typestore

ARM = load_arm(default_urdf())
JOINTS = list(ARM.joint_names)
HOME = np.array([0.0, 0.25, 1.5, 0.0, 1.5, 0.0])
PERIOD_NS = 10_000_000
T0_NS = 5_000_000_000


def _stamp(t_ns: int) -> Any:
    return typestore().types["builtin_interfaces/msg/Time"](
        sec=t_ns // 1_000_000_000, nanosec=t_ns % 1_000_000_000)


def _confidence(t_ns: int, dis: float, ood: float, version: int) -> Any:
    ts = typestore().types
    header = ts["std_msgs/msg/Header"](stamp=_stamp(t_ns), frame_id="")
    vec = ts["geometry_msgs/msg/Vector3"](x=dis, y=ood, z=float(version))
    return ts["geometry_msgs/msg/Vector3Stamped"](header=header, vector=vec)


def _string(data: dict[str, Any]) -> Any:
    return typestore().types["std_msgs/msg/String"](data=json.dumps(data))


def write_bag(
    path: Path,
    steps: int,
    offset: np.ndarray,
    stages: list[tuple[int, str]] = ((0, "shadow"),),  # type: ignore[assignment]
    ood: np.ndarray | None = None,
    spike_at: int | None = None,
    with_confidence: bool = True,
) -> Path:
    """Write a shadow-mode bag: policy = baseline + offset; stage changes at given steps."""
    topics = {
        "/joint_states": "sensor_msgs/msg/JointState",
        "/policy/joint_command": "sensor_msgs/msg/JointState",
        "/baseline/joint_command": "sensor_msgs/msg/JointState",
        "/safety_filter/status": "std_msgs/msg/String",
    }
    if with_confidence:
        topics["/policy/confidence"] = "geometry_msgs/msg/Vector3Stamped"
    stage_at = dict(stages)
    with BagWriter(path, {"unit": {"serial": "test"}}) as bag:
        for name, msgtype in topics.items():
            bag.add_topic(name, msgtype)
        for k in range(steps):
            t = T0_NS + k * PERIOD_NS
            if k in stage_at:
                bag.write_msg("/safety_filter/status", t, _string(
                    {"rollout_stage": stage_at[k], "source": "baseline", "estop": False,
                     "envelope_sha256": "x"}))
            q = _q(k)
            qd = 0.1 * np.cos(0.01 * k + np.arange(6))
            bag.write_msg("/joint_states", t, joint_state_msg(JOINTS, t, q, qd))
            # The baseline answers 1 ms later than the policy but stamps the same observation.
            cmd = q + offset
            if spike_at is not None and k == spike_at:
                cmd = cmd.copy()
                cmd[1] = 5.0  # beyond the URDF limit of the shoulder lift: a hard violation
            bag.write_msg("/policy/joint_command", t + 500_000, joint_state_msg(JOINTS, t, cmd))
            bag.write_msg("/baseline/joint_command", t + 1_000_000, joint_state_msg(JOINTS, t, q))
            if with_confidence:
                o = 1.0 if ood is None else float(ood[k])
                bag.write_msg("/policy/confidence", t + 500_000, _confidence(t, 0.01, o, 4))
    return path


def _q(k: int) -> np.ndarray:
    """Measured position at step k, on a 2^-20 rad grid so that q + OFFSET - q is exact."""
    return np.round((HOME + 0.1 * np.sin(0.01 * k + np.arange(6))) * 2**20) / 2**20


def _rollout_yaml(tmp_path: Path, min_steps: int = 100) -> Path:
    gate = {"min_steps": min_steps, "min_time_s": 1.0, "min_agreement_rate": 0.9,
            "max_hard_violations": 0, "max_ood_fraction": 0.1}
    p = tmp_path / "rollout.yaml"
    p.write_text(yaml.safe_dump({"gates": {"advisory": gate, "limited": gate, "full": gate},
                                 "log_file": str(tmp_path / "rollout.jsonl")}))
    return p


OFFSET = np.array([2.0**-6, 0.0, 0.0, -(2.0**-5), 0.0, 0.0])


def test_report_from_a_bag_gives_exact_metrics_plots_and_gate_table(tmp_path: Path) -> None:
    ood = np.where(np.arange(300) % 20 == 0, 4.0, 1.0)  # 15 of 300 beyond 3.0
    bag = write_bag(tmp_path / "bag", 300, OFFSET, ood=ood)
    out = tmp_path / "report"
    rc = sim2real(["shadow", "report", str(bag), "-o", str(out),
                   "--config", str(_rollout_yaml(tmp_path))])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    assert m["steps"] == 300 and m["unmatched_policy"] == 0
    assert m["time_s"] == pytest.approx(2.99, abs=1e-9)
    assert m["mean_abs_rad"] == list(np.abs(OFFSET)) and m["max_abs_rad"] == list(np.abs(OFFSET))
    assert m["agreement_rate"] == 1.0
    assert m["ood_fraction"] == 15 / 300 and m["confidence_samples"] == 300
    assert m["policy_versions"] == [4]
    assert m["hard_violations"] == 0
    assert report["stage"] == "shadow" and report["stage_known"] is True
    rec = report["recommendation"]
    assert rec["promote"] is True and rec["recommended_stage"] == "advisory"
    page = (out / "report.md").read_text()
    assert "| min_agreement_rate | 1 | >= | 0.9 | pass |" in page
    assert "| max_ood_fraction | 0.05 | <= | 0.1 | pass |" in page
    assert "![divergence](divergence.png)" in page and "![confidence](confidence.png)" in page
    for png in ("divergence.png", "confidence.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_hard_violation_in_the_bag_fails_the_gate_and_shows_in_the_report(
    tmp_path: Path,
) -> None:
    bag = write_bag(tmp_path / "bag", 200, OFFSET, spike_at=150)
    out = tmp_path / "report"
    assert sim2real(["shadow", "report", str(bag), "-o", str(out), "--format", "html",
                     "--config", str(_rollout_yaml(tmp_path))]) == 0
    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    # The spike asks shoulder_lift for 5 rad (envelope: [-1.9, 1.9]): one hard position
    # violation, plus a hard workspace one if that configuration puts the tool outside the box.
    spike = _q(150) + OFFSET
    spike[1] = 5.0
    env = load_envelope(share_path("config", "safety_envelope.yaml"), ARM)
    tool = ARM.tool_position(spike)
    outside = bool(np.any(tool < env.box_min_m) or np.any(tool > env.box_max_m))
    assert m["hard_violations"] == 1 + outside
    assert m["interventions_by_kind"]["position"] == 1
    assert m["interventions_by_kind"].get("workspace", 0) == int(outside)
    assert "safety.projection.Projector" in report["intervention_check"]
    assert report["recommendation"]["promote"] is False
    html = (out / "report.html").read_text()
    assert (f"<td>max_hard_violations</td><td>{1 + outside}</td><td>&lt;=</td><td>0</td>"
            "<td>FAIL</td>") in html
    assert "<img src='divergence.png'>" in html


def test_evidence_restarts_at_a_stage_change_in_the_bag(tmp_path: Path) -> None:
    bag = write_bag(tmp_path / "bag", 300, OFFSET, stages=[(0, "shadow"), (100, "advisory")])
    out = tmp_path / "report"
    assert sim2real(["shadow", "report", str(bag), "-o", str(out),
                     "--config", str(_rollout_yaml(tmp_path, min_steps=250))]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["stage"] == "advisory"
    assert [s["stage"] for s in report["segments"]] == ["shadow", "advisory"]
    assert report["metrics"]["steps"] == 200  # only the advisory part counts
    gate = report["recommendation"]["gate"]
    assert (gate["from"], gate["to"], gate["passed"]) == ("advisory", "limited", False)


def test_coverage_uses_the_given_training_statistics(tmp_path: Path) -> None:
    bag = write_bag(tmp_path / "bag", 100, OFFSET)
    # Positions vary by +-0.1 rad around HOME; a 0.032 rad std at k=3 covers only part.
    stats = TrainingStats(np.concatenate([HOME, np.zeros(6)]),
                          np.concatenate([np.full(6, 0.032), np.full(6, 1.0)]),
                          state_block_names(JOINTS))
    stats_file = save_training_stats(stats, tmp_path / "stats.json")
    out = tmp_path / "report"
    assert sim2real(["shadow", "report", str(bag), "-o", str(out), "--stats", str(stats_file),
                     "--config", str(_rollout_yaml(tmp_path))]) == 0
    cov = json.loads((out / "report.json").read_text())["metrics"]["coverage"]
    q = np.stack([_q(k) for k in range(100)])
    expected = float(np.mean(np.all(np.abs(q - HOME) <= 3 * 0.032, axis=1)))
    assert cov["samples"] == 100 and cov["fraction_within"] == expected
    assert 0.0 < expected < 1.0


def test_bag_without_baseline_commands_is_refused_naming_the_topic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bag = tmp_path / "bag"
    with BagWriter(bag, {"unit": {"serial": "t"}}) as w:
        w.add_topic("/policy/joint_command", "sensor_msgs/msg/JointState")
        w.write_msg("/policy/joint_command", 1, joint_state_msg(JOINTS, 1, HOME))
    assert sim2real(["shadow", "report", str(bag), "-o", str(tmp_path / "r")]) == 2
    assert "baseline/joint_command" in capsys.readouterr().err

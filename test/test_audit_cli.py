"""`sim2real audit` end to end: real spec, real bags, real graph; exit 1 on red, both files."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String
from test_audit_latency import DelayedController, StatePublisher

from sim2real_ros.audit.evidence import HilRecord, load_hil_record, write_hil_record
from sim2real_ros.audit.sources import TERM_AXES, sim_model_for
from sim2real_ros.cli import main
from sim2real_ros.config import ConfigError, file_sha256
from sim2real_ros.ros.env import child_env
from sim2real_ros.ros.qos import LATCHED_QOS
from sim2real_ros.sysid.bags import (
    BagWriter,
    joint_state_msg,
    multiarray_msg,
    unit_metadata,
    wrench_msg,
)

REPO = Path(__file__).resolve().parent.parent
NAMES = ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint",
         "wrist_2_joint", "wrist_3_joint"]
UNIT = "arm-SN1234"
MS = 1_000_000
SIGMA_Q = 2e-4  # rad: inside the shipped spec's joint_position_noise range [5e-5, 5e-4]
SIGMA_W = np.array([0.2, 0.2, 0.2, 0.01, 0.01, 0.01])  # N, N·m: inside its F/T noise ranges


def write_cell_bag(path: Path, unit: str = UNIT, seconds: float = 3.0,
                   latency_ms: float = 7.0) -> Path:
    """A bag as the sysid recorder writes it: arm at rest, policy loop with a known latency."""
    rng = np.random.default_rng(0)
    q0 = np.array([0.0, -0.5, 1.2, 0.0, 1.0, 0.0])
    with BagWriter(path, unit_metadata(unit, cell="cell-1")) as w:
        w.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        w.add_topic("/policy/joint_command", "sensor_msgs/msg/JointState")
        w.add_topic("/forward_position_controller/commands", "std_msgs/msg/Float64MultiArray")
        w.add_topic("/force_torque_sensor_broadcaster/wrench", "geometry_msgs/msg/WrenchStamped")
        t0 = 1_700_000_000 * 1_000_000_000
        for k in range(int(seconds * 500)):
            t = t0 + k * 2 * MS
            q = q0 + rng.normal(0, SIGMA_Q, 6)
            v = rng.normal(0, 3e-3, 6)
            w.write_msg("/joint_states", t + MS // 2, joint_state_msg(NAMES, t, q, v))
            w.write_msg("/force_torque_sensor_broadcaster/wrench", t + MS // 2,
                        wrench_msg(t, "ft_sensor_link", rng.normal(0, 1, 6) * SIGMA_W))
            if k % 5 == 0:  # 100 Hz policy answering this observation
                w.write_msg("/policy/joint_command", t + 3 * MS, joint_state_msg(NAMES, t, q0))
                w.write_msg("/forward_position_controller/commands",
                            t + int(latency_ms * MS), multiarray_msg(q0))
    return path


def hil(path: Path, unit: str = UNIT, passed: bool = True) -> Path:
    rec = HilRecord("proxy", unit, datetime.now(timezone.utc).isoformat(), 0.96, 50, 0.012,
                    passed)
    return write_hil_record(path, rec)


def run(args: list[str]) -> tuple[int, dict, str]:
    out = Path(args[args.index("-o") + 1])
    code = main(["audit", *args])
    return code, json.loads((out / "audit.json").read_text()), (out / "audit.md").read_text()


def rows(report: dict) -> dict[str, str]:
    return {r["gap"]: r["status"] for r in report["rows"]}


def test_every_simulator_term_maps_to_a_checklist_axis() -> None:
    from sim2real_ros.sim.randomization import TERMS

    assert set(TERMS) == set(TERM_AXES)
    for name, (gap, _) in TERM_AXES.items():
        assert TERMS[name].group == gap


def test_audit_of_the_shipped_spec_with_a_cell_bag(tmp_path: Path) -> None:
    bag = write_cell_bag(tmp_path / "run1")
    envelope = tmp_path / "envelope.yaml"
    envelope.write_text("version: 1\n")
    code, report, md = run([
        "--bag", str(bag), "--hil-record", str(hil(tmp_path / "hil.json")),
        "--envelope", str(envelope), "-o", str(tmp_path / "out")])
    status = rows(report)
    assert code == 0, status
    assert status == {"visual": "green", "dynamics": "amber", "sensor": "green",
                      "actuator": "green", "latency": "amber", "safety": "amber"}
    assert report["units"] == {f"bag {bag}": UNIT}
    (lat,) = report["measurements"]["latency"]
    assert lat["obs_to_command_p50_s"] == pytest.approx(0.007)
    assert lat["obs_to_policy_p50_s"] == pytest.approx(0.003)
    pos = next(m for m in report["measurements"]["noise"] if m["key"] == "joint_position_std_rad")
    np.testing.assert_allclose(pos["std"], SIGMA_Q, rtol=0.2)
    latency_row = next(r for r in report["rows"] if r["gap"] == "latency")
    assert any("covered" in e and "NOT" not in e for e in latency_row["evidence"])
    assert any("watchdog" in m for m in latency_row["missing"])
    assert "| Latency | 🟠 amber |" in md and "## Evidence per row" in md


def test_red_row_exits_non_zero_and_still_writes_both_files(tmp_path: Path) -> None:
    spec = tmp_path / "no_latency.yaml"
    spec.write_text("terms:\n  link_mass: {operation: scale, distribution: uniform, "
                    "range: [0.9, 1.1], mode: reset}\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "sim2real_ros.cli", "audit", "--spec", str(spec), "-o", str(out)],
        env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "deployment blocked" in proc.stderr
    report = json.loads((out / "audit.json").read_text())
    assert report["deployable"] is False and report["overall"] == "red"
    assert rows(report)["latency"] == "red" and rows(report)["sensor"] == "red"
    assert "NOT deployable" in (out / "audit.md").read_text()


def test_a_unit_mismatch_between_bag_and_declaration_is_reported(tmp_path: Path) -> None:
    bag = write_cell_bag(tmp_path / "run1", unit="arm-SN9999", seconds=1.5)
    code, report, _ = run(["--bag", str(bag), "--unit", UNIT, "--hil-record",
                           str(hil(tmp_path / "h.json")), "-o", str(tmp_path / "o")])
    dyn = next(r for r in report["rows"] if r["gap"] == "dynamics")
    assert any("disagree" in e for e in dyn["evidence"])
    act = next(r for r in report["rows"] if r["gap"] == "actuator")
    assert act["status"] == "amber"  # the HIL record is for UNIT, the bag measured SN9999


def test_bad_inputs_are_config_errors_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "hil.json"
    bad.write_text(json.dumps({"kind": "hil", "backend": "proxy", "unit_id": UNIT,
                               "created_utc": "2026-01-01T00:00:00Z", "success_rate": 1.5,
                               "n_episodes": 10, "tracking_error_rad": 0.1, "passed": True}))
    with pytest.raises(ConfigError, match="success_rate"):
        load_hil_record(bad)
    assert main(["audit", "--hil-record", str(bad), "-o", str(tmp_path / "o")]) == 2
    assert main(["audit", "--bag", str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 2
    assert main(["audit", "--noise-factor", "0.5", "-o", str(tmp_path / "o")]) == 2


def test_hil_record_round_trips_and_old_records_do_not_count(tmp_path: Path) -> None:
    path = hil(tmp_path / "hil.json")
    assert load_hil_record(path).to_dict() == json.loads(path.read_text())
    old = HilRecord("real", UNIT, (datetime.now(timezone.utc) - timedelta(days=91)).isoformat(),
                    0.97, 40, 0.01, True)
    code, report, _ = run(["--unit", UNIT, "--hil-record",
                           str(write_hil_record(tmp_path / "old.json", old)),
                           "-o", str(tmp_path / "o")])
    assert rows(report)["actuator"] == "amber"


class CellReporter(Node):
    """What a cell's drive and safety filter announce: unit id in /diagnostics, filter status."""

    def __init__(self, context: object, unit: str, envelope_sha: str) -> None:
        super().__init__("cell_reporter", context=context)  # type: ignore[arg-type]
        self.status = self.create_publisher(String, "safety_filter/status", LATCHED_QOS)
        self.status.publish(String(data=json.dumps({
            "rollout_stage": "full", "source": "policy", "estop": False,
            "envelope_sha256": envelope_sha})))
        self.diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(0.2, self._tick)
        self.unit = unit

    def _tick(self) -> None:
        msg = DiagnosticArray()
        msg.status = [DiagnosticStatus(name="drive", hardware_id=self.unit,
                                       values=[KeyValue(key="unit_id", value=self.unit)])]
        self.diag.publish(msg)


def test_live_audit_measures_the_running_graph(ros_context: object, tmp_path: Path) -> None:
    nodes = [StatePublisher(ros_context), DelayedController(ros_context, 0.020),
             CellReporter(ros_context, "arm-LIVE", "cd" * 32)]
    executor = SingleThreadedExecutor(context=ros_context)  # type: ignore[arg-type]
    for n in nodes:
        executor.add_node(n)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.01)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        code, report, _ = run(["--live", "2.5", "-o", str(tmp_path / "o")])
    finally:
        stop.set()
        thread.join(timeout=5)
        for n in nodes:
            executor.remove_node(n)
            n.destroy_node()
        executor.shutdown()
    assert len(report["measurements"]["latency"]) == 1, report["notes"]
    lat = report["measurements"]["latency"][0]
    assert lat["source"] == "live graph"
    assert lat["n"] >= 50
    # The controller holds each answer 20 ms, so no pair can be faster; the exact figure is
    # test_audit_latency's business (here the graph shares the GIL with the probe).
    assert 0.020 <= lat["obs_to_command_p50_s"] < 0.2
    assert report["inputs"]["live_s"] == 2.5
    assert report["units"] == {"live graph": "arm-LIVE"}
    safety = next(r for r in report["rows"] if r["gap"] == "safety")
    assert any("safety filter running on the live graph" in e for e in safety["evidence"])


def test_calibration_spec_is_the_simulator_model_when_no_spec_is_given(tmp_path: Path) -> None:
    cal = tmp_path / "cal.yaml"
    cal.write_text("nominal: {mass_scale: 1.02}\nrandomization:\n  terms:\n    action_delay: "
                   "{operation: abs, distribution: uniform, range: [0.004, 0.006], mode: reset}\n")
    sim, source = sim_model_for(None, [str(cal)])
    assert sim is not None and source == f"{cal} (randomization)"
    assert sim.latency.action_delay_s == (0.004, 0.006)
    assert sim.latency.observation_delay_s == (0.0, 0.0)


def write_unit_calibration(path: Path, unit: str = UNIT, n_runs: int = 3,
                           age_days: float = 2.0) -> Path:
    """A calibration in the sysid room's file format, written and checked by its writer."""
    from sim2real_ros.sysid.calibration import write_calibration

    created = (datetime.now(timezone.utc) - timedelta(days=age_days)).isoformat()
    noise = {"joint_position_std_rad": [SIGMA_Q] * 6, "joint_velocity_std_rad_s": [3e-3] * 6,
             "rest_samples": 1500}
    data = {
        "unit": {"serial": unit, "cell": "cell-1", "tool": "gripper", "date": created,
                 "operator_note": "", "envelope_sha256": ""},
        "created_utc": created,
        "runs": [f"run{i}" for i in range(n_runs)],
        "n_runs": n_runs,
        "nominal": {"mass_scale": 1.03, "joint_damping_nms": [0.6] * 6},
        "confidence": {}, "spread": {},
        "latency": {"action_latency_s": 0.008, "observation_latency_s": 0.001},
        "noise": noise,
        "randomization": {"terms": {
            "link_mass": {"operation": "scale", "distribution": "uniform",
                          "range": [0.98, 1.02], "mode": "reset"},
            "action_delay": {"operation": "abs", "distribution": "uniform",
                             "range": [0.006, 0.010], "mode": "reset"},
            "observation_delay": {"operation": "abs", "distribution": "uniform",
                                  "range": [0.0, 0.002], "mode": "reset"},
            "joint_position_noise": {"operation": "abs", "distribution": "uniform",
                                     "range": [0.8 * SIGMA_Q, 1.25 * SIGMA_Q], "mode": "reset"},
            "joint_velocity_noise": {"operation": "abs", "distribution": "uniform",
                                     "range": [0.0024, 0.00375], "mode": "reset"},
        }},
    }
    return write_calibration(data, path)


def test_audit_through_a_sysid_calibration_file(tmp_path: Path) -> None:
    cal = write_unit_calibration(tmp_path / f"{UNIT}.yaml")
    bag = write_cell_bag(tmp_path / "run1", seconds=2.0)
    args = ["--calibration", str(cal), "--bag", str(bag), "--unit", UNIT,
            "--hil-record", str(hil(tmp_path / "hil.json"))]
    code, report, _ = run([*args, "-o", str(tmp_path / "o")])
    status = rows(report)
    assert report["inputs"]["spec"] == f"{cal} (randomization)"
    assert status["dynamics"] == "green"
    assert status["actuator"] == "green"
    # The calibrated spec models noise but no encoder bias/drift and no F/T noise.
    sensor = next(r for r in report["rows"] if r["gap"] == "sensor")
    assert sensor["status"] == "amber"
    assert any("bias or drift" in m for m in sensor["missing"])
    assert any(m["source"] == f"calibration {cal}" for m in report["measurements"]["noise"])
    # 7 ms graph + 9 ms identified drive/sensor delay = 16 ms against the calibrated [6, 12] ms.
    latency = next(r for r in report["rows"] if r["gap"] == "latency")
    assert any("p50 16.0 ms" in e and "covered" in e and "NOT" not in e
               for e in latency["evidence"])
    assert code == 0
    # Too old, too few runs, another unit: each turns the dynamics row amber.
    for name, kw in (("old", {"age_days": 31}), ("few", {"n_runs": 2}),
                     ("other", {"unit": "arm-SN0001"})):
        c = write_unit_calibration(tmp_path / f"{name}.yaml", **kw)
        _, rep, _ = run(["--calibration", str(c), "--unit", UNIT, "-o", str(tmp_path / name)])
        assert rows(rep)["dynamics"] == "amber", name


def write_suite_record(path: Path, envelope: Path, fail: str = "", drop: tuple[str, ...] = ()
                       ) -> Path:
    """A fault record as the safety suite writes it (its own writer and result type)."""
    from sim2real_ros.safety.faults import FAULT_GAPS, FaultResult, write_fault_record

    names = {n: g for n, g in FAULT_GAPS.items() if n not in drop}
    results = [FaultResult(n, g, True, n != fail, 1.0, "test") for n, g in names.items()]
    write_fault_record(path, results, file_sha256(envelope))
    return path


def test_audit_through_the_safety_suites_fault_record(tmp_path: Path) -> None:
    envelope = tmp_path / "envelope.yaml"
    envelope.write_text("version: 1\n")
    base = ["--envelope", str(envelope), "--bag", str(write_cell_bag(tmp_path / "run1", 1.5))]
    # A record without the out-of-envelope command leaves the bounds untested.
    rec = write_suite_record(tmp_path / "faults.json", envelope, drop=("command_beyond_envelope",))
    _, report, _ = run([*base, "--fault-record", str(rec), "-o", str(tmp_path / "a")])
    safety = next(r for r in report["rows"] if r["gap"] == "safety")
    latency = next(r for r in report["rows"] if r["gap"] == "latency")
    assert safety["status"] == "amber" and safety["missing"] == ["fault-test bounds"]
    assert latency["status"] == "green", latency
    # The whole suite (watchdog, fallback, e-stop, rollback and bounds) turns the row green.
    full = write_suite_record(tmp_path / "faults2.json", envelope)
    _, report, _ = run([*base, "--fault-record", str(full), "-o", str(tmp_path / "b")])
    assert rows(report)["safety"] == "green"
    failed = write_suite_record(tmp_path / "faults3.json", envelope, fail="force_spike")
    code, report, _ = run([*base, "--fault-record", str(failed), "-o", str(tmp_path / "c")])
    assert rows(report)["safety"] == "red" and code == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"envelope_sha256": "x", "created_utc": "", "faults": []}))
    assert main(["audit", "--fault-record", str(bad), "-o", str(tmp_path / "d")]) == 2

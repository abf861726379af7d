"""Scripted observation faults: the injector core, its node, and its place in the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import spin_until
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState

from sim2real_ros.adapters.faults import ObservationFault, ObservationFaultInjector
from sim2real_ros.graph import FAULT_INJECTOR, GraphArgs, build_graph
from sim2real_ros.ros.graph_util import get_remote_parameters, set_remote_parameters
from sim2real_ros.ros.qos import STATE_QOS


def test_a_healthy_injector_passes_observations_through_untouched() -> None:
    inj = ObservationFaultInjector(seed=1)
    q, qd = np.arange(6.0), np.ones(6)
    out_q, out_qd = inj.apply(q, qd)
    assert out_q is q and out_qd is qd and inj.applied == 0


def test_an_active_fault_offsets_positions_and_adds_seeded_velocity_noise() -> None:
    a, b = ObservationFaultInjector(seed=7), ObservationFaultInjector(seed=7)
    for inj in (a, b):
        inj.fault = ObservationFault(position_offset_rad=0.5, velocity_noise_rad_s=2.0)
    q, qd = np.zeros(6), np.zeros(6)
    qa, qda = a.apply(q, qd)
    qb, qdb = b.apply(q, qd)
    assert np.allclose(qa, 0.5) and np.array_equal(qda, qdb)  # same seed, same noise
    assert np.std(np.concatenate([a.apply(q, qd)[1] for _ in range(500)])) == pytest.approx(
        2.0, rel=0.1)
    assert np.all(q == 0) and np.all(qd == 0)  # inputs untouched


@pytest.mark.parametrize("kwargs", [{"position_offset_rad": float("nan")},
                                    {"velocity_noise_rad_s": -1.0}])
def test_an_invalid_fault_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be finite"):
        ObservationFault(**kwargs)


@pytest.mark.parametrize("backend", ["sim", "real"])
def test_the_injector_sits_in_front_of_one_node_only(backend: str) -> None:
    g = build_graph(GraphArgs(backend=backend)).with_fault_injector("policy_node")
    names = g.names()
    assert names.index(FAULT_INJECTOR[0]) == names.index("policy_node") - 1
    assert g.node("policy_node").remappings[0] == ("joint_states", FAULT_INJECTOR[2])
    assert [s for s, _ in g.node("policy_node").remappings].count("joint_states") == 1
    for n in g.nodes:
        if n.name not in ("policy_node", FAULT_INJECTOR[0]):
            assert FAULT_INJECTOR[2] not in dict(n.remappings).values()
    expected = "/joint_states" if backend == "real" else None
    assert dict(g.node(FAULT_INJECTOR[0]).remappings).get("joint_states") == expected


def test_injector_node_glitches_joint_states_while_its_parameters_say_so(
    ros_context: object,
) -> None:
    from sim2real_ros.adapters.fault_node import FaultInjector

    inj = FaultInjector(context=ros_context)
    peer = Node("peer", context=ros_context)
    got: list[JointState] = []
    peer.create_subscription(JointState, FAULT_INJECTOR[2], got.append, STATE_QOS)
    pub = peer.create_publisher(JointState, "joint_states", STATE_QOS)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(inj)
    ex.add_node(peer)

    def send_and_get() -> JointState:
        n = len(got)
        msg = JointState(name=[f"j{i}" for i in range(3)], position=[0.1, 0.2, 0.3],
                         velocity=[0.0, 0.0, 0.0])
        msg.header.stamp.sec = 42
        assert spin_until(ex, lambda: pub.get_subscription_count() > 0, 5.0)
        pub.publish(msg)
        assert spin_until(ex, lambda: len(got) > n, 5.0)
        return got[-1]

    clean = send_and_get()
    assert list(clean.position) == [0.1, 0.2, 0.3] and clean.header.stamp.sec == 42
    assert set_remote_parameters(peer, ex, "/fault_injector",
                                 {"position_offset_rad": 1.0, "velocity_noise_rad_s": 0.5}) == []
    assert get_remote_parameters(peer, ex, "/fault_injector", ["position_offset_rad"]) == {
        "position_offset_rad": 1.0}
    bad = send_and_get()
    assert np.allclose(bad.position, [1.1, 1.2, 1.3])
    assert np.any(np.asarray(bad.velocity) != 0.0) and bad.header.stamp.sec == 42
    refused = set_remote_parameters(peer, ex, "/fault_injector", {"velocity_noise_rad_s": -1.0})
    assert refused and "velocity_noise_rad_s" in refused[0]
    assert set_remote_parameters(peer, ex, "/fault_injector", {"position_offset_rad": 0.0,
                                                               "velocity_noise_rad_s": 0.0}) == []
    assert list(send_and_get().position) == [0.1, 0.2, 0.3]
    ex.shutdown()
    inj.destroy_node()
    peer.destroy_node()


CALIBRATION = """\
unit: {serial: arm-SN1234}
created_utc: '2026-01-01T00:00:00+00:00'
runs: [run1]
n_runs: 1
nominal: {}
latency: {}
noise: {}
randomization: {}
"""


def test_unit_check_runs_only_on_a_calibrated_real_arm(tmp_path: Path) -> None:
    cal = tmp_path / "arm-SN1234.yaml"
    cal.write_text(CALIBRATION)
    real = build_graph(GraphArgs(backend="real", calibration=str(cal)))
    assert real.node("unit_check").parameter_dict()["calibration_file"] == str(cal.resolve())
    assert real.node("unit_check").restartable  # a monitor: its death must not stop the arm
    assert "unit_check" not in build_graph(GraphArgs(backend="real")).names()
    sim = build_graph(GraphArgs(backend="sim", calibration=str(cal)))
    assert "unit_check" not in sim.names()
    assert sim.node("sim_bridge").parameter_dict()["calibration_file"] == str(cal.resolve())


@pytest.mark.parametrize("live, level, fragment", [
    ("arm-SN9999", 2, "UNIT MISMATCH: live 'arm-SN9999', calibration 'arm-SN1234'"),
    ("arm-SN1234", 0, "live arm is the calibrated unit 'arm-SN1234'"),
])
def test_unit_check_node_reports_whether_the_live_arm_is_the_calibrated_unit(
    tmp_path: Path, ros_context: object, live: str, level: int, fragment: str
) -> None:
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.parameter import Parameter

    from sim2real_ros.adapters.unit_node import UnitCheck
    from sim2real_ros.ros.diagnostics import make_status, status_level

    cal = tmp_path / "arm-SN1234.yaml"
    cal.write_text(CALIBRATION)
    check = UnitCheck(context=ros_context, parameter_overrides=[
        Parameter("calibration_file", value=str(cal)),
        Parameter("diagnostics_period_s", value=0.1)])
    peer = Node("driver_stand_in", context=ros_context)
    got: list[object] = []
    pub = peer.create_publisher(DiagnosticArray, "/diagnostics", STATE_QOS)
    peer.create_subscription(
        DiagnosticArray, "/diagnostics",
        lambda m: got.extend(s for s in m.status if s.name.startswith("unit_check:")), STATE_QOS)
    # The stand-in driver reports its unit at 20 Hz, as a driver's diagnostics would.
    peer.create_timer(0.05, lambda: pub.publish(DiagnosticArray(
        status=[make_status("arm: drive", 0, "ok", {"unit_id": live})])))
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(check)
    ex.add_node(peer)

    def report() -> bool:
        return check.live_unit_id == live and bool(got) and fragment in got[-1].message

    assert spin_until(ex, report, 10.0), [s.message for s in got[-3:]]  # type: ignore[attr-defined]
    assert status_level(got[-1]) == level  # type: ignore[arg-type]
    ex.shutdown()
    check.destroy_node()
    peer.destroy_node()

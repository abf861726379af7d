"""sysid_recorder on real rclpy/DDS: exact message counts in the bag, and a whole excitation run
against the sim bridge in separate processes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from conftest import spin_until
from geometry_msgs.msg import WrenchStamped
from mcap.reader import make_reader
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import array_to_multiarray, arrays_to_joint_state, ns_to_stamp
from sim2real_ros.sysid import bags, excitation
from sim2real_ros.sysid.node import SysidRecorder
from sim2real_ros.sysid.runs import load_run

JOINTS = ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint",
          "wrist_2_joint", "wrist_3_joint"]
RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000,
                      reliability=ReliabilityPolicy.RELIABLE)


def _recorder(ctx: object, tmp_path: Path, **params: object) -> SysidRecorder:
    overrides = {"unit_serial": "SN-R", "output_dir": str(tmp_path), "run_name": "rt",
                 "excitation": "none", "duration_s": 0.0, **params}
    return SysidRecorder(context=ctx, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])


def test_recorder_writes_every_published_message_once(ros_context: object,
                                                      tmp_path: Path) -> None:
    rec = _recorder(ros_context, tmp_path)
    src = Node("sysid_test_source", context=ros_context)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(rec)
    ex.add_node(src)
    pubs = {
        "js": src.create_publisher(JointState, "joint_states", RELIABLE),
        "cmd": src.create_publisher(Float64MultiArray, "forward_position_controller/commands",
                                    RELIABLE),
        "ft": src.create_publisher(WrenchStamped, "force_torque_sensor_broadcaster/wrench",
                                   RELIABLE),
    }
    assert spin_until(ex, lambda: all(p.get_subscription_count() >= 1 for p in pubs.values()),
                      10.0)
    n = 300
    for k in range(n):
        stamp = ns_to_stamp(10**18 + k * 2_000_000)
        pubs["js"].publish(arrays_to_joint_state(JOINTS, stamp, position=np.full(6, 1e-3 * k),
                                                 velocity=np.zeros(6), effort=np.ones(6)))
        w = WrenchStamped()
        w.header.stamp = stamp
        pubs["ft"].publish(w)
        if k % 5 == 0:
            pubs["cmd"].publish(array_to_multiarray(np.full(6, 0.01 * k)))
        ex.spin_once(timeout_sec=0.0)
    bag = rec.bag
    assert bag is not None
    assert spin_until(ex, lambda: bag.counts.get("/joint_states", 0) == n
                      and bag.counts.get("/force_torque_sensor_broadcaster/wrench", 0) == n
                      and bag.counts.get("/forward_position_controller/commands", 0) == n // 5,
                      20.0), bag.counts
    client = src.create_client(Trigger, "sysid_recorder/stop")
    assert client.wait_for_service(timeout_sec=5.0)
    fut = client.call_async(Trigger.Request())
    assert spin_until(ex, fut.done, 5.0) and fut.result().success
    ex.remove_node(rec)
    rec.destroy_node()
    src.destroy_node()

    path = tmp_path / "rt"
    counts = bags.count_messages(path)
    assert counts["/joint_states"] == n
    assert counts["/force_torque_sensor_broadcaster/wrench"] == n
    assert counts["/forward_position_controller/commands"] == n // 5
    mcap_counts: dict[str, int] = {}
    (f,) = path.glob("*.mcap")
    with f.open("rb") as fh:
        for _s, channel, _m in make_reader(fh).iter_messages():
            mcap_counts[channel.topic] = mcap_counts.get(channel.topic, 0) + 1
    for topic in ("/joint_states", "/force_torque_sensor_broadcaster/wrench",
                  "/forward_position_controller/commands"):
        assert mcap_counts[topic] == counts[topic]
    js = bags.read_joint_states(path, JOINTS)
    np.testing.assert_allclose(js.position[:, 0], 1e-3 * np.arange(n))  # in order, intact
    info = bags.bag_info(path)
    assert info.metadata["unit"]["serial"] == "SN-R" and info.status == "complete"
    assert len(info.metadata["envelope_sha256"]) == 64


def test_recorder_refuses_to_start_without_a_unit_or_over_an_existing_bag(
        ros_context: object, tmp_path: Path) -> None:
    import pytest

    with pytest.raises(ConfigError, match="unit_serial"):
        _recorder(ros_context, tmp_path, unit_serial="")
    (tmp_path / "rt").mkdir()
    with pytest.raises(ConfigError, match="never overwritten"):
        _recorder(ros_context, tmp_path)


def test_excitation_waits_for_the_command_path_and_aborts_when_it_never_connects(
        ros_context: object, tmp_path: Path) -> None:
    rec = _recorder(ros_context, tmp_path, excitation="multisine", duration_s=2.0,
                    settle_s=0.1, command_path_timeout_s=1.0, joint_states_timeout_s=5.0)
    src = Node("sysid_test_arm", context=ros_context)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(rec)
    ex.add_node(src)
    js = src.create_publisher(JointState, "joint_states", RELIABLE)
    sent: list[JointState] = []
    assert spin_until(ex, lambda: js.get_subscription_count() >= 1, 10.0)

    def arm_publishes() -> None:
        js.publish(arrays_to_joint_state(JOINTS, ns_to_stamp(time.time_ns()),
                                         position=np.zeros(6), velocity=np.zeros(6)))

    timer = src.create_timer(0.01, arm_publishes)
    # joint_states flow, but nobody listens to the recorder's commands: it must not start
    assert not spin_until(ex, lambda: rec.phase != "waiting", 0.6)
    # and after command_path_timeout_s it gives up with a reason an operator can act on
    assert spin_until(ex, lambda: rec.phase == "aborted", 5.0), rec.phase
    assert "no subscriber on /policy/joint_command" in rec.reason
    assert "safety filter" in rec.reason
    src.create_subscription(JointState, "policy/joint_command", sent.append, RELIABLE)
    spin_until(ex, lambda: False, 0.3)
    assert not sent  # nothing was ever commanded
    timer.cancel()
    ex.remove_node(rec)
    rec.destroy_node()
    src.destroy_node()
    info = bags.bag_info(tmp_path / "rt")
    assert info.status.startswith("aborted: command path not connected")


def test_excitation_through_the_graph_records_a_fittable_run(node_processes: object,
                                                             ros_context: object,
                                                             tmp_path: Path) -> None:
    # The sim bridge is the arm; a relay stands in for the safety filter's pass-through in
    # stage full (the filter itself is tested by its own room).
    sim = node_processes.start("sim2real_ros.sim.node", ros_args=[  # type: ignore[attr-defined]
        "-p", "randomize:=false"], name="sim_bridge")
    rec = node_processes.start("sim2real_ros.sysid.node", ros_args=[  # type: ignore[attr-defined]
        "-p", "unit_serial:=SN-G", "-p", f"output_dir:={tmp_path}", "-p", "run_name:=g",
        "-p", "duration_s:=2.0", "-p", "settle_s:=0.6", "-p", "exit_when_done:=true",
        "-p", "abort_tracking_error_rad:=1.0", "-p", "joint_states_timeout_s:=2.0",
        "-p", "latency_probe_moves:=6", "-p", "latency_probe_hold_s:=0.3"],
        name="recorder")
    relay = Node("sysid_test_relay", context=ros_context)
    out = relay.create_publisher(Float64MultiArray, "forward_position_controller/commands",
                                 RELIABLE)
    relay.create_subscription(JointState, "policy/joint_command",
                              lambda m: out.publish(array_to_multiarray(np.array(m.position))),
                              RELIABLE)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(relay)
    deadline = time.monotonic() + 90.0
    while rec.poll() is None and time.monotonic() < deadline and sim.poll() is None:
        ex.spin_once(timeout_sec=0.05)
    log = node_processes.log(rec)  # type: ignore[attr-defined]
    assert rec.poll() == 0, log + node_processes.log(sim)  # type: ignore[attr-defined]
    run = load_run(tmp_path / "g", JOINTS)
    assert run.unit_serial == "SN-G"
    assert run.metadata["excitation"]["kind"] == "multisine"
    assert np.ptp(run.cmd, axis=0).min() > 1e-3, log  # every joint was excited
    assert np.ptp(run.q, axis=0).min() > 1e-3, log  # and moved
    # the bridge's 500 Hz, recorded as it came (a starved host may slow the bridge itself)
    assert 150.0 < 1.0 / run.sample_period_s < 700.0, (run.sample_period_s, log)
    # The excitation and its latency probe went out sampled on the 100 Hz command grid, not
    # at the timer's wall-clock instants (which the filter read as jerk, docs/sysid.md): the
    # commands after the hold are exactly the trajectory at k / 100 s.
    meta = run.metadata["excitation"]
    assert meta["latency_probe"]["moves"] == 6
    env = excitation.ExcitationEnvelope.from_arm(load_arm(default_urdf()), 0.3, 0.3, 3.0)
    exc = excitation.append_latency_probe(
        excitation.make_excitation("multisine", np.array(meta["center_rad"]), env, 2.0, 0.3,
                                   0.2, 2.0, seed=0), env, 6, hold_s=0.3, seed=0)
    sent = bags.read_joint_commands(tmp_path / "g", JOINTS, "policy/joint_command").values
    hold = np.flatnonzero(np.all(np.abs(sent - exc.q[0]) < 1e-12, axis=1))
    first = int(hold[np.flatnonzero(np.diff(hold) > 1)[0]] + 1) if np.any(
        np.diff(hold) > 1) else int(hold[-1] + 1)
    n = int(exc.duration_s * 100) - 1
    want = np.array([exc.at((k + 1) / 100.0) for k in range(n)])
    np.testing.assert_allclose(sent[first:first + n], want, atol=1e-9, rtol=0)

"""The sim_bridge node with real rclpy: in-process and as a separate process."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import spin_until
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from sim2real_ros.ros.convert import array_to_multiarray, stamp_to_s
from sim2real_ros.ros.diagnostics import status_values
from sim2real_ros.ros.qos import CLOCK_QOS, COMMAND_QOS, LATCHED_QOS, STATE_QOS
from sim2real_ros.sim.node import SimBridge

ELBOW = 2


class Probe:
    """A test node that records what the bridge publishes and sends it commands."""

    def __init__(self, ctx: Any) -> None:
        self.node = Node("sim_probe", context=ctx)
        self.states: list[tuple[float, JointState]] = []
        self.draws: list[dict] = []
        self.diag: list[dict[str, str]] = []
        self.clock: list[float] = []
        self.images: list[Image] = []
        n = self.node
        n.create_subscription(JointState, "joint_states",
                              lambda m: self.states.append((time.monotonic(), m)), STATE_QOS)
        n.create_subscription(String, "sim_bridge/randomization",
                              lambda m: self.draws.append(json.loads(m.data)), LATCHED_QOS)
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, STATE_QOS)
        n.create_subscription(Clock, "/clock", lambda m: self.clock.append(stamp_to_s(m.clock)),
                              CLOCK_QOS)
        n.create_subscription(Image, "camera/image_raw", self.images.append, STATE_QOS)
        self.position = n.create_publisher(Float64MultiArray,
                                           "forward_position_controller/commands", COMMAND_QOS)
        self.reset = n.create_client(Trigger, "sim_bridge/reset")

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for st in msg.status:
            if st.name.startswith("sim_bridge"):
                self.diag.append(status_values(st))

    def last_position(self) -> np.ndarray:
        return np.array(self.states[-1][1].position)


def make_bridge(ctx: Any, **params: Any) -> SimBridge:
    base = {"diagnostics_period_s": 0.2, "randomize": False}
    base.update(params)
    return SimBridge(context=ctx,
                     parameter_overrides=[Parameter(k, value=v) for k, v in base.items()])


@pytest.fixture
def rig(ros_context: Any) -> Any:
    made: list[Any] = []
    executor = SingleThreadedExecutor(context=ros_context)

    def build(**params: Any) -> tuple[SimBridge, Probe, SingleThreadedExecutor]:
        bridge = make_bridge(ros_context, **params)
        probe = Probe(ros_context)
        executor.add_node(bridge)
        executor.add_node(probe.node)
        made.extend([bridge, probe.node])
        return bridge, probe, executor

    yield build
    for n in made:
        executor.remove_node(n)
        n.destroy_node()


def test_publishes_joint_states_at_the_configured_rate(rig: Any) -> None:
    _, probe, ex = rig(publish_rate_hz=100.0)
    assert spin_until(ex, lambda: len(probe.states) > 20, 10.0)
    start = len(probe.states)
    t0 = time.monotonic()
    spin_until(ex, lambda: False, 1.0)
    rate = (len(probe.states) - start) / (time.monotonic() - t0)
    # Wall-clock delivery on a shared 2-core host: generous below, strict above (a bridge that
    # published faster than configured would be wrong whatever the load).
    assert 0.5 * 100.0 < rate < 1.05 * 100.0
    stamps = np.array([stamp_to_s(m.header.stamp) for _, m in probe.states[start:]])
    # Never faster than configured; late ticks under load only stretch the period.
    assert 0.95 / 100.0 < np.median(np.diff(stamps)) < 1.6 / 100.0
    msg = probe.states[-1][1]
    assert list(msg.name) == ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint",
                              "wrist_1_joint", "wrist_2_joint", "wrist_3_joint"]
    assert len(msg.position) == len(msg.velocity) == len(msg.effort) == 6


def test_follows_position_commands(rig: Any) -> None:
    _, probe, ex = rig()
    target = np.array([0.2, 0.3, 0.4, 0.1, 0.2, 0.3])
    assert spin_until(ex, lambda: len(probe.states) > 5, 10.0)
    probe.position.publish(array_to_multiarray(target))
    assert spin_until(ex, lambda: np.allclose(probe.last_position(), target, atol=0.01), 10.0)


def test_bad_commands_are_rejected_counted_and_the_last_valid_one_kept(rig: Any) -> None:
    _, probe, ex = rig()
    good = np.zeros(6)
    good[ELBOW] = 0.3
    assert spin_until(ex, lambda: len(probe.states) > 5, 10.0)
    probe.position.publish(array_to_multiarray(good))
    spin_until(ex, lambda: False, 0.2)
    probe.position.publish(array_to_multiarray(np.zeros(5)))
    nan = good.copy()
    nan[0] = float("nan")
    probe.position.publish(array_to_multiarray(nan))
    inf = good.copy()
    inf[1] = float("inf")
    probe.position.publish(array_to_multiarray(inf))
    assert spin_until(
        ex, lambda: bool(probe.diag) and probe.diag[-1]["commands_rejected"] == "3", 10.0)
    assert probe.diag[-1]["commands_received"] == "4"
    assert "non-finite" in probe.diag[-1]["last_reject_reason"]
    assert spin_until(ex, lambda: abs(probe.last_position()[ELBOW] - 0.3) < 0.01, 10.0)
    assert abs(probe.last_position()[0]) < 1e-3


def test_the_longest_gap_between_commands_is_reported_as_the_arm_saw_it(rig: Any) -> None:
    _, probe, ex = rig()
    assert spin_until(ex, lambda: len(probe.states) > 5, 10.0)
    for _ in range(5):  # a 100 Hz stream ...
        probe.position.publish(array_to_multiarray(np.zeros(6)))
        spin_until(ex, lambda: False, 0.01)
    spin_until(ex, lambda: False, 0.35)  # ... a 350 ms outage ...

    def stream(seconds: float) -> None:  # ... and the stream is back
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            probe.position.publish(array_to_multiarray(np.zeros(6)))
            spin_until(ex, lambda: False, 0.01)

    stream(0.1)
    n = len(probe.diag)
    stream(0.6)  # at least two full 0.2 s report windows of a steady stream
    assert len(probe.diag) >= n + 2
    reports = probe.diag[n:]
    assert max(float(r["command_gap_max_total_s"]) for r in reports) >= 0.35
    # A window of the steady stream reports its own gaps (loaded host: generous), not the outage.
    assert min(float(r["command_gap_max_s"]) for r in reports) < 0.2


def test_reset_draws_anew_from_the_seed_parameter(rig: Any) -> None:
    bridge, probe, ex = rig(randomize=True, seed=3, unit_id="sim-test")
    assert spin_until(ex, lambda: len(probe.draws) >= 1, 10.0)
    first = probe.draws[-1]
    assert first["unit_id"] == "sim-test" and first["seed"] == 3
    assert probe.reset.wait_for_service(timeout_sec=5.0)
    bridge.set_parameters([Parameter("seed", value=42)])
    future = probe.reset.call_async(Trigger.Request())
    assert spin_until(ex, future.done, 10.0) and future.result().success
    assert spin_until(ex, lambda: len(probe.draws) >= 2, 10.0)
    second = probe.draws[-1]
    assert second["seed"] == 42 and second["episode"] == first["episode"] + 1
    assert second["values"] != first["values"]
    assert json.loads(future.result().message)["seed"] == 42


def test_lockstep_advances_sim_time_only_when_commanded(rig: Any) -> None:
    _, probe, ex = rig(clock_mode="lockstep", lockstep_timeout_s=30.0, control_period_s=0.01)
    assert spin_until(ex, lambda: bool(probe.clock), 5.0)
    before = max(probe.clock)
    spin_until(ex, lambda: False, 0.3)
    assert max(probe.clock) == before  # nothing commanded: the sim waits
    for k in range(1, 6):
        probe.position.publish(array_to_multiarray(np.zeros(6)))
        assert spin_until(ex, lambda k=k: max(probe.clock) >= before + 0.01 * k - 1e-9, 5.0)
    spin_until(ex, lambda: False, 0.3)
    assert max(probe.clock) - before == pytest.approx(0.05, abs=1e-6)
    stamps = [stamp_to_s(m.header.stamp) for _, m in probe.states]
    assert stamps == sorted(stamps) and stamps[-1] <= max(probe.clock) + 1e-9


def test_freerun_waits_for_nothing_and_stamps_with_sim_time(rig: Any) -> None:
    _, probe, ex = rig(clock_mode="freerun", publish_rate_hz=500.0, camera_enabled=True,
                       camera_rate_hz=20.0)
    assert spin_until(ex, lambda: len(probe.clock) > 300 and probe.images, 20.0)
    stamps = np.array([stamp_to_s(m.header.stamp) for _, m in probe.states])
    assert np.all(np.diff(stamps) > 0)
    # A subscriber that cannot keep up loses messages (nothing waits for it), but every stamp
    # sits on the 2 ms publish grid of sim time.
    steps = np.diff(stamps) / 0.002
    assert np.allclose(steps, np.round(steps), atol=1e-4)
    img = probe.images[-1]
    assert img.encoding == "rgb8" and len(img.data) == img.height * img.width * 3


def test_bridge_runs_as_a_process_and_follows_commands(node_processes: Any,
                                                       ros_context: Any) -> None:
    proc = node_processes.start("sim2real_ros.sim.node", name="sim_bridge",
                                ros_args=["-p", "randomize:=false", "-p", "unit_id:=proc"])
    probe = Probe(ros_context)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(probe.node)
    try:
        assert spin_until(ex, lambda: len(probe.states) > 10, 20.0), node_processes.log(proc)
        target = np.zeros(6)
        target[ELBOW] = -0.4
        target[0] = 0.5
        for _ in range(3):  # the first message may race discovery of the subscription
            probe.position.publish(array_to_multiarray(target))
            spin_until(ex, lambda: False, 0.1)
        assert spin_until(
            ex, lambda: np.allclose(probe.last_position(), target, atol=0.01), 10.0
        ), node_processes.log(proc)
        assert spin_until(ex, lambda: bool(probe.draws), 5.0)
        assert probe.draws[-1]["unit_id"] == "proc"
    finally:
        ex.remove_node(probe.node)
        probe.node.destroy_node()


def test_bad_randomization_file_refuses_to_start_naming_file_and_key(
    node_processes: Any, tmp_path: Path
) -> None:
    spec = tmp_path / "bad_spec.yaml"
    spec.write_text("terms:\n  joint_damping: {operation: scale, range: [2.0, 0.5], "
                    "mode: reset}\n")
    proc = node_processes.start("sim2real_ros.sim.node", name="bad_bridge",
                                ros_args=["-p", f"randomization_file:={spec}"])
    assert proc.wait(timeout=30) == 2
    log = node_processes.log(proc)
    assert str(spec) in log and "terms.joint_damping.range" in log

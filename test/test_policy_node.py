"""policy_node and task_sequencer in-process with real rclpy (Fast DDS on loopback)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import spin_until
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PointStamped, Vector3Stamped
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from sim2real_ros.config import ConfigError
from sim2real_ros.paths import default_urdf
from sim2real_ros.policy.node import PolicyNode
from sim2real_ros.policy.registry import PolicyIntegrityError, PolicyRegistry
from sim2real_ros.policy.task import TaskConfig, in_box
from sim2real_ros.policy.task_node import TaskSequencer
from sim2real_ros.robot.model import load_arm
from sim2real_ros.ros.convert import (
    array_to_multiarray,
    arrays_to_joint_state,
    s_to_stamp,
    stamp_to_ns,
)
from sim2real_ros.ros.diagnostics import WARN, status_level, status_values
from sim2real_ros.ros.qos import LATCHED_QOS, STATE_QOS

torch.set_num_threads(1)
ARM = load_arm(default_urdf())
HOME = np.array(TaskConfig().home_rad)


@pytest.fixture
def registry(tmp_path: Path) -> PolicyRegistry:
    """A private registry: v1 = shipped default (known-good), v2 = a copy promoted nowhere."""
    reg = PolicyRegistry(tmp_path / "reg")
    policy, _ = reg.load(1)
    reg.add(policy, {"note": "candidate"}, parent=1)
    return reg


class Probe:
    """A test node that plays the arm and the task, and records what the policy node says."""

    def __init__(self, ctx: object) -> None:
        self.node = Node("probe", context=ctx)
        self.js_pub = self.node.create_publisher(JointState, "joint_states", STATE_QOS)
        self.tgt_pub = self.node.create_publisher(PointStamped, "task/target", STATE_QOS)
        self.commands: list[JointState] = []
        self.confidence: list[Vector3Stamped] = []
        self.versions: list[dict] = []
        self.diags: list[DiagnosticArray] = []
        self.node.create_subscription(JointState, "policy/joint_command",
                                      self.commands.append, STATE_QOS)
        self.node.create_subscription(Vector3Stamped, "policy/confidence",
                                      self.confidence.append, STATE_QOS)
        self.node.create_subscription(String, "policy_node/active_version",
                                      lambda m: self.versions.append(json.loads(m.data)),
                                      LATCHED_QOS)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.diags.append,
                                      STATE_QOS)
        self.rollback = self.node.create_client(Trigger, "policy_node/rollback")
        self.sent_stamps_ns: list[int] = []

    def send_state(self, q: np.ndarray = HOME, age_s: float = 0.0) -> None:
        # Stamped with the shared clock, as a driver on the same host stamps its states.
        t_s = self.node.get_clock().now().nanoseconds * 1e-9 - age_s
        msg = arrays_to_joint_state(ARM.joint_names, s_to_stamp(t_s), position=q,
                                    velocity=np.zeros(6), effort=np.zeros(6))
        self.sent_stamps_ns.append(stamp_to_ns(msg.header.stamp))
        self.js_pub.publish(msg)

    def send_target(self, p: np.ndarray) -> None:
        msg = PointStamped()
        msg.header.frame_id = "base_link"
        msg.point.x, msg.point.y, msg.point.z = (float(v) for v in p)
        self.tgt_pub.publish(msg)

    def policy_status(self) -> list:
        out = []
        for arr in self.diags:
            out += [s for s in arr.status if s.name.startswith("policy_node")]
        return out


def _setup(ros_context: object, registry: PolicyRegistry, **params: object
           ) -> tuple[PolicyNode, Probe, SingleThreadedExecutor]:
    overrides = [Parameter("registry_path", value=str(registry.root)),
                 Parameter("diagnostics_period_s", value=0.2)]
    overrides += [Parameter(k, value=v) for k, v in params.items()]
    node = PolicyNode(context=ros_context, parameter_overrides=overrides)
    probe = Probe(ros_context)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(node)
    ex.add_node(probe.node)
    return node, probe, ex


def _drive(probe: Probe, ex: SingleThreadedExecutor, duration_s: float,
           target: np.ndarray | None = None, age_s: float = 0.0,
           until: Callable[[], bool] | None = None) -> bool:
    """Publish joint states at <= 200 Hz (and the target every 10th) while spinning.

    With `until`, stop as soon as it holds and treat `duration_s` as a deadline (a loaded
    machine may be slow; nothing here is a timing assertion); return whether it held.
    """
    end = time.monotonic() + duration_s
    k = 0
    while time.monotonic() < end:
        if until is not None and until():
            return True
        probe.send_state(age_s=age_s)
        if target is not None and k % 10 == 0:
            probe.send_target(target)
        k += 1
        # Serve every ready callback (one executor runs both nodes) before the next state,
        # so states are not queued behind each other and aged by the test itself.
        window = time.monotonic() + 0.005
        while time.monotonic() < window:
            ex.spin_once(timeout_sec=0.001)
    return until() if until is not None else True


def test_commands_carry_the_observation_stamp_and_confidence(ros_context, registry) -> None:
    node, probe, ex = _setup(ros_context, registry)
    target = ARM.tool_position(HOME) + np.array([0.1, 0.05, -0.05])
    assert spin_until(ex, lambda: probe.versions, 5.0)
    assert probe.versions[-1]["version"] == 1 and probe.versions[-1]["known_good"] == 1
    assert _drive(probe, ex, 20.0, target, until=lambda: len(probe.commands) >= 20)
    sent = set(probe.sent_stamps_ns)
    for cmd in probe.commands:
        assert stamp_to_ns(cmd.header.stamp) in sent  # answers a real observation
        assert list(cmd.name) == ARM.joint_names
        assert np.all(np.abs(np.array(cmd.position) - HOME) <= 0.25 + 1e-9)
    stamps = [stamp_to_ns(c.header.stamp) for c in probe.commands]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # each answered once
    conf = probe.confidence[-1]
    assert conf.vector.z == 1.0 and conf.vector.x >= 0.0 and np.isfinite(conf.vector.y)
    assert stamp_to_ns(conf.header.stamp) in sent
    # the arm does not move in this test, so the commanded target walks toward the goal
    moved = np.array(probe.commands[-1].position) - HOME
    assert np.linalg.norm(moved) > 0.02
    node.destroy_node()


@pytest.mark.parametrize("tolerance_rad", [0.0, 0.005])
def test_while_the_baseline_holds_the_arm_the_policy_moves_the_held_command(
        ros_context, registry, tolerance_rad: float) -> None:
    node, probe, ex = _setup(ros_context, registry,
                             executed_command_tolerance_rad=tolerance_rad)
    assert node.runner.own_tolerance_rad == tolerance_rad
    # The safety filter's output: the baseline holds the arm at HOME (shadow stage).
    executed = probe.node.create_publisher(Float64MultiArray,
                                           "forward_position_controller/commands", STATE_QOS)
    probe.node.create_timer(0.005, lambda: executed.publish(array_to_multiarray(HOME)))
    target = ARM.tool_position(HOME) + np.array([0.1, 0.05, -0.05])
    assert _drive(probe, ex, 20.0, target, until=lambda: len(probe.commands) >= 40)
    # Every proposal is within the tolerance and one step of the held command, never a walk
    # of its own (the previous test shows the walk when nothing else drives): with 0 each
    # step starts from the held command, with 5 mrad the policy's own target may drift that
    # far before it does.
    cfg = node.runner.task
    late = np.array([c.position for c in probe.commands[10:]])
    assert np.all(np.abs(late - HOME) <= tolerance_rad + cfg.max_step_rad + 1e-9)
    least = 30 if tolerance_rad == 0.0 else 2
    assert node.runner.adopted >= least

    def reported() -> bool:
        return any(int(status_values(st).get("steps_from_executed_command", 0)) >= least
                   for st in probe.policy_status())

    assert spin_until(ex, reported, 3.0)
    node.destroy_node()


def test_stale_observations_silence_the_node_and_diagnostics_say_so(ros_context,
                                                                     registry) -> None:
    node, probe, ex = _setup(ros_context, registry, stale_timeout_s=0.05)
    target = ARM.tool_position(HOME) + np.array([0.1, 0.0, 0.0])
    assert _drive(probe, ex, 20.0, target, until=lambda: len(probe.commands) >= 5)

    def spin_target_only(duration_s: float) -> None:
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            probe.send_target(target)
            window = time.monotonic() + 0.01
            while time.monotonic() < window:
                ex.spin_once(timeout_sec=0.001)

    # joint_states stop; the target keeps coming, so only the observation goes stale. First
    # let what was in flight be delivered (a loaded host may deliver it late), until the
    # node has been stale with no new joint state for a whole window.
    deadline = time.monotonic() + 20.0
    seq = -1
    while time.monotonic() < deadline:
        spin_target_only(0.3)
        if node._obs_seq == seq and node._state == "stale":
            break
        seq = node._obs_seq
    assert node._state == "stale"
    n_quiet, published = len(probe.commands), node._published
    spin_target_only(0.6)
    assert len(probe.commands) == n_quiet and node._published == published
    stale = [s for s in probe.policy_status() if status_values(s)["state"] == "stale"]
    assert stale, "diagnostics never reported stale"
    assert status_level(stale[-1]) == WARN and "publishing nothing" in stale[-1].message
    assert int(status_values(stale[-1])["stale_ticks"]) > 0
    # fresh data again: commands resume, starting from the measured position
    n_stale = len(probe.commands)
    assert _drive(probe, ex, 20.0, target, until=lambda: len(probe.commands) > n_stale)
    first = np.array(probe.commands[n_stale].position)
    assert np.all(np.abs(first - HOME) <= TaskConfig().max_step_rad + 1e-9)
    node.destroy_node()


def test_old_stamps_are_stale_under_stamp_timing_even_when_they_keep_arriving(
    ros_context, registry
) -> None:
    node, probe, ex = _setup(ros_context, registry, stale_timeout_s=0.05, stale_clock="stamp")
    target = ARM.tool_position(HOME) + np.array([0.1, 0.0, 0.0])
    def stale() -> list:
        return [s for s in probe.policy_status() if status_values(s)["state"] == "stale"]

    # states 200 ms old, delivered promptly
    assert _drive(probe, ex, 20.0, target, age_s=0.2, until=lambda: bool(stale()))
    _drive(probe, ex, 0.3, target, age_s=0.2)
    assert probe.commands == []
    assert "0.2" in stale()[-1].message and "(stamp)" in stale()[-1].message
    node.destroy_node()
    # the same stream under receipt timing (the default) is fresh: it arrives continuously
    node, probe, ex = _setup(ros_context, registry, stale_timeout_s=0.05)
    assert _drive(probe, ex, 20.0, target, age_s=0.2, until=lambda: len(probe.commands) > 0)
    node.destroy_node()


def test_no_target_means_no_command(ros_context, registry) -> None:
    node, probe, ex = _setup(ros_context, registry)
    def waiting() -> bool:
        return any(status_values(s)["state"] == "waiting_for_target"
                   for s in probe.policy_status())

    assert _drive(probe, ex, 20.0, until=waiting)
    _drive(probe, ex, 0.3)
    assert probe.commands == []
    node.destroy_node()


def test_rollback_service_switches_to_known_good_and_records_why(ros_context,
                                                                 registry) -> None:
    node, probe, ex = _setup(ros_context, registry, policy_version=2)
    target = ARM.tool_position(HOME) + np.array([0.1, 0.0, 0.0])
    assert spin_until(ex, lambda: probe.versions and probe.versions[-1]["version"] == 2, 5.0)
    assert _drive(probe, ex, 20.0, target, until=lambda: len(probe.confidence) > 0)
    assert probe.confidence[-1].vector.z == 2.0
    assert probe.rollback.wait_for_service(timeout_sec=5.0)
    fut = probe.rollback.call_async(Trigger.Request())
    assert spin_until(ex, fut.done, 5.0)
    resp = fut.result()
    assert resp.success and "version 2 -> known-good 1" in resp.message
    assert spin_until(ex, lambda: probe.versions[-1]["version"] == 1, 5.0)
    assert "rollback service call" in probe.versions[-1]["reason"]
    events = [e for e in registry.events() if e["event"] == "node_rollback"]
    assert events and events[-1]["from_version"] == 2 and events[-1]["to_version"] == 1
    assert events[-1]["reason"] == resp.message
    assert _drive(probe, ex, 20.0, target,
                  until=lambda: bool(probe.confidence) and probe.confidence[-1].vector.z == 1.0)
    node.destroy_node()


def test_rollback_refuses_a_tampered_known_good_and_keeps_running(ros_context,
                                                                  registry) -> None:
    node, probe, ex = _setup(ros_context, registry, policy_version=2)
    path = registry.path_of(1)
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert probe.rollback.wait_for_service(timeout_sec=5.0)
    fut = probe.rollback.call_async(Trigger.Request())
    assert spin_until(ex, fut.done, 5.0)
    resp = fut.result()
    assert not resp.success and "staying on version 2" in resp.message
    assert "sha256" in resp.message
    assert node.record is not None and node.record.version == 2
    node.destroy_node()


def test_tampered_policy_refuses_to_start(ros_context, registry) -> None:
    path = registry.path_of(2)
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(PolicyIntegrityError):
        PolicyNode(context=ros_context, parameter_overrides=[
            Parameter("registry_path", value=str(registry.root)),
            Parameter("policy_version", value=2)])


def test_policy_version_parameter_switches_after_verification(ros_context, registry) -> None:
    node, probe, ex = _setup(ros_context, registry)
    res = node.set_parameters([Parameter("policy_version", value=2)])[0]
    assert res.successful and node.record is not None and node.record.version == 2
    res = node.set_parameters([Parameter("policy_version", value=7)])[0]
    assert not res.successful and "policy_version = 7 refused" in res.reason
    assert node.record.version == 2
    node.destroy_node()


def test_out_of_range_rate_is_refused_at_start(ros_context, registry) -> None:
    with pytest.raises(ConfigError, match="rate_hz"):
        PolicyNode(context=ros_context, parameter_overrides=[
            Parameter("registry_path", value=str(registry.root)),
            Parameter("rate_hz", value=5000.0)])


def test_task_sequencer_cycles_seeded_reachable_targets(ros_context) -> None:
    seq = TaskSequencer(context=ros_context, parameter_overrides=[
        Parameter("seed", value=3), Parameter("targets", value=4),
        Parameter("dwell_s", value=0.3), Parameter("publish_rate_hz", value=50.0)])
    probe = Node("probe_targets", context=ros_context)
    got: list[PointStamped] = []
    probe.create_subscription(PointStamped, "task/target", got.append, STATE_QOS)
    ex = SingleThreadedExecutor(context=ros_context)
    ex.add_node(seq)
    ex.add_node(probe)
    spin_until(ex, lambda: False, 1.5)
    pts = {(round(m.point.x, 9), round(m.point.y, 9), round(m.point.z, 9)) for m in got}
    assert len(pts) >= 3, "targets did not change with the dwell time"
    cfg = TaskConfig()
    for p in pts:
        assert in_box(np.array(p), np.array(cfg.workspace_min_m), np.array(cfg.workspace_max_m))
    listed = {tuple(np.round(t, 9)) for t in seq.targets}
    assert pts <= listed
    assert all(m.header.frame_id == "base_link" for m in got)
    again = TaskSequencer("task_sequencer_b", context=ros_context, parameter_overrides=[
        Parameter("seed", value=3), Parameter("targets", value=4)])
    np.testing.assert_array_equal(again.targets, seq.targets)
    seq.destroy_node()
    again.destroy_node()


def test_task_sequencer_refuses_an_empty_box(ros_context) -> None:
    with pytest.raises(ConfigError, match="workspace_min_m/workspace_max_m"):
        TaskSequencer(context=ros_context, parameter_overrides=[
            Parameter("workspace_min_m", value=[3.0, 3.0, 3.0]),
            Parameter("workspace_max_m", value=[4.0, 4.0, 4.0])])


def test_a_policy_for_another_arm_refuses_to_start(ros_context, registry) -> None:
    from sim2real_ros.policy.model import EnsemblePolicy

    policy, _ = registry.load(1)
    other = EnsemblePolicy(policy.spec, policy.stats, policy.task,
                           [f"other_{n}" for n in policy.joint_names], net=policy.net)
    rec = registry.add(other, {"note": "wrong arm"}, parent=1)
    with pytest.raises(ConfigError, match="joint_names"):
        PolicyNode(context=ros_context, parameter_overrides=[
            Parameter("registry_path", value=str(registry.root)),
            Parameter("policy_version", value=rec.version)])

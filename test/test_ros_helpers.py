"""Message conversions, parameter schemas and diagnostics used by every node."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState

from sim2real_ros.config import ConfigError
from sim2real_ros.ros.convert import (
    MessageError,
    array_to_multiarray,
    array_to_wrench,
    arrays_to_joint_state,
    joint_state_to_arrays,
    multiarray_to_array,
    ns_to_stamp,
    s_to_stamp,
    stamp_to_ns,
    stamp_to_s,
    wrench_to_array,
)
from sim2real_ros.ros.diagnostics import ERROR, make_status, status_level, status_values
from sim2real_ros.ros.params import ParamSpec, declare_params

JOINTS = ["a", "b", "c"]


def _js(names: list[str], pos: list[float], vel: list[float] | None = None) -> JointState:
    msg = JointState()
    msg.header.stamp = s_to_stamp(12.5)
    msg.name = names
    msg.position = pos
    msg.velocity = vel or []
    return msg


def test_joint_state_is_reordered_into_configured_order() -> None:
    arr = joint_state_to_arrays(_js(["c", "a", "b", "gripper"], [3.0, 1.0, 2.0, 9.0]), JOINTS)
    np.testing.assert_array_equal(arr.position, [1.0, 2.0, 3.0])
    assert arr.velocity is None
    assert arr.stamp_s == 12.5


@pytest.mark.parametrize(
    "names, pos, vel, match",
    [
        (["a", "b"], [1.0, 2.0], None, "lacks joints"),
        (["a", "a", "b", "c"], [1.0, 1.0, 2.0, 3.0], None, "duplicate"),
        (["a", "b", "c"], [1.0, 2.0], None, "position has 2 values for 3 names"),
        (["a", "b", "c"], [1.0, 2.0, 3.0], [0.0], "velocity has 1 values"),
        (["a", "b", "c"], [], None, "no position"),
    ],
)
def test_malformed_joint_states_are_refused(
    names: list[str], pos: list[float], vel: list[float] | None, match: str
) -> None:
    with pytest.raises(MessageError, match=match):
        joint_state_to_arrays(_js(names, pos, vel), JOINTS)


def test_non_finite_values_pass_through_for_the_caller_to_judge() -> None:
    arr = joint_state_to_arrays(_js(JOINTS, [math.nan, math.inf, 0.0]), JOINTS)
    assert math.isnan(arr.position[0]) and math.isinf(arr.position[1])


def test_round_trips() -> None:
    msg = arrays_to_joint_state(JOINTS, s_to_stamp(1.25), position=np.array([1.0, 2.0, 3.0]))
    assert list(msg.position) == [1.0, 2.0, 3.0] and list(msg.velocity) == []
    with pytest.raises(MessageError, match=r"expected \(3,\)"):
        arrays_to_joint_state(JOINTS, s_to_stamp(0), position=np.zeros(2))
    np.testing.assert_array_equal(multiarray_to_array(array_to_multiarray([1, 2, 3]), 3), [1, 2, 3])
    with pytest.raises(MessageError, match="expected 4"):
        multiarray_to_array(array_to_multiarray([1, 2, 3]), 4)
    w = np.arange(6.0)
    np.testing.assert_array_equal(wrench_to_array(array_to_wrench(w, s_to_stamp(0), "ft")), w)
    assert stamp_to_ns(ns_to_stamp(1_234_567_890_123)) == 1_234_567_890_123
    assert stamp_to_s(s_to_stamp(3.000000001)) == pytest.approx(3.000000001, abs=1e-9)


def test_diagnostic_status_carries_level_and_values() -> None:
    st = make_status("safety", ERROR, "estop", {"count": 3, "rate_hz": 99.51234567})
    assert status_level(st) == ERROR
    assert status_values(st) == {"count": "3", "rate_hz": "99.5123"}


SPECS = [
    ParamSpec("rate_hz", 100.0, "control rate, Hz", low=1.0, high=1000.0),
    ParamSpec("stage", "shadow", "rollout stage", choices=("shadow", "full")),
    ParamSpec("limit_nm", 10.0, "torque limit, N·m", low=0.0, read_only=True),
]


def test_parameters_are_declared_with_descriptors_and_guarded(ros_context: object) -> None:
    node = Node("param_test", context=ros_context)
    try:
        values = declare_params(node, SPECS)
        assert values == {"rate_hz": 100.0, "stage": "shadow", "limit_nm": 10.0}
        desc = node.describe_parameter("rate_hz")
        assert "Hz" in desc.description
        assert desc.floating_point_range[0].to_value == 1000.0
        bad = node.set_parameters([Parameter("rate_hz", value=5000.0)])[0]
        assert not bad.successful and "rate_hz" in bad.reason and "5000" in bad.reason
        bad = node.set_parameters([Parameter("stage", value="sideways")])[0]
        assert not bad.successful and "shadow" in bad.reason
        ok = node.set_parameters([Parameter("stage", value="full")])[0]
        assert ok.successful
        ro = node.set_parameters([Parameter("limit_nm", value=1.0)])[0]
        assert not ro.successful
    finally:
        node.destroy_node()


def test_out_of_range_start_up_value_refuses_to_start(ros_context: object) -> None:
    node = Node(
        "param_bad",
        context=ros_context,
        parameter_overrides=[Parameter("stage", value="sideways")],
    )
    try:
        with pytest.raises(ConfigError, match=r"/param_bad: stage = 'sideways'"):
            declare_params(node, SPECS)
    finally:
        node.destroy_node()
    SingleThreadedExecutor(context=ros_context).shutdown()

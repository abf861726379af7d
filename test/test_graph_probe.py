"""ProbeCore: control rate, observation -> arm command latency, targets reached."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.adapters.probe import ProbeCore


def test_latency_is_arm_arrival_minus_the_stamp_of_the_decision_behind_it() -> None:
    core = ProbeCore()
    for k in range(100):
        t = 10.0 + 0.01 * k  # a 100 Hz loop
        core.on_joint_state(t, t)
        core.on_source_command("baseline", t + 0.003, t)  # the baseline answers in 3 ms
        core.on_arm_command(t + 0.004)  # the filter forwards 1 ms later
        core.on_arm_command(t + 0.009)  # a republished hold is not a new decision
    s = core.summary()
    assert s["obs_to_command_latency_ms"]["n"] == 100
    assert s["obs_to_command_latency_ms"]["p50"] == pytest.approx(4.0, abs=1e-6)
    assert s["obs_to_command_latency_ms"]["p99"] == pytest.approx(4.0, abs=1e-6)
    assert s["control_rate_hz"] == pytest.approx(199 / (0.99 + 0.005), rel=1e-6)
    assert s["joint_states_rate_hz"] == pytest.approx(100.0, rel=1e-6)
    assert s["obs_to_policy_command_latency_ms"]["n"] == 0


def test_policy_latency_comes_from_its_own_stamps() -> None:
    core = ProbeCore()
    for k, lag in enumerate([0.002, 0.004, 0.006]):
        core.on_source_command("policy", 1.0 + k + lag, 1.0 + k)
    lat = core.summary()["obs_to_policy_command_latency_ms"]
    assert lat["p50"] == pytest.approx(4.0)
    assert lat["n"] == 3


def test_a_target_counts_as_reached_once_the_tool_is_within_tolerance() -> None:
    core = ProbeCore(reach_tolerance_m=0.01)
    core.on_target(0.0, (0.5, 0.0, 0.5))
    for k, x in enumerate([0.3, 0.4, 0.48, 0.495, 0.492]):
        core.on_joint_state(0.1 * (k + 1), 0.1 * (k + 1), np.array([x, 0.0, 0.5]))
    core.on_target(5.0, (0.5, 0.0, 0.5))  # the same target again is the same visit
    core.on_target(5.0, (0.0, 0.5, 0.5))
    core.on_joint_state(5.1, 5.1, np.array([0.5, 0.0, 0.5]))
    s = core.summary()
    assert s["targets"] == 2 and s["targets_reached"] == 1
    first, second = core.targets
    assert first.min_distance_m == pytest.approx(0.005)
    assert first.reached_at_s == pytest.approx(0.4)
    assert second.reached_at_s is None


def test_source_timeline_records_changes_only() -> None:
    core = ProbeCore()
    for t, src in [(0.0, "baseline"), (1.0, "baseline"), (2.0, "policy"), (3.0, "baseline")]:
        core.on_active_source(t, src)
    assert core.source_timeline == [(0.0, "baseline"), (2.0, "policy"), (3.0, "baseline")]

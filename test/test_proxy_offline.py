"""The offline proxy harness: the teacher on the MuJoCo plant with the cell's timing, filter on."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.policy.expert import ExpertGains
from sim2real_ros.proxy.offline import (
    OfflineTiming,
    classify,
    evaluate_on_plant,
    teacher_runner,
)
from sim2real_ros.proxy.plant import ProxyPlant
from sim2real_ros.proxy.scoring import episode_targets
from sim2real_ros.proxy.unit import ProxyUnit
from sim2real_ros.robot.model import load_arm

ARM = load_arm(default_urdf())
ENVELOPE = share_path("config", "safety_envelope.yaml")


def _run(filter_on: bool, seed: int = 0, feed: bool = True) -> tuple[list, object]:
    runner = teacher_runner(gains=ExpertGains(lead_s=0.04), arm=ARM)
    targets = episode_targets(7919, 4, runner.task, ARM)
    unit = ProxyUnit.from_yaml(share_path("config", "proxy", "unit_proxy-SN0001.yaml"), ARM)
    return evaluate_on_plant(runner, targets, ProxyPlant(unit), OfflineTiming(seed=seed),
                             envelope_path=ENVELOPE if filter_on else None,
                             feed_executed=feed)


def test_teacher_reaches_the_proxy_targets_through_the_filter_and_repeats_bit_for_bit() -> None:
    res, c = _run(True)
    assert len(res) == 4
    assert sum(r.success for r in res) >= 3, [classify(r, 0.02) for r in res]
    assert 0 < c.commands and 0 <= c.onsets <= c.intervened <= c.commands
    assert sum(c.onset_limits.values()) >= c.onsets
    again, c2 = _run(True)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in res]
    assert c2.to_dict() == c.to_dict()
    # Without the filter nothing is projected; without the executed feed nothing is adopted.
    _, off = _run(False)
    assert off.intervened == 0 and not off.events
    _, nofeed = _run(True, feed=False)
    assert nofeed.adopted == 0


def test_classify_and_timing_checks() -> None:
    res, _ = _run(False)
    assert {classify(r, 0.02) for r in res} <= {"success", "near", "far"}
    with pytest.raises(ValueError, match="hop_s"):
        OfflineTiming(hop_s=(0.02, 0.01)).check()
    with pytest.raises(ValueError, match="obs_rate_hz"):
        OfflineTiming(obs_rate_hz=0.0).check()
    assert np.isfinite(res[0].final_distance_m)


def test_a_late_echo_of_the_executed_command_cascaded_the_exact_adoption_rule() -> None:
    """The executed command comes back 2-12 ms after the projection (after the runner's next
    step about a fifth of the time, as on a loaded graph). With exact matching (tolerance 0)
    the runner adopted the filter's trims one step late and the loop cascaded: it continued
    from the filter's command on most steps. The shipped tolerance leaves trims to the filter."""
    from pathlib import Path

    import sim2real_ros.policy as policy_pkg
    from sim2real_ros.policy.model import EnsemblePolicy
    from sim2real_ros.policy.runner import PolicyRunner

    pol = EnsemblePolicy.load(Path(policy_pkg.__file__).parent / "default" / "policy.pt")
    unit = ProxyUnit.from_yaml(share_path("config", "proxy", "unit_proxy-SN0001.yaml"), ARM)
    timing = OfflineTiming(feedback_hop_s=(0.002, 0.012))
    out = {}
    for tol in (0.0, 0.005):
        runner = PolicyRunner(pol, ARM, own_tolerance_rad=tol)
        targets = episode_targets(7919, 3, runner.task, ARM)
        res, c = evaluate_on_plant(runner, targets, ProxyPlant(unit), timing,
                                   envelope_path=ENVELOPE)
        out[tol] = (sum(r.success for r in res), c.adopted, c.commands)
    exact, tolerant = out[0.0], out[0.005]
    assert exact[1] > 0.5 * exact[2], out  # adopted on most steps
    assert tolerant[1] < 0.05 * tolerant[2], out
    assert tolerant[0] >= exact[0], out
    with pytest.raises(ValueError, match="feedback_hop_s"):
        OfflineTiming(feedback_hop_s=(0.0, 0.9)).check()


def test_the_experiments_safety_timing_is_declared_and_in_range() -> None:
    """The loaded-host overrides the experiment hands the filter: every key a declared
    parameter of the safety filter, every value inside its range (the node would refuse it at
    start-up otherwise, minutes into a run)."""
    from sim2real_ros.proxy.cell import safety_timing
    from sim2real_ros.safety.node import PARAMS

    specs = {p.name: p for p in PARAMS}
    overrides = safety_timing(0.1)
    assert overrides["late_command_grace_periods"] == 2.5
    assert overrides["command_timeout_s"] == 0.1
    for key, value in overrides.items():
        assert key in specs, key
        assert specs[key].check(value) is None, (key, value)
    assert safety_timing(0.0) == {}


def test_the_experiments_baseline_timing_is_declared_and_in_range() -> None:
    """The baseline's joint_states timeout grows with the filter's on a loaded host, and the
    override is a declared, in-range baseline parameter; 0 keeps the shipped value."""
    from sim2real_ros.proxy.cell import baseline_timing
    from sim2real_ros.safety.baseline_node import PARAMS

    specs = {p.name: p for p in PARAMS}
    overrides = baseline_timing(0.1)
    assert overrides == {"state_timeout_s": 0.2}
    for key, value in overrides.items():
        assert specs[key].check(value) is None, (key, value)
    assert baseline_timing(0.0) == {}


def test_the_limited_stage_refuses_a_policy_whose_interface_it_would_clip() -> None:
    """The shipped interface runs at 0.8 of the envelope, the limited stage at 0.5 of it:
    step 4 must say so up front instead of collecting a stage the monitor drops at once."""
    from dataclasses import replace

    from sim2real_ros.policy.task import TaskConfig, resolve_rate_limits
    from sim2real_ros.proxy.experiment import limited_stage_misfit
    from sim2real_ros.safety.envelope import load_envelope

    env = load_envelope(ENVELOPE, ARM)
    assert env.limited_scale == 0.5
    shipped = resolve_rate_limits(TaskConfig(), ARM)
    why = limited_stage_misfit(shipped, env)
    assert why is not None
    assert "max_velocity_rad_s" in why and "shoulder_pan_joint" in why
    assert "limited_scale 0.5" in why and str(env.path) in why
    slow = resolve_rate_limits(TaskConfig(limit_fraction=0.45), ARM)
    assert limited_stage_misfit(slow, env) is None
    assert limited_stage_misfit(replace(shipped, action_interface="step"), env) is None

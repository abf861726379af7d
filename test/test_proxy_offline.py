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

"""Shadow metrics on synthetic streams whose divergence is known exactly."""

from __future__ import annotations

import numpy as np
import pytest

from sim2real_ros.shadow.divergence import (
    ShadowAccumulator,
    StampMatcher,
    TrainingStats,
    WouldBeIntervention,
    align_by_stamp,
    percentiles,
    step_divergence,
    windows,
    within_k_sigma,
)
from sim2real_ros.shadow.gates import MetricsSettings

JOINTS = ["j1", "j2", "j3"]
PERIOD_NS = 10_000_000  # 100 Hz
# Powers of two: baseline + offset - baseline is exact in binary floating point.
OFFSET = np.array([2.0**-6, -(2.0**-5), 0.0])


def _baseline(k: int) -> np.ndarray:
    return np.array([k * 2.0**-10, -k * 2.0**-11, 0.5])


def _settings(**kw: float) -> MetricsSettings:
    base = dict(stamp_tolerance_s=0.002, agreement_tolerance_rad=0.05, ood_threshold=3.0,
                disagreement_threshold_rad=0.1, coverage_k_sigma=3.0, window_s=1.0)
    base.update(kw)
    return MetricsSettings(**base)  # type: ignore[arg-type]


def test_constant_offset_gives_exact_per_joint_and_l2_divergence() -> None:
    acc = ShadowAccumulator(JOINTS, _settings())
    for k in range(500):
        t = 1_000_000_000 + k * PERIOD_NS
        acc.add_baseline(t, _baseline(k))
        acc.add_policy(t, _baseline(k) + OFFSET)
    m = acc.metrics()
    expected_l2 = float(np.linalg.norm(OFFSET))
    assert m.steps == 500
    assert m.time_s == pytest.approx(499 * 0.01, abs=1e-12)
    assert m.mean_abs_rad == list(np.abs(OFFSET))
    assert m.max_abs_rad == list(np.abs(OFFSET))
    assert m.mean_l2_rad == pytest.approx(expected_l2, rel=1e-15)
    assert m.l2_percentiles_rad["p95"] == pytest.approx(expected_l2, rel=1e-15)
    # |offset| <= 0.05 rad on every joint: every step agrees.
    assert m.agreement_rate == 1.0
    assert m.unmatched_policy == 0 and m.unmatched_baseline == 0


def test_agreement_rate_counts_steps_with_any_joint_beyond_tolerance() -> None:
    acc = ShadowAccumulator(JOINTS, _settings(agreement_tolerance_rad=2.0**-5))
    big = np.array([0.0, 0.0, 2.0**-4])  # beyond the tolerance on one joint
    for k in range(400):
        t = k * PERIOD_NS
        acc.add_policy(t, _baseline(k) + (big if k % 4 == 0 else OFFSET))
        acc.add_baseline(t, _baseline(k))
    m = acc.metrics()
    # OFFSET's largest component is exactly the tolerance: those steps agree (equality passes).
    assert m.agreement_rate == 0.75
    assert m.max_abs_rad == [2.0**-6, 2.0**-5, 2.0**-4]


def test_commands_pair_by_stamp_not_by_arrival_order() -> None:
    acc = ShadowAccumulator(JOINTS, _settings())
    # The baseline arrives in bursts of three, late and with 1 ms stamp jitter.
    for k in range(0, 300, 3):
        for j in range(3):
            acc.add_policy((k + j) * PERIOD_NS, _baseline(k + j) + OFFSET)
        for j in range(3):
            jitter = 1_000_000 if (k + j) % 2 else -1_000_000
            acc.add_baseline((k + j) * PERIOD_NS + jitter, _baseline(k + j))
    acc.finish()
    m = acc.metrics()
    assert m.steps == 300
    assert m.max_abs_rad == list(np.abs(OFFSET))
    assert m.unmatched_policy == 0


def test_commands_outside_the_stamp_tolerance_stay_unmatched() -> None:
    acc = ShadowAccumulator(JOINTS, _settings(stamp_tolerance_s=0.002))
    for k in range(100):
        acc.add_policy(k * PERIOD_NS, _baseline(k))
        if k % 10 != 0:  # every tenth baseline command is missing
            acc.add_baseline(k * PERIOD_NS + 2_000_000, _baseline(k))  # exactly at tolerance
        else:
            acc.add_baseline(k * PERIOD_NS + 2_000_001, _baseline(k))  # 1 ns beyond it
    acc.finish()
    m = acc.metrics()
    assert m.steps == 90
    assert m.unmatched_policy == 10 and m.unmatched_baseline == 10
    assert m.gate_metrics()["unmatched_fraction"] == 0.1


def test_align_by_stamp_is_one_to_one_and_nearest() -> None:
    policy = [0, 10, 20, 30]
    baseline = [1, 9, 11, 31, 50]
    assert align_by_stamp(policy, baseline, tolerance_ns=2) == [(0, 0), (1, 1), (3, 3)]


def test_matcher_rejects_negative_tolerance() -> None:
    with pytest.raises(ValueError, match="tolerance_ns"):
        StampMatcher(-1)


def test_windowed_divergence_separates_a_drift_from_a_clean_period() -> None:
    acc = ShadowAccumulator(JOINTS, _settings(window_s=1.0))
    for k in range(300):  # 3 s: clean, clean, drifting
        drift = np.array([0.0, 0.0, 0.25]) if k >= 200 else np.zeros(3)
        acc.add_policy(k * PERIOD_NS, _baseline(k) + drift)
        acc.add_baseline(k * PERIOD_NS, _baseline(k))
    ws = windows(list(acc.history), 1.0)
    assert [w.steps for w in ws] == [100, 100, 100]
    assert [w.agreement_rate for w in ws] == [1.0, 1.0, 0.0]
    assert ws[2].mean_abs_rad == [0.0, 0.0, 0.25]
    m = acc.metrics()
    assert m.window is not None and m.window.agreement_rate == 0.0 and m.window.steps == 100
    assert m.agreement_rate == 200 / 300


def test_non_finite_policy_command_never_agrees() -> None:
    s = step_divergence(0, np.array([np.nan, 0.0, 0.0]), np.zeros(3), 0.05)
    assert not s.agree


def test_would_be_interventions_are_counted_per_policy_command() -> None:
    limit = 0.5

    def check(t_ns: int, q: np.ndarray, q_meas: np.ndarray | None) -> list[WouldBeIntervention]:
        return [
            WouldBeIntervention(t_ns, "position", JOINTS[i], float(abs(q[i]) - limit),
                                hard=bool(abs(q[i]) > 2 * limit))
            for i in range(len(q)) if abs(q[i]) > limit
        ]

    acc = ShadowAccumulator(JOINTS, _settings(), intervention_check=check)
    for k in range(10):
        q = np.array([0.6 if k < 3 else 0.0, 1.2 if k == 9 else 0.0, 0.0])
        acc.add_policy(k * PERIOD_NS, q)
        acc.add_baseline(k * PERIOD_NS, np.zeros(3))
    m = acc.metrics()
    assert m.soft_interventions == 3 and m.hard_violations == 1
    assert m.interventions_by_kind == {"position": 4}
    assert acc.interventions[-1].joint == "j2"


def test_confidence_distribution_and_ood_and_fallback_fractions() -> None:
    acc = ShadowAccumulator(JOINTS, _settings(ood_threshold=3.0, disagreement_threshold_rad=0.1))
    ood = np.arange(100) * 0.05  # 0.00 .. 4.95: values above 3.0 are 3.05 .. 4.95 -> 39
    dis = np.where(np.arange(100) < 10, 0.2, 0.01)  # 10 unsure, all with low OOD
    for k in range(100):
        acc.add_confidence(k * PERIOD_NS, float(dis[k]), float(ood[k]), version=2)
    acc.add_confidence(100 * PERIOD_NS, 0.0, float("nan"), version=3)  # NaN OOD fails closed
    m = acc.metrics()
    assert m.confidence_samples == 101
    assert m.ood_fraction == 40 / 101
    assert m.fallback_rate == 50 / 101
    assert m.policy_versions == [2, 3]
    assert m.ood_percentiles["p50"] == pytest.approx(np.percentile(ood, 50))
    assert m.ood_percentiles["max"] == pytest.approx(4.95)
    assert m.disagreement_percentiles_rad["p95"] == pytest.approx(0.2)


def test_ood_score_exactly_at_threshold_is_in_distribution() -> None:
    acc = ShadowAccumulator(JOINTS, _settings(ood_threshold=3.0))
    acc.add_confidence(0, 0.0, 3.0, 1)
    assert acc.metrics().ood_fraction == 0.0


def test_coverage_is_the_fraction_of_observations_within_k_sigma() -> None:
    stats = TrainingStats(mean=np.zeros(6), std=np.ones(6), names=tuple(f"d{i}" for i in range(6)))
    acc = ShadowAccumulator(JOINTS, _settings(coverage_k_sigma=2.0), training_stats=stats)
    rng = np.random.default_rng(7)
    inside = 0
    for k in range(200):
        q = rng.uniform(-2.5, 2.5, 3)
        qd = rng.uniform(-1.0, 1.0, 3)
        inside += bool(np.all(np.abs(q) <= 2.0))
        t = k * PERIOD_NS
        acc.add_joint_state(t, q, qd)
        acc.add_policy(t, q)
    m = acc.metrics()
    assert m.coverage is not None and m.coverage.samples == 200
    assert m.coverage.fraction_within == inside / 200
    assert m.coverage.per_dim_fraction[3:] == [1.0, 1.0, 1.0]


def test_observation_exactly_k_sigma_away_is_covered() -> None:
    stats = TrainingStats(mean=np.array([1.0]), std=np.array([0.5]))
    assert within_k_sigma(np.array([2.5]), stats, 3.0)[0]
    assert not within_k_sigma(np.array([2.5000001]), stats, 3.0)[0]


def test_observation_without_velocities_counts_as_uncovered() -> None:
    stats = TrainingStats(mean=np.zeros(6), std=np.ones(6))
    acc = ShadowAccumulator(JOINTS, _settings(), training_stats=stats)
    acc.add_joint_state(0, np.zeros(3), None)
    acc.add_policy(0, np.zeros(3))
    m = acc.metrics()
    assert m.coverage is not None and m.coverage.fraction_within == 0.0


def test_reset_starts_the_evidence_afresh() -> None:
    acc = ShadowAccumulator(JOINTS, _settings())
    for k in range(10):
        acc.add_policy(k * PERIOD_NS, np.zeros(3))
        acc.add_baseline(k * PERIOD_NS, np.zeros(3))
        acc.add_status(estop=k == 5)
    assert acc.metrics().steps == 10 and acc.metrics().estops == 1
    acc.reset()
    m = acc.metrics()
    assert m.steps == 0 and m.agreement_rate is None and m.estops == 0


def test_wrong_joint_count_is_refused() -> None:
    acc = ShadowAccumulator(JOINTS, _settings())
    with pytest.raises(ValueError, match=r"expected \(3,\)"):
        acc.add_policy(0, np.zeros(4))


def test_percentiles_ignore_non_finite_values() -> None:
    assert percentiles([1.0, float("nan"), 3.0], (50,)) == {"p50": 2.0, "max": 3.0}
    assert percentiles([]) == {}

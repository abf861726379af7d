"""Each checklist row turns green, amber and red on constructed evidence, at its thresholds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from sim2real_ros.audit.checklist import (
    AMBER,
    GREEN,
    RED,
    Thresholds,
    evaluate,
    fault_capabilities,
)
from sim2real_ros.audit.evidence import (
    AuditEvidence,
    CalibrationEvidence,
    FaultRecordEvidence,
    FaultResult,
    HilRecord,
    ImageCoverage,
    LatencyMeasurement,
    LatencyModel,
    LiveGraphEvidence,
    MeasuredNoise,
    RandomizedAxis,
    SimModelEvidence,
    WorldModelSummary,
)

NOW = datetime(2026, 5, 9, 12, 0, tzinfo=timezone.utc)
ENVELOPE = "ab" * 32
UNIT = "arm-SN1234"


def ax(axis: str, low: float, high: float, op: str = "add") -> RandomizedAxis:
    return RandomizedAxis(axis, f"test.{axis}", low, high, op)


def green_sim(**changes: object) -> SimModelEvidence:
    sim = SimModelEvidence(
        source="randomization.yaml",
        sha256="cd" * 32,
        camera_enabled=True,
        visual={a: ax(a, 0.0, 1.0) for a in ("light", "colour", "pixel_noise")},
        dynamics={a: ax(a, 0.8, 1.2, "scale") for a in ("link_mass", "joint_damping",
                                                         "joint_friction")},
        actuator={"torque_limit": ax("torque_limit", 0.9, 1.0, "scale"),
                  "motor_lag": ax("motor_lag", 0.002, 0.01, "abs")},
        sensor={"joint_position_noise": ax("joint_position_noise", 1e-4, 3e-4, "abs"),
                "joint_velocity_noise": ax("joint_velocity_noise", 1e-3, 3e-3, "abs"),
                "joint_position_drift": ax("joint_position_drift", 1e-6, 1e-5, "abs"),
                "ft_force_noise": ax("ft_force_noise", 0.1, 0.3, "abs")},
        latency=LatencyModel((0.002, 0.006), (0.005, 0.015), 0.002, 0.01, "randomization.yaml"),
    )
    return dataclasses.replace(sim, **changes)  # type: ignore[arg-type]


def faults(*, skip: str = "", fail: str = "", slow: str = "") -> FaultRecordEvidence:
    names = {
        "command_out_of_envelope": "bounds",
        "joint_states_stale": "watchdog",
        "policy_killed": "fallback",
        "force_spike": "estop",
        "drift_rollback": "monitor",
    }
    fs = tuple(
        FaultResult(n, g, injected=(n != skip), survived=(n != fail),
                    reaction_periods=(5.0 if n == slow else 1.0))
        for n, g in names.items()
    )
    return FaultRecordEvidence("faults.json", ENVELOPE, NOW - timedelta(days=2), fs)


def green_evidence() -> AuditEvidence:
    return AuditEvidence(
        sim=green_sim(),
        calibrations=[CalibrationEvidence("cal.yaml", UNIT, NOW - timedelta(days=3), 3,
                                          {"joint_damping_nms": [0.5] * 6},
                                          action_latency_s=0.004, observation_latency_s=0.001)],
        declared_unit=UNIT,
        measured_noise=[MeasuredNoise("joint_position_std_rad", (2e-4,) * 6, "bag"),
                        MeasuredNoise("joint_velocity_std_rad_s", (2e-3,) * 6, "bag")],
        latency=[LatencyMeasurement("bag", 500, 0.006, 0.009, 0.011)],
        faults=faults(),
        envelope_sha256=ENVELOPE,
        hil=[HilRecord("proxy", UNIT, (NOW - timedelta(days=1)).isoformat(), 0.95, 50, 0.01,
                       True)],
        image_coverage=ImageCoverage(0.99, 100, 200, "camera bag"),
    )


def with_(ev: AuditEvidence, **changes: object) -> AuditEvidence:
    return dataclasses.replace(ev, **changes)  # type: ignore[arg-type]


def sim_(ev: AuditEvidence, **changes: object) -> AuditEvidence:
    return with_(ev, sim=green_sim(**changes))


def old(days: float) -> datetime:
    return NOW - timedelta(days=days)


Case = tuple[str, str, Callable[[AuditEvidence], AuditEvidence]]

CASES: list[Case] = [
    # visual
    ("visual", GREEN, lambda e: e),
    ("visual", GREEN, lambda e: sim_(e, camera_enabled=False)),  # no images: not applicable
    ("visual", AMBER, lambda e: sim_(e, visual={"light": ax("light", 0, 1)})),
    ("visual", AMBER, lambda e: with_(e, image_coverage=None)),
    ("visual", RED, lambda e: sim_(e, visual={})),
    ("visual", RED, lambda e: with_(e, image_coverage=ImageCoverage(0.94, 100, 200, "bag"))),
    ("visual", RED, lambda e: with_(sim_(e, camera_enabled=False), policy_uses_images=True)),
    # dynamics
    ("dynamics", GREEN, lambda e: e),
    ("dynamics", GREEN, lambda e: with_(e, calibrations=[dataclasses.replace(
        e.calibrations[0], created_utc=old(30))])),
    ("dynamics", AMBER, lambda e: with_(e, calibrations=[dataclasses.replace(
        e.calibrations[0], created_utc=old(30.1))])),
    ("dynamics", AMBER, lambda e: with_(e, calibrations=[dataclasses.replace(
        e.calibrations[0], n_runs=2)])),
    ("dynamics", AMBER, lambda e: with_(e, calibrations=[dataclasses.replace(
        e.calibrations[0], unit_id="arm-OTHER")])),
    ("dynamics", AMBER, lambda e: with_(e, observed_units={"live graph": "arm-OTHER"})),
    ("dynamics", AMBER, lambda e: with_(e, declared_unit=None)),
    ("dynamics", AMBER, lambda e: with_(e, calibrations=[])),  # spec sheet + 3 axes randomized
    ("dynamics", AMBER, lambda e: with_(e, world_model=WorldModelSummary(
        100, 0.11, 0.0, 0.01, 0.2, 0.05, "wm"))),
    ("dynamics", GREEN, lambda e: with_(e, world_model=WorldModelSummary(
        100, 0.10, 0.0, 0.01, 0.2, 0.05, "wm"))),
    ("dynamics", RED, lambda e: with_(sim_(e, dynamics={
        "link_mass": ax("link_mass", 0.8, 1.2, "scale"),
        "joint_damping": ax("joint_damping", 1.0, 1.0, "scale")}), calibrations=[])),
    # sensor / noise
    ("sensor", GREEN, lambda e: e),
    ("sensor", GREEN, lambda e: with_(e, measured_noise=[  # exactly x2 above the range top
        MeasuredNoise("joint_position_std_rad", (6e-4,), "bag")])),
    ("sensor", AMBER, lambda e: with_(e, measured_noise=[
        MeasuredNoise("joint_position_std_rad", (6.1e-4,), "bag")])),
    ("sensor", AMBER, lambda e: with_(e, measured_noise=[
        MeasuredNoise("joint_position_std_rad", (4.9e-5,), "bag")])),
    ("sensor", AMBER, lambda e: with_(e, measured_noise=[])),
    ("sensor", AMBER, lambda e: with_(e, measured_noise=[
        *e.measured_noise, MeasuredNoise("ft_torque_std_nm", (0.01,), "bag")])),
    ("sensor", AMBER, lambda e: sim_(e, sensor={
        "joint_position_noise": ax("joint_position_noise", 1e-4, 3e-4, "abs")})),
    ("sensor", RED, lambda e: sim_(e, sensor={
        "joint_position_noise": ax("joint_position_noise", 0.0, 0.0, "abs")})),
    ("sensor", RED, lambda e: with_(e, sim=None)),
    # contact / actuator
    ("actuator", GREEN, lambda e: e),
    ("actuator", AMBER, lambda e: with_(e, hil=[])),
    ("actuator", AMBER, lambda e: with_(e, hil=[dataclasses.replace(e.hil[0], n_episodes=19)])),
    ("actuator", AMBER, lambda e: with_(e, hil=[dataclasses.replace(e.hil[0],
                                                                    unit_id="arm-OTHER")])),
    ("actuator", RED, lambda e: with_(e, hil=[
        e.hil[0], dataclasses.replace(e.hil[0], passed=False, created_utc=NOW.isoformat())])),
    ("actuator", RED, lambda e: with_(sim_(e, actuator={"kp": ax("kp", 0.75, 1.5, "scale")}),
                                      hil=[])),
    ("actuator", AMBER, lambda e: with_(sim_(e, actuator={}, actuator_structure=(
        "servo with torque saturation",)), hil=[])),
    # latency
    ("latency", GREEN, lambda e: e),
    ("latency", AMBER, lambda e: with_(e, latency=[])),
    ("latency", AMBER, lambda e: with_(e, faults=dataclasses.replace(faults(), faults=tuple(
        f for f in faults().faults if "watchdog" not in fault_capabilities(f))))),
    ("latency", AMBER, lambda e: with_(e, latency=[
        LatencyMeasurement("live", 500, 0.030, 0.045, 0.05)])),  # 35 ms > 21 ms + 7 ms
    # Model [7, 21] ms + 2 ms jitter, tolerance 5 ms; the calibration adds 5 ms of drive and
    # sensor delay: p99 18 + 5 = 23 <= 28 is covered, p99 24 + 5 = 29 is not.
    ("latency", GREEN, lambda e: with_(e, latency=[
        LatencyMeasurement("live", 500, 0.015, 0.018, 0.02)])),
    ("latency", AMBER, lambda e: with_(e, latency=[
        LatencyMeasurement("live", 500, 0.015, 0.024, 0.03)])),
    ("latency", RED, lambda e: sim_(e, latency=LatencyModel())),
    # safety wrapper
    ("safety", GREEN, lambda e: e),
    ("safety", AMBER, lambda e: with_(e, faults=faults(skip="drift_rollback"))),
    ("safety", AMBER, lambda e: with_(e, faults=faults(slow="policy_killed"))),
    ("safety", AMBER, lambda e: with_(e, envelope_sha256="ef" * 32)),
    ("safety", AMBER, lambda e: with_(e, faults=dataclasses.replace(
        faults(), created_utc=old(31)))),
    ("safety", AMBER, lambda e: with_(e, faults=None)),  # envelope known, never fault-tested
    ("safety", AMBER, lambda e: with_(e, faults=None, envelope_sha256=None,
                                      live=LiveGraphEvidence(5.0, safety_status={
                                          "source": "policy"}))),
    ("safety", AMBER, lambda e: with_(e, live=LiveGraphEvidence(5.0, safety_status={
        "envelope_sha256": "ef" * 32}))),  # the running filter has another envelope
    ("safety", RED, lambda e: with_(e, faults=faults(fail="policy_killed"))),
    ("safety", RED, lambda e: with_(e, faults=None, envelope_sha256=None)),
]


@pytest.mark.parametrize(("gap", "status", "make"), CASES,
                         ids=[f"{g}-{s}-{i}" for i, (g, s, _) in enumerate(CASES)])
def test_row_status_follows_its_rule_on_constructed_evidence(
    gap: str, status: str, make: Callable[[AuditEvidence], AuditEvidence]
) -> None:
    row = evaluate(make(green_evidence()), NOW).row(gap)
    assert row.status == status, (row.rule, row.evidence, row.missing)
    assert row.rule
    # A row that is not green always says what is still missing.
    assert (row.missing != []) == (status != GREEN) or gap == "dynamics"


def test_every_row_has_each_colour_among_the_cases() -> None:
    seen = {(g, s) for g, s, _ in CASES}
    for gap in ("visual", "dynamics", "sensor", "actuator", "latency", "safety"):
        assert {(gap, GREEN), (gap, AMBER), (gap, RED)} <= seen


def test_all_green_evidence_is_deployable_and_any_red_is_not() -> None:
    checklist = evaluate(green_evidence(), NOW)
    assert [r.status for r in checklist.rows] == [GREEN] * 6
    assert checklist.deployable and checklist.overall == GREEN
    red = evaluate(with_(green_evidence(), faults=faults(fail="force_spike")), NOW)
    assert not red.deployable and red.overall == RED


def test_empty_evidence_fails_closed() -> None:
    checklist = evaluate(AuditEvidence(), NOW)
    assert [r.status for r in checklist.rows] == [RED] * 6


def test_thresholds_are_configurable() -> None:
    ev = with_(green_evidence(), calibrations=[dataclasses.replace(
        green_evidence().calibrations[0], n_runs=2)])
    assert evaluate(ev, NOW).row("dynamics").status == AMBER
    assert evaluate(ev, NOW, Thresholds(calibration_min_runs=2)).row("dynamics").status == GREEN
    with pytest.raises(ValueError, match="noise_factor"):
        Thresholds(noise_factor=0.5)


@pytest.mark.parametrize(("name", "gap", "caps"), [
    # the safety suite's own names and playbook gap labels (safety/faults.py)
    ("policy_killed", "latency", {"watchdog", "fallback"}),
    ("joint_states_stopped", "latency", {"watchdog"}),
    ("force_spike", "contact_actuator", {"estop"}),
    ("uncertainty_spike", "dynamics", {"fallback"}),
    ("policy_drift", "dynamics", {"monitor_rollback"}),
    ("command_beyond_envelope", "contact_actuator", {"bounds"}),
])
def test_the_safety_suites_faults_map_to_exactly_their_capabilities(
    name: str, gap: str, caps: set[str]
) -> None:
    assert fault_capabilities(FaultResult(name, gap, True, True)) == caps


@pytest.mark.parametrize(("name", "gap", "cap"), [
    ("kill_policy_process", "", "fallback"),
    ("uncertainty_spike", "", "fallback"),
    ("force_spike", "", "estop"),
    ("stale_joint_states", "", "watchdog"),
    ("drift", "", "monitor_rollback"),
    ("whatever", "bounds", "bounds"),
])
def test_fault_names_map_to_wrapper_capabilities(name: str, gap: str, cap: str) -> None:
    assert cap in fault_capabilities(FaultResult(name, gap, True, True))


def test_only_this_units_calibration_adds_its_drive_delay_to_the_loop_delay() -> None:
    from sim2real_ros.audit.checklist import latency_coverage

    ev = green_evidence()
    m = LatencyMeasurement("live", 100, 0.010, 0.012, 0.012)
    _, mine = latency_coverage(m, ev, Thresholds())
    assert "p50 15.0 ms" in mine and "drive/sensor delay from cal.yaml" in mine
    other = with_(ev, calibrations=[dataclasses.replace(ev.calibrations[0], unit_id="arm-X")])
    _, theirs = latency_coverage(m, other, Thresholds())
    assert "p50 10.0 ms" in theirs and "drive/sensor" not in theirs

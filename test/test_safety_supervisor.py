"""Watchdog, fallback with hysteresis, e-stop latch, stages and monitor, to the exact tick."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from sim2real_ros.paths import default_urdf, share_path
from sim2real_ros.robot import load_arm
from sim2real_ros.safety import events as ev
from sim2real_ros.safety.envelope import derive_envelope_dict, load_envelope
from sim2real_ros.safety.monitor import Monitor, MonitorConfig
from sim2real_ros.safety.supervisor import (
    SOURCE_BASELINE,
    SOURCE_HOLD,
    SOURCE_POLICY,
    Supervisor,
    SupervisorConfig,
    TickResult,
)
from sim2real_ros.safety.watchdog import ClockGuard, StreamWatch

ARM = load_arm(default_urdf())
ENV = load_envelope(share_path("config", "safety_envelope.yaml"), ARM)
HOME = [0.0, 0.0, 1.6, 0.0, 1.5, 0.0]
P = 0.01
T0 = 50.0


class Rig:
    """Drives a Supervisor like the node does: inputs stamped with the tick's time."""

    def __init__(self, stage: str = "full", **cfg: object) -> None:
        base = {"calm_period_s": 0.1}
        base.update(cfg)
        self.sup = Supervisor(ENV, ARM, SupervisorConfig(**base), stage=stage)  # type: ignore
        self.t = T0
        self.js = True
        self.policy = True
        self.baseline = True
        self.disagreement = 0.01
        self.ood = 0.5
        self.policy_cmd = list(HOME)
        self.results: list[TickResult] = []

    def step(self, n: int = 1) -> TickResult:
        for _ in range(n):
            self.t = round(self.t + P, 9)
            t = self.t
            if self.js:
                self.sup.on_joint_state(t, t, HOME, [0.0] * 6)
            if self.policy:
                self.sup.on_policy_command(t, t, None, self.policy_cmd)
                self.sup.on_confidence(t, t, self.disagreement, self.ood)
            if self.baseline:
                self.sup.on_baseline_command(t, t, None, HOME)
            res = self.sup.tick(t + 0.001, P)
            self.results.append(res)
        return res

    def events(self, kind: str) -> list[ev.SafetyEvent]:
        return [e for r in self.results for e in r.events if e.kind == kind]


def _driving(rig: Rig) -> None:
    rig.step(int(rig.sup.config.calm_period_s / P) + 5)
    assert rig.sup.source == SOURCE_POLICY


def test_stream_watch_rejects_out_of_order_and_future_stamps() -> None:
    w = StreamWatch("x", timeout_s=0.02, max_age_s=0.1, future_tolerance_s=0.005)
    assert w.status(0.0) == "missing" and w.describe(0.0) == "x missing"
    assert w.accept(1.0, 1.0) == ""
    assert w.accept(1.01, 0.99) == "out_of_order"
    assert w.accept(1.01, 1.016) == "future_stamp"
    assert w.accept(1.01, 1.005) == ""
    assert w.status(1.029) == ""
    assert w.status(1.0301) == "stale_arrival"
    assert w.accept(1.04, 1.005) == "" and w.status(1.04, reference_s=1.1051) == "stale_stamp"


def test_clock_guard_flags_backward_and_large_forward_jumps() -> None:
    g = ClockGuard(0.01, max_forward_jump_s=0.5)
    assert [g.check(t) for t in (1.0, 1.01, 1.51, 1.0, 5.0)] == ["", "", "", "backward",
                                                                 "forward"]


def test_stale_command_triggers_fallback_within_two_periods() -> None:
    rig = Rig(command_timeout_s=0.025)
    _driving(rig)
    last_arrival = rig.t
    rig.policy = False
    while rig.sup.source == SOURCE_POLICY:
        rig.step()
    # Stale once now > last arrival + 25 ms; the tick after that already switched.
    tick_time = rig.t + 0.001
    assert tick_time - last_arrival > 0.025
    assert tick_time - last_arrival <= 0.025 + P
    assert rig.sup.source == SOURCE_BASELINE
    fb = rig.events(ev.FALLBACK)[-1]
    assert fb.limit == "policy_stale_arrival" and fb.reaction_periods is not None
    assert 0.0 <= fb.reaction_periods <= 2.0


def test_command_stale_by_stamp_falls_back_even_while_messages_arrive() -> None:
    rig = Rig(max_command_age_s=0.05)
    _driving(rig)
    rig.policy = False
    frozen = rig.t
    for _ in range(4):
        rig.step()
        rig.sup.on_policy_command(rig.t, frozen, None, HOME)
        rig.sup.on_confidence(rig.t, frozen, 0.01, 0.5)
    assert rig.sup.source == SOURCE_POLICY
    for _ in range(3):
        rig.step()
        rig.sup.on_policy_command(rig.t, frozen, None, HOME)
        rig.sup.on_confidence(rig.t, frozen, 0.01, 0.5)
    assert rig.sup.source == SOURCE_BASELINE
    assert rig.events(ev.FALLBACK)[-1].limit == "policy_stale_stamp"


def test_command_stamped_in_the_future_is_rejected() -> None:
    rig = Rig()
    _driving(rig)
    out = rig.sup.on_policy_command(rig.t, rig.t + 0.5, None, HOME)
    assert out and out[0].kind == ev.INVALID_COMMAND and "future_stamp" in out[0].detail
    rig.policy = False
    rig.step()
    assert rig.sup.source == SOURCE_BASELINE
    assert rig.events(ev.FALLBACK)[-1].limit == "invalid_command"


def test_out_of_order_joint_states_are_rejected_and_missing_ones_hold() -> None:
    rig = Rig(state_timeout_s=0.025)
    _driving(rig)
    out = rig.sup.on_joint_state(rig.t, rig.t - 1.0, [0.3] * 6)
    assert out[0].limit == "out_of_order" and rig.sup.q == HOME
    last = rig.t
    rig.js = False
    while rig.sup.source != SOURCE_HOLD:
        rig.step()
    assert rig.t + 0.001 - last <= 0.025 + P
    hold = rig.events(ev.HOLD)[-1]
    assert hold.limit == "joint_states_stale_arrival" and hold.reaction_periods <= 2.0
    # Holding means braking to a stop: the command stops changing.
    rig.step(100)
    a, b = rig.results[-2].command, rig.results[-1].command
    assert a == b


def test_clock_jump_discards_inputs_and_holds_until_fresh_data() -> None:
    rig = Rig()
    _driving(rig)
    rig.t -= 10.0  # simulated clock reset
    rig.js = rig.policy = rig.baseline = False
    res = rig.step()
    assert res.source == SOURCE_HOLD
    assert rig.events(ev.CLOCK_JUMP)[-1].limit == "backward"
    rig.js = rig.policy = rig.baseline = True
    rig.step()
    assert rig.sup.source == SOURCE_BASELINE  # the policy must be calm again first
    rig.step(12)
    assert rig.sup.source == SOURCE_POLICY


def test_disagreement_fallback_has_hysteresis_and_a_calm_period() -> None:
    rig = Rig(disagreement_enter_rad=0.1, disagreement_exit_rad=0.07, calm_period_s=0.2)
    _driving(rig)
    rig.disagreement = 0.1  # at the threshold: still trusted
    rig.step()
    assert rig.sup.source == SOURCE_POLICY
    rig.disagreement = 0.1001
    rig.step()
    assert rig.sup.source == SOURCE_BASELINE
    assert rig.events(ev.FALLBACK)[-1].limit == "disagreement"
    rig.disagreement = 0.09  # below enter, above exit: no return
    rig.step(50)
    assert rig.sup.source == SOURCE_BASELINE
    rig.disagreement = 0.07
    rig.step()
    first_calm = rig.t + 0.001
    while rig.sup.source == SOURCE_BASELINE:
        rig.step()
        if rig.t > first_calm + 1.0:
            break
    # Returns at the first tick with now - first_calm >= 0.2 s, not earlier.
    assert rig.t + 0.001 - first_calm == pytest.approx(0.2, abs=1e-6)
    assert rig.events(ev.RETURN)
    # One bad sample during the calm period restarts it.
    rig.disagreement = 0.2
    rig.step()
    rig.disagreement = 0.0
    rig.step(10)
    rig.disagreement = 0.08
    rig.step()
    rig.disagreement = 0.0
    rig.step(15)
    assert rig.sup.source == SOURCE_BASELINE
    rig.step(10)
    assert rig.sup.source == SOURCE_POLICY


def test_ood_score_over_threshold_falls_back() -> None:
    rig = Rig(ood_enter=3.0, ood_exit=2.5)
    _driving(rig)
    rig.ood = 3.5
    rig.step()
    assert rig.sup.source == SOURCE_BASELINE and rig.sup.fallback_reason == "ood"
    rig.ood = math.nan  # a NaN score is never trusted
    rig.step(30)
    assert rig.sup.source == SOURCE_BASELINE


def test_missing_confidence_blocks_the_policy_unless_not_required() -> None:
    for required, expected in ((True, SOURCE_BASELINE), (False, SOURCE_POLICY)):
        rig = Rig(require_confidence=required)
        for _ in range(20):
            rig.t = round(rig.t + P, 9)
            rig.sup.on_joint_state(rig.t, rig.t, HOME)
            rig.sup.on_policy_command(rig.t, rig.t, None, HOME)
            rig.sup.on_baseline_command(rig.t, rig.t, None, HOME)
            rig.sup.tick(rig.t + 0.001)
        assert rig.sup.source == expected


def test_force_spike_latches_estop_until_reset_and_reset_needs_the_cause_gone() -> None:
    rig = Rig()
    _driving(rig)
    limit = ENV.measured.max_force_n
    out = rig.sup.on_wrench(rig.t, rig.t, [0.0, 0.0, limit + 1.0, 0.0, 0.0, 0.0])
    assert out[0].kind == ev.ESTOP and out[0].excess == pytest.approx(1.0)
    rig.step()
    assert rig.sup.source == SOURCE_HOLD and rig.sup.estop
    ok, why = rig.sup.reset_estop(rig.t)
    assert not ok and "wrench" in why
    rig.sup.on_wrench(rig.t, rig.t, [0.0] * 6)
    rig.step(50)
    assert rig.sup.estop and rig.sup.source == SOURCE_HOLD  # latched, not self-clearing
    ok, _ = rig.sup.reset_estop(rig.t)
    assert ok and not rig.sup.estop
    rig.step()
    assert rig.sup.source == SOURCE_BASELINE  # the policy waits for its calm period
    rig.step(12)
    assert rig.sup.source == SOURCE_POLICY


def test_per_axis_torque_over_limit_latches_estop(tmp_path: Path) -> None:
    data = derive_envelope_dict(ARM)
    data["force"]["measured"]["max_torque_per_axis_nm"] = [15.0, 15.0, 5.0]
    (tmp_path / "env.yaml").write_text(yaml.safe_dump(data))
    env = load_envelope(tmp_path / "env.yaml", ARM)
    sup = Supervisor(env, ARM, SupervisorConfig())
    sup.on_wrench(T0, T0, [0.0, 0.0, 0.0, 0.0, 0.0, 4.9])
    assert not sup.estop
    out = sup.on_wrench(T0, T0, [0.0, 0.0, 0.0, 0.0, 0.0, 5.1])
    assert sup.estop and out[0].limit == "torque_z" and out[0].excess == pytest.approx(0.1)


def test_joint_beyond_hard_limit_latches_estop() -> None:
    rig = Rig()
    _driving(rig)
    q = list(HOME)
    q[1] = ARM.limits[1].upper + 0.001
    rig.sup.on_joint_state(rig.t, rig.t, q)
    assert rig.sup.estop and "shoulder_lift_joint" in rig.sup.estop_reason
    ok, why = rig.sup.reset_estop(rig.t)
    assert not ok and "hard limit" in why


def test_repeated_invalid_commands_latch_estop_at_exactly_the_count() -> None:
    rig = Rig(invalid_estop_count=5, invalid_window_s=1.0)
    _driving(rig)
    rig.policy = False
    for k in range(4):
        rig.sup.on_policy_command(rig.t, rig.t, None, [math.nan] * 6)
        rig.sup.on_confidence(rig.t, rig.t, 0.0, 0.0)
        rig.step()
    assert not rig.sup.estop and rig.sup.source == SOURCE_BASELINE
    rig.sup.on_policy_command(rig.t, rig.t, None, [1.0] * 5)
    assert rig.sup.estop and "repeated_invalid_commands" in rig.sup.estop_reason


def test_invalid_commands_outside_the_window_do_not_add_up() -> None:
    rig = Rig(invalid_estop_count=3, invalid_window_s=0.5)
    _driving(rig)
    rig.policy = False
    for _ in range(6):
        rig.sup.on_policy_command(rig.t, rig.t, None, [math.nan] * 6)
        rig.step(60)
    assert not rig.sup.estop


@pytest.mark.parametrize("stage,expected,scale", [
    ("shadow", SOURCE_BASELINE, 1.0), ("advisory", SOURCE_BASELINE, 1.0),
    ("limited", SOURCE_POLICY, ENV.limited_scale), ("full", SOURCE_POLICY, 1.0)])
def test_rollout_stage_decides_the_source_and_the_envelope_scale(stage: str, expected: str,
                                                                 scale: float) -> None:
    rig = Rig(stage=stage)
    rig.step(20)
    assert rig.sup.source == expected
    assert rig.sup.projector.scale == scale


def test_limited_stage_projects_the_policy_inside_the_tighter_envelope() -> None:
    rig = Rig(stage="limited")
    rig.step(20)
    rig.policy_cmd = list(HOME)
    rig.policy_cmd[0] += 1.0
    peak = 0.0
    for _ in range(100):
        rig.step()
        peak = max(peak, abs(rig.sup.projector.v[0]))
    assert peak <= ENV.joints[0].velocity_rad_s * ENV.limited_scale * (1 + 1e-9)
    assert peak > 0.9 * ENV.joints[0].velocity_rad_s * ENV.limited_scale


def test_stage_drop_while_a_joint_brakes_at_its_limit_keeps_every_command_inside() -> None:
    """The monitor's full -> limited drop mid-approach (the fault suite's command_beyond_envelope
    under load): no emitted command may leave the position envelope."""
    # Only this test's drop changes the stage (the monitor would drop limited -> advisory).
    rig = Rig(stage="full", monitor=MonitorConfig(max_intervention_rate=1.0,
                                                  max_tracking_error_rad=10.0))
    _driving(rig)
    k = 4
    jt = ENV.joints[k]
    rig.policy_cmd = list(HOME)
    rig.policy_cmd[k] = jt.upper_rad + 0.6
    for n in range(200):
        if n == 12:
            assert abs(rig.sup.projector.v[k]) > 0.3
            rig.sup.set_stage("limited", rig.t, "monitor")
        res = rig.step()
        for c, j in zip(res.command, ENV.joints):
            assert j.lower_rad <= c <= j.upper_rad, (n, res.command)
    assert rig.sup.projector.scale == ENV.limited_scale
    assert rig.sup.projector.joints[k].vmax < jt.velocity_rad_s  # the scaled limits, settled


def test_unknown_stage_is_refused() -> None:
    rig = Rig()
    with pytest.raises(ValueError):
        rig.sup.set_stage("yolo", rig.t)
    with pytest.raises(ValueError):
        Supervisor(ENV, ARM, stage="beta")


def test_stale_baseline_in_fallback_holds() -> None:
    rig = Rig(stage="advisory")
    rig.step(5)
    assert rig.sup.source == SOURCE_BASELINE
    rig.baseline = False
    rig.step(4)
    assert rig.sup.source == SOURCE_HOLD and rig.sup.hold_reason == "baseline_unavailable"


def test_config_rejects_inverted_hysteresis() -> None:
    with pytest.raises(ValueError, match="hysteresis"):
        Supervisor(ENV, ARM, SupervisorConfig(disagreement_enter_rad=0.05,
                                              disagreement_exit_rad=0.1))


def test_monitor_fires_above_the_intervention_threshold_and_not_below() -> None:
    cfg = MonitorConfig(window_s=1.0, min_fill=0.9, max_intervention_rate=0.5,
                        max_fallback_rate=1.0, max_tracking_error_rad=10.0)
    below, above = Monitor(cfg), Monitor(cfg)
    verdicts = []
    for k in range(200):
        t = k * P
        assert below.update(t, k % 20 < 9, False, 0.0, False) is None  # 45 %
        verdicts.append(above.update(t, k % 20 < 11, False, 0.0, False))  # 55 %
    fired = [k for k, v in enumerate(verdicts) if v is not None]
    assert fired and fired[0] >= 90  # not before the window is 90 % full
    assert "intervention rate" in verdicts[fired[0]].reasons[0]
    assert len(fired) == 1  # the cooldown (5 s) holds it off afterwards


def test_monitor_counts_force_events_as_rising_edges_and_tracking_error_as_a_mean() -> None:
    m = Monitor(MonitorConfig(window_s=1.0, max_force_events=2, max_tracking_error_rad=0.2))
    verdict = None
    for k in range(100):
        above = k in (10, 11, 12, 30, 50)  # three rising edges
        verdict = verdict or m.update(k * P, False, False, 0.1, above)
    assert verdict is not None and "3 force events" in verdict.reasons[0]
    m2 = Monitor(MonitorConfig(window_s=1.0, max_tracking_error_rad=0.2))
    out = [m2.update(k * P, False, False, 0.25, False) for k in range(100)]
    assert any(v is not None and "tracking error" in v.reasons[0] for v in out)


def _drift(rig: Rig) -> list:
    """Drive, then drift: the policy asks for ever faster motion, so the projector intervenes
    every tick; return the monitor verdicts that fired over 200 ticks."""
    _driving(rig)
    verdicts = []
    for k in range(200):
        rig.policy_cmd = [h + 0.02 * k * k * P for h in HOME]
        verdicts.append(rig.step().rollback)
    return [v for v in verdicts if v is not None]


def test_monitor_drift_requests_rollback_and_drops_the_stage() -> None:
    mon = MonitorConfig(window_s=0.5, max_intervention_rate=0.3, cooldown_s=10.0)
    rig = Rig(stage="full", monitor=mon)
    fired = _drift(rig)
    assert len(fired) == 1
    assert rig.sup.stage == "limited"
    assert rig.events(ev.MONITOR) and rig.events(ev.STAGE)[-1].detail.startswith("full -> limited")
    assert rig.sup.source != SOURCE_POLICY or rig.sup.authority


def test_every_event_and_status_carries_the_envelope_hash() -> None:
    rig = Rig()
    _driving(rig)
    rig.sup.on_wrench(rig.t, rig.t, [1e3, 0, 0, 0, 0, 0])
    rig.step()
    events = [e for r in rig.results for e in r.events]
    assert events
    for e in events:
        assert e.to_dict(ENV.sha256)["envelope_sha256"] == ENV.sha256
        assert e.to_json(ENV.sha256)
    assert rig.sup.status()["envelope_sha256"] == ENV.sha256 and rig.sup.status()["estop"]


def test_baseline_hold_event_names_the_check_that_failed_and_its_figure() -> None:
    # Silent baseline: the hold says how long ago its last message came, against the timeout.
    rig = Rig(stage="advisory", baseline_timeout_s=0.025)
    rig.step(5)
    rig.baseline = False
    rig.step(4)
    hold = [e for e in rig.events(ev.HOLD) if e.limit == "baseline_unavailable"]
    assert len(hold) == 1
    assert "stale_arrival" in hold[0].detail and "> 0.025 s" in hold[0].detail
    # A baseline that keeps answering an old joint state: the hold gives the stamp's age.
    rig = Rig(stage="advisory", max_baseline_age_s=0.05)
    rig.step(5)
    rig.baseline = False
    old = rig.t
    for _ in range(8):
        rig.sup.on_baseline_command(rig.t + P, old, None, HOME)
        rig.step()
    hold = [e for e in rig.events(ev.HOLD) if e.limit == "baseline_unavailable"]
    assert len(hold) == 1 and "stale_stamp" in hold[0].detail, hold
    age = float(hold[0].detail.split("stamp ")[1].split(" s")[0])
    assert 0.05 <= age <= 0.07


def test_monitor_verdict_says_which_limits_the_intervention_rate_is_made_of() -> None:
    cfg = MonitorConfig(window_s=1.0, min_fill=0.9, max_intervention_rate=0.5,
                        max_fallback_rate=1.0, max_tracking_error_rad=10.0, ignored_limits=())
    m = Monitor(cfg)
    verdict = None
    for k in range(200):
        # 40 % jerk only, 20 % jerk and workspace together, 40 % clean; limits passed with a
        # tick that does not count are ignored.
        phase = k % 10
        if phase < 4:
            v = m.update(k * P, True, False, 0.0, False, ("jerk",))
        elif phase < 6:
            v = m.update(k * P, True, False, 0.0, False, ("jerk", "workspace"))
        else:
            v = m.update(k * P, False, False, 0.0, False, ("position",))
        if v is not None:
            verdict = v
            break
    assert verdict is not None
    assert verdict.intervention_rate == pytest.approx(0.6, abs=0.02)
    assert verdict.intervention_limits["jerk"] == pytest.approx(0.6, abs=0.02)
    assert verdict.intervention_limits["workspace"] == pytest.approx(0.2, abs=0.02)
    assert "position" not in verdict.intervention_limits
    assert re.search(r"\(by limit: jerk 0\.6\d\d, workspace 0\.(19|20)\d\)$",
                     verdict.reasons[0])
    # Firing restarts the window: the breakdown too.
    assert m.limit_rates() == {}


def test_monitor_does_not_count_smoothing_trims_by_default_but_reports_them() -> None:
    cfg = MonitorConfig(window_s=1.0, min_fill=0.9, max_intervention_rate=0.5,
                        max_fallback_rate=1.0, max_tracking_error_rad=10.0)
    assert cfg.ignored_limits == ("acceleration", "jerk")
    m = Monitor(cfg)
    fired = []
    for k in range(400):
        # 90 % of ticks trimmed for jerk/acceleration only, 30 % of them also tool speed:
        # the counted rate is 0.3, below 0.5 (counting every limit it would be 0.9).
        phase = k % 10
        if phase < 3:
            lim: tuple[str, ...] = ("acceleration", "jerk", "tool_speed")
        elif phase < 9:
            lim = ("jerk",)
        else:
            lim = ()
        v = m.update(k * P, bool(lim), False, 0.0, False, lim)
        if v is not None:
            fired.append(v)
    assert fired == []
    assert m.figures()["intervention_rate"] == pytest.approx(0.3, abs=0.02)
    assert m.limit_rates()["jerk"] == pytest.approx(0.9, abs=0.02)
    # A tick with no limit named still counts (fail closed), and past the threshold the
    # reason marks the ignored limits.
    for k in range(400, 700):
        lim = ("jerk", "workspace") if k % 10 < 6 else ()
        v = m.update(k * P, bool(lim), False, 0.0, False, lim)
        if v is not None:
            fired.append(v)
            break
    assert len(fired) == 1
    assert "workspace 0." in fired[0].reasons[0] and "jerk 0." in fired[0].reasons[0]
    assert re.search(r"jerk 0\.\d{3} \(not counted\)", fired[0].reasons[0])
    m2 = Monitor(cfg)
    for k in range(200):
        v = m2.update(k * P, True, False, 0.0, False, ())
        if v is not None:
            break
    assert v is not None and v.intervention_rate > 0.5


def test_monitor_refuses_unknown_ignored_limits() -> None:
    with pytest.raises(ValueError, match=r"ignored_limits \['jerks'\]"):
        Monitor(MonitorConfig(ignored_limits=("jerks",)))


def test_supervisor_passes_the_projection_limits_to_the_monitor() -> None:
    # Tracking error out of the way, so the intervention rate is what fires.
    mon = MonitorConfig(window_s=0.5, max_intervention_rate=0.3, cooldown_s=10.0,
                        max_tracking_error_rad=10.0)
    rig = Rig(stage="full", monitor=mon)
    fired = _drift(rig)
    assert len(fired) == 1
    limits = fired[0].intervention_limits
    assert limits and set(limits) <= {"position", "velocity", "acceleration", "jerk",
                                      "braking", "workspace", "tool_speed"}
    # Every counted tick names at least one limit, and no limit is in more ticks than counted.
    rate = fired[0].intervention_rate
    assert rate > 0.3
    assert sum(limits.values()) >= rate - 1e-9
    assert all(0.0 < r <= rate + 1e-9 for r in limits.values())
    assert "by limit:" in rig.events(ev.MONITOR)[-1].detail

"""The command mux: which source drives the arm, with fallback, hysteresis, e-stop and stages.

Sources: the policy, the independent baseline controller, or `hold` (brake to a stop and stay).
The rollout stage decides who may drive: the baseline in `shadow` and `advisory`, the policy
under a tighter envelope (`limited_scale`) in `limited`, the policy in `full`. The policy loses
authority when its command stream goes stale (by arrival or by stamp), when a command is invalid,
when its confidence stream is missing (if required) or when its ensemble disagreement or OOD score
crosses the *enter* threshold; it regains authority only after every signal has stayed below the
*exit* threshold, with a fresh stream, for the whole calm period. Without fresh joint_states, or
after a clock jump, everything holds. Hard violations (measured force or torque over the
envelope, a joint beyond its URDF hard limit, repeated invalid commands) latch an e-stop: hold
until `reset_estop`, which is refused while the cause persists.

Pure: no rclpy. The node feeds messages and ticks with its clock's time in seconds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim2real_ros.robot.model import ArmModel
from sim2real_ros.safety import events as ev
from sim2real_ros.safety.envelope import Envelope
from sim2real_ros.safety.events import SafetyEvent
from sim2real_ros.safety.monitor import Monitor, MonitorConfig, Verdict
from sim2real_ros.safety.projection import EFFORT, MODES, POSITION, VELOCITY, Projector
from sim2real_ros.safety.watchdog import FRESH, ClockGuard, StreamWatch

SHADOW, ADVISORY, LIMITED, FULL = "shadow", "advisory", "limited", "full"
STAGES = (SHADOW, ADVISORY, LIMITED, FULL)
POLICY_STAGES = (LIMITED, FULL)
# Where the monitor drops the stage to when the policy drifts.
STAGE_DROP = {FULL: LIMITED, LIMITED: ADVISORY, ADVISORY: ADVISORY, SHADOW: SHADOW}
SOURCE_POLICY, SOURCE_BASELINE, SOURCE_HOLD = "policy", "baseline", "hold"


@dataclass(frozen=True)
class SupervisorConfig:
    """Timeouts (s), thresholds and stage rules of the mux; see docs/safety.md."""

    period_s: float = 0.01
    mode: str = POSITION
    command_timeout_s: float = 0.025
    max_command_age_s: float = 0.1
    baseline_timeout_s: float = 0.025
    max_baseline_age_s: float = 0.1
    state_timeout_s: float = 0.025
    max_state_age_s: float = 0.1
    confidence_timeout_s: float = 0.05
    future_tolerance_s: float = 0.02
    clock_jump_s: float = 0.5
    require_confidence: bool = True
    disagreement_enter_rad: float = 0.1
    disagreement_exit_rad: float = 0.07
    ood_enter: float = 3.0
    ood_exit: float = 2.5
    calm_period_s: float = 1.0
    invalid_estop_count: int = 10
    invalid_window_s: float = 1.0
    hard_limit_tolerance_rad: float = 0.0
    force_warning_fraction: float = 0.5
    wrench_timeout_s: float = 0.1
    # After the policy regains authority the command converges from where the baseline or the
    # hold left it to the policy's target; those corrections are the handover, not the policy
    # asking for too much, so the monitor does not count them for this long.
    handover_grace_s: float = 1.0
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def check(self) -> str | None:
        """Return why the configuration is invalid, or None."""
        if self.mode not in MODES:
            return f"mode must be one of {list(MODES)}, got {self.mode!r}"
        positive = ("period_s", "command_timeout_s", "max_command_age_s", "baseline_timeout_s",
                    "max_baseline_age_s", "state_timeout_s", "max_state_age_s",
                    "confidence_timeout_s", "clock_jump_s", "invalid_window_s",
                    "wrench_timeout_s", "disagreement_enter_rad", "ood_enter")
        for name in positive:
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0.0):
                return f"{name} must be a finite number > 0, got {v}"
        for name in ("future_tolerance_s", "calm_period_s", "hard_limit_tolerance_rad",
                     "handover_grace_s",
                     "disagreement_exit_rad", "ood_exit"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0.0):
                return f"{name} must be a finite number >= 0, got {v}"
        if self.disagreement_exit_rad > self.disagreement_enter_rad:
            return (f"disagreement_exit_rad ({self.disagreement_exit_rad}) must be <= "
                    f"disagreement_enter_rad ({self.disagreement_enter_rad}) (hysteresis)")
        if self.ood_exit > self.ood_enter:
            return f"ood_exit ({self.ood_exit}) must be <= ood_enter ({self.ood_enter})"
        if self.invalid_estop_count < 1:
            return f"invalid_estop_count must be >= 1, got {self.invalid_estop_count}"
        if not 0.0 < self.force_warning_fraction <= 1.0:
            return f"force_warning_fraction must be in (0, 1], got {self.force_warning_fraction}"
        return self.monitor.check()


@dataclass
class TickResult:
    """What one control tick decided."""

    command: list[float]  # in joint order; empty when nothing can be commanded yet
    mode: str
    source: str
    stage: str
    estop: bool
    intervened: bool
    events: list[SafetyEvent]
    wrench: list[float] | None  # clipped policy wrench while the policy drives, else None
    status_changed: bool
    rollback: Verdict | None  # set on the tick the monitor fired


@dataclass
class _Command:
    stamp_s: float
    names: list[str] | None
    values: list[float]


class Supervisor:
    """Mux + watchdog + e-stop latch + stages + monitor around one Projector."""

    def __init__(self, envelope: Envelope, arm: ArmModel, config: SupervisorConfig | None = None,
                 stage: str = SHADOW) -> None:
        self.config = config or SupervisorConfig()
        why = self.config.check()
        if why:
            raise ValueError(why)
        if stage not in STAGES:
            raise ValueError(f"rollout stage must be one of {list(STAGES)}, got {stage!r}")
        cfg = self.config
        self.envelope = envelope
        self.arm = arm
        self.joint_names = list(envelope.joint_names)
        self.n = len(self.joint_names)
        self.projector = Projector(envelope, arm, cfg.period_s)
        self.monitor = Monitor(cfg.monitor)
        self.stage = stage
        self._apply_scale()
        self.joint_watch = StreamWatch("joint_states", cfg.state_timeout_s, cfg.max_state_age_s,
                                       cfg.future_tolerance_s)
        self.policy_watch = StreamWatch("policy/joint_command", cfg.command_timeout_s,
                                        cfg.max_command_age_s, cfg.future_tolerance_s)
        self.baseline_watch = StreamWatch("baseline/joint_command", cfg.baseline_timeout_s,
                                          cfg.max_baseline_age_s, cfg.future_tolerance_s)
        self.confidence_watch = StreamWatch("policy/confidence", cfg.confidence_timeout_s,
                                            cfg.max_command_age_s, cfg.future_tolerance_s)
        self.wrench_watch = StreamWatch("force_torque_sensor_broadcaster/wrench",
                                        cfg.wrench_timeout_s, math.inf, math.inf)
        self.policy_wrench_watch = StreamWatch("policy/wrench_command", cfg.command_timeout_s,
                                               cfg.max_command_age_s, math.inf)
        self.clock = ClockGuard(cfg.period_s, cfg.clock_jump_s)
        self.q: list[float] | None = None
        self.qd: list[float] | None = None
        self.wrench: list[float] | None = None
        self.policy_cmd: _Command | None = None
        self.baseline_cmd: _Command | None = None
        self.policy_wrench: list[float] | None = None
        self.disagreement_rad = math.nan
        self.ood = math.nan
        self.policy_invalid = False
        self._invalid_times: deque[float] = deque()
        self.estop = False
        self.estop_reason = ""
        self.authority = False  # the policy may drive (when the stage allows it)
        self.fallback_reason = "policy_missing"
        self._calm_since: float | None = None
        self.source = SOURCE_HOLD
        self.hold_reason = "joint_states_missing"
        self._pending: list[SafetyEvent] = []
        self._last_status: tuple[str, str, bool, str, str] | None = None
        self.force_above_warning = False
        self.last_command: list[float] = []
        # The monitor judges a policy only after it has driven once in the current stage, so a
        # policy that is still starting up is not "falling back" (and not rolled back).
        self._monitor_armed = False
        self._handover_until = -math.inf
        self.ticks = 0
        self.interventions = 0
        self.hard_violations = 0
        self._tick_late_periods = 0.0
        self._estop_t = math.nan
        self._ticks_since_estop = 0

    # -- stage -----------------------------------------------------------------------------
    def _apply_scale(self) -> None:
        self.projector.set_scale(self.envelope.limited_scale if self.stage == LIMITED else 1.0)

    def set_stage(self, stage: str, now_s: float, reason: str = "operator") -> list[SafetyEvent]:
        """Change the rollout stage; raise ValueError for an unknown one."""
        if stage not in STAGES:
            raise ValueError(f"rollout stage must be one of {list(STAGES)}, got {stage!r}")
        if stage == self.stage:
            return []
        old = self.stage
        self.stage = stage
        self._apply_scale()
        self.monitor.reset()
        # A policy that keeps driving across the change stays under watch.
        self._monitor_armed = self.authority
        e = SafetyEvent(ev.STAGE, "rollout_stage", "", 0.0, f"{old} -> {stage}: {reason}", now_s)
        self._pending.append(e)
        return [e]

    # -- inputs ----------------------------------------------------------------------------
    def on_joint_state(self, now_s: float, stamp_s: float, position: Sequence[float] | None,
                       velocity: Sequence[float] | None = None) -> list[SafetyEvent]:
        """Take a measurement in joint order; a joint beyond its hard limit latches the e-stop."""
        out: list[SafetyEvent] = []
        q = _finite_list(position, self.n)
        if q is None:
            out.append(SafetyEvent(ev.INVALID_INPUT, "joint_states", "", math.nan,
                                   "position missing, wrong length or non-finite", now_s))
            self._pending.extend(out)
            return out
        why = self.joint_watch.accept(now_s, stamp_s)
        if why:
            out.append(SafetyEvent(ev.INVALID_INPUT, why, "", stamp_s - (
                self.joint_watch.last_stamp_s or now_s), f"joint_states {why}", now_s))
            self._pending.extend(out)
            return out
        self.q = q
        self.qd = _finite_list(velocity, self.n)
        tol = self.config.hard_limit_tolerance_rad
        for i, lim in enumerate(self.arm.limits):
            if q[i] > lim.upper + tol or q[i] < lim.lower - tol:
                excess = q[i] - lim.upper if q[i] > lim.upper else lim.lower - q[i]
                out += self._latch(now_s, "joint_hard_limit", self.joint_names[i], excess,
                                   f"measured {q[i]:.4f} rad outside the URDF limits "
                                   f"[{lim.lower}, {lim.upper}]")
        return out

    def on_wrench(self, now_s: float, stamp_s: float, wrench: Sequence[float]
                  ) -> list[SafetyEvent]:
        """Take a wrist F/T measurement; over the measured-force envelope latches the e-stop."""
        out: list[SafetyEvent] = []
        w = _finite_list(wrench, 6)
        lim = self.envelope.measured
        if w is None:
            # A sensor that reports garbage is treated as over the limit: fail closed.
            return self._latch(now_s, "force_sensor_invalid", "", math.nan,
                               "F/T wrench not 6 finite numbers")
        self.wrench_watch.accept(now_s, stamp_s)
        self.wrench = w
        f = math.sqrt(w[0] ** 2 + w[1] ** 2 + w[2] ** 2)
        t = math.sqrt(w[3] ** 2 + w[4] ** 2 + w[5] ** 2)
        checks = [("force_norm", f, lim.max_force_n), ("torque_norm", t, lim.max_torque_nm)]
        checks += [(f"force_{a}", abs(w[k]), lim.max_force_per_axis_n[k])
                   for k, a in enumerate("xyz")]
        checks += [(f"torque_{a}", abs(w[3 + k]), lim.max_torque_per_axis_nm[k])
                   for k, a in enumerate("xyz")]
        frac = self.config.force_warning_fraction
        self.force_above_warning = f > frac * lim.max_force_n or t > frac * lim.max_torque_nm
        for name, value, limit in checks:
            if value > limit:
                out += self._latch(now_s, name, "", value - limit,
                                   f"measured {value:.3f} > limit {limit}")
                break
        return out

    def on_policy_command(self, now_s: float, stamp_s: float, names: Sequence[str] | None,
                          values: Sequence[float]) -> list[SafetyEvent]:
        """Take a policy command (stamp = the joint_states stamp it answers)."""
        # "From the future" is judged against the node clock: the driver stamps joint_states
        # on the same clock, and a filter that is behind on its joint_states queue must not
        # mistake a timely answer for a forged one.
        why = self.policy_watch.accept(now_s, stamp_s, now_s)
        if not why:
            order = self.projector.order(names, values)
            if isinstance(order, str):
                why = order
            else:
                self.policy_cmd = _Command(stamp_s, None, order)
                self.policy_invalid = False
                return []
        return self._invalid_policy(now_s, why)

    def on_confidence(self, now_s: float, stamp_s: float, disagreement_rad: float,
                      ood_score: float) -> list[SafetyEvent]:
        """Take the policy's confidence (ensemble disagreement in rad, OOD score)."""
        why = self.confidence_watch.accept(now_s, stamp_s, now_s)
        if why:
            e = SafetyEvent(ev.INVALID_INPUT, why, "", math.nan, f"policy/confidence {why}", now_s)
            self._pending.append(e)
            return [e]
        # NaN confidence counts as "not confident" (fails closed in the tick).
        self.disagreement_rad = float(disagreement_rad)
        self.ood = float(ood_score)
        return []

    def on_baseline_command(self, now_s: float, stamp_s: float, names: Sequence[str] | None,
                            values: Sequence[float]) -> list[SafetyEvent]:
        """Take a baseline command (stamp = the joint_states stamp it answers)."""
        why = self.baseline_watch.accept(now_s, stamp_s, now_s)
        if not why:
            order = self.projector.order(names, values)
            if not isinstance(order, str):
                self.baseline_cmd = _Command(stamp_s, None, order)
                return []
            why = order
        e = SafetyEvent(ev.INVALID_COMMAND, "baseline", "", math.nan, why, now_s)
        self._pending.append(e)
        return [e]

    def on_policy_wrench(self, now_s: float, stamp_s: float, wrench: Sequence[float]
                         ) -> list[SafetyEvent]:
        """Take a policy wrench command; it is clipped to the commanded-force envelope."""
        self.policy_wrench_watch.accept(now_s, stamp_s)
        res = self.projector.project_wrench(wrench)
        self.policy_wrench = res.wrench
        out = [_at(e, now_s) for e in res.events]
        self._pending.extend(out)
        return out

    def _invalid_policy(self, now_s: float, why: str) -> list[SafetyEvent]:
        out = [SafetyEvent(ev.INVALID_COMMAND, "policy", "", math.nan, why, now_s)]
        self._pending.append(out[0])
        self.policy_invalid = True
        times = self._invalid_times
        times.append(now_s)
        while times and times[0] < now_s - self.config.invalid_window_s:
            times.popleft()
        if len(times) >= self.config.invalid_estop_count:
            out += self._latch(now_s, "repeated_invalid_commands", "", float(len(times)),
                               f"{len(times)} invalid policy commands within "
                               f"{self.config.invalid_window_s} s")
        return out

    def _latch(self, now_s: float, limit: str, joint: str, excess: float, detail: str
               ) -> list[SafetyEvent]:
        self.hard_violations += 1
        if self.estop:
            # Already latched: further readings over the limit are counted, not re-reported.
            return []
        e = SafetyEvent(ev.ESTOP, limit, joint, excess, detail, now_s)
        self._estop_t = now_s
        self._ticks_since_estop = 0
        self.estop = True
        self.estop_reason = f"{limit}{'[' + joint + ']' if joint else ''}: {detail}"
        self._pending.append(e)
        return [e]

    # -- e-stop reset ----------------------------------------------------------------------
    def reset_estop(self, now_s: float) -> tuple[bool, str]:
        """Clear the latch if the cause is gone; the policy then needs a full calm period."""
        if not self.estop:
            return True, "no e-stop latched"
        problems = []
        if self.joint_watch.status(now_s) != FRESH:
            problems.append("joint_states are not fresh")
        if self.q is not None:
            tol = self.config.hard_limit_tolerance_rad
            for i, lim in enumerate(self.arm.limits):
                if not lim.lower - tol <= self.q[i] <= lim.upper + tol:
                    problems.append(f"{self.joint_names[i]} beyond its hard limit")
        if self.wrench is not None:
            lim = self.envelope.measured
            w = self.wrench
            f = math.sqrt(w[0] ** 2 + w[1] ** 2 + w[2] ** 2)
            t = math.sqrt(w[3] ** 2 + w[4] ** 2 + w[5] ** 2)
            if (f > lim.max_force_n or t > lim.max_torque_nm
                    or any(abs(w[k]) > lim.max_force_per_axis_n[k] for k in range(3))
                    or any(abs(w[3 + k]) > lim.max_torque_per_axis_nm[k] for k in range(3))):
                problems.append(f"measured wrench still over the limit ({f:.1f} N, {t:.2f} N·m)")
        if problems:
            why = "; ".join(problems)
            self._pending.append(SafetyEvent(ev.ESTOP_RESET_REFUSED, "", "", 0.0, why, now_s))
            return False, f"refused: {why}"
        reason = self.estop_reason
        self.estop = False
        self.estop_reason = ""
        self._invalid_times.clear()
        self.policy_invalid = False
        self._lose_authority(now_s, "estop_reset", "e-stop reset", 0.0)
        self.monitor.reset()
        self._monitor_armed = False
        self._pending.append(SafetyEvent(ev.ESTOP_RESET, "", "", 0.0, f"cleared: {reason}", now_s))
        return True, f"e-stop cleared (was: {reason})"

    # -- the tick --------------------------------------------------------------------------
    def _policy_problem(self, now_s: float) -> tuple[str, str, float]:
        """Return (code, detail, reaction delay s) of why the policy may not drive, or ''."""
        cfg = self.config
        ref = self.joint_watch.last_stamp_s
        st = self.policy_watch.status(now_s, ref)
        if st != FRESH:
            return f"policy_{st}", f"policy command {st}", self._stale_delay(
                self.policy_watch, st, now_s, ref)
        if self.policy_invalid:
            return ("invalid_command", "the last policy command was invalid",
                    max(0.0, now_s - self._invalid_times[-1]) if self._invalid_times else 0.0)
        if cfg.require_confidence:
            cst = self.confidence_watch.status(now_s, ref)
            if cst != FRESH:
                return f"confidence_{cst}", f"policy confidence {cst}", self._stale_delay(
                    self.confidence_watch, cst, now_s, ref)
            # Hysteresis: leaving needs the enter threshold, returning the lower exit one.
            d_lim = cfg.disagreement_enter_rad if self.authority else cfg.disagreement_exit_rad
            o_lim = cfg.ood_enter if self.authority else cfg.ood_exit
            # Reaction counted from the arrival of the confidence sample that crossed.
            arrived = self.confidence_watch.last_arrival_s
            delay = max(0.0, now_s - arrived) if arrived is not None else 0.0
            if not self.disagreement_rad <= d_lim:
                return ("disagreement",
                        f"ensemble disagreement {self.disagreement_rad:.4f} rad > {d_lim} rad",
                        delay)
            if not self.ood <= o_lim:
                return "ood", f"OOD score {self.ood:.3f} > {o_lim}", delay
        return "", "", 0.0

    @staticmethod
    def _stale_delay(watch: StreamWatch, status: str, now_s: float, ref: float | None) -> float:
        """Seconds since the stream became stale (by arrival, or by stamp on the stamp clock)."""
        if status == "stale_arrival":
            since = watch.stale_since()
            return max(0.0, now_s - since) if since is not None else 0.0
        if status == "stale_stamp" and watch.last_stamp_s is not None:
            r = now_s if ref is None else ref
            return max(0.0, r - watch.last_stamp_s - watch.max_age_s)
        return 0.0

    def _lose_authority(self, now_s: float, code: str, detail: str, delay_s: float) -> None:
        self._calm_since = None
        if self.authority:
            self.authority = False
            periods = delay_s / self.config.period_s
            late = self._tick_late_periods
            self._pending.append(SafetyEvent(
                ev.FALLBACK, code, "", 0.0,
                f"{detail}; reaction {periods:.2f} control periods after the condition held "
                f"(this tick ran {late:.2f} periods late)", now_s, reaction_periods=periods,
                tick_late_periods=late))
        self.fallback_reason = code

    def tick(self, now_s: float, dt_s: float | None = None) -> TickResult:
        """Decide the source, project its command, update the monitor; call once per period.

        `dt_s` is the time since the previous tick (default: the nominal period); the
        projector accepts [0.5, 2] periods and uses the nominal period outside that range.
        """
        cfg = self.config
        dt = cfg.period_s if dt_s is None else dt_s
        self.ticks += 1
        prev = self.clock.last_now_s
        self._tick_late_periods = (0.0 if prev is None else
                                   max(0.0, now_s - prev - cfg.period_s) / cfg.period_s)
        jump = self.clock.check(now_s)
        if jump:
            for w in (self.joint_watch, self.policy_watch, self.baseline_watch,
                      self.confidence_watch, self.wrench_watch, self.policy_wrench_watch):
                w.forget()
            self.policy_cmd = self.baseline_cmd = None
            self._lose_authority(now_s, "clock_jump", f"clock jumped {jump}", 0.0)
            self._pending.append(SafetyEvent(ev.CLOCK_JUMP, jump, "", 0.0,
                                             "inputs discarded; holding until fresh data", now_s))

        # Policy authority with hysteresis and calm period.
        problem, detail, delay = self._policy_problem(now_s)
        if problem:
            self._lose_authority(now_s, problem, detail, delay)
        elif not self.authority:
            if self._calm_since is None:
                self._calm_since = now_s
            # 1 ns slack: times are float seconds, "after 0.2 s" must not become 0.21 s.
            if now_s - self._calm_since >= cfg.calm_period_s - 1e-9:
                self.authority = True
                self._monitor_armed = True
                self._handover_until = now_s + cfg.handover_grace_s
                self.fallback_reason = ""
                self._pending.append(SafetyEvent(ev.RETURN, "calm_period", "", 0.0,
                                                 f"policy calm for {cfg.calm_period_s} s", now_s))

        # Source.
        js = self.joint_watch.status(now_s)
        base_fresh = (self.baseline_watch.status(now_s, self.joint_watch.last_stamp_s)
                      == FRESH)
        base_ok = self.baseline_cmd is not None and base_fresh
        if js != FRESH:
            source, hold_reason = SOURCE_HOLD, f"joint_states_{js}"
        elif self.estop:
            source, hold_reason = SOURCE_HOLD, "estop"
        elif self.stage in POLICY_STAGES and self.authority and self.policy_cmd is not None:
            source, hold_reason = SOURCE_POLICY, ""
        elif base_ok:
            source, hold_reason = SOURCE_BASELINE, ""
        else:
            source, hold_reason = SOURCE_HOLD, "baseline_unavailable"
        if source == SOURCE_HOLD and (self.source != SOURCE_HOLD
                                      or hold_reason != self.hold_reason):
            since = self.joint_watch.stale_since() if js != FRESH else None
            periods = max(0.0, now_s - since) / cfg.period_s if since is not None else 0.0
            late = self._tick_late_periods
            detail = hold_reason
            if hold_reason == "baseline_unavailable":
                detail = (self.baseline_watch.describe(now_s, self.joint_watch.last_stamp_s)
                          if not base_fresh else "baseline/joint_command: no valid command yet")
            if hold_reason == "estop":
                detail = self.estop_reason
                periods = max(0.0, now_s - self._estop_t) / cfg.period_s
                # Held in the tick right after the latch: any delay was the scheduler's.
                if self._ticks_since_estop == 0:
                    late = periods
            self._pending.append(SafetyEvent(ev.HOLD, hold_reason, "", 0.0, detail, now_s,
                                             reaction_periods=periods,
                                             tick_late_periods=late))
        elif source != SOURCE_HOLD and self.source == SOURCE_HOLD:
            self._pending.append(SafetyEvent(ev.RESUME, source, "", 0.0, f"{source} drives",
                                             now_s))
        if source != self.source and SOURCE_HOLD not in (source, self.source):
            self._pending.append(SafetyEvent(ev.SOURCE, source, "", 0.0,
                                             f"{self.source} -> {source}", now_s))
        self.source = source
        self.hold_reason = hold_reason
        if self.estop:
            self._ticks_since_estop += 1

        # Command.
        proj = self.projector
        mode = cfg.mode
        if source == SOURCE_HOLD:
            if mode == EFFORT:
                res = proj.effort_hold(self.q, self.qd)
            else:
                res = proj.brake(dt, mode, self.q)
        else:
            cmd = self.policy_cmd if source == SOURCE_POLICY else self.baseline_cmd
            assert cmd is not None
            if mode == POSITION:
                res = proj.project_position(cmd.names, cmd.values, dt, self.q)
            elif mode == VELOCITY:
                res = proj.project_velocity(cmd.names, cmd.values, dt, self.q)
            else:
                res = proj.project_effort(cmd.names, cmd.values, self.q, self.qd)
        intervened = res.intervened and source != SOURCE_HOLD
        self.interventions += intervened
        for e in res.events:
            self._pending.append(_at(e, now_s))
        if res.command:
            self.last_command = res.command

        # Monitor (only while the policy is meant to drive).
        verdict = None
        if self.stage in POLICY_STAGES and not self.estop and self._monitor_armed:
            err = 0.0
            if self.q is not None and res.command and mode == POSITION:
                err = max(abs(c - m) for c, m in zip(res.command, self.q))
            counted = (intervened and source == SOURCE_POLICY
                       and res.deviation > cfg.monitor.min_intervention_rad
                       and now_s >= self._handover_until)
            limits = (tuple(sorted({e.limit for e in res.events if e.kind == ev.INTERVENTION}))
                      if counted else ())
            verdict = self.monitor.update(now_s, counted, source != SOURCE_POLICY, err,
                                          self.force_above_warning, limits)
            if verdict is not None:
                self._pending.append(SafetyEvent(ev.MONITOR, "rollback", "", 0.0,
                                                 "; ".join(verdict.reasons), now_s))
                new = STAGE_DROP[self.stage]
                self.set_stage(new, now_s, "monitor: " + "; ".join(verdict.reasons))
                self._lose_authority(now_s, "monitor", "; ".join(verdict.reasons), 0.0)

        wrench = None
        if (source == SOURCE_POLICY and self.policy_wrench is not None
                and self.policy_wrench_watch.status(now_s) == FRESH):
            wrench = self.policy_wrench
        events, self._pending = self._pending, []
        status = (self.stage, source, self.estop, self.estop_reason, self.fallback_reason)
        changed = status != self._last_status
        self._last_status = status
        return TickResult(res.command, mode, source, self.stage, self.estop, intervened, events,
                          wrench, changed, verdict)

    def status(self) -> dict[str, object]:
        """Return the latched status record (safety_filter/status), hash included."""
        return {
            "rollout_stage": self.stage,
            "source": self.source,
            "estop": self.estop,
            "estop_reason": self.estop_reason,
            "fallback_reason": self.fallback_reason,
            "hold_reason": self.hold_reason if self.source == SOURCE_HOLD else "",
            "envelope_sha256": self.envelope.sha256,
        }


def _finite_list(values: Sequence[float] | None, n: int) -> list[float] | None:
    if values is None:
        return None
    try:
        if len(values) != n:
            return None
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    return out if all(math.isfinite(v) for v in out) else None


def _at(e: SafetyEvent, now_s: float) -> SafetyEvent:
    return SafetyEvent(e.kind, e.limit, e.joint, e.excess, e.detail, now_s)

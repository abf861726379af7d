"""The reality-gap checklist: six rows, each green, amber or red, from typed evidence.

Every rule is a plain function of `AuditEvidence` and `Thresholds`, and every row says which
evidence it used and which mitigation is still missing. Red blocks deployment; amber needs a
planned mitigation (the `missing` list is that plan's starting point). Absent evidence never
counts in favour: the rules fail closed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sim2real_ros.audit.evidence import (
    ACTUATOR_BOUNDING_AXES,
    DYNAMICS_AXES,
    GAP_TITLES,
    GAPS,
    NOISE_MEASURED_KEYS,
    VISUAL_AXES,
    AuditEvidence,
    CalibrationEvidence,
    FaultResult,
    HilRecord,
    LatencyMeasurement,
    MeasuredNoise,
    RandomizedAxis,
    age_days,
    parse_utc,
)

GREEN, AMBER, RED = "green", "amber", "red"
_RANK = {GREEN: 0, AMBER: 1, RED: 2}


@dataclass(frozen=True)
class Thresholds:
    """The concrete numbers behind the rules (docs/audit.md explains each)."""

    calibration_min_runs: int = 3
    calibration_max_age_days: float = 30.0
    dynamics_min_randomized_axes: int = 3
    world_model_max_flagged_fraction: float = 0.10
    noise_factor: float = 2.0
    latency_abs_tolerance_s: float = 0.005
    latency_rel_tolerance: float = 0.20
    hil_min_episodes: int = 20
    hil_max_age_days: float = 90.0
    fault_record_max_age_days: float = 30.0
    max_reaction_periods: float = 2.0
    visual_min_coverage: float = 0.95

    def __post_init__(self) -> None:
        if self.calibration_min_runs < 1:
            raise ValueError(f"calibration_min_runs must be >= 1, got {self.calibration_min_runs}")
        if self.noise_factor < 1.0:
            raise ValueError(f"noise_factor must be >= 1, got {self.noise_factor}")
        for name in ("calibration_max_age_days", "hil_max_age_days", "fault_record_max_age_days",
                     "latency_abs_tolerance_s", "latency_rel_tolerance", "max_reaction_periods"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class Row:
    """One checklist row: status, the rule that decided it, evidence used, mitigation missing."""

    gap: str
    status: str
    rule: str
    evidence: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        """Return the row's display name."""
        return GAP_TITLES[self.gap]

    def to_dict(self) -> dict[str, Any]:
        """Return the row as a JSON-ready dict."""
        d = asdict(self)
        d["title"] = self.title
        return d


@dataclass
class Checklist:
    """All six rows and the verdict."""

    rows: list[Row]
    thresholds: Thresholds
    now_utc: str

    @property
    def overall(self) -> str:
        """Return the worst status of any row."""
        return max((r.status for r in self.rows), key=_RANK.__getitem__)

    @property
    def deployable(self) -> bool:
        """Return False when any row is red."""
        return all(r.status != RED for r in self.rows)

    def row(self, gap: str) -> Row:
        """Return the row of one gap."""
        return next(r for r in self.rows if r.gap == gap)


# --------------------------------------------------------------------------------------------
# Safety-suite fault names -> the wrapper capability each one exercises.

SAFETY_CAPABILITIES = ("bounds", "watchdog", "fallback", "estop", "monitor_rollback")
# The playbook's green: bounds, fallback, monitor + rollback tested. The watchdog is required by
# the latency row.
REQUIRED_SAFETY_CAPABILITIES = ("bounds", "fallback", "monitor_rollback")
_CAPABILITY_WORDS = {
    "bounds": ("bound", "envelope", "projection", "project", "clip", "limit", "fuzz",
               "adversarial", "invalid_command", "nan"),
    # A killed policy is caught by the watchdog (its stream goes stale) before the fallback.
    "watchdog": ("watchdog", "stale", "joint_states", "clock", "out_of_order", "timeout",
                 "missing_state", "stamp", "kill"),
    "fallback": ("fallback", "kill", "uncertainty", "confidence", "ood", "policy_dead",
                 "policy_stop"),
    "estop": ("estop", "e_stop", "e-stop", "force", "spike", "hard_limit"),
    "monitor_rollback": ("rollback", "drift", "monitor"),
}


def fault_capabilities(fault: FaultResult) -> set[str]:
    """Return the wrapper capabilities a fault exercises, from its `gap` label or its name."""
    label = fault.gap.lower().replace(" ", "_").replace("+", "_")
    caps = {c for c in SAFETY_CAPABILITIES if label == c}
    if label in ("monitor", "rollback"):
        caps.add("monitor_rollback")
    name = f"{fault.name} {fault.gap}".lower()
    for cap, words in _CAPABILITY_WORDS.items():
        if any(w in name for w in words):
            caps.add(cap)
    # A force spike tests the e-stop latch, not an uncertainty spike's fallback.
    if "uncertainty" in name or "confidence" in name:
        caps.discard("estop")
    return caps


def _tested(fault: FaultResult, th: Thresholds) -> bool:
    slow = fault.reaction_periods is not None and fault.reaction_periods > th.max_reaction_periods
    return fault.injected and fault.survived and not slow


# --------------------------------------------------------------------------------------------
# Rows


def visual_row(ev: AuditEvidence, th: Thresholds) -> Row:
    """Visual: randomization covers the camera's variation / some axes only / no match."""
    sim = ev.sim
    uses = ev.policy_uses_images
    if uses is None and sim is not None:
        # A policy trained in a simulator without a camera cannot have learned from images.
        uses = sim.camera_enabled
    evidence: list[str] = []
    if sim is not None:
        evidence.append(f"camera in simulator: {'on' if sim.camera_enabled else 'off'} "
                        f"({sim.source})")
    if uses is None:
        return Row("visual", RED, "no simulator spec: sim visuals cannot be shown to match",
                   evidence, ["pass the randomization spec (--spec)"])
    if not uses:
        evidence.append("policy observes no images (proprioceptive observations only)")
        return Row("visual", GREEN, "not applicable: the policy observes no images", evidence)
    if sim is None or not sim.camera_enabled:
        return Row("visual", RED, "the policy uses a camera the simulator does not render",
                   evidence, ["enable the simulated camera and randomize its appearance"])
    active = {k: v for k, v in sim.active("visual").items() if k in VISUAL_AXES}
    evidence += [f"visual axis {v.describe()}" for v in active.values()]
    absent = [a for a in VISUAL_AXES if a not in active]
    cov = ev.image_coverage
    if cov is not None:
        evidence.append(f"real images covered by randomized renders: {cov.fraction:.0%} "
                        f"({cov.n_real} real, {cov.n_sim} rendered, {cov.source})")
    if cov is not None and cov.fraction < th.visual_min_coverage:
        return Row("visual", RED,
                   f"sim visuals don't match the camera: coverage {cov.fraction:.0%} < "
                   f"{th.visual_min_coverage:.0%}", evidence,
                   [f"widen or add appearance randomization ({', '.join(absent) or 'ranges'})"])
    if not active:
        return Row("visual", RED, "the camera is rendered without appearance randomization",
                   evidence, [f"randomize {', '.join(VISUAL_AXES)}"])
    if absent:
        return Row("visual", AMBER, f"some axes only ({len(active)}/{len(VISUAL_AXES)})",
                   evidence, [f"randomize {', '.join(absent)}"])
    if cov is None:
        return Row("visual", AMBER, "all axes randomized, coverage of the real camera unmeasured",
                   evidence, ["record camera images on the cell (--bag) to measure coverage"])
    return Row("visual", GREEN, "randomization covers the real camera's variation", evidence)


def _unit_conflict(units: dict[str, str]) -> str | None:
    ids = sorted(set(units.values()))
    if len(ids) > 1:
        return "unit identities disagree: " + ", ".join(f"{s}={u}" for s, u in units.items())
    return None


def _calibration_problems(
    cal: CalibrationEvidence, units: dict[str, str], now: datetime, th: Thresholds
) -> list[str]:
    problems = []
    if not units:
        problems.append("no unit to match it against (declare --unit or give a bag/live graph)")
    for source, unit in units.items():
        if cal.unit_id != unit:
            problems.append(f"unit {cal.unit_id!r} is not the {source} unit {unit!r}")
    if cal.n_runs < th.calibration_min_runs:
        problems.append(f"{cal.n_runs} run(s) < {th.calibration_min_runs}")
    age = age_days(cal.created_utc, now)
    if age > th.calibration_max_age_days:
        problems.append(f"{age:.0f} days old > {th.calibration_max_age_days:g}")
    if age < -1.0 / 24.0:
        problems.append(f"created {-age:.1f} days in the future")
    if not cal.nominal:
        problems.append("no nominal parameters")
    return problems


def dynamics_row(ev: AuditEvidence, th: Thresholds, now: datetime) -> Row:
    """Dynamics: system ID of this unit / tuned from a spec sheet / first principles only."""
    units = ev.units()
    evidence = [f"unit: {u} ({s})" for s, u in units.items()]
    missing: list[str] = []
    conflict = _unit_conflict(units)
    if conflict:
        evidence.append(conflict)
    valid: list[CalibrationEvidence] = []
    for cal in ev.calibrations:
        problems = _calibration_problems(cal, units, now, th)
        age = age_days(cal.created_utc, now)
        desc = (f"calibration {cal.path}: unit {cal.unit_id}, {cal.n_runs} runs, "
                f"{age:.1f} days old")
        evidence.append(desc + (f" — not usable: {'; '.join(problems)}" if problems else ""))
        if not problems:
            valid.append(cal)
    wm = ev.world_model
    wm_ok = True
    if wm is not None:
        wm_ok = wm.flagged_fraction <= th.world_model_max_flagged_fraction
        evidence.append(
            f"world-model check ({wm.source}): {wm.flagged_fraction:.0%} of {wm.n_states} states "
            f"flagged (divergence > {wm.threshold_rad:.3g} rad or outside its data), mean "
            f"divergence {wm.mean_divergence_rad:.3g} rad")
    if valid and wm_ok:
        if wm is None:
            missing.append("optional: world-model consistency check (--world-model)")
        return Row("dynamics", GREEN, "system identification of the actual unit", evidence,
                   missing)
    randomized = {}
    if ev.sim is not None:
        randomized = {k: v for k, v in ev.sim.active("dynamics").items()
                      if k in DYNAMICS_AXES and v.randomized}
        evidence += [f"dynamics axis {v.describe()}" for v in randomized.values()]
    if valid and wm is not None and not wm_ok:
        return Row("dynamics", AMBER,
                   f"calibrated, but the world model disagrees on {wm.flagged_fraction:.0%} > "
                   f"{th.world_model_max_flagged_fraction:.0%} of visited states", evidence,
                   ["investigate the flagged states; fit a residual model or recalibrate"])
    unit = ev.declared_unit or next(iter(units.values()), "<unit>")
    missing.append(f"calibrate unit {unit}: >= {th.calibration_min_runs} sysid runs, at most "
                   f"{th.calibration_max_age_days:g} days old (sim2real sysid fit)")
    if ev.calibrations:
        return Row("dynamics", AMBER, "calibrated, but not usable for this unit now", evidence,
                   missing)
    if len(randomized) >= th.dynamics_min_randomized_axes:
        return Row("dynamics", AMBER,
                   f"tuned from the spec sheet (URDF nominal, {len(randomized)} dynamics axes "
                   "randomized)", evidence, missing)
    return Row("dynamics", RED,
               f"first-principles model only ({len(randomized)} < "
               f"{th.dynamics_min_randomized_axes} dynamics axes randomized, no calibration)",
               evidence, missing)


def _measured_by_key(ev: AuditEvidence) -> dict[str, list[MeasuredNoise]]:
    out: dict[str, list[MeasuredNoise]] = {}
    for m in ev.measured_noise:
        out.setdefault(m.key, []).append(m)
    return out


def _noise_match(axis: RandomizedAxis, m: MeasuredNoise, factor: float) -> str | None:
    """Return why a configured std range does not cover a measured std within `factor`."""
    lo, hi = min(axis.low, axis.high), max(axis.low, axis.high)
    bad = [v for v in m.std if not (lo / factor <= v <= hi * factor)]
    if bad:
        return (f"{axis.key} [{lo:.3g}, {hi:.3g}] is not within x{factor:g} of measured "
                f"{m.key} {', '.join(f'{v:.3g}' for v in bad)} ({m.source})")
    return None


def sensor_row(ev: AuditEvidence, th: Thresholds) -> Row:
    """Sensor / noise: measured profile injected / partially modelled / ideal sensors."""
    sim = ev.sim
    if sim is None:
        return Row("sensor", RED, "no simulator spec: sensors must be taken as ideal", [],
                   ["pass the randomization spec (--spec)"])
    active = sim.active("sensor")
    evidence = [f"sensor term {v.describe()}" for v in active.values()]
    measured = _measured_by_key(ev)
    for ms in measured.values():
        evidence += [f"measured {m.describe()}" for m in ms]
    if not active:
        return Row("sensor", RED, "sensors assumed ideal (no noise, bias or drift in the spec)",
                   evidence, ["measure the noise at rest (bag) and inject it in the spec"])
    groups = {
        "joint position noise": ("joint_position_noise",),
        "joint velocity noise": ("joint_velocity_noise",),
        "encoder bias or drift": ("joint_position_bias", "joint_position_drift"),
        "F/T noise": ("ft_force_noise", "ft_torque_noise"),
    }
    missing = [f"model {g}" for g, chans in groups.items() if not any(c in active for c in chans)]
    mismatches: list[str] = []
    compared = 0
    for channel, (key, _unit) in NOISE_MEASURED_KEYS.items():
        for m in measured.get(key, []):
            if channel not in active:
                mismatches.append(f"{key} measured ({m.source}) but {channel} not modelled")
                continue
            compared += 1
            why = _noise_match(active[channel], m, th.noise_factor)
            if why:
                mismatches.append(why)
    missing += [f"fix: {m}" for m in mismatches]
    if not measured.get("joint_position_std_rad"):
        missing.append("measure joint position noise at rest (a bag with the arm still, or a "
                       "calibration with a noise profile)")
    if not missing:
        return Row("sensor", GREEN,
                   f"measured noise profile injected ({compared} channel(s) within "
                   f"x{th.noise_factor:g} of measured)", evidence)
    return Row("sensor", AMBER, "noise modelled partially", evidence, missing)


def _hil_problems(rec: HilRecord, units: dict[str, str], now: datetime,
                  th: Thresholds) -> list[str]:
    problems = []
    if not units:
        problems.append("no unit to match it against")
    for source, unit in units.items():
        if rec.unit_id != unit:
            problems.append(f"unit {rec.unit_id!r} is not the {source} unit {unit!r}")
    if rec.n_episodes < th.hil_min_episodes:
        problems.append(f"{rec.n_episodes} episodes < {th.hil_min_episodes}")
    if age_days(parse_utc(rec.created_utc, rec.path), now) > th.hil_max_age_days:
        problems.append(f"older than {th.hil_max_age_days:g} days")
    if not rec.passed:
        problems.append("did not pass")
    return problems


def actuator_row(ev: AuditEvidence, th: Thresholds, now: datetime) -> Row:
    """Contact / actuator: HIL validated / bounded by actuator models / commands as effects."""
    units = ev.units()
    evidence: list[str] = []
    valid = []
    for rec in ev.hil:
        problems = _hil_problems(rec, units, now, th)
        evidence.append(
            f"HIL record {rec.path or '<record>'}: {rec.backend}, unit {rec.unit_id}, "
            f"{rec.n_episodes} episodes, success {rec.success_rate:.0%}, tracking error "
            f"{rec.tracking_error_rad:.3g} rad, {'passed' if rec.passed else 'FAILED'}"
            + (f" — not usable: {'; '.join(problems)}" if problems else ""))
        if not problems:
            valid.append(rec)
    # The newest record for this unit decides: a failed evaluation after a passed one means the
    # stack no longer transfers.
    mine = [r for r in ev.hil if units and all(r.unit_id == u for u in units.values())]
    if mine:
        latest = max(mine, key=lambda r: parse_utc(r.created_utc, r.path))
        if not latest.passed:
            return Row("actuator", RED,
                       "the latest hardware-in-the-loop evaluation of this unit failed",
                       evidence, ["find and fix the failure, then re-run the HIL evaluation"])
    if valid:
        return Row("actuator", GREEN, "hardware-in-the-loop validated", evidence)
    bounding: list[str] = []
    if ev.sim is not None:
        act = ev.sim.active("actuator")
        evidence += [f"simulator always models: {s}" for s in ev.sim.actuator_structure]
        evidence += [f"actuator axis {v.describe()}" for v in act.values()]
        bounding = list(ev.sim.actuator_structure)
        bounding += [f"randomized {k}" for k in sorted(act) if k in ACTUATOR_BOUNDING_AXES]
    missing = [f"hardware-in-the-loop evaluation of this unit: >= {th.hil_min_episodes} "
               "episodes, passed (HIL run record)"]
    if bounding:
        return Row("actuator", AMBER, f"bounded by actuator models ({'; '.join(bounding)})",
                   evidence, missing)
    missing.insert(0, f"model the actuator: one of {', '.join(ACTUATOR_BOUNDING_AXES)}")
    return Row("actuator", RED, "commands treated as effects (no actuator model bounds them)",
               evidence, missing)


def _watchdog_faults(ev: AuditEvidence, th: Thresholds) -> list[FaultResult]:
    if ev.faults is None:
        return []
    return [f for f in ev.faults.faults if "watchdog" in fault_capabilities(f) and _tested(f, th)]


def latency_coverage(
    m: LatencyMeasurement, ev: AuditEvidence, th: Thresholds
) -> tuple[bool, str]:
    """Return whether the sim's latency model covers one measured loop delay, and why."""
    assert ev.sim is not None
    model = ev.sim.latency
    extra = 0.0
    parts = []
    units = ev.units()
    for cal in ev.calibrations:
        # Drive and sensor delay come from system identification of this unit; the graph adds
        # the rest. Another unit's drive delay says nothing about this one.
        if not units or any(cal.unit_id != u for u in units.values()):
            continue
        if cal.action_latency_s is not None:
            extra = float(cal.action_latency_s) + float(cal.observation_latency_s or 0.0)
            parts.append(f"+ {extra * 1e3:.1f} ms drive/sensor delay from {cal.path}")
            break
    p50 = m.obs_to_command_p50_s + extra
    p99 = m.obs_to_command_p99_s + extra
    lo, hi = model.total_range_s()
    tol = max(th.latency_abs_tolerance_s, th.latency_rel_tolerance * p50)
    ok = (lo - tol <= p50 <= hi + tol) and p99 <= hi + model.jitter_s + tol
    text = (f"measured loop delay p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms "
            f"({m.source}, n={m.n}{' ' + ' '.join(parts) if parts else ''}) vs model "
            f"[{lo * 1e3:.1f}, {hi * 1e3:.1f}] ms + jitter {model.jitter_s * 1e3:.1f} ms, "
            f"tolerance {tol * 1e3:.1f} ms: {'covered' if ok else 'NOT covered'}")
    return ok, text


def latency_row(ev: AuditEvidence, th: Thresholds) -> Row:
    """Latency: realistic timing in sim plus the wrapper / approximate / zero latency."""
    if ev.sim is None:
        return Row("latency", RED, "no simulator spec: zero latency must be assumed", [],
                   ["pass the randomization spec (--spec)"])
    model = ev.sim.latency
    lo, hi = model.total_range_s()
    obs_ms = [v * 1e3 for v in model.observation_delay_s]
    act_ms = [v * 1e3 for v in model.action_delay_s]
    evidence = [f"sim latency model ({model.source or ev.sim.source}): observation "
                f"{obs_ms[0]:.1f}-{obs_ms[1]:.1f} ms, action {act_ms[0]:.1f}-{act_ms[1]:.1f} ms, "
                f"jitter p99 {model.jitter_s * 1e3:.1f} ms, drops {model.drop_probability:.1%}"]
    if model.is_zero:
        return Row("latency", RED, "the simulator assumes zero latency", evidence,
                   ["measure the loop delay (--bag or --live) and model it in the spec"])
    missing: list[str] = []
    covered = []
    for m in ev.latency:
        ok, text = latency_coverage(m, ev, th)
        evidence.append(text)
        covered.append(ok)
    if not ev.latency:
        missing.append("measure the observation-to-action latency (--bag with the graph's "
                       "topics, or --live)")
    elif not all(covered):
        missing.append("widen the spec's observation/action delay to cover the measured delay")
    watchdog = _watchdog_faults(ev, th)
    if watchdog:
        evidence.append("watchdog fault-tested: " + ", ".join(f.name for f in watchdog))
    else:
        missing.append("fault-test the safety filter's watchdog (stale state / stale command)")
    if not missing:
        return Row("latency", GREEN, "realistic timing in sim plus the wrapper's watchdog",
                   evidence)
    return Row("latency", AMBER, "approximate timing only", evidence, missing)


def safety_row(ev: AuditEvidence, th: Thresholds, now: datetime) -> Row:
    """Safety wrapper: bounds, fallback, monitor + rollback tested / partial / raw policy."""
    rec = ev.faults
    evidence: list[str] = []
    if ev.envelope_sha256:
        evidence.append(f"envelope {ev.envelope_source} sha256 {ev.envelope_sha256[:12]}")
    live_status = ev.live.safety_status if ev.live is not None else None
    if live_status is not None:
        evidence.append(f"safety filter running on the live graph: {live_status}")
    if rec is None:
        if ev.envelope_sha256 or live_status is not None:
            return Row("safety", AMBER, "wrapper present, not fault-tested", evidence,
                       ["run the safety fault-injection suite and pass its record "
                        "(--fault-record)"])
        return Row("safety", RED, "raw policy: no envelope, no fault record, no safety filter",
                   evidence, ["deploy the safety filter with an envelope, fault-test it"])
    age = age_days(rec.created_utc, now)
    evidence.append(f"fault record {rec.path}: {len(rec.faults)} faults, {age:.1f} days old, "
                    f"envelope {rec.envelope_sha256[:12]}")
    failed = [f for f in rec.faults if f.injected and not f.survived]
    for f in rec.faults:
        caps = ",".join(sorted(fault_capabilities(f))) or "unclassified"
        state = ("not injected" if not f.injected else "survived" if f.survived else "FAILED")
        react = "" if f.reaction_periods is None else f", {f.reaction_periods:g} periods"
        evidence.append(f"fault {f.name} [{caps}]: {state}{react}")
    if failed:
        return Row("safety", RED, "the wrapper failed injected faults: "
                   + ", ".join(f.name for f in failed), evidence,
                   ["fix the safety filter until every injected fault is survived"])
    tested = set()
    for f in rec.faults:
        if _tested(f, th):
            tested |= fault_capabilities(f)
    missing = [f"fault-test {c.replace('_', ' + ')}" for c in REQUIRED_SAFETY_CAPABILITIES
               if c not in tested]
    slow = [f.name for f in rec.faults if f.injected and f.survived and not _tested(f, th)]
    if slow:
        missing.append(f"react within {th.max_reaction_periods:g} control periods: "
                       + ", ".join(slow))
    if age > th.fault_record_max_age_days:
        missing.append(f"re-run the fault suite (record {age:.0f} days old > "
                       f"{th.fault_record_max_age_days:g})")
    # What the running filter reports is what is deployed; the file is the fallback.
    live_sha = (live_status or {}).get("envelope_sha256")
    current = live_sha or ev.envelope_sha256
    if live_sha and ev.envelope_sha256 and live_sha != ev.envelope_sha256:
        evidence.append(f"the running filter's envelope {live_sha[:12]} is not "
                        f"{ev.envelope_source} ({ev.envelope_sha256[:12]})")
    if current is None:
        missing.append("name the deployed envelope (--envelope or --live) to match the record")
    elif current != rec.envelope_sha256:
        missing.append(f"fault-test the deployed envelope {current[:12]} (record is for "
                       f"{rec.envelope_sha256[:12]})")
    if not missing:
        return Row("safety", GREEN, "bounds, fallback, monitor + rollback fault-tested", evidence)
    return Row("safety", AMBER, "partial, not fully fault-tested", evidence, missing)


def evaluate(ev: AuditEvidence, now: datetime, th: Thresholds | None = None) -> Checklist:
    """Compute all six rows from the evidence at time `now` (UTC)."""
    th = th or Thresholds()
    rows = [
        visual_row(ev, th),
        dynamics_row(ev, th, now),
        sensor_row(ev, th),
        actuator_row(ev, th, now),
        latency_row(ev, th),
        safety_row(ev, th, now),
    ]
    assert [r.gap for r in rows] == list(GAPS)
    return Checklist(rows, th, now.isoformat())

"""Typed evidence for the six reality-gap rows, and the adapters that read it from files.

The checklist never opens a file: it reads these dataclasses. The adapters at the bottom build
them from the other rooms' outputs through those rooms' own loaders (randomization spec,
calibration, bags, fault record) and from the hardware-in-the-loop run record defined here.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.config import ConfigError

GAPS = ("visual", "dynamics", "sensor", "actuator", "latency", "safety")
GAP_TITLES = {
    "visual": "Visual",
    "dynamics": "Dynamics",
    "sensor": "Sensor / noise",
    "actuator": "Contact / actuator",
    "latency": "Latency",
    "safety": "Safety wrapper",
}


def parse_utc(text: str, path: str | Path | None = None, key: str = "created_utc") -> datetime:
    """Parse an ISO-8601 time; a time without a zone is taken as UTC."""
    try:
        t = datetime.fromisoformat(str(text))
    except (TypeError, ValueError) as exc:
        raise ConfigError(path, key, text, "an ISO-8601 time, e.g. 2026-05-01T12:00:00Z") from exc
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def age_days(created: datetime, now: datetime) -> float:
    """Return how many days before `now` a record was made (negative if in the future)."""
    return (now - created).total_seconds() / 86400.0


# --------------------------------------------------------------------------------------------
# The simulator as configured (from the randomization spec, or a calibration's spec)


@dataclass(frozen=True)
class RandomizedAxis:
    """One quantity the simulator perturbs: canonical axis, the spec key, and its range."""

    axis: str
    key: str
    low: float
    high: float
    operation: str = "add"

    @property
    def active(self) -> bool:
        """True when the term changes the quantity at all (not the identity draw)."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return False
        if self.operation == "scale":
            return not (self.low == 1.0 and self.high == 1.0)
        # add and abs: a zero value is no noise, no delay, no offset.
        return not (self.low == 0.0 and self.high == 0.0)

    @property
    def randomized(self) -> bool:
        """True when draws differ (a range, not one tuned value)."""
        return self.active and self.high > self.low

    def describe(self) -> str:
        """Return `key [low, high] (operation)` for the report."""
        return f"{self.key} [{self.low:.4g}, {self.high:.4g}] ({self.operation})"


@dataclass(frozen=True)
class LatencyModel:
    """The simulator's timing: delay ranges in seconds, per-step jitter, drop probability."""

    observation_delay_s: tuple[float, float] = (0.0, 0.0)
    action_delay_s: tuple[float, float] = (0.0, 0.0)
    jitter_s: float = 0.0
    drop_probability: float = 0.0
    source: str = ""

    def total_range_s(self) -> tuple[float, float]:
        """Return the loop delay the model can produce, observation plus action, before jitter."""
        lo = self.observation_delay_s[0] + self.action_delay_s[0]
        hi = self.observation_delay_s[1] + self.action_delay_s[1]
        return lo, hi

    @property
    def is_zero(self) -> bool:
        """True when the simulator assumes zero latency."""
        return self.total_range_s()[1] <= 0.0 and self.jitter_s <= 0.0


@dataclass(frozen=True)
class SimModelEvidence:
    """What the randomized simulator models, per gap, read from its spec."""

    source: str
    sha256: str | None
    camera_enabled: bool
    visual: dict[str, RandomizedAxis] = field(default_factory=dict)
    dynamics: dict[str, RandomizedAxis] = field(default_factory=dict)
    actuator: dict[str, RandomizedAxis] = field(default_factory=dict)
    sensor: dict[str, RandomizedAxis] = field(default_factory=dict)
    latency: LatencyModel = field(default_factory=LatencyModel)
    # Actuator limits the simulator always applies, randomized or not (e.g. torque saturation).
    actuator_structure: tuple[str, ...] = ()

    def active(self, gap: str) -> dict[str, RandomizedAxis]:
        """Return the active axes of one gap (visual, dynamics, actuator, sensor)."""
        axes: dict[str, RandomizedAxis] = getattr(self, gap)
        return {k: v for k, v in axes.items() if v.active}


# Canonical axis names the checklist knows. The spec adapter maps the sim room's term names
# onto them; an axis the simulator cannot model simply never appears.
VISUAL_AXES = ("light", "colour", "pixel_noise")
DYNAMICS_AXES = (
    "link_mass", "link_inertia", "com_offset", "joint_damping", "joint_friction",
    "contact_friction", "restitution", "gravity", "payload",
)
LATENCY_TERMS = ("observation_delay", "observation_jitter", "observation_drop", "action_delay",
                 "action_jitter", "action_drop")
ACTUATOR_AXES = ("kp", "kd", "torque_limit", "deadband", "backlash", "motor_lag")
# Actuator axes that bound what a command can achieve (saturation, dead zones, lag): without at
# least one of them in the simulator a command becomes its effect.
ACTUATOR_BOUNDING_AXES = ("torque_limit", "deadband", "backlash", "motor_lag")
SENSOR_CHANNELS = (
    "joint_position_noise", "joint_velocity_noise", "joint_effort_noise", "joint_position_bias",
    "joint_position_drift", "joint_position_quantization", "joint_velocity_quantization",
    "ft_force_noise", "ft_torque_noise", "ft_bias",
)
# The channel whose configured std is compared with a measured std (measured key, unit).
NOISE_MEASURED_KEYS = {
    "joint_position_noise": ("joint_position_std_rad", "rad"),
    "joint_velocity_noise": ("joint_velocity_std_rad_s", "rad/s"),
    "joint_effort_noise": ("joint_effort_std_nm", "N·m"),
    "ft_force_noise": ("ft_force_std_n", "N"),
    "ft_torque_noise": ("ft_torque_std_nm", "N·m"),
}


# --------------------------------------------------------------------------------------------
# Measurements and records from the cell


@dataclass(frozen=True)
class CalibrationEvidence:
    """A system-identification result of one unit."""

    path: str
    unit_id: str
    created_utc: datetime
    n_runs: int
    nominal: dict[str, Any] = field(default_factory=dict)
    action_latency_s: float | None = None
    observation_latency_s: float | None = None
    noise: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MeasuredNoise:
    """Sensor noise measured with the arm at rest: per-joint (or per-axis) std of one channel."""

    key: str
    std: tuple[float, ...]
    source: str
    n_samples: int = 0

    def describe(self) -> str:
        """Return `key = [..] from source` for the report."""
        vals = ", ".join(f"{v:.3g}" for v in self.std)
        return f"{self.key} = [{vals}] from {self.source}"


@dataclass(frozen=True)
class LatencyMeasurement:
    """Observation-to-action latency of a graph: observation header stamp to arm command.

    `obs_to_command_*` are from the joint_states stamp an action answers to the arrival of the
    arm command that carries it; `obs_to_policy_*` stop at the policy's command. Seconds.
    """

    source: str
    n: int
    obs_to_command_p50_s: float
    obs_to_command_p99_s: float
    obs_to_command_max_s: float
    obs_to_policy_p50_s: float | None = None
    obs_to_policy_p99_s: float | None = None
    state_transport_p50_s: float | None = None


@dataclass(frozen=True)
class FaultResult:
    """One fault the safety suite injected, and whether the wrapper survived it."""

    name: str
    gap: str
    injected: bool
    survived: bool
    reaction_periods: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class FaultRecordEvidence:
    """The safety suite's machine-readable fault-injection record."""

    path: str
    envelope_sha256: str
    created_utc: datetime
    faults: tuple[FaultResult, ...]


HIL_KIND = "hil"
HIL_BACKENDS = ("real", "hil", "proxy")


@dataclass(frozen=True)
class HilRecord:
    """One hardware-in-the-loop evaluation: the real control stack against a plant, N episodes.

    File format (JSON object, one per file; written by the transfer experiment):
    {"kind": "hil", "backend": "real"|"hil"|"proxy", "unit_id": str, "created_utc": ISO-8601,
     "success_rate": 0..1, "n_episodes": int >= 1, "tracking_error_rad": float >= 0,
     "passed": bool}
    """

    backend: str
    unit_id: str
    created_utc: str
    success_rate: float
    n_episodes: int
    tracking_error_rad: float
    passed: bool
    kind: str = HIL_KIND
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON object of the file format (without the path)."""
        d = asdict(self)
        d.pop("path")
        return d

    @classmethod
    def from_dict(cls, data: Any, path: str | Path = "<dict>") -> HilRecord:
        """Validate a record's fields; raise ConfigError naming the file, key and value."""
        if not isinstance(data, dict):
            raise ConfigError(path, "<root>", type(data).__name__, "a JSON object")
        if data.get("kind") != HIL_KIND:
            raise ConfigError(path, "kind", data.get("kind"), f"'{HIL_KIND}'")
        backend = data.get("backend")
        if backend not in HIL_BACKENDS:
            raise ConfigError(path, "backend", backend, f"one of {list(HIL_BACKENDS)}")
        unit = data.get("unit_id")
        if not isinstance(unit, str) or not unit:
            raise ConfigError(path, "unit_id", unit, "a non-empty string")
        created = data.get("created_utc")
        parse_utc(created, path)  # type: ignore[arg-type]
        rate = data.get("success_rate")
        if not _is_number(rate) or not 0.0 <= float(rate) <= 1.0:
            raise ConfigError(path, "success_rate", rate, "a number in [0, 1]")
        n = data.get("n_episodes")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(path, "n_episodes", n, "an integer >= 1")
        err = data.get("tracking_error_rad")
        if not _is_number(err) or not 0.0 <= float(err) < math.inf:
            raise ConfigError(path, "tracking_error_rad", err, "a finite number >= 0 (rad)")
        passed = data.get("passed")
        if not isinstance(passed, bool):
            raise ConfigError(path, "passed", passed, "true or false")
        return cls(str(backend), unit, str(created), float(rate), n, float(err), passed,
                   path=str(path))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def load_hil_record(path: str | Path) -> HilRecord:
    """Read a hardware-in-the-loop run record; ConfigError on a bad file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(p, "<file>", None, f"a readable file ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(p, "<file>", None, f"valid JSON ({exc.msg})") from exc
    return HilRecord.from_dict(data, p)


def write_hil_record(path: str | Path, record: HilRecord) -> Path:
    """Validate and write a hardware-in-the-loop run record as JSON; return the path."""
    p = Path(path)
    HilRecord.from_dict(record.to_dict(), p)  # refuse to write what load would refuse
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")
    return p


@dataclass(frozen=True)
class ImageCoverage:
    """How much of the real camera's image statistics the randomized renders cover (0..1)."""

    fraction: float
    n_real: int
    n_sim: int
    source: str


@dataclass(frozen=True)
class WorldModelSummary:
    """Result of the world-model consistency check (see worldmodel.consistency_check)."""

    n_states: int
    flagged_fraction: float
    out_of_data_fraction: float
    mean_divergence_rad: float
    max_divergence_rad: float
    threshold_rad: float
    source: str


@dataclass(frozen=True)
class LiveGraphEvidence:
    """What a running graph told the audit: the unit, whether the wrapper runs, its envelope."""

    duration_s: float
    unit_id: str | None = None
    safety_status: dict[str, Any] | None = None
    randomization_draw: dict[str, Any] | None = None
    topics_seen: tuple[str, ...] = ()


@dataclass
class AuditEvidence:
    """Everything the checklist decides on. Absent evidence is None or empty, never invented."""

    sim: SimModelEvidence | None = None
    calibrations: list[CalibrationEvidence] = field(default_factory=list)
    declared_unit: str | None = None
    # Unit identities the cell itself reported: {"bag <path>": id, "live graph": id}.
    observed_units: dict[str, str] = field(default_factory=dict)
    measured_noise: list[MeasuredNoise] = field(default_factory=list)
    latency: list[LatencyMeasurement] = field(default_factory=list)
    faults: FaultRecordEvidence | None = None
    envelope_sha256: str | None = None
    envelope_source: str = ""
    hil: list[HilRecord] = field(default_factory=list)
    policy_uses_images: bool | None = None
    image_coverage: ImageCoverage | None = None
    world_model: WorldModelSummary | None = None
    live: LiveGraphEvidence | None = None
    notes: list[str] = field(default_factory=list)

    def units(self) -> dict[str, str]:
        """Return every known identity of the unit being deployed on: {source: unit_id}."""
        out = dict(self.observed_units)
        if self.declared_unit:
            out["declared (--unit)"] = self.declared_unit
        return out


def as_floats(values: Any) -> tuple[float, ...]:
    """Return a scalar or sequence as a tuple of floats (empty for None)."""
    if values is None:
        return ()
    arr = np.atleast_1d(np.asarray(values, dtype=float)).ravel()
    return tuple(float(v) for v in arr)


# --------------------------------------------------------------------------------------------
# Adapters: the other rooms' files -> evidence. Their loaders are imported where used so the
# checklist (and its tests) need neither PyBullet nor rosbags.


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """Read a field from a dataclass-like object or a mapping."""
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _utc(value: Any, path: str | Path, key: str = "created_utc") -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    return parse_utc(value, path, key)


def calibration_evidence(path: str | Path) -> tuple[CalibrationEvidence, list[MeasuredNoise]]:
    """Read a calibration file (sysid room's loader); return it and the noise it measured."""
    from sim2real_ros.sysid.calibration import load_calibration

    cal = load_calibration(path)
    latency = _get(cal, "latency") or {}
    noise = dict(_get(cal, "noise") or {})
    ev = CalibrationEvidence(
        path=str(path),
        unit_id=str(_get(cal, "unit_id")),
        created_utc=_utc(_get(cal, "created_utc"), path),
        n_runs=int(_get(cal, "n_runs") or 0),
        nominal=dict(_get(cal, "nominal") or {}),
        action_latency_s=_opt_float(_get(latency, "action_latency_s")),
        observation_latency_s=_opt_float(_get(latency, "observation_latency_s")),
        noise=noise,
    )
    measured = [MeasuredNoise(key, as_floats(value), f"calibration {path}")
                for key, value in noise.items()
                if key in {k for k, _ in NOISE_MEASURED_KEYS.values()} and value is not None]
    return ev, measured


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def fault_record_evidence(path: str | Path) -> FaultRecordEvidence:
    """Read the safety suite's fault-injection record (safety room's loader)."""
    from sim2real_ros.safety.faults import load_fault_record

    rec = load_fault_record(path)
    faults = tuple(
        FaultResult(
            name=str(_get(f, "name")),
            gap=str(_get(f, "gap") or ""),
            injected=bool(_get(f, "injected")),
            survived=bool(_get(f, "survived")),
            reaction_periods=_opt_float(_get(f, "reaction_periods")),
            detail=str(_get(f, "detail") or ""),
        )
        for f in _get(rec, "faults") or []
    )
    return FaultRecordEvidence(str(path), str(_get(rec, "envelope_sha256")),
                               _utc(_get(rec, "created_utc"), path), faults)


@dataclass
class BagEvidence:
    """What one bag says: the unit it measured, noise at rest, and the graph's latency."""

    path: str
    unit_id: str | None
    noise: list[MeasuredNoise]
    latency: LatencyMeasurement | None
    topics: list[str]


def bag_unit_id(metadata: dict[str, Any]) -> str | None:
    """Return the unit serial a sysid bag's metadata names, if any."""
    unit = metadata.get("unit")
    if isinstance(unit, dict) and unit.get("serial"):
        return str(unit["serial"])
    return None


def bag_evidence(path: str | Path, joint_names: list[str] | None = None) -> BagEvidence:
    """Read one bag through the sysid room's reader; BagError for an unreadable bag."""
    from sim2real_ros.audit.latency import latency_from_bag, topic_matches
    from sim2real_ros.audit.noise import joint_noise_at_rest, wrench_noise_at_rest
    from sim2real_ros.sysid.bags import bag_info, read_joint_states, read_wrench

    info = bag_info(path)
    topics = list(info.topics)
    noise: list[MeasuredNoise] = []
    if any(topic_matches(t, "joint_states") for t in topics):
        js = read_joint_states(path, joint_names)
        noise, windows = joint_noise_at_rest(js.t_s, js.position, js.velocity, f"bag {path}",
                                             effort=js.effort)
        if noise and any(topic_matches(t, "force_torque_sensor_broadcaster/wrench")
                         for t in topics):
            w = read_wrench(path)
            noise += wrench_noise_at_rest(w.t_s, w.wrench, windows, f"bag {path}")
    return BagEvidence(str(path), bag_unit_id(info.metadata), noise, latency_from_bag(path),
                       topics)

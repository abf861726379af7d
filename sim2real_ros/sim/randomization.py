"""Domain randomization as data (Isaac Lab vocabulary) and the one seeded sampler.

A spec names terms from a fixed catalogue (TERMS). Each term says how its value is drawn:
`operation: scale|add|abs` against the nominal value, `distribution: uniform|log_uniform|gaussian`
with `range: [low, high]` (gaussian: `[mean, std]`), and `mode: startup|reset|interval`
(interval terms also take `interval_s`). Joint terms may name `joints:`, link terms `links:`;
`shared: true` draws one value for every joint/axis. Every realized draw is a `Draw`, a plain
record that serializes to JSON and rebuilds the exact same parameters.

A spec file is either a plain spec (`terms:` at the root) or a calibration file, whose
`randomization:` section is a spec and whose `nominal:` section holds PlantParams fields.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.config import ConfigError, load_yaml
from sim2real_ros.robot.model import ArmModel
from sim2real_ros.sim.actuator import ActuatorParams
from sim2real_ros.sim.camera import VisualParams
from sim2real_ros.sim.latency import LatencyParams
from sim2real_ros.sim.plant import PlantParams, resolve_params
from sim2real_ros.sim.sensors import SensorParams

OPERATIONS = ("scale", "add", "abs")
DISTRIBUTIONS = ("uniform", "log_uniform", "gaussian")
MODES = ("startup", "reset", "interval")
GROUPS = ("dynamics", "actuator", "latency", "sensor", "visual")
TERM_KEYS = ("operation", "distribution", "range", "mode", "joints", "links", "interval_s",
             "shared", "enabled")
INF = math.inf


@dataclass(frozen=True)
class TermDef:
    """One randomizable quantity: where it lives, its shape, unit and physical domain."""

    group: str  # the gap it targets: dynamics|actuator|latency|sensor|visual
    target: str  # "plant" | "actuator" | "latency" | "sensor" | "visual"
    field_name: str  # field of the target's params dataclass
    shape: str  # scalar | joint | link3 | vec2 | vec3
    unit: str
    domain: tuple[float, float]
    description: str


def _t(group: str, target: str, fld: str, shape: str, unit: str, lo: float, hi: float,
       desc: str) -> TermDef:
    return TermDef(group, target, fld, shape, unit, (lo, hi), desc)


# The catalogue, in the order terms are drawn. Every gap of the practice is covered.
TERMS: dict[str, TermDef] = {
    # dynamics
    "link_mass": _t("dynamics", "plant", "mass_scale", "scalar", "", 1e-3, INF,
                    "scale of every link's mass (and inertia)"),
    "link_inertia": _t("dynamics", "plant", "inertia_scale", "scalar", "", 1e-3, INF,
                       "extra scale of every link's inertia"),
    "com_offset": _t("dynamics", "plant", "com_offset_m", "link3", "m", -INF, INF,
                     "shift of a moving link's centre of mass, link frame"),
    "joint_damping": _t("dynamics", "plant", "joint_damping_nms", "joint", "N·m·s/rad", 0, INF,
                        "viscous joint damping"),
    "joint_friction": _t("dynamics", "plant", "joint_friction_nm", "joint", "N·m", 0, INF,
                         "Coulomb joint friction"),
    "armature": _t("dynamics", "plant", "armature_kgm2", "joint", "kg·m²", 0, INF,
                   "reflected rotor inertia"),
    "contact_lateral_friction": _t("dynamics", "plant", "lateral_friction", "scalar", "", 0, INF,
                                   "contact friction coefficient"),
    "contact_spinning_friction": _t("dynamics", "plant", "spinning_friction", "scalar", "m", 0,
                                    INF, "contact torsional friction"),
    "contact_rolling_friction": _t("dynamics", "plant", "rolling_friction", "scalar", "m", 0,
                                   INF, "contact rolling friction"),
    "contact_restitution": _t("dynamics", "plant", "restitution", "scalar", "", 0, 1,
                              "contact restitution"),
    "gravity_tilt": _t("dynamics", "plant", "gravity", "vec2", "rad", -0.5, 0.5,
                       "tilt of gravity about the base x and y axes (a base not level)"),
    "payload_mass": _t("dynamics", "plant", "payload_kg", "scalar", "kg", 0, INF,
                       "point mass at the tool frame"),
    "payload_offset": _t("dynamics", "plant", "payload_offset_m", "vec3", "m", -INF, INF,
                         "payload position in the tool frame"),
    # actuator
    "kp": _t("actuator", "plant", "kp_scale", "joint", "", 0, INF, "servo position-gain scale"),
    "kd": _t("actuator", "plant", "kd_scale", "joint", "", 0, INF, "servo velocity-gain scale"),
    "torque_limit": _t("actuator", "plant", "torque_limit_scale", "joint", "", 0, INF,
                       "scale of the URDF effort limits"),
    "motor_lag": _t("actuator", "plant", "motor_lag_s", "joint", "s", 0, INF,
                    "first-order lag of the motor torque"),
    "deadband": _t("actuator", "actuator", "deadband_rad", "joint", "rad", 0, INF,
                   "set-point changes smaller than this are ignored"),
    "backlash": _t("actuator", "actuator", "backlash_rad", "joint", "rad", 0, INF,
                   "gear play between motor and link"),
    # latency
    "observation_delay": _t("latency", "latency", "observation_delay_s", "scalar", "s", 0, INF,
                            "age of a measurement when it is read"),
    "observation_jitter": _t("latency", "latency", "observation_jitter_s", "scalar", "s", 0, INF,
                             "std of the extra per-message observation delay"),
    "observation_drop": _t("latency", "latency", "observation_drop_prob", "scalar", "", 0, 1,
                           "probability a measurement is lost"),
    "action_delay": _t("latency", "latency", "action_delay_s", "scalar", "s", 0, INF,
                       "time from command to the drive acting on it"),
    "action_jitter": _t("latency", "latency", "action_jitter_s", "scalar", "s", 0, INF,
                        "std of the extra per-message action delay"),
    "action_drop": _t("latency", "latency", "action_drop_prob", "scalar", "", 0, 1,
                      "probability a command is lost"),
    # sensor
    "joint_position_noise": _t("sensor", "sensor", "position_noise_rad", "joint", "rad", 0, INF,
                               "encoder white noise std"),
    "joint_velocity_noise": _t("sensor", "sensor", "velocity_noise_rad_s", "joint", "rad/s", 0,
                               INF, "velocity white noise std"),
    "joint_effort_noise": _t("sensor", "sensor", "effort_noise_nm", "joint", "N·m", 0, INF,
                             "effort (current) white noise std"),
    "joint_position_bias": _t("sensor", "sensor", "position_bias_rad", "joint", "rad", -INF, INF,
                              "constant encoder offset"),
    "joint_position_drift": _t("sensor", "sensor", "position_drift_rad_per_sqrt_s", "joint",
                               "rad/√s", 0, INF, "random-walk drift intensity (std after 1 s)"),
    "joint_position_quantization": _t("sensor", "sensor", "position_quantization_rad", "joint",
                                      "rad", 0, INF, "encoder resolution"),
    "joint_velocity_quantization": _t("sensor", "sensor", "velocity_quantization_rad_s", "joint",
                                      "rad/s", 0, INF, "velocity resolution"),
    "ft_force_noise": _t("sensor", "sensor", "ft_force_noise_n", "vec3", "N", 0, INF,
                         "F/T force noise std per axis"),
    "ft_torque_noise": _t("sensor", "sensor", "ft_torque_noise_nm", "vec3", "N·m", 0, INF,
                          "F/T torque noise std per axis"),
    "ft_force_bias": _t("sensor", "sensor", "ft_force_bias_n", "vec3", "N", -INF, INF,
                        "F/T force offset per axis"),
    "ft_torque_bias": _t("sensor", "sensor", "ft_torque_bias_nm", "vec3", "N·m", -INF, INF,
                         "F/T torque offset per axis"),
    # visual
    "light_direction": _t("visual", "visual", "light_direction", "vec3", "", -INF, INF,
                          "direction towards the light"),
    "light_ambient": _t("visual", "visual", "light_ambient", "scalar", "", 0, INF,
                        "ambient light coefficient"),
    "light_diffuse": _t("visual", "visual", "light_diffuse", "scalar", "", 0, INF,
                        "diffuse light coefficient"),
    "arm_color": _t("visual", "visual", "arm_rgb", "vec3", "", 0, 1, "arm colour RGB"),
    "floor_color": _t("visual", "visual", "floor_rgb", "vec3", "", 0, 1, "floor colour RGB"),
    "pixel_noise": _t("visual", "visual", "pixel_noise_std", "scalar", "counts", 0, INF,
                      "camera pixel noise std (8-bit counts)"),
}


@dataclass(frozen=True)
class TermSpec:
    """How one term is drawn."""

    name: str
    operation: str
    distribution: str
    range: tuple[float, float]
    mode: str
    joints: tuple[str, ...] | None = None
    links: tuple[str, ...] | None = None
    interval_s: tuple[float, float] | None = None
    shared: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Return the spec-file form of this term."""
        out: dict[str, Any] = {
            "operation": self.operation,
            "distribution": self.distribution,
            "range": list(self.range),
            "mode": self.mode,
        }
        if self.joints is not None:
            out["joints"] = list(self.joints)
        if self.links is not None:
            out["links"] = list(self.links)
        if self.interval_s is not None:
            out["interval_s"] = list(self.interval_s)
        if self.shared:
            out["shared"] = True
        return out


def _number(value: Any, path: str | None, key: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(path, key, value, what)
    return float(value)


def _parse_term(name: str, data: Any, path: str | None, prefix: str) -> TermSpec | None:
    key = f"{prefix}{name}"
    if name not in TERMS:
        raise ConfigError(path, key, name, f"a known term, one of {list(TERMS)}")
    if not isinstance(data, dict):
        raise ConfigError(path, key, data, "a mapping with operation, distribution, range, mode")
    for k in data:
        if k not in TERM_KEYS:
            raise ConfigError(path, f"{key}.{k}", data[k], f"a term key, one of {list(TERM_KEYS)}")
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(path, f"{key}.enabled", enabled, "true or false")
    if not enabled:
        return None
    d = TERMS[name]
    op = data.get("operation")
    if op not in OPERATIONS:
        raise ConfigError(path, f"{key}.operation", op, f"one of {list(OPERATIONS)}")
    dist = data.get("distribution", "uniform")
    if dist not in DISTRIBUTIONS:
        raise ConfigError(path, f"{key}.distribution", dist, f"one of {list(DISTRIBUTIONS)}")
    mode = data.get("mode", "reset")
    if mode not in MODES:
        raise ConfigError(path, f"{key}.mode", mode, f"one of {list(MODES)}")
    rng = data.get("range")
    if not isinstance(rng, (list, tuple)) or len(rng) != 2:
        what = "[mean, std]" if dist == "gaussian" else "[low, high]"
        raise ConfigError(path, f"{key}.range", rng, f"two numbers {what}")
    a = _number(rng[0], path, f"{key}.range", "two finite numbers")
    b = _number(rng[1], path, f"{key}.range", "two finite numbers")
    lo, hi = d.domain
    if dist == "gaussian":
        if b < 0:
            raise ConfigError(path, f"{key}.range", list(rng), "[mean, std] with std >= 0")
    else:
        if a > b:
            raise ConfigError(path, f"{key}.range", list(rng), "[low, high] with low <= high")
        if dist == "log_uniform" and a <= 0:
            raise ConfigError(path, f"{key}.range", list(rng), "log_uniform bounds > 0")
        if op == "scale" and a < 0:
            raise ConfigError(path, f"{key}.range", list(rng), "scale factors >= 0")
        if op == "abs" and (a < lo or b > hi):
            unit = f" {d.unit}" if d.unit else ""
            raise ConfigError(
                path, f"{key}.range", list(rng), f"values within [{lo}, {hi}]{unit} for {name}"
            )
    joints = data.get("joints")
    if joints is not None:
        if d.shape != "joint":
            raise ConfigError(path, f"{key}.joints", joints, f"no joints: {name} is not per joint")
        if not isinstance(joints, list) or not joints or not all(
            isinstance(j, str) for j in joints
        ):
            raise ConfigError(path, f"{key}.joints", joints, "a non-empty list of joint names")
        joints = tuple(joints)
    links = data.get("links")
    if links is not None:
        if d.shape != "link3":
            raise ConfigError(path, f"{key}.links", links, f"no links: {name} is not per link")
        if not isinstance(links, list) or not links or not all(isinstance(j, str) for j in links):
            raise ConfigError(path, f"{key}.links", links, "a non-empty list of link names")
        links = tuple(links)
    interval = data.get("interval_s")
    if mode == "interval":
        if interval is None:
            raise ConfigError(path, f"{key}.interval_s", None, "seconds (or [low, high]) > 0")
        if isinstance(interval, (list, tuple)):
            if len(interval) != 2:
                raise ConfigError(path, f"{key}.interval_s", interval, "[low, high] seconds")
            i_lo = _number(interval[0], path, f"{key}.interval_s", "[low, high] seconds > 0")
            i_hi = _number(interval[1], path, f"{key}.interval_s", "[low, high] seconds > 0")
        else:
            i_lo = i_hi = _number(interval, path, f"{key}.interval_s", "seconds > 0")
        if not 0 < i_lo <= i_hi:
            raise ConfigError(path, f"{key}.interval_s", interval, "0 < low <= high seconds")
        interval = (i_lo, i_hi)
    elif interval is not None:
        raise ConfigError(
            path, f"{key}.interval_s", interval, "no interval_s unless mode: interval"
        )
    shared = data.get("shared", False)
    if not isinstance(shared, bool):
        raise ConfigError(path, f"{key}.shared", shared, "true or false")
    return TermSpec(name, op, dist, (a, b), mode, joints, links, interval, shared)


@dataclass
class RandomizationSpec:
    """A validated set of terms; `sha256` identifies the content, `path` where it came from."""

    terms: dict[str, TermSpec] = field(default_factory=dict)
    path: str | None = None
    # "randomization." when the spec is a section of a calibration file.
    key_prefix: str = field(default="", repr=False, compare=False)

    @property
    def sha256(self) -> str:
        """Hash of the canonical content (comments and key order in the file do not matter)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def disabled(cls) -> RandomizationSpec:
        """Return a spec with no terms: the nominal plant, ideal sensors, no latency."""
        return cls({}, None)

    @classmethod
    def from_dict(
        cls, data: Any, path: str | Path | None = None, arm: ArmModel | None = None,
        prefix: str = "",
    ) -> RandomizationSpec:
        """Validate a spec mapping ({terms: {...}}); raise ConfigError naming file and key."""
        p = str(path) if path is not None else None
        if not isinstance(data, dict):
            raise ConfigError(p, prefix.rstrip(".") or "<root>", data, "a mapping with terms:")
        for k in data:
            if k not in ("terms", "version", "description"):
                raise ConfigError(p, f"{prefix}{k}", data[k], "terms, version or description")
        terms_raw = data.get("terms")
        if terms_raw is None:
            terms_raw = {}
        if not isinstance(terms_raw, dict):
            raise ConfigError(p, f"{prefix}terms", terms_raw, "a mapping of term name -> term")
        terms: dict[str, TermSpec] = {}
        for name, tdata in terms_raw.items():
            term = _parse_term(str(name), tdata, p, f"{prefix}terms.")
            if term is not None:
                terms[term.name] = term
        spec = cls(terms, p, prefix)
        if arm is not None:
            spec.validate(arm)
        return spec

    @classmethod
    def from_yaml(cls, path: str | Path, arm: ArmModel | None = None) -> RandomizationSpec:
        """Load a spec file, or the `randomization:` section of a calibration file."""
        data = load_yaml(path)
        if "randomization" in data:
            return cls.from_dict(data["randomization"], path, arm, prefix="randomization.")
        return cls.from_dict(data, path, arm)

    def validate(self, arm: ArmModel) -> None:
        """Check that every named joint and link exists on the arm."""
        prefix = self.key_prefix
        moving_links = [arm.all_joints[j].child for j in arm.joint_names]
        for t in self.terms.values():
            for j in t.joints or ():
                if j not in arm.joint_names:
                    raise ConfigError(
                        self.path, f"{prefix}terms.{t.name}.joints", j,
                        f"a joint of the arm, one of {arm.joint_names}",
                    )
            for link in t.links or ():
                if link not in moving_links:
                    raise ConfigError(
                        self.path, f"{prefix}terms.{t.name}.links", link,
                        f"a moving link of the arm, one of {moving_links}",
                    )

    def to_dict(self) -> dict[str, Any]:
        """Return the spec-file form."""
        return {"terms": {n: t.to_dict() for n, t in self.terms.items()}}

    def interval_terms(self) -> list[TermSpec]:
        """Return the terms redrawn on a timer."""
        return [t for t in self.terms.values() if t.mode == "interval"]


def load_calibration(
    path: str | Path, arm: ArmModel | None = None
) -> tuple[PlantParams, RandomizationSpec | None]:
    """Read a calibration file: `nominal:` PlantParams fields, optional `randomization:` spec."""
    data = load_yaml(path)
    nominal_raw = data.get("nominal", {})
    if not isinstance(nominal_raw, dict):
        raise ConfigError(path, "nominal", nominal_raw, "a mapping of PlantParams fields")
    try:
        nominal = PlantParams.from_dict(nominal_raw, path)
    except ConfigError as exc:
        raise ConfigError(path, f"nominal.{exc.key}", exc.value, exc.allowed) from None
    if arm is not None:
        try:
            resolve_params(nominal, arm)
        except ValueError as exc:
            raise ConfigError(
                path, "nominal", None, f"per-joint sizes for the arm ({exc})"
            ) from None
    spec = None
    if "randomization" in data:
        spec = RandomizationSpec.from_dict(data["randomization"], path, arm, "randomization.")
    return nominal, spec


# ---------------------------------------------------------------------------------- draws
@dataclass
class Nominal:
    """The values a term perturbs: the (calibrated) plant and ideal everything else."""

    plant: PlantParams
    actuator: ActuatorParams
    latency: LatencyParams
    sensor: SensorParams
    visual: VisualParams

    @classmethod
    def for_arm(cls, arm: ArmModel, plant: PlantParams | None = None) -> Nominal:
        """Return the nominal values for an arm (plant from a calibration if given)."""
        n = arm.n_joints
        return cls(
            resolve_params(plant or PlantParams(), arm),
            ActuatorParams.zeros(n),
            LatencyParams(),
            SensorParams.zeros(n),
            VisualParams(),
        )


def _params_dict(obj: Any) -> dict[str, Any]:
    out = {}
    for k, v in asdict(obj).items():
        out[k] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


def _params_from(cls: type, data: dict[str, Any]) -> Any:
    kwargs = {}
    for f in fields(cls):
        if f.name in data:
            v = data[f.name]
            kwargs[f.name] = np.asarray(v, dtype=float) if isinstance(v, list) else v
    return cls(**kwargs)


@dataclass
class Draw:
    """One realized randomization: the parameters every model runs with, and how they came."""

    plant: PlantParams
    actuator: ActuatorParams
    latency: LatencyParams
    sensor: SensorParams
    visual: VisualParams
    values: dict[str, list[Any]] = field(default_factory=dict)  # term -> realized value
    seed: int | None = None
    episode: int = 0
    spec_sha256: str = ""
    spec_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "seed": self.seed,
            "episode": self.episode,
            "spec_sha256": self.spec_sha256,
            "spec_path": self.spec_path,
            "values": self.values,
            "plant": self.plant.to_dict(),
            "actuator": _params_dict(self.actuator),
            "latency": _params_dict(self.latency),
            "sensor": _params_dict(self.sensor),
            "visual": _params_dict(self.visual),
        }

    def to_json(self) -> str:
        """Serialize to JSON (floats round-trip exactly)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Draw:
        """Rebuild a draw from to_dict()."""
        return cls(
            plant=PlantParams.from_dict(data["plant"]),
            actuator=_params_from(ActuatorParams, data["actuator"]),
            latency=_params_from(LatencyParams, data["latency"]),
            sensor=_params_from(SensorParams, data["sensor"]),
            visual=_params_from(VisualParams, data["visual"]),
            values=dict(data.get("values", {})),
            seed=data.get("seed"),
            episode=int(data.get("episode", 0)),
            spec_sha256=str(data.get("spec_sha256", "")),
            spec_path=data.get("spec_path"),
        )

    @classmethod
    def from_json(cls, text: str) -> Draw:
        """Rebuild a draw from to_json()."""
        return cls.from_dict(json.loads(text))


def _target_of(nominal: Nominal, d: TermDef) -> Any:
    return getattr(nominal, d.target)


def _nominal_value(nominal: Nominal, name: str) -> np.ndarray:
    d = TERMS[name]
    if name == "gravity_tilt":
        return np.zeros(2)
    value = getattr(_target_of(nominal, d), d.field_name)
    return np.array(value, dtype=float)


def _draw_values(t: TermSpec, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    size = () if t.shared else shape
    a, b = t.range
    if t.distribution == "uniform":
        x = rng.uniform(a, b, size)
    elif t.distribution == "log_uniform":
        x = np.exp(rng.uniform(math.log(a), math.log(b), size))
    else:
        x = rng.normal(a, b, size)
    return np.broadcast_to(np.asarray(x, dtype=float), shape).copy()


def _term_value(
    t: TermSpec, rng: np.random.Generator, nominal: Nominal, arm: ArmModel
) -> np.ndarray:
    d = TERMS[t.name]
    base = _nominal_value(nominal, t.name)
    mask: np.ndarray | None = None
    if d.shape == "joint" and t.joints is not None:
        mask = np.isin(np.array(arm.joint_names), np.array(t.joints))
    if d.shape == "link3" and t.links is not None:
        moving = [arm.all_joints[j].child for j in arm.joint_names]
        mask = np.isin(np.array(moving), np.array(t.links))
    x = _draw_values(t, rng, base.shape)
    if t.operation == "scale":
        value = base * x
    elif t.operation == "add":
        value = base + x
    else:
        value = x
    value = np.clip(value, *d.domain)
    if mask is not None:
        value = np.where(mask.reshape((-1,) + (1,) * (value.ndim - 1)), value, base)
    return value


def _term_rng(entropy: int, name: str) -> np.random.Generator:
    # One stream per term: adding or removing a term never changes the others' values.
    return np.random.default_rng([entropy, zlib.crc32(name.encode())])


def _apply(nominal: Nominal, values: dict[str, Any]) -> tuple[Any, ...]:
    plant = nominal.plant.copy()
    parts = {
        "plant": plant,
        "actuator": _params_from(ActuatorParams, _params_dict(nominal.actuator)),
        "latency": _params_from(LatencyParams, _params_dict(nominal.latency)),
        "sensor": _params_from(SensorParams, _params_dict(nominal.sensor)),
        "visual": _params_from(VisualParams, _params_dict(nominal.visual)),
    }
    for name in TERMS:
        if name not in values:
            continue
        d = TERMS[name]
        v = np.asarray(values[name], dtype=float)
        if name == "gravity_tilt":
            g = np.asarray(nominal.plant.gravity, dtype=float)
            rx, ry = float(v[0]), float(v[1])
            cx, sx, cy, sy = math.cos(rx), math.sin(rx), math.cos(ry), math.sin(ry)
            rot_x = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
            rot_y = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
            plant.gravity = rot_y @ rot_x @ g
            continue
        setattr(parts[d.target], d.field_name, float(v) if v.ndim == 0 else v)
    return (parts["plant"], parts["actuator"], parts["latency"], parts["sensor"], parts["visual"])


def build_draw(
    nominal: Nominal, values: dict[str, Any], spec: RandomizationSpec | None = None,
    seed: int | None = None, episode: int = 0,
) -> Draw:
    """Return the draw whose terms took `values` (term -> value) around `nominal`."""
    plant, actuator, latency, sensor, visual = _apply(nominal, values)
    clean = {k: np.asarray(v, dtype=float).tolist() for k, v in values.items()}
    return Draw(
        plant, actuator, latency, sensor, visual, clean, seed, episode,
        spec.sha256 if spec else "", spec.path if spec else None,
    )


def sample(
    spec: RandomizationSpec,
    rng: np.random.Generator,
    mode: str,
    arm: ArmModel,
    nominal: Nominal | None = None,
    base: Draw | None = None,
    only: Iterable[str] | None = None,
    seed: int | None = None,
    episode: int = 0,
) -> Draw:
    """Draw the terms a moment calls for and keep the others from `base` (or nominal).

    mode "startup" draws every term (a complete first draw), "reset" the reset and interval
    terms, "interval" the interval terms (or those in `only`). Consumes one integer from `rng`.
    """
    if mode not in MODES:
        raise ValueError(f"mode = {mode!r}: expected one of {list(MODES)}")
    nom = nominal or Nominal.for_arm(arm)
    due = {"startup": MODES, "reset": ("reset", "interval"), "interval": ("interval",)}[mode]
    wanted = set(only) if only is not None else None
    entropy = int(rng.integers(0, 2**63 - 1))
    values: dict[str, Any] = dict(base.values) if base is not None else {}
    for name, t in sorted(spec.terms.items(), key=lambda kv: list(TERMS).index(kv[0])):
        if wanted is not None and name not in wanted:
            continue
        if t.mode in due or name not in values:
            values[name] = _term_value(t, _term_rng(entropy, name), nom, arm)
    values = {k: v for k, v in values.items() if k in spec.terms}
    return build_draw(nom, values, spec, seed, episode)

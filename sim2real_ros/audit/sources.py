"""Evidence from the simulator room's files: the randomization spec and the calibrated simulator.

The spec's term names (sim/randomization.py TERMS) map onto the checklist's canonical axes here,
in one table, so a renamed or new term shows up as a test failure rather than silently as red.
"""

from __future__ import annotations

from typing import Any

from sim2real_ros.audit.evidence import LatencyModel, RandomizedAxis, SimModelEvidence
from sim2real_ros.config import ConfigError, load_yaml

# spec term -> (gap, canonical axis). Every term of the simulator's catalogue is listed.
TERM_AXES: dict[str, tuple[str, str]] = {
    "link_mass": ("dynamics", "link_mass"),
    "link_inertia": ("dynamics", "link_inertia"),
    "com_offset": ("dynamics", "com_offset"),
    "joint_damping": ("dynamics", "joint_damping"),
    "joint_friction": ("dynamics", "joint_friction"),
    "armature": ("dynamics", "link_inertia"),
    "contact_lateral_friction": ("dynamics", "contact_friction"),
    "contact_spinning_friction": ("dynamics", "contact_friction"),
    "contact_rolling_friction": ("dynamics", "contact_friction"),
    "contact_restitution": ("dynamics", "restitution"),
    "gravity_tilt": ("dynamics", "gravity"),
    "payload_mass": ("dynamics", "payload"),
    "payload_offset": ("dynamics", "payload"),
    "kp": ("actuator", "kp"),
    "kd": ("actuator", "kd"),
    "torque_limit": ("actuator", "torque_limit"),
    "motor_lag": ("actuator", "motor_lag"),
    "deadband": ("actuator", "deadband"),
    "backlash": ("actuator", "backlash"),
    "observation_delay": ("latency", "observation_delay"),
    "observation_jitter": ("latency", "observation_jitter"),
    "observation_drop": ("latency", "observation_drop"),
    "action_delay": ("latency", "action_delay"),
    "action_jitter": ("latency", "action_jitter"),
    "action_drop": ("latency", "action_drop"),
    "joint_position_noise": ("sensor", "joint_position_noise"),
    "joint_velocity_noise": ("sensor", "joint_velocity_noise"),
    "joint_effort_noise": ("sensor", "joint_effort_noise"),
    "joint_position_bias": ("sensor", "joint_position_bias"),
    "joint_position_drift": ("sensor", "joint_position_drift"),
    "joint_position_quantization": ("sensor", "joint_position_quantization"),
    "joint_velocity_quantization": ("sensor", "joint_velocity_quantization"),
    "ft_force_noise": ("sensor", "ft_force_noise"),
    "ft_torque_noise": ("sensor", "ft_torque_noise"),
    "ft_force_bias": ("sensor", "ft_bias"),
    "ft_torque_bias": ("sensor", "ft_bias"),
    "light_direction": ("visual", "light"),
    "light_ambient": ("visual", "light"),
    "light_diffuse": ("visual", "light"),
    "arm_color": ("visual", "colour"),
    "floor_color": ("visual", "colour"),
    "pixel_noise": ("visual", "pixel_noise"),
}

# The simulator's jitter is a per-message N(0, std) added as |jitter|: its 99th percentile is
# 2.576 std.
JITTER_P99_PER_STD = 2.576


def term_range(term: Any) -> tuple[float, float]:
    """Return a term's value range: [low, high], or mean +- 2 std for a gaussian."""
    a, b = float(term.range[0]), float(term.range[1])
    if term.distribution == "gaussian":
        return a - 2.0 * b, a + 2.0 * b
    return a, b


def _axis(term: Any) -> RandomizedAxis:
    lo, hi = term_range(term)
    return RandomizedAxis(TERM_AXES[term.name][1], term.name, lo, hi, term.operation)


def _zero_nominal_range(term: Any | None) -> tuple[float, float]:
    """Range of a quantity whose nominal is zero (latency, noise): scale leaves it zero."""
    if term is None or term.operation == "scale":
        return 0.0, 0.0
    lo, hi = term_range(term)
    return max(lo, 0.0), max(hi, 0.0)


def sim_model_from_spec(spec: Any, source: str, camera_enabled: bool = False
                        ) -> SimModelEvidence:
    """Turn a RandomizationSpec into what the checklist reads; unknown terms raise ConfigError."""
    groups: dict[str, dict[str, RandomizedAxis]] = {
        "visual": {}, "dynamics": {}, "actuator": {}, "sensor": {}}
    terms = dict(spec.terms)
    for name, term in terms.items():
        if name not in TERM_AXES:
            raise ConfigError(source, f"terms.{name}", name,
                              f"a term the audit knows, one of {sorted(TERM_AXES)}")
        gap, axis = TERM_AXES[name]
        if gap == "latency":
            continue
        ax = _axis(term)
        have = groups[gap].get(axis)
        # Several terms can feed one axis (light direction, ambient, diffuse): keep the first
        # active one and name the others.
        if have is None or (not have.active and ax.active):
            groups[gap][axis] = ax
        elif ax.active:
            groups[gap][axis] = RandomizedAxis(axis, f"{have.key}+{name}", have.low, have.high,
                                               have.operation)
    obs = _zero_nominal_range(terms.get("observation_delay"))
    act = _zero_nominal_range(terms.get("action_delay"))
    jit = (_zero_nominal_range(terms.get("observation_jitter"))[1]
           + _zero_nominal_range(terms.get("action_jitter"))[1])
    drop = max(_zero_nominal_range(terms.get("observation_drop"))[1],
               _zero_nominal_range(terms.get("action_drop"))[1])
    latency = LatencyModel(obs, act, JITTER_P99_PER_STD * jit, drop, source)
    return SimModelEvidence(source=source, sha256=spec.sha256, camera_enabled=camera_enabled,
                            latency=latency, **groups)


def camera_enabled_in_config() -> bool:
    """Return whether the shipped sim_bridge parameters switch the camera on."""
    from sim2real_ros.paths import share_path

    try:
        path = share_path("config", "nodes", "sim_bridge.yaml")
    except FileNotFoundError:
        return False
    if not path.is_file():
        return False
    params = (load_yaml(path).get("sim_bridge") or {}).get("ros__parameters") or {}
    value = params.get("camera_enabled", params.get("camera", False))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value > 0  # a camera rate in Hz
    return bool(value)


def sim_model_for(spec_path: str | None, calibration_paths: list[str],
                  camera_enabled: bool | None = None) -> tuple[SimModelEvidence | None, str]:
    """Return the simulator's model: --spec, else a calibration's spec, else the shipped one."""
    from sim2real_ros.sim.randomization import RandomizationSpec

    cam = camera_enabled_in_config() if camera_enabled is None else camera_enabled
    if spec_path:
        spec = RandomizationSpec.from_yaml(spec_path)
        return sim_model_from_spec(spec, str(spec_path), cam), str(spec_path)
    for cal in calibration_paths:
        if "randomization" in load_yaml(cal):
            spec = RandomizationSpec.from_yaml(cal)
            return sim_model_from_spec(spec, f"{cal} (randomization)", cam), str(cal)
    from sim2real_ros.paths import share_path

    try:
        shipped = share_path("config", "randomization.yaml")
    except FileNotFoundError:
        return None, "none"
    if not shipped.is_file():
        return None, "none"
    spec = RandomizationSpec.from_yaml(shipped)
    return sim_model_from_spec(spec, str(shipped), cam), str(shipped)


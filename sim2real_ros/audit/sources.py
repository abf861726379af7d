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

# What sim/plant.py applies to every position command whatever the spec says: a drive's PD
# servo whose torque saturates at the URDF effort limits (times torque_limit_scale).
SIMCORE_ACTUATOR = ("position servo with torque saturation at the URDF effort limits "
                    "(sim/plant.py)",)

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
                            latency=latency, actuator_structure=SIMCORE_ACTUATOR, **groups)


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


def resolve_spec(spec_path: str | None, calibration_paths: list[str]) -> tuple[Any, str]:
    """Return the spec the simulator runs: --spec, else a calibration's, else the shipped one."""
    from sim2real_ros.sim.randomization import RandomizationSpec

    if spec_path:
        return RandomizationSpec.from_yaml(spec_path), str(spec_path)
    for cal in calibration_paths:
        if "randomization" in load_yaml(cal):
            return RandomizationSpec.from_yaml(cal), f"{cal} (randomization)"
    from sim2real_ros.paths import share_path

    try:
        shipped = share_path("config", "randomization.yaml")
    except FileNotFoundError:
        return None, "none"
    if not shipped.is_file():
        return None, "none"
    return RandomizationSpec.from_yaml(shipped), str(shipped)


def sim_model_for(spec_path: str | None, calibration_paths: list[str],
                  camera_enabled: bool | None = None) -> tuple[SimModelEvidence | None, str]:
    """Return the simulator's model: --spec, else a calibration's spec, else the shipped one."""
    cam = camera_enabled_in_config() if camera_enabled is None else camera_enabled
    spec, source = resolve_spec(spec_path, calibration_paths)
    if spec is None:
        return None, source
    return sim_model_from_spec(spec, source, cam), source


# --------------------------------------------------------------------------------------------
# The world-model consistency check against the calibrated simulator and the active policy

DEFAULT_DIVERGENCE_RAD = 0.05  # about 3 degrees at any joint
DEFAULT_HORIZON_STEPS = 50
DEFAULT_STARTS = 8
DEFAULT_SETTLE_S = 0.5


def simcore_rollout(core: Any, period_s: float, settle_s: float = DEFAULT_SETTLE_S) -> Any:
    """Make a worldmodel.SimRollout from a SimCore: position commands every `period_s`.

    The state is the observation (q, qd) the controller sees. A rollout starts with the arm
    holding the start's joint positions for `settle_s` (the simulator cannot be placed at a
    velocity, and a joint position without its gravity sag is a state no recording holds);
    the world model then starts from that settled state.
    """
    import numpy as np

    n = core.n

    def run(start: Any, policy: Any, horizon: int) -> tuple[Any, Any]:
        reset = getattr(policy, "reset", None)
        if callable(reset):
            reset()
        q0 = np.asarray(start, dtype=float)[:n]
        obs = core.reset(q0=q0)
        if settle_s > 0:
            core.command("position", q0)
            obs = core.advance(settle_s)
        states = [np.concatenate([obs.q, obs.qd])]
        actions = []
        for _ in range(horizon):
            a = np.asarray(policy(states[-1]), dtype=float)
            core.command("position", a)
            obs = core.advance(period_s)
            actions.append(a)
            states.append(np.concatenate([obs.q, obs.qd]))
        return np.vstack(states), np.vstack(actions)

    return run


class RunnerPolicy:
    """Adapt the policy room's PolicyRunner to policy(state) -> joint target, for one target."""

    def __init__(self, runner: Any, target_m: Any) -> None:
        self.runner = runner
        self.target_m = target_m
        self.n = runner.arm.n_joints

    def reset(self) -> None:
        """Forget the runner's last target (a new rollout)."""
        self.runner.reset()

    def __call__(self, state: Any) -> Any:
        """Return the joint position target for state = (q, qd)."""
        return self.runner.step(state[:self.n], state[self.n:], self.target_m).joint_target_rad


def world_model_check(
    bags: list[str],
    calibrations: list[str],
    policy_version: int = 0,
    spec_path: str | None = None,
    n_starts: int = DEFAULT_STARTS,
    horizon: int = DEFAULT_HORIZON_STEPS,
    threshold_rad: float = DEFAULT_DIVERGENCE_RAD,
    seed: int = 0,
    config: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """Fit the world model on the bags and check it against the calibrated simulator.

    The policy (registry version, 0 = known-good) reaches random targets of its task from
    recorded joint positions; `config` is the WorldModelConfig (default: its defaults).
    Returns the checklist's WorldModelSummary and a JSON-ready detail record.
    """
    import numpy as np

    from sim2real_ros.audit.worldmodel import (
        EnsembleWorldModel,
        Transitions,
        consistency_check,
        transitions_from_bag,
    )
    from sim2real_ros.policy.registry import PolicyRegistry
    from sim2real_ros.policy.runner import PolicyRunner
    from sim2real_ros.sim.core import SimCore
    from sim2real_ros.sim.randomization import RandomizationSpec, load_calibration

    if not bags:
        raise ConfigError("<command line>", "--world-model", None,
                          "at least one --bag to learn from")
    policy, record = PolicyRegistry().load(policy_version)
    runner = PolicyRunner(policy)
    arm = runner.arm
    period_s = 1.0 / runner.control_rate_hz
    data = Transitions.concat([transitions_from_bag(b, list(arm.joint_names), period_s)
                               for b in bags])
    model = EnsembleWorldModel.fit(data, config)
    nominal, spec = None, None
    if calibrations:
        nominal, spec = load_calibration(calibrations[0], arm)
    if spec_path:
        spec = RandomizationSpec.from_yaml(spec_path, arm)
    core = SimCore(spec, seed=seed, calibration=nominal)
    try:
        rng = np.random.default_rng(seed)
        n = arm.n_joints
        picks = rng.choice(len(data), size=min(n_starts, len(data)), replace=False)
        starts = np.hstack([data.state[picks, :n], np.zeros((len(picks), n))])
        lo, hi = (np.asarray(runner.task.workspace_min_m), np.asarray(runner.task.workspace_max_m))
        policies = [RunnerPolicy(runner, rng.uniform(lo, hi)) for _ in picks]
        report = consistency_check(simcore_rollout(core, period_s), model, policies, starts,
                                   horizon, threshold_rad, compare_dims=list(range(n)))
    finally:
        core.close()
    sim_text = f"calibrated by {calibrations[0]}" if calibrations else "uncalibrated"
    source = (f"{len(data)} transitions from {len(bags)} bag(s), policy v{record.version}, "
              f"simulator {sim_text}")
    details = report.to_dict()
    details["fit_heldout_rms"] = (model.fit_report.heldout_rms.tolist()
                                  if model.fit_report else None)
    details["source"] = source
    return report.summary(source), details

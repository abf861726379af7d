"""The default arm task: fast point-to-point reaching of a tool-frame (tool0) target.

Control: at `control_rate_hz` the policy's normalized action a in [-1, 1]^n requests a joint
command rate. Two action interfaces (`action_interface`):

- `jerk_limited` (default): a|a| is the requested command velocity as a fraction of
  `max_velocity_rad_s`; the command follows it through a jerk-limited trajectory generator,
  so every emitted command already satisfies the velocity, acceleration and jerk limits of the
  safety envelope (`limit_fraction` of them), with the command's own velocity and acceleration
  in the observation. The safety filter then has nothing to reshape in normal operation: its
  projector and its rollback monitor stay quiet, and the policy learns with exactly the command
  dynamics it will meet on the cell.
- `step` (policy files written before the key existed): the target moves by
  `max_step_rad * a|a|` per period, with any change between periods.

Either way the command moves the previous command (not the measured position), which gives the
loop integral action, so the tool reaches the target exactly even though the joint servo sags
under gravity and payload; `max_offset_rad` keeps that integrator from winding up when the arm
is blocked or a safety filter holds it.

Observation (float32 vector, normalized by the policy with its saved statistics):
`[q (n), qd (n), target (3), target - tool(q) (3), cmd - q (n), (cmd velocity (n),
cmd acceleration (n) for jerk_limited), wrench (6, optional)]`.

Success: the tool is within `tolerance_m` of the target and every joint slower than
`rest_speed_rad_s`, before `episode_s` elapses. The episode ends there.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.config import ConfigError
from sim2real_ros.robot.model import ArmModel


ACTION_INTERFACES = ("jerk_limited", "step")
RATE_LIMIT_KEYS = ("max_velocity_rad_s", "max_acceleration_rad_s2", "max_jerk_rad_s3")
# The jerk-limited command stops this far inside the URDF limits (the shipped envelope's
# position limits are 0.1 rad inside them).
POSITION_MARGIN_RAD = 0.15


def _tuple(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class TaskConfig:
    """Parameters of the reaching task (SI units)."""

    control_rate_hz: float = 100.0
    episode_s: float = 2.0
    max_step_rad: float = 0.02
    max_offset_rad: float = 0.25
    tolerance_m: float = 0.02
    rest_speed_rad_s: float = 0.05
    min_distance_m: float = 0.10
    workspace_min_m: tuple[float, ...] = (0.30, -0.40, 0.15)
    workspace_max_m: tuple[float, ...] = (0.70, 0.40, 0.60)
    home_rad: tuple[float, ...] = (0.0, 0.0, 1.6, 0.0, 1.5, 0.0)
    spread_rad: tuple[float, ...] = (0.8, 0.5, 0.6, 0.5, 0.4, 0.0)
    include_wrench: bool = False
    action_interface: str = "jerk_limited"
    # Limits of the jerk-limited command, per joint (rad/s, rad/s², rad/s³); empty = the
    # shipped safety envelope's limits x limit_fraction (resolved when an environment or a
    # runner is built, and stored resolved in the policy file).
    max_velocity_rad_s: tuple[float, ...] = ()
    max_acceleration_rad_s2: tuple[float, ...] = ()
    max_jerk_rad_s3: tuple[float, ...] = ()
    limit_fraction: float = 0.8
    # Cap of the tool-speed bound sum_i |J_i| |v_i| the requested joint velocities may give
    # (m/s; the safety filter's Cartesian check bounds the tool speed the same way). 0 = the
    # envelope's max_tool_speed_m_s x limit_fraction (resolved like the rate limits); < 0 = no
    # cap (policy files written before the cap existed are read with -1: they act as trained).
    max_tool_speed_m_s: float = 0.0
    # reward weights (documented in docs/policy.md)
    reward_success: float = 10.0
    reward_action_l2: float = 0.002
    reward_speed: float = 0.01
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dt_s(self) -> float:
        """Control period, s."""
        return 1.0 / self.control_rate_hz

    @property
    def max_steps(self) -> int:
        """Control steps per episode."""
        return int(round(self.episode_s * self.control_rate_hz))

    @property
    def jerk_limited(self) -> bool:
        """True for the jerk-limited action interface."""
        return self.action_interface == "jerk_limited"

    def obs_dim(self, n_joints: int) -> int:
        """Length of the observation vector for an arm with n joints."""
        rates = 2 * n_joints if self.jerk_limited else 0
        return 3 * n_joints + 6 + rates + (6 if self.include_wrench else 0)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], source: str | Path = "<task config>", strict: bool = True
    ) -> TaskConfig:
        """Build and validate a config; bad values (and, if strict, unknown keys) raise.

        Policy files are read with strict=False: a file written by another version may carry
        keys (reward weights, say) that do not change how the policy acts, and a file written
        before `action_interface` existed acts through the `step` interface it was trained on.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown and strict:
            raise ConfigError(source, unknown[0], data[unknown[0]], f"one of {sorted(known)}")
        kw: dict[str, Any] = {}
        if not strict and "action_interface" not in data:
            kw["action_interface"] = "step"
        if not strict and "max_tool_speed_m_s" not in data:
            kw["max_tool_speed_m_s"] = -1.0
        for k, v in data.items():
            if k not in known:
                continue
            kw[k] = _tuple(v) if isinstance(v, (list, tuple)) else v
        cfg = cls(**kw)
        cfg.validate(source)
        return cfg

    def validate(self, source: str | Path = "<task config>", n_joints: int | None = None) -> None:
        """Raise ConfigError naming the key, value and range of the first bad setting."""
        bounds = {
            "control_rate_hz": (10.0, 1000.0, "Hz"),
            "episode_s": (0.1, 60.0, "s"),
            "max_step_rad": (1e-4, 0.5, "rad"),
            "max_offset_rad": (1e-3, 2.0, "rad"),
            "tolerance_m": (1e-4, 0.5, "m"),
            "rest_speed_rad_s": (1e-4, 5.0, "rad/s"),
            "min_distance_m": (0.0, 2.0, "m"),
            "limit_fraction": (0.05, 1.0, "of the safety envelope's limits"),
        }
        for key, (lo, hi, unit) in bounds.items():
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
                raise ConfigError(source, key, v, f"a number in [{lo}, {hi}] {unit}")
        for key in ("workspace_min_m", "workspace_max_m"):
            if len(getattr(self, key)) != 3:
                raise ConfigError(source, key, getattr(self, key), "three numbers (x, y, z), m")
        lo_b, hi_b = np.array(self.workspace_min_m), np.array(self.workspace_max_m)
        if np.any(lo_b >= hi_b):
            raise ConfigError(source, "workspace_max_m", self.workspace_max_m,
                              f"each component > workspace_min_m {self.workspace_min_m}")
        if self.action_interface not in ACTION_INTERFACES:
            raise ConfigError(source, "action_interface", self.action_interface,
                              f"one of {list(ACTION_INTERFACES)}")
        cap = self.max_tool_speed_m_s
        if not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and math.isfinite(cap)
                and cap <= 10.0):
            raise ConfigError(source, "max_tool_speed_m_s", cap,
                              "a finite number <= 10 m/s (0 = from the envelope, < 0 = no cap)")
        for key in RATE_LIMIT_KEYS:
            vals = getattr(self, key)
            if any(not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)
                   for v in vals):
                raise ConfigError(source, key, vals, "positive finite numbers, one per joint")
        if n_joints is not None:
            for key in ("home_rad", "spread_rad"):
                if len(getattr(self, key)) != n_joints:
                    raise ConfigError(source, key, getattr(self, key), f"{n_joints} numbers, rad")
            for key in RATE_LIMIT_KEYS:
                if getattr(self, key) and len(getattr(self, key)) != n_joints:
                    raise ConfigError(source, key, getattr(self, key),
                                      f"{n_joints} numbers (one per joint) or empty")


def in_box(p: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """True when a point lies inside an axis-aligned box."""
    return bool(np.all(p >= lo) and np.all(p <= hi))


def sample_configuration(rng: np.random.Generator, cfg: TaskConfig, arm: ArmModel) -> np.ndarray:
    """Draw a joint vector uniformly around the home pose, inside the joint limits."""
    home, spread = np.array(cfg.home_rad), np.array(cfg.spread_rad)
    q = home + rng.uniform(-1.0, 1.0, size=home.shape) * spread
    return np.clip(q, arm.lower_rad, arm.upper_rad)


def sample_reachable_target(
    rng: np.random.Generator,
    cfg: TaskConfig,
    arm: ArmModel,
    box_min_m: np.ndarray | None = None,
    box_max_m: np.ndarray | None = None,
    max_tries: int = 2_000,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (target_xyz_m, q_reaching_it): a forward-kinematics point inside the workspace box.

    Drawing joint vectors and keeping the tool positions that fall in the box makes every
    target reachable by construction (no IK failure can hide in the task distribution).
    """
    lo = np.array(cfg.workspace_min_m if box_min_m is None else box_min_m, dtype=float)
    hi = np.array(cfg.workspace_max_m if box_max_m is None else box_max_m, dtype=float)
    for _ in range(max_tries):
        q = sample_configuration(rng, cfg, arm)
        p = arm.tool_position(q)
        if in_box(p, lo, hi):
            return p, q
    raise ConfigError("<task config>", "workspace box", (lo.tolist(), hi.tolist()),
                      "a box that contains reachable tool positions around home_rad ± spread_rad")


def sample_episode(
    rng: np.random.Generator, cfg: TaskConfig, arm: ArmModel
) -> tuple[np.ndarray, np.ndarray]:
    """Return (q_start, target_xyz_m) at least `min_distance_m` apart."""
    target, _ = sample_reachable_target(rng, cfg, arm)
    for _ in range(1000):
        q0 = sample_configuration(rng, cfg, arm)
        if np.linalg.norm(arm.tool_position(q0) - target) >= cfg.min_distance_m:
            return q0, target
    return q0, target


def reachable_targets(
    seed: int,
    count: int,
    arm: ArmModel,
    box_min_m: np.ndarray | None = None,
    box_max_m: np.ndarray | None = None,
    cfg: TaskConfig | None = None,
) -> np.ndarray:
    """Return `count` seeded reachable targets (count x 3, m) inside the box."""
    cfg = cfg or TaskConfig()
    rng = np.random.default_rng(seed)
    return np.array(
        [sample_reachable_target(rng, cfg, arm, box_min_m, box_max_m)[0] for _ in range(count)]
    )


def resolve_rate_limits(cfg: TaskConfig, arm: ArmModel) -> TaskConfig:
    """Fill empty jerk-limited command limits from the safety envelope x `limit_fraction`.

    The envelope is the shipped config/safety_envelope.yaml when it is written for this robot,
    else the one `sim2real safety derive-envelope` derives from the URDF (the same defaults).
    """
    if not cfg.jerk_limited or (all(getattr(cfg, k) for k in RATE_LIMIT_KEYS)
                                and cfg.max_tool_speed_m_s != 0.0):
        return cfg
    from sim2real_ros.config import load_yaml
    from sim2real_ros.paths import share_path
    from sim2real_ros.safety.envelope import derive_envelope_dict

    path = share_path("config", "safety_envelope.yaml")
    data = load_yaml(path)
    if data.get("robot") != arm.name:
        data = derive_envelope_dict(arm)
    joints = data["joints"]
    f = cfg.limit_fraction
    per_joint = {
        "max_velocity_rad_s": "velocity_rad_s",
        "max_acceleration_rad_s2": "acceleration_rad_s2",
        "max_jerk_rad_s3": "jerk_rad_s3",
    }
    kw: dict[str, Any] = {
        key: tuple(float(joints[n][env_key]) * f for n in arm.joint_names)
        for key, env_key in per_joint.items()
        if not getattr(cfg, key)
    }
    if cfg.max_tool_speed_m_s == 0.0:
        kw["max_tool_speed_m_s"] = float(data["workspace"]["max_tool_speed_m_s"]) * f
    out = replace(cfg, **kw)
    out.validate(path, n_joints=arm.n_joints)
    return out


def step_scale_rad(cfg: TaskConfig, n_joints: int) -> np.ndarray:
    """The joint-command move per period that a = 1 requests, rad (per joint)."""
    if cfg.jerk_limited:
        if len(cfg.max_velocity_rad_s) != n_joints:
            raise ValueError("jerk-limited task without resolved limits: call "
                             "resolve_rate_limits(cfg, arm) first")
        return np.asarray(cfg.max_velocity_rad_s, dtype=float) * cfg.dt_s
    return np.full(n_joints, cfg.max_step_rad)


def initial_history(cmd: np.ndarray) -> np.ndarray:
    """A command history (newest first, 3 x n) at rest at `cmd`."""
    c = np.asarray(cmd, dtype=float)
    return np.stack([c, c, c])


def command_rates(cfg: TaskConfig, history: np.ndarray) -> np.ndarray:
    """Velocity and acceleration of the command (finite differences, as the safety filter's).

    `history` is (..., 3, n), newest first; returns (..., 2n): [velocity rad/s, accel rad/s²].
    """
    h = np.asarray(history, dtype=float)
    dt = cfg.dt_s
    vel = (h[..., 0, :] - h[..., 1, :]) / dt
    acc = (h[..., 0, :] - 2.0 * h[..., 1, :] + h[..., 2, :]) / (dt * dt)
    return np.concatenate([vel, acc], axis=-1)


def build_observation(
    cfg: TaskConfig,
    q: np.ndarray,
    qd: np.ndarray,
    target_m: np.ndarray,
    tool_m: np.ndarray,
    cmd: np.ndarray,
    wrench: np.ndarray | None = None,
    history: np.ndarray | None = None,
) -> np.ndarray:
    """Assemble the raw (unnormalized) observation vector; batch dims are allowed in front.

    The jerk-limited interface also observes the command's velocity and acceleration, from
    `history` (..., 3, n), newest first, whose newest row is `cmd`; none given = at rest.
    """
    parts = [q, qd, target_m, target_m - tool_m, cmd - q]
    if cfg.jerk_limited:
        hist = initial_history(cmd) if history is None else history
        if history is None and np.ndim(cmd) > 1:
            hist = np.stack([cmd, cmd, cmd], axis=-2)
        parts.append(command_rates(cfg, hist))
    if cfg.include_wrench:
        if wrench is None:
            raise ValueError("this task observes the wrist wrench; none was given")
        parts.append(wrench)
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts], axis=-1).astype(
        np.float32
    )


def action_to_step(cfg: TaskConfig, action: np.ndarray) -> np.ndarray:
    """Map normalized actions in [-1, 1] to requested joint-command moves, rad: `s * a * |a|`.

    `s` is `step_scale_rad` (max_step_rad, or max velocity x period when jerk-limited). The
    signed square gives fine resolution near zero: a network's small output bias (0.03, say)
    requests 0.1 % of the largest move instead of 3 %, so a learned policy can come to rest
    instead of creeping along the arm's redundant directions.
    """
    a = np.clip(np.asarray(action, dtype=float), -1.0, 1.0)
    return step_scale_rad(cfg, a.shape[-1]) * a * np.abs(a)


def step_to_action(cfg: TaskConfig, step_rad: np.ndarray) -> np.ndarray:
    """Inverse of `action_to_step` (moves beyond the scale map to +-1)."""
    s = np.asarray(step_rad, dtype=float)
    x = np.clip(s / step_scale_rad(cfg, s.shape[-1]), -1.0, 1.0)
    return np.sign(x) * np.sqrt(np.abs(x))


def apply_action(
    cfg: TaskConfig, arm: ArmModel, cmd: np.ndarray, q: np.ndarray, action: np.ndarray
) -> np.ndarray:
    """Return the next joint target from a normalized action (the `step` interface)."""
    nxt = cmd + action_to_step(cfg, action)
    nxt = np.clip(nxt, q - cfg.max_offset_rad, q + cfg.max_offset_rad)
    return np.clip(nxt, arm.lower_rad, arm.upper_rad)


_LEVERS: dict[int, Any] = {}


def tool_lever_arms(arm: ArmModel, q: np.ndarray) -> np.ndarray:
    """Per joint, how fast the tool moves per rad/s of that joint at q (|J_i|, m/rad): the
    safety filter's own lever arms (`safety.kinematics.ToolKinematics`), so the interface caps
    exactly the bound the filter checks."""
    cached = _LEVERS.get(id(arm))
    if cached is None or cached[0] is not arm:
        from sim2real_ros.safety.kinematics import ToolKinematics

        cached = _LEVERS[id(arm)] = (arm, ToolKinematics(arm).fast_tool_position_and_levers)
    out = [0.0] * arm.n_joints
    cached[1](np.asarray(q, dtype=float).tolist(), out)
    return np.array(out)


def advance_command(
    cfg: TaskConfig, arm: ArmModel, history: np.ndarray, q: np.ndarray, action: np.ndarray
) -> np.ndarray:
    """Return the command history (3 x n, newest first) after one action.

    `step`: `apply_action`. `jerk_limited`: the action requests the command velocity
    v_r = V a|a|; the command's acceleration moves toward the one that reaches v_r without
    overshoot under the jerk limit (a_d = sign(e) min(A, a_J(|e|), |e|/dt), e = v_r - v, a_J
    the discrete sqrt law a^2/(2J) + a dt/2 = |e|),
    at most J per second, and the command integrates the result. So |v| <= V, |a| <= A and
    |j| <= J hold by construction (up to one period's rounding of the sqrt law, which the margin
    `limit_fraction` absorbs). A request that would carry the command further than
    `max_offset_rad` from the measured position is cut to zero velocity (anti-windup).
    """
    h = np.asarray(history, dtype=float)
    if not cfg.jerk_limited:
        nxt = apply_action(cfg, arm, h[0], q, action)
        return np.stack([nxt, h[0], h[1]])
    dt = cfg.dt_s
    vmax = np.asarray(cfg.max_velocity_rad_s)
    amax = np.asarray(cfg.max_acceleration_rad_s2)
    jmax = np.asarray(cfg.max_jerk_rad_s3)
    a = np.clip(np.asarray(action, dtype=float), -1.0, 1.0)
    v_req = vmax * a * np.abs(a)
    if cfg.max_tool_speed_m_s > 0:
        # The safety filter bounds the tool speed by sum_i L_i w_i (lever arm times the peak
        # speed while braking); the sqrt law below keeps w_i <= |v_req,i|, so capping the
        # request's bound keeps the filter's (the expert caps its own plan, the learner's
        # imitation error does not: 15 of 17 interventions that started a projector episode
        # on the proxy were this bound).
        levers = tool_lever_arms(arm, h[0])
        bound = float(np.sum(levers * np.abs(v_req)))
        if bound > cfg.max_tool_speed_m_s:
            v_req = v_req * (cfg.max_tool_speed_m_s / bound)
    off = h[0] - np.asarray(q, dtype=float)
    v_req = np.where(off > cfg.max_offset_rad, np.minimum(v_req, 0.0), v_req)
    v_req = np.where(off < -cfg.max_offset_rad, np.maximum(v_req, 0.0), v_req)
    # Near a joint limit, no faster than a stop at half the acceleration limit allows (with
    # the time the jerk limit needs to reach it): the command brakes before the limit instead
    # of being clipped at it, which no acceleration or jerk limit would survive.
    decel = 0.5 * amax
    lag = decel / jmax + dt
    lo = np.asarray(arm.lower_rad) + POSITION_MARGIN_RAD
    hi = np.asarray(arm.upper_rad) - POSITION_MARGIN_RAD
    for room, sign in ((hi - h[0], 1.0), (h[0] - lo, -1.0)):
        d = np.maximum(room, 0.0)
        cap = np.sqrt((decel * lag) ** 2 + 2.0 * decel * d) - decel * lag
        v_req = np.minimum(v_req, cap) if sign > 0 else np.maximum(v_req, -cap)
    vel = (h[0] - h[1]) / dt
    acc = (h[0] - 2.0 * h[1] + h[2]) / (dt * dt)
    e = v_req - vel
    # Ramping a to zero at J in steps of dt still changes v by a^2/(2J) + a dt/2.
    half = 0.5 * jmax * dt
    ramp = np.sqrt(half * half + 2.0 * jmax * np.abs(e)) - half
    mag = np.minimum(np.minimum(amax, ramp), np.abs(e) / dt)
    a_des = np.sign(e) * mag
    jerk = np.clip((a_des - acc) / dt, -jmax, jmax)
    acc_n = np.clip(acc + jerk * dt, -amax, amax)
    vel_n = np.clip(vel + acc_n * dt, -vmax, vmax)
    nxt = np.clip(h[0] + vel_n * dt, arm.lower_rad, arm.upper_rad)
    return np.stack([nxt, h[0], h[1]])


def reward(
    cfg: TaskConfig, distance_m: float, action: np.ndarray, success: bool, qd: np.ndarray
) -> float:
    """Per-step reward: -distance (m), small action and joint-speed costs, a success bonus.

    Every term but the bonus is negative, so the best an agent can do is to finish early by
    reaching the target and coming to rest (a per-step bonus for being near the target would
    instead pay for hovering there without stopping).
    """
    r = (
        -distance_m
        - cfg.reward_action_l2 * float(np.sum(np.square(action)))
        - cfg.reward_speed * float(np.max(np.abs(qd)))
    )
    if success:
        r += cfg.reward_success
    return r


def is_success(cfg: TaskConfig, distance_m: float, qd: np.ndarray) -> bool:
    """Within tolerance and at rest."""
    return distance_m < cfg.tolerance_m and float(np.max(np.abs(qd))) < cfg.rest_speed_rad_s

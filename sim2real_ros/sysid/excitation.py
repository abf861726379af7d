"""Excitation trajectories for identification: multi-sine, chirp and smoothed steps per joint.

Every trajectory is an offset around a centre pose, faded in and out with a quintic window (zero
velocity and acceleration at both ends), then scaled per joint so position, velocity and
acceleration stay inside a conservative envelope: a fraction of the URDF limits, well inside the
safety filter's. The safety filter still checks every command; this keeps it from having to clip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim2real_ros.robot.model import ArmModel

KINDS = ("multisine", "chirp", "step")
GRID_HZ = 1000.0  # internal sampling; commands are interpolated from it


class ExcitationError(ValueError):
    """An excitation cannot be made or leaves its envelope; the message names joint and bound."""


@dataclass(frozen=True)
class ExcitationEnvelope:
    """Per-joint bounds an excitation must stay within (rad, rad/s, rad/s²)."""

    joint_names: tuple[str, ...]
    lower_rad: np.ndarray
    upper_rad: np.ndarray
    max_velocity_rad_s: np.ndarray
    max_acceleration_rad_s2: np.ndarray

    @classmethod
    def from_arm(
        cls,
        arm: ArmModel,
        position_margin_rad: float = 0.3,
        velocity_fraction: float = 0.25,
        max_acceleration_rad_s2: float = 2.0,
    ) -> ExcitationEnvelope:
        """Shrink the URDF limits: a margin on positions, a fraction of the velocity limits."""
        if not 0.0 < velocity_fraction <= 1.0:
            raise ExcitationError(f"velocity_fraction = {velocity_fraction}: expected (0, 1]")
        if position_margin_rad < 0.0 or max_acceleration_rad_s2 <= 0.0:
            raise ExcitationError(
                f"position_margin_rad = {position_margin_rad} (expected >= 0), "
                f"max_acceleration_rad_s2 = {max_acceleration_rad_s2} (expected > 0)"
            )
        lo = np.asarray(arm.lower_rad, dtype=float) + position_margin_rad
        hi = np.asarray(arm.upper_rad, dtype=float) - position_margin_rad
        if np.any(lo >= hi):
            bad = [arm.joint_names[i] for i in np.flatnonzero(lo >= hi)]
            raise ExcitationError(f"position margin {position_margin_rad} rad leaves no range on {bad}")
        n = arm.n_joints
        return cls(
            tuple(arm.joint_names),
            lo,
            hi,
            np.asarray(arm.max_velocity_rad_s, dtype=float) * velocity_fraction,
            np.full(n, float(max_acceleration_rad_s2)),
        )

    @property
    def n_joints(self) -> int:
        """Return the number of joints."""
        return len(self.joint_names)

    def check(self, exc: Excitation, slack: float = 1.02) -> None:
        """Raise ExcitationError naming the first joint and quantity outside the envelope."""
        for j, name in enumerate(self.joint_names):
            q = exc.q[:, j]
            if q.min() < self.lower_rad[j] - 1e-9 or q.max() > self.upper_rad[j] + 1e-9:
                raise ExcitationError(
                    f"{name}: position range [{q.min():.4f}, {q.max():.4f}] rad leaves the "
                    f"envelope [{self.lower_rad[j]:.4f}, {self.upper_rad[j]:.4f}] rad"
                )
            v = np.abs(exc.qd[:, j]).max()
            if v > self.max_velocity_rad_s[j] * slack:
                raise ExcitationError(
                    f"{name}: |velocity| {v:.4f} rad/s exceeds {self.max_velocity_rad_s[j]:.4f}"
                )
            a = np.abs(exc.qdd[:, j]).max()
            if a > self.max_acceleration_rad_s2[j] * slack:
                raise ExcitationError(
                    f"{name}: |acceleration| {a:.4f} rad/s² exceeds "
                    f"{self.max_acceleration_rad_s2[j]:.4f}"
                )


@dataclass
class Excitation:
    """A sampled joint trajectory: q(t) = centre + offset(t), with derivatives."""

    kind: str
    joint_names: list[str]
    center_rad: np.ndarray
    t_s: np.ndarray  # from 0 to duration, GRID_HZ samples
    q: np.ndarray  # (T, n)
    qd: np.ndarray
    qdd: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        """Return the trajectory's length in seconds."""
        return float(self.t_s[-1])

    def at(self, t_s: float) -> np.ndarray:
        """Return the target position at time t (the centre before 0 and after the end)."""
        if t_s <= 0.0:
            return self.q[0].copy()
        if t_s >= self.t_s[-1]:
            return self.q[-1].copy()
        i = int(t_s * GRID_HZ)
        i = min(i, self.t_s.size - 2)
        w = (t_s - self.t_s[i]) * GRID_HZ
        return (1.0 - w) * self.q[i] + w * self.q[i + 1]

    def describe(self) -> dict[str, Any]:
        """Return a JSON-friendly description (stored in the bag's metadata)."""
        return {
            "kind": self.kind,
            "duration_s": self.duration_s,
            "center_rad": [float(v) for v in self.center_rad],
            "peak_offset_rad": [float(v) for v in np.abs(self.q - self.center_rad).max(axis=0)],
            **self.params,
        }


def _window(t: np.ndarray, duration_s: float, ramp_s: float) -> np.ndarray:
    """Quintic fade-in/out: zero value, slope and curvature at both ends."""
    ramp = min(ramp_s, duration_s / 2.0)
    if ramp <= 0.0:
        return np.ones_like(t)

    def smooth(x: np.ndarray) -> np.ndarray:
        x = np.clip(x, 0.0, 1.0)
        return x**3 * (10.0 - 15.0 * x + 6.0 * x**2)

    return smooth(t / ramp) * smooth((duration_s - t) / ramp)


def _derivatives(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dt = 1.0 / GRID_HZ
    xd = np.gradient(x, dt, axis=0)
    return xd, np.gradient(xd, dt, axis=0)


def _fit_into(
    offset: np.ndarray, center: np.ndarray, env: ExcitationEnvelope, amplitude: np.ndarray
) -> np.ndarray:
    """Scale each joint's offset to its requested amplitude, then down into the envelope."""
    out = offset.copy()
    xd, xdd = _derivatives(offset)
    for j in range(offset.shape[1]):
        peak = np.abs(offset[:, j]).max()
        if peak <= 0.0 or amplitude[j] <= 0.0:
            out[:, j] = 0.0
            continue
        k = amplitude[j] / peak
        up = env.upper_rad[j] - center[j]
        down = center[j] - env.lower_rad[j]
        if up <= 0.0 or down <= 0.0:
            raise ExcitationError(
                f"{env.joint_names[j]}: centre {center[j]:.4f} rad is outside the excitation "
                f"envelope [{env.lower_rad[j]:.4f}, {env.upper_rad[j]:.4f}] rad"
            )
        hi, lo = offset[:, j].max(), offset[:, j].min()
        if hi > 0:
            k = min(k, up / hi)
        if lo < 0:
            k = min(k, down / -lo)
        vpk, apk = np.abs(xd[:, j]).max(), np.abs(xdd[:, j]).max()
        if vpk > 0:
            k = min(k, env.max_velocity_rad_s[j] / vpk)
        if apk > 0:
            k = min(k, env.max_acceleration_rad_s2[j] / apk)
        out[:, j] = offset[:, j] * k * 0.999  # stay strictly inside after resampling
    return out


def _amplitudes(amplitude_rad: float | np.ndarray, n: int) -> np.ndarray:
    a = np.broadcast_to(np.asarray(amplitude_rad, dtype=float), (n,)).copy()
    if np.any(a < 0) or not np.all(np.isfinite(a)):
        raise ExcitationError(f"amplitude_rad = {a.tolist()}: expected finite values >= 0")
    return a


def _grid(duration_s: float) -> np.ndarray:
    if not 0.5 <= duration_s <= 3600.0:
        raise ExcitationError(f"duration_s = {duration_s}: expected [0.5, 3600] s")
    return np.arange(int(round(duration_s * GRID_HZ)) + 1) / GRID_HZ


def multisine(
    center_rad: np.ndarray,
    envelope: ExcitationEnvelope,
    duration_s: float = 20.0,
    amplitude_rad: float | np.ndarray = 0.3,
    f_min_hz: float = 0.2,
    f_max_hz: float = 2.0,
    n_freqs: int = 6,
    ramp_s: float = 1.0,
    seed: int = 0,
) -> Excitation:
    """Sum of sines with disjoint, interleaved frequency sets per joint (decorrelated joints).

    Amplitudes fall as 1/f so velocity is spread evenly over the band; phases are Schroeder
    phases with a seeded offset, which keeps the crest factor low.
    """
    if not 0.0 < f_min_hz < f_max_hz:
        raise ExcitationError(f"f_min_hz = {f_min_hz}, f_max_hz = {f_max_hz}: expected 0 < min < max")
    n = envelope.n_joints
    t = _grid(duration_s)
    rng = np.random.default_rng(seed)
    freqs = np.geomspace(f_min_hz, f_max_hz, n_freqs * n)
    offset = np.zeros((t.size, n))
    for j in range(n):
        fj = freqs[j::n]
        k = np.arange(1, fj.size + 1)
        phases = -np.pi * k * (k - 1) / fj.size + rng.uniform(0, 2 * np.pi)
        for f, ph in zip(fj, phases):
            offset[:, j] += np.sin(2 * np.pi * f * t + ph) / f
    offset *= _window(t, duration_s, ramp_s)[:, None]
    params = {"f_min_hz": f_min_hz, "f_max_hz": f_max_hz, "n_freqs": n_freqs, "seed": seed}
    return _finish("multisine", t, offset, center_rad, envelope, amplitude_rad, params)


def chirp(
    center_rad: np.ndarray,
    envelope: ExcitationEnvelope,
    duration_s: float = 20.0,
    amplitude_rad: float | np.ndarray = 0.3,
    f_min_hz: float = 0.1,
    f_max_hz: float = 2.0,
    ramp_s: float = 1.0,
    seed: int = 0,
) -> Excitation:
    """Logarithmic sweep per joint; odd joints sweep down so the joints stay decorrelated."""
    if not 0.0 < f_min_hz < f_max_hz:
        raise ExcitationError(f"f_min_hz = {f_min_hz}, f_max_hz = {f_max_hz}: expected 0 < min < max")
    n = envelope.n_joints
    t = _grid(duration_s)
    rng = np.random.default_rng(seed)
    rate = np.log(f_max_hz / f_min_hz) / duration_s
    offset = np.zeros((t.size, n))
    for j in range(n):
        f0, r = (f_min_hz, rate) if j % 2 == 0 else (f_max_hz, -rate)
        phase = 2 * np.pi * f0 * (np.exp(r * t) - 1.0) / r
        inst_f = f0 * np.exp(r * t)
        offset[:, j] = np.sin(phase + rng.uniform(0, 2 * np.pi)) / inst_f
    offset *= _window(t, duration_s, ramp_s)[:, None]
    params = {"f_min_hz": f_min_hz, "f_max_hz": f_max_hz, "seed": seed}
    return _finish("chirp", t, offset, center_rad, envelope, amplitude_rad, params)


def steps(
    center_rad: np.ndarray,
    envelope: ExcitationEnvelope,
    duration_s: float = 20.0,
    amplitude_rad: float | np.ndarray = 0.3,
    hold_s: float = 1.5,
    seed: int = 0,
) -> Excitation:
    """Random step levels per joint joined by minimum-jerk moves, staggered across joints."""
    if hold_s <= 0.0:
        raise ExcitationError(f"hold_s = {hold_s}: expected > 0")
    n = envelope.n_joints
    t = _grid(duration_s)
    amp = _amplitudes(amplitude_rad, n)
    rng = np.random.default_rng(seed)
    offset = np.zeros((t.size, n))
    for j in range(n):
        a = amp[j]
        if a <= 0.0:
            continue
        # Steps sized so a minimum-jerk move of length hold_s/2 respects the velocity and
        # acceleration bounds: peak v = 1.875·Δ/T, peak a = 5.774·Δ/T².
        move_s = hold_s / 2.0
        max_step = min(
            envelope.max_velocity_rad_s[j] * move_s / 1.875,
            envelope.max_acceleration_rad_s2[j] * move_s**2 / 5.774,
        )
        level = 0.0
        start = hold_s * (0.5 + j / n)  # stagger so joints do not move in lockstep
        x = np.zeros_like(t)
        t_move = start
        while t_move + move_s < duration_s - hold_s:
            target = float(rng.uniform(-a, a))
            target = float(np.clip(target, level - max_step, level + max_step))
            x = _add_move(x, t, t_move, move_s, level, target)
            level = target
            t_move += hold_s
        x = _add_move(x, t, min(t_move, duration_s - move_s), move_s, level, 0.0)
        offset[:, j] = x
    params = {"hold_s": hold_s, "seed": seed}
    # The levels are already bounded; _finish only shrinks to the position envelope.
    exc = _finish("step", t, offset, center_rad, envelope, np.abs(offset).max(axis=0), params)
    return exc


def _add_move(
    x: np.ndarray, t: np.ndarray, t0: float, dur: float, frm: float, to: float
) -> np.ndarray:
    s = np.clip((t - t0) / dur, 0.0, 1.0)
    blend = s**3 * (10.0 - 15.0 * s + 6.0 * s**2)
    mask = t >= t0
    x = x.copy()
    x[mask] = frm + (to - frm) * blend[mask]
    return x


def _finish(
    kind: str,
    t: np.ndarray,
    offset: np.ndarray,
    center_rad: np.ndarray,
    env: ExcitationEnvelope,
    amplitude_rad: float | np.ndarray,
    params: dict[str, Any],
) -> Excitation:
    center = np.asarray(center_rad, dtype=float)
    if center.shape != (env.n_joints,):
        raise ExcitationError(f"center_rad has shape {center.shape}, expected ({env.n_joints},)")
    amp = _amplitudes(amplitude_rad, env.n_joints)
    scaled = _fit_into(offset, center, env, amp)
    qd, qdd = _derivatives(scaled)
    exc = Excitation(kind, list(env.joint_names), center, t, center + scaled, qd, qdd, params)
    env.check(exc)
    return exc


def make_excitation(
    kind: str,
    center_rad: np.ndarray,
    envelope: ExcitationEnvelope,
    duration_s: float = 20.0,
    amplitude_rad: float | np.ndarray = 0.3,
    f_min_hz: float = 0.2,
    f_max_hz: float = 2.0,
    seed: int = 0,
) -> Excitation:
    """Build an excitation by name: 'multisine', 'chirp' or 'step'."""
    if kind == "multisine":
        return multisine(center_rad, envelope, duration_s, amplitude_rad, f_min_hz, f_max_hz,
                         seed=seed)
    if kind == "chirp":
        return chirp(center_rad, envelope, duration_s, amplitude_rad, f_min_hz, f_max_hz,
                     seed=seed)
    if kind == "step":
        return steps(center_rad, envelope, duration_s, amplitude_rad, seed=seed)
    raise ExcitationError(f"kind = {kind!r}: expected one of {list(KINDS)}")


def default_center(envelope: ExcitationEnvelope) -> np.ndarray:
    """Return a pose with the upper arm raised and forearm bent: gravity loads every joint."""
    mid = 0.5 * (envelope.lower_rad + envelope.upper_rad)
    c = mid.copy()
    if envelope.n_joints >= 3:
        # Bent elbow, inclined shoulder: gravity torque is large and varies with the motion,
        # which is what makes mass, payload and friction identifiable.
        c[1] = np.clip(0.6, envelope.lower_rad[1], envelope.upper_rad[1])
        c[2] = np.clip(0.9, envelope.lower_rad[2], envelope.upper_rad[2])
    return c


PROBE_RUN = 3  # probe moves per direction before turning back


def probe_move_s(step_rad: float, jerk_rad_s3: float) -> float:
    """Duration of a minimum-jerk move of `step_rad` whose jerk peaks at `jerk_rad_s3`.

    A minimum-jerk move's jerk is largest at its ends, 60·Δ/T³.
    """
    return float((60.0 * step_rad / jerk_rad_s3) ** (1.0 / 3.0))


def append_latency_probe(
    exc: Excitation,
    envelope: ExcitationEnvelope,
    moves: int = 12,
    step_rad: float = 0.03,
    jerk_rad_s3: float = 40.0,
    hold_s: float = 0.6,
    seed: int = 0,
) -> Excitation:
    """Append a latency probe: moves from rest, all joints together, read on the first torque.

    After the excitation the arm holds `hold_s`, then makes `moves` minimum-jerk moves of
    `step_rad` per joint, each followed by a hold: three moves one way, three back, repeated
    (each joint's direction seeded). Every move after the first of a run of three continues
    its joint's direction, so the gearbox's backlash is taken up when it starts; the fit reads
    the command path's dead time at those starts (`sysid/deadtime.py`). `jerk_rad_s3` sets
    how sharply a move starts: keep it under the safety envelope's jerk limit, which would
    otherwise trim it (the fit reads the commands as sent, so a trimmed probe still reads,
    less sharply).
    """
    if moves <= 0 or moves % (2 * PROBE_RUN):
        raise ExcitationError(f"latency probe moves = {moves}: expected a positive multiple of "
                              f"{2 * PROBE_RUN} ({PROBE_RUN} out, {PROBE_RUN} back)")
    if not (0.0 < step_rad <= 0.2 and math.isfinite(step_rad)):
        raise ExcitationError(f"latency probe step_rad = {step_rad}: expected (0, 0.2] rad")
    if not (0.0 < jerk_rad_s3 <= 1000.0 and math.isfinite(jerk_rad_s3)):
        raise ExcitationError(f"latency probe jerk_rad_s3 = {jerk_rad_s3}: expected (0, 1000]")
    if not (0.2 <= hold_s <= 5.0):
        raise ExcitationError(f"latency probe hold_s = {hold_s}: expected [0.2, 5] s (the fit "
                              "needs 0.3 s of rest before a move)")
    n = envelope.n_joints
    move_s = probe_move_s(step_rad, jerk_rad_s3)
    dirs = np.random.default_rng(seed).choice([-1.0, 1.0], size=n)
    span = hold_s + moves * (move_s + hold_s)
    t_probe = np.arange(1, int(round(span * GRID_HZ)) + 1) / GRID_HZ
    start = exc.q[-1]
    x = np.zeros((t_probe.size, n))
    level = np.zeros(n)
    t_move = hold_s
    for m in range(moves):
        sign = 1.0 if (m // PROBE_RUN) % 2 == 0 else -1.0
        for j in range(n):
            target = level[j] + sign * dirs[j] * step_rad
            x[:, j] = _add_move(x[:, j], t_probe, t_move, move_s, level[j], target)
            level[j] = target
        t_move += move_s + hold_s
    t = np.concatenate([exc.t_s, exc.t_s[-1] + t_probe])
    q = np.vstack([exc.q, start + x])
    qd, qdd = _derivatives(q)
    params = dict(exc.params)
    params["latency_probe"] = {"moves": int(moves), "step_rad": float(step_rad),
                               "jerk_rad_s3": float(jerk_rad_s3), "hold_s": float(hold_s),
                               "move_s": move_s, "starts_at_s": float(exc.t_s[-1]),
                               "directions": [int(d) for d in dirs]}
    out = Excitation(exc.kind, list(exc.joint_names), exc.center_rad, t, q, qd, qdd, params)
    envelope.check(out)
    return out

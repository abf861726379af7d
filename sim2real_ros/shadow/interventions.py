"""Would-be safety interventions: what the safety filter would have done to the policy's commands.

Checked against the operations envelope (config/safety_envelope.yaml) loaded through the safety
room's loader (`sim2real_ros.safety.envelope.load_envelope`), per policy command:
- soft (the filter clips and alarms): a joint target outside the envelope's position range, or a
  step from the previous command faster than the envelope's velocity limit;
- hard (the filter rejects the command / e-stops): a non-finite target, a target outside the
  URDF's hard position limits, or a step faster than the URDF's velocity limit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim2real_ros.robot.model import ArmModel
from sim2real_ros.shadow.divergence import InterventionCheck, WouldBeIntervention


class EnvelopeCheck:
    """Stateful per-command check (it remembers the previous command for velocity)."""

    def __init__(
        self,
        joint_names: list[str],
        lower_rad: np.ndarray,
        upper_rad: np.ndarray,
        velocity_rad_s: np.ndarray,
        hard_lower_rad: np.ndarray,
        hard_upper_rad: np.ndarray,
        hard_velocity_rad_s: np.ndarray,
        max_gap_s: float = 0.1,
    ) -> None:
        self.joint_names = list(joint_names)
        self.lower = np.asarray(lower_rad, float)
        self.upper = np.asarray(upper_rad, float)
        self.velocity = np.asarray(velocity_rad_s, float)
        self.hard_lower = np.asarray(hard_lower_rad, float)
        self.hard_upper = np.asarray(hard_upper_rad, float)
        self.hard_velocity = np.asarray(hard_velocity_rad_s, float)
        # Beyond this gap the previous command says nothing about the commanded velocity
        # (the filter restarts its rate limit from the measured state after a stall).
        self.max_gap_s = max_gap_s
        self._prev: tuple[int, np.ndarray] | None = None

    def __call__(
        self, t_ns: int, q_cmd: np.ndarray, q_measured: np.ndarray | None
    ) -> list[WouldBeIntervention]:
        """Return the interventions the filter would make on this command."""
        out: list[WouldBeIntervention] = []
        q = np.asarray(q_cmd, float)
        names = self.joint_names
        bad = ~np.isfinite(q)
        for i in np.flatnonzero(bad):
            out.append(WouldBeIntervention(t_ns, "non_finite", names[i], float("inf"), True))
        qf = np.where(bad, 0.0, q)
        for i in range(len(q)):
            if bad[i]:
                continue
            below, above = self.lower[i] - qf[i], qf[i] - self.upper[i]
            excess = max(below, above)
            if excess > 0.0:
                hard = bool(qf[i] < self.hard_lower[i] or qf[i] > self.hard_upper[i])
                out.append(WouldBeIntervention(t_ns, "position", names[i], float(excess), hard))
        prev = self._prev
        self._prev = None if bad.any() else (t_ns, qf)
        if prev is not None and not bad.any():
            dt = (t_ns - prev[0]) * 1e-9
            if 0.0 < dt <= self.max_gap_s:
                speed = np.abs(qf - prev[1]) / dt
                for i in np.flatnonzero(speed > self.velocity):
                    out.append(WouldBeIntervention(
                        t_ns, "velocity", names[i], float(speed[i] - self.velocity[i]),
                        bool(speed[i] > self.hard_velocity[i])))
        return out


def build_intervention_check(
    envelope_path: str | Path | None, arm: ArmModel
) -> tuple[InterventionCheck, str]:
    """Return the check for `envelope_path` (None = shipped envelope) and a description of it.

    An envelope that does not load raises its ConfigError: the comparator refuses to start
    rather than report zero would-be violations it never checked.
    """
    from sim2real_ros.paths import share_path
    from sim2real_ros.safety.envelope import load_envelope

    path = Path(envelope_path) if envelope_path else share_path("config", "safety_envelope.yaml")
    env = load_envelope(path, arm)
    joints = [env.joint(n) for n in arm.joint_names]
    check = EnvelopeCheck(
        list(arm.joint_names),
        np.array([j.lower_rad for j in joints]),
        np.array([j.upper_rad for j in joints]),
        np.array([j.velocity_rad_s for j in joints]),
        np.asarray(arm.lower_rad, float),
        np.asarray(arm.upper_rad, float),
        np.asarray(arm.max_velocity_rad_s, float),
    )
    return check, f"envelope {path} (sha256 {env.sha256[:12]}) via safety.envelope.load_envelope"

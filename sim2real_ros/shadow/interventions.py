"""Would-be safety interventions: what the safety filter would have done to the policy's commands.

The safety room's own projection core (`sim2real_ros.safety.projection.Projector`, over the
envelope loaded by `sim2real_ros.safety.envelope.load_envelope`) runs on the policy's command
stream as if the policy drove the arm through the filter: the same limits, the same state
(the trajectory it would have emitted), the same events. No second copy of the limits exists.

Classification:
- hard, judged on the policy's request itself (what it asked for, whatever the filter would
  emit): a target the filter must reject (`invalid_command`: NaN, infinite), a joint target
  outside the envelope's position range (`position`), or a configuration whose tool position
  lies outside the envelope's workspace box (`workspace`): the policy asked for something the
  cell forbids;
- soft, from the projector's events: rate shaping (`velocity`, `acceleration`, `jerk`,
  `tool_speed`, `braking`) and braking reserve near the workspace boundary
  (`workspace_reserve`): the filter smooths the command and the intent stays allowed.
Measurement and timing notes (`invalid_input`) are not interventions on the policy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim2real_ros.robot.model import ArmModel
from sim2real_ros.shadow.divergence import InterventionCheck, WouldBeIntervention

# The control period the projector assumes; commands further apart than its accepted range
# (2 periods) restart the would-be trajectory from the measured state, as the filter's
# fallback does after a stale policy.
DEFAULT_PERIOD_S = 0.01


class ProjectorCheck:
    """Runs the safety projector on policy commands and reports what it would have changed."""

    def __init__(self, projector: object, period_s: float = DEFAULT_PERIOD_S) -> None:
        from sim2real_ros.safety.projection import Projector

        assert isinstance(projector, Projector)
        self.projector = projector
        self.period_s = period_s
        env = projector.envelope
        self.lower_rad = np.array([j.lower_rad for j in env.joints])
        self.upper_rad = np.array([j.upper_rad for j in env.joints])
        self.box_min_m = np.array(env.box_min_m)
        self.box_max_m = np.array(env.box_max_m)
        self._last_ns: int | None = None

    def hard(self, t_ns: int, q_cmd: np.ndarray) -> list[WouldBeIntervention]:
        """Return what is forbidden in the request itself (NaN, joint range, workspace box)."""
        names = self.projector.joint_names
        q = np.asarray(q_cmd, dtype=float)
        bad = ~np.isfinite(q)
        if bad.any():
            return [WouldBeIntervention(t_ns, "invalid_command", names[i], float("inf"), True)
                    for i in np.flatnonzero(bad)]
        out = []
        excess = np.maximum(self.lower_rad - q, q - self.upper_rad)
        for i in np.flatnonzero(excess > 0.0):
            out.append(WouldBeIntervention(t_ns, "position", names[i], float(excess[i]), True))
        tool = self.projector.arm.tool_position(q)
        box_excess = float(np.max(np.maximum(self.box_min_m - tool, tool - self.box_max_m)))
        if box_excess > 0.0:
            out.append(WouldBeIntervention(t_ns, "workspace", "*", box_excess, True))
        return out

    def __call__(
        self, t_ns: int, q_cmd: np.ndarray, q_measured: np.ndarray | None
    ) -> list[WouldBeIntervention]:
        """Project one policy command; return the interventions it would cause."""
        from sim2real_ros.safety.events import INTERVENTION

        out = self.hard(t_ns, q_cmd)
        p = self.projector
        measured = None if q_measured is None else [float(v) for v in q_measured]
        dt = self.period_s if self._last_ns is None else (t_ns - self._last_ns) * 1e-9
        if self._last_ns is not None and (dt <= 0.0 or dt > p.dt_max_s):
            # A gap (or a stamp going back): the filter would have fallen back meanwhile.
            p.initialized = False
            dt = self.period_s
        self._last_ns = t_ns
        if not p.initialized and measured is None:
            # Nothing to start the would-be trajectory from (no joint_states yet): start from
            # the command itself, which then cannot be judged against a previous one.
            measured = [float(v) if np.isfinite(v) else 0.0 for v in q_cmd]
        proj = p.project_position(None, [float(v) for v in q_cmd], dt, measured)
        for e in proj.events:
            # Rejections and out-of-range targets are already counted as hard above.
            if e.kind != INTERVENTION or e.limit == "position":
                continue
            kind = "workspace_reserve" if e.limit == "workspace" else e.limit
            out.append(WouldBeIntervention(t_ns, kind, e.joint or "*", float(e.excess), False))
        return out


def build_intervention_check(
    envelope_path: str | Path | None, arm: ArmModel, period_s: float = DEFAULT_PERIOD_S
) -> tuple[InterventionCheck, str]:
    """Return the check for `envelope_path` (None = shipped envelope) and a description of it.

    An envelope that does not load raises its ConfigError: the comparator refuses to start
    rather than report zero would-be violations it never checked.
    """
    from sim2real_ros.paths import share_path
    from sim2real_ros.safety.envelope import load_envelope
    from sim2real_ros.safety.projection import Projector

    path = Path(envelope_path) if envelope_path else share_path("config", "safety_envelope.yaml")
    env = load_envelope(path, arm)
    check = ProjectorCheck(Projector(env, arm, period_s), period_s)
    return check, (f"safety.projection.Projector on envelope {path} "
                   f"(sha256 {env.sha256[:12]}, full-stage limits)")

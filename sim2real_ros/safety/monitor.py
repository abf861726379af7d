"""Sliding-window monitor of the acting policy: when it drifts, roll back and drop the stage.

Per control tick the supervisor reports whether the projector intervened, whether the filter
was in fallback, the tracking error between command and measurement, and whether the wrist force
crossed the warning level. Once the window is filled, any rate above its threshold fires: the
supervisor then requests `policy_node/rollback`, drops the rollout stage one step and raises an
alarm. After firing the window restarts and a cooldown keeps one drift from firing twice.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

# Every limit the projection names on an intervention event (safety.projection).
INTERVENTION_LIMITS = (
    "position", "velocity", "acceleration", "jerk", "braking", "workspace", "tool_speed",
    "effort", "wrench_force_x", "wrench_force_y", "wrench_force_z", "wrench_torque_x",
    "wrench_torque_y", "wrench_torque_z", "wrench_force_norm", "wrench_torque_norm",
)
# The limits that shape a command rather than bound where the arm goes or how fast: an
# acceleration or jerk trim turns a step into a ramp. Transfer run 18 (docs/proxy.md): the
# policies' 0.5-0.8 intervention rates that dropped every stage were acceleration and jerk
# trims (workspace 0, tool speed < 0.04), the same shaping the policy's commands get in any
# cell, not a sign of the policy leaving its domain. They are not counted by default; the
# verdict and the diagnostics still report them.
SMOOTHING_LIMITS = ("acceleration", "jerk")


@dataclass(frozen=True)
class MonitorConfig:
    """Thresholds of the rollback monitor."""

    window_s: float = 2.0
    # The window must be this full (time covered / window_s) before it can fire.
    min_fill: float = 0.9
    max_intervention_rate: float = 0.5  # fraction of ticks the projector changed the command
    # A tick counts as an intervention only if the command moved by more than this (rad): the
    # jerk-level trims a jittery stream needs are not the policy asking for too much.
    min_intervention_rad: float = 1e-3
    max_fallback_rate: float = 0.5  # fraction of ticks the policy should have driven but did not
    max_tracking_error_rad: float = 0.25  # mean over the window of max_joint |cmd - measured|
    max_force_events: int = 5  # rising edges of the wrist force above the warning level
    cooldown_s: float = 5.0
    # Limits whose interventions do not count toward the intervention rate (a tick counts if
    # any other limit acted on it). () counts every limit.
    ignored_limits: tuple[str, ...] = SMOOTHING_LIMITS

    def check(self) -> str | None:
        """Return why the configuration is invalid, or None."""
        if not self.window_s > 0.0:
            return f"window_s must be > 0, got {self.window_s}"
        if not 0.0 < self.min_fill <= 1.0:
            return f"min_fill must be in (0, 1], got {self.min_fill}"
        for name in ("max_intervention_rate", "max_fallback_rate"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                return f"{name} must be in (0, 1], got {v}"
        if not self.min_intervention_rad >= 0.0:
            return f"min_intervention_rad must be >= 0, got {self.min_intervention_rad}"
        if not self.max_tracking_error_rad > 0.0:
            return f"max_tracking_error_rad must be > 0, got {self.max_tracking_error_rad}"
        if self.max_force_events < 1:
            return f"max_force_events must be >= 1, got {self.max_force_events}"
        if self.cooldown_s < 0.0:
            return f"cooldown_s must be >= 0, got {self.cooldown_s}"
        unknown = [n for n in self.ignored_limits if n not in INTERVENTION_LIMITS]
        if unknown:
            return (f"ignored_limits {unknown} are not limits the projection names; "
                    f"expected some of {list(INTERVENTION_LIMITS)}")
        return None


@dataclass(frozen=True)
class Verdict:
    """Why the monitor fired, with the windowed figures."""

    reasons: tuple[str, ...]
    intervention_rate: float
    fallback_rate: float
    tracking_error_rad: float
    force_events: int
    # Per limit (position, velocity, acceleration, jerk, braking, workspace, tool_speed...):
    # the fraction of the window's ticks on which that limit changed the policy's command,
    # ignored limits included (they can exceed intervention_rate). A tick can name several
    # limits, so these can sum past intervention_rate.
    intervention_limits: dict[str, float] = field(default_factory=dict)


class Monitor:
    """Windowed rates over control ticks; `update` returns a Verdict when one is crossed."""

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        why = self.config.check()
        if why:
            raise ValueError(why)
        self._samples: deque[tuple[float, bool, bool, float, bool, tuple[str, ...]]] = deque()
        self._n_interv = 0
        self._n_limit: Counter[str] = Counter()
        self._n_fallback = 0
        self._err_sum = 0.0
        self._n_force = 0
        self._force_above = False
        self._cooldown_until = -float("inf")
        self.fired = 0

    def reset(self) -> None:
        """Forget the window (stage change, e-stop reset, after firing)."""
        self._samples.clear()
        self._n_limit.clear()
        self._n_interv = self._n_fallback = self._n_force = 0
        self._err_sum = 0.0

    def figures(self) -> dict[str, float]:
        """Return the current windowed figures."""
        n = len(self._samples)
        return {
            "intervention_rate": self._n_interv / n if n else 0.0,
            "fallback_rate": self._n_fallback / n if n else 0.0,
            "tracking_error_rad": self._err_sum / n if n else 0.0,
            "force_events": float(self._n_force),
            "window_samples": float(n),
        }

    def limit_rates(self) -> dict[str, float]:
        """Per limit, the fraction of the window's ticks on which it changed the command."""
        n = len(self._samples)
        return {k: c / n for k, c in sorted(self._n_limit.items(), key=lambda kv: -kv[1])
                if c > 0} if n else {}

    def update(self, now_s: float, intervened: bool, fallback: bool, tracking_error_rad: float,
               force_above_warning: bool, limits: tuple[str, ...] = ()) -> Verdict | None:
        """Add one tick; return a Verdict if the window crosses a threshold.

        `limits` names the limits that acted on the intervention (dropped when `intervened`
        is False), so a verdict says what the rate is made of. A tick whose limits are all in
        `ignored_limits` is not counted; one with no limits named is.
        """
        cfg = self.config
        force_event = force_above_warning and not self._force_above
        self._force_above = force_above_warning
        err = tracking_error_rad if tracking_error_rad == tracking_error_rad else 0.0
        limits = tuple(limits) if intervened else ()
        if limits and all(n in cfg.ignored_limits for n in limits):
            intervened = False
        self._samples.append((now_s, intervened, fallback, err, force_event, limits))
        self._n_limit.update(limits)
        self._n_interv += intervened
        self._n_fallback += fallback
        self._err_sum += err
        self._n_force += force_event
        horizon = now_s - cfg.window_s
        samples = self._samples
        while samples and samples[0][0] <= horizon:
            _, i, f, e, fe, lim = samples.popleft()
            self._n_limit.subtract(lim)
            self._n_interv -= i
            self._n_fallback -= f
            self._err_sum -= e
            self._n_force -= fe
        if now_s < self._cooldown_until:
            return None
        covered = now_s - samples[0][0] if samples else 0.0
        if covered < cfg.min_fill * cfg.window_s:
            return None
        fig = self.figures()
        by_limit = self.limit_rates()
        reasons = []
        if fig["intervention_rate"] > cfg.max_intervention_rate:
            parts = ", ".join(f"{k} {v:.3f}" + (" (not counted)" if k in cfg.ignored_limits
                                                 else "") for k, v in by_limit.items())
            reasons.append(f"intervention rate {fig['intervention_rate']:.3f} > "
                           f"{cfg.max_intervention_rate}" + (f" (by limit: {parts})"
                                                             if parts else ""))
        if fig["fallback_rate"] > cfg.max_fallback_rate:
            reasons.append(f"fallback rate {fig['fallback_rate']:.3f} > {cfg.max_fallback_rate}")
        if fig["tracking_error_rad"] > cfg.max_tracking_error_rad:
            reasons.append(f"tracking error {fig['tracking_error_rad']:.4f} rad > "
                           f"{cfg.max_tracking_error_rad} rad")
        if self._n_force > cfg.max_force_events:
            reasons.append(f"{self._n_force} force events > {cfg.max_force_events}")
        if not reasons:
            return None
        verdict = Verdict(tuple(reasons), fig["intervention_rate"], fig["fallback_rate"],
                          fig["tracking_error_rad"], self._n_force, by_limit)
        self.fired += 1
        self._cooldown_until = now_s + cfg.cooldown_s
        self.reset()
        return verdict

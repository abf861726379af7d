"""Shadow-mode metrics: how far the policy's commands are from the acting baseline's.

The policy and the baseline both stamp each command with the stamp of the joint_states message it
answers, so commands are paired by header stamp (within a tolerance), never by arrival time. From
the pairs: per-step and windowed per-joint absolute and L2 divergence, the agreement rate, and
the safety interventions the policy's commands would have caused had it acted. Alongside: the
distribution of the policy's confidence (ensemble disagreement, OOD score) and how much of what
the policy observed lies within its training statistics.

`ShadowAccumulator` is the one streaming implementation; the live node and the bag report both
feed it, so the report of a recorded run and the live recommendation agree by construction.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from sim2real_ros.shadow.gates import MetricsSettings

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


@dataclass(frozen=True)
class WouldBeIntervention:
    """A safety intervention the policy's command would have caused had it acted."""

    t_ns: int
    kind: str  # the limit that fired, e.g. "position", "velocity"
    joint: str
    excess: float  # by how much the limit was exceeded (the limit's unit)
    hard: bool  # a hard violation (e-stop / reject) rather than a soft clip

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready record."""
        return {"t": self.t_ns * 1e-9, "kind": self.kind, "joint": self.joint,
                "excess": self.excess, "hard": self.hard}


# Checks one policy command: (stamp ns, commanded positions rad, measured positions rad or None)
# -> the interventions it would cause. May keep state (previous command for velocity limits).
InterventionCheck = Callable[[int, np.ndarray, "np.ndarray | None"], list[WouldBeIntervention]]


@dataclass
class _Pending:
    t_ns: int
    position_rad: np.ndarray


class StampMatcher:
    """Pairs two command streams by header stamp, one-to-one, within a tolerance.

    A command pairs with the nearest still-unpaired command of the other stream received so far
    whose stamp differs by at most `tolerance_ns`. Each stream is assumed in stamp order (both
    answer joint_states in order), so a pending command is given up as unmatched once the other
    stream has moved past its stamp plus the tolerance.
    """

    def __init__(self, tolerance_ns: int, max_pending: int = 1000) -> None:
        if tolerance_ns < 0:
            raise ValueError(f"tolerance_ns must be >= 0, got {tolerance_ns}")
        self.tolerance_ns = int(tolerance_ns)
        self.max_pending = max_pending
        self._pending: dict[str, deque[_Pending]] = {"policy": deque(), "baseline": deque()}
        self._latest_ns: dict[str, int | None] = {"policy": None, "baseline": None}
        self.unmatched: dict[str, int] = {"policy": 0, "baseline": 0}

    def add(
        self, stream: str, t_ns: int, position_rad: np.ndarray
    ) -> tuple[int, np.ndarray, np.ndarray] | None:
        """Add a command; return (policy stamp ns, policy pos, baseline pos) when it pairs."""
        other = "baseline" if stream == "policy" else "policy"
        if stream not in self._pending:
            raise ValueError(f"stream must be 'policy' or 'baseline', got {stream!r}")
        latest = self._latest_ns[stream]
        self._latest_ns[stream] = t_ns if latest is None else max(latest, t_ns)
        self._expire(other, self._latest_ns[stream])
        candidates = self._pending[other]
        best_i, best_dt = -1, self.tolerance_ns + 1
        for i, c in enumerate(candidates):
            dt = abs(c.t_ns - t_ns)
            if dt < best_dt:
                best_i, best_dt = i, dt
        if best_i >= 0:
            partner = candidates[best_i]
            del candidates[best_i]
            if stream == "policy":
                return t_ns, position_rad, partner.position_rad
            return partner.t_ns, partner.position_rad, position_rad
        own = self._pending[stream]
        own.append(_Pending(int(t_ns), position_rad))
        if len(own) > self.max_pending:
            own.popleft()
            self.unmatched[stream] += 1
        return None

    def _expire(self, stream: str, other_latest_ns: int | None) -> None:
        if other_latest_ns is None:
            return
        q = self._pending[stream]
        while q and q[0].t_ns + self.tolerance_ns < other_latest_ns:
            q.popleft()
            self.unmatched[stream] += 1

    def flush(self) -> None:
        """Count every command still waiting for a partner as unmatched (end of a recording)."""
        for stream, q in self._pending.items():
            self.unmatched[stream] += len(q)
            q.clear()


def align_by_stamp(
    policy_t_ns: Sequence[int], baseline_t_ns: Sequence[int], tolerance_ns: int
) -> list[tuple[int, int]]:
    """Return (policy index, baseline index) pairs whose stamps match within `tolerance_ns`."""
    matcher = StampMatcher(tolerance_ns, max_pending=len(policy_t_ns) + len(baseline_t_ns) + 1)
    events = [(int(t), 0, i) for i, t in enumerate(policy_t_ns)]
    events += [(int(t), 1, i) for i, t in enumerate(baseline_t_ns)]
    pairs = []
    for t, which, i in sorted(events):
        # The index rides along in the position slot so the pair can be reported by index.
        out = matcher.add("policy" if which == 0 else "baseline", t, np.array([i]))
        if out is not None:
            pairs.append((int(out[1][0]), int(out[2][0])))
    return sorted(pairs)


@dataclass(frozen=True)
class StepDivergence:
    """Divergence of one aligned step."""

    t_ns: int
    abs_rad: np.ndarray  # per joint |policy - baseline|
    l2_rad: float
    agree: bool  # every joint within the agreement tolerance


def step_divergence(
    t_ns: int,
    policy_rad: np.ndarray,
    baseline_rad: np.ndarray,
    agreement_tolerance_rad: float,
) -> StepDivergence:
    """Return the per-joint absolute and L2 divergence of one aligned step."""
    p = np.asarray(policy_rad, dtype=float)
    b = np.asarray(baseline_rad, dtype=float)
    if p.shape != b.shape:
        raise ValueError(f"policy has shape {p.shape}, baseline {b.shape}")
    a = np.abs(p - b)
    # A non-finite command never agrees: NaN comparisons are False, which is the intent.
    agree = bool(np.all(a <= agreement_tolerance_rad))
    return StepDivergence(int(t_ns), a, float(np.linalg.norm(p - b)), agree)


@dataclass(frozen=True)
class WindowDivergence:
    """Divergence over one time window."""

    t_start_s: float
    t_end_s: float
    steps: int
    mean_abs_rad: list[float]
    max_abs_rad: list[float]
    mean_l2_rad: float
    agreement_rate: float

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready record."""
        return dict(self.__dict__)


def summarize_window(steps: Sequence[StepDivergence]) -> WindowDivergence | None:
    """Return the divergence over `steps` (None for no steps)."""
    if not steps:
        return None
    a = np.stack([s.abs_rad for s in steps])
    return WindowDivergence(
        t_start_s=steps[0].t_ns * 1e-9,
        t_end_s=steps[-1].t_ns * 1e-9,
        steps=len(steps),
        mean_abs_rad=[float(v) for v in a.mean(axis=0)],
        max_abs_rad=[float(v) for v in a.max(axis=0)],
        mean_l2_rad=float(np.mean([s.l2_rad for s in steps])),
        agreement_rate=sum(s.agree for s in steps) / len(steps),
    )


def windows(steps: Sequence[StepDivergence], window_s: float) -> list[WindowDivergence]:
    """Split steps into consecutive windows of `window_s` from the first stamp."""
    if not steps:
        return []
    w_ns = int(round(window_s * 1e9))
    t0 = steps[0].t_ns
    groups: dict[int, list[StepDivergence]] = {}
    for s in steps:
        groups.setdefault((s.t_ns - t0) // w_ns, []).append(s)
    return [w for k in sorted(groups) if (w := summarize_window(groups[k])) is not None]


def percentiles(values: Iterable[float], qs: Sequence[int] = PERCENTILES) -> dict[str, float]:
    """Return {"p50": .., ..., "max": ..} of finite values ({} when there are none)."""
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return {}
    out = {f"p{q}": float(np.percentile(arr, q)) for q in qs}
    out["max"] = float(arr.max())
    return out


@dataclass(frozen=True)
class TrainingStats:
    """Per-dimension mean and standard deviation of the policy's training observations."""

    mean: np.ndarray
    std: np.ndarray
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mean.shape != self.std.shape or self.mean.ndim != 1:
            raise ValueError(f"mean {self.mean.shape} and std {self.std.shape} must be equal 1-D")


def within_k_sigma(
    observation: np.ndarray, stats: TrainingStats, k_sigma: float
) -> tuple[bool, np.ndarray]:
    """Return (all dims within k sigma, per-dim within); |x - mean| == k*std counts as within."""
    x = np.asarray(observation, dtype=float)
    if x.shape != stats.mean.shape:
        raise ValueError(f"observation has shape {x.shape}, training stats {stats.mean.shape}")
    dims = np.abs(x - stats.mean) <= k_sigma * stats.std
    return bool(np.all(dims)), dims


@dataclass(frozen=True)
class CoverageSummary:
    """Fraction of observations within k sigma of the training statistics."""

    samples: int
    k_sigma: float
    fraction_within: float | None
    per_dim_fraction: list[float]
    names: list[str]


@dataclass
class ShadowMetrics:
    """Everything measured since the current stage began (the gates read `gate_metrics`)."""

    steps: int = 0
    time_s: float = 0.0
    agreement_rate: float | None = None
    mean_abs_rad: list[float] = field(default_factory=list)
    max_abs_rad: list[float] = field(default_factory=list)
    mean_l2_rad: float | None = None
    max_l2_rad: float | None = None
    l2_percentiles_rad: dict[str, float] = field(default_factory=dict)
    hard_violations: int = 0
    soft_interventions: int = 0
    interventions_by_kind: dict[str, int] = field(default_factory=dict)
    policy_commands: int = 0
    baseline_commands: int = 0
    unmatched_policy: int = 0
    unmatched_baseline: int = 0
    confidence_samples: int = 0
    disagreement_percentiles_rad: dict[str, float] = field(default_factory=dict)
    ood_percentiles: dict[str, float] = field(default_factory=dict)
    ood_fraction: float | None = None
    fallback_rate: float | None = None
    policy_versions: list[int] = field(default_factory=list)
    coverage: CoverageSummary | None = None
    estops: int = 0
    window: WindowDivergence | None = None

    def gate_metrics(self) -> dict[str, float | int | None]:
        """Return metric name -> measured value, the input of gates.evaluate."""
        unmatched = (
            self.unmatched_policy / self.policy_commands if self.policy_commands else None
        )
        return {
            "steps": self.steps,
            "time_s": self.time_s,
            "agreement_rate": self.agreement_rate,
            "hard_violations": self.hard_violations,
            "soft_interventions": self.soft_interventions,
            "ood_fraction": self.ood_fraction,
            "fallback_rate": self.fallback_rate,
            "coverage": None if self.coverage is None else self.coverage.fraction_within,
            "p95_l2_divergence_rad": self.l2_percentiles_rad.get("p95"),
            "unmatched_fraction": unmatched,
            "estops": self.estops,
        }

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready report body."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("coverage", "window")}
        out["coverage"] = None if self.coverage is None else dict(self.coverage.__dict__)
        out["window"] = None if self.window is None else self.window.as_dict()
        out["gate_metrics"] = self.gate_metrics()
        return out


class ShadowAccumulator:
    """Streaming shadow metrics since the current stage began; `reset()` at every stage change.

    Feed it policy and baseline commands, confidence messages, joint states and safety status
    in any interleaving; read `metrics(now_ns)` whenever a report is due. Counters are exact and
    unbounded; per-step records (percentiles, plots) keep the last `max_history_steps`.
    """

    def __init__(
        self,
        joint_names: Sequence[str],
        settings: MetricsSettings,
        intervention_check: InterventionCheck | None = None,
        training_stats: TrainingStats | None = None,
        observation_of: Callable[[np.ndarray, np.ndarray | None], np.ndarray] | None = None,
    ) -> None:
        self.joint_names = list(joint_names)
        self.settings = settings
        self.intervention_check = intervention_check
        self.training_stats = training_stats
        # Maps measured (position, velocity) to the vector the training stats describe.
        self.observation_of = observation_of or _positions_then_velocities
        self.reset()

    def reset(self) -> None:
        """Forget everything: evidence for the next gate is gathered at the new stage only."""
        s = self.settings
        self._matcher = StampMatcher(int(round(s.stamp_tolerance_s * 1e9)))
        self.history: deque[StepDivergence] = deque(maxlen=s.max_history_steps)
        self.interventions: deque[WouldBeIntervention] = deque(maxlen=1000)  # latest, any kind
        self.hard_interventions: deque[WouldBeIntervention] = deque(maxlen=10000)
        self._steps = 0
        self._agree = 0
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        n = len(self.joint_names)
        self._sum_abs = np.zeros(n)
        self._max_abs = np.zeros(n)
        self._sum_l2 = 0.0
        self._max_l2 = 0.0
        self._hard = 0
        self._soft = 0
        self._by_kind: dict[str, int] = {}
        self._policy_n = 0
        self._baseline_n = 0
        self._conf_n = 0
        self._ood_n = 0
        self._fallback_n = 0
        self.disagreement_rad: deque[float] = deque(maxlen=s.max_history_steps)
        self.ood_score: deque[float] = deque(maxlen=s.max_history_steps)
        self._versions: set[int] = set()
        self._joints: deque[tuple[int, np.ndarray, np.ndarray | None]] = deque(maxlen=2000)
        self._cov_waiting: deque[int] = deque(maxlen=1000)
        self._cov_n = 0
        self._cov_in = 0
        dims = 0 if self.training_stats is None else self.training_stats.mean.size
        self._cov_dims = np.zeros(dims, dtype=int)
        self._estops = 0
        self._estop_active = False

    def add_joint_state(
        self, t_ns: int, position_rad: np.ndarray, velocity_rad_s: np.ndarray | None
    ) -> None:
        """Record a measured state; commands look up the observation they answered by stamp."""
        q = np.asarray(position_rad, float)
        self._joints.append((int(t_ns), q, velocity_rad_s))
        if self._cov_waiting and self.training_stats is not None:
            # The policy's answer arrived before the observation (topics are not ordered).
            tol = self._matcher.tolerance_ns
            for i, t in enumerate(self._cov_waiting):
                if abs(t - t_ns) <= tol:
                    del self._cov_waiting[i]
                    self._add_coverage(q, velocity_rad_s)
                    break

    def _observation_at(self, t_ns: int) -> tuple[np.ndarray, np.ndarray | None] | None:
        tol = self._matcher.tolerance_ns
        best, best_dt = None, tol + 1
        for t, q, qd in reversed(self._joints):
            dt = abs(t - t_ns)
            if dt < best_dt:
                best, best_dt = (q, qd), dt
            if t < t_ns - tol:
                break
        return best

    def add_policy(self, t_ns: int, position_rad: np.ndarray) -> StepDivergence | None:
        """Record a policy command; return the step when it pairs with a baseline command."""
        self._policy_n += 1
        obs = self._observation_at(int(t_ns))
        if self.training_stats is not None:
            if obs is not None:
                self._add_coverage(obs[0], obs[1])
            else:
                self._cov_waiting.append(int(t_ns))
        return self._add("policy", t_ns, position_rad, obs)

    def add_baseline(self, t_ns: int, position_rad: np.ndarray) -> StepDivergence | None:
        """Record a baseline command; return the step when it pairs with a policy command."""
        self._baseline_n += 1
        return self._add("baseline", t_ns, position_rad, None)

    def _add(
        self,
        stream: str,
        t_ns: int,
        position_rad: np.ndarray,
        obs: tuple[np.ndarray, np.ndarray | None] | None,
    ) -> StepDivergence | None:
        pos = np.asarray(position_rad, dtype=float)
        if pos.shape != (len(self.joint_names),):
            raise ValueError(f"{stream} command has shape {pos.shape}, "
                             f"expected ({len(self.joint_names)},)")
        hard = soft = 0
        if stream == "policy" and self.intervention_check is not None:
            # Checked on every policy command, paired or not: it is what would have reached
            # the arm had the policy acted.
            found = self.intervention_check(int(t_ns), pos, None if obs is None else obs[0])
            for iv in found:
                self.interventions.append(iv)
                if iv.hard:
                    self.hard_interventions.append(iv)
                self._by_kind[iv.kind] = self._by_kind.get(iv.kind, 0) + 1
                hard += int(bool(iv.hard))
                soft += int(not iv.hard)
            self._hard += hard
            self._soft += soft
        pair = self._matcher.add(stream, int(t_ns), pos)
        if pair is None:
            return None
        t_pair, p, b = pair
        step = step_divergence(t_pair, p, b, self.settings.agreement_tolerance_rad)
        self._steps += 1
        self._agree += step.agree
        self._first_ns = t_pair if self._first_ns is None else min(self._first_ns, t_pair)
        self._last_ns = t_pair if self._last_ns is None else max(self._last_ns, t_pair)
        self._sum_abs += step.abs_rad
        self._max_abs = np.maximum(self._max_abs, step.abs_rad)
        self._sum_l2 += step.l2_rad
        self._max_l2 = max(self._max_l2, step.l2_rad)
        self.history.append(step)
        return step

    def _add_coverage(self, q: np.ndarray, qd: np.ndarray | None) -> None:
        assert self.training_stats is not None
        try:
            x = self.observation_of(q, qd)
            inside, dims = within_k_sigma(x, self.training_stats, self.settings.coverage_k_sigma)
        except ValueError:
            # An observation that cannot be formed (no velocities) is outside by definition.
            inside, dims = False, np.zeros_like(self._cov_dims, dtype=bool)
        self._cov_n += 1
        self._cov_in += inside
        self._cov_dims += dims

    def add_confidence(
        self, t_ns: int, disagreement_rad: float, ood_score: float, version: int
    ) -> None:
        """Record one policy/confidence message."""
        self._conf_n += 1
        self.disagreement_rad.append(float(disagreement_rad))
        self.ood_score.append(float(ood_score))
        self._versions.add(int(version))
        s = self.settings
        # Non-finite confidence is treated as out of distribution: fail closed.
        ood = not (ood_score <= s.ood_threshold)
        unsure = not (disagreement_rad <= s.disagreement_threshold_rad)
        self._ood_n += ood
        self._fallback_n += ood or unsure

    def add_status(self, estop: bool) -> None:
        """Record a safety_filter/status message; count rising edges of the e-stop."""
        if estop and not self._estop_active:
            self._estops += 1
        self._estop_active = bool(estop)

    def finish(self) -> None:
        """Count commands still waiting for a partner as unmatched (end of a bag)."""
        self._matcher.flush()

    def metrics(self, now_ns: int | None = None) -> ShadowMetrics:
        """Return the metrics since the stage began and over the last `window_s`."""
        n = self._steps
        span_ns = 0 if self._first_ns is None or self._last_ns is None else (
            self._last_ns - self._first_ns)
        m = ShadowMetrics(
            steps=n,
            time_s=span_ns * 1e-9,
            agreement_rate=self._agree / n if n else None,
            mean_abs_rad=[float(v) for v in self._sum_abs / n] if n else [],
            max_abs_rad=[float(v) for v in self._max_abs] if n else [],
            mean_l2_rad=self._sum_l2 / n if n else None,
            max_l2_rad=self._max_l2 if n else None,
            l2_percentiles_rad=percentiles(s.l2_rad for s in self.history),
            hard_violations=self._hard,
            soft_interventions=self._soft,
            interventions_by_kind=dict(self._by_kind),
            policy_commands=self._policy_n,
            baseline_commands=self._baseline_n,
            unmatched_policy=self._matcher.unmatched["policy"],
            unmatched_baseline=self._matcher.unmatched["baseline"],
            confidence_samples=self._conf_n,
            disagreement_percentiles_rad=percentiles(self.disagreement_rad),
            ood_percentiles=percentiles(self.ood_score),
            ood_fraction=self._ood_n / self._conf_n if self._conf_n else None,
            fallback_rate=self._fallback_n / self._conf_n if self._conf_n else None,
            policy_versions=sorted(self._versions),
            estops=self._estops,
        )
        if self.training_stats is not None:
            k = self.settings.coverage_k_sigma
            c = self._cov_n
            m.coverage = CoverageSummary(
                samples=c,
                k_sigma=k,
                fraction_within=self._cov_in / c if c else None,
                per_dim_fraction=[float(v) / c for v in self._cov_dims] if c else [],
                names=list(self.training_stats.names),
            )
        if self.history:
            end = self.history[-1].t_ns if now_ns is None else now_ns
            start = end - int(round(self.settings.window_s * 1e9))
            recent = [s for s in self.history if s.t_ns > start]
            m.window = summarize_window(recent)
        return m


def json_default(o: Any) -> Any:
    """Make numpy scalars and arrays JSON-serializable (json.dumps(..., default=json_default))."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def _positions_then_velocities(q: np.ndarray, qd: np.ndarray | None) -> np.ndarray:
    """Return [q, qd] (the default observation layout when the stats say nothing else)."""
    if qd is None:
        raise ValueError("observation needs velocities")
    return np.concatenate([q, qd])

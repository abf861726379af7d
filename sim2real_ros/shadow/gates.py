"""Rollout gates: what each promotion (shadow -> advisory -> limited -> full) must measure.

config/rollout.yaml holds the metric settings and, per target stage, the criteria. A criterion
`min_<metric>` passes when the measured value is >= its threshold, `max_<metric>` when it is <=:
a value exactly at the threshold passes. A metric that could not be measured (no confidence
messages, no training statistics) fails its criterion: the gates fail closed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sim2real_ros.config import ConfigError, load_yaml, require, require_number

STAGES: tuple[str, ...] = ("shadow", "advisory", "limited", "full")


@dataclass(frozen=True)
class CriterionSpec:
    """What a criterion key measures: the metric it reads, its direction and unit."""

    key: str
    metric: str
    op: str  # ">=" for min_*, "<=" for max_*
    unit: str
    integer: bool
    description: str


# Every criterion a gate may use. Unknown keys in rollout.yaml are refused: a misspelt criterion
# would otherwise silently drop a safety gate.
CRITERIA: dict[str, CriterionSpec] = {
    s.key: s
    for s in (
        CriterionSpec("min_steps", "steps", ">=", "steps", True,
                      "aligned policy/baseline command pairs observed at the current stage"),
        CriterionSpec("min_time_s", "time_s", ">=", "s", False,
                      "stamp span of the aligned pairs observed at the current stage"),
        CriterionSpec("min_agreement_rate", "agreement_rate", ">=", "", False,
                      "fraction of aligned steps where every joint agrees within tolerance"),
        CriterionSpec("max_hard_violations", "hard_violations", "<=", "", True,
                      "would-be hard envelope violations had the policy acted"),
        CriterionSpec("max_soft_interventions", "soft_interventions", "<=", "", True,
                      "would-be soft interventions (clips, warnings) had the policy acted"),
        CriterionSpec("max_ood_fraction", "ood_fraction", "<=", "", False,
                      "fraction of confidence messages with OOD score above ood_threshold"),
        CriterionSpec("max_fallback_rate", "fallback_rate", "<=", "", False,
                      "fraction of confidence messages that would trigger the baseline fallback"),
        CriterionSpec("min_coverage", "coverage", ">=", "", False,
                      "fraction of observations within k sigma of the training statistics"),
        CriterionSpec("max_p95_l2_divergence_rad", "p95_l2_divergence_rad", "<=", "rad", False,
                      "95th percentile of the per-step L2 divergence"),
        CriterionSpec("max_unmatched_fraction", "unmatched_fraction", "<=", "", False,
                      "fraction of policy commands without a baseline partner"),
        CriterionSpec("max_estops", "estops", "<=", "", True,
                      "emergency stops the safety filter reported at the current stage"),
    )
}
# A gate without these would let a policy through on no evidence at all.
REQUIRED_CRITERIA = ("min_steps", "min_time_s", "min_agreement_rate", "max_hard_violations")


@dataclass(frozen=True)
class MetricsSettings:
    """How the comparator measures (rollout.yaml `metrics`)."""

    stamp_tolerance_s: float = 0.005
    agreement_tolerance_rad: float = 0.05
    ood_threshold: float = 3.0
    disagreement_threshold_rad: float = 0.1
    coverage_k_sigma: float = 3.0
    window_s: float = 10.0
    max_history_steps: int = 360000


@dataclass(frozen=True)
class Gate:
    """The criteria to promote from `from_stage` to `to_stage`: criterion key -> threshold."""

    from_stage: str
    to_stage: str
    thresholds: dict[str, float]


@dataclass(frozen=True)
class RolloutConfig:
    """Parsed config/rollout.yaml."""

    path: str
    metrics: MetricsSettings
    gates: dict[str, Gate]  # keyed by target stage
    log_file: str

    def gate_to(self, to_stage: str) -> Gate:
        """Return the gate that guards promotion into `to_stage`."""
        if to_stage not in self.gates:
            raise ConfigError(self.path, "gates", to_stage, f"one of {sorted(self.gates)}")
        return self.gates[to_stage]

    def log_path(self, base: Path | None = None) -> Path:
        """Return the rollout log's path ('' = default_log_path(); relative: against `base`)."""
        if not self.log_file:
            return default_log_path()
        p = Path(self.log_file).expanduser()
        return p if p.is_absolute() else (base or Path.cwd()) / p


LOG_ENV_VAR = "SIM2REAL_ROLLOUT_LOG"


def default_log_path() -> Path:
    """Return `$SIM2REAL_ROLLOUT_LOG`, else ~/.local/share/sim2real_ros/rollout_log.jsonl.

    One fixed place per user (like the policy registry): the comparator and the operator's
    `sim2real rollout promote` must write the same log whatever directory each started in.
    """
    env = os.environ.get(LOG_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "sim2real_ros" / "rollout_log.jsonl"


@dataclass(frozen=True)
class CriterionResult:
    """One row of a gate table."""

    key: str
    metric: str
    op: str
    threshold: float
    measured: float | None
    passed: bool
    unit: str

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready row."""
        return {
            "criterion": self.key,
            "metric": self.metric,
            "op": self.op,
            "threshold": self.threshold,
            "measured": self.measured,
            "passed": self.passed,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class GateResult:
    """A gate evaluated against measured metrics."""

    from_stage: str
    to_stage: str
    criteria: list[CriterionResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Return True when every criterion passed (an empty gate never passes)."""
        return bool(self.criteria) and all(c.passed for c in self.criteria)

    def failing(self) -> list[CriterionResult]:
        """Return the criteria that did not pass."""
        return [c for c in self.criteria if not c.passed]

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready gate table."""
        return {
            "from": self.from_stage,
            "to": self.to_stage,
            "passed": self.passed,
            "criteria": [c.as_dict() for c in self.criteria],
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> GateResult:
        """Rebuild a gate table from its JSON form."""
        rows = [
            CriterionResult(
                key=str(r["criterion"]),
                metric=str(r["metric"]),
                op=str(r["op"]),
                threshold=float(r["threshold"]),
                measured=None if r["measured"] is None else float(r["measured"]),
                passed=bool(r["passed"]),
                unit=str(r.get("unit", "")),
            )
            for r in data["criteria"]
        ]
        return GateResult(str(data["from"]), str(data["to"]), rows)


def stage_index(stage: str, where: str = "rollout stage") -> int:
    """Return the position of `stage` in STAGES; raise ConfigError for an unknown stage."""
    if stage not in STAGES:
        raise ConfigError(None, where, stage, f"one of {list(STAGES)}")
    return STAGES.index(stage)


def next_stage(stage: str) -> str | None:
    """Return the stage after `stage`, or None at full autonomy."""
    i = stage_index(stage)
    return STAGES[i + 1] if i + 1 < len(STAGES) else None


def check_criterion(op: str, measured: float | None, threshold: float) -> bool:
    """Return whether `measured op threshold` holds; equality passes, unmeasured fails."""
    if measured is None or not math.isfinite(measured):
        return False
    if op == ">=":
        return measured >= threshold
    if op == "<=":
        return measured <= threshold
    raise ValueError(f"unknown comparison {op!r}, expected '>=' or '<='")


def evaluate(gate: Gate, metrics: Mapping[str, float | int | None]) -> GateResult:
    """Evaluate every criterion of `gate` against `metrics` (metric name -> measured value)."""
    rows = []
    for key, threshold in gate.thresholds.items():
        spec = CRITERIA[key]
        raw = metrics.get(spec.metric)
        measured = None if raw is None else float(raw)
        rows.append(
            CriterionResult(
                key=key,
                metric=spec.metric,
                op=spec.op,
                threshold=threshold,
                measured=measured,
                passed=check_criterion(spec.op, measured, threshold),
                unit=spec.unit,
            )
        )
    return GateResult(gate.from_stage, gate.to_stage, rows)


def _metrics_settings(data: dict[str, Any], path: str) -> MetricsSettings:
    known = set(MetricsSettings.__dataclass_fields__)
    for key in data:
        if key not in known:
            raise ConfigError(path, f"metrics.{key}", data[key], f"one of {sorted(known)}")
    d = MetricsSettings()

    def num(key: str, low: float, high: float, unit: str) -> float:
        if key not in data:
            return float(getattr(d, key))
        return require_number(data, key, f"{path} [metrics]", low, high, unit)

    max_hist = data.get("max_history_steps", d.max_history_steps)
    if isinstance(max_hist, bool) or not isinstance(max_hist, int) or not 1 <= max_hist <= 10**8:
        raise ConfigError(path, "metrics.max_history_steps", max_hist, "an integer in [1, 1e8]")
    return MetricsSettings(
        stamp_tolerance_s=num("stamp_tolerance_s", 0.0, 1.0, "s"),
        agreement_tolerance_rad=num("agreement_tolerance_rad", 0.0, math.pi, "rad"),
        ood_threshold=num("ood_threshold", 0.0, 1e6, ""),
        disagreement_threshold_rad=num("disagreement_threshold_rad", 0.0, math.pi, "rad"),
        coverage_k_sigma=num("coverage_k_sigma", 0.0, 100.0, "sigma"),
        window_s=num("window_s", 1e-3, 86400.0, "s"),
        max_history_steps=int(max_hist),
    )


def _gate(to_stage: str, data: Any, path: str) -> Gate:
    where = f"gates.{to_stage}"
    if not isinstance(data, dict):
        raise ConfigError(path, where, data, "a mapping of criterion -> threshold")
    thresholds: dict[str, float] = {}
    for key, value in data.items():
        if key not in CRITERIA:
            raise ConfigError(path, f"{where}.{key}", value, f"one of {sorted(CRITERIA)}")
        spec = CRITERIA[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"{where}.{key}", value, "a number")
        v = float(value)
        if not math.isfinite(v) or v < 0.0:
            raise ConfigError(path, f"{where}.{key}", value, "a finite number >= 0")
        if spec.integer and v != int(v):
            raise ConfigError(path, f"{where}.{key}", value, "a whole number")
        is_fraction = spec.metric in (
            "agreement_rate", "ood_fraction", "fallback_rate", "coverage", "unmatched_fraction"
        )
        if is_fraction and v > 1.0:
            raise ConfigError(path, f"{where}.{key}", value, "a fraction in [0, 1]")
        thresholds[key] = v
    missing = [k for k in REQUIRED_CRITERIA if k not in thresholds]
    if missing:
        raise ConfigError(path, f"{where}.{missing[0]}", None, "present (every gate needs "
                          f"{list(REQUIRED_CRITERIA)})")
    return Gate(STAGES[STAGES.index(to_stage) - 1], to_stage, thresholds)


def load_rollout_config(path: str | Path | None = None) -> RolloutConfig:
    """Load and validate rollout.yaml (default: the shipped config/rollout.yaml)."""
    if path is None or str(path) == "":
        from sim2real_ros.paths import share_path

        path = share_path("config", "rollout.yaml")
    p = str(path)
    data = load_yaml(path)
    known = {"metrics", "gates", "log_file"}
    for key in data:
        if key not in known:
            raise ConfigError(p, key, data[key], f"one of {sorted(known)}")
    metrics_data = data.get("metrics", {})
    if not isinstance(metrics_data, dict):
        raise ConfigError(p, "metrics", metrics_data, "a mapping")
    metrics = _metrics_settings(metrics_data, p)
    gates_data = require(data, "gates", p, dict, "a mapping of target stage -> criteria")
    gates: dict[str, Gate] = {}
    for to_stage in STAGES[1:]:
        if to_stage not in gates_data:
            raise ConfigError(p, f"gates.{to_stage}", None, "a gate for every promotion "
                              f"({list(STAGES[1:])})")
        gates[to_stage] = _gate(to_stage, gates_data[to_stage], p)
    extra = set(gates_data) - set(STAGES[1:])
    if extra:
        key = sorted(extra)[0]
        raise ConfigError(p, f"gates.{key}", gates_data[key], f"one of {list(STAGES[1:])}")
    log_file = data.get("log_file", "")
    if not isinstance(log_file, str):
        raise ConfigError(p, "log_file", log_file, "a path, or '' for the default")
    return RolloutConfig(p, metrics, gates, log_file)


@dataclass(frozen=True)
class Recommendation:
    """What the comparator recommends: stay, or promote to the next stage (its gate passed)."""

    current_stage: str
    recommended_stage: str
    gate: GateResult | None  # None at full autonomy: no further gate

    @property
    def promote(self) -> bool:
        """Return True when promotion is recommended."""
        return self.recommended_stage != self.current_stage

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form published on shadow_comparator/recommendation."""
        return {
            "current_stage": self.current_stage,
            "recommended_stage": self.recommended_stage,
            "promote": self.promote,
            "gate": None if self.gate is None else self.gate.as_dict(),
        }


def recommend(
    config: RolloutConfig, current_stage: str, metrics: Mapping[str, float | int | None]
) -> Recommendation:
    """Recommend the next stage when its gate passes on `metrics`, else the current one."""
    nxt = next_stage(current_stage)
    if nxt is None:
        return Recommendation(current_stage, current_stage, None)
    result = evaluate(config.gate_to(nxt), metrics)
    return Recommendation(current_stage, nxt if result.passed else current_stage, result)

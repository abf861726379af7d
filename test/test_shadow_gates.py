"""Rollout gates pass and fail exactly at their thresholds; rollout.yaml is validated."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim2real_ros.config import ConfigError
from sim2real_ros.shadow.gates import (
    CRITERIA,
    STAGES,
    Gate,
    evaluate,
    load_rollout_config,
    next_stage,
    recommend,
)


def _passing_metrics(gate: Gate) -> dict[str, float]:
    """Metrics exactly at every threshold of `gate`."""
    return {CRITERIA[k].metric: v for k, v in gate.thresholds.items()}


def test_shipped_rollout_config_has_a_gate_for_every_promotion() -> None:
    cfg = load_rollout_config()
    assert list(cfg.gates) == list(STAGES[1:])
    for to_stage, gate in cfg.gates.items():
        assert gate.to_stage == to_stage and next_stage(gate.from_stage) == to_stage
        assert gate.thresholds["max_hard_violations"] == 0


@pytest.mark.parametrize("to_stage", STAGES[1:])
def test_every_criterion_passes_exactly_at_its_threshold(to_stage: str) -> None:
    gate = load_rollout_config().gate_to(to_stage)
    result = evaluate(gate, _passing_metrics(gate))
    assert result.passed, result.failing()
    assert len(result.criteria) == len(gate.thresholds)


@pytest.mark.parametrize("to_stage", STAGES[1:])
def test_every_criterion_fails_just_beyond_its_threshold(to_stage: str) -> None:
    gate = load_rollout_config().gate_to(to_stage)
    for key, threshold in gate.thresholds.items():
        spec = CRITERIA[key]
        step = 1 if spec.integer else max(abs(threshold), 1.0) * 1e-9
        beyond = threshold - step if spec.op == ">=" else threshold + step
        metrics = _passing_metrics(gate)
        metrics[spec.metric] = beyond
        result = evaluate(gate, metrics)
        assert not result.passed, key
        assert [c.key for c in result.failing()] == [key]
        row = result.failing()[0]
        assert row.measured == beyond and row.threshold == threshold


def test_rates_computed_as_counts_pass_at_the_threshold() -> None:
    gate = Gate("shadow", "advisory", {"min_steps": 100, "min_time_s": 0.0,
                                       "min_agreement_rate": 0.95, "max_hard_violations": 0,
                                       "max_ood_fraction": 0.05})
    ok = {"steps": 100, "time_s": 1.0, "agreement_rate": 95 / 100, "hard_violations": 0,
          "ood_fraction": 5 / 100}
    assert evaluate(gate, ok).passed
    assert not evaluate(gate, {**ok, "agreement_rate": 94 / 100}).passed
    assert not evaluate(gate, {**ok, "ood_fraction": 6 / 100}).passed
    assert not evaluate(gate, {**ok, "steps": 99}).passed
    assert not evaluate(gate, {**ok, "hard_violations": 1}).passed


def test_unmeasured_metric_fails_closed() -> None:
    gate = load_rollout_config().gate_to("advisory")
    metrics = _passing_metrics(gate)
    metrics["coverage"] = None  # type: ignore[assignment]
    result = evaluate(gate, metrics)
    assert [c.key for c in result.failing()] == ["min_coverage"]
    assert result.failing()[0].measured is None
    metrics["coverage"] = float("nan")
    assert not evaluate(gate, metrics).passed


def test_recommendation_names_the_next_stage_only_when_its_gate_passes() -> None:
    cfg = load_rollout_config()
    gate = cfg.gate_to("limited")
    good = _passing_metrics(gate)
    rec = recommend(cfg, "advisory", good)
    assert rec.promote and rec.recommended_stage == "limited"
    rec = recommend(cfg, "advisory", {**good, "hard_violations": 1})
    assert not rec.promote and rec.recommended_stage == "advisory"
    assert rec.as_dict()["gate"]["passed"] is False
    top = recommend(cfg, "full", good)
    assert not top.promote and top.gate is None


def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "rollout.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _valid() -> dict:
    gate = {"min_steps": 10, "min_time_s": 1.0, "min_agreement_rate": 0.9,
            "max_hard_violations": 0}
    return {"gates": {s: dict(gate) for s in STAGES[1:]}}


@pytest.mark.parametrize(
    "mutate, key, allowed",
    [
        (lambda d: d["gates"]["limited"].update(min_agreement_rte=0.9),
         "gates.limited.min_agreement_rte", "one of"),
        (lambda d: d["gates"]["full"].pop("max_hard_violations"),
         "gates.full.max_hard_violations", "every gate needs"),
        (lambda d: d["gates"].pop("advisory"), "gates.advisory", "a gate for every promotion"),
        (lambda d: d["gates"]["advisory"].update(min_agreement_rate=1.5),
         "gates.advisory.min_agreement_rate", "a fraction in [0, 1]"),
        (lambda d: d["gates"]["advisory"].update(max_hard_violations=0.5),
         "gates.advisory.max_hard_violations", "a whole number"),
        (lambda d: d["gates"]["advisory"].update(min_steps=-1),
         "gates.advisory.min_steps", ">= 0"),
        (lambda d: d["gates"]["advisory"].update(min_steps="many"),
         "gates.advisory.min_steps", "a number"),
        (lambda d: d.update(metrics={"stamp_tolerance_s": 5.0}),
         "stamp_tolerance_s", "[0.0, 1.0] s"),
        (lambda d: d.update(metrics={"agreement_tol": 0.1}), "metrics.agreement_tol", "one of"),
        (lambda d: d["gates"].update(autonomous={}), "gates.autonomous", "one of"),
    ],
)
def test_invalid_rollout_config_is_refused_naming_file_key_and_range(
    tmp_path: Path, mutate, key: str, allowed: str
) -> None:
    data = _valid()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_rollout_config(path)
    msg = str(err.value)
    assert str(path) in msg and key in msg and allowed in msg


def test_minimal_valid_config_uses_default_metric_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_rollout_config(_write(tmp_path, _valid()))
    assert cfg.metrics.agreement_tolerance_rad == 0.05
    monkeypatch.setenv("SIM2REAL_ROLLOUT_LOG", str(tmp_path / "cell.jsonl"))
    assert cfg.log_path() == tmp_path / "cell.jsonl"  # same file from any working directory
    monkeypatch.delenv("SIM2REAL_ROLLOUT_LOG")
    assert cfg.log_path() == Path.home() / ".local/share/sim2real_ros/rollout_log.jsonl"
    relative = load_rollout_config(_write(tmp_path, {**_valid(), "log_file": "r.jsonl"}))
    assert relative.log_path(tmp_path) == tmp_path / "r.jsonl"

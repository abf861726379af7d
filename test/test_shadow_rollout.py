"""The stage machine: operator-only promotion on a passed gate, automatic demotion, the log."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from sim2real_ros.config import ConfigError
from sim2real_ros.shadow.gates import CRITERIA, evaluate, load_rollout_config
from sim2real_ros.shadow.rollout import (
    PromotionRefused,
    RolloutLog,
    RolloutStateMachine,
    Transition,
    current_stage_from_log,
)


def _gate_result(to_stage: str, passed: bool = True):
    gate = load_rollout_config().gate_to(to_stage)
    metrics = {CRITERIA[k].metric: v for k, v in gate.thresholds.items()}
    if not passed:
        metrics["hard_violations"] = 1
    return evaluate(gate, metrics)


def test_promotion_with_a_passed_gate_is_logged_with_who_why_and_evidence(tmp_path: Path) -> None:
    log = RolloutLog(tmp_path / "rollout.jsonl")
    sm = RolloutStateMachine("shadow", log)
    t = sm.promote("advisory", "alice", "two shifts clean", _gate_result("advisory"),
                   evidence={"report": "r.json"}, time_s=100.0)
    assert sm.stage == "advisory"
    records = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert records == [t.as_dict()]
    r = records[0]
    assert (r["from"], r["to"], r["kind"], r["who"], r["why"]) == (
        "shadow", "advisory", "promotion", "alice", "two shifts clean")
    assert r["evidence"]["gate"]["passed"] is True and r["evidence"]["report"] == "r.json"
    assert log.read() == [t]
    assert current_stage_from_log(log) == "advisory"


@pytest.mark.parametrize(
    "to_stage, who, why, gate_to, passed, match",
    [
        ("advisory", "alice", "ok", "advisory", False, "max_hard_violations"),
        ("limited", "alice", "ok", "limited", True, "one stage at a time"),
        ("advisory", " ", "ok", "advisory", True, "who"),
        ("advisory", "alice", "", "advisory", True, "why"),
        ("advisory", "alice", "ok", "limited", True, "gate table for advisory -> limited"),
    ],
)
def test_promotion_is_refused_unless_every_rule_holds(
    tmp_path: Path, to_stage: str, who: str, why: str, gate_to: str, passed: bool, match: str
) -> None:
    log = RolloutLog(tmp_path / "rollout.jsonl")
    sm = RolloutStateMachine("shadow", log)
    with pytest.raises(PromotionRefused, match=match):
        sm.promote(to_stage, who, why, _gate_result(gate_to, passed))
    assert sm.stage == "shadow" and log.read() == []


def test_no_promotion_beyond_full() -> None:
    sm = RolloutStateMachine("full")
    with pytest.raises(PromotionRefused, match="already at full"):
        sm.promote("full", "a", "b", _gate_result("full"))


def test_observed_stage_drop_is_an_automatic_demotion_or_rollback(tmp_path: Path) -> None:
    log = RolloutLog(tmp_path / "rollout.jsonl")
    sm = RolloutStateMachine("limited", log)
    t = sm.observe("advisory", evidence={"events": [{"kind": "velocity"}]}, time_s=5.0)
    assert t is not None and (t.kind, t.who, t.from_stage, t.to_stage) == (
        "demotion", "automatic", "limited", "advisory")
    t2 = sm.observe("shadow", evidence={"version": {"version": 1}}, rolled_back=True)
    assert t2 is not None and t2.kind == "rollback"
    assert sm.observe("shadow") is None
    assert [r.kind for r in log.read()] == ["demotion", "rollback"]
    assert log.read()[0].evidence == {"events": [{"kind": "velocity"}]}


def test_observed_promotion_follows_the_operator_record_or_flags_an_unrecorded_one(
    tmp_path: Path,
) -> None:
    log = RolloutLog(tmp_path / "rollout.jsonl")
    cli_side = RolloutStateMachine("shadow", log)
    record = cli_side.promote("advisory", "bob", "ok", _gate_result("advisory"))
    node_side = RolloutStateMachine("shadow", log)
    assert node_side.observe("advisory", promotion_record=log.last()) == record
    assert len(log.read()) == 1  # followed, not logged twice
    flagged = node_side.observe("limited", promotion_record=log.last())
    assert flagged is not None and flagged.who == "unknown" and "outside" in flagged.why
    assert len(log.read()) == 2


def test_demotion_must_lower_the_stage() -> None:
    sm = RolloutStateMachine("advisory")
    with pytest.raises(ValueError, match="not a lower stage"):
        sm.demote("limited", "why")
    with pytest.raises(ValueError, match="cannot raise"):
        sm.demote("limited", "why", kind="rollback")


def test_corrupt_log_line_is_reported_with_its_line_number(tmp_path: Path) -> None:
    p = tmp_path / "rollout.jsonl"
    good = Transition(1.0, "shadow", "advisory", "promotion", "a", "b").as_dict()
    p.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"rollout.jsonl:2"):
        RolloutLog(p).read()
    p.write_text(json.dumps({**good, "to": "autonomous"}) + "\n")
    with pytest.raises(ConfigError, match="autonomous"):
        RolloutLog(p).read()


def _append_many(path: str, who: str) -> None:
    log = RolloutLog(path)
    for i in range(50):
        log.append(Transition(float(i), "shadow", "shadow", "rollback", who, "x" * 2000))


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    path = str(tmp_path / "rollout.jsonl")
    procs = [multiprocessing.get_context("spawn").Process(target=_append_many, args=(path, w))
             for w in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    records = RolloutLog(path).read()
    assert sorted(r.who for r in records) == ["a"] * 50 + ["b"] * 50

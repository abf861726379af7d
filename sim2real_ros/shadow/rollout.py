"""The rollout stage machine: shadow -> advisory -> limited -> full, and back.

Promotion moves one stage up and only by an explicit operator action that records who, why and
the gate evidence; it is refused unless the gate for that step passed. Demotion and rollback
move down, automatically (the safety monitor fires) or by an operator. Every transition is
appended, with its evidence, as one JSON line to the rollout log, so the history of a cell's
autonomy can be audited and replayed.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim2real_ros.config import ConfigError
from sim2real_ros.shadow.gates import STAGES, GateResult, next_stage, stage_index

KINDS = ("promotion", "demotion", "rollback")
AUTOMATIC = "automatic"


class PromotionRefused(ValueError):
    """A promotion was asked for that the rules do not allow; the message says which rule."""


@dataclass(frozen=True)
class Transition:
    """One stage change with the evidence it was made on."""

    time_s: float  # wall-clock (Unix) seconds
    from_stage: str
    to_stage: str
    kind: str  # promotion | demotion | rollback
    who: str
    why: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON record written to the rollout log."""
        return {
            "time_s": self.time_s,
            "from": self.from_stage,
            "to": self.to_stage,
            "kind": self.kind,
            "who": self.who,
            "why": self.why,
            "evidence": self.evidence,
        }

    @staticmethod
    def from_dict(data: dict[str, Any], where: str = "<record>") -> Transition:
        """Rebuild a transition from its JSON record; raise ConfigError naming the bad field."""
        for key in ("time_s", "from", "to", "kind", "who", "why"):
            if key not in data:
                raise ConfigError(where, key, None, "present in every rollout record")
        stage_index(str(data["from"]), f"{where}: from")
        stage_index(str(data["to"]), f"{where}: to")
        if data["kind"] not in KINDS:
            raise ConfigError(where, "kind", data["kind"], f"one of {list(KINDS)}")
        return Transition(
            time_s=float(data["time_s"]),
            from_stage=str(data["from"]),
            to_stage=str(data["to"]),
            kind=str(data["kind"]),
            who=str(data["who"]),
            why=str(data["why"]),
            evidence=dict(data.get("evidence") or {}),
        )


class RolloutLog:
    """Append-only JSON-lines log of transitions, safe for several writing processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, transition: Transition) -> None:
        """Append one record (an exclusive lock keeps lines whole across processes)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(transition.as_dict(), sort_keys=True, default=_plain) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def read(self) -> list[Transition]:
        """Return every transition; a corrupt line raises ConfigError naming its line number."""
        if not self.path.exists():
            return []
        out = []
        for i, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{self.path}:{i}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(where, "<line>", line[:80], f"a JSON record ({exc})") from exc
            if not isinstance(data, dict):
                raise ConfigError(where, "<line>", line[:80], "a JSON object")
            out.append(Transition.from_dict(data, where))
        return out

    def last(self) -> Transition | None:
        """Return the latest transition, or None for an empty log."""
        records = self.read()
        return records[-1] if records else None


class RolloutStateMachine:
    """Holds the current stage and makes only the transitions the rules allow."""

    def __init__(self, stage: str = "shadow", log: RolloutLog | None = None) -> None:
        stage_index(stage)
        self._stage = stage
        self.log = log

    @property
    def stage(self) -> str:
        """Return the current stage."""
        return self._stage

    def _record(self, t: Transition) -> Transition:
        if self.log is not None:
            self.log.append(t)
        self._stage = t.to_stage
        return t

    def promote(
        self,
        to_stage: str,
        who: str,
        why: str,
        gate: GateResult,
        evidence: dict[str, Any] | None = None,
        time_s: float | None = None,
    ) -> Transition:
        """Move one stage up on an operator's word, only when the gate for that step passed."""
        stage_index(to_stage, "--to")
        if not who.strip():
            raise PromotionRefused("a promotion must record who made it (--who)")
        if not why.strip():
            raise PromotionRefused("a promotion must record why (--why)")
        expected = next_stage(self._stage)
        if to_stage != expected:
            raise PromotionRefused(
                f"cannot promote {self._stage} -> {to_stage}: promotion is one stage at a time"
                + (f" (next is {expected})" if expected else " (already at full autonomy)")
            )
        if (gate.from_stage, gate.to_stage) != (self._stage, to_stage):
            raise PromotionRefused(
                f"the evidence is a gate table for {gate.from_stage} -> {gate.to_stage}, "
                f"not for {self._stage} -> {to_stage}"
            )
        if not gate.passed:
            failing = ", ".join(
                f"{c.key} (measured {c.measured}, needs {c.op} {c.threshold})"
                for c in gate.failing()
            ) or "no criteria"
            raise PromotionRefused(f"gate {self._stage} -> {to_stage} not passed: {failing}")
        ev = {"gate": gate.as_dict(), **(evidence or {})}
        t = Transition(
            time.time() if time_s is None else time_s,
            self._stage, to_stage, "promotion", who.strip(), why.strip(), ev,
        )
        return self._record(t)

    def demote(
        self,
        to_stage: str,
        why: str,
        evidence: dict[str, Any] | None = None,
        who: str = AUTOMATIC,
        kind: str = "demotion",
        time_s: float | None = None,
    ) -> Transition:
        """Move to a lower stage (automatic by default); `kind` is demotion or rollback."""
        if kind not in ("demotion", "rollback"):
            raise ValueError(f"kind must be 'demotion' or 'rollback', got {kind!r}")
        if stage_index(to_stage) >= stage_index(self._stage) and kind == "demotion":
            raise ValueError(f"cannot demote {self._stage} -> {to_stage}: not a lower stage")
        if stage_index(to_stage) > stage_index(self._stage):
            raise ValueError(f"a rollback cannot raise the stage ({self._stage} -> {to_stage})")
        t = Transition(
            time.time() if time_s is None else time_s,
            self._stage, to_stage, kind, who, why, dict(evidence or {}),
        )
        return self._record(t)

    def observe(
        self,
        stage: str,
        evidence: dict[str, Any] | None = None,
        rolled_back: bool = False,
        promotion_record: Transition | None = None,
        time_s: float | None = None,
    ) -> Transition | None:
        """Reconcile a stage observed on the safety filter; return the transition it implies.

        A lower stage is an automatic demotion (a rollback when the policy version was rolled
        back). A higher stage is expected to have been recorded by `sim2real rollout promote`
        (`promotion_record`); if none matches, it is logged as an unrecorded promotion so the
        audit shows who bypassed the gate.
        """
        stage_index(stage, "safety_filter rollout_stage")
        if stage == self._stage:
            return None
        if stage_index(stage) < stage_index(self._stage):
            return self.demote(
                stage,
                "the safety monitor lowered the stage"
                + (" and rolled the policy back" if rolled_back else ""),
                evidence,
                kind="rollback" if rolled_back else "demotion",
                time_s=time_s,
            )
        if (
            promotion_record is not None
            and promotion_record.kind == "promotion"
            and promotion_record.to_stage == stage
            and promotion_record.from_stage == self._stage
        ):
            # Already logged by the operator's command; only follow it.
            self._stage = stage
            return promotion_record
        t = Transition(
            time.time() if time_s is None else time_s,
            self._stage, stage, "promotion", "unknown",
            "stage raised outside `sim2real rollout promote` (no gate evidence recorded)",
            dict(evidence or {}),
        )
        return self._record(t)


def _plain(o: Any) -> Any:
    # numpy scalars and arrays in evidence (measured values) have tolist().
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def current_stage_from_log(log: RolloutLog, default: str = STAGES[0]) -> str:
    """Return the stage the log ends in (the default for an empty log)."""
    last = log.last()
    return default if last is None else last.to_stage

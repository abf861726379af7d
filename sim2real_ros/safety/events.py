"""Safety events: every intervention, fallback, hold and e-stop, with the envelope hash."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

# Kinds of event (the `kind` field of safety_filter/events).
INTERVENTION = "intervention"  # a command was changed to satisfy a limit
INVALID_COMMAND = "invalid_command"  # a command was rejected (NaN, names, length, stamp)
INVALID_INPUT = "invalid_input"  # a measurement or dt was rejected
FALLBACK = "fallback"  # the policy lost authority; the baseline (or hold) drives
RETURN = "return"  # the policy regained authority after the calm period
HOLD = "hold"  # no trustworthy source: braking to a stop and holding
RESUME = "resume"  # leaving hold
ESTOP = "estop"  # hard violation: latched stop until reset
ESTOP_RESET = "estop_reset"
ESTOP_RESET_REFUSED = "estop_reset_refused"
STAGE = "stage"  # rollout stage changed
MONITOR = "monitor"  # a monitor threshold was crossed
ROLLBACK = "rollback"  # rollback requested / its outcome
CLOCK_JUMP = "clock_jump"
SOURCE = "source"  # the driving source changed between policy and baseline


@dataclass(frozen=True)
class SafetyEvent:
    """One safety event: what happened, which limit, which joint, by how much."""

    kind: str
    limit: str = ""
    joint: str = ""
    excess: float = 0.0
    detail: str = ""
    t_s: float = 0.0
    # Fallback/hold events: control periods from the moment the condition held to the reaction.
    reaction_periods: float | None = None
    # ...and how late (control periods) the reacting tick itself ran: scheduling delay.
    tick_late_periods: float | None = None

    def to_dict(self, envelope_sha256: str) -> dict[str, Any]:
        """Return the event as the JSON object published on safety_filter/events."""
        out = {
            "t": self.t_s,
            "kind": self.kind,
            "limit": self.limit,
            "joint": self.joint,
            # JSON has no NaN/inf; a non-finite excess (a NaN command) is reported as a string.
            "excess": self.excess if math.isfinite(self.excess) else str(self.excess),
            "detail": self.detail,
            "envelope_sha256": envelope_sha256,
        }
        if self.reaction_periods is not None:
            out["reaction_periods"] = self.reaction_periods
        if self.tick_late_periods is not None:
            out["tick_late_periods"] = self.tick_late_periods
        return out

    def to_json(self, envelope_sha256: str) -> str:
        """Return the event as one JSON line."""
        return json.dumps(self.to_dict(envelope_sha256), sort_keys=True)


class EventCounter:
    """Counts events by kind and by (kind, limit) for diagnostics."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.by_limit: Counter[str] = Counter()
        self.total = 0

    def add(self, events: list[SafetyEvent]) -> None:
        """Count a batch of events."""
        for e in events:
            self.total += 1
            self.by_kind[e.kind] += 1
            if e.limit:
                self.by_limit[f"{e.kind}.{e.limit}"] += 1

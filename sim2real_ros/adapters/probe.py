"""What a running graph does, measured from outside it: rates, latency, tracking (pure core).

The probe is a passive tap: the demo, the graph tests and the latency benchmark feed it what
they hear on the contract topics with arrival times, and it answers:

- achieved control rate: arrivals of the arm command (forward_position_controller/commands);
- observation -> arm command latency: a Float64MultiArray has no stamp, so each new decision
  (policy/joint_command or baseline/joint_command, stamped with the joint_states they answer)
  is paired with the first arm command heard after it: the age of the measured state when the
  command built from it reaches the arm. The pairing is the audit room's
  (`sim2real_ros.audit.latency.LatencyPairer`), so `sim2real audit --live`, the demo and the
  benchmark measure the same thing. Arrival is where the probe hears it: one DDS hop, like the
  arm's own subscription;
- observation -> policy command latency (policy/joint_command arrival minus its stamp);
- tracking: tool position from joint_states (forward kinematics) against task/target, and which
  targets were reached within a tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim2real_ros.audit.latency import LatencyPairer

SOURCES = ("policy", "baseline")  # the answer streams of the contract


def pct(values: list[float] | np.ndarray, q: float) -> float | None:
    """Return the q-th percentile, or None for no values."""
    arr = np.asarray(values, dtype=float)
    return float(np.percentile(arr, q)) if arr.size else None


@dataclass
class TargetVisit:
    """One target of the task and how close the tool came while it was active."""

    t_start_s: float
    target_xyz: tuple[float, float, float]
    min_distance_m: float = math.inf
    reached_at_s: float | None = None


@dataclass
class ProbeCore:
    """Accumulates timestamped observations of a running graph."""

    reach_tolerance_m: float = 0.02
    # Arrival times (s, the probe's clock = the graph's wall clock) and payloads.
    joint_state_arrivals_s: list[float] = field(default_factory=list)
    joint_state_stamps_s: list[float] = field(default_factory=list)
    command_arrivals_s: list[float] = field(default_factory=list)
    pairer: LatencyPairer = field(default_factory=LatencyPairer)
    # (arrival time relative to t0, latency) for each paired arm command, for the plots.
    command_latency_trace: list[tuple[float, float]] = field(default_factory=list)
    policy_latency_s: list[float] = field(default_factory=list)
    source_arrivals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    # Arrival times relative to t0 of each source's commands (gaps show a dead policy).
    source_times: dict[str, list[float]] = field(
        default_factory=lambda: {s: [] for s in SOURCES})
    confidence: list[tuple[float, float, float]] = field(default_factory=list)  # t, disagree, ood
    tool_trace: list[tuple[float, float]] = field(default_factory=list)  # t, distance to target
    targets: list[TargetVisit] = field(default_factory=list)
    source_timeline: list[tuple[float, str]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    t0_s: float | None = None

    def __post_init__(self) -> None:
        self._active_source: str | None = None
        self._target: np.ndarray | None = None

    def _rel(self, t_s: float) -> float:
        if self.t0_s is None:
            self.t0_s = t_s
        return t_s - self.t0_s

    # -- inputs ---------------------------------------------------------------------------
    def on_joint_state(self, arrival_s: float, stamp_s: float,
                       tool_xyz: np.ndarray | None = None) -> None:
        """Record one joint_states message (and the tool position computed from it)."""
        self._rel(arrival_s)
        self.pairer.add_state(int(arrival_s * 1e9), int(stamp_s * 1e9))
        self.joint_state_arrivals_s.append(arrival_s)
        self.joint_state_stamps_s.append(stamp_s)
        if tool_xyz is not None and self._target is not None:
            d = float(np.linalg.norm(np.asarray(tool_xyz) - self._target))
            t = self._rel(arrival_s)
            self.tool_trace.append((t, d))
            visit = self.targets[-1]
            visit.min_distance_m = min(visit.min_distance_m, d)
            if visit.reached_at_s is None and d <= self.reach_tolerance_m:
                visit.reached_at_s = t

    def on_target(self, arrival_s: float, xyz: tuple[float, float, float]) -> None:
        """Record a task target; a repeated identical target continues the current visit."""
        target = np.asarray(xyz, dtype=float)
        if self._target is not None and np.allclose(target, self._target, atol=1e-9):
            return
        self._target = target
        self.targets.append(TargetVisit(self._rel(arrival_s), tuple(map(float, xyz))))

    def on_source_command(self, source: str, arrival_s: float, obs_stamp_s: float) -> None:
        """Record a policy or baseline command (stamped with the observation it answers)."""
        self.source_times[source].append(self._rel(arrival_s))
        self.source_arrivals[source] += 1
        self.pairer.add_answer(int(arrival_s * 1e9), int(obs_stamp_s * 1e9))
        if source == "policy":
            self.policy_latency_s.append(arrival_s - obs_stamp_s)

    def on_active_source(self, arrival_s: float, source: str) -> None:
        """Record which source drives the arm (from safety_filter/status)."""
        if source != self._active_source:
            self._active_source = source
            self.source_timeline.append((self._rel(arrival_s), source))

    def on_arm_command(self, arrival_s: float) -> None:
        """Record one arm command (paired with the newest decision not yet paired)."""
        t = self._rel(arrival_s)
        self.command_arrivals_s.append(arrival_s)
        before = len(self.pairer.obs_to_command_s)
        self.pairer.add_command(int(arrival_s * 1e9))
        if len(self.pairer.obs_to_command_s) > before:
            self.command_latency_trace.append((t, self.pairer.obs_to_command_s[-1]))

    def on_confidence(self, arrival_s: float, disagreement: float, ood: float) -> None:
        """Record one policy/confidence sample."""
        self.confidence.append((self._rel(arrival_s), disagreement, ood))

    def on_event(self, arrival_s: float, event: dict[str, Any]) -> None:
        """Record one safety event (JSON of safety_filter/events)."""
        self.events.append({"t_rel": self._rel(arrival_s), **event})

    # -- results --------------------------------------------------------------------------
    @staticmethod
    def rate_hz(arrivals_s: list[float], since_s: float | None = None) -> float | None:
        """Return the mean arrival rate (Hz) over the span of `arrivals_s` (after since_s)."""
        a = [t for t in arrivals_s if since_s is None or t >= since_s]
        if len(a) < 2 or a[-1] <= a[0]:
            return None
        return (len(a) - 1) / (a[-1] - a[0])

    def summary(self, since_s: float | None = None) -> dict[str, Any]:
        """Return the measured figures as a JSON-ready dict (latencies in ms)."""
        periods = np.diff(self.command_arrivals_s) if len(self.command_arrivals_s) > 1 else []
        lat = [v * 1e3 for t, v in self.command_latency_trace
               if since_s is None or t + (self.t0_s or 0.0) >= since_s]
        plat = [v * 1e3 for v in self.policy_latency_s]
        reached = [v for v in self.targets if v.reached_at_s is not None]
        return {
            "control_rate_hz": self.rate_hz(self.command_arrivals_s, since_s),
            "joint_states_rate_hz": self.rate_hz(self.joint_state_arrivals_s, since_s),
            "arm_commands": len(self.command_arrivals_s),
            "command_period_ms_p99": pct(np.asarray(periods) * 1e3, 99),
            "obs_to_command_latency_ms": {"p50": pct(lat, 50), "p99": pct(lat, 99),
                                          "n": len(lat)},
            "obs_to_policy_command_latency_ms": {"p50": pct(plat, 50), "p99": pct(plat, 99),
                                                 "n": len(plat)},
            "source_commands": dict(self.source_arrivals),
            "targets": len(self.targets),
            "targets_reached": len(reached),
            "reach_tolerance_m": self.reach_tolerance_m,
            "time_to_reach_s": [round(v.reached_at_s - v.t_start_s, 3) for v in reached
                                if v.reached_at_s is not None],
            "safety_events": len(self.events),
        }

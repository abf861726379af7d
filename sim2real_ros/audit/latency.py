"""Observation-to-action latency of a graph, from header stamps and arrival times.

The policy stamps its command with the stamp of the joint_states it answers (topic contract), so
the age of an observation when the arm receives the command built from it is
`arrival(forward_position_controller/commands) - header.stamp(policy/joint_command)`. The same
pairing runs on a live graph (arrival = the probe's clock, see probe.py) and on a bag (arrival =
the recorder's receive time). Pure: no rclpy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim2real_ros.audit.evidence import LatencyMeasurement

STATE_TOPIC = "joint_states"
ANSWER_TOPICS = ("policy/joint_command", "baseline/joint_command")
COMMAND_TOPIC = "forward_position_controller/commands"
STATUS_TOPIC = "safety_filter/status"
ANSWER_SOURCES = ("policy", "baseline")


def answer_source(topic: str) -> str | None:
    """Return 'policy' or 'baseline' for an answer topic, else None."""
    for name in ANSWER_TOPICS:
        if topic_matches(topic, name):
            return name.split("/", 1)[0]
    return None


def topic_matches(topic: str, name: str) -> bool:
    """True if `topic` is `name` or ends with `/name` (namespaced or absolute)."""
    t = topic.lstrip("/")
    n = name.lstrip("/")
    return t == n or t.endswith("/" + n)


def header_stamp_ns(msg: Any) -> int | None:
    """Return a message's header stamp in ns (works for rclpy and rosbags messages)."""
    header = getattr(msg, "header", None)
    if header is None:
        return None
    stamp = header.stamp
    sec = getattr(stamp, "sec", None)
    nsec = getattr(stamp, "nanosec", None)
    if sec is None or nsec is None:
        return None
    return int(sec) * 1_000_000_000 + int(nsec)


@dataclass
class LatencyPairer:
    """Pair arm commands with the observation stamps they answer, as messages stream in.

    Only the first arm command after a new answer counts: a filter that republishes its last
    command on a timer holds a target, it does not make a new decision. When the safety filter
    has said which source drives the arm (`driving`, from safety_filter/status), answers of the
    other source are not paired: in shadow mode the policy answers too, but the baseline acts.
    """

    obs_to_command_s: list[float] = field(default_factory=list)
    obs_to_answer_s: list[float] = field(default_factory=list)
    state_transport_s: list[float] = field(default_factory=list)
    driving: str | None = None
    _pending_stamp_ns: int | None = None
    _last_answer_stamp_ns: int | None = None

    def add_state(self, arrival_ns: int, stamp_ns: int | None) -> None:
        """Record a joint_states arrival (its transport delay)."""
        if stamp_ns is not None and stamp_ns > 0:
            self.state_transport_s.append((arrival_ns - stamp_ns) * 1e-9)

    def add_answer(self, arrival_ns: int, stamp_ns: int | None, source: str | None = None
                   ) -> None:
        """Record a policy (or baseline) command stamped with its observation's stamp."""
        if stamp_ns is None or stamp_ns <= 0:
            return
        if source is not None and self.driving in ANSWER_SOURCES and source != self.driving:
            return
        # A repeated stamp is the same decision republished; it is not a new answer.
        if stamp_ns == self._last_answer_stamp_ns:
            return
        self._last_answer_stamp_ns = stamp_ns
        self.obs_to_answer_s.append((arrival_ns - stamp_ns) * 1e-9)
        self._pending_stamp_ns = stamp_ns

    def set_status(self, status: Any) -> None:
        """Take the driving source from a safety_filter/status record (dict or JSON text)."""
        if isinstance(status, str):
            try:
                status = json.loads(status)
            except json.JSONDecodeError:
                return
        if isinstance(status, dict) and isinstance(status.get("source"), str):
            self.driving = status["source"]

    def add_command(self, arrival_ns: int) -> None:
        """Record an arm command; pair it with the newest unanswered decision."""
        if self._pending_stamp_ns is None:
            return
        self.obs_to_command_s.append((arrival_ns - self._pending_stamp_ns) * 1e-9)
        self._pending_stamp_ns = None

    def add(self, topic: str, arrival_ns: int, msg: Any) -> None:
        """Route one message by topic name."""
        if topic_matches(topic, COMMAND_TOPIC):
            self.add_command(arrival_ns)
        elif answer_source(topic) is not None:
            self.add_answer(arrival_ns, header_stamp_ns(msg), answer_source(topic))
        elif topic_matches(topic, STATUS_TOPIC):
            self.set_status(getattr(msg, "data", None))
        elif topic_matches(topic, STATE_TOPIC):
            self.add_state(arrival_ns, header_stamp_ns(msg))

    def measurement(self, source: str) -> LatencyMeasurement | None:
        """Return the latency statistics, or None when no command could be paired."""
        if not self.obs_to_command_s:
            return None
        cmd = np.asarray(self.obs_to_command_s)
        ans = np.asarray(self.obs_to_answer_s)
        st = np.asarray(self.state_transport_s)
        return LatencyMeasurement(
            source=source,
            n=int(cmd.size),
            obs_to_command_p50_s=float(np.percentile(cmd, 50)),
            obs_to_command_p99_s=float(np.percentile(cmd, 99)),
            obs_to_command_max_s=float(cmd.max()),
            obs_to_policy_p50_s=float(np.percentile(ans, 50)) if ans.size else None,
            obs_to_policy_p99_s=float(np.percentile(ans, 99)) if ans.size else None,
            state_transport_p50_s=float(np.percentile(st, 50)) if st.size else None,
        )


def latency_from_messages(
    messages: Iterable[tuple[str, int, Any]], source: str
) -> LatencyMeasurement | None:
    """Measure from (topic, arrival_ns, msg) in arrival order, e.g. a bag's messages."""
    pairer = LatencyPairer()
    for topic, t_ns, msg in messages:
        pairer.add(topic, t_ns, msg)
    return pairer.measurement(source)


def bag_topics(bag_path: str | Path) -> list[str]:
    """Return the topic names a bag holds (through the sysid room's bag reader)."""
    from sim2real_ros.sysid.bags import bag_info

    return list(bag_info(bag_path).topics)


def latency_from_bag(bag_path: str | Path) -> LatencyMeasurement | None:
    """Measure the observation-to-action latency recorded in a bag (None if it lacks topics)."""
    from sim2real_ros.sysid.bags import read_messages

    wanted = [STATE_TOPIC, *ANSWER_TOPICS, COMMAND_TOPIC, STATUS_TOPIC]
    topics = [t for t in bag_topics(bag_path) if any(topic_matches(t, w) for w in wanted)]
    if not any(topic_matches(t, COMMAND_TOPIC) for t in topics):
        return None
    if not any(any(topic_matches(t, a) for a in ANSWER_TOPICS) for t in topics):
        return None
    return latency_from_messages(read_messages(bag_path, topics), f"bag {bag_path}")

"""Talk to the running graph from a command: the safety filter's stage, the live recommendation.

A short-lived rclpy node on its own context: reads and sets the `rollout_stage` parameter of the
safety filter through its standard parameter services (what `ros2 param set` does) and waits
for the comparator's latched recommendation.
"""

from __future__ import annotations

import json
import os
import time
from types import TracebackType
from typing import Any, Callable

import rclpy
from rcl_interfaces.msg import ParameterType
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from std_msgs.msg import String

from sim2real_ros.ros.qos import LATCHED_QOS

STAGE_PARAM = "rollout_stage"
# How long a latched topic may show no publisher before waiting for it is given up, s.
DISCOVERY_S = 5.0


class RemoteError(RuntimeError):
    """The graph did not answer as needed; the message says what was asked of whom."""


class GraphClient:
    """A temporary node for one CLI command; use as a context manager."""

    def __init__(self, name: str = "sim2real_rollout_cli") -> None:
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = Node(f"{name}_{os.getpid()}", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._clients: dict[str, AsyncParameterClient] = {}

    def __enter__(self) -> GraphClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Destroy the node and shut the context down."""
        self.executor.remove_node(self.node)
        self.node.destroy_node()
        if self.context.ok():
            rclpy.shutdown(context=self.context)

    def _params(self, target: str, timeout_s: float) -> AsyncParameterClient:
        # One client per target: a fresh client's first response can be lost while its reader
        # is still being matched, so get and set share the client the first call matched.
        client = self._clients.get(target)
        if client is None:
            client = self._clients[target] = AsyncParameterClient(self.node, target)
        deadline = time.monotonic() + timeout_s
        while not client.services_are_ready():
            if time.monotonic() > deadline:
                raise RemoteError(f"{target}: parameter services not available within "
                                  f"{timeout_s} s (is the safety filter running?)")
            self.executor.spin_once(timeout_sec=0.05)
        return client

    def _call(self, send: Callable[[], Any], what: str, timeout_s: float) -> Any:
        # A service reports ready once it can receive, but the first response may be lost
        # while the reply path is still matching (Fast DDS drops it after a timeout): resend
        # (get and set are idempotent) until the overall timeout.
        deadline = time.monotonic() + timeout_s
        while True:
            future = send()
            remaining = deadline - time.monotonic()
            self.executor.spin_until_future_complete(future, timeout_sec=min(1.0, remaining))
            if future.done():
                if future.exception() is not None:
                    raise RemoteError(f"{what}: {future.exception()}")
                return future.result()
            if time.monotonic() >= deadline:
                raise RemoteError(f"{what}: no answer within {timeout_s} s")

    def get_stage(self, target: str, timeout_s: float = 5.0) -> str:
        """Return the `rollout_stage` parameter of node `target`."""
        client = self._params(target, timeout_s)
        res = self._call(lambda: client.get_parameters([STAGE_PARAM]),
                         f"get {target} {STAGE_PARAM}", timeout_s)
        if not res.values or res.values[0].type != ParameterType.PARAMETER_STRING:
            raise RemoteError(f"{target} has no string parameter {STAGE_PARAM!r}")
        return str(res.values[0].string_value)

    def set_stage(self, target: str, stage: str, timeout_s: float = 5.0) -> None:
        """Set `rollout_stage` on node `target`; raise RemoteError with the node's reason."""
        client = self._params(target, timeout_s)
        res = self._call(lambda: client.set_parameters([Parameter(STAGE_PARAM, value=stage)]),
                         f"set {target} {STAGE_PARAM}", timeout_s)
        result = res.results[0]
        if not result.successful:
            raise RemoteError(f"{target} refused {STAGE_PARAM}={stage!r}: {result.reason}")

    def latest(self, topic: str, timeout_s: float) -> dict[str, Any] | None:
        """Return the latched JSON message on `topic`, or None if none arrives in time."""
        got: list[str] = []
        sub = self.node.create_subscription(String, topic, lambda m: got.append(m.data),
                                            LATCHED_QOS)
        try:
            start = time.monotonic()
            deadline = start + timeout_s
            while not got and time.monotonic() < deadline:
                self.executor.spin_once(timeout_sec=0.05)
                # Nobody publishing after DISCOVERY_S means no message will come: do not sit out
                # the timeout. Discovery on loopback is usually quick, but a lost initial
                # announcement is repeated only with the next periodic one (Fast DDS: 3 s), so
                # waiting less than that refuses a live comparator on a loaded machine.
                if (time.monotonic() - start > DISCOVERY_S
                        and self.node.count_publishers(topic) == 0):
                    break
        finally:
            self.node.destroy_subscription(sub)
        if not got:
            return None
        data = json.loads(got[-1])
        return data if isinstance(data, dict) else None

    def capture(
        self, topics: dict[str, tuple[str, type, Any]], duration_s: float
    ) -> list[tuple[str, int, Any]]:
        """Subscribe to {key: (topic, type, qos)} for `duration_s`; return (key, t_ns, msg)."""
        got: list[tuple[str, int, Any]] = []
        clock = self.node.get_clock()

        def keep(key: str) -> Callable[[Any], None]:
            return lambda msg: got.append((key, clock.now().nanoseconds, msg))

        subs = [self.node.create_subscription(mtype, topic, keep(key), qos)
                for key, (topic, mtype, qos) in topics.items()]
        try:
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                self.executor.spin_once(timeout_sec=0.01)
        finally:
            for sub in subs:
                self.node.destroy_subscription(sub)
        return got


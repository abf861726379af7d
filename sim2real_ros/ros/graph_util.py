"""Talking to other nodes' parameters from a node of ours (scripted faults, tests)."""

from __future__ import annotations

import time
from typing import Any

from rcl_interfaces.srv import GetParameters, SetParameters
from rclpy.node import Node
from rclpy.parameter import Parameter, parameter_value_to_python


def _spin_future(node: Node, executor: Any, future: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not future.done() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.02)
    return future.done()


def set_remote_parameters(node: Node, executor: Any, target: str, values: dict[str, Any],
                          timeout_s: float = 5.0) -> list[str]:
    """Set parameters on node `target` (e.g. '/policy_node'); return the refusal reasons.

    An empty list means every value was accepted. A missing service or a timeout is reported
    as a reason, never raised: scripted faults must not take the caller down.
    """
    client = node.create_client(SetParameters, f"{target.rstrip('/')}/set_parameters")
    try:
        if not client.wait_for_service(timeout_sec=timeout_s):
            return [f"{target}/set_parameters not available within {timeout_s} s"]
        req = SetParameters.Request()
        req.parameters = [Parameter(k, value=v).to_parameter_msg() for k, v in values.items()]
        future = client.call_async(req)
        if not _spin_future(node, executor, future, timeout_s):
            return [f"{target}/set_parameters did not answer within {timeout_s} s"]
        return [f"{k}: {r.reason}" for k, r in zip(values, future.result().results)
                if not r.successful]
    finally:
        node.destroy_client(client)


def get_remote_parameters(node: Node, executor: Any, target: str, names: list[str],
                          timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Return the values of `names` on node `target`, or None when it does not answer."""
    client = node.create_client(GetParameters, f"{target.rstrip('/')}/get_parameters")
    try:
        if not client.wait_for_service(timeout_sec=timeout_s):
            return None
        future = client.call_async(GetParameters.Request(names=names))
        if not _spin_future(node, executor, future, timeout_s):
            return None
        return {n: parameter_value_to_python(v) for n, v in zip(names, future.result().values)}
    finally:
        node.destroy_client(client)

"""Node parameters declared from a schema: type, default, description with units, bounds.

Mirrors generate_parameter_library: one table per node, descriptors carry the ranges, values are
validated at start-up (a bad value refuses to start, naming the parameter and the bound) and on
every later set (the set is refused with the reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.exceptions import InvalidParameterValueException
from rclpy.node import Node
from rclpy.parameter import Parameter

from sim2real_ros.config import ConfigError


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: name, default, description (say the unit), bounds or choices."""

    name: str
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    read_only: bool = False
    param_type: Parameter.Type | None = None

    def check(self, value: Any) -> str | None:
        """Return why `value` is not allowed, or None if it is."""
        if self.choices is not None and value not in self.choices:
            return f"one of {list(self.choices)}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                return "a finite number"
            lo = -math.inf if self.low is None else self.low
            hi = math.inf if self.high is None else self.high
            if not lo <= value <= hi:
                return f"a value in [{lo}, {hi}]"
        return None


def _descriptor(spec: ParamSpec) -> ParameterDescriptor:
    desc = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
    if spec.param_type is not None:
        desc.type = spec.param_type.value
    # Ranges are checked by ParamSpec.check so the error names our bound; the descriptor
    # still advertises them to tools (ros2 param describe).
    if isinstance(spec.default, float) and (spec.low is not None or spec.high is not None):
        lo = -1e300 if spec.low is None else float(spec.low)
        hi = 1e300 if spec.high is None else float(spec.high)
        desc.floating_point_range = [FloatingPointRange(from_value=lo, to_value=hi, step=0.0)]
    elif (
        isinstance(spec.default, int)
        and not isinstance(spec.default, bool)
        and (spec.low is not None and spec.high is not None)
    ):
        desc.integer_range = [IntegerRange(from_value=int(spec.low), to_value=int(spec.high), step=1)]
    return desc


def declare_params(
    node: Node,
    specs: list[ParamSpec],
    on_change: Callable[[dict[str, Any]], str | None] | None = None,
) -> dict[str, Any]:
    """Declare every spec on `node`, validate start-up values, and guard later sets.

    `on_change` may veto a set by returning a reason (cross-parameter checks). Raises
    ConfigError naming `<node>.<param>` when a start-up value is out of bounds.
    """
    by_name = {s.name: s for s in specs}
    values: dict[str, Any] = {}
    for spec in specs:
        try:
            if spec.param_type is not None and spec.default is None:
                p = node.declare_parameter(spec.name, spec.param_type, _descriptor(spec))
            else:
                p = node.declare_parameter(spec.name, spec.default, _descriptor(spec))
        except InvalidParameterValueException as exc:
            raise ConfigError(
                f"ROS parameters of /{node.get_name()}", spec.name, None, str(exc)
            ) from exc
        value = p.value
        why = spec.check(value)
        if why is not None:
            raise ConfigError(f"ROS parameters of /{node.get_name()}", spec.name, value, why)
        values[spec.name] = value

    def guard(params: list[Parameter]) -> SetParametersResult:
        changes = {}
        for p in params:
            spec = by_name.get(p.name)
            if spec is None:
                continue
            why = spec.check(p.value)
            if why is not None:
                return SetParametersResult(
                    successful=False, reason=f"{p.name} = {p.value!r}: expected {why}"
                )
            changes[p.name] = p.value
        if on_change is not None and changes:
            reason = on_change(changes)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    node.add_on_set_parameters_callback(guard)
    return values

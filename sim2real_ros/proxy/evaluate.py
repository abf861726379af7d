"""Evaluate a policy on the same seeded targets in the simulator (in process) and on the proxy
(through the ROS graph, real backend), scored by proxy.scoring.

On the proxy the driver is one more node of the graph: it publishes `task/target`
(geometry_msgs/PointStamped, base frame) one episode at a time and listens to what any cell
tool can listen to: `joint_states`, the arm command `forward_position_controller/commands`,
`safety_filter/events` and `safety_filter/status`. It never talks to the proxy arm itself.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sim2real_ros.policy.task import TaskConfig
from sim2real_ros.proxy.scoring import EpisodeResult, EpisodeScorer
from sim2real_ros.robot.model import ArmModel

TARGET_TOPIC = "task/target"
JOINT_STATES = "/joint_states"
ARM_COMMAND = "/forward_position_controller/commands"
SAFETY_EVENTS = "safety_filter/events"
SAFETY_STATUS = "safety_filter/status"
POLICY_COMMAND = "policy/joint_command"
BASE_FRAME = "base_link"
DIAGNOSTICS = "/diagnostics"
SAFETY_NODE = "/safety_filter"
DRIVER_STATUS_PREFIX = "proxy_arm"  # a real cell's driver reports its own name here


@dataclass
class GraphCounters:
    """What the safety filter did during an evaluation."""

    interventions: int = 0  # safety_filter/events messages
    fallbacks: int = 0  # status changes to a source other than the policy
    event_kinds: dict[str, int] = field(default_factory=dict)
    # "kind/limit" -> count: which limit or check fired (what an operator reads first)
    event_details: dict[str, int] = field(default_factory=dict)
    source_changes: dict[str, int] = field(default_factory=dict)  # changes to each source
    # seconds of the scored episodes each source (policy | baseline | hold) drove the arm
    source_time_s: dict[str, float] = field(default_factory=dict)
    estops: int = 0  # times the status reported a newly latched e-stop
    stage_changes: list[str] = field(default_factory=list)  # e.g. "full->limited" (monitor)
    # the rollback monitor's reasons, as its `monitor` events carry them (with the limits an
    # intervention rate is made of)
    monitor_reasons: list[str] = field(default_factory=list)
    policy_commands: int = 0
    arm_commands: int = 0
    hardware_id: str = ""  # the arm driver's hardware_id on /diagnostics (the unit's serial)
    # The proxy's own health while it ran (a host too busy to keep it in real time shows here)
    driver_min_real_time_factor: float = float("nan")
    driver_overruns: int = 0
    driver_min_rate_hz: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


def evaluate_in_sim(
    policy: Any, targets: np.ndarray, spec: Any, seed: int,
    progress: Callable[[int, EpisodeResult], None] | None = None,
    calibration: Any = None,
) -> list[EpisodeResult]:
    """Run the policy on the targets in the simulator (the sim room's SimCore), chained.

    Same protocol as on the proxy: control at the task's rate, score from the simulated
    measurement (what joint_states would carry), the next episode starts where this one ended
    (at rest, with a new draw of the randomization's reset terms). `calibration` (PlantParams)
    is the nominal plant a calibration's scale terms are relative to.
    """
    from sim2real_ros.policy.runner import PolicyRunner
    from sim2real_ros.sim.core import SimCore

    runner = PolicyRunner(policy)
    task = runner.task
    core = SimCore(spec=spec, seed=seed, calibration=calibration)
    try:
        obs = core.reset(seed=seed, q0=np.array(task.home_rad))
        scorer = EpisodeScorer(runner.arm, task)
        results: list[EpisodeResult] = []
        t = 0.0
        for k, target in enumerate(targets):
            if k > 0:
                # A new draw of the reset-mode terms per episode (as in training), with the arm
                # left where the previous episode ended (at rest: a reset zeroes velocities).
                obs = core.reset(q0=core.plant.state().q)
            scorer.start(k, t, target)
            while not scorer.timed_out(t):
                if getattr(obs, "valid", True):
                    step = runner.step(obs.q, obs.qd, target,
                                       obs.wrench if task.include_wrench else None)
                    core.command("position", step.joint_target_rad)
                    scorer.add_command(step.joint_target_rad)
                obs = core.advance(task.dt_s)
                t += task.dt_s
                if getattr(obs, "valid", True) and scorer.add_state(t, obs.q, obs.qd):
                    break
            results.append(scorer.finish())
            if progress is not None:
                progress(k, results[-1])
        return results
    finally:
        core.close()


def _nanmin(a: float, b: float) -> float:
    """min() that ignores NaN (NaN only when both are)."""
    if math.isnan(a):
        return b
    return a if math.isnan(b) else min(a, b)


def _make_driver_class() -> type:
    """Build the driver node class (rclpy imported only when the proxy evaluation runs)."""
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import PointStamped
    from rclpy.node import Node
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray, String

    from sim2real_ros.ros.convert import MessageError, joint_state_to_arrays, stamp_to_s
    from sim2real_ros.ros.qos import COMMAND_QOS, EVENT_QOS, LATCHED_QOS, STATE_QOS

    class EvaluationDriver(Node):
        """Publish targets, collect joint states, arm commands and safety events."""

        def __init__(self, arm: ArmModel, context: Any = None) -> None:
            super().__init__("transfer_evaluator", context=context)
            self.arm = arm
            self.states: list[tuple[float, np.ndarray, np.ndarray]] = []
            self.commands: list[np.ndarray] = []
            self.counters = GraphCounters()
            self._source: str | None = None
            self._estop = False
            self.stage = ""
            self.scoring = False
            self._source_since = time.monotonic()
            # Transient local: a late-joining policy node still gets the current target.
            self._target_pub = self.create_publisher(PointStamped, TARGET_TOPIC, LATCHED_QOS)
            self.create_subscription(JointState, JOINT_STATES, self._on_state, STATE_QOS)
            self.create_subscription(Float64MultiArray, ARM_COMMAND, self._on_command,
                                     COMMAND_QOS)
            self.create_subscription(JointState, POLICY_COMMAND, self._on_policy, STATE_QOS)
            self.create_subscription(String, SAFETY_EVENTS, self._on_event, EVENT_QOS)
            self.create_subscription(String, SAFETY_STATUS, self._on_status, LATCHED_QOS)
            self.create_subscription(DiagnosticArray, DIAGNOSTICS, self._on_diagnostics,
                                     STATE_QOS)
            self._convert = (joint_state_to_arrays, stamp_to_s, MessageError)

        def publish_target(self, target_m: np.ndarray) -> None:
            """Publish the episode's tool target (base frame)."""
            msg = PointStamped()
            msg.header.stamp = self.get_clock().now().to_msg()
            msg.header.frame_id = BASE_FRAME
            msg.point.x, msg.point.y, msg.point.z = (float(v) for v in target_m)
            self._target_pub.publish(msg)

        def _on_state(self, msg: Any) -> None:
            to_arrays, _, error = self._convert
            try:
                js = to_arrays(msg, self.arm.joint_names)
            except error:
                return
            qd = js.velocity if js.velocity is not None else np.zeros(self.arm.n_joints)
            self.states.append((time.monotonic(), js.position, qd))

        def _on_command(self, msg: Any) -> None:
            self.counters.arm_commands += 1
            if len(msg.data) == self.arm.n_joints:
                self.commands.append(np.asarray(msg.data, dtype=float))

        def _on_policy(self, msg: Any) -> None:
            self.counters.policy_commands += 1

        def _on_event(self, msg: Any) -> None:
            self.counters.interventions += 1
            try:
                event = json.loads(msg.data)
                kind = str(event.get("kind", "unknown"))
                # kind/limit: which check fired (the detail carries the measured values)
                detail = f"{kind}/{event.get('limit', '')}"
                reason = str(event.get("detail", "")) if kind == "monitor" else ""
            except (ValueError, AttributeError):
                kind = detail = "unparsable"
                reason = ""
            c = self.counters
            if reason:
                c.monitor_reasons.append(reason)
            c.event_kinds[kind] = c.event_kinds.get(kind, 0) + 1
            c.event_details[detail] = c.event_details.get(detail, 0) + 1

        def account_source_time(self) -> None:
            """Add the time since the last change to the source that was driving."""
            now = time.monotonic()
            if self._source is not None and self.scoring:
                t = self.counters.source_time_s
                t[self._source] = t.get(self._source, 0.0) + now - self._source_since
            self._source_since = now

        def _on_diagnostics(self, msg: Any) -> None:
            c = self.counters
            for st in msg.status:
                if not st.name.startswith(DRIVER_STATUS_PREFIX):
                    continue
                if st.hardware_id:
                    c.hardware_id = st.hardware_id
                values = {kv.key: kv.value for kv in st.values}
                try:
                    rtf = float(values.get("real_time_factor", "nan"))
                    rate = float(values.get("joint_states_rate_hz", "nan"))
                    c.driver_overruns = max(c.driver_overruns, int(values.get("overruns", 0)))
                except ValueError:
                    continue
                c.driver_min_real_time_factor = _nanmin(c.driver_min_real_time_factor, rtf)
                c.driver_min_rate_hz = _nanmin(c.driver_min_rate_hz, rate)

        def _on_status(self, msg: Any) -> None:
            try:
                status = json.loads(msg.data)
                source = str(status.get("source", ""))
            except (ValueError, AttributeError):
                return
            c = self.counters
            if source and source != self._source:
                self.account_source_time()
                c.source_changes[source] = c.source_changes.get(source, 0) + 1
                if self._source is not None and source != "policy":
                    c.fallbacks += 1
                self._source = source
            estop = bool(status.get("estop", False))
            if estop and not self._estop:
                c.estops += 1
            self._estop = estop
            stage = str(status.get("rollout_stage", ""))
            if stage and self.stage and stage != self.stage:
                c.stage_changes.append(f"{self.stage}->{stage}")
            self.stage = stage or self.stage

    return EvaluationDriver


@dataclass
class ProxyEvaluation:
    """What one evaluation on the proxy produced."""

    results: list[EpisodeResult]
    counters: GraphCounters
    wall_s: float
    warmup_s: float


def evaluate_on_graph(
    arm: ArmModel, task: TaskConfig, targets: np.ndarray, alive: Callable[[], None],
    promote_to: str | None = None,
    warmup_timeout_s: float = 90.0,
    progress: Callable[[int, EpisodeResult], None] | None = None,
) -> ProxyEvaluation:
    """Drive the running graph through the targets and score each episode.

    `alive()` is called every spin and must raise when a process of the cell died. The first
    target (the home pose's tool position) is held until the policy streams and commands reach
    the arm (node start-up); then, with `promote_to`, the safety filter's `rollout_stage` is
    set to it (the graph was started in a stage where the baseline drives, so the wrapper's
    monitor never judges a policy that has not started yet); the arm gets one episode to settle
    before the scored episodes begin.
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    ctx = Context()
    rclpy.init(context=ctx)
    driver_cls = _make_driver_class()
    driver = driver_cls(arm, context=ctx)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(driver)
    t_start = time.monotonic()

    def spin_for(seconds: float, stop: Callable[[], bool] | None = None) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ex.spin_once(timeout_sec=0.005)
            alive()
            if stop is not None and stop():
                return

    try:
        # Warm-up: the arm goes to the tool position of the home pose under the policy.
        home_tool = arm.tool_position(np.array(task.home_rad))
        driver.publish_target(home_tool)
        deadline = time.monotonic() + warmup_timeout_s
        while driver.counters.arm_commands < 10 or driver.counters.policy_commands < 10:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no policy commands reached the arm within {warmup_timeout_s:.0f} s "
                    f"(policy/joint_command: {driver.counters.policy_commands}, arm commands: "
                    f"{driver.counters.arm_commands}, joint_states: {len(driver.states)})")
            driver.publish_target(home_tool)
            spin_for(0.1)
        if promote_to is not None:
            from sim2real_ros.ros.graph_util import set_remote_parameters

            refused = set_remote_parameters(driver, ex, SAFETY_NODE,
                                            {"rollout_stage": promote_to})
            if refused:
                raise RuntimeError(f"{SAFETY_NODE} refused rollout_stage={promote_to}: "
                                   f"{refused}")
        spin_for(task.episode_s)
        warmup_s = time.monotonic() - t_start
        driver.counters = GraphCounters(hardware_id=driver.counters.hardware_id)
        driver.account_source_time()
        driver.scoring = True
        scorer = EpisodeScorer(arm, task)
        results: list[EpisodeResult] = []
        for k, target in enumerate(targets):
            driver.states.clear()
            driver.commands.clear()
            driver.publish_target(target)
            t0 = time.monotonic()
            scorer.start(k, t0, target)
            seen = 0
            last_pub = t0

            def episode_over() -> bool:
                nonlocal seen, last_pub
                now = time.monotonic()
                if now - last_pub > 0.2:  # re-publish: a restarted policy node needs it too
                    driver.publish_target(target)
                    last_pub = now
                while seen < len(driver.states):
                    t_s, q, qd = driver.states[seen]
                    seen += 1
                    if driver.commands:
                        scorer.add_command(driver.commands[-1])
                    if scorer.add_state(t_s, q, qd):
                        return True
                return scorer.timed_out(now)

            spin_for(task.episode_s + 0.5, episode_over)
            results.append(scorer.finish())
            if progress is not None:
                progress(k, results[-1])
        driver.account_source_time()
        return ProxyEvaluation(results, driver.counters, time.monotonic() - t_start, warmup_s)
    finally:
        ex.remove_node(driver)
        driver.destroy_node()
        rclpy.shutdown(context=ctx)


def set_stage_when_streaming(stage: str, alive: Callable[[], None],
                             done: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Once policy/joint_command streams, set the safety filter's rollout_stage to `stage`.

    For the sysid runs: the recorder's excitation arrives on policy/joint_command; the filter
    starts in a stage where the baseline holds the arm and is switched when the stream is
    there. Returns False when `done()` became true before any command was seen.
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from sensor_msgs.msg import JointState

    from sim2real_ros.ros.graph_util import set_remote_parameters
    from sim2real_ros.ros.qos import STATE_QOS

    ctx = Context()
    rclpy.init(context=ctx)
    node = Node("transfer_stage_setter", context=ctx)
    seen: list[int] = []
    node.create_subscription(JointState, POLICY_COMMAND, lambda m: seen.append(1), STATE_QOS)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    try:
        end = time.monotonic() + timeout_s
        while len(seen) < 3:
            if done():
                return False
            if time.monotonic() > end:
                raise TimeoutError(f"no {POLICY_COMMAND} within {timeout_s:.0f} s")
            ex.spin_once(timeout_sec=0.01)
            alive()
        refused = set_remote_parameters(node, ex, SAFETY_NODE, {"rollout_stage": stage})
        if refused:
            raise RuntimeError(f"{SAFETY_NODE} refused rollout_stage={stage}: {refused}")
        return True
    finally:
        ex.remove_node(node)
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def wait_for_trigger_service(service: str, alive: Callable[[], None],
                             timeout_s: float = 90.0) -> None:
    """Wait until a std_srvs/Trigger service exists (a node is up); TimeoutError otherwise."""
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node
    from std_srvs.srv import Trigger

    ctx = Context()
    rclpy.init(context=ctx)
    node = Node("transfer_service_probe", context=ctx)
    client = node.create_client(Trigger, service)
    try:
        end = time.monotonic() + timeout_s
        while not client.wait_for_service(timeout_sec=0.2):
            alive()
            if time.monotonic() > end:
                raise TimeoutError(f"{service} did not appear within {timeout_s:.0f} s")
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def call_trigger(service: str, timeout_s: float = 10.0) -> str | None:
    """Call a std_srvs/Trigger service; return None on success, else why it failed."""
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from std_srvs.srv import Trigger

    ctx = Context()
    rclpy.init(context=ctx)
    node = Node("transfer_trigger", context=ctx)
    client = node.create_client(Trigger, service)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    try:
        if not client.wait_for_service(timeout_sec=timeout_s):
            return f"{service} not available within {timeout_s:.0f} s"
        future = client.call_async(Trigger.Request())
        end = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < end:
            ex.spin_once(timeout_sec=0.05)
        if not future.done():
            return f"{service} did not answer within {timeout_s:.0f} s"
        res = future.result()
        return None if res.success else f"{service}: {res.message}"
    finally:
        ex.remove_node(node)
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def observe_unit_id(alive: Callable[[], None], timeout_s: float = 30.0) -> str:
    """Return the arm driver's hardware_id from /diagnostics (how a cell names its unit)."""
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    from sim2real_ros.ros.qos import STATE_QOS

    ctx = Context()
    rclpy.init(context=ctx)
    node = Node("transfer_unit_probe", context=ctx)
    found: list[str] = []

    def on_diag(msg: Any) -> None:
        for st in msg.status:
            if st.name.startswith(DRIVER_STATUS_PREFIX) and st.hardware_id:
                found.append(st.hardware_id)

    node.create_subscription(DiagnosticArray, DIAGNOSTICS, on_diag, STATE_QOS)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    try:
        end = time.monotonic() + timeout_s
        while not found and time.monotonic() < end:
            ex.spin_once(timeout_sec=0.05)
            alive()
        if not found:
            raise TimeoutError(f"no arm driver reported a hardware_id on {DIAGNOSTICS} within "
                               f"{timeout_s:.0f} s")
        return found[-1]
    finally:
        ex.remove_node(node)
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def event_kinds_total(evals: list[GraphCounters]) -> dict[str, int]:
    """Sum event kinds over several evaluations."""
    total: Counter[str] = Counter()
    for c in evals:
        total.update(c.event_kinds)
    return dict(total)


def nan_to_none(x: float) -> float | None:
    """JSON has no NaN: write None instead."""
    return None if isinstance(x, float) and math.isnan(x) else x

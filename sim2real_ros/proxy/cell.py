"""The proxy cell: the proxy_arm process plus the graph of `sim2real run --backend real`.

The experiment powers the proxy arm up once per stage (like a cell whose arm stays on between
jobs) and starts the real-backend graph for each job with the policy version and rollout stage
of that job, exactly as `sim2real run --backend real --policy-version N --rollout-stage S`
builds it (graph.build_graph + runner.GraphRunner). Only the task sequencer is left out: the
evaluation driver publishes the targets itself so that every evaluation sees the same seeded
targets.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from sim2real_ros.paths import share_path
from sim2real_ros.ros.env import DISCOVERY_VAR, DOMAIN_VAR, child_env

PROXY_MODULE = "sim2real_ros.proxy.node"
REGISTRY_ENV = "SIM2REAL_POLICY_REGISTRY"


class CellError(RuntimeError):
    """A process of the proxy cell failed; the message names it and points at its log."""


def ensure_dds_env() -> None:
    """Keep the experiment's DDS traffic on loopback, on a domain of its own.

    The experiment's nodes all run on this machine; a domain drawn per run keeps two runs
    (or a run and a test) from talking to each other.
    """
    os.environ[DISCOVERY_VAR] = "LOCALHOST"
    if not os.environ.get(DOMAIN_VAR, "").isdigit():
        # Above the 1-100 that `make test` and the test fixtures draw from: a run's services
        # (e.g. /sysid_recorder/stop) must never be answered by, or reach, a test's nodes.
        os.environ[DOMAIN_VAR] = str(random.SystemRandom().randint(101, 232))


class ProxyArmProcess:
    """The proxy_arm node as its own process (python -m sim2real_ros.proxy.node)."""

    def __init__(self, unit_file: Path, log_path: Path,
                 initial_positions_rad: np.ndarray | None = None,
                 publish_rate_hz: float | None = None) -> None:
        self.unit_file = Path(unit_file)
        self.log_path = Path(log_path)
        self.initial = initial_positions_rad
        self.rate_hz = publish_rate_hz
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: TextIO | None = None

    def command(self) -> list[str]:
        """Return the command line that starts the proxy arm."""
        args = [sys.executable, "-m", PROXY_MODULE, "--ros-args",
                "--params-file", str(share_path("config", "nodes", "proxy_arm.yaml")),
                "-p", f"unit_file:={self.unit_file}"]
        if self.initial is not None:
            vals = ",".join(f"{v:.6f}" for v in np.asarray(self.initial, dtype=float))
            args += ["-p", f"initial_positions_rad:=[{vals}]"]
        if self.rate_hz is not None:
            args += ["-p", f"publish_rate_hz:={float(self.rate_hz)}"]
        return args

    def start(self) -> None:
        """Power the proxy arm up."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(self.command(), env=child_env(), stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def check(self) -> None:
        """Raise CellError when the proxy arm process has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise CellError(f"proxy_arm exited with code {self.popen.returncode}; "
                            f"see {self.log_path}")

    def stop(self) -> None:
        """Power it down: SIGINT, then SIGKILL after 5 s."""
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGINT)
            try:
                self.popen.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


@contextmanager
def proxy_arm(unit_file: Path, log_path: Path, initial_positions_rad: np.ndarray | None = None,
              publish_rate_hz: float | None = None) -> Iterator[ProxyArmProcess]:
    """Run the proxy arm for the duration of a with-block."""
    arm = ProxyArmProcess(unit_file, log_path, initial_positions_rad, publish_rate_hz)
    arm.start()
    try:
        yield arm
    finally:
        arm.stop()


@contextmanager
def run_graph(graph: object, log_dir: Path, registry_root: Path | None = None
              ) -> Iterator[object]:
    """Run a graph with the runner of `sim2real run` for a with-block; yield the runner."""
    from sim2real_ros.runner import GraphRunner, RunnerConfig

    missing = graph.missing()  # type: ignore[attr-defined]
    if missing:
        raise CellError(f"the graph lacks nodes not installed yet: {missing}")
    log_dir.mkdir(parents=True, exist_ok=True)
    # One intra-op thread per torch process: batch-1 inference of a small MLP gains nothing
    # from a pool, and a pool per node fights the other nodes for the cores (measured here:
    # the policy node fell to ~10 Hz with the default pool).
    env = {"OMP_NUM_THREADS": "1"}
    if registry_root is not None:
        env[REGISTRY_ENV] = str(registry_root)
    out = open(log_dir / "graph.log", "a")  # noqa: SIM115 - closed below
    runner = GraphRunner(graph, out=out, log_dir=log_dir,  # type: ignore[arg-type]
                         config=RunnerConfig(grace_s=5.0, extra_env=env))
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()
        out.close()


# The stage the graph starts in: the baseline drives until the policy streams; the evaluation
# then sets the stage it measures (see evaluate.evaluate_on_graph). Started directly in `full`,
# the safety filter's rollback monitor sees the seconds before the policy node is up as a
# 100 % fallback rate and demotes the stage for good (observed: full -> limited -> advisory
# within 7 s of start-up on the 2-core machine).
START_STAGE = "shadow"


def safety_timing(timeout_s: float) -> dict[str, float]:
    """Safety-filter overrides for a loaded host: stream timeouts and stamp tolerance.

    The shipped values (25 ms stream timeouts, 5 ms future-stamp tolerance) fit a cell's
    real-time host; on 2 shared cores the filter's own joint_states queue lags the policy's by
    more than 5 ms, so answers to the newest state were rejected as "from the future" and
    latched the e-stop, and the sysid recorder's excitation (stamped with the state it last
    processed) was rejected as stale (both observed). 0 = the shipped values.
    """
    if timeout_s <= 0:
        return {}
    # A node that answers late (its joint_states queue backlogged) answers an old stamp:
    # the stamp-age limits grow with the timeouts. A command up to 2.5 periods after the last
    # one is late, not gone: the arm holds its setpoint meanwhile and the command is projected
    # as the next sample. With the shipped 1.5 periods the filter braked along the last
    # command 5-200 times per 30-target evaluation here (policy intervals > 15 ms: 26-192 per
    # evaluation, > 25 ms: 2-11), and each brake was a disturbance the projection then had to
    # recover from, in the evaluation that also fed the rollback monitor.
    return {"command_timeout_s": timeout_s, "baseline_timeout_s": timeout_s,
            "state_timeout_s": timeout_s, "confidence_timeout_s": timeout_s,
            "future_tolerance_s": timeout_s / 2, "max_command_age_s": 3 * timeout_s,
            "max_baseline_age_s": 3 * timeout_s, "late_command_grace_periods": 2.5}


def baseline_timing(timeout_s: float) -> dict[str, float]:
    """Baseline-controller override for a loaded host: its joint_states timeout.

    The shipped 50 ms stops the baseline whenever its joint_states queue lags that long, which
    on 2 shared cores happened for 60-70 ms at a time ("joint_states 0.068 s old" in the
    baseline log, observed in transfer runs), and each stop showed up at the filter as a
    silent baseline. Scaled like the filter's stream timeouts; 0 = the shipped value.
    """
    return {} if timeout_s <= 0 else {"state_timeout_s": max(0.05, 2 * timeout_s)}


def real_backend_graph(
    registry_root: Path, policy_version: int, rollout_stage: str, log_dir: Path,
    leave_out: tuple[str, ...] = ("task_sequencer",), safety_timeout_s: float = 0.0,
) -> Any:
    """The graph of `sim2real run --backend real --policy-version V --rollout-stage S`."""
    from sim2real_ros.graph import GraphArgs, build_graph

    from sim2real_ros.graph import ROLLOUT_STAGES

    if rollout_stage not in ROLLOUT_STAGES:
        raise ValueError(f"rollout_stage {rollout_stage!r}: expected one of {ROLLOUT_STAGES}")
    graph = build_graph(GraphArgs(backend="real", rollout_stage=START_STAGE,
                                  policy_version=str(policy_version)))
    graph = graph.without([n for n in leave_out if n in graph.names()])
    extra = safety_timing(safety_timeout_s)
    if extra:
        graph = graph.with_parameters("safety_filter", **extra)
        graph = graph.with_parameters("baseline_controller",
                                      **baseline_timing(safety_timeout_s))
    return run_graph(graph, log_dir, registry_root)


def sysid_support_graph(unit_id: str, log_dir: Path, safety_timeout_s: float = 0.0) -> Any:
    """The sysid graph of launch/sysid.launch.py (backend real) without its recorder.

    `sim2real sysid excite` then runs the recorder against it, as on a cell where the graph
    was started by `ros2 launch sim2real_ros sysid.launch.py backend:=real`. The safety filter
    starts in START_STAGE and is set to the graph's stage (`full`) once the recorder streams
    (evaluate.set_stage_when_streaming), for the same start-up reason as above.
    """
    from sim2real_ros.graph import GraphArgs, NodeSpec, build_graph
    from sim2real_ros.sysid.graph import RECORDER, sysid_nodes

    base = build_graph(GraphArgs(backend="real", rollout_stage="full"))
    specs = []
    for d in sysid_nodes(unit_id, backend="real"):
        if d["name"] == RECORDER:
            continue
        files = tuple(str(x) for x in d["parameters"] if not isinstance(x, dict))
        overrides: dict[str, Any] = {}
        for x in d["parameters"]:
            if isinstance(x, dict):
                overrides.update(x)
        if d["name"] == "safety_filter":
            overrides["rollout_stage"] = START_STAGE
            overrides.update(safety_timing(safety_timeout_s))
        if d["name"] == "baseline_controller":
            overrides.update(baseline_timing(safety_timeout_s))
        specs.append(NodeSpec(
            name=d["name"], executable=d["executable"], module=d["module"],
            parameter_files=files, parameters=tuple(overrides.items()),
            remappings=tuple((str(a), str(b)) for a, b in d["remappings"]), role="control"))
    return run_graph(replace(base, nodes=tuple(specs)), log_dir)


def check_graph(runner: object) -> None:
    """Raise CellError when a graph node died for good (restartable ones are restarted)."""
    failed = runner.poll()  # type: ignore[attr-defined]
    if failed is not None:
        raise CellError(f"graph node {failed} died; see its log in "
                        f"{runner.log_dir}")  # type: ignore[attr-defined]

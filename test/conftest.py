"""Test fixtures: loopback-only DDS on a run-unique domain, rclpy contexts, node processes."""

from __future__ import annotations

import os
import random

# Set before anything imports rclpy. `make test` already exports both; running pytest directly
# gets the same guarantees here. test_environment.py fails if either is missing or wrong.
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
if not os.environ.get("ROS_DOMAIN_ID", "").isdigit():
    os.environ["ROS_DOMAIN_ID"] = str(random.SystemRandom().randint(1, 100))

# Tests never write into the user's home: the policy registry and the rollout log of this run
# live in a throw-away directory (tests that need their own pass explicit paths).
import tempfile  # noqa: E402

_RUN_DIR = tempfile.mkdtemp(prefix="sim2real-test-")
os.environ["SIM2REAL_POLICY_REGISTRY"] = os.path.join(_RUN_DIR, "policies")
os.environ["SIM2REAL_ROLLOUT_LOG"] = os.path.join(_RUN_DIR, "rollout_log.jsonl")

import itertools  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sim2real_ros.ros.env import child_env  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


_TEST_COUNTER = itertools.count()
_BASE_DOMAIN = int(os.environ["ROS_DOMAIN_ID"])


@pytest.fixture(autouse=True)
def _own_domain_per_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Give every test its own DDS domain (1..100, stepping from this run's domain).

    A node a previous test left behind (a process that outlived its test, a late publisher)
    then cannot reach into this test's graph: each test sees only what it started. Processes
    started through `child_env` and contexts made by `ros_context` inherit the domain.
    """
    domain = 1 + (_BASE_DOMAIN - 1 + next(_TEST_COUNTER)) % 100
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    yield domain


@pytest.fixture
def ros_context() -> Iterator[object]:
    """A fresh rclpy context for one test, shut down afterwards."""
    import rclpy
    from rclpy.context import Context

    ctx = Context()
    rclpy.init(context=ctx)
    try:
        yield ctx
    finally:
        if ctx.ok():
            rclpy.shutdown(context=ctx)


def spin_until(
    executor: object, predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.01
) -> bool:
    """Spin `executor` until `predicate()` is true or the timeout passes; return the predicate."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        executor.spin_once(timeout_sec=step_s)  # type: ignore[attr-defined]
    return predicate()


class NodeProcesses:
    """Starts node modules as real processes (`python -m module --ros-args ...`); kills them."""

    def __init__(self, log_dir: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_dir = log_dir

    def start(self, module: str, ros_args: list[str] | None = None, name: str | None = None,
              extra_env: dict[str, str] | None = None, args: list[str] | None = None
              ) -> subprocess.Popen[bytes]:
        """Start `python -m module [args] --ros-args ros_args`; output goes to a log file."""
        label = name or module.rsplit(".", 2)[-2]
        log = open(self.log_dir / f"{label}-{len(self.procs)}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", module, *(args or [])]
        if ros_args:
            cmd += ["--ros-args", *ros_args]
        proc = subprocess.Popen(cmd, env=child_env(extra_env), stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        """Return what the process printed so far."""
        return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]

    def stop_all(self) -> None:
        """SIGINT each process, then SIGKILL whatever is left after 5 s."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 5.0
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def node_processes(tmp_path: Path) -> Iterator[NodeProcesses]:
    """Start node processes for a cross-process test; all are stopped at teardown."""
    np_ = NodeProcesses(tmp_path)
    try:
        yield np_
    finally:
        np_.stop_all()

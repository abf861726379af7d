"""The runner across real processes: a death tears down, restartable nodes respawn, Ctrl-C."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sim2real_ros.graph import GraphArgs, NodeSpec, build_graph
from sim2real_ros.ros.env import child_env
from sim2real_ros.runner import EXIT_NODE_DIED, GraphRunner, RunnerConfig

REPO = Path(__file__).resolve().parent.parent
# Real rclpy nodes of ours that need nothing else running: the trajectory adapter, started
# under other names. Using them keeps these tests independent of the other rooms' nodes.
ADAPTER = "sim2real_ros.adapters.trajectory_node"


def _graph(restartable: tuple[bool, ...]):  # type: ignore[no-untyped-def]
    base = build_graph(GraphArgs(backend="sim"))
    nodes = tuple(
        NodeSpec(name=f"adapter_{i}", executable="trajectory_adapter", module=ADAPTER,
                 parameters=(("diagnostics_period_s", 0.5),), restartable=r, role="adapter")
        for i, r in enumerate(restartable)
    )
    return base.__class__(args=base.args, backend=base.backend, nodes=nodes)


def _wait(pred, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.graph
def test_a_dying_node_tears_the_graph_down_and_the_run_exits_non_zero(tmp_path: Path) -> None:
    out = io.StringIO()
    runner = GraphRunner(_graph((False, False)), out=out, log_dir=tmp_path,
                         config=RunnerConfig(grace_s=5.0))
    runner.start()
    try:
        survivor = runner.pid("adapter_1")
        # Each node's own output reaches the console prefixed with its name, and its log file.
        assert _wait(lambda: "[adapter_1] " in out.getvalue()
                     and "streaming 6 joints" in out.getvalue(), 10.0), out.getvalue()
        assert _wait(lambda: "streaming 6 joints" in (tmp_path / "adapter_0.log").read_text(),
                     5.0)
        os.kill(runner.pid("adapter_0"), signal.SIGKILL)
        assert _wait(lambda: runner.poll() == "adapter_0", 5.0)
    finally:
        clean = runner.stop()
    assert clean
    assert not _alive(survivor), "the other node must be torn down with the graph"
    text = out.getvalue()
    assert "node adapter_0 died (signal SIGKILL); tearing the graph down" in text
    kinds = [(e.node, e.kind) for e in runner.events]
    assert ("adapter_0", "exited") in kinds and ("adapter_1", "stopped") in kinds


@pytest.mark.graph
def test_a_restartable_node_is_restarted_up_to_its_limit_then_the_graph_stops() -> None:
    out = io.StringIO()
    runner = GraphRunner(_graph((True, False)), out=out,
                         config=RunnerConfig(max_restarts=1, restart_delay_s=0.2))
    runner.start()
    try:
        first = runner.pid("adapter_0")
        os.kill(first, signal.SIGKILL)
        assert _wait(lambda: runner.poll() is None and runner.restarts("adapter_0") == 1
                     and runner.is_running("adapter_0"), 5.0), out.getvalue()
        second = runner.pid("adapter_0")
        assert second != first
        assert runner.is_running("adapter_1")
        # Past the limit the death is fatal like any other.
        os.kill(second, signal.SIGKILL)
        assert _wait(lambda: runner.poll() == "adapter_0", 5.0), out.getvalue()
    finally:
        runner.stop()
    text = out.getvalue()
    assert "node adapter_0 died (signal SIGKILL); restarting (1/1)" in text
    assert "after 1 restarts, the limit; tearing the graph down" in text


RUN_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {test_dir!r})
    from test_graph_runner import _graph
    from sim2real_ros.runner import GraphRunner, RunnerConfig
    sys.exit(GraphRunner(_graph((False, True)), config=RunnerConfig(grace_s=5.0)).run())
""")


@pytest.mark.graph
def test_ctrl_c_stops_every_node_cleanly_and_exits_zero(tmp_path: Path) -> None:
    script = tmp_path / "run_graph.py"
    script.write_text(RUN_SCRIPT.format(test_dir=str(REPO / "test")))
    proc = subprocess.Popen([sys.executable, str(script)], env=child_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        # Wait until both nodes report (their first diagnostics-free line is the runner's).
        assert proc.stdout is not None
        pids = []
        for line in proc.stdout:
            lines.append(line)
            if "(pid " in line and "started adapter_" in line:
                pids.append(int(line.rsplit("pid ", 1)[1].rstrip(")\n")))
            if len(pids) == 2:
                break
        time.sleep(2.0)  # let both nodes finish starting up and spin
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert "stopping (SIGINT)" in text
    assert "all nodes stopped; exit 0" in text, text
    assert not any(_alive(p) for p in pids)


@pytest.mark.graph
def test_a_node_refusing_its_configuration_is_fatal_even_when_restartable() -> None:
    base = _graph((True,))
    bad = base.with_parameters("adapter_0", time_from_start_s=5.0)  # above its 1.0 s bound
    out = io.StringIO()
    runner = GraphRunner(bad, out=out, config=RunnerConfig(restart_delay_s=0.1))
    runner.start()
    try:
        assert _wait(lambda: runner.poll() == "adapter_0", 15.0), out.getvalue()
    finally:
        runner.stop()
    text = out.getvalue()
    assert "[adapter_0] [sim2real_ros] refusing to start" in text  # its own message, prefixed
    assert "time_from_start_s out of range" in text
    assert "refused its configuration (exit code 2)" in text
    assert runner.restarts("adapter_0") == 0


@pytest.mark.graph
def test_each_node_runs_at_its_niceness_so_the_arm_path_outranks_the_policy() -> None:
    base = _graph((False, False))
    nodes = (base.nodes[0], replace(base.nodes[1], nice=7))
    out = io.StringIO()
    runner = GraphRunner(replace(base, nodes=nodes), out=out, config=RunnerConfig(grace_s=5.0))
    runner.start()
    try:
        # Both up before the stop: a SIGINT inside rclpy's start-up (slow for the niced node
        # on a loaded host) can go unanswered, which is the start-up's problem, not this test's.
        assert _wait(lambda: out.getvalue().count("streaming 6 joints") >= 2, 20.0), \
            out.getvalue()
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, runner.pid("adapter_0")) == own
        assert os.getpriority(os.PRIO_PROCESS, runner.pid("adapter_1")) == min(own + 7, 19)
    finally:
        assert runner.stop()


def test_the_shipped_graph_never_lowers_the_arm_facing_nodes() -> None:
    for backend in ("sim", "real"):
        graph = build_graph(GraphArgs(backend=backend))
        nice = {n.name: n.nice for n in graph.nodes}
        for name in ("sim_bridge", "safety_filter", "baseline_controller",
                     "trajectory_adapter"):
            assert nice.get(name, 0) == 0, (backend, name)
        assert nice["policy_node"] > 0 and nice["shadow_comparator"] > nice["policy_node"]
    with pytest.raises(ValueError, match="nice = 20, expected 0..19"):
        NodeSpec(name="x", executable="x", module="x", nice=20)

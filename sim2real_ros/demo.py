"""`sim2real demo` / `make demo`: the sim graph for ~60 s on the wall clock, with scripted faults.

Hardware-in-the-loop style: every node runs as its own process (the same graph as
`sim2real run --backend sim`), the sim bridge steps in real time, and the demo measures the
graph from outside with a probe, as one would on a cell. The shipped policy runs in shadow mode
against the baseline with the safety filter active, the task sequencer cycles targets and the
shadow comparator scores the policy. Mid-run the demo injects an uncertainty spike into the
policy, then kills the policy process with SIGKILL (the policy is restartable: the runner
respawns it while the safety filter keeps the baseline in charge). At the end it prints a
summary and writes summary.json, plots and every node's log to runs/demo-<timestamp>/.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sim2real_ros.graph import Graph, GraphArgs, build_graph

# The uncertainty spike: the policy's joint_states glitch (fault_injector in front of it).
SPIKE_NODE = "/fault_injector"


@dataclass
class DemoOptions:
    """What the demo runs and where it writes."""

    duration_s: float = 60.0
    rollout_stage: str = "shadow"
    runs_dir: Path = Path("runs")
    faults: bool = True
    plots: bool = True
    startup_timeout_s: float = 60.0
    # Fractions of the run at which the scripted faults happen.
    spike_at: float = 0.35
    spike_duration_s: float = 4.0
    kill_at: float = 0.6
    # Size of the glitch that makes the spike (see adapters/faults.py).
    spike_position_offset_rad: float = 0.2
    spike_velocity_noise_rad_s: float = 0.5
    reach_tolerance_m: float = 0.03


@dataclass
class FaultRecord:
    """One scripted fault and what the graph did about it."""

    kind: str
    t_s: float
    detail: dict[str, Any] = field(default_factory=dict)


def ensure_dds_env() -> None:
    """Keep DDS on loopback and on a domain of its own when the caller did not (make demo does)."""
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] != "LOCALHOST":
        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    if not os.environ.get("ROS_DOMAIN_ID", "").isdigit():
        os.environ["ROS_DOMAIN_ID"] = str(1 + int.from_bytes(os.urandom(2), "little") % 100)


def demo_graph(options: DemoOptions) -> tuple[Graph, list[str]]:
    """Return the demo's graph (the nodes that are installed) and the names left out."""
    graph = build_graph(GraphArgs(backend="sim", rollout_stage=options.rollout_stage))
    missing = graph.missing()
    graph = graph.without(missing)
    if "policy_node" in graph.names():
        # The scripted kill is planned: the runner must respawn the policy, not end the demo.
        graph = graph.with_node("policy_node", restartable=True)
        if options.faults:
            graph = graph.with_fault_injector("policy_node")
    return graph, missing


def new_run_dir(runs_dir: Path) -> Path:
    """Create runs/demo-<timestamp>/ (with a suffix if it exists)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = runs_dir / f"demo-{stamp}"
    k = 1
    while path.exists():
        path = runs_dir / f"demo-{stamp}-{k}"
        k += 1
    path.mkdir(parents=True)
    return path


class FaultScript:
    """The scripted faults, stepped from the demo loop with seconds since the loop closed."""

    def __init__(self, options: DemoOptions, graph: Graph, runner: Any, probe: Any,
                 executor: Any) -> None:
        self.options = options
        self.executor = executor
        self.graph = graph
        self.runner = runner
        self.probe = probe
        self.records: list[FaultRecord] = []
        self.spike_start_s = options.spike_at * options.duration_s
        self.spike_end_s = self.spike_start_s + options.spike_duration_s
        self.kill_s = options.kill_at * options.duration_s
        self._done: set[str] = set()
        self._spike: FaultRecord | None = None
        self._kill: FaultRecord | None = None
        self._restarts_before_kill = 0

    def step(self, t: float) -> None:
        """Fire whatever is due at `t` (s since the loop closed)."""
        has_policy = "policy_node" in self.graph.names()
        has_injector = "fault_injector" in self.graph.names()
        if has_injector and t >= self.spike_start_s and "spike" not in self._done:
            self._done.add("spike")
            self._spike = FaultRecord("uncertainty_spike", t, self._spike_on())
            self.records.append(self._spike)
            print(f"  t={t:5.1f} s  FAULT: uncertainty spike in the policy "
                  f"({self._spike.detail.get('mechanism')})")
        if self._spike is not None and t >= self.spike_end_s and "spike_end" not in self._done:
            self._done.add("spike_end")
            self._spike.detail["ended_at_s"] = t
            self._spike.detail.update(self._spike_off())
        if has_policy and t >= self.kill_s and "kill" not in self._done:
            self._done.add("kill")
            pid = self.runner.pid("policy_node")
            self.runner.kill("policy_node", signal.SIGKILL)
            self._kill = FaultRecord("policy_killed", t, {"signal": "SIGKILL", "pid": pid})
            self._restarts_before_kill = self.runner.restarts("policy_node")
            self.records.append(self._kill)
            print(f"  t={t:5.1f} s  FAULT: policy process killed with SIGKILL (pid {pid})")
        if (self._kill is not None and "restart" not in self._done
                and self.runner.restarts("policy_node") > self._restarts_before_kill):
            self._done.add("restart")
            self._kill.detail["restarted_at_s"] = t

    def _set(self, values: dict[str, float]) -> list[str]:
        from sim2real_ros.ros.graph_util import set_remote_parameters

        # The probe's executor is spun inside; the demo loop resumes right after.
        return set_remote_parameters(self.probe, self.executor, SPIKE_NODE, values, timeout_s=3.0)

    def _spike_on(self) -> dict[str, Any]:
        values = {"position_offset_rad": self.options.spike_position_offset_rad,
                  "velocity_noise_rad_s": self.options.spike_velocity_noise_rad_s}
        refused = self._set(values)
        return {"mechanism": "glitched joint_states on the policy's input (fault_injector): "
                f"+{values['position_offset_rad']} rad on every joint, "
                f"{values['velocity_noise_rad_s']} rad/s velocity noise",
                "applied": not refused, "refused": refused, **values}

    def _spike_off(self) -> dict[str, Any]:
        refused = self._set({"position_offset_rad": 0.0, "velocity_noise_rad_s": 0.0})
        return {"cleared": not refused}


class _Tee:
    """A text sink for the runner: node output to graph.log, runner lines also to the console."""

    def __init__(self, path: Path, echo_runner: bool = True) -> None:
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._echo = echo_runner

    def write(self, text: str) -> int:
        self._f.write(text)
        if self._echo and text.startswith("[runner]"):
            sys.stdout.write(text)
        return len(text)

    def flush(self) -> None:
        self._f.flush()
        sys.stdout.flush()

    def close(self) -> None:
        self._f.close()


def run_demo(options: DemoOptions) -> int:
    """Run the demo; return 0 when the graph ran through its faults, 1 otherwise."""
    ensure_dds_env()
    # rclpy and the nodes are imported only now, with the DDS environment in place.
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    from sim2real_ros.adapters.probe_node import GraphProbe
    from sim2real_ros.runner import GraphRunner, RunnerConfig

    graph, missing = demo_graph(options)
    run_dir = new_run_dir(options.runs_dir)
    if "shadow_comparator" in graph.names():
        # Demo transitions go to the run folder, never into the shipped rollout log.
        graph = graph.with_parameters("shadow_comparator",
                                      rollout_log=str((run_dir / "rollout.jsonl").resolve()))
    print(f"sim2real demo: run folder {run_dir}")
    print(f"  ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']} "
          f"ROS_AUTOMATIC_DISCOVERY_RANGE={os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE']}")
    print(f"  nodes: {', '.join(graph.names())}")
    if missing:
        print(f"  not installed yet, left out: {', '.join(missing)}")
    (run_dir / "graph.json").write_text(json.dumps(graph.describe(), indent=2))

    tee = _Tee(run_dir / "graph.log")
    # A fresh policy registry in the run folder (initialised from the shipped default): the
    # demo's rollbacks never touch the user's registry.
    env = {"SIM2REAL_POLICY_REGISTRY": str((run_dir / "policies").resolve())}
    runner = GraphRunner(graph, out=tee, log_dir=run_dir / "logs",  # type: ignore[arg-type]
                         config=RunnerConfig(grace_s=10.0, max_restarts=3, extra_env=env))
    ctx = Context()
    rclpy.init(context=ctx)
    probe = GraphProbe("demo_probe", context=ctx, topics=graph.backend.topics,
                       reach_tolerance_m=options.reach_tolerance_m)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(probe)
    faults: list[FaultRecord] = []
    failure: str | None = None
    interrupted = False
    t_loop0: float | None = None
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(_signum: int, _frame: object) -> None:
        nonlocal interrupted
        interrupted = True

    signal.signal(signal.SIGINT, on_sigint)
    try:
        runner.start()
        t_loop0 = _wait_for_closed_loop(probe, executor, runner, options.startup_timeout_s,
                                        lambda: interrupted)
        if t_loop0 is None:
            failure = runner.failed_node and f"node {runner.failed_node} died during start-up" \
                or "the loop did not close (no arm command) within the start-up timeout"
        else:
            print(f"sim2real demo: loop closed; running {options.duration_s:.0f} s "
                  "on the wall clock")
            script = (FaultScript(options, graph, runner, probe, executor)
                      if options.faults else None)
            failure = _run_loop(options, probe, executor, runner, script, t_loop0,
                                lambda: interrupted)
            if script is not None:
                faults = script.records
    finally:
        clean = runner.stop()
        signal.signal(signal.SIGINT, previous)
        executor.shutdown()
        probe.destroy_node()
        rclpy.shutdown(context=ctx)
        tee.close()
    if interrupted and failure is None:
        failure = "interrupted (Ctrl-C)"
    summary = build_summary(options, graph, missing, runner, probe, faults, t_loop0, failure,
                            clean, run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    if options.plots:
        summary["plots"] = write_plots(run_dir, probe, faults, t_loop0)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(format_summary(summary))
    return 0 if summary["ok"] else 1


def _wait_for_closed_loop(probe: Any, executor: Any, runner: Any, timeout_s: float,
                          interrupted: Any) -> float | None:
    """Spin until the first arm command arrives; return its time, or None (death, timeout)."""
    deadline = time.monotonic() + timeout_s
    last_poll = 0.0
    while time.monotonic() < deadline and not interrupted():
        executor.spin_once(timeout_sec=0.05)
        if probe.core.command_arrivals_s:
            return probe.core.command_arrivals_s[0]
        if time.monotonic() - last_poll > 0.1:
            last_poll = time.monotonic()
            if runner.poll() is not None:
                return None
    return None


def _run_loop(options: DemoOptions, probe: Any, executor: Any, runner: Any,
              script: FaultScript | None, t_loop0: float, interrupted: Any) -> str | None:
    """Run for the demo's duration; return why it failed, or None."""
    end = t_loop0 + options.duration_s
    next_poll = next_progress = 0.0
    while not interrupted():
        now = probe.now_s()
        if now >= end:
            return None
        executor.spin_once(timeout_sec=0.02)
        t = now - t_loop0
        if script is not None:
            script.step(t)
        if now >= next_poll:
            next_poll = now + 0.1
            dead = runner.poll()
            if dead is not None:
                return f"node {dead} died and is not restartable: the graph was torn down"
        if now >= next_progress:
            next_progress = now + 10.0
            print(_progress_line(probe, runner, t))
    return None


def _progress_line(probe: Any, runner: Any, t: float) -> str:
    core = probe.core
    recent = [a for a in core.command_arrivals_s if a >= probe.now_s() - 2.0]
    rate = (len(recent) - 1) / (recent[-1] - recent[0]) if len(recent) > 2 else 0.0
    source = (probe.latched.get("safety_status") or {}).get("source", "?")
    reached = sum(1 for v in core.targets if v.reached_at_s is not None)
    restarts = runner.restarts("policy_node") if "policy_node" in runner.graph.names() else 0
    return (f"  t={t:5.1f} s  control {rate:6.1f} Hz  source {source:<8}  targets "
            f"{reached}/{len(core.targets)} reached  safety events {len(core.events)}  "
            f"policy restarts {restarts}")


# What the nodes say about themselves on /diagnostics, kept in the summary next to what the
# probe measured from outside: (status name fragment, keys).
NODE_REPORT_KEYS = {
    "sim_bridge": ("joint_states_rate_hz", "real_time_factor", "overruns", "unit_id"),
    "safety_filter": ("rollout_stage", "source", "interventions", "events_total", "estop",
                      "fallback_reason", "tick_p50_us", "tick_p99_us", "rollback_requests"),
    "policy_node": ("state", "version", "commands_published", "stale_ticks", "ood_max",
                    "disagreement_max_rad"),
    "shadow_comparator": ("stage", "recommended_stage", "gate_passed", "gate_failing",
                          "agreement_rate", "ood_fraction", "fallback_rate", "steps"),
}


def _node_reports(probe: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for node, keys in NODE_REPORT_KEYS.items():
        for name, (_, _, message, values) in probe.diagnostics.items():
            if name.startswith(f"{node}:"):
                out[node] = {"message": message, **{k: values[k] for k in keys if k in values}}
    history = [h[2] for n, hs in probe.diagnostics_history.items() if n.startswith("sim_bridge:")
               for h in hs]
    rtf = [float(v["real_time_factor"]) for v in history if _is_number(v.get("real_time_factor"))]
    if rtf and "sim_bridge" in out:
        out["sim_bridge"]["real_time_factor_min"] = min(rtf)
        out["sim_bridge"]["real_time_factor_median"] = sorted(rtf)[len(rtf) // 2]
    return out


def _arm_gap_max(probe: Any, loop_rel: float, start_s: float, end_s: float) -> float | None:
    """Largest `command_gap_max_s` of the sim bridge's reports overlapping [start_s, end_s].

    A report at time T covers the period since the previous report, so the reports that
    overlap the window are those from the first after `start_s` to the first after `end_s`.
    Times are relative to the closed loop, as the fault times are.
    """
    reports = sorted((t - loop_rel, v) for name, hs in probe.diagnostics_history.items()
                     if name.startswith("sim_bridge:") for t, _, v in hs)
    gaps: list[float] = []
    for t, values in reports:
        if t <= start_s or not _is_number(values.get("command_gap_max_s")):
            continue
        gaps.append(float(values["command_gap_max_s"]))
        if t >= end_s:
            break
    return max(gaps) if gaps else None


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _window_stats(times: list[float], start: float, end: float) -> dict[str, Any]:
    inside = [t for t in times if start <= t <= end]
    gaps = [b - a for a, b in zip(inside, inside[1:])]
    return {"n": len(inside), "max_gap_s": max(gaps) if gaps else None}


def build_summary(options: DemoOptions, graph: Graph, missing: list[str], runner: Any,
                  probe: Any, faults: list[FaultRecord], t_loop0: float | None,
                  failure: str | None, clean_shutdown: bool, run_dir: Path) -> dict[str, Any]:
    """Return everything the demo measured as a JSON-ready dict, with its pass/fail checks."""
    core = probe.core
    since = t_loop0
    measured = core.summary(since_s=since)
    t0 = core.t0_s or 0.0
    loop_rel = (t_loop0 - t0) if t_loop0 is not None else 0.0
    kinds: dict[str, int] = {}
    for e in core.events:
        kinds[str(e.get("kind", "?"))] = kinds.get(str(e.get("kind", "?")), 0) + 1
    reports = _node_reports(probe)
    fallback_events = kinds.get("fallback", 0)
    # The filter's own count (events are throttled on the topic); the events as fallback.
    safety = reports.get("safety_filter", {})
    interventions = (int(float(safety["interventions"])) if _is_number(safety.get("interventions"))
                     else kinds.get("intervention", 0))
    switches = [{"t_s": round(t - loop_rel, 3), "source": s} for t, s in core.source_timeline]
    shadow = probe.latched.get("shadow_report") or {}
    recommendation = probe.latched.get("shadow_recommendation") or {}
    # Fault outcomes: did the arm keep receiving commands, and when did the policy come back?
    arm_rel = [a - t0 - loop_rel for a in core.command_arrivals_s]
    policy_rel = [t - loop_rel for t in core.source_times.get("policy", [])]
    for f in faults:
        if f.kind == "policy_killed":
            # Commands already in flight when the process died do not count as a return: the
            # policy is back with the first command after the runner restarted it.
            restarted = f.detail.get("restarted_at_s")
            after = [t for t in policy_rel if restarted is not None and t > restarted]
            f.detail["policy_commands_resumed_after_s"] = (
                round(after[0] - f.t_s, 3) if after else None)
            end = after[0] if after else f.t_s + 5.0
            f.detail["arm_commands_during_outage"] = _window_stats(arm_rel, f.t_s, end)
            # The arm's own count (sim bridge diagnostics): longest gap between the commands
            # it received, in every report window that overlaps the outage.
            f.detail["arm_command_gap_max_s"] = _arm_gap_max(probe, loop_rel, f.t_s, end)
            f.detail["restarts"] = runner.restarts("policy_node")
        if f.kind == "uncertainty_spike":
            end = f.detail.get("ended_at_s", f.t_s + options.spike_duration_s)
            conf = [(t - loop_rel, d, o) for t, d, o in core.confidence]
            before = [c for c in conf if f.t_s - 5.0 <= c[0] < f.t_s]
            during = [c for c in conf if f.t_s <= c[0] <= end + 0.5]
            f.detail["ood_before_max"] = max((c[2] for c in before), default=None)
            f.detail["ood_during_max"] = max((c[2] for c in during), default=None)
            f.detail["disagreement_during_max_rad"] = max((c[1] for c in during), default=None)
            f.detail["source_switches"] = [s for s in switches if f.t_s <= s["t_s"] <= end + 5]
    checks = {
        "loop_closed": t_loop0 is not None,
        "graph_stayed_up": failure is None or failure.startswith("interrupted"),
        "control_rate_within_20pct_of_100hz": bool(
            measured["control_rate_hz"] and measured["control_rate_hz"] >= 80.0),
        "clean_shutdown": clean_shutdown,
    }
    if any(f.kind == "policy_killed" for f in faults):
        kill = next(f for f in faults if f.kind == "policy_killed")
        checks["policy_restarted_after_kill"] = (
            kill.detail.get("policy_commands_resumed_after_s") is not None)
        # Judged where it matters, at the arm: the sim bridge times each command it receives.
        # The probe's view (arrivals in this process) is kept in the summary; it also counts
        # its own scheduling delays. Without the bridge's figure (older bridge), the probe's.
        gap = kill.detail.get("arm_command_gap_max_s")
        if gap is None:
            gap = kill.detail["arm_commands_during_outage"]["max_gap_s"]
        checks["arm_never_100ms_without_command_while_policy_dead"] = bool(
            gap is not None and gap < 0.1)
    return {
        "ok": all(checks.values()) and failure is None,
        "failure": failure,
        "checks": checks,
        "run_dir": str(run_dir),
        "started_utc": datetime.utcnow().isoformat(timespec="seconds") + "Z",
        "duration_s": options.duration_s,
        "rollout_stage": options.rollout_stage,
        "ros_domain_id": os.environ.get("ROS_DOMAIN_ID"),
        "nodes": graph.names(),
        "nodes_missing": missing,
        "control_rate_hz": measured["control_rate_hz"],
        "joint_states_rate_hz": measured["joint_states_rate_hz"],
        "obs_to_command_latency_ms": measured["obs_to_command_latency_ms"],
        "obs_to_policy_command_latency_ms": measured["obs_to_policy_command_latency_ms"],
        "interventions": interventions,
        "fallback_events": fallback_events,
        "safety_events_by_kind": kinds,
        "source_switches": switches,
        "shadow_agreement": ((shadow.get("metrics") or {}).get("gate_metrics") or {}).get(
            "agreement_rate"),
        "shadow_report": shadow,
        "gate_status": recommendation,
        "policy_version": probe.latched.get("policy_version"),
        "targets": measured["targets"],
        "targets_reached": measured["targets_reached"],
        "reach_tolerance_m": measured["reach_tolerance_m"],
        "node_reports": reports,
        "load_average_1_5_15": list(os.getloadavg()),
        "faults": [asdict(f) for f in faults],
        "runner_events": [asdict(e) for e in runner.events],
        "measured": measured,
    }


def _fmt(v: Any, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def format_summary(s: dict[str, Any]) -> str:
    """Return the human-readable summary printed at the end of the demo."""
    lat = s["obs_to_command_latency_ms"]
    plat = s["obs_to_policy_command_latency_ms"]
    gate = s.get("gate_status") or {}
    sim = s.get("node_reports", {}).get("sim_bridge", {})
    lines = [
        "",
        "=" * 72,
        f"sim2real demo summary  ({s['run_dir']})",
        "=" * 72,
        f"nodes                      {', '.join(s['nodes'])}",
    ]
    if s["nodes_missing"]:
        lines.append(f"not installed (left out)   {', '.join(s['nodes_missing'])}")
    lines += [
        f"rollout stage              {s['rollout_stage']}",
        f"achieved control rate      {_fmt(s['control_rate_hz'], ' Hz', 1)}"
        f"   (joint_states {_fmt(s['joint_states_rate_hz'], ' Hz', 1)})",
        f"obs -> arm command latency p50 {_fmt(lat['p50'], ' ms')}  p99 {_fmt(lat['p99'], ' ms')}"
        f"  (n={lat['n']})",
        f"obs -> policy command      p50 {_fmt(plat['p50'], ' ms')}  "
        f"p99 {_fmt(plat['p99'], ' ms')}  (n={plat['n']})",
        f"safety interventions       {s['interventions']}   events by kind "
        f"{s['safety_events_by_kind']}",
        f"fallback events            {s['fallback_events']}   source switches "
        f"{[(x['t_s'], x['source']) for x in s['source_switches']][:8]}",
        f"shadow agreement           {_fmt(s['shadow_agreement'], '', 3)}",
        f"gate status                {_gate_line(gate)}",
        f"targets reached            {s['targets_reached']}/{s['targets']} "
        f"(within {s['reach_tolerance_m'] * 100:.0f} cm)",
        f"sim bridge                 real-time factor "
        f"{_fmt(sim.get('real_time_factor_median'), '', 3)} (median), joint_states "
        f"{sim.get('joint_states_rate_hz', 'n/a')} Hz (its own count); host load "
        f"{', '.join(f'{x:.1f}' for x in s['load_average_1_5_15'])}",
    ]
    for f in s["faults"]:
        d = {k: v for k, v in f["detail"].items() if k not in ("source_switches",)}
        lines.append(f"fault at t={f['t_s']:.1f} s    {f['kind']}: {json.dumps(d, default=str)}")
    lines.append("checks                     " + ", ".join(
        f"{k}={'ok' if v else 'FAILED'}" for k, v in s["checks"].items()))
    if s["failure"]:
        lines.append(f"FAILURE                    {s['failure']}")
    lines.append(f"result                     {'OK' if s['ok'] else 'FAILED'}")
    lines.append(f"written                    {s['run_dir']}/summary.json, plots, logs/")
    return "\n".join(lines)


def _gate_line(rec: dict[str, Any]) -> str:
    if not rec:
        return "n/a (no recommendation heard)"
    line = f"stage {rec.get('current_stage')} -> recommended {rec.get('recommended_stage')}"
    gate = rec.get("gate") or {}
    if gate:
        failing = [c.get("criterion") for c in gate.get("criteria", []) if not c.get("passed")]
        line += (f"; gate to {gate.get('to', 'next')} "
                 f"{'passed' if gate.get('passed') else 'not passed'}")
        if failing:
            line += f" (failing: {', '.join(map(str, failing))})"
    return line


def _legend(ax: Any, loc: str) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc=loc)


def write_plots(run_dir: Path, probe: Any, faults: list[FaultRecord],
                t_loop0: float | None) -> list[str]:
    """Write overview.png (tracking, confidence, latency, sources) and latency.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    core = probe.core
    t0 = core.t0_s or 0.0
    shift = (t_loop0 - t0) if t_loop0 is not None else 0.0
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    ax = axes[0]
    if core.tool_trace:
        tt, dd = np.array(core.tool_trace).T
        ax.plot(tt - shift, dd * 100, lw=0.8, label="tool to target")
    for v in core.targets:
        ax.axvline(v.t_start_s - shift, color="0.8", lw=0.6)
    ax.axhline(core.reach_tolerance_m * 100, color="g", ls="--", lw=0.8, label="tolerance")
    ax.set_ylabel("distance (cm)")
    ax.set_title("Tracking: tool0 distance to the task target (grey: new target)")
    _legend(ax, "upper right")
    ax = axes[1]
    if core.confidence:
        tc, dis, ood = np.array(core.confidence).T
        ax.plot(tc - shift, ood, lw=0.8, label="OOD score")
        ax2 = ax.twinx()
        ax2.plot(tc - shift, dis, lw=0.8, color="tab:orange", label="ensemble disagreement")
        ax2.set_ylabel("disagreement (rad)")
        _legend(ax2, "upper left")
    ax.set_ylabel("OOD (RMS z)")
    ax.set_title("Policy confidence")
    _legend(ax, "upper right")
    ax = axes[2]
    if core.command_latency_trace:
        tl, lat = np.array(core.command_latency_trace).T
        ax.plot(tl - shift, lat * 1e3, ".", ms=1.5, label="obs -> arm command")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Observation to arm command latency")
    ax = axes[3]
    for src, y in (("baseline", 0), ("policy", 1)):
        ts = np.asarray(core.source_times.get(src, []))
        if ts.size:
            ax.plot(ts - shift, np.full(ts.size, y), "|", ms=6, label=f"{src} commands")
    # Who the safety filter lets drive, as coloured bars on the top row.
    colors = {"policy": "tab:orange", "baseline": "tab:blue", "hold": "tab:red"}
    timeline = core.source_timeline
    end_t = (core.command_arrivals_s[-1] - t0) if core.command_arrivals_s else 0.0
    for k, (t, src) in enumerate(timeline):
        t_next = timeline[k + 1][0] if k + 1 < len(timeline) else end_t
        ax.broken_barh([(t - shift, max(t_next - t, 0.0))], (1.7, 0.6),
                       color=colors.get(src, "0.5"))
    for src, c in colors.items():
        ax.plot([], [], color=c, lw=6, label=f"drives: {src}")
    _legend(ax, "upper right")
    arm = np.asarray(core.command_arrivals_s) - t0 - shift
    if arm.size:
        ax.plot(arm, np.full(arm.size, -1), "|", ms=6, color="k", label="arm commands")
    ax.set_yticks([-1, 0, 1, 2], ["arm", "baseline", "policy", "safety source"])
    ax.set_title("Who commands (a gap in 'policy' = the killed process)")
    ax.set_xlabel("time since the loop closed (s)")
    for a in axes:
        for f in faults:
            color = "r" if f.kind == "policy_killed" else "m"
            a.axvline(f.t_s, color=color, ls=":", lw=1.2)
            end = f.detail.get("ended_at_s")
            if end is not None:
                a.axvspan(f.t_s, end, color=color, alpha=0.08)
    axes[0].set_xlim(left=0)
    fig.tight_layout()
    overview = run_dir / "overview.png"
    fig.savefig(overview, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    lat_ms = np.asarray([v for _, v in core.command_latency_trace]) * 1e3
    if lat_ms.size:
        ax[0].hist(lat_ms, bins=60)
        for q in (50, 99):
            ax[0].axvline(np.percentile(lat_ms, q), color="r", ls="--", lw=0.8)
    ax[0].set_xlabel("obs -> arm command latency (ms)")
    ax[0].set_title("latency (dashed: p50, p99)")
    per = np.diff(core.command_arrivals_s) * 1e3
    if per.size:
        ax[1].hist(per, bins=60)
    ax[1].set_xlabel("arm command period (ms)")
    ax[1].set_title("control period")
    fig.tight_layout()
    latency = run_dir / "latency.png"
    fig.savefig(latency, dpi=110)
    plt.close(fig)
    return [str(overview), str(latency)]

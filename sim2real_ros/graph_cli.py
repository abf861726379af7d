"""`sim2real run` (the graph as processes) and `sim2real demo` (the hardware-in-the-loop demo)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sim2real_ros.graph import (
    ARGUMENT_DESCRIPTIONS,
    BACKENDS,
    ROLLOUT_STAGES,
    GraphArgs,
    build_graph,
)


def _add_graph_args(p: argparse.ArgumentParser, with_backend: bool = True) -> None:
    if with_backend:
        p.add_argument("--backend", choices=BACKENDS, default="sim",
                       help=ARGUMENT_DESCRIPTIONS["backend"])
    p.add_argument("--rollout-stage", choices=ROLLOUT_STAGES, default="shadow",
                   help=ARGUMENT_DESCRIPTIONS["rollout_stage"])
    p.add_argument("--policy-version", default="", help=ARGUMENT_DESCRIPTIONS["policy_version"])
    p.add_argument("--calibration", default="", help=ARGUMENT_DESCRIPTIONS["calibration"])


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `run` and `demo` to the sim2real command."""
    run = subparsers.add_parser(
        "run", help="start the graph as processes (where `ros2 launch` is absent)",
        description="Start the graph of graph.py for a backend as processes, each log line "
        "prefixed with its node. Ctrl-C stops it cleanly; a node that dies (and is not "
        "restartable) tears the graph down and the exit code is 1.")
    _add_graph_args(run)
    run.add_argument("--backend-config", type=Path, default=None,
                     help="backend file to use instead of config/backends/<backend>.yaml")
    run.add_argument("--duration", type=float, default=None, metavar="S",
                     help="stop cleanly after S seconds (default: run until Ctrl-C)")
    run.add_argument("--grace", type=float, default=10.0, metavar="S",
                     help="seconds between SIGINT and SIGKILL at shutdown (default 10)")
    run.add_argument("--max-restarts", type=int, default=3,
                     help="restarts allowed per restartable node (default 3)")
    run.add_argument("--log-dir", type=Path, default=None,
                     help="also write each node's output to <log-dir>/<node>.log")
    run.add_argument("--print", dest="print_only", action="store_true",
                     help="print the command of every node and exit")
    run.set_defaults(func=cmd_run)

    demo = subparsers.add_parser(
        "demo", help="run the sim graph ~60 s in real time with a scripted fault; report",
        description="Hardware-in-the-loop demo: the sim graph on the wall clock, the shipped "
        "policy in shadow mode against the baseline, an uncertainty spike and a killed policy "
        "process mid-run. Prints a summary and writes plots and summary.json to "
        "runs/demo-<timestamp>/.")
    demo.add_argument("--duration", type=float, default=60.0, metavar="S",
                      help="run length in seconds (default 60)")
    demo.add_argument("--rollout-stage", choices=ROLLOUT_STAGES, default="shadow",
                      help=ARGUMENT_DESCRIPTIONS["rollout_stage"])
    demo.add_argument("--runs-dir", type=Path, default=Path("runs"),
                      help="where the run folder goes (default runs/)")
    demo.add_argument("--no-fault", action="store_true", help="skip the scripted faults")
    demo.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    demo.set_defaults(func=cmd_demo)


def cmd_run(args: argparse.Namespace) -> int:
    """Start the graph and watch it."""
    from sim2real_ros.runner import GraphRunner, RunnerConfig

    graph = build_graph(
        GraphArgs(backend=args.backend, rollout_stage=args.rollout_stage,
                  policy_version=str(args.policy_version), calibration=args.calibration),
        backend_path=args.backend_config,
    )
    if args.print_only:
        for spec in graph.nodes:
            over = "<overrides.yaml>" if spec.parameters else None
            print(f"# {spec.name}{' (restartable)' if spec.restartable else ''}")
            print(shlex.join(spec.command(over)))
            if spec.parameters:
                print("# overrides.yaml:\n" + spec.override_params_yaml().rstrip())
        return 0
    missing = graph.missing()
    if missing:
        print(f"sim2real run: error: nodes not installed: {missing}", file=sys.stderr)
        return 2
    try:
        runner = GraphRunner(graph, log_dir=args.log_dir, config=RunnerConfig(
            grace_s=args.grace, max_restarts=args.max_restarts))
    except RuntimeError as exc:  # unsafe DDS environment
        print(f"sim2real run: error: {exc}", file=sys.stderr)
        return 2
    return runner.run(args.duration)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo."""
    from sim2real_ros.demo import DemoOptions, run_demo

    return run_demo(DemoOptions(
        duration_s=args.duration, rollout_stage=args.rollout_stage, runs_dir=args.runs_dir,
        faults=not args.no_fault, plots=not args.no_plots))

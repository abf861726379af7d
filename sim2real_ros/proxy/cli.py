"""`sim2real experiment transfer`: the sim-to-real playbook end to end on the proxy arm."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `experiment transfer` to the sim2real command."""
    exp = subparsers.add_parser(
        "experiment", help="reproducible experiments (transfer)",
        description="Reproducible experiments on the proxy arm.")
    sub = exp.add_subparsers(dest="experiment", required=True)
    tr = sub.add_parser(
        "transfer", help="train, measure the gap on the proxy, calibrate, fine-tune, audit",
        description="Run the sim-to-real playbook on the MuJoCo proxy arm: train nominal and "
        "randomized policies, evaluate them on the proxy through the real-backend ROS graph, "
        "identify the proxy and retrain in the calibrated simulator, fine-tune the last layer "
        "on proxy trajectories, audit each step. Every stage seals its artifacts with a sha256 "
        "manifest; --resume continues a run and refuses any artifact changed since.")
    tr.add_argument("--quick", action="store_true",
                    help="small sizes that check the pipeline in minutes (not the numbers)")
    tr.add_argument("--run-dir", type=Path, default=None,
                    help="run folder (default runs/transfer-<UTC time>); must be new unless "
                    "--resume")
    tr.add_argument("--resume", action="store_true",
                    help="continue the run in --run-dir: verify sealed stages, run the rest")
    tr.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="change one setting (e.g. proxy_episodes=50, seed=3); recorded in "
                    "run.json, and a resume must repeat it")
    tr.add_argument("--stage", dest="stages", action="append", default=None, metavar="NAME",
                    help="run only these stages (repeatable); the others stay as they are")
    tr.set_defaults(func=cmd_transfer)


def cmd_transfer(args: argparse.Namespace) -> int:
    """Run or resume the transfer experiment; exit 0 done, 2 bad config/artifact, 3 blocked."""
    from sim2real_ros.config import ConfigError
    from sim2real_ros.proxy.experiment import (
        STAGES,
        ExperimentConfig,
        default_run_dir,
        run_pipeline,
    )

    base = ExperimentConfig.quick() if args.quick else ExperimentConfig()
    cfg = base.with_overrides(args.overrides)
    if args.resume and args.run_dir is None:
        raise ConfigError("<command line>", "--run-dir", None, "the run folder to resume")
    names = [s.name for s in STAGES]
    if args.stages:
        unknown = [s for s in args.stages if s not in names]
        if unknown:
            raise ConfigError("<command line>", "--stage", unknown[0], f"one of {names}")
    run_dir = args.run_dir or default_run_dir()
    return run_pipeline(run_dir, cfg, quick=args.quick, resume=args.resume,
                        only=tuple(args.stages) if args.stages else None)

"""The `sim2real` command: one entry point, a sub-command family per room.

Each room contributes `register(subparsers)` in its own cli module, so rooms never edit this
file to add a verb.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sim2real_ros.config import ConfigError

# Rooms that contribute sub-commands, in the order `sim2real --help` lists them.
COMMAND_MODULES = [
    "sim2real_ros.sim.cli",  # sim draw|check-spec|terms
    "sim2real_ros.policy.cli",  # train; policy list|promote|rollback|verify|eval|finetune|record-sim
    "sim2real_ros.safety.cli",  # safety check-envelope|derive-envelope|fault-suite
    "sim2real_ros.sysid.cli",  # sysid excite|record|info|fit|synth
    "sim2real_ros.shadow.cli",  # shadow report; rollout promote|status
    "sim2real_ros.audit.cli",  # audit
    "sim2real_ros.graph_cli",  # run, demo
    "sim2real_ros.proxy.cli",  # experiment transfer
]


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every room's sub-commands."""
    parser = argparse.ArgumentParser(
        prog="sim2real", description="Harden a simulation-trained arm policy for a real cell."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; configuration errors print one line and exit 2."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"sim2real: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

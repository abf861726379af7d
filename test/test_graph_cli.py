"""`sim2real run` argument handling (no processes started).

The parser is built from graph_cli.register alone: importing every room's CLI (as
sim2real_ros.cli does) costs seconds and is the lead's cli test's business.
"""

from __future__ import annotations

import argparse

import pytest

from sim2real_ros import graph_cli
from sim2real_ros.config import ConfigError


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sim2real")
    graph_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_run_print_shows_each_node_command_with_its_overrides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _run(["run", "--backend", "real", "--rollout-stage", "limited", "--print"]) == 0
    out = capsys.readouterr().out
    assert "# policy_node (restartable)" in out
    assert "-m sim2real_ros.safety.node --ros-args -r __node:=safety_filter" in out
    assert "-r joint_states:=/joint_states" in out
    assert "rollout_stage: limited" in out
    assert "sim_bridge" not in out


@pytest.mark.parametrize("argv, message", [
    (["run", "--policy-version", "newest", "--print"], "policy_version = 'newest'"),
    (["run", "--calibration", "arm-SN404", "--print"], "calibration = 'arm-SN404'"),
])
def test_run_refuses_bad_arguments_naming_them(argv: list[str], message: str) -> None:
    # sim2real_ros.cli turns a ConfigError into one line and exit code 2.
    with pytest.raises(ConfigError, match=message):
        _run(argv)


def test_run_refuses_an_unknown_backend_choice() -> None:
    with pytest.raises(SystemExit) as exc:
        _run(["run", "--backend", "hardware"])
    assert exc.value.code == 2

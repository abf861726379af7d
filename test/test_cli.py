"""The `sim2real` command offers every room's verbs and reports config errors in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sim2real_ros.cli import COMMAND_MODULES, build_parser, main

VERBS = ["sim", "train", "policy", "safety", "sysid", "shadow", "rollout", "audit", "run", "demo",
         "experiment"]


def test_every_room_contributes_its_verbs() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(VERBS)
    assert len(COMMAND_MODULES) == 8


def test_config_error_is_one_line_and_exit_code_2(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"{tmp_path}/nope.yaml"
    assert main(["sim", "check-spec", missing]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err and err.strip().count("\n") <= 2


def test_console_entry_point_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "sim2real_ros.cli", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for verb in VERBS:
        assert verb in out

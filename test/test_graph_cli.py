"""`sim2real run` argument handling (no processes started)."""

from __future__ import annotations

import pytest

from sim2real_ros.cli import main


def test_run_print_shows_each_node_command_with_its_overrides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--backend", "real", "--rollout-stage", "limited", "--print"]) == 0
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
def test_run_refuses_bad_arguments_with_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_run_refuses_an_unknown_backend_choice() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--backend", "hardware"])
    assert exc.value.code == 2

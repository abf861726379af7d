"""Every rclpy process of ours is loopback-only on a run-unique domain."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sim2real_ros.ros.env import child_env, dds_env_problems

REPO = Path(__file__).resolve().parent.parent


def test_test_process_runs_loopback_only_with_a_domain_id() -> None:
    assert os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE") == "LOCALHOST"
    assert os.environ.get("ROS_DOMAIN_ID", "").isdigit()
    assert dds_env_problems() == []


def test_makefile_exports_localhost_discovery_and_a_run_unique_domain() -> None:
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST$", text, re.M)
    assert re.search(r"^export ROS_DOMAIN_ID$", text, re.M)
    assert "urandom" in text, "the domain id must be drawn per run"


def test_ci_script_calls_make_test_with_localhost_discovery() -> None:
    text = (REPO / ".ci" / "run").read_text()
    assert "make test" in text
    assert "ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST" in text


def test_child_processes_inherit_the_dds_environment() -> None:
    out = subprocess.run(
        [sys.executable, "-c",
         "import os; print(os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'], os.environ['ROS_DOMAIN_ID'])"],
        env=child_env(), capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out == ["LOCALHOST", os.environ["ROS_DOMAIN_ID"]]


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"ROS_DOMAIN_ID": "7"}, "ROS_AUTOMATIC_DISCOVERY_RANGE"),
        ({"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET", "ROS_DOMAIN_ID": "7"}, "SUBNET"),
        ({"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}, "ROS_DOMAIN_ID"),
        ({"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_DOMAIN_ID": "x"}, "ROS_DOMAIN_ID"),
    ],
)
def test_unsafe_dds_environment_is_refused_for_children(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for var in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_DOMAIN_ID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError, match=expected):
        child_env()

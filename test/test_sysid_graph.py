"""The sysid graph description that launch/sysid.launch.py translates."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sim2real_ros.sysid.graph import LAUNCH_ARGUMENTS, recorder_overrides, sysid_nodes

REPO = Path(__file__).resolve().parent.parent


def _by_name(nodes: list[dict]) -> dict[str, dict]:
    return {n["name"]: n for n in nodes}


def test_sim_backend_runs_the_excitation_through_the_safety_filter_in_stage_full() -> None:
    nodes = _by_name(sysid_nodes("SN-1", "sim", recorder_params={"duration_s": 5.0}))
    assert set(nodes) == {"sim_bridge", "safety_filter", "baseline_controller",
                          "sysid_recorder"}
    sf = nodes["safety_filter"]["parameters"][-1]
    assert sf["rollout_stage"] == "full" and sf["require_confidence"] is False
    rec = nodes["sysid_recorder"]
    assert rec["parameters"][-1]["unit_serial"] == "SN-1"
    assert rec["parameters"][-1]["duration_s"] == 5.0
    assert rec["parameters"][0].endswith("config/nodes/sysid_recorder.yaml")
    for n in nodes.values():
        assert set(n) >= {"package", "executable", "name", "parameters", "remappings"}


def test_real_backend_starts_no_simulator_and_a_unit_is_required() -> None:
    nodes = _by_name(sysid_nodes("SN-1", "real"))
    assert "sim_bridge" not in nodes and "sysid_recorder" in nodes
    with pytest.raises(ValueError, match="unit"):
        sysid_nodes("  ")


def test_launch_file_declares_every_argument_and_uses_the_description() -> None:
    text = (REPO / "launch" / "sysid.launch.py").read_text()
    tree = ast.parse(text)  # launch/launch_ros are not installable here; check its shape
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert {"sysid_nodes", "LAUNCH_ARGUMENTS", "recorder_overrides"} <= names
    values = {k: "1.5" if k in ("duration_s", "amplitude_rad") else "x" for k in LAUNCH_ARGUMENTS}
    over = recorder_overrides(values)
    assert over["duration_s"] == 1.5 and over["unit_cell"] == "x"
